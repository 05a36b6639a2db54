"""The subscriber waits for its links with one ``epoll`` over the sockets' ``zmq.FD``
(transport/links.py). ZeroMQ signals that descriptor only when a command reaches the socket's
mailbox (a pipe read empty gets a message), and any operation on the socket may consume the
signal. These tests try to lose a wake-up: a message that waits while the subscriber sleeps.

Publishers here send heartbeats every 30 s and subscribers ping every 30 s (unless a test says
otherwise), so nothing but the message itself can wake a waiting subscriber: a lost wake-up
shows as a stall of many seconds, and the bounds below (a few seconds) catch it."""

import random
import time

import zmq

from epochstream.events import DataMessage
from epochstream.transport import Publisher, Subscriber

QUIET = 30.0  # heartbeat and ping interval: no timer wakes anybody during a test

#: what a delivery may take here before it counts as a stall (a lost wake-up waits QUIET)
PROMPT_S = 5.0


def _fetch_one_epoch(sub, deadline_s: float = PROMPT_S):
    t0 = time.monotonic()
    r = sub.fetch(max_epochs=1, expires=deadline_s)
    took = time.monotonic() - t0
    assert r.epochs, f"no epoch within {deadline_s} s: a wake-up was lost (status {r.status})"
    return r.epochs[0], took


def test_a_burst_longer_than_one_read_pass_is_read_without_a_new_signal():
    """A pass reads at most 128 messages of a socket; the rest must be read on the next passes
    although no new command (no signal) reaches the socket: the socket stays unsettled."""
    pub = Publisher("wake-burst", heartbeat_interval=QUIET)
    sub = Subscriber("wake-burst", endpoints=[pub.endpoint], ping_interval=QUIET, timeout=60)
    try:
        assert sub.wait_ready(10)
        for round_ in range(3):
            for i in range(900):
                pub.send(round_, [i])
            pub.advance_to(round_ + 1)
            epoch, took = _fetch_one_epoch(sub)
            assert epoch.time == round_ and len(epoch.records) == 900
            time.sleep(0.2)  # the subscriber goes back to waiting on the descriptor
    finally:
        sub.close()
        pub.close()


def test_many_partitions_one_late_message_at_a_time():
    """16 partitions; each round, every partition but one moves on first, then after a random
    pause the last one sends its data and moves on: the epoch completes only if that one
    message wakes the waiting subscriber. Pings every 5 ms (each send on a socket may consume
    its signal) make the race with the subscriber's own sends likely."""
    rng = random.Random(28)
    n = 16
    pubs = [Publisher("wake-many", partition=p, partitions=n, heartbeat_interval=QUIET)
            for p in range(n)]
    sub = Subscriber("wake-many", endpoints=[p.endpoint for p in pubs], ping_interval=0.005,
                     timeout=60)
    try:
        assert sub.wait_ready(10)
        worst = 0.0
        for t in range(60):
            last = rng.randrange(n)
            for p in range(n):
                if p != last:
                    pubs[p].advance_to(t + 1)
            time.sleep(rng.choice([0, 0.001, 0.003, 0.01]))
            pubs[last].send(t, [(last, t)])
            pubs[last].advance_to(t + 1)
            epoch, took = _fetch_one_epoch(sub)
            worst = max(worst, took)
            assert epoch.time == t and list(epoch.records) == [(last, t)]
    finally:
        sub.close()
        for p in pubs:
            p.close()


def test_an_outside_wait_on_the_sockets_does_not_hide_a_message_from_a_waiting_step():
    """An event loop waits on ``sub.sockets`` itself (zmq.select checks ``EVENTS``, which takes
    the socket's signal), then takes a step that may wait: the step must still see the
    message, not wait for a signal that was already taken."""
    pub = Publisher("wake-outside", heartbeat_interval=QUIET)
    sub = Subscriber("wake-outside", endpoints=[pub.endpoint], ping_interval=QUIET, timeout=60)
    try:
        assert sub.wait_ready(10)
        while sub.step_events(0):  # the snapshot's events
            pass
        for t in range(5):
            pub.send(0, [t])  # one message a round (events() hands data out as it arrives)
            readable, _, _ = zmq.select(list(sub.sockets), [], [], PROMPT_S)
            assert readable
            t0 = time.monotonic()
            got = sub.step_events(PROMPT_S)
            assert got, "the step waited for a signal the outside wait had taken"
            assert time.monotonic() - t0 < PROMPT_S / 2
            events = [e for it in got for e in it]
            assert [list(e.data) for e in events if type(e) is DataMessage] == [[t]]
            time.sleep(0.05)
    finally:
        sub.close()
        pub.close()


def test_a_waiting_read_costs_what_is_ready_not_the_partitions():
    """With 64 partitions, 63 idle: a pass hands out only the links that may be readable."""
    n = 64
    pubs = [Publisher("wake-cost", partition=p, partitions=n, heartbeat_interval=QUIET)
            for p in range(n)]
    sub = Subscriber("wake-cost", endpoints=[p.endpoint for p in pubs], ping_interval=QUIET,
                     timeout=60)
    try:
        assert sub.wait_ready(20)
        links = sub._join.links
        for _ in range(3):  # settle every link: each is read until zmq.Again once
            sub._join.poll(0.05)
        assert len(links.unsettled) == 0
        pubs[7].send(0, ["x"])
        deadline = time.monotonic() + PROMPT_S
        while not links.unsettled and time.monotonic() < deadline:
            handed = links.poll(100)
            if handed:
                assert [links.partition_of[s] for s in handed] == [7]
                break
        else:
            raise AssertionError("partition 7's message never woke the wait")
    finally:
        sub.close()
        for p in pubs:
            p.close()


def test_close_from_another_thread_ends_an_iterating_thread():
    """``close()`` while another thread is inside ``epochs()`` (waiting, or reading a busy
    stream): that thread ends with a ``ValueError`` naming the closed subscriber, at once —
    it neither spins on the emptied links nor waits on a closed ``epoll``. (Before, it spun
    at 100 % of a core forever once its wait had been emptied.)"""
    import threading
    for busy in (False, True):
        pub = Publisher(f"wake-close-{busy}", heartbeat_interval=0.2)
        sub = Subscriber(f"wake-close-{busy}", endpoints=[pub.endpoint], timeout=10)
        assert sub.wait_ready(10)
        seen, stop = [], threading.Event()

        def read():
            try:
                for e in sub.epochs():
                    seen.append(e.time)
            except ValueError as exc:
                seen.append(("closed", str(exc)))
            except Exception as exc:  # noqa: BLE001 - the test names what it got
                seen.append(("other", repr(exc)))

        def feed():
            t = 0
            while not stop.is_set():
                pub.send(t, [t])
                t += 1
                pub.advance_to(t)
                time.sleep(0.001)

        reader = threading.Thread(target=read, daemon=True)
        feeder = threading.Thread(target=feed, daemon=True)
        reader.start()
        if busy:
            feeder.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        sub.close()
        reader.join(5)
        stop.set()
        alive = reader.is_alive()
        if busy:
            feeder.join(5)
        pub.close()
        assert not alive, "the iterating thread did not end after close()"
        assert time.monotonic() - t0 < 2
        assert seen and seen[-1][0] == "closed" and "was closed" in seen[-1][1], seen[-3:]
