"""The publisher protocol's hot-path caches (the last time that passed ``check_data``, the last
time inserted into the upper frontier) never change an answer: a Hypothesis state machine
drives one :class:`PublisherProtocol` with data at times drawn from a small pool of objects —
the same object again, an equal int that is another object, a list, a bool, the wrong shape —
interleaved with ``advance_to``, ``progress`` and ``close``, and compares every answer (the
normalised time or the error, the lower and upper frontiers) with a brute-force model that
recomputes them from scratch on every call."""

import hypothesis_profiles  # noqa: F401  (loads the Hypothesis profile)

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from epochstream.errors import ProtocolError
from epochstream.order import TOTAL, product
from epochstream.protocol import PublisherProtocol

from hypothesis_profiles import examples


def _pool(order):
    """Times to send: shared objects (sent again as the same object), equal ints built afresh
    (``int(str(n))``: another object above the small-int cache), lists and garbage."""
    if order is TOTAL:
        shared = [0, 1, 2, 3, 300, 301, 10 ** 6]
        return shared + [lambda n=n: int(str(n)) for n in (300, 301, 10 ** 6)] + [True, (1,), "1"]
    shared = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 3), (300, 300)]
    return shared + [lambda t=t: list(t) for t in shared[:3]] + [
        lambda: (int("300"), int("300")), (True, 1), (1,), 5]


class Model:
    """Recomputes everything: held capabilities as a multiset, the upper frontier as the
    maximal elements of every accepted time."""

    def __init__(self, order):
        self.order = order
        self.held = {order.minimum: 1}
        self.seen: list = []

    def lower(self) -> set:
        le = self.order.le
        live = [t for t, c in self.held.items() if c > 0]
        return {t for t in live if not any(o != t and le(o, t) for o in live)}

    def upper(self) -> set:
        le = self.order.le
        return {t for t in self.seen if not any(o != t and le(t, o) for o in self.seen)}

    def check(self, t):
        t = self.order.check(t)
        if not any(self.order.le(e, t) for e in self.lower()):
            raise ProtocolError("behind")
        return t


class CacheMachine(RuleBasedStateMachine):
    @initialize(order=st.sampled_from([TOTAL, product(2)]))
    def start(self, order):
        self.order = order
        self.pool = _pool(order)
        self.pub = PublisherProtocol(order)
        self.model = Model(order)

    def _time(self, i):
        t = self.pool[i % len(self.pool)]
        return t() if callable(t) else t

    def _same(self, call, t):
        """``call(t)`` answers as the model: the normalised time (returned), or ProtocolError
        (``None``)."""
        try:
            want = self.model.check(t)
        except ProtocolError:
            with pytest.raises(ProtocolError):
                call(t)
            return None
        got = call(t)
        assert got == want and type(got) is type(want)
        return got

    @rule(i=st.integers(0, 40))
    def data(self, i):
        got = self._same(self.pub.accept, self._time(i))
        if got is not None:
            self.model.seen.append(got)

    @rule(i=st.integers(0, 40))
    def check_only(self, i):  # check_data alone (what send_encoded calls first)
        self._same(self.pub.check_data, self._time(i))

    @rule(i=st.integers(0, 40))
    def advance_to(self, i):
        t = self._time(i)
        try:
            t = self.order.check(t)
            live = [c for c, n in self.model.held.items() if n > 0]
            ok = bool(live) and all(self.order.le(c, t) for c in live)
        except ProtocolError:
            ok = False
        if not ok:
            with pytest.raises(ProtocolError):
                self.pub.advance_to(self._time(i))
            return
        self.pub.advance_to(t)
        self.model.held = {t: 1}

    @rule(i=st.integers(0, 40), j=st.integers(0, 40))
    def progress(self, i, j):  # mint a capability at a later time, release one held
        try:
            new = self.order.check(self._time(i))
        except ProtocolError:
            return
        held = sorted((t for t, n in self.model.held.items() if n > 0), key=repr)
        if not held or not self.order.le(held[j % len(held)], new):
            return
        old = held[j % len(held)]
        self.pub.progress([(new, 1), (old, -1)])
        self.model.held[new] = self.model.held.get(new, 0) + 1
        self.model.held[old] -= 1

    @rule()
    def close(self):
        self.pub.close()
        self.model.held = {}

    @invariant()
    def frontiers_agree(self):
        if not hasattr(self, "pub"):
            return
        assert set(self.pub.lower) == self.model.lower()
        assert set(self.pub.upper) == self.model.upper()


TestCache = CacheMachine.TestCase
TestCache.settings = settings(max_examples=examples(400), stateful_step_count=20)
