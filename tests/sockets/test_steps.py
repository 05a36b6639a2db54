"""The Subscriber's public non-blocking step (what ``aio`` drives, issue 22): ``sockets`` to
wait on, ``step_events(0)`` to take what arrived, ``wait_ready(0)`` to read without waiting;
and ``events()`` keeps what it read ahead when the caller leaves it (``break``)."""

import collections
import time

import zmq

from epochstream.events import DataMessage, LowerFrontierUpdate
from epochstream.transport import Publisher, Subscriber
from epochstream.transport.subscriber import pop_event


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
            pending = collections.deque(got)
            while (ev := pop_event(pending)) is not None:
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


def test_a_step_decodes_each_message_when_it_is_consumed_not_the_whole_batch():
    """A step hands out one poll's messages lazily: nothing is decoded until consumed, then
    one message per event. Before, a step decoded its whole batch (up to 256 messages) at
    once: at 1000 tuples per message ~256,000 objects lived together and the garbage
    collector ran ~1,000 times more; records/s halved (benchmarks.ab tuples1000: 0.51x)."""
    pub = Publisher("lazy", heartbeat_interval=0.2)
    sub = Subscriber("lazy", endpoints=[pub.endpoint], timeout=10)
    decoded = []
    real = sub.codec.decode

    def counting(payload):
        decoded.append(1)
        return real(payload)
    sub.codec.decode = counting
    try:
        assert sub.wait_ready(5)
        for t in range(20):
            pub.send(t, [("r", t)])
        pub.flush()
        time.sleep(0.3)  # all 20 messages arrive: one step reads them together
        handed = 0
        for _ in range(5):  # (the first step may hold only the snapshot's frontier)
            before = len(decoded)
            got = sub.step_events(1.0)
            assert len(decoded) == before, "the step decoded before anything was consumed"
            pending = collections.deque(got or [])
            while (ev := pop_event(pending)) is not None:
                handed += type(ev) is DataMessage
                assert len(decoded) == handed  # decoded one by one, as they are handed out
            if handed:
                break
        assert handed == 20
    finally:
        pub.close()
        sub.close()
