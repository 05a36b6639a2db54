"""Issue 4: slow subscribers, failure detection both ways, restarts, flow control, bad input.

Real processes (``tests/sockets/fault_peer.py``) are killed with SIGKILL; real sockets on 127.0.0.1.
Measured detection times are printed (``pytest -s``) and recorded in docs/reliability.md.
"""
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import zmq

from peer_processes import kill as _kill, read_until as _read_until
from epochstream import wire
from epochstream.catalog import Catalog
from epochstream.errors import ProtocolError, PublisherLost
from epochstream.transport import Gap, Publisher, Subscriber

PEER = str(Path(__file__).with_name("fault_peer.py"))


def _spawn(*args):
    proc = subprocess.Popen([sys.executable, PEER, *map(str, args)], stdout=subprocess.PIPE,
                            text=True, bufsize=1)
    return proc


# -- slow subscribers -------------------------------------------------------------------------
def test_recovery_reports_gap_and_never_a_partial_or_duplicate_epoch():
    pub = Publisher("t", max_queue_messages=200)
    sub = Subscriber("t", endpoints=[pub.endpoint], rcvhwm=10, recover=True)
    assert sub.wait_ready(5)
    payload = list(range(4000))  # ~12 KB: more than loopback TCP buffers hold
    n = 1500
    for t in range(n):  # the subscriber does not read: it is evicted on the way
        pub.send(t, payload)
        pub.advance_to(t + 1)
    pub.flush()
    assert pub.stats["subscribers_evicted"] >= 1
    seen, gaps = [], []
    done = threading.Event()

    def consume():
        for item in sub.epochs(timeout=10):
            if isinstance(item, Gap):
                gaps.append(item)
            else:
                assert len(item) == 4000  # whole
                seen.append(item.time)
        done.set()

    th = threading.Thread(target=consume)
    th.start()
    deadline = time.monotonic() + 20
    while not gaps and time.monotonic() < deadline:  # keep publishing until it re-joined
        time.sleep(0.01)
    for t in range(n, n + 50):
        pub.send(t, payload)
        pub.advance_to(t + 1)
        time.sleep(0.002)
    pub.close(linger=5)
    th.join(30)
    assert done.is_set()
    assert gaps and gaps[0].reason == "lagged"
    assert len(seen) == len(set(seen)) and seen == sorted(seen)  # no epoch twice, in order
    missed = [t for t in range(n + 50) if t not in seen]
    assert missed, "the stalled subscriber cannot have seen everything"
    assert all(any(g.may_have_missed(t) for g in gaps) for t in missed), (gaps, missed[:3], missed[-3:])  # every hole reported
    assert seen[-1] == n + 49  # and it caught up with the live stream
    sub.close()


def test_credit_flow_control_slow_steady_consumer_is_never_evicted():
    pub = Publisher("t", max_queue_messages=20, sndhwm=10, queue_hwm=10)
    sub = Subscriber("t", endpoints=[pub.endpoint], credit=8, rcvhwm=10)
    assert sub.wait_ready(5)
    got = []

    def consume():
        for e in sub.epochs(timeout=20):
            got.append(e.time)
            time.sleep(0.002)  # slow but steady

    th = threading.Thread(target=consume)
    th.start()
    t0 = time.monotonic()
    n = 400
    for t in range(n):
        pub.send(t, list(range(100)))
        pub.advance_to(t + 1)
    publish_time = time.monotonic() - t0
    pub.close(linger=10)
    th.join(30)
    assert got == list(range(n))
    assert pub.stats["subscribers_evicted"] == 0
    # back-pressure: the publisher could not run ahead of the consumer's ~2 ms per epoch
    assert publish_time > n * 0.002 * 0.5
    sub.close()


def test_credit_must_be_sensible():
    with pytest.raises(ValueError, match="credit"):
        Subscriber("t", endpoints=["tcp://127.0.0.1:1"], credit=0)


# -- failure detection ------------------------------------------------------------------------
def test_killed_publisher_is_detected_as_publisher_lost(tmp_path):
    cat = tmp_path / "cat"
    proc = _spawn("publisher", cat, "t", 0, 3, 50)
    try:
        _read_until(proc, "READY")
        with Subscriber("t", catalog=Catalog(cat), timeout=1.0) as sub:
            assert sub.wait_ready(10)
            _read_until(proc, "EPOCH 2")
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(PublisherLost, match="partition 0") as info:
                for _ in sub.epochs():
                    pass
            detection = time.monotonic() - killed
        print(f"\nkill -9 publisher detected after {detection:.2f} s (timeout 1.0 s)")
        assert info.value.partition == 0
        assert detection < 1.0 + 1.5
        # the catalog sees the dead holder
        part = Catalog(cat).lookup("t").partition_info[0]
        assert part.state == "dead"
    finally:
        _kill(proc)


def test_restarted_publisher_is_detected_and_subscriber_resnapshots(tmp_path):
    cat = tmp_path / "cat"
    proc = _spawn("publisher", cat, "t", 0, 5, 100)
    proc2 = None
    try:
        _, first_incarnation, _ = _read_until(proc, "READY")
        sub = Subscriber("t", catalog=Catalog(cat), timeout=10.0, recover=True, ping_interval=0.2)
        assert sub.wait_ready(10)
        items = []
        ended = []

        def consume():
            try:
                items.extend(sub.epochs(timeout=15))
            except PublisherLost as exc:  # how this stream ends: the last publisher is killed
                ended.append(exc)

        th = threading.Thread(target=consume, daemon=True)
        th.start()
        _read_until(proc, "EPOCH 4")
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # the restarted publisher resumes at epoch 5 (what a Spark query restarted from its
        # checkpoint does), with a new incarnation, possibly on another port
        proc2 = _spawn("publisher", cat, "t", 5, 10, 5)  # epochs 5..14 at 5 epochs/s
        _, second_incarnation, _ = _read_until(proc2, "READY")
        registered = time.monotonic()
        assert second_incarnation != first_incarnation
        deadline = time.monotonic() + 10
        while not any(isinstance(i, Gap) for i in items) and time.monotonic() < deadline:
            time.sleep(0.005)
        detected = time.monotonic() - registered
        print(f"\nrestarted publisher detected {detected:.2f} s after it registered "
              f"(ping 0.2 s, catalog checked while silent)")
        _read_until(proc2, "EPOCH 14")
        deadline = time.monotonic() + 10
        while not any(getattr(i, "time", None) == 14 for i in items) and time.monotonic() < deadline:
            time.sleep(0.01)
        sub.timeout = 0.5
        _kill(proc2)  # ends the stream for the subscriber: PublisherLost ends the thread
        th.join(15)
        assert ended and ended[0].partition == 0
        epochs = [i for i in items if not isinstance(i, Gap)]
        gaps = [i for i in items if isinstance(i, Gap)]
        times = [e.time for e in epochs]
        assert len(gaps) == 1 and gaps[0].reason == "restarted" and gaps[0].partition == 0
        assert detected < 3.0
        assert times == sorted(set(times))  # no epoch twice, in order
        assert all(len(e) == 10 for e in epochs)  # whole
        before = [t for t in times if t <= gaps[0].last_epoch]
        after = [t for t in times if t > gaps[0].last_epoch]
        assert before == list(range(before[0], before[-1] + 1)) and before[-1] >= 3
        assert after and after[-1] == 14 and after == list(range(after[0], 15))
        missed = [t for t in range(before[-1] + 1, after[0])]
        assert all(gaps[0].may_have_missed(t) for t in missed)  # every hole is reported
        assert sub.incarnations[0] == second_incarnation
        sub.close()
    finally:
        _kill(proc)
        if proc2 is not None:
            _kill(proc2)


def test_publisher_process_exiting_right_after_close_delivers_everything():
    """Regression: close() used to close the socket with a fixed 2 s linger, and a process that
    exited right after close() lost what was still queued for a subscriber that was behind (the
    subscriber then saw PublisherLost instead of the end of the stream)."""
    proc = subprocess.Popen([sys.executable, PEER, "burst", "t", "3000", "4000"], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, bufsize=1)
    try:
        _, endpoint = _read_until(proc, "READY")
        with Subscriber("t", endpoints=[endpoint], timeout=10) as sub:
            assert sub.wait_ready(10)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            _read_until(proc, "CLOSED")  # ~36 MB published and closed; we have read nothing yet
            time.sleep(1.0)  # ... and stay behind for a while
            times = [e.time for e in sub.epochs(timeout=30)]
        assert times == list(range(3000)) and sub.finished
        assert proc.wait(30) == 0
    finally:
        _kill(proc)


def test_killed_subscriber_is_freed_by_the_publisher():
    with Publisher("t", heartbeat_interval=0.2) as pub:
        proc = _spawn("subscriber", pub.endpoint, "t")
        try:
            _read_until(proc, "READY")
            deadline = time.monotonic() + 5
            while pub.subscribers != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pub.subscribers == 1
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            while pub.subscribers and time.monotonic() - killed < 5:
                time.sleep(0.01)
            freed = time.monotonic() - killed
            print(f"\nkill -9 subscriber freed after {freed:.2f} s (heartbeat 0.2 s)")
            assert pub.subscribers == 0 and freed < 0.2 * 4 + 1
        finally:
            _kill(proc)


def test_reconnecting_subscriber_gets_a_fresh_snapshot():
    with Publisher("t") as pub:
        s1 = Subscriber("t", endpoints=[pub.endpoint])
        assert s1.wait_ready(5)
        pub.send(0, ["a"])
        pub.advance_to(1)
        pub.send(1, ["b"])
        pub.flush()
        s1.close()
        s2 = Subscriber("t", endpoints=[pub.endpoint])
        assert s2.wait_ready(5)
        assert s2.snapshots[0].lower == (1,) and s2.snapshots[0].upper == (1,)
        pub.advance_to(2)
        pub.send(2, ["c"])
        pub.close()
        assert [e.time for e in s2.epochs(timeout=5)] == [2]
        s2.close()


def test_publisher_memory_stays_bounded_with_a_stalled_subscriber():
    """RSS of the publishing process with one stalled subscriber over thousands of epochs."""
    proc = psutil.Process()
    pub = Publisher("t", max_queue_messages=2000, max_queue_bytes=8 << 20)
    stalled = Subscriber("t", endpoints=[pub.endpoint], rcvhwm=10)
    assert stalled.wait_ready(5)
    payload = list(range(1000))  # ~3 KB per message
    rss = []
    for t in range(6000):
        pub.send(t, payload)
        pub.advance_to(t + 1)
        if t % 1000 == 999:
            pub.flush()
            rss.append(proc.memory_info().rss)
    growth = (rss[-1] - rss[1]) / 2**20
    print(f"\nRSS with a stalled subscriber: {[round(r / 2**20) for r in rss]} MiB, "
          f"growth after eviction {growth:.1f} MiB (12000 messages, ~36 MB sent)")
    assert pub.stats["subscribers_evicted"] == 1
    assert growth < 16  # the backlog bound (8 MiB) plus noise, not the 36 MB published
    stalled.close()
    pub.close(linger=0.5)


# -- bad input --------------------------------------------------------------------------------
def test_progress_releasing_a_capability_never_held_is_refused():
    with Publisher("t") as pub, Subscriber("t", endpoints=[pub.endpoint]) as sub:
        assert sub.wait_ready(5)
        with pytest.raises(ProtocolError, match="never held"):
            pub.progress([(3, -1)])
        with pytest.raises(ProtocolError, match="never held"):
            pub.progress([(0, -2), (1, 1)])
        assert pub.lower == (0,)  # nothing applied
        pub.send(0, ["ok"])
        pub.close()
        assert [list(e.records) for e in sub.epochs(timeout=5)] == [["ok"]]


def test_oversized_and_garbage_messages_do_not_disturb_other_subscribers():
    with Publisher("t") as pub, Subscriber("t", endpoints=[pub.endpoint]) as good:
        assert good.wait_ready(5)
        ctx = zmq.Context.instance()
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(pub.endpoint)
        bad.send_multipart([wire.HELLO, b"x" * (1 << 17)])  # over the publisher's MAXMSGSIZE
        bad.send_multipart([b"h\x09", b"\x80"])  # unknown protocol version
        bad.send_multipart(wire.encode_control(wire.CREDIT, messages=5))  # credit unasked
        for t in range(10):
            pub.send(t, [t])
            pub.advance_to(t + 1)
        pub.close()
        assert [e.time for e in good.epochs(timeout=5)] == list(range(10))
        bad.close()
