"""The relay's upstream policy (epochstream/transport/upstream.py), pure: a Hypothesis state
machine plays a relay's publisher loop (hellos, updates, byes, frontier advances, ticks) and its
relay thread (granting or failing each change asked for, at a boundary beyond every epoch begun)
and checks the safety property: every subscriber is served, from the epoch it is served from
(its floor, or the lower frontier when it was admitted), only epochs whose upstream filter
covers what it needs."""

from __future__ import annotations

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from epochstream.filters import Filter, covers
from epochstream.order import TOTAL
from epochstream.transport.upstream import HELLO, MAX_HELD, UPDATE, UpstreamCover

KEY = "c"
FILTERS = [Filter(), Filter(keys=["AA"]), Filter(keys=["UA"]), Filter(keys=["AA", "UA"]),
           Filter(where=[("c", "in", ["DL"])]), Filter(where=[("d", ">", 3)]),
           Filter(keys=["AA"], columns=["t"]), Filter(keys=["UA"], where=[("d", "<", 2)])]
filters = st.sampled_from(FILTERS)


class Relay(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.up = UpstreamCover(TOTAL, KEY)
        self.lower = 0          # the relay's lower frontier (a total order: one time)
        self.begun = 0          # the newest epoch data arrived for
        self.upstream = [(0, Filter())]  # the upstream program: (from epoch, filter)
        self.served: dict[str, tuple] = {}  # subscriber -> (from epoch, filters needed)
        self.asked = None
        self.n = 0

    # -- the relay thread --------------------------------------------------------------
    def _in_force(self, t: int) -> Filter:
        return [f for b, f in self.upstream if b <= t][-1]

    @precondition(lambda self: self.asked is not None)
    @rule(fail=st.booleans())
    def relay_answers(self, fail):
        target, self.asked = self.asked, None
        if fail:
            self.up.failed()  # refused: hellos are not served, updates keep the old filter
            return
        b = self.begun + 1  # boundary(): beyond every epoch data was sent for
        self.upstream.append((b, target))
        self.up.granted(target, (b,))
        self._serve_ready()

    # -- the loop ------------------------------------------------------------------------
    def _ask(self, target):
        if target is not None:
            assert self.asked is None  # one change at a time
            self.asked = target

    def _serve_ready(self):
        while self.up.ready:
            kind, (name, fs), floor = self.up.ready.pop(0)
            start = max(floor[0], self.lower)
            if kind == UPDATE:  # the change takes effect at or beyond the floor
                old_from, old = self.served[name]
                self.served[name] = (old_from, old + fs, start)
            else:
                self.served[name] = (start, fs)
        self._ask(self.up.request(self._live()))

    def _live(self):
        return [f for v in self.served.values() for f in v[1]]

    def _needs(self, f):
        return (f,)

    @rule(f=filters)
    def hello(self, f):
        name = f"s{self.n}"
        self.n += 1
        fs = self._needs(f)
        if self.up.admit(fs):
            self.served[name] = (self.lower, fs)
            return
        held = self.up.hold(HELLO, (name, fs), fs)
        assert held or len(self.up.held) >= MAX_HELD
        self._serve_ready()

    @precondition(lambda self: self.served)
    @rule(data=st.data(), f=filters)
    def update(self, data, f):
        name = data.draw(st.sampled_from(sorted(self.served)))
        if len(self.served[name]) == 3:  # one change at a time per subscriber
            return
        fs = self.served[name][1] + (f,)  # a program during a change: old and new
        self.up.drop(lambda item: item[0] == name)  # a newer update replaces a held one
        if self.up.admit(fs):
            start, old = self.served[name]
            self.served[name] = (start, fs, self.lower)
            return
        if self.up.hold(UPDATE, (name, (f,)), fs):
            self._serve_ready()

    @precondition(lambda self: self.served)
    @rule(data=st.data())
    def bye(self, data):
        name = data.draw(st.sampled_from(sorted(self.served)))
        del self.served[name]
        self.up.drop(lambda item: item[0] == name)

    @rule(ahead=st.none() | st.integers(0, 2), advance=st.integers(0, 2))
    def epoch(self, ahead, advance):
        if ahead is not None:  # data for an epoch at or beyond the lower frontier
            self.begun = max(self.begun, self.lower + ahead)
        if advance:
            self.lower += advance
            self.up.frontier((self.lower,))

    @rule()
    def tick(self):
        self._ask(self.up.narrow(self._live()))

    # -- safety ----------------------------------------------------------------------------
    @invariant()
    def every_served_epoch_is_covered(self):
        horizon = max(b for b, _ in self.upstream) + 2
        for name, entry in self.served.items():
            start, fs = entry[0], entry[1]
            for t in range(start, horizon):
                upstream = self._in_force(t)
                # a change's new filter applies only from where it took effect
                need = fs if len(entry) == 2 or t >= entry[2] else fs[:-1]
                for f in need:
                    assert covers(upstream, f, KEY), (name, t, upstream, f)
            if self.asked is not None:  # a change asked for still covers every served filter
                assert all(covers(self.asked, f, KEY) for f in fs), (name, self.asked)


TestUpstreamCover = Relay.TestCase


def test_examples():
    up = UpstreamCover(TOTAL, KEY)
    aa = Filter(keys=["AA"])
    assert up.admit([aa])                       # the initial cover is everything
    assert up.narrow([aa]) == aa                # narrowed to what the one subscriber needs
    assert up.asked == aa and not up.admit([Filter()])  # binds admissions at once
    up.granted(aa, (5,))
    assert up.hold(HELLO, "late", [Filter(keys=["UA"])])
    assert up.request([aa]) == Filter(keys=["AA", "UA"])
    assert up.request([aa]) is None             # one change at a time
    assert up.narrow([aa]) is None              # not while a hello is held
    up.granted(Filter(keys=["AA", "UA"]), (9,))
    assert up.ready == [(HELLO, "late", (9,))]  # served from the boundary on
    up.ready.clear()
    up.frontier((7,))
    assert up.cover == aa                       # (9,) not reached: still the old cover
    up.frontier((9,))
    assert up.cover == Filter(keys=["AA", "UA"]) and not up.transitions
    for i in range(MAX_HELD):
        assert up.hold(HELLO, i, [Filter(keys=[f"k{i}"])])
    assert not up.hold(HELLO, "one too many", [Filter(keys=["x"])])
    assert len(up.drop(lambda item: item == 3)) == 1
    assert len(up.failed()) == MAX_HELD - 1 and not up.held
