"""Tests of the public testing toolkit (:mod:`epochstream.testing`): the strategies generate
valid timely-style streams, the oracle matches hand-worked examples and is independent of the
production code, ``check_order`` catches broken orders, and the checker catches broken
subscribers (mutation tests)."""

import hypothesis_profiles  # noqa: F401  (loads the Hypothesis profile)

import collections
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from epochstream import protocol
from epochstream.errors import ProtocolError
from epochstream.order import TOTAL, product
from epochstream.protocol import PublisherProtocol
from epochstream import testing as T
from epochstream.testing import model
from epochstream.testing import (OrderViolation, antichains, assert_epoch_atomic, check_order,
                                 event_streams, lower_after, maximal, minimal, oracle, orders,
                                 times, universe)


# find() stops at the first example (no shrinking: we only need existence)
FIND = settings(max_examples=3000, database=None, phases=[Phase.generate])


# -- user-defined orders ---------------------------------------------------------------------
class LexPair:
    name = "lex2"
    minimum = (0, 0)
    universe = [(a, b) for a in range(3) for b in range(3)]
    le = staticmethod(lambda a, b: a <= b)
    lt = staticmethod(lambda a, b: a < b)
    key = staticmethod(lambda t: t)


class Capped:
    """Ints 0..cap (a bounded total order): times beyond the cap do not exist."""

    def __init__(self, cap=4):
        self.cap = cap
        self.name = f"capped({cap})"
        self.minimum = 0
        self.universe = list(range(cap + 1))

    def le(self, a, b):
        return a <= b <= self.cap

    def lt(self, a, b):
        return a < b <= self.cap


class Subsets:
    """Subsets of {0, 1, 2} ordered by inclusion (a bounded lattice, no key)."""

    name = "subsets"
    minimum = frozenset()
    universe = [frozenset(s) for s in [(), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]]
    le = staticmethod(lambda a, b: a <= b)
    lt = staticmethod(lambda a, b: a < b)


class Divides:
    name = "divides"
    minimum = 1
    universe = list(range(1, 13))
    le = staticmethod(lambda a, b: b % a == 0)
    lt = staticmethod(lambda a, b: a != b and b % a == 0)


USER_ORDERS = [LexPair(), Capped(), Subsets(), Divides()]
ALL_ORDERS = [TOTAL, product(1), product(2), product(3), product(4)] + USER_ORDERS


def _id(o):
    return getattr(o, "name", repr(o))


# -- check_order -----------------------------------------------------------------------------
@pytest.mark.parametrize("order", ALL_ORDERS, ids=_id)
def test_check_order_accepts_partial_orders(order):
    check_order(order, universe(order))


def test_check_order_accepts_every_shipped_order():
    @given(orders())
    def check(order):
        check_order(order, universe(order))

    check()


class _Broken:
    name = "broken"
    minimum = 0
    universe = list(range(5))

    def le(self, a, b):
        return a <= b

    def lt(self, a, b):
        return a < b


def _broken(**over):
    o = _Broken()
    for k, v in over.items():
        setattr(o, k, v)
    return o


@pytest.mark.parametrize("order,law,snippet", [
    (_broken(le=lambda a, b: a == 0 or 0 <= b - a <= 1, lt=lambda a, b: a != b and (a == 0 or 0 <= b - a <= 1)),
     "transitivity", "not transitive: 1 <= 2 and 2 <= 3 but not 1 <= 3"),
    (_broken(le=lambda a, b: min(a, 2) <= min(b, 2), lt=lambda a, b: min(a, 2) < min(b, 2)),
     "antisymmetry", "not antisymmetric"),
    (_broken(lt=lambda a, b: a <= b), "lt", "lt(0, 0) is True"),
    (_broken(minimum=1), "minimum", "minimum 1 is not <= 0"),
    (_broken(le=lambda a, b: a < b), "reflexivity", "not reflexive"),
    (_broken(key=lambda t: -t), "key", "key is not a linear extension: 0 < 1"),
    (_broken(key=lambda t: 0), "key", "key is not a linear extension"),
    (_broken(le=lambda a, b: 1 if a <= b else 0), "bool", "not a bool"),
], ids=["transitivity", "antisymmetry", "lt", "minimum", "reflexivity", "key-reversed",
        "key-constant", "bool"])
def test_check_order_rejects(order, law, snippet):
    with pytest.raises(OrderViolation) as info:
        check_order(order, range(5))
    assert info.value.law == law
    assert snippet in str(info.value)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)


def test_capped_preorder_is_caught_beyond_the_cap():
    """'ints capped at a max' as min(t, cap) is only a preorder: check_order names the pair."""
    o = _broken(le=lambda a, b: min(a, 3) <= min(b, 3), lt=lambda a, b: min(a, 3) < min(b, 3))
    check_order(o, range(4))  # fine up to the cap
    with pytest.raises(OrderViolation, match=r"3 <= 4 and 4 <= 3"):
        check_order(o, range(6))


# -- strategies ------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ALL_ORDERS, ids=_id)
def test_times_and_antichains(order):
    U = set(universe(order))

    @given(times(order), antichains(order))
    def check(t, a):
        assert t in U
        assert set(a) <= U and len(set(a)) == len(a)
        for x in a:
            for y in a:
                assert x == y or not order.le(x, y)

    check()


def test_universe_needs_a_hint_for_user_orders():
    class Bare:
        minimum = 0
        le = staticmethod(lambda a, b: a <= b)
        lt = staticmethod(lambda a, b: a < b)

    with pytest.raises(TypeError, match="universe"):
        universe(Bare())
    # an explicit universe always works (the minimum is added if missing)
    assert find(times(Bare(), universe=[3, 4]), lambda t: True) == 0


def _validate(stream):
    """Run each partition through PublisherProtocol; check the timely invariants."""
    order = stream.order
    for evs in stream.events:
        pub = PublisherProtocol(order)
        counts = collections.Counter({order.minimum: 1})
        prev = set(pub.lower)
        for i, e in enumerate(evs):
            assert not pub.closed, f"event after the partition finished: {e!r}"
            if e[0] == "data":
                pub.data(e[1], e[2])  # raises ProtocolError if no capability covers it
                continue
            if e[0] == "close":
                pub.close()
                assert i == len(evs) - 1
                continue
            pub.progress(e[1])
            for t, d in e[1]:
                counts[t] += d
            new = set(pub.lower)
            # the frontier never moves backwards: every new element is >= some old one
            for t in new:
                assert any(order.le(o, t) for o in prev), f"{t!r} appeared below {prev!r}"
            prev = new
            assert set(pub.lower) == lower_after(order, evs, i + 1)


@pytest.mark.parametrize("order", ALL_ORDERS, ids=_id)
def test_event_streams_are_valid(order):
    @given(event_streams(order, partitions=st.integers(1, 8)))
    def check(stream):
        _validate(stream)
        assert sorted(stream.interleaving) == sorted(p for p in range(stream.partitions)
                                                     for _ in stream.events[p])
        assert len(stream.joins) == len(stream.subscribe_at) >= 1
        for joins in stream.joins:
            assert all(0 <= j <= len(e) for j, e in zip(joins, stream.events))

    check()


def _min_accumulated(stream):
    lo = 0
    for evs in stream.events:
        c = collections.Counter()
        for e in evs:
            if e[0] == "progress":
                for t, d in e[1]:
                    c[t] += d
                lo = min(lo, min(c.values(), default=0))
    return lo


@pytest.mark.parametrize("desc,pred", [
    ("transient negative across batches", lambda s: _min_accumulated(s) < 0),
    ("count > 1", lambda s: any(e[0] == "progress" and any(d > 0 for t, d in e[1]) and
                                 lower_after(s.order, evs, 0) is not None and
                                 max(collections.Counter(t for e2 in evs[:i + 1] if e2[0] == "progress"
                                                         for t, d in e2[1] if d > 0).values(), default=0) > 1
                                 for evs in s.events for i, e in enumerate(evs))),
    ("zero delta", lambda s: any(e[0] == "progress" and any(d == 0 for _, d in e[1])
                                 for evs in s.events for e in evs)),
    ("explicit close", lambda s: any(evs and evs[-1] == ("close",) for evs in s.events)),
    ("open partition", lambda s: any(lower_after(s.order, evs, len(evs)) for evs in s.events)),
    ("data before and after a join", lambda s: any(
        any(e[0] == "data" for e in evs[:j]) and any(e[0] == "data" for e in evs[j:])
        for evs, j in zip(s.events, s.joins[0]))),
    ("a join after a partition closed", lambda s: any(
        j == len(evs) and not lower_after(s.order, evs, j) for evs, j in zip(s.events, s.joins[0]))),
    ("epoch shared by two partitions", lambda s: any(
        len({p for p, evs in enumerate(s.events) for e in evs if e[0] == "data" and e[1] == t}) > 1
        for t in s.records())),
])
def test_event_streams_cover(desc, pred):
    """The generator reaches each interesting situation (found quickly by Hypothesis)."""
    find(event_streams(product(2), partitions=st.integers(1, 4)), pred,
         settings=FIND)


# -- the oracle ------------------------------------------------------------------------------
def test_oracle_strymon_example():
    """The spec's example: completed [0, 1, 2], active [3, 5], latent [4, 6, ...]: the filter is
    {5}, so 4 is not delivered (no hole) and 6, 7 are."""
    events = [[("data", 3, ["a"]), ("data", 5, ["b"]), ("progress", [(3, 1), (0, -1)]),
               ("data", 3, ["a2"]), ("data", 4, ["c"]), ("data", 5, ["b2"]), ("data", 6, ["d"]),
               ("data", 7, ["e"]), ("close",)]]
    exp = oracle(TOTAL, events, [3])
    assert exp.filter == {5}
    assert exp.dropped == {3, 4, 5}
    assert exp.delivered == {6: ["d"], 7: ["e"]}
    assert exp.final_frontier == frozenset() and exp.lower_at_join == {3}
    assert_epoch_atomic(TOTAL, events, [3])


def test_oracle_multi_partition_product():
    P = product(2)
    events = [
        [("data", (0, 1), ["a"]), ("progress", [((1, 0), 1), ((0, 0), -1)]), ("data", (1, 0), ["b"]),
         ("data", (1, 1), ["c"])],
        [("data", (1, 1), ["d"]), ("data", (2, 0), ["e"]), ("close",)],
    ]
    exp = oracle(P, events, [1, 0])
    assert exp.filter == {(0, 1)}
    assert exp.dropped == {(0, 1)}
    assert exp.lower_at_join == {(0, 0)}
    assert exp.final_frontier == {(1, 0)}
    assert exp.delivered == {}  # partition 0 still holds (1, 0) <= (1, 0), (1, 1), (2, 0)
    assert exp.incomplete == {(1, 0): ["b"], (1, 1): ["c", "d"], (2, 0): ["e"]}
    events[0].append(("progress", [((1, 0), -1), ((2, 1), 1)]))
    exp = oracle(P, events, [1, 0])
    assert exp.final_frontier == {(2, 1)}
    # (2, 1) is <= none of them: all three epochs complete, (1, 1) merged from both partitions
    assert exp.delivered == {(1, 0): ["b"], (1, 1): ["c", "d"], (2, 0): ["e"]}
    assert exp.incomplete == {}
    assert_epoch_atomic(P, events, [1, 0])


def _names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _names(c)
    return names


# Imports the toolkit with the production frontier and protocol made unimportable, then runs the
# oracle and the strategies: any import of either, direct or indirect, fails it.
_BLOCKED_IMPORT = """
import sys, warnings
sys.modules["epochstream.frontier"] = sys.modules["epochstream.protocol"] = None
from epochstream.order import TOTAL, product
from epochstream.testing import event_streams, oracle
warnings.simplefilter("ignore")
exp = oracle(product(2), [[("data", (1, 0), ["a"]), ("close",)]], [0])
assert exp.delivered == {(1, 0): ["a"]} and exp.latent((1, 0)), exp
event_streams(TOTAL).example()
"""


def test_oracle_is_independent_of_production_code():
    """The oracle's code names no frontier/protocol code, no toolkit module imports either at
    the top, and the toolkit imports and runs its oracle and strategies without them."""
    banned = {"frontier", "protocol", "Antichain", "MutableAntichain", "PublisherProtocol",
              "SubscriberProtocol", "EpochAssembler", "replay"}
    fns = [f for f in vars(model).values()
           if inspect.isfunction(f) and f.__module__ == model.__name__]
    fns += [f for f in vars(model.Expected).values() if inspect.isfunction(f)]
    assert {T.oracle, T.minimal, T.maximal, T.lower_after, model._counts_after} <= set(fns)
    for fn in fns:
        names = {part for name in _names(fn.__code__) for part in name.split(".")}
        assert not (names & banned), (fn.__name__, names & banned)
    # no module of the toolkit imports them at the top
    modules = [T] + [importlib.import_module(f"{T.__name__}.{m.name}")
                     for m in pkgutil.iter_modules(T.__path__)]
    assert model in modules
    for mod in modules:
        top = [line for line in inspect.getsource(mod).splitlines()
               if line.startswith(("import ", "from "))]
        assert not any("frontier" in line or "protocol" in line for line in top), (mod.__name__, top)
    # and importing the toolkit loads neither, so the oracle runs without them
    done = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_minimal_maximal_brute_force():
    P = product(2)
    ts = [(0, 2), (1, 1), (2, 0), (1, 2), (0, 3)]
    assert minimal(P, ts) == {(0, 2), (1, 1), (2, 0)}
    assert maximal(P, ts) == {(2, 0), (1, 2), (0, 3)}
    assert minimal(P, []) == frozenset()


# -- user orders through the whole pipeline --------------------------------------------------
@pytest.mark.parametrize("order", USER_ORDERS, ids=_id)
def test_user_orders_epoch_atomic(order):
    @given(event_streams(order, partitions=st.integers(1, 5)), st.lists(st.integers(0, 7)))
    def check(stream, schedule):
        for joins in stream.joins:
            assert_epoch_atomic(stream, joins, schedule=schedule)

    check()


# -- mutation tests: the checker catches broken subscribers ---------------------------------
def _retire_on_le(self):
    """Strymon's pre-e3fadf1 rule: retire f once some lower element is >= f."""
    lower = self._lower.frontier
    keep = [f for f in self._filter if not any(self.order.le(f, e) for e in lower)]
    if len(keep) != len(self._filter):
        self._filter = protocol.Antichain(self._filter.order, keep)


def _never_filter(self, t):
    return True


@pytest.mark.parametrize("mutation", ["retire-on-le", "no-filter", "no-buffering"])
def test_checker_catches_broken_subscriber(monkeypatch, mutation):
    if mutation == "retire-on-le":
        monkeypatch.setattr(protocol.SubscriberProtocol, "_retire", _retire_on_le)
    elif mutation == "no-filter":
        monkeypatch.setattr(protocol.SubscriberProtocol, "_start", _start_without_filter)
    else:
        monkeypatch.setattr(protocol.SubscriberProtocol, "receive", _receive_without_buffering)

    def broken(stream):
        try:
            for joins in stream.joins:
                assert_epoch_atomic(stream, joins)
        except (AssertionError, ProtocolError):
            return True
        return False

    find(event_streams(TOTAL, partitions=st.integers(1, 3)), broken,
         settings=FIND)


_orig_start = protocol.SubscriberProtocol._start
_orig_receive = protocol.SubscriberProtocol.receive


def _start_without_filter(self):
    out = _orig_start(self)
    self._filter.clear()
    return out


def _receive_without_buffering(self, partition, message):
    if isinstance(message, protocol.InitialFrontierSnapshot) and not self._ready:
        self._snapshots[partition] = message
        out = []
        if message.lower:
            ch = self._lower.update_iter([(t, 1) for t in message.lower])
            if ch:
                out.append(protocol.LowerFrontierUpdate(tuple(ch)))
        self._filter.extend(message.upper)
        if len(self._snapshots) == self.partitions:
            self._ready = True
        return out
    self._ready = True
    return self._process(message)
