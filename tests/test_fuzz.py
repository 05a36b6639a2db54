"""Fuzzing (Hypothesis, bounded): the wire decoders and the subscriber protocol only ever fail
with our precise errors, rejected input leaves the state unchanged, and a publisher bombarded
with garbage keeps serving."""
import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pytest
import zmq
from hypothesis import given, settings, strategies as st

from epochstream import wire
from epochstream.errors import ProtocolError, WireError
from epochstream.order import TOTAL, product
from epochstream.protocol import (DataMessage, InitialFrontierSnapshot, LowerFrontierUpdate,
                                  SubscriberProtocol)
from epochstream.transport import Publisher, Subscriber

kinds = st.sampled_from([wire.SNAPSHOT, wire.DATA, wire.FRONTIER, wire.HEARTBEAT, wire.NOTICE,
                         wire.HELLO, wire.PING, wire.BYE, wire.CREDIT, b"D\x02", b"Z\x01", b"", b"DD"])
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=5) | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10)
headers = st.one_of(st.binary(max_size=40), msgpack_values.map(msgpack.packb))
frame_lists = st.lists(st.one_of(kinds, headers), min_size=0, max_size=4)


@given(frame_lists)
def test_decode_raises_only_wire_error(frames):
    try:
        wire.decode(frames)
    except WireError:
        pass


@given(frame_lists)
def test_decode_control_raises_only_wire_error(frames):
    try:
        wire.decode_control(frames)
    except WireError:
        pass


@given(st.binary(max_size=200), st.sampled_from(["msgpack", "arrow"]))
def test_codecs_reject_garbage_with_wire_error(payload, name):
    try:
        wire.codec(name).decode(payload)
    except WireError:
        pass


int_times = st.integers(-3, 6)
pair_times = st.tuples(st.integers(0, 4), st.integers(0, 4))
anything = st.one_of(int_times, pair_times, st.text(max_size=2), st.none(), st.lists(st.integers(0, 3), max_size=3))


def messages(times):
    return st.one_of(
        st.builds(InitialFrontierSnapshot, st.lists(times, max_size=3).map(tuple),
                  st.lists(times, max_size=3).map(tuple)),
        st.builds(LowerFrontierUpdate, st.lists(st.tuples(times, st.sampled_from([1, -1])),
                                                max_size=3).map(tuple)),
        st.builds(DataMessage, times, st.just(["x"])),
    )


@settings(max_examples=200)
@given(st.sampled_from([TOTAL, product(2)]), st.integers(1, 3),
       st.lists(st.tuples(st.integers(-1, 3), messages(anything)), max_size=25))
def test_subscriber_protocol_rejects_garbage_precisely_and_keeps_state(order, n, feed):
    sub = SubscriberProtocol(order, n)
    for partition, message in feed:
        before = (sub.ready, sub.lower, sub.filter, sub.snapshots)
        try:
            sub.receive(partition, message)
        except ProtocolError:
            # rejected: nothing changed that a caller can see
            assert (sub.ready, sub.lower, sub.filter, sub.snapshots) == before


@settings(max_examples=30)
@given(st.lists(frame_lists.filter(bool), min_size=1, max_size=20))
def test_publisher_keeps_serving_under_garbage(garbage):
    with Publisher("fuzz", heartbeat_interval=0.2) as pub:
        bad = zmq.Context.instance().socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(pub.endpoint)
        for frames in garbage:
            bad.send_multipart([bytes(f) for f in frames])
        with Subscriber("fuzz", endpoints=[pub.endpoint], timeout=5) as sub:
            assert sub.wait_ready(5)
            pub.send(0, ["ok"])
            pub.close()
            assert [list(e.records) for e in sub.epochs(timeout=5)] == [["ok"]]
        bad.close()


@pytest.mark.parametrize("order, bad", [
    (TOTAL, DataMessage([], ["x"])),                       # wrong shape, found by CI's Hypothesis run
    (TOTAL, LowerFrontierUpdate(((("a",), 1),))),          # wrong shape in an update
    (product(2), DataMessage(5, ["x"])),
    (TOTAL, DataMessage(0, ["x"])),                        # behind the merged lower frontier (5)
])
def test_a_bad_message_buffered_before_the_last_snapshot_changes_nothing(order, bad):
    """A message buffered while snapshots are missing is checked when it arrives (refused from
    its own sender) or, if it can only be judged against the merged frontier, refused together
    with the snapshot that would start the stream — never half-applying the start."""
    low = 5 if order is TOTAL else (5, 5)
    sub = SubscriberProtocol(order, 2)
    sub.receive(0, InitialFrontierSnapshot((low,), ()))
    try:
        sub.receive(0, bad)
    except ProtocolError:
        assert sub.snapshots.keys() == {0} and not sub.ready
        return
    before = (sub.ready, sub.lower, sub.filter, sub.snapshots)
    with pytest.raises(ProtocolError):
        sub.receive(1, InitialFrontierSnapshot((low,), ()))
    assert (sub.ready, sub.lower, sub.filter, sub.snapshots) == before
