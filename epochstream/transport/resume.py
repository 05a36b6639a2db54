"""History and durable positions of a subscriber: joining at a position, filling from the epoch
logs exactly what the live filter drops, and acking (docs/history.md).

A mixin of :class:`~epochstream.transport.subscriber.Subscriber`. The decisions are the pure
:class:`~epochstream.position.HistoryJoin` and :class:`~epochstream.position.AckTracker`; this
module reads the catalog and the logs (:class:`~epochstream.history.History`) for them.

How a join at position ``A`` stays gapless: the live join gets a floor ``A`` (data not at or
beyond ``A`` is dropped) and its Strymon filter ``U`` drops every epoch some partition had begun
before the join. When every snapshot is in, :class:`HistoryJoin` names the epochs history must
supply (``A <= t <= u``) and the partitions whose logs it needs; each is checked (a log that
retains everything from ``A`` on) or the join fails with
:class:`~epochstream.errors.HistoryUnavailable` (a durable subscription:
:class:`~epochstream.errors.SubscriptionExpired`). From then on, before every merged frontier
change, the wanted epochs that the merged lower frontier now says complete are read from the
index (a publisher indexes an epoch before it sends the frontier update that completes it, so
they are all there) and handed out, whole, ahead of the update: an order consistent with the
partial order, since no live epoch is ``<=`` a wanted one.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..errors import HistoryUnavailable, ProtocolError, SubscriptionExpired, SubscriptionHeld
from ..events import Epoch, LowerFrontierUpdate
from ..frontier import Antichain, beyond, join
from ..order import linear_extension
from ..position import AckTracker, HistoryJoin

__all__ = ["Resume", "HistoryBatch", "Rejoined"]

log = logging.getLogger("epochstream.transport")


@dataclasses.dataclass(frozen=True)
class HistoryBatch:
    """Internal event: complete epochs to hand out from history, ``[(time, [EpochRecord])]``
    in a linear extension of the order; ``lower``: the merged lower frontier they are complete
    against (the frontier update that follows the batch moves to it)."""

    epochs: list
    lower: tuple


@dataclasses.dataclass(frozen=True)
class Rejoined:
    """Internal event: a re-join whose gap history fills (no :class:`~epochstream.events.Gap`).
    ``epochs()`` drops the old join's incomplete epochs; ``events()`` hands out ``withdraw`` (the
    old merged frontier's removal) so its consumers' frontier stays consistent."""

    withdraw: LowerFrontierUpdate | None


class Resume:
    """Joining at a position and durable subscriptions, for the Subscriber."""

    def _init_resume(self, position, durable: str | None, takeover: bool) -> Any:
        """Resolve where the first join starts: returns its floor (``None`` for latest)."""
        self.durable = durable
        self._fill: HistoryJoin | None = None
        # history batches handed to the caller's queue and not read to the end yet: while any
        # is, a finished partition's connection stays open (no bye), so its publisher lingers
        # and can still serve the reads (docs/history.md, "Remote history")
        self._fills_unread = 0
        self._retire_later: set = set()
        self._fill_served: set = set()
        self._fill_t0: int | None = None
        self._history = None
        self._acks: AckTracker | None = None
        self._resolve_at_ready = False
        self._durable_new = False  # created by this subscriber, its start not served yet
        self._refused_new = False  # ... and refused: close() drops it again
        if durable is not None:
            if self._catalog is None:
                raise ValueError("durable= needs a catalog (the position is held there)")
            info = self._catalog.durable_claim(self.topic, durable, self.id, takeover=takeover)
            if info.position is not None:
                position = tuple(info.position)
                self._acks = AckTracker(self.order, position, info.acked)
                log.info("durable subscription %r of %r resumes at %s", durable, self.topic,
                         list(position))
            elif position is None:  # "latest": resolved once the live join is ready
                self._resolve_at_ready = True
            else:
                self._durable_new = True
        if position == "earliest":
            position = self._earliest()
        if position is not None and self._acks is None and durable is not None:
            self._acks = AckTracker(self.order, position)
            self._store_position()
        return position

    def _history_reader(self):
        if self._history is None:
            from ..history import History
            from ..history_remote import DEFAULT_TIMEOUT
            # a history read waits no longer than this subscriber waits for its publishers
            mine = getattr(self, "timeout", None)
            timeout = DEFAULT_TIMEOUT if not mine or mine <= 0 else min(DEFAULT_TIMEOUT, mine)
            self._history = History(self.topic, self._catalog, timeout=timeout,
                                    security=getattr(self, "security", None))
        self._history.endpoints = dict(getattr(self, "_endpoints", {}))  # this join's publishers
        return self._history

    def _earliest(self) -> tuple:
        """Everything retained: the join of every logged partition's ``since``."""
        if self._catalog is None:
            raise ValueError("start='earliest' needs a catalog (history is found there)")
        return self._history_reader().since

    # -- the join --------------------------------------------------------------------------
    def _plan_history(self, position) -> bool:
        """Once every snapshot is in: set up the history fill of a join at ``position``.
        Returns False if history cannot fill it (the caller raises or reports a Gap)."""
        protocol = self._protocol
        snaps = {p: (s.lower, s.upper) for p, s in protocol.snapshots.items()}
        hj = HistoryJoin(self.order, position, snaps)
        needed = hj.needed_partitions()
        self._fill = None
        if not needed:
            return True
        if self._catalog is None:
            self._fill_error = "subscribers given endpoints= have no catalog to find history in"
            return False
        states = self._catalog.history_states(self.topic)
        for p, elems in needed.items():
            s = states.get(p)
            if s is None:
                self._fill_error = (f"partition {p} keeps no epoch log (its publisher has no "
                                    f"retention) and has data at or beyond {list(elems)}")
                return False
            since = Antichain(self.order, s.since)
            if not all(since.less_equal(a) for a in elems):
                self._fill_error = (f"partition {p} retains epochs only from {list(s.since)} "
                                    f"on, after the position {list(position)}")
                self._fill_retained = tuple(s.since)
                return False
        self._fill, self._fill_served, self._fill_lower = hj, set(), None
        self._fill_needed = tuple(needed)
        t0s = [a[0] if isinstance(a, tuple) else a for a in hj.position]
        self._fill_t0 = min(t0s) if t0s else None
        return True

    def _history_unavailable(self, position, durable_first: bool = True):
        msg = (f"topic {self.topic!r}: cannot resume at {list(position)}: "
               f"{getattr(self, '_fill_error', 'history unavailable')}")
        retained = getattr(self, "_fill_retained", None)
        if self.durable is not None and durable_first and retained is not None \
                and not self._durable_new:  # (a new one asked for too much: unavailable)
            return SubscriptionExpired(f"durable subscription {self.durable!r}: {msg}",
                                       name=self.durable, acked=tuple(position),
                                       retained=retained)
        return HistoryUnavailable(msg, retained=retained)

    def _ready_history(self, out: list) -> list:
        """Called when the join became ready (``out``: the protocol's outputs so far)."""
        if self._resolve_at_ready:
            self._resolve_at_ready = False
            # "latest" of a finished topic: where its next run continues
            self._join_position = self._protocol.lower or self._after_end() or ()
            self._acks = AckTracker(self.order, self._join_position)
            self._store_position()
        position = self._join_position
        if position is None:
            return out
        if not self._plan_history(position):
            self._refused_new = self._durable_new
            raise self._history_unavailable(position)
        self._durable_new = False  # its start is served: it stays, whatever happens next
        return out

    def _with_history(self, outputs: list) -> list:
        """Insert the wanted epochs that the merged lower frontier now says complete ahead of
        the first frontier change in ``outputs`` (at the end if there is none); the index is
        read only when the merged lower frontier moved."""
        fill = self._fill
        if fill is None or not self._protocol.ready:  # a re-join's first snapshots: the merged
            return outputs                            # lower frontier is not known yet
        lower = self._protocol.lower
        if lower == self._fill_lower:
            return outputs
        served_to, self._fill_lower = self._fill_lower, lower
        first = next((i for i, m in enumerate(outputs) if type(m) is LowerFrontierUpdate),
                     len(outputs))
        low = Antichain(self.order, lower)
        by_time: dict = {}
        for p in self._catalog.history_states(self.topic):
            for r in self._catalog.history_epochs(self.topic, p, min_t0=self._fill_t0):
                t = r.time
                if t in self._fill_served or low.less_equal(t) or not fill.wanted(t):
                    continue
                by_time.setdefault(t, []).append(r)
        self._check_retained(fill, served_to)
        if fill.settled(lower):
            self._fill = None
        else:  # later epochs are at or beyond this lower frontier
            t0s = [t[0] if isinstance(t, tuple) else t for t in lower]
            if t0s:
                self._fill_t0 = max(self._fill_t0 or min(t0s), min(t0s))
        if not by_time:
            self._retire_finished()  # (with a batch: once it is read)
            return outputs
        self._fill_served.update(by_time)
        self._fills_unread += 1
        self.stats["history_epochs"] += len(by_time)
        batch = HistoryBatch([(t, by_time[t]) for t in linear_extension(self.order, by_time)],
                             lower)
        return [*outputs[:first], batch, *outputs[first:]]

    def _check_retained(self, fill: HistoryJoin, served_to) -> None:
        """After reading the index for a fill: raise :class:`HistoryUnavailable` (a durable
        subscription: :class:`SubscriptionExpired`) if retention moved a needed partition's
        ``since`` past an epoch the fill still owes — at or beyond the position and not
        served yet, i.e. at or beyond ``join(position, served_to)`` — so that epoch is never
        skipped silently, nor served with only the partitions that still hold it."""
        owed = tuple(fill.position) if served_to is None else \
            join(self.order, fill.position, served_to)
        if not owed:
            return
        states = self._catalog.history_states(self.topic)
        for p in self._fill_needed:
            s = states.get(p)
            since = Antichain(self.order, () if s is None else s.since)
            if s is None or not all(since.less_equal(a) for a in owed):
                self._fill = None
                self._fill_error = (f"retention of partition {p} deleted epochs this "
                                    f"subscriber still had to read from its log (it retains "
                                    f"epochs only from {list(s.since) if s else []} on)")
                self._fill_retained = tuple(s.since) if s else None
                raise self._history_unavailable(fill.position)

    def _retire_finished(self) -> None:
        """Say goodbye to the finished partitions kept open for the fill, once no fill batch
        is left to read and the fill owes nothing more (their publishers may have to serve
        its reads until then)."""
        if not self._fills_unread and self._fill is None and self._retire_later:
            for p in sorted(self._retire_later):
                self._retire_socket(p)
            self._retire_later.clear()

    def _history_epochs(self, batch: HistoryBatch, now: float):
        """Read, check, decode and combine each epoch of ``batch``; yield :class:`Epoch`."""
        reader = self._history_reader()
        try:
            yield from self._history_batch(reader, batch, now)
        finally:  # read to the end, failed or abandoned: the publishers need not wait for it
            self._batch_read()

    def _batch_read(self) -> None:
        """A history batch was read to its end, failed or was abandoned (every reader of
        batches calls this once per batch)."""
        self._fills_unread = max(0, self._fills_unread - 1)
        self._retire_finished()

    def _history_batch(self, reader, batch: HistoryBatch, now: float):
        decode, combine = self.codec.decode, self.codec.combine
        epochs = reader.read(batch.epochs)
        while True:
            try:
                item = next(epochs, None)
            except HistoryUnavailable as e:  # retention deleted it while we caught up
                if self.durable is None or e.retained is None:  # (not: the publisher is gone)
                    raise
                raise SubscriptionExpired(
                    f"durable subscription {self.durable!r}: {e}", name=self.durable,
                    acked=self.position or (), retained=e.retained or ()) from None
            if item is None:
                return
            t, recs, payloads = item
            chunks = [decode(p) for _, p in payloads]
            if self._filters.program is not None:
                recheck = self._filters.recheck
                chunks = [c for c in (recheck(t, c) for c in chunks) if c is not None]
                if not chunks:
                    continue
            yield Epoch(t, combine(chunks), len(chunks), sum(r.nbytes for r in recs),
                        max(r.completed_at for r in recs), now)

    # -- durable ---------------------------------------------------------------------------
    def _store_position(self) -> None:
        if self.durable is None or self._acks is None:
            return
        if not self._catalog.durable_ack(self.topic, self.durable, self.id,
                                         list(self._acks.position), list(self._acks.acked)):
            self._lost_hold()

    def _lost_hold(self):
        info = self._catalog.durable(self.topic, self.durable)
        why = ("it was dropped" if info is None else
               f"it expired ({info.reason})" if info.state == "expired" else
               "another subscriber took it over" if info.holder not in (None, self.id) else
               "another subscriber took it over and has closed since, or it was reset")
        raise SubscriptionHeld(f"durable subscription {self.durable!r} of topic {self.topic!r}: "
                               f"this subscriber no longer holds it ({why}); its acks are "
                               f"refused")

    def ack(self, epoch) -> None:
        """Acknowledge a handed-out epoch (an :class:`~epochstream.events.Epoch` or its time)
        of a durable subscription: the catalog then holds the new :attr:`position` (one write),
        and a resume never redelivers it. Raises ``ValueError`` without ``durable=`` or for an
        epoch that is not an unacked handed-out one (acked already, never handed out),
        :class:`~epochstream.errors.SubscriptionHeld` if this subscriber's hold was taken over,
        reset, dropped or expired (fencing: the ack is refused)."""
        if self.durable is None or self._acks is None:
            raise ValueError("ack() needs a durable subscription: Subscriber(..., durable=name)")
        if getattr(self, "_closed", False):
            raise ValueError(f"durable subscription {self.durable!r}: this subscriber is closed "
                             f"(it released its hold); open it again to ack")
        t = epoch.time if isinstance(epoch, Epoch) else epoch
        check = getattr(self.order, "check", None)
        try:
            t = check(t) if check else t
        except ProtocolError as e:
            raise ValueError(str(e)) from None
        saved = self._acks.snapshot()
        if not self._acks.ack(t):
            raise ValueError(f"epoch {t!r} is not an unacked epoch handed out by this subscriber "
                             f"(acked already, or never handed out)")
        try:
            self._store_position()
        except BaseException:  # refused (fenced) or failed: nothing of this ack stays
            self._acks.restore(saved)
            raise

    def _after_end(self) -> tuple | None:
        """Where a durable subscription of a finished stream stands once everything is acked:
        the times not at or below any time the stream had data at (every partition's upper
        frontier in the catalog), where a new run of the topic continues (docs/history.md) —
        never the empty frontier, at which nothing would ever be delivered again. ``None`` for
        an order :func:`~epochstream.frontier.beyond` cannot compute this for."""
        from ..order import dual
        uppers = Antichain(dual(self.order))
        if self._catalog is not None:
            for p in self._catalog.lookup(self.topic).partition_info:
                uppers.extend(p.upper)
            for s in self._catalog.history_states(self.topic).values():
                uppers.extend(s.upper)
        return beyond(self.order, uppers.elements)

    def _ack_frontier(self, lower) -> None:
        """Tell the ack tracker the merged lower frontier (at the end of the stream, where it
        stands after it: :meth:`_after_end`; for an order without one, the last frontier stays,
        and the epochs acked beyond it are kept as out-of-order acks)."""
        lower = tuple(lower) or self._after_end()
        if lower is not None:
            self._acks.frontier(lower)

    def _skipped(self, t) -> bool:
        """True iff epoch ``t`` was acked in an earlier session of this durable subscription
        (``events()`` hands nothing of it out again)."""
        return self._acks is not None and self._acks.skips(t)

    @property
    def position(self) -> tuple | None:
        """The acked position of a durable subscription (a tuple of times: every epoch not at or
        beyond it was acked), or ``None`` without ``durable=`` (or before a ``"latest"`` start
        is resolved, when the join is ready)."""
        return None if self._acks is None else self._acks.position

    def _close_history(self) -> None:
        if self._history is not None:
            self._history.close()

    def _forget_new_durable(self) -> None:
        """A subscriber that created its durable subscription and whose start was refused
        (older than what is retained, or the constructor failed), once closed: drop it again
        if it is still as this subscriber left it (free, at the start it stored), so a refused
        start leaves nothing behind. Best effort:
        a catalog that refuses (a secured one needs an admin grant to drop) leaves a free name
        at that start."""
        if self.durable is None or self._catalog is None or self._acks is None:
            return
        try:
            info = self._catalog.durable(self.topic, self.durable)
            if info is not None and info.holder is None and \
                    tuple(info.position or ()) == tuple(self._acks.start):
                self._catalog.durable_drop(self.topic, self.durable)
        except Exception:  # noqa: BLE001 - the refusal being raised matters more
            log.debug("could not drop the unused durable %r", self.durable, exc_info=True)

    def _release_hold(self) -> None:
        if self.durable is not None and self._catalog is not None:
            try:
                self._catalog.durable_release(self.topic, self.durable, self.id)
            except Exception:  # closing must not fail on the catalog
                log.debug("could not release durable %r", self.durable, exc_info=True)
