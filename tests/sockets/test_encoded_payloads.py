"""``Publisher.send_encoded`` takes a bytes-like payload already in the topic's codec. Anything
else is refused at the call with ``TypeError`` (nothing sent, the publisher goes on serving);
every bytes-like kind is delivered as its bytes. Before, an ``int`` reached the loop and killed
it (``TypeError`` in the fan-out), and a ``zmq.Frame`` killed it in the coalescer (``Frame[0]``
is a socket-option lookup, not a byte); a ``bytearray`` changed after the call could change what
subscribers got."""

import array

import pytest
import zmq

from epochstream.transport import Publisher, Subscriber


@pytest.fixture
def pair():
    pub = Publisher("encoded", heartbeat_interval=0.2)
    sub = Subscriber("encoded", endpoints=[pub.endpoint], timeout=10)
    assert sub.wait_ready(10)
    yield pub, sub
    sub.close()
    pub.close()


@pytest.mark.parametrize("bad", [12345, "\x91\x01", None, [b"\x91\x01"], object()])
def test_a_payload_that_is_not_bytes_like_is_refused_at_the_call(pair, bad):
    pub, sub = pair
    with pytest.raises(TypeError, match="bytes-like"):
        pub.send_encoded(0, bad)
    pub.send_encoded(0, b"\x91\x07")  # the publisher goes on; the refused call sent nothing
    pub.advance_to(1)
    epoch = next(iter(sub.epochs(timeout=10)))
    assert epoch.time == 0 and list(epoch.records) == [7]


def test_every_bytes_like_kind_is_delivered_as_its_bytes(pair):
    pub, sub = pair
    mutable = bytearray(b"\x91\x01")
    pub.send_encoded(0, mutable)
    mutable[1] = 0x63  # changed after the call: subscribers still get what was handed over
    pub.send_encoded(0, memoryview(b"\x91\x02"))
    pub.send_encoded(0, zmq.Frame(b"\x91\x03"))
    pub.send_encoded(0, array.array("B", b"\x91\x04"))
    pub.send_encoded(0, memoryview(b"\x91\x05").cast("H"))  # a 2-byte format, one item
    pub.advance_to(1)
    assert pub.flush(10)
    epoch = next(iter(sub.epochs(timeout=10)))
    assert list(epoch.records) == [1, 2, 3, 4, 5]
