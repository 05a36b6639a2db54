"""Publishers share one loop thread per process (issue 28, the curve of topics per process): a
publisher without an epoch log or catalog is a member of the process's
:class:`~epochstream.transport.reactor.Reactor` instead of running a thread (and a wake-up pipe)
of its own. Before, N publishers were N loop threads and 5 file descriptors each. Here: the
thread count, delivery through the shared thread, fairness (a flooding publisher does not
starve another's heartbeats), isolation (a loop that raises ends only its publisher), and
closing/aborting/creating publishers from several threads while others send. Real sockets on
127.0.0.1, real threads."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import zmq

from epochstream import wire
from epochstream.errors import ProtocolError, PublisherAborted
from epochstream.transport import Publisher, Subscriber
from epochstream.transport.reactor import OwnThread, SharedLoop, loop_mode, shared_reactor
from epochstream.retention import Retention

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import json, os, sys, threading, time
    from epochstream import Publisher, Subscriber
    n = int(sys.argv[1])
    tasks = lambda: len(os.listdir("/proc/self/task"))
    fds = lambda: len(os.listdir("/proc/self/fd"))
    Publisher("warm-up").close(linger=0, wait=True)  # the context, its I/O thread
    time.sleep(0.2)
    t0, f0 = tasks(), fds()
    pubs = [Publisher(f"shared-{i}", heartbeat_interval=1.0) for i in range(n)]
    t1, f1 = tasks(), fds()
    subs = [Subscriber(f"shared-{i}", endpoints=[p.endpoint], timeout=30)
            for i, p in enumerate(pubs)]
    ready = all(s.wait_ready(20) for s in subs)
    for i, p in enumerate(pubs):
        p.send(0, [i])
        p.send(1, [i, i])
        p.close()
    got = [[(e.time, list(e.records)) for e in s.epochs(timeout=30)] for s in subs]
    ok = sum(g == [(0, [i]), (1, [i, i])] for i, g in enumerate(got))
    for p in pubs:
        p.join(15)
    for s in subs:
        s.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the reactor's thread ends with its last publisher
    print(json.dumps({"threads": [t0, t1], "fds": [f0, f1], "ready": ready, "delivered": ok,
                      "left": [t.name for t in threading.enumerate()]}), flush=True)
    os._exit(0)
""")


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 4096,
                    reason="needs a file-descriptor limit of at least 4096")
def test_300_publishers_use_one_loop_thread_and_all_deliver():
    """Before: 300 publishers were 300 more threads (one loop thread each) and 5 descriptors
    each (the ROUTER's listener and mailbox, the wake-up pipe's two sockets)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT, "300"], capture_output=True, text=True,
                         timeout=110, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    (t0, t1), (f0, f1) = got["threads"], got["fds"]
    print(f"300 publishers: threads {t0} -> {t1}, fds {f0} -> {f1} "
          f"({(f1 - f0) / 300:.2f} per publisher)")
    assert t1 - t0 <= 2, got  # the reactor's thread (before: 300)
    assert (f1 - f0) / 300 <= 3.5, got  # (before: 5 per publisher)
    assert got["ready"] and got["delivered"] == 300, got
    assert got["left"] == ["MainThread"], got  # the reactor ended with its last publisher


def test_loop_mode_rule():
    assert loop_mode(None, log_kept=False, catalog=False) == "shared"
    assert loop_mode(None, log_kept=False, catalog=True) == "own"
    assert loop_mode(None, log_kept=True, catalog=True) == "own"
    assert loop_mode("shared", log_kept=False, catalog=True) == "shared"
    assert loop_mode("own", log_kept=False, catalog=False) == "own"
    with pytest.raises(ValueError, match="retention"):
        loop_mode("shared", log_kept=True, catalog=True)
    with pytest.raises(ValueError, match="loop must be"):
        loop_mode("threads", log_kept=False, catalog=False)


def test_shared_and_own_publishers_side_by_side(tmp_path):
    shared = Publisher("side-a", heartbeat_interval=0.1)
    own = Publisher("side-b", heartbeat_interval=0.1, loop="own")
    logged = Publisher("side-c", catalog=tmp_path / "c.db", retention=Retention())
    try:
        assert isinstance(shared._driver, SharedLoop)
        assert isinstance(own._driver, OwnThread) and isinstance(logged._driver, OwnThread)
        with pytest.raises(ValueError, match="retention"):
            Publisher("side-d", catalog=tmp_path / "c.db", retention=Retention(), loop="shared")
        for pub in (shared, own):
            with Subscriber(pub.topic, endpoints=[pub.endpoint], timeout=10) as sub:
                assert sub.wait_ready(5)
                pub.send(0, ["x"])
                pub.advance_to(1)
                first = next(iter(sub.epochs(timeout=5)))
                assert (first.time, list(first.records)) == (0, ["x"])
    finally:
        for pub in (shared, own, logged):
            pub.close(linger=0, wait=True)


def _hello(endpoint: str, topic: str, **fields) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart(wire.encode_control(wire.HELLO, topic=topic, partition=0, id=topic,
                                         **fields))
    return s


def test_a_flooding_publisher_does_not_starve_another_publishers_heartbeats():
    """One shared thread drives both: the flood's steps are bounded and round-robin, so the
    quiet publisher's heartbeats (every 0.1 s) keep coming."""
    busy = Publisher("flood", heartbeat_interval=1.0, queue_hwm=1000)
    quiet = Publisher("quiet", heartbeat_interval=0.1)
    assert busy._driver._reactor is quiet._driver._reactor
    stop = threading.Event()
    sent = [0]

    def flood():
        t = 0
        while not stop.is_set():
            try:
                for _ in range(200):
                    busy.send(t, [t, "x" * 50])
                busy.advance_to(t + 1)
            except ProtocolError:  # closed at the end of the test
                return
            sent[0] += 200
            t += 1

    reader = Subscriber("flood", endpoints=[busy.endpoint], timeout=20)
    peer = _hello(quiet.endpoint, "quiet")
    try:
        assert reader.wait_ready(5)
        assert peer.poll(5000)
        peer.recv_multipart()  # the snapshot
        threading.Thread(target=flood, daemon=True).start()
        consumed = threading.Thread(target=lambda: sum(1 for _ in reader.epochs(timeout=20)),
                                    daemon=True)
        consumed.start()
        beats, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 3.0:
            if peer.poll(100) and isinstance(wire.decode(peer.recv_multipart()),
                                             wire.Heartbeat):
                beats.append(time.monotonic())
        quiet.send(0, ["late"])  # data too: sent while the flood goes on
        t_sent = time.monotonic()
        while peer.poll(2000):
            if isinstance(wire.decode(peer.recv_multipart()), wire.DataMessage):
                break
        latency = time.monotonic() - t_sent
        gaps = [b - a for a, b in zip([t0] + beats, beats + [time.monotonic()])]
        print(f"flood sent {sent[0]} messages in 3 s; quiet: {len(beats)} heartbeats, "
              f"largest gap {max(gaps):.3f} s, data latency {latency * 1000:.1f} ms")
        assert sent[0] > 1000  # it did flood
        assert max(gaps) < 1.0 and len(beats) >= 10, gaps
        assert latency < 1.0
    finally:
        stop.set()
        peer.close(0)
        busy.close(linger=0, wait=True)
        quiet.close(linger=0, wait=True)
        reader.close()


class InjectedBug(BaseException):
    """A bug in the loop (a BaseException: PeerControl answers a bad message's Exception)."""


def test_a_loop_that_raises_ends_only_its_publisher():
    """The victim's loop raises (a bug, injected into its handling of a control message): its
    callers blocked at ``queue_hwm`` and its flush are released and raise, it is no longer
    driven; the reactor and the other publishers go on serving."""
    pubs = [Publisher(f"iso-{i}", heartbeat_interval=0.1) for i in range(2)]
    victim = Publisher("iso-victim", heartbeat_interval=0.1, queue_hwm=4,
                       max_queue_messages=4, credit_timeout=60)
    subs = [Subscriber(p.topic, endpoints=[p.endpoint], timeout=10) for p in pubs]
    stalled = _hello(victim.endpoint, "iso-victim", credit=1)  # grants 1 message, never more
    outcome: dict = {}

    def call(name, fn):
        try:
            fn()
            outcome[name] = "returned"
        except ProtocolError as e:
            outcome[name] = e

    try:
        assert all(s.wait_ready(5) for s in subs) and stalled.poll(5000)
        producer = threading.Thread(target=call, args=(
            "send", lambda: [victim.send(t, [t]) for t in range(100)]), daemon=True)
        producer.start()
        deadline = time.monotonic() + 5
        while not victim.would_block and time.monotonic() < deadline:
            time.sleep(0.01)
        assert victim.would_block  # flow control holds the producer back at queue_hwm

        def boom(*_):  # past the loop's own catch of a bad message's Exception
            raise InjectedBug("injected bug")

        victim._loop._control = boom
        stalled.send_multipart(wire.encode_control(wire.PING, id="x"))
        victim._driver.join(5)
        assert not victim._driver.is_alive()
        producer.join(5)
        assert not producer.is_alive()
        assert isinstance(outcome["send"], ProtocolError) and "loop died" in str(outcome["send"])
        assert isinstance(victim._loop.error, InjectedBug)
        assert victim.flush(1) is True  # nothing waits for a loop that ended
        with pytest.raises(ProtocolError, match="injected bug"):
            victim.send(500, [1])
        assert shared_reactor()._thread is not None and shared_reactor()._thread.is_alive()
        for p in pubs:  # the others still serve, through the same thread
            assert p._driver._reactor is victim._driver._reactor
            p.send(0, [p.topic])
            p.close()
        for p, s in zip(pubs, subs):
            assert [(e.time, list(e.records)) for e in s.epochs(timeout=10)] == [(0, [p.topic])]
    finally:
        stalled.close(0)
        victim.close(linger=0)
        for p in pubs:
            p.close(linger=0)
        for s in subs:
            s.close()


def _produce(pub: Publisher, epochs: int, errors: list) -> None:
    try:
        for t in range(epochs):
            pub.send(t, [t] * 10)
            pub.advance_to(t + 1)
            time.sleep(0.002)
    except ProtocolError as e:  # the closed/aborted one
        errors.append(e)


def test_closing_and_aborting_publishers_while_others_send():
    pubs = [Publisher(f"end-{i}", heartbeat_interval=0.2) for i in range(4)]
    subs = [Subscriber(p.topic, endpoints=[p.endpoint], timeout=15) for p in pubs]
    errors: list = [[] for _ in pubs]
    try:
        assert all(s.wait_ready(5) for s in subs)
        threads = [threading.Thread(target=_produce, args=(p, 400, errors[i]), daemon=True)
                   for i, p in enumerate(pubs[2:], start=2)]
        for th in threads:
            th.start()
        for t in range(5):
            for p in pubs[:2]:
                p.send(t, [t])
        pubs[0].close()  # while 2 and 3 send
        pubs[1].abort("stop here")
        got0 = [e.time for e in subs[0].epochs(timeout=10)]
        assert got0 == list(range(5)) and subs[0].finished
        assert pubs[0].join(10)  # (its subscriber read to the end: no linger)
        with pytest.raises(PublisherAborted):
            for _ in subs[1].epochs(timeout=10):
                pass
        for th in threads:
            th.join(30)
        for p in pubs[2:]:
            p.close()
        for s in subs[2:]:
            got = [e.time for e in s.epochs(timeout=15)]
            assert got == list(range(400))
        assert errors == [[], [], [], []]
    finally:
        for p in pubs:
            p.close(linger=0)
        for s in subs:
            s.close()


def test_close_from_another_thread_while_the_caller_is_blocked_at_hwm():
    """The caller is blocked in send by flow control (a subscriber granting no credit); another
    thread closes: the close goes through once the stalled subscriber is evicted
    (``credit_timeout``), the caller's next call raises, the publisher ends."""
    pub = Publisher("blocked", heartbeat_interval=0.1, queue_hwm=4, max_queue_messages=4,
                    credit_timeout=1.0)
    stalled = _hello(pub.endpoint, "blocked", credit=1)
    outcome: list = []

    def produce():
        try:
            for t in range(10_000):
                pub.send(t, [t])
        except ProtocolError as e:
            outcome.append(e)

    try:
        assert stalled.poll(5000)
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        deadline = time.monotonic() + 5
        while not pub.would_block and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.would_block
        t0 = time.monotonic()
        closer = threading.Thread(target=lambda: pub.close(linger=0.5, wait=True), daemon=True)
        closer.start()
        closer.join(15)
        producer.join(15)
        took = time.monotonic() - t0
        print(f"closed from another thread while blocked at hwm: {took:.2f} s")
        assert not closer.is_alive() and not producer.is_alive()
        assert pub.closed and not pub._driver.is_alive()
        assert len(outcome) == 1 and "closed" in str(outcome[0])
        assert took < 10
    finally:
        stalled.close(0)
        pub.close(linger=0)


def test_publishers_created_and_closed_concurrently_from_several_threads():
    """Four threads each create, use and close 25 publishers (the reactor's thread ends and
    starts again as its last member leaves and a new one comes) while one long-lived
    publisher keeps delivering through it."""
    reactor = shared_reactor()
    base = reactor.members
    steady = Publisher("steady", heartbeat_interval=0.1)
    sub = Subscriber("steady", endpoints=[steady.endpoint], timeout=20)
    failures: list = []

    def churn(k):
        try:
            for i in range(25):
                p = Publisher(f"churn-{k}-{i}", heartbeat_interval=0.05)
                with Subscriber(p.topic, endpoints=[p.endpoint], timeout=10) as s:
                    assert s.wait_ready(5)
                    p.send(0, [k, i])
                    if i % 3 == 2:
                        p.abort("churn", linger=0.5)
                    else:
                        p.close(linger=0.5)
                    if i % 3 != 2:
                        assert [list(e.records) for e in s.epochs(timeout=10)] == [[k, i]]
                p.join(5)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    try:
        assert sub.wait_ready(5)
        threads = [threading.Thread(target=churn, args=(k,), daemon=True) for k in range(4)]
        for th in threads:
            th.start()
        for t in range(50):
            steady.send(t, [t])
            steady.advance_to(t + 1)
            time.sleep(0.01)
        for th in threads:
            th.join(90)
        assert not failures, failures
        steady.close()
        assert [e.time for e in sub.epochs(timeout=10)] == list(range(50))
        assert steady.join(10)
        deadline = time.monotonic() + 5
        while reactor.members > base and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reactor.members == base
    finally:
        steady.close(linger=0)
        sub.close()


def test_reactor_ends_with_its_last_member_and_starts_again():
    reactor = shared_reactor()
    if reactor.members:
        pytest.skip("other publishers of this process are still open")
    for _ in range(3):
        p = Publisher("again", heartbeat_interval=0.1)
        assert reactor._thread is not None
        with Subscriber("again", endpoints=[p.endpoint], timeout=10) as s:
            assert s.wait_ready(5)
            p.send(0, ["x"])
            p.close()
            assert [list(e.records) for e in s.epochs(timeout=5)] == [["x"]]
        assert p.join(5)
        deadline = time.monotonic() + 5
        while reactor._thread is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reactor._thread is None


def test_a_reactor_that_dies_ends_its_members_and_the_next_publisher_gets_a_new_one(monkeypatch):
    """A bug in the reactor itself (injected where it computes its wait) ends every member with
    it — callers raise instead of queueing for a thread that is gone — and the process's next
    publisher is driven by a new reactor."""
    import epochstream.transport.reactor as reactor_module

    doomed = reactor_module.Reactor()
    monkeypatch.setattr(reactor_module, "_reactor", (os.getpid(), doomed))

    def bug():
        raise InjectedBug("reactor bug")

    monkeypatch.setattr(doomed, "_wait_s", bug)
    pub = Publisher("doomed", heartbeat_interval=0.1)
    try:
        assert pub._driver._reactor is doomed
        pub._driver.join(5)
        assert not pub._driver.is_alive() and isinstance(doomed.broken, InjectedBug)
        with pytest.raises(ProtocolError, match="reactor bug"):
            pub.send(0, [1])
        with Publisher("after", heartbeat_interval=0.1) as fresh:
            assert fresh._driver._reactor is not doomed
            with Subscriber("after", endpoints=[fresh.endpoint], timeout=10) as sub:
                assert sub.wait_ready(5)
                fresh.send(0, ["ok"])
                fresh.advance_to(1)
                assert list(next(iter(sub.epochs(timeout=5))).records) == ["ok"]
    finally:
        pub.close(linger=0)


def test_idle_members_cost_nothing_while_another_is_busy():
    """A pass of the reactor costs what is ready, not every member: 200 idle publishers (no
    subscribers, heartbeat 1 s) are stepped about twice a second each (their heartbeat timer,
    which wakes up to 1 ms early), however many passes a flooding one makes meanwhile."""
    idle = [Publisher(f"idle-{i}", heartbeat_interval=1.0) for i in range(200)]
    busy = Publisher("busy", heartbeat_interval=1.0)
    reader = Subscriber("busy", endpoints=[busy.endpoint], timeout=20)
    try:
        assert reader.wait_ready(5)
        time.sleep(0.3)  # their first steps
        before = [p._driver.steps for p in idle]
        busy_before, passes_before = busy._driver.steps, busy._driver._reactor.passes
        t0 = time.monotonic()
        t = 0
        while time.monotonic() - t0 < 2.0:
            for _ in range(100):
                busy.send(t, [t])
            busy.advance_to(t + 1)
            t += 1
        seconds = time.monotonic() - t0
        idle_steps = sum(p._driver.steps for p in idle) - sum(before)
        busy_steps = busy._driver.steps - busy_before
        passes = busy._driver._reactor.passes - passes_before
        print(f"{seconds:.1f} s: {passes} passes, busy {busy_steps} steps, 200 idle "
              f"{idle_steps} steps ({idle_steps / 200 / seconds:.2f} per member per second)")
        assert busy_steps > 100 and passes > 100
        assert idle_steps <= 200 * (seconds + 1) * 3  # not once per pass: that is 200 × passes
    finally:
        for p in [busy, *idle]:
            p.close(linger=0)
        reader.close()
