"""The Subscriber's public non-blocking step (what ``aio`` drives, issue 22): ``sockets`` to
wait on, ``step_events(0)`` to take what arrived, ``wait_ready(0)`` to read without waiting;
and ``events()`` keeps what it read ahead when the caller leaves it (``break``)."""

import time

import zmq

from epochstream.events import DataMessage, LowerFrontierUpdate
from epochstream.transport import Publisher, Subscriber


def _publish(pub, n):
    for t in range(n):
        pub.send(t, [("r", t)])
        pub.advance_to(t + 1)
    pub.close()


def test_an_event_loop_drives_the_step_over_the_public_sockets():
    pub = Publisher("steps", heartbeat_interval=0.2)
    sub = Subscriber("steps", endpoints=[pub.endpoint], timeout=10)
    try:
        deadline = time.monotonic() + 10
        while not sub.wait_ready(0):  # never blocks: read what arrived, then wait ourselves
            assert time.monotonic() < deadline
            zmq.select(list(sub.sockets), [], [], 0.05)
        _publish(pub, 30)
        records, frontier = [], []
        while True:
            got = sub.step_events(0)
            if got is None:
                break
            if not got:
                assert time.monotonic() < deadline, "the stream never ended"
                zmq.select(list(sub.sockets), [], [], 0.05)
                continue
            for ev in got:
                if type(ev) is DataMessage:
                    records.extend(ev.data)
                elif type(ev) is LowerFrontierUpdate:
                    frontier.append(ev)
        assert records == [("r", t) for t in range(30)]
        assert frontier and sub.finished
        assert sub.step_events(0) is None  # and so on, once ended
    finally:
        sub.close()


def test_leaving_events_after_each_item_loses_nothing():
    """Before, events() held the rest of a poll's batch in its generator: a caller that left
    the loop (break) lost it, and the next events() started after it."""
    pub = Publisher("leave", heartbeat_interval=0.2)
    sub = Subscriber("leave", endpoints=[pub.endpoint], timeout=10)
    try:
        assert sub.wait_ready(5)
        _publish(pub, 40)
        time.sleep(0.3)  # everything arrives: one poll reads many messages
        records = []
        for _ in range(1000):
            ev = next(iter(sub.events(timeout=5)), None)
            if ev is None:
                break
            if type(ev) is DataMessage:
                records.extend(ev.data)
        assert records == [("r", t) for t in range(40)]
    finally:
        sub.close()
