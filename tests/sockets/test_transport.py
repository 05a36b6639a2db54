"""Publisher/Subscriber over real ZeroMQ sockets on 127.0.0.1."""
import threading
import time

import pytest
import zmq

from epochstream import wire
from epochstream.errors import ProtocolError, PublisherLost, SubscriberLagged
from epochstream.events import DataMessage
from epochstream.order import product
from epochstream.transport import Publisher, Subscriber

# the conformance suite runs once per data-message version (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("wire_version")

@pytest.fixture
def two_partitions():
    pubs = [Publisher("flights", i, partitions=2) for i in range(2)]
    yield pubs
    for p in pubs:
        p.close(linger=0.5)


def _eps(pubs):
    return [p.endpoint for p in pubs]


def test_two_partitions_join_mid_epoch_and_finish_cleanly(two_partitions):
    p0, p1 = two_partitions
    early = Subscriber("flights", endpoints=_eps(two_partitions))
    assert early.wait_ready(5)
    for p in (p0, p1):
        p.send(0, [("a", p.partition)])
        p.advance_to(1)
    p0.send(1, [("b", 0)])  # epoch 1 in flight: partition 0 has sent, partition 1 not yet
    p0.flush()
    late = Subscriber("flights", endpoints=_eps(two_partitions))
    assert late.wait_ready(5)
    assert late.filter == (1,)
    p1.send(1, [("b", 1)])
    for p in (p0, p1):
        p.send(2, [("c", p.partition)] * 3)
        p.advance_to(5)
        p.send(7, [("d", p.partition)])
        p.close()
    got_early = {e.time: sorted(e.records) for e in early.epochs(timeout=5)}
    got_late = {e.time: sorted(e.records) for e in late.epochs(timeout=5)}
    assert got_early == {0: [("a", 0), ("a", 1)], 1: [("b", 0), ("b", 1)],
                         2: [("c", 0)] * 3 + [("c", 1)] * 3, 7: [("d", 0), ("d", 1)]}
    assert got_late == {t: v for t, v in got_early.items() if t >= 2}  # epoch 1 not partially
    assert early.finished and late.finished
    assert late.stats["dropped"] == 1
    early.close()
    late.close()


def test_events_api_yields_data_and_frontier():
    with Publisher("t", order=product(2)) as pub:
        with Subscriber("t", endpoints=[pub.endpoint], order=product(2)) as sub:
            assert sub.wait_ready(5)
            pub.send((0, 1), [1, 2])
            pub.progress([((1, 0), 1), ((0, 0), -1)])
            pub.close()
            events = list(sub.events(timeout=5))
            kinds = [type(e).__name__ for e in events]
            assert kinds[0] == "LowerFrontierUpdate"  # the initial merged frontier
            assert "DataMessage" in kinds and kinds[-1] == "LowerFrontierUpdate"
            data = next(e for e in events if isinstance(e, DataMessage))
            assert (data.time, list(data.data)) == ((0, 1), [1, 2]) and data.nbytes > 0
            assert sub.lower == ()


def test_events_as_pairs_still_work_with_a_deprecation_warning():
    with Publisher("t") as pub:
        with Subscriber("t", endpoints=[pub.endpoint]) as sub:
            assert sub.wait_ready(5)
            pub.send(0, [1, 2])
            pub.close()
            with pytest.warns(DeprecationWarning, match="event.nbytes"):
                pairs = [(msg, nbytes) for msg, nbytes in sub.events(timeout=5)]
            data = [(m, n) for m, n in pairs if isinstance(m, DataMessage)]
            assert data and data[0][1] == data[0][0].nbytes > 0


def test_publisher_errors_are_raised_to_caller_and_stream_survives():
    with Publisher("t") as pub, Subscriber("t", endpoints=[pub.endpoint]) as sub:
        assert sub.wait_ready(5)
        pub.advance_to(3)
        with pytest.raises(ProtocolError, match="behind the lower frontier"):
            pub.send(1, ["late"])
        with pytest.raises(ProtocolError, match="backwards"):
            pub.advance_to(2)
        with pytest.raises(ProtocolError, match="wrong shape"):
            pub.send((3, 1), ["x"])
        pub.send(3, ["ok"])
        pub.close()
        assert [(e.time, list(e.records)) for e in sub.epochs(timeout=5)] == [(3, ["ok"])]


def test_malformed_frames_do_not_kill_the_publisher():
    with Publisher("t") as pub:
        ctx = zmq.Context.instance()
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(pub.endpoint)
        bad.send_multipart([b"??"])
        bad.send_multipart([wire.HELLO, b"\xc1"])
        bad.send_multipart(wire.encode_control(wire.HELLO, topic="other", partition=0, id="x"))
        notices = []
        for _ in range(3):
            assert bad.poll(5000)
            notices.append(wire.decode(bad.recv_multipart()))
        assert [n.code for n in notices] == ["error"] * 3
        assert "not 'other'" in notices[2].message
        bad.close()
        with Subscriber("t", endpoints=[pub.endpoint]) as sub:  # still serving
            assert sub.wait_ready(5)
            pub.send(0, ["x"])
            pub.close()
            assert [len(e) for e in sub.epochs(timeout=5)] == [1]
        assert pub.stats["bad_messages"] == 2


def test_wrong_topic_is_a_clear_error():
    with Publisher("t") as pub:
        with Subscriber("not-t", endpoints=[pub.endpoint]) as sub:
            with pytest.raises(ProtocolError, match="rejected this subscriber"):
                sub.wait_ready(5)


def test_stalled_subscriber_is_evicted_with_notice_and_fast_one_unaffected():
    pub = Publisher("t", max_queue_messages=500)
    stalled = Subscriber("t", endpoints=[pub.endpoint], rcvhwm=10)
    fast = Subscriber("t", endpoints=[pub.endpoint])
    assert stalled.wait_ready(5) and fast.wait_ready(5)
    got = []

    def consume():
        got.extend(e.time for e in fast.epochs(timeout=10))

    th = threading.Thread(target=consume)
    th.start()
    n = 3000
    payload = list(range(1000))  # ~3 KB per message: kernel TCP buffers cannot hide the stall
    for t in range(n):
        pub.send(t, payload)
        pub.advance_to(t + 1)
        if t % 50 == 49:  # the fast subscriber keeps up; the stalled one never reads
            deadline = time.monotonic() + 10
            while len(got) < t - 50 and time.monotonic() < deadline:
                time.sleep(0.001)
    pub.flush()  # stats are kept by the publisher's loop thread
    assert pub.stats["subscribers_evicted"] == 1
    # The stalled subscriber resumes while the publisher is still up: it drains what was queued
    # for it, then gets the eviction notice as SubscriberLagged naming its last complete epoch.
    delivered = []
    with pytest.raises(SubscriberLagged, match="evicted") as info:
        for e in stalled.epochs(timeout=10):
            delivered.append(e.time)
            assert len(e) == 1000  # whole
    assert info.value.partition == 0
    assert delivered == list(range(len(delivered))) and info.value.last_epoch == delivered[-1]
    pub.close(linger=5)
    th.join(20)
    assert got == list(range(n))
    stalled.close()
    fast.close()


def test_silent_publisher_is_reported_lost():
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)  # accepts the connection but never answers
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    try:
        with Subscriber("t", endpoints=[f"tcp://127.0.0.1:{port}"], timeout=0.5) as sub:
            t0 = time.monotonic()
            with pytest.raises(PublisherLost, match="partition 0"):
                sub.wait_ready(5)
            assert time.monotonic() - t0 < 3
    finally:
        fake.close(0)


def test_idle_stream_keeps_subscriber_alive_with_heartbeats():
    with Publisher("t", heartbeat_interval=0.1) as pub:
        with Subscriber("t", endpoints=[pub.endpoint], timeout=0.5) as sub:
            assert sub.wait_ready(5)
            with pytest.raises(TimeoutError):
                for _ in sub.epochs(timeout=1.5):  # 1.5 s idle > 0.5 s timeout: heartbeats keep it alive
                    pass


def test_no_lost_wakeup_between_caller_and_publisher_loop():
    """Regression: a wake-up consumed while the loop was already draining left the 'kicked' flag
    set, so the next call waited for the loop's idle timeout (the heartbeat interval). With a
    30 s heartbeat, any lost wake-up makes this ping-pong time out."""
    with Publisher("t", heartbeat_interval=30) as pub, \
            Subscriber("t", endpoints=[pub.endpoint], timeout=60, ping_interval=30) as sub:
        assert sub.wait_ready(5)
        epochs = sub.epochs(timeout=5)  # TimeoutError if an epoch takes longer than 5 s
        for e in range(300):
            for _ in range(5):  # a burst: later calls land while the loop drains earlier ones
                pub.send(e, [e])
            pub.advance_to(e + 1)
            assert next(epochs).time == e


def test_subscribers_count_includes_every_peer_that_has_its_snapshot(monkeypatch):
    """``Publisher.subscribers`` is read from another thread: a subscriber that is ready (it
    has the snapshot) must already be counted. CI caught the loop registering the peer only
    after sending the snapshot; the slowed ``join`` below widens that window to 0.5 s."""
    from epochstream.transport import fanout
    real_join = fanout.Fanout.join

    def slow_join(self, *args, **kwargs):
        time.sleep(0.5)
        return real_join(self, *args, **kwargs)

    monkeypatch.setattr(fanout.Fanout, "join", slow_join)
    pub = Publisher("count", 0)
    sub = Subscriber("count", endpoints=[pub.endpoint], timeout=5)
    try:
        assert sub.wait_ready(5)
        assert pub.subscribers == 1
    finally:
        sub.close()
        pub.close(linger=0.5)
