"""The index rows of one history batch, read a page at a time (docs/history.md, "Joining
history and the live stream").

A :class:`~epochstream.transport.fill.HistoryBatch` owes the wanted epochs its merged lower
frontier completes. :class:`IndexPages` reads their index rows from the catalog, at most
:data:`PAGE_ROWS` of a partition per call (``Catalog.history_epochs(after=..., limit=...)``),
each page after the last row of the one before in the index's own total order (the time's
first component ``t0``, then its stored text): no row is skipped or read twice, however many
times share a ``t0``. It hands the rows out in chunks, each every kept row of every partition
whose ``t0`` is below the smallest ``t0`` at which some partition may still have rows unread:
so each epoch is whole (the rows of all its partitions), and a chunk sorted by the order's
linear extension follows every earlier chunk consistently with the partial order (a time with
a smaller first component is never ``>=`` one with a larger). :meth:`IndexPages.prime` reads
the first page of every partition (the subscriber's loop, as it inserts the batch); the rest is
read as the batch's reader reaches it: the first epoch costs one page, not the whole index.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ..order import linear_extension

__all__ = ["PAGE_ROWS", "IndexPages", "raise_t0", "t0"]

PAGE_ROWS = 1000
"""Index rows of one partition a history batch reads per catalog call (read when a batch is
made: a test may set it lower to cross many page boundaries with a small log)."""


def t0(t: Any) -> Any:
    """A time's first component (the time itself for a total order), as the index keys it."""
    return t[0] if isinstance(t, tuple) else t


def raise_t0(a: Any, c: Any) -> Any:
    """``a`` with its first component raised to at least ``c``: the least time ``>= a`` of
    every time ``t >= a`` with ``t0(t) >= c`` (a join, in a total or a product order)."""
    if isinstance(a, tuple):
        return a if a[0] >= c else (c, *a[1:])
    return a if a >= c else c


class IndexPages:
    """The rows of ``partitions`` of ``topic`` in ``catalog`` with ``min_t0 <= t0 <= max_t0``
    (``None``: unbounded) whose time ``keep`` accepts, in chunks (:meth:`chunks`) of
    ``[(time, [EpochRecord, ...])]`` in a linear extension of ``order``. ``check(partition,
    after)`` runs after every page read of ``partition`` (``after``: the time the read began
    after, ``None``: its first): it raises if retention may have deleted a row the read was
    to return. ``page_rows``: rows per page (default :data:`PAGE_ROWS`)."""

    def __init__(self, catalog, topic: str, order, partitions, *, min_t0, max_t0,
                 keep: Callable[[Any], bool], check: Callable[[int, Any], None],
                 page_rows: int | None = None):
        self._catalog, self._topic, self._order = catalog, topic, order
        self._keep, self._check = keep, check
        self._min_t0, self._max_t0 = min_t0, max_t0
        self._page = int(page_rows or PAGE_ROWS)
        self.partitions = self._partitions = tuple(sorted(partitions))
        #: partitions that may have rows unread: the time of the last row read (None: none)
        self._after: dict = dict.fromkeys(self._partitions)
        self._held: dict = {p: [] for p in self._partitions}  # kept rows read, not handed out
        self.reads = 0  # pages read (catalog calls)
        self.rows = 0  # index rows read

    def prime(self) -> bool:
        """Read the first page of every partition; True if the batch may hold an epoch (a
        kept row was read, or some partition has more rows)."""
        for p in self._partitions:
            if p in self._after and self._after[p] is None:
                self._read(p)
        return bool(self._after) or any(self._held.values())

    def chunks(self) -> Iterator[tuple[list, Any]]:
        """Yield ``(chunk, bound)``: a non-empty chunk, and the ``t0`` every row still to come
        is at or beyond (``None``: none is to come), reading pages as they are needed."""
        while True:
            bound = self._bound()
            chunk = self._take(bound)
            if chunk:
                yield chunk, bound
            if bound is None:
                return
            for p in [p for p, a in self._after.items() if a is None or t0(a) <= bound]:
                self._read(p)

    def _bound(self):
        """Every row with ``t0`` below it has been read (``None``: every row has been)."""
        if not self._after:
            return None
        return min(t0(a) if a is not None else float("-inf") for a in self._after.values())

    def _read(self, p: int) -> None:
        after = self._after[p]
        page = self._catalog.history_epochs(self._topic, p, min_t0=self._min_t0, after=after,
                                            limit=self._page)
        self._check(p, after)  # (after the read: a trim before it shows here)
        self.reads += 1
        self.rows += len(page)
        end, held, keep, top = len(page) < self._page, self._held[p], self._keep, self._max_t0
        for r in page:
            if top is not None and t0(r.time) > top:
                end = True  # (past every wanted epoch)
                break
            if keep(r.time):
                held.append(r)
        if end:
            del self._after[p]
        elif page:
            self._after[p] = page[-1].time

    def _take(self, bound) -> list:
        """The kept rows with ``t0`` below ``bound`` (all, for ``None``), grouped by time, in a
        linear extension of the order; they are no longer held."""
        by_time: dict = {}
        for p in self._partitions:
            held = self._held[p]
            n = len(held)
            if bound is not None:
                n = next((i for i, r in enumerate(held) if t0(r.time) >= bound), n)
            for r in held[:n]:
                by_time.setdefault(r.time, []).append(r)
            del held[:n]
        return [(t, by_time[t]) for t in linear_extension(self._order, by_time)]
