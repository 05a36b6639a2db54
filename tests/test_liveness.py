"""The pure liveness policy of a subscriber (epochstream.transport.liveness), no sockets: random
message arrivals and clock readings chosen by Hypothesis."""
import hypothesis.strategies as st
from hypothesis import given, settings

from hypothesis_profiles import examples

from epochstream.transport.liveness import Liveness

steps = st.lists(st.tuples(st.floats(0.0, 2.0), st.sets(st.integers(0, 2))), max_size=60)


@settings(max_examples=examples(200))
@given(timeout=st.floats(0.5, 10), ping=st.floats(0.05, 2), steps=steps)
def test_suspects_and_losses_follow_silence(timeout, ping, steps):
    live = Liveness(timeout, ping)
    now = 100.0
    live.join([0, 1, 2], now)
    heard = {0: now, 1: now, 2: now}
    last_lookup = None
    last_ping = now
    for dt, arrivals in steps:
        now += dt
        for p in arrivals:
            live.heard(p, now)
            heard[p] = now
        if live.ping_due(now):
            assert now - last_ping >= ping
            last_ping = now
        else:
            assert now - last_ping < ping
        got = live.suspects(now)
        after = min(timeout, 3 * ping)
        silent = {p: now - h for p, h in heard.items() if now - h > after}
        if got:
            assert dict(got) == silent  # exactly the silent partitions, with their silence
            past = any(s > timeout for s in silent.values())
            assert past or last_lookup is None or now - last_lookup >= ping  # rate-limited
            last_lookup = now
        elif silent:
            # nothing to look up only while rate-limited and nobody is past the timeout
            assert last_lookup is not None and now - last_lookup < ping
            assert all(s <= timeout for s in silent.values())
        for p, s in got:
            assert live.lost(s) == (s > timeout)


@settings(max_examples=examples(100))
@given(timeout=st.floats(0.5, 5), ping=st.floats(0.05, 1), gaps=st.lists(st.floats(0, 1), max_size=30))
def test_awaited_successor_checks_are_rate_limited(timeout, ping, gaps):
    live = Liveness(timeout, ping)
    now = 0.0
    live.join([0, 1], now)
    assert not live.successor_check_due(now)  # nothing awaited
    live.await_successor(1, "inc-a", now, "aborted")
    assert 1 not in live.last_heard and live.awaiting[1][1] == now + timeout
    last = None
    for dt in gaps:
        now += dt
        if live.successor_check_due(now):
            assert last is None or now - last >= ping / 4
            last = now


def test_a_rejoin_forgets_what_was_awaited():
    live = Liveness(1.0, 0.1)
    live.join([0], 0.0)
    live.await_successor(0, "x", 0.0, "aborted")
    live.join([0], 5.0)
    assert not live.awaiting and live.last_heard == {0: 5.0}
