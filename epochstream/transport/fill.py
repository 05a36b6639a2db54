"""A subscriber's history fill: joining at a position, the epoch logs supply exactly what the
live stream drops (docs/history.md, "Joining at a position").

:class:`HistoryFill` is composed into the :class:`~epochstream.transport.subscriber.Subscriber`
(its own state). The decisions are the pure :class:`~epochstream.position.HistoryJoin`; this
module reads the catalog's index and the logs (:class:`~epochstream.history.History`) for them.

How a join at position ``A`` stays gapless: the live join is *as of* ``A`` (data not at or
beyond ``A`` is dropped) and its Strymon filter ``U`` drops every epoch some partition had begun
before the join. When every snapshot is in, :class:`HistoryJoin` names the epochs history must
supply (``A <= t <= u``) and the partitions whose logs it needs; each is checked (a log that
retains everything from ``A`` on) or the join fails with
:class:`~epochstream.errors.HistoryUnavailable` (a durable subscription:
:class:`~epochstream.errors.SubscriptionExpired`). From then on, before every merged frontier
change, the wanted epochs that the merged lower frontier now says complete (a publisher
indexes an epoch before it sends the frontier update that completes it, so they are all in the
index) are handed out, whole, as a :class:`HistoryBatch` ahead of the update: an order
consistent with the partial order, since no live epoch is ``<=`` a wanted one. A batch reads
their index rows a page at a time (:mod:`~epochstream.transport.fill_pages`) as its reader
reaches them, the live events behind it held back meanwhile; which epochs it owes is fixed
when it is made (wanted, complete at its lower frontier, and owed by no earlier batch: not
complete at an earlier one's), so a later batch never repeats what an earlier one still reads.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Iterator

from ..catalog import Catalog
from ..errors import HistoryUnavailable, SubscriptionExpired
from ..events import DataMessage, Epoch, LowerFrontierUpdate
from ..frontier import Antichain, join
from ..position import HistoryJoin
from .durable import DurableCursor
from .fill_pages import IndexPages, raise_t0, t0
from .filtering import FilterSession

__all__ = ["HistoryFill", "HistoryBatch", "Rejoined"]


@dataclasses.dataclass(frozen=True)
class HistoryBatch:
    """Internal event: complete epochs to hand out from history, their index rows read a page
    at a time (``pages``: :class:`~epochstream.transport.fill_pages.IndexPages`, chunks of
    ``[(time, [EpochRecord])]`` in a linear extension of the order); ``lower``: the merged
    lower frontier they are complete against (the frontier update that follows the batch moves
    to it)."""

    pages: IndexPages
    lower: tuple


@dataclasses.dataclass(frozen=True)
class Rejoined:
    """Internal event: a re-join whose gap history fills (no :class:`~epochstream.events.Gap`).
    ``epochs()`` drops the old join's incomplete epochs; ``events()`` hands out ``withdraw`` (the
    old merged frontier's removal) so its consumers' frontier stays consistent."""

    withdraw: LowerFrontierUpdate | None


class HistoryFill:
    """The history side of one subscriber of ``topic``: plans a join's fill (:meth:`plan`),
    inserts the epochs it owes into the stream (:meth:`insert`), reads them (:meth:`epochs`,
    :meth:`messages`). Its :attr:`retire` says goodbye to a finished partition the fill kept
    open (its publisher may have to serve the fill's reads until it is done); ``timeout``: the
    longest a read through a live publisher waits (seconds)."""

    def __init__(self, topic: str, catalog: Catalog | None, order, codec, filters: FilterSession,
                 stats: collections.Counter, *, timeout: float, security=None, durable: DurableCursor | None = None):
        self.topic, self.order, self.codec = topic, order, codec
        self._catalog, self._filters, self._stats = catalog, filters, stats
        self._timeout, self._security = timeout, security
        #: called with a finished partition the fill kept open, once the fill is done with it
        self.retire: Callable[[int], None] = lambda partition: None
        self.durable = durable
        self.join: HistoryJoin | None = None  # the fill under way (None: none, or settled)
        # batches handed to the caller's queue and not read to the end yet: while any is, a
        # finished partition's connection stays open (no bye), so its publisher lingers and
        # can still serve the reads (docs/history.md, "Remote history")
        self._unread = 0
        self._retire_later: set = set()
        self._prior: list = []  # the lowers of this join's earlier batches (Antichains)
        self._lower: tuple | None = None
        self._t0: int | None = None
        self._needed: tuple = ()
        self._error = "history unavailable"
        self._retained: tuple | None = None
        self._history = None
        self.endpoints: dict = {}  # the current join's publishers (remote reads go there)

    # -- reading ---------------------------------------------------------------------------
    def reader(self):
        """The :class:`~epochstream.history.History` reader (made on first use)."""
        if self._history is None:
            from ..log.reader import History
            from ..log.remote import DEFAULT_TIMEOUT
            mine = self._timeout  # a read waits no longer than the subscriber waits for
            timeout = DEFAULT_TIMEOUT if not mine or mine <= 0 else min(DEFAULT_TIMEOUT, mine)
            self._history = History(self.topic, self._catalog, timeout=timeout,
                                    security=self._security)
        self._history.endpoints = dict(self.endpoints)
        return self._history

    def earliest(self) -> tuple:
        """Everything retained: the join of every logged partition's ``since``."""
        if self._catalog is None:
            raise ValueError("start='earliest' needs a catalog (history is found there)")
        return self.reader().since

    def close(self) -> None:
        if self._history is not None:
            self._history.close()

    # -- the plan --------------------------------------------------------------------------
    def plan(self, position, snapshots: dict) -> bool:
        """Once every snapshot (``{partition: InitialFrontierSnapshot}``) is in: set up the
        fill of a join at ``position``. False if history cannot fill it (then
        :meth:`unavailable` says why)."""
        snaps = {p: (s.lower, s.upper) for p, s in snapshots.items()}
        hj = HistoryJoin(self.order, position, snaps)
        needed = hj.needed_partitions()
        self.join = None
        if not needed:
            return True
        if self._catalog is None:
            self._error = "subscribers given endpoints= have no catalog to find history in"
            return False
        states = self._catalog.history_states(self.topic)
        for p, elems in needed.items():
            s = states.get(p)
            if s is None:
                self._error = (f"partition {p} keeps no epoch log (its publisher has no "
                               f"retention) and has data at or beyond {list(elems)}")
                return False
            since = Antichain(self.order, s.since)
            if not all(since.less_equal(a) for a in elems):
                self._error = (f"partition {p} retains epochs only from {list(s.since)} "
                               f"on, after the position {list(position)}")
                self._retained = tuple(s.since)
                return False
        self.join, self._prior, self._lower = hj, [], None
        self._needed = tuple(needed)
        t0s = [a[0] if isinstance(a, tuple) else a for a in hj.position]
        self._t0 = min(t0s) if t0s else None
        return True

    def has_history(self) -> bool:
        """True iff some partition of the topic keeps an epoch log."""
        return self._catalog is not None and bool(self._catalog.history_states(self.topic))

    def unavailable(self, position, created: bool = False):
        """The error for a join at ``position`` that history cannot fill:
        :class:`SubscriptionExpired` for a durable subscription that fell behind retention
        (``created``: one this subscriber just created asked for too much: unavailable),
        else :class:`HistoryUnavailable`."""
        msg = f"topic {self.topic!r}: cannot resume at {list(position)}: {self._error}"
        durable = self.durable
        if durable is not None and self._retained is not None and not created:
            return SubscriptionExpired(f"durable subscription {durable.name!r}: {msg}",
                                       name=durable.name, acked=tuple(position),
                                       retained=self._retained)
        return HistoryUnavailable(msg, retained=self._retained)

    # -- the fill --------------------------------------------------------------------------
    def insert(self, outputs: list, lower: tuple) -> list:
        """Insert the wanted epochs that the merged lower frontier ``lower`` now says complete
        (one :class:`HistoryBatch`) ahead of the first frontier change in ``outputs`` (at the
        end if there is none); only when ``lower`` moved, and reading one page of the index
        per partition here (the rest as the batch is read)."""
        fill = self.join
        if lower == self._lower:
            return outputs
        served_to, self._lower = self._lower, lower
        pages = self._pages(fill, lower, served_to)
        some = pages.prime()
        owed = self._owed(fill, served_to)
        for p in set(self._needed) - set(pages.partitions):  # (keeps no log: no pages)
            self._check_retained(fill, owed, p, None)
        new = Antichain(self.order, lower)
        self._prior = [a for a in self._prior if not all(a.less_equal(x) for x in new)]
        self._prior.append(new)  # (an earlier lower at or before this one says nothing more)
        if fill.settled(lower):
            self.join = None
        else:  # later epochs are at or beyond this lower frontier
            t0s = [t0(t) for t in lower]
            if t0s:
                self._t0 = max(self._t0 or min(t0s), min(t0s))
        if not some:
            self._retire_finished()  # (with a batch: once it is read)
            return outputs
        self._unread += 1
        batch = HistoryBatch(pages, lower)
        first = next((i for i, m in enumerate(outputs) if type(m) is LowerFrontierUpdate),
                     len(outputs))
        return [*outputs[:first], batch, *outputs[first:]]

    def _pages(self, fill: HistoryJoin, lower: tuple, served_to) -> IndexPages:
        """The index pages of the batch of ``lower``: the wanted epochs complete at it that no
        earlier batch owes (each owes those not complete at the lower before it), read from
        the first component this join still needs on."""
        low, prior, wanted = Antichain(self.order, lower), tuple(self._prior), fill.wanted
        needed, owed = set(self._needed), self._owed(fill, served_to)

        def keep(t) -> bool:
            return (wanted(t) and not low.less_equal(t)
                    and all(a.less_equal(t) for a in prior))

        def check(p: int, after) -> None:
            if p in needed:
                self._check_retained(fill, owed, p, after)
        uppers = [t0(u) for u in fill.uppers]
        return IndexPages(self._catalog, self.topic, self.order,
                          self._catalog.history_states(self.topic), min_t0=self._t0,
                          max_t0=max(uppers) if uppers else None, keep=keep, check=check)

    @staticmethod
    def _owed(fill: HistoryJoin, served_to) -> tuple:
        """Where the epochs a batch owes are: at or beyond ``join(position, served_to)``."""
        return tuple(fill.position) if served_to is None else \
            join(fill.order, fill.position, served_to)

    def _check_retained(self, fill: HistoryJoin, owed: tuple, p: int, after) -> None:
        """After reading the index of partition ``p`` (after the time ``after``, ``None``:
        from its start): raise :class:`HistoryUnavailable` (durable:
        :class:`SubscriptionExpired`) if retention moved its ``since`` past an epoch the fill
        still owes — at or beyond ``owed`` (``join(position, served_to)``) and, read after
        ``after``, with a first component at least ``after``'s — so that epoch is never
        skipped silently, nor served with only the partitions that still hold it."""
        if not owed:
            return
        if after is not None:
            owed = tuple(raise_t0(a, t0(after)) for a in owed)
        s = self._catalog.history_state(self.topic, p)
        since = Antichain(self.order, () if s is None else s.since)
        if s is None or not all(since.less_equal(a) for a in owed):
            self.join = None
            self._error = (f"retention of partition {p} deleted epochs this subscriber "
                           f"still had to read from its log (it retains epochs only from "
                           f"{list(s.since) if s else []} on)")
            self._retained = tuple(s.since) if s else None
            raise self.unavailable(fill.position)

    def defer_retire(self, partition: int) -> bool:
        """A partition finished: True if its goodbye must wait for the fill (a batch unread,
        or epochs still owed: its publisher may have to serve their reads)."""
        if self._unread or self.join is not None:
            self._retire_later.add(partition)
            return True
        return False

    def _retire_finished(self) -> None:
        if not self._unread and self.join is None and self._retire_later:
            for p in sorted(self._retire_later):
                self.retire(p)
            self._retire_later.clear()

    def _batch_read(self) -> None:
        """A batch was read to its end, failed or was abandoned (once per batch)."""
        self._unread = max(0, self._unread - 1)
        self._retire_finished()

    # -- the epochs ------------------------------------------------------------------------
    def _chunks(self, batch: HistoryBatch) -> Iterator[tuple[list, Any]]:
        for chunk, bound in batch.pages.chunks():
            self._stats["history_epochs"] += len(chunk)
            yield chunk, bound

    def epochs(self, batch: HistoryBatch, now: float,
               on_chunk: Callable[[list, Any], None] | None = None) -> Iterator[Epoch]:
        """Read, check, decode, re-check against the filter and combine each epoch of
        ``batch`` (``now``: its ``released_at``); an epoch nothing of which matches is left
        out. ``on_chunk(times, bound)`` is told each chunk's times before its epochs (every
        later epoch of the batch has a first component ``>= bound``; ``None``: it is the last
        chunk). Raises :class:`HistoryUnavailable` (a durable subscription:
        :class:`SubscriptionExpired`) if retention deleted an epoch before it was read."""
        try:
            reader = self.reader()
            for chunk, bound in self._chunks(batch):
                if on_chunk is not None:
                    on_chunk([t for t, _ in chunk], bound)
                yield from self._epochs(reader, chunk, now)
        finally:  # read to the end, failed or abandoned: the publishers need not wait for it
            self._batch_read()

    def _epochs(self, reader, chunk: list, now: float) -> Iterator[Epoch]:
        decode, combine, filters = self.codec.decode, self.codec.combine, self._filters
        epochs = reader.read(chunk)
        while True:
            try:
                item = next(epochs, None)
            except SubscriptionExpired:
                raise
            except HistoryUnavailable as e:  # retention deleted it while we caught up
                durable = self.durable
                if durable is None or e.retained is None:  # (not: the publisher is gone)
                    raise
                raise SubscriptionExpired(
                    f"durable subscription {durable.name!r}: {e}", name=durable.name,
                    acked=durable.position or (), retained=e.retained or ()) from None
            if item is None:
                return
            t, recs, payloads = item
            chunks = [decode(p) for _, p in payloads]
            if filters.program is not None:
                chunks = [c for c in (filters.recheck(t, c) for c in chunks) if c is not None]
                if not chunks:
                    continue
            yield Epoch(t, combine(chunks), len(chunks), sum(r.nbytes for r in recs),
                        max(r.completed_at for r in recs), now)

    def messages(self, batch: HistoryBatch) -> Iterator[DataMessage]:
        """The :class:`DataMessage`\\ s of ``batch`` for ``events()``, read and decoded one at a
        time: epochs acked in an earlier session of a durable subscription skipped, records
        re-checked against the filter."""
        decode, filters, durable = self.codec.decode, self._filters, self.durable
        try:
            reader = self.reader()
            for chunk, _ in self._chunks(batch):
                for t, _recs, payloads in reader.read(chunk):
                    if durable is not None and durable.skips(t):
                        continue
                    for _, payload in payloads:
                        records = decode(payload)
                        if filters.program is not None:
                            records = filters.recheck(t, records)
                            if records is None:
                                continue
                        yield DataMessage(t, records, len(payload))
        finally:
            self._batch_read()
