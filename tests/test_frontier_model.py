"""MutableAntichain / Antichain against brute-force models (Hypothesis stateful testing).

The model is a plain dict of counts; its frontier is the minimal times with a positive count
(computed by :func:`epochstream.testing.minimal`, O(n²)). After every batch of updates —
including counts > 1, zero deltas and transient negative counts — the frontier, the reported net
changes, the stored counts and ``less_equal``/``less_than`` must agree with the model.
"""

import hypothesis_profiles  # noqa: F401  (loads the Hypothesis profile)

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from epochstream.frontier import Antichain, MutableAntichain
from epochstream.order import TOTAL, dual, product
from epochstream.testing import maximal, minimal, universe


from user_orders import Divides, LexPairNoKey as LexPair  # noqa: E402


ORDERS = [TOTAL, product(1), product(2), product(3), product(4), LexPair(), Divides()]


def _ids(o):
    return getattr(o, "name", repr(o))


def machine_for(order):
    U = universe(order)
    updates = st.lists(st.tuples(st.sampled_from(U), st.integers(-2, 2)), max_size=6)

    class MutableAntichainMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.m = MutableAntichain(order)
            self.counts = collections.Counter()
            self.frontier = frozenset()

        def _apply(self, batch):
            for t, d in batch:
                self.counts[t] += d
            new = minimal(order, [t for t, c in self.counts.items() if c > 0])
            want = ({(t, -1) for t in self.frontier - new} | {(t, 1) for t in new - self.frontier})
            got = self.m.update_iter(batch)
            assert set(got) == want, f"changes {got!r} != {want!r} after {batch!r}"
            assert len(got) == len(want), f"duplicate changes {got!r}"
            # removals first
            signs = [d for _, d in got]
            assert signs == sorted(signs), f"removals must come first: {got!r}"
            self.frontier = new

        @rule(batch=updates)
        def update(self, batch):
            self._apply(batch)

        @rule(t=st.sampled_from(U), n=st.integers(1, 3))
        def transient_negative_then_positive(self, t, n):
            # a -n that arrives before its +n: the count is negative in between
            self._apply([(t, -n)])
            self._apply([(t, n)])

        @precondition(lambda self: any(c > 0 for c in self.counts.values()))
        @rule(data=st.data())
        def release_a_frontier_element(self, data):
            t = data.draw(st.sampled_from(sorted(self.frontier, key=repr)))
            self._apply([(t, -self.counts[t])])

        @rule(t=st.sampled_from(U))
        def zero_delta(self, t):
            self._apply([(t, 0)])

        @invariant()
        def agrees(self):
            assert set(self.m.frontier) == self.frontier
            assert len(self.m.frontier) == len(self.frontier)
            assert self.m.counts() == {t: c for t, c in self.counts.items() if c}
            assert len(self.m) == sum(1 for c in self.counts.values() if c)
            assert self.m.is_empty() == (not self.frontier)
            for t in U:
                assert self.m.count_for(t) == self.counts[t]
                assert self.m.less_equal(t) == any(order.le(f, t) for f in self.frontier)
                assert self.m.less_than(t) == any(order.lt(f, t) for f in self.frontier)

    MutableAntichainMachine.__name__ = f"MutableAntichainMachine_{_ids(order)}"
    MutableAntichainMachine.TestCase.settings = settings(settings.default, stateful_step_count=25)
    return MutableAntichainMachine


@pytest.mark.parametrize("order", ORDERS, ids=_ids)
def test_mutable_antichain_matches_model(order):
    machine_for(order).TestCase().runTest()


@pytest.mark.parametrize("order", ORDERS, ids=_ids)
def test_mutable_antichain_initial_updates_equal_update_iter(order):
    U = universe(order)

    @given(st.lists(st.tuples(st.sampled_from(U), st.integers(-2, 2)), max_size=10))
    def check(batch):
        m = MutableAntichain(order, batch)
        counts = collections.Counter()
        for t, d in batch:
            counts[t] += d
        assert set(m.frontier) == minimal(order, [t for t, c in counts.items() if c > 0])

    check()


@pytest.mark.parametrize("order", ORDERS, ids=_ids)
def test_antichain_insert_matches_model(order):
    U = universe(order)

    @given(st.lists(st.sampled_from(U), max_size=12), st.sampled_from(U))
    def check(ts, probe):
        a = Antichain(order, ts)
        assert set(a.elements) == minimal(order, ts)
        assert len(a.elements) == len(set(a.elements))
        assert a.less_equal(probe) == any(order.le(t, probe) for t in ts)
        assert a.less_than(probe) == any(order.lt(t, probe) for t in ts)
        up = Antichain(dual(order), ts)
        assert set(up.elements) == maximal(order, ts)

    check()


@pytest.mark.parametrize("order", ORDERS, ids=_ids)
def test_antichain_dominates_matches_model(order):
    U = universe(order)

    @given(st.lists(st.sampled_from(U), max_size=6), st.lists(st.sampled_from(U), max_size=6))
    def check(xs, ys):
        a, b = Antichain(order, xs), Antichain(order, ys)
        assert a.dominates(b) == all(any(order.le(x, y) for x in xs) for y in ys)
        assert (a == b) == (minimal(order, xs) == minimal(order, ys))

    check()
