"""Frontiers: antichains of logical times, after timely-dataflow's ``progress/frontier.rs``.

:class:`Antichain`
    A set of mutually incomparable times — the *minimal* elements of everything inserted
    (timely ``Antichain<T>``). Over :func:`~epochstream.order.dual` it keeps maximal elements
    instead (the Strymon *upper frontier*).

    Algebra: ``insert(t)`` keeps ``t`` iff no element is ``<= t``, and then evicts every element
    ``>= t``. ``less_equal(t)`` is true iff some element is ``<= t`` (``t`` is at or beyond the
    frontier: still possible); ``less_than(t)`` iff some element is ``< t``.

    >>> from epochstream.order import product
    >>> a = Antichain(product(2), [(0, 3), (2, 1)])
    >>> a.insert((1, 1)), sorted(a.elements)
    (True, [(0, 3), (1, 1)])
    >>> a.less_equal((1, 5)), a.less_equal((0, 2))
    (True, False)

:class:`MutableAntichain`
    A multiset of times with integer counts and the antichain of minimal times whose count is
    positive (timely ``MutableAntichain<T>``). ``update_iter`` applies ``(time, delta)`` updates and
    returns only the *net* changes of the frontier, as ``(time, +1)`` / ``(time, -1)`` pairs.
    Counts may go transiently negative (a ``-1`` may arrive before its ``+1``); zero deltas are
    ignored; counts that return to zero are forgotten, so memory is bounded by the number of
    times with a non-zero count.

    >>> from epochstream.order import TOTAL
    >>> m = MutableAntichain(TOTAL, [(0, 1)])
    >>> m.update_iter([(1, 1), (0, -1)])
    [(0, -1), (1, 1)]
    >>> m.frontier
    (1,)

Costs (``n`` = times with positive count, ``w`` = frontier width):

- total order: ``update_iter`` is O(log n) per update (a ``sortedcontainers.SortedList``; the
  frontier is its first element);
- other orders: O(log n) per update to keep the sorted multiset, plus, only when an update can
  change the frontier (a new time not beyond it, or a frontier element's count falling to zero),
  a rebuild that scans the positive times in linear-extension order: O(n·w) comparisons. Updates
  strictly beyond the frontier never trigger a rebuild (timely's ``rebuild_required`` test).
"""

from __future__ import annotations

from typing import Any, Iterable

from sortedcontainers import SortedKeyList, SortedList

from .errors import ProtocolError
from .order import TotalOrder, linear_extension, sort_key

__all__ = ["Antichain", "MutableAntichain", "apply_changes", "join", "beyond"]


class Antichain:
    """Minimal elements of the times inserted (timely ``Antichain``).

    ``Antichain(order, elements=())`` — ``order`` has ``le``/``lt`` (see :mod:`epochstream.order`);
    ``elements`` an iterable of times, inserted one by one. Cost: ``insert``, ``less_equal`` and
    ``less_than`` are O(w) order comparisons for an antichain of width ``w`` (w == 1 for a total
    order).
    """

    __slots__ = ("order", "_elements", "_le", "_lt")

    def __init__(self, order, elements: Iterable[Any] = ()):
        self.order = order
        self._le = order.le
        self._lt = order.lt
        self._elements: list = []
        for t in elements:
            self.insert(t)

    def insert(self, t) -> bool:
        """Insert ``t``; return True iff it became an element (no element was ``<= t``)."""
        le = self._le
        els = self._elements
        for e in els:
            if le(e, t):
                return False
        if els:
            self._elements = [e for e in els if not le(t, e)]
        self._elements.append(t)
        return True

    def extend(self, times: Iterable[Any]) -> bool:
        """Insert each of ``times``; True iff any was added."""
        added = False
        for t in times:
            added |= self.insert(t)
        return added

    @property
    def elements(self) -> tuple:
        """The antichain's elements, as a tuple (in insertion order)."""
        return tuple(self._elements)

    def less_equal(self, t) -> bool:
        """True iff some element ``e`` has ``e <= t`` (timely ``Antichain::less_equal``)."""
        le = self._le
        for e in self._elements:
            if le(e, t):
                return True
        return False

    def less_than(self, t) -> bool:
        """True iff some element ``e`` has ``e < t`` (timely ``Antichain::less_than``)."""
        lt = self._lt
        for e in self._elements:
            if lt(e, t):
                return True
        return False

    def dominates(self, other: "Antichain") -> bool:
        """timely ``PartialOrder for Antichain``: every element of ``other`` is ``>=`` some
        element of ``self``. Note: a subscriber's lower frontier already dominates the snapshot's
        upper frontier at subscription, so this is *not* the condition to retire a filter."""
        return all(self.less_equal(t) for t in other._elements)

    def remove(self, t) -> None:
        """Remove element ``t`` (``ValueError`` if absent)."""
        self._elements.remove(t)

    def clear(self) -> None:
        self._elements = []

    def __contains__(self, t) -> bool:
        return t in self._elements

    def __iter__(self):
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __bool__(self) -> bool:
        return bool(self._elements)

    def __eq__(self, other) -> bool:
        if isinstance(other, Antichain):
            return set(self._elements) == set(other._elements)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Antichain({self._elements!r})"


def join(order, a: Iterable[Any], b: Iterable[Any]) -> tuple:
    """The frontier of the times at or beyond *both* frontiers ``a`` and ``b``: the minimal
    elements of ``{order.join(x, y) : x in a, y in b}`` (timely ``Antichain`` over a
    ``Lattice``: the intersection of two up-sets is the up-set of the pairwise joins).

    Algebra: ``t`` is at or beyond the result iff it is at or beyond ``a`` and at or beyond
    ``b``; ``join(o, a, ()) == ()`` (nothing is beyond the empty frontier);
    ``join(o, a, [o.minimum]) == a``. Needs an order with ``join`` (:data:`~epochstream.order.TOTAL`,
    ``product(n)``). O(|a|·|b|) joins plus the antichain inserts.

    >>> from epochstream.order import product
    >>> sorted(join(product(2), [(0, 3), (2, 0)], [(1, 1)]))
    [(1, 3), (2, 1)]
    """
    out = Antichain(order)
    bj = order.join
    bs = list(b)
    for x in a:
        for y in bs:
            out.insert(bj(x, y))
    return out.elements


class MutableAntichain:
    """Counts of times and the frontier of minimal times with positive count
    (timely ``MutableAntichain``).

    ``MutableAntichain(order, updates=())`` starts empty and applies ``updates`` (``(time, delta)``
    pairs) without reporting them. ``frontier`` is a tuple of the current minimal positive times.
    """

    __slots__ = ("order", "_counts", "_positive", "_frontier", "_total", "_le")

    def __init__(self, order, updates: Iterable[tuple[Any, int]] = ()):
        self.order = order
        self._le = order.le
        self._total = isinstance(order, TotalOrder)
        self._counts: dict = {}
        key = sort_key(order)
        if self._total:
            self._positive = SortedList()
        elif key is not None:
            self._positive = SortedKeyList(key=key)
        else:  # a user order without a sort key: a plain set, sorted on rebuild
            self._positive = _PlainSet(order)
        self._frontier: list = []
        if updates:
            self.update_iter(updates)

    # -- queries ---------------------------------------------------------------------------
    @property
    def frontier(self) -> tuple:
        """The minimal times with positive count, as a tuple (linear-extension order)."""
        return tuple(self._frontier)

    def count_for(self, t) -> int:
        """The accumulated count of ``t`` (0 if none)."""
        return self._counts.get(t, 0)

    def less_equal(self, t) -> bool:
        """True iff some frontier element is ``<= t`` (``t`` may still occur)."""
        le = self._le
        for e in self._frontier:
            if le(e, t):
                return True
        return False

    def less_than(self, t) -> bool:
        """True iff some frontier element is ``< t``."""
        lt = self.order.lt
        for e in self._frontier:
            if lt(e, t):
                return True
        return False

    def is_empty(self) -> bool:
        """True iff the frontier is empty (no time has positive count)."""
        return not self._frontier

    def counts(self) -> dict:
        """A copy of the non-zero counts ``{time: count}`` (negative counts included)."""
        return dict(self._counts)

    def __len__(self) -> int:
        """Number of times with a non-zero count (what the structure stores)."""
        return len(self._counts)

    # -- updates ---------------------------------------------------------------------------
    def update_iter(self, updates: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """Apply ``(time, delta)`` updates; return the net frontier changes.

        Follows timely ``MutableAntichain::update_iter``: zero deltas are dropped, counts may be
        transiently negative, the frontier is the minimal times with positive count, and the
        result lists each time that left the frontier as ``(t, -1)`` and each that joined as
        ``(t, +1)`` (never both for one time), removals first, each group in linear-extension
        order. Cost: see the module docstring."""
        counts = self._counts
        positive = self._positive
        frontier = self._frontier
        le = self._le
        rebuild = False
        for t, delta in updates:
            if not delta:
                continue
            old = counts.get(t, 0)
            new = old + delta
            if new:
                counts[t] = new
            else:
                del counts[t]
            if old <= 0 < new:
                positive.add(t)
                if not rebuild:
                    # A new positive time changes the frontier iff no element is <= it.
                    for e in frontier:
                        if le(e, t):
                            break
                    else:
                        rebuild = True
            elif new <= 0 < old:
                positive.remove(t)
                if not rebuild and t in frontier:
                    rebuild = True
        if not rebuild:
            return []
        return self._rebuild()

    def update(self, t, delta: int) -> list[tuple[Any, int]]:
        """``update_iter([(t, delta)])``."""
        return self.update_iter(((t, delta),))

    def _rebuild(self) -> list[tuple[Any, int]]:
        old = self._frontier
        if self._total:
            new = [self._positive[0]] if self._positive else []
        else:
            new = []
            le = self._le
            for t in self._positive:
                for e in new:
                    if le(e, t):
                        break
                else:
                    new.append(t)
        self._frontier = new
        if old == new:
            return []
        old_set = set(old)
        new_set = set(new)
        return ([(t, -1) for t in old if t not in new_set]
                + [(t, 1) for t in new if t not in old_set])

    def __repr__(self) -> str:
        return f"MutableAntichain(frontier={self._frontier!r}, counts={self._counts!r})"


class _PlainSet:
    """Positive times for a user order without a sort key: iterates in a linear extension
    computed on demand (O(n²) comparisons)."""

    __slots__ = ("order", "items")

    def __init__(self, order):
        self.order = order
        self.items: set = set()

    def add(self, t):
        self.items.add(t)

    def remove(self, t):
        self.items.remove(t)

    def __iter__(self):
        return iter(linear_extension(self.order, self.items))

    def __len__(self):
        return len(self.items)

    def __bool__(self):
        return bool(self.items)

    def __getitem__(self, i):  # pragma: no cover - only the total order indexes
        return linear_extension(self.order, self.items)[i]



def apply_changes(frontier: dict, changes: Iterable[tuple[Any, int]], *, strict: bool = False) -> None:
    """Apply net frontier changes ``[(t, +1 | -1), ...]`` (what :meth:`MutableAntichain.update_iter`
    returns, or a :class:`~epochstream.events.LowerFrontierUpdate`'s ``updates``) to ``frontier``,
    a ``dict`` used as an insertion-ordered set of its elements (``{t: True}``). A positive
    delta adds ``t``, a non-positive one removes it. ``strict``: raise
    :class:`~epochstream.errors.ProtocolError` for adding an element already present or removing
    one that is absent (``frontier`` may then be partly updated: callers that need atomicity
    validate first). Cost: O(1) per change.

    >>> f = {0: True}
    >>> apply_changes(f, [(0, -1), (1, 1)]); list(f)
    [1]
    """
    for t, d in changes:
        if d > 0:
            if strict and t in frontier:
                raise ProtocolError(f"frontier change adds {t!r}, which is already an element")
            frontier[t] = True
        elif t in frontier:
            del frontier[t]
        elif strict:
            raise ProtocolError(f"frontier change removes {t!r}, which is not an element")


def beyond(order, times: Iterable[Any]) -> tuple | None:
    """The frontier of the times *not* at or below any of ``times`` (the complement of their
    down-set): where a stream continues after it had data at ``times`` (a finished stream's
    upper frontier). TOTAL: ``(max(times) + 1,)``; ``product(n)``: the join over every ``u``
    of ``{u + e_i : i < n}`` (the times past ``u`` in some coordinate). No ``times``:
    ``(order.minimum,)``. ``None`` for an order it cannot compute this for (neither total nor
    a product of ints). A coordinate already at the largest wire time contributes nothing.

    Algebra: ``t`` is at or beyond the result iff no ``u`` of ``times`` has ``u >= t``.
    O(|times| · n) joins for ``product(n)``.

    >>> from epochstream.order import TOTAL, product
    >>> beyond(TOTAL, [3, 7])
    (8,)
    >>> sorted(beyond(product(2), [(3, 5)]))
    [(0, 6), (4, 0)]
    """
    from .order import TIME_MAX
    times = list(times)
    if not times:
        return (order.minimum,)
    if getattr(order, "name", None) == "total":
        top = max(times)
        return (top + 1,) if top < TIME_MAX else ()
    width = getattr(order, "width", None)
    if not isinstance(width, int) or not hasattr(order, "join"):
        return None
    out: tuple = (order.minimum,)
    for u in times:
        past = [tuple(0 if j != i else u[i] + 1 for j in range(width))
                for i in range(width) if u[i] < TIME_MAX]
        out = join(order, out, past)
    return out
