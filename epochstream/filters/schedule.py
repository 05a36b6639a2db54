"""The filter schedule: which filter each epoch is under while a subscriber's filter changes,
so that no epoch mixes two filters (docs/filters.md, "Changing the filter"; on the wire a
*filter program*, docs/protocol.md §2.1).

Pure: no sockets, no clock.

**A schedule** (:class:`FilterSchedule`) is a list of ``(boundary, filter)`` entries, the
first with boundary ``None``. For an epoch ``t``, the filter *in force* is the last entry whose
boundary ``B`` satisfies ``B <= t`` (at or beyond, as a frontier),
:meth:`FilterSchedule.in_force`. A publisher sends data at ``t`` filtered by the *union* of the
filters of that entry and every later one (:meth:`FilterSchedule.sent`); an entry whose
boundary is still unknown (``None`` after the first) is in that union for every ``t``. The
subscriber re-filters each epoch by the filter in force, so it releases exactly the epoch's
records matching it — whatever the publisher sent under the schedule it knew at the time,
since schedules only grow (proof in docs/filters.md).

:func:`boundary` gives the frontier a change takes effect at: the minimal times not ``<=`` any
time a partition had sent data for when it switched (its upper frontier), so no data of an epoch
at or beyond it was filtered by the old schedule only.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

from ..errors import FilterError
from .filter import Filter

__all__ = ["FilterSchedule", "boundary", "MAX_ENTRIES", "MAX_WIRE_BYTES"]

MAX_ENTRIES = 16
"""At most this many entries in a schedule (older ones are pruned as the frontier passes)."""
MAX_WIRE_BYTES = 60_000
"""At most this many bytes for a schedule's msgpack encoding: it travels in a hello or an update,
and a publisher takes subscriber messages of at most 64 KiB (``MAXMSGSIZE``)."""


class FilterSchedule:
    """``FilterSchedule(order, entries)``: ``entries`` is ``[(boundary, Filter), ...]`` —
    ``boundary`` a tuple of times (a frontier) or ``None`` (the first entry: from the start; a
    later entry: a change whose boundary is not known yet). See the module docstring.
    ``order``: the topic's order. Raises :class:`FilterError` if the first boundary is not
    ``None`` or there are more than :data:`MAX_ENTRIES` entries."""

    __slots__ = ("order", "entries", "_key")

    def __init__(self, order, entries: Iterable[tuple[tuple | None, Filter]]):
        self.order = order
        self.entries: tuple = tuple((None if b is None else tuple(b), f) for b, f in entries)
        if not self.entries or self.entries[0][0] is not None:
            raise FilterError("a filter program starts with an entry of boundary None")
        if len(self.entries) > MAX_ENTRIES:
            raise FilterError(f"a filter program has at most {MAX_ENTRIES} entries")
        self._key = self.entries

    @classmethod
    def single(cls, order, f: Filter) -> "FilterSchedule":
        """The schedule of the one filter ``f``, from the start."""
        return cls(order, [(None, f)])

    @property
    def current(self) -> Filter:
        """The newest filter."""
        return self.entries[-1][1]

    def _index(self, t) -> int:
        le = self.order.le
        k = 0
        for i, (b, _) in enumerate(self.entries):
            if i and b is not None and any(le(x, t) for x in b):
                k = i
        return k

    def in_force(self, t) -> Filter:
        """The filter epoch ``t`` is released under (the subscriber's re-check)."""
        return self.entries[self._index(t)][1]

    def sent(self, t) -> tuple:
        """The filters whose union a publisher sends data at ``t`` under (distinct, in order)."""
        return tuple(dict.fromkeys(f for _, f in self.entries[self._index(t):]))

    def prune(self, lower: Iterable) -> "FilterSchedule":
        """Drop entries no epoch at or beyond the frontier ``lower`` is under: those before
        the last entry whose boundary every element of ``lower`` is at or beyond."""
        le = self.order.le
        lower = tuple(lower)
        if not lower:
            return FilterSchedule(self.order, [(None, self.current)])
        k = 0
        for i, (b, _) in enumerate(self.entries):
            if i and b is not None and all(any(le(x, t) for x in b) for t in lower):
                k = i
        if k == 0:
            return self
        return FilterSchedule(self.order, [(None, self.entries[k][1]), *self.entries[k + 1:]])

    def with_change(self, f: Filter, at: tuple | None = None) -> "FilterSchedule":
        """This schedule with ``f`` appended at boundary ``at`` (``None``: not known yet), or
        the pending last entry's boundary set."""
        entries = list(self.entries)
        if len(entries) > 1 and entries[-1][0] is None and entries[-1][1] == f:
            entries[-1] = (at, f)
        else:
            entries.append((at, f))
        return FilterSchedule(self.order, entries)

    def __eq__(self, other) -> bool:
        return isinstance(other, FilterSchedule) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"FilterSchedule({list(self.entries)!r})"

    def to_wire(self) -> list:
        """``[[boundary or nil, filter map], ...]``."""
        return [[None if b is None else [list(t) if isinstance(t, tuple) else t for t in b],
                 f.to_wire()] for b, f in self.entries]

    @classmethod
    def from_wire(cls, order, obj, check_time: Callable | None = None) -> "FilterSchedule":
        """Decode :meth:`to_wire` (``check_time`` normalises each boundary time);
        :class:`FilterError` for anything malformed."""
        if not isinstance(obj, (list, tuple)) or not obj or len(obj) > MAX_ENTRIES:
            raise FilterError(f"a filter program must be an array of 1..{MAX_ENTRIES} "
                              f"[boundary, filter] entries, got {obj!r:.80}")
        entries = []
        for e in obj:
            if not isinstance(e, (list, tuple)) or len(e) != 2:
                raise FilterError(f"a program entry must be [boundary, filter], got {e!r:.80}")
            b, f = e
            if b is not None:
                if not isinstance(b, (list, tuple)) or len(b) > 1024:
                    raise FilterError(f"a boundary must be an array of times, got {b!r:.80}")
                try:
                    b = tuple(check_time(x) if check_time else x for x in b)
                except Exception as exc:  # noqa: BLE001 - any bad time is a bad filter
                    raise FilterError(f"bad boundary time: {exc}") from None
            entries.append((b, Filter.from_wire(f)))
        return cls(order, entries)

def boundary(order, uppers: Iterable) -> tuple:
    """The minimal times not ``<=`` any time of ``uppers`` (an iterable of times): the frontier
    at or beyond which no epoch has data sent before a change. Total order: ``max + 1`` (the
    order's minimum for no uppers); product orders: the minimal elements of the
    complement of the down-set, from candidates whose coordinates are 0 or some ``u_i + 1``.
    ``NotImplementedError`` for other orders.

    >>> from epochstream.order import TOTAL, product
    >>> boundary(TOTAL, [3, 5])
    (6,)
    >>> sorted(boundary(product(2), [(1, 3), (2, 1)]))
    [(0, 4), (2, 2), (3, 0)]
    """
    uppers = list(uppers)
    name = getattr(order, "name", "")
    if name == "total":
        return ((max(uppers) + 1),) if uppers else (order.minimum,)
    dim = getattr(order, "width", None) if name.startswith("product(") else None
    if dim is None:
        raise NotImplementedError(f"filter changes need a total or product order, not {name!r}")
    if not uppers:
        return (order.minimum,)
    axes = [sorted({0, *(u[i] + 1 for u in uppers)}) for i in range(dim)]
    le = order.le
    cand = [c for c in itertools.product(*axes) if not any(le(c, u) for u in uppers)]
    return tuple(c for c in cand if not any(o != c and le(o, c) for o in cand))
