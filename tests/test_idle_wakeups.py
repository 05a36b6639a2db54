"""An idle subscriber in ``epochs()`` wakes a few times a second, not ten (issue 28, the idle
cost: 0.16-0.21 % of a core per idle subscriber at 10 polls a second, ~0.06 % at 2-3): while
nothing arrives each poll waits up to ``EPOCHS_IDLE_SLICE`` (bounded by half the ping interval
and by what is left of ``timeout``); a message still wakes it at once."""

from __future__ import annotations

import threading
import time

import pytest

from epochstream import Publisher, Subscriber

pytestmark = pytest.mark.timeout(30)


def _counting(sub):
    calls = []
    step = sub._step

    def counted(slice_s):
        calls.append(slice_s)
        return step(slice_s)
    sub._step = counted
    return calls


def test_idle_epochs_polls_a_few_times_a_second_and_data_still_wakes_it():
    pub = Publisher("idle-wakeups", codec="msgpack", heartbeat_interval=1.0)
    sub = Subscriber("idle-wakeups", endpoints=[pub.endpoint], codec="msgpack", timeout=30)
    try:
        assert sub.wait_ready(10)
        calls = _counting(sub)
        got = []

        def consume():
            for ep in sub.epochs(timeout=20):
                got.append((ep.time, time.monotonic()))
                return
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        time.sleep(2.5)
        idle_polls = len(calls)
        assert idle_polls <= 14, f"{idle_polls} polls in 2.5 idle seconds (10 a second before)"
        assert max(calls) >= 0.4
        sent_at = time.monotonic()
        pub.send(0, [(1, 2)])
        pub.advance_to(1)
        t.join(10)
        assert got and got[0][0] == 0
        assert got[0][1] - sent_at < 0.45  # a message wakes the poll at once (the idle slice is 0.5 s)
    finally:
        sub.close()
        pub.close(linger=1)


def test_an_idle_timeout_is_still_kept_to_about_a_tenth_of_a_second():
    pub = Publisher("idle-timeout", codec="msgpack", heartbeat_interval=1.0)
    sub = Subscriber("idle-timeout", endpoints=[pub.endpoint], codec="msgpack", timeout=30)
    try:
        assert sub.wait_ready(10)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            for _ in sub.epochs(timeout=0.7):
                pass
        assert 0.7 <= time.monotonic() - t0 < 1.05  # the last slice ends with the timeout (unbounded: ~1.1 s)
    finally:
        sub.close()
        pub.close(linger=1)
