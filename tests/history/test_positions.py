"""Positions (:mod:`epochstream.position`) and the lattice operations they rest on, against
brute-force oracles over small grids.

- :func:`resolve_position`: "latest"/"earliest"/int/tuple/list, bad input;
- :class:`HistoryJoin`: ``wanted``, ``needed_partitions``, ``settled`` over ``product(2)`` and
  ``TOTAL``, against the semantic definition (an exhaustive search for a witness epoch);
- :class:`AckTracker`: random ``handed_out``/``ack``/``frontier`` sequences against a model,
  and the resume contract (acked never again, unacked again) across sessions;
- :func:`epochstream.frontier.join` and ``order.join``: lattice laws by brute force.

The oracles use only ``order.le`` and plain sets (the toolkit's :func:`minimal`), never
:class:`~epochstream.frontier.Antichain`.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from hypothesis_profiles import examples

from epochstream.errors import ProtocolError
from epochstream.frontier import Antichain, join
from epochstream.order import TIME_MAX, TOTAL, product
from epochstream.position import AckTracker, HistoryJoin, resolve_position
from epochstream.testing.model import maximal, minimal
from epochstream.testing.strategies import antichains

P2 = product(2)
GRID2 = tuple(itertools.product(range(4), repeat=2))   # {0..3}^2: closed under join
GRID_T = tuple(range(7))


def grid(order):
    return GRID_T if order is TOTAL else GRID2


def at_or_beyond(order, frontier, t) -> bool:
    return any(order.le(a, t) for a in frontier)


def as_set(xs) -> frozenset:
    return frozenset(xs)


def times_of(order):
    return st.sampled_from(grid(order))


def frontiers(order, min_size=0, max_size=4):
    return antichains(order, grid(order), min_size=min_size, max_size=max_size)


def uppers(order, max_size=3):
    """An upper frontier: the maximal elements of a random set of times (maybe empty)."""
    return st.lists(times_of(order), max_size=max_size).map(
        lambda ts: tuple(sorted(maximal(order, ts), key=repr)))


ORDERS = st.sampled_from([TOTAL, P2])


# ---- resolve_position --------------------------------------------------------------------


def test_resolve_position_named():
    for order in (TOTAL, P2):
        assert resolve_position(order, "latest") is None
        assert resolve_position(order, "earliest") == "earliest"
        for bad in ("", "Latest", "EARLIEST", "first", "0"):
            with pytest.raises(ValueError):
                resolve_position(order, bad)


def test_resolve_position_times():
    assert resolve_position(TOTAL, 5) == (5,)
    assert resolve_position(TOTAL, 0) == (0,)
    assert as_set(resolve_position(TOTAL, [7, 3, 9])) == {3}
    assert resolve_position(TOTAL, []) == ()
    assert resolve_position(P2, (1, 2)) == ((1, 2),)
    assert as_set(resolve_position(P2, [(1, 2), (2, 1)])) == {(1, 2), (2, 1)}
    assert as_set(resolve_position(P2, [(1, 2), (2, 3), (1, 2)])) == {(1, 2)}
    assert resolve_position(P2, [[0, 3]]) == ((0, 3),)  # lists as times are normalised
    assert resolve_position(P2, []) == ()
    assert resolve_position(product(3), (1, 2, 3)) == ((1, 2, 3),)


@pytest.mark.parametrize("order,bad", [
    (TOTAL, 1.5), (TOTAL, True), (TOTAL, None), (TOTAL, TIME_MAX + 1), (TOTAL, [1, "x"]),
    (TOTAL, {1}), (P2, 5), (P2, (1,)), (P2, (1, 2, 3)), (P2, [(1, 2, 3)]), (P2, (1, True)),
    (P2, [(1, 2), 3]), (P2, ("a", "b")), (P2, (1.0, 2)), (P2, [1, 2]),
])
def test_resolve_position_bad_shapes(order, bad):
    with pytest.raises((ProtocolError, ValueError, TypeError)):
        resolve_position(order, bad)


@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), st.lists(times_of(o), max_size=6))))
def test_resolve_position_list_is_its_minimal_elements(case):
    order, ts = case
    got = resolve_position(order, list(ts))
    assert isinstance(got, tuple)
    assert len(got) == len(set(got))
    assert as_set(got) == minimal(order, ts)


# ---- HistoryJoin -------------------------------------------------------------------------


@st.composite
def joins(draw, order, max_partitions=3):
    """A position and per-partition (lower, upper) snapshots. A partition's lower is an
    antichain; its upper the maximal elements of times it sent (maybe none)."""
    position = draw(frontiers(order))
    n = draw(st.integers(1, max_partitions))
    snaps = {p: (draw(frontiers(order, max_size=3)), draw(uppers(order))) for p in range(n)}
    return position, snaps


def oracle_wanted(order, position, snaps, t) -> bool:
    U = {u for _, up in snaps.values() for u in up}
    return at_or_beyond(order, position, t) and any(order.le(t, u) for u in U)


def oracle_needed(order, position, snaps) -> dict:
    """p is needed for a in A iff some wanted epoch t (a <= t <= some u in U) may hold data of
    p: sent before the join (t <= u_p for some u_p in p's upper) or after it (l <= t for some
    l in p's lower). Exhaustive search for such a t over the grid (closed under join)."""
    U = {u for _, up in snaps.values() for u in up}
    le = order.le
    out = {}
    for p, (lower, upper) in snaps.items():
        need = set()
        for a in position:
            for t in grid(order):
                if not (le(a, t) and any(le(t, u) for u in U)):
                    continue
                if any(le(t, up) for up in upper) or any(le(l, t) for l in lower):
                    need.add(a)
                    break
        if need:
            out[p] = frozenset(need)
    return out


@settings(max_examples=examples(200))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), joins(o))))
def test_history_join_wanted(case):
    order, (position, snaps) = case
    hj = HistoryJoin(order, position, snaps)
    for t in grid(order):
        assert hj.wanted(t) == oracle_wanted(order, position, snaps, t), t


@settings(max_examples=examples(200))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), joins(o))))
def test_history_join_needed_partitions(case):
    order, (position, snaps) = case
    hj = HistoryJoin(order, position, snaps)
    got = {p: frozenset(v) for p, v in hj.needed_partitions().items()}
    assert got == oracle_needed(order, position, snaps)
    # a partition with data at a wanted epoch (sent before the join) is always needed
    for p, (_, upper) in snaps.items():
        if any(hj.wanted(t) for t in grid(order) if any(order.le(t, u) for u in upper)):
            assert p in got


@settings(max_examples=examples(200))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), joins(o), frontiers(o))))
def test_history_join_settled(case):
    """settled(L) iff no element of L is <= some u in U; and once settled, every wanted epoch
    is complete (no wanted t with L <= t)."""
    order, (position, snaps), lower = case
    hj = HistoryJoin(order, position, snaps)
    U = {u for _, up in snaps.values() for u in up}
    expect = not any(order.le(l, u) for l in lower for u in U)
    assert hj.settled(lower) == expect
    if hj.settled(lower):
        assert not any(hj.wanted(t) and at_or_beyond(order, lower, t) for t in grid(order))
    # the empty lower frontier (every partition finished) is always settled
    assert hj.settled(())


def test_history_join_examples():
    hj = HistoryJoin(TOTAL, [3], {0: ((6,), (5,)), 1: ((4,), (7,))})
    assert [t for t in range(10) if hj.wanted(t)] == [3, 4, 5, 6, 7]
    assert set(hj.needed_partitions()) == {0, 1}
    assert not hj.settled([7]) and hj.settled([8])
    # a position past every upper needs nothing from history
    hj = HistoryJoin(TOTAL, [9], {0: ((9,), (8,))})
    assert hj.needed_partitions() == {} and not any(hj.wanted(t) for t in range(20))
    # the empty position wants nothing
    hj = HistoryJoin(P2, [], {0: (((0, 0),), ((3, 3),))})
    assert hj.needed_partitions() == {} and not hj.wanted((0, 0))
    # product order: incomparable position elements, each needed only where it can be
    hj = HistoryJoin(P2, [(0, 2), (2, 0)], {0: (((0, 3),), ((0, 2),)), 1: (((3, 0),), ())})
    need = hj.needed_partitions()
    assert set(need[0]) == {(0, 2)}
    assert 1 not in need  # joins (3,0)v(0,2)=(3,2), (3,0): neither <= (0,2)


# ---- AckTracker --------------------------------------------------------------------------


@st.composite
def ack_sessions(draw, order):
    """A session of a durable subscriber as the Subscriber drives its AckTracker: ``start``
    (a frontier); a set of epochs with data at or beyond it; releases (the merged lower
    frontier moves forward, the epochs it completes are handed out, then ``frontier``);
    acks of random handed-out epochs (sometimes out of order, sometimes bogus)."""
    g = grid(order)
    start = draw(frontiers(order, min_size=1, max_size=2))
    beyond = [t for t in g if at_or_beyond(order, start, t)]
    data = set(draw(st.lists(st.sampled_from(beyond), max_size=8))) if beyond else set()
    ops = []
    lower = list(start)  # the merged lower frontier starts at or before the position
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["release", "ack", "ack", "bogus"]))
        if kind == "release" and lower:
            up = [t for t in g if at_or_beyond(order, lower, t)]
            pick = draw(st.lists(st.sampled_from(up), min_size=1, max_size=3))
            new = sorted(minimal(order, pick), key=repr)
            if draw(st.integers(0, 5)) == 0:
                new = []
            ops.append(("release", tuple(new)))
            lower = new
        elif kind == "ack":
            ops.append(("ack", draw(st.integers(0, 100))))  # index into the unacked, resolved later
        else:
            ops.append(("bogus", draw(st.sampled_from(g))))
    return tuple(start), data, ops


class AckModel:
    """Plain sets: handed out, acked, and the frontier fed so far."""

    def __init__(self, order, start):
        self.order, self.start = order, tuple(start)
        self.handed, self.acked = [], set()
        self.lower = None

    def unacked(self):
        return [t for t in self.handed if t not in self.acked]

    def position(self):
        """minimal(unacked ∪ join(start, lower)), join by brute force over the grid."""
        if self.lower is None:
            base = set(self.start)
        else:
            up = [t for t in grid(self.order)
                  if at_or_beyond(self.order, self.start, t)
                  and at_or_beyond(self.order, self.lower, t)]
            base = set(minimal(self.order, up))
        return minimal(self.order, base | set(self.unacked()))


def run_session(order, data, ops, tracker: AckTracker, model: AckModel, delivered):
    """Drive ``tracker`` as the Subscriber does; ``delivered`` collects what the user got."""
    prev_position = tuple(tracker.position)
    for op in ops:
        if op[0] == "release":
            new = op[1]
            done = [t for t in sorted(data, key=repr)
                    if t not in model.handed
                    and not at_or_beyond(order, new, t)
                    and at_or_beyond(order, tracker.start, t)]
            for t in done:
                tracker.handed_out(t)
                model.handed.append(t)
            tracker.frontier(new)
            model.lower = new
            for t in done:  # what epochs() does with epochs acked in an earlier session
                if tracker.skips(t):
                    assert tracker.ack(t)
                    model.acked.add(t)
                else:
                    delivered.append(t)
        elif op[0] == "ack":
            un = model.unacked()
            if un:
                t = un[op[1] % len(un)]
                assert tracker.ack(t) is True
                model.acked.add(t)
        else:  # ack of something not an unacked handed-out epoch
            t = op[1]
            expect = t in model.unacked()
            assert tracker.ack(t) is expect
            if expect:
                model.acked.add(t)
        check_tracker(order, tracker, model)
        # the acked position never moves backwards
        now = tracker.position
        assert all(at_or_beyond(order, prev_position, t) for t in now), (prev_position, now)
        prev_position = now


def check_tracker(order, tracker: AckTracker, model: AckModel) -> None:
    pos = tracker.position
    want = model.position()
    assert as_set(pos) == want
    assert as_set(tracker.unacked) == set(model.unacked())
    for t in grid(order):
        if not at_or_beyond(order, pos, t):
            # every epoch not at or beyond the position was acked or never handed out
            assert t not in model.unacked(), t
    for t in model.unacked():
        assert at_or_beyond(order, pos, t)
    # acked ones at or beyond the position are remembered (a resume must skip them) ...
    for t in model.acked:
        if at_or_beyond(order, pos, t):
            assert t in tracker.acked, t
    # ... and nothing is remembered as acked that was not
    assert set(tracker.acked) <= model.acked
    assert set(tracker.unacked).isdisjoint(tracker.acked)


@settings(max_examples=examples(300))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), ack_sessions(o))))
def test_ack_tracker_against_model(case):
    order, (start, data, ops) = case
    tracker = AckTracker(order, start)
    model = AckModel(order, start)
    check_tracker(order, tracker, model)
    run_session(order, data, ops, tracker, model, [])


@settings(max_examples=examples(300))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), ack_sessions(o))))
def test_ack_tracker_resume_contract(case):
    """Session 1 runs, the catalog keeps (position, acked); session 2 resumes with them and
    releases everything: it delivers exactly the epochs session 1 did not ack — acked ones
    never again, unacked ones (handed out or not) again, whole."""
    order, (start, data, ops) = case
    t1, m1 = AckTracker(order, start), AckModel(order, start)
    got1: list = []
    run_session(order, data, ops, t1, m1, got1)
    position, acked = t1.position, t1.acked
    t2 = AckTracker(order, position, acked)
    got2: list = []
    # session 2 sees every epoch at or beyond its start once the stream ends
    for t in sorted(data, key=repr):
        if at_or_beyond(order, position, t):
            t2.handed_out(t)
    t2.frontier(())
    for t in sorted(data, key=repr):
        if at_or_beyond(order, position, t):
            if t2.skips(t):
                assert t2.ack(t)
            else:
                got2.append(t)
    assert set(got2) == set(data) - m1.acked
    assert len(got2) == len(set(got2))
    # the union of what both sessions handed to the user covers every epoch
    assert set(got1) | set(got2) == set(data)


def test_ack_tracker_doc_example():
    a = AckTracker(TOTAL, [0])
    assert a.position == (0,)
    a.frontier([3])
    a.handed_out(0)
    a.handed_out(2)
    assert a.ack(2) and a.position == (0,) and 2 in a.acked
    assert not a.ack(2) and not a.ack(7)
    assert a.ack(0) and a.position == (3,)
    a.frontier([])
    assert a.position == ()
    b = AckTracker(TOTAL, [0], acked=[4, 6])
    assert b.skips(4) and b.skips(6) and not b.skips(5)


# ---- lattice joins -----------------------------------------------------------------------


@settings(max_examples=examples(300))
@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), frontiers(o), frontiers(o))))
def test_frontier_join_is_the_intersection_of_up_sets(case):
    order, a, b = case
    j = join(order, a, b)
    assert len(set(j)) == len(j)
    assert as_set(j) == minimal(order, j), "the result is an antichain"
    for t in grid(order):
        assert at_or_beyond(order, j, t) == (at_or_beyond(order, a, t)
                                             and at_or_beyond(order, b, t)), t
    assert as_set(join(order, b, a)) == as_set(j)
    assert join(order, a, ()) == () and join(order, (), b) == ()
    assert as_set(join(order, a, [order.minimum])) == as_set(a)
    assert as_set(join(order, a, a)) == as_set(a)


@given(ORDERS.flatmap(lambda o: st.tuples(st.just(o), frontiers(o), frontiers(o),
                                          frontiers(o))))
def test_frontier_join_is_associative(case):
    order, a, b, c = case
    assert as_set(join(order, join(order, a, b), c)) == as_set(join(order, a, join(order, b, c)))


@pytest.mark.parametrize("order", [TOTAL, product(1), product(2), product(3)])
def test_order_join_is_the_least_upper_bound(order):
    if order is TOTAL:
        g = list(range(-3, 4))
    else:
        g = list(itertools.product(range(3), repeat=order.width))
    le = order.le
    for a, b in itertools.product(g, repeat=2):
        j = order.join(a, b)
        assert le(a, j) and le(b, j)
        assert all(le(j, c) for c in g if le(a, c) and le(b, c)), (a, b, j)
        assert order.join(b, a) == j and order.join(a, a) == a
        if le(a, b):
            assert j == b


@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.just(product(n)), *[st.tuples(*[st.integers(-2**63, 2**64 - 1)] * n)] * 3)))
def test_product_join_laws_on_wide_values(case):
    order, a, b, c = case
    j = order.join
    assert j(a, b) == j(b, a)
    assert j(j(a, b), c) == j(a, j(b, c))
    assert order.le(a, j(a, b)) and order.le(b, j(a, b))
    assert j(a, order.minimum) == tuple(max(x, 0) for x in a)


@given(st.integers(-2**63, 2**64 - 1), st.integers(-2**63, 2**64 - 1))
def test_total_join_is_max(a, b):
    assert TOTAL.join(a, b) == max(a, b)


def test_a_released_epoch_holds_the_position_but_is_not_ackable_until_handed_out():
    """What a frontier update releases is given to the user one epoch at a time: until an
    epoch is, it holds the position back and an ack of it is refused (it was never seen)."""
    from epochstream.position import AckTracker
    a = AckTracker(TOTAL, [0])
    a.frontier([5])
    for t in (0, 2, 4):
        a.released(t)
    assert a.position == (0,) and not a.ack(2) and not a.ack(4)
    a.handed_out(0)
    assert a.ack(0) and a.position == (2,)
    a.skip(2)                      # acked in an earlier session: needs no ack now
    assert a.position == (4,) and not a.ack(4)
    saved = a.snapshot()
    a.handed_out(4)
    assert a.ack(4) and a.position == (5,)
    a.restore(saved)               # the catalog refused that ack: nothing of it stays
    assert a.position == (4,) and not a.ack(4)


@pytest.mark.parametrize("order, uppers, expect", [
    (TOTAL, [], (0,)), (TOTAL, [3, 9, 4], (10,)),
    (product(2), [(3, 5)], ((0, 6), (4, 0))),
    (product(2), [(3, 5), (1, 7)], ((0, 8), (2, 6), (4, 0))),
    (product(3), [(1, 0, 2)], ((0, 0, 3), (0, 1, 0), (2, 0, 0))),
])
def test_beyond_is_the_complement_of_the_down_set(order, uppers, expect):
    from epochstream.frontier import beyond
    got = beyond(order, uppers)
    assert tuple(sorted(got)) == tuple(sorted(expect))
    # every time in a grid: at or beyond the result iff at or below no upper
    f = Antichain(order, got)
    n = getattr(order, "width", None)
    grid = range(12) if n is None else itertools.product(range(10), repeat=n)
    for t in grid:
        assert f.less_equal(t) == (not any(order.le(t, u) for u in uppers)), t
