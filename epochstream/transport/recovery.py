"""Recovery of a subscriber: what it does when a partition goes quiet or its publisher changes.

:class:`Recovery` is composed into the :class:`~epochstream.transport.subscriber.Subscriber`
(its own state: the re-join under way and the frontier handed out before it). It decides, on
the catalog's word, and the subscriber carries the decisions out (:data:`CLOSED`,
:data:`RETIRE`, :data:`REJOIN` actions) or raises what it raises:

- a partition that closed between the subscriber's catalog lookup and its hello stands in with
  its final upper frontier (an empty lower frontier);
- a partition whose publisher aborted: :class:`~epochstream.errors.PublisherAborted`, or with
  ``recover=True`` a wait of up to ``timeout`` seconds for a new incarnation (live, or one that
  already ran and closed), then a re-join;
- a publisher that restarted (new incarnation) with ``recover=True``: a re-join;
- silence past ``timeout``: :class:`~epochstream.errors.PublisherLost`.

A re-join drops the join's incomplete epochs, joins every partition afresh *as of* a frontier (the
merged lower frontier before it, so no epoch is delivered twice, and never below the join's
position, which the stream may not have reached yet) and, once every fresh snapshot is in,
reports a complete :class:`~epochstream.events.Gap` — or, where the epoch logs hold what was
missed, fills it from history instead.
"""

from __future__ import annotations

import logging
import time as _time
from typing import Callable

from .. import wire
from ..catalog import Catalog, PartitionInfo
from ..errors import PublisherAborted, PublisherLost
from ..events import Gap, LowerFrontierUpdate
from ..frontier import Antichain, join
from ..order import dual
from .fill import HistoryFill, Rejoined
from .liveness import Liveness
from .discovery import catalog_partitions

__all__ = ["Recovery", "CLOSED", "RETIRE", "REJOIN"]

log = logging.getLogger("epochstream.transport")

#: ``(CLOSED, partition, upper)``: it closed before answering the hello; stand in with ``upper``
CLOSED = "closed"
#: ``(RETIRE, partition)``: its publisher aborted; close its connection
RETIRE = "retire"
#: ``(REJOIN, reason, partition)``: join every partition afresh
REJOIN = "rejoin"


class Recovery:
    """Re-join and give-up decisions for one subscriber of ``topic`` (times of ``order``):
    ``recover`` and ``timeout`` (seconds) as the subscriber's options; ``catalog`` (``None``:
    endpoints given, no successor can be found); ``liveness``: the subscriber's liveness
    policy (silence, awaited successors)."""

    def __init__(self, topic: str, order, catalog: Catalog | None, liveness: Liveness, *,
                 recover: bool, timeout: float):
        self.topic, self.order, self.recover, self.timeout = topic, order, recover, timeout
        self._catalog, self._liveness = catalog, liveness
        self.pending_gap: tuple | None = None  # (reason, partition, since) while re-joining
        self.announced: tuple = ()  # the merged lower frontier handed out before a re-join

    def rejoin_as_of(self, reason: str, partition: int, protocol, position) -> tuple | None:
        """A re-join of the join whose protocol state is ``protocol`` (its position
        ``position``: ``None`` for latest) after ``reason`` on ``partition``: the ``as_of`` the
        new join starts at. Remembers the gap to report (or fill) once the new join is
        ready."""
        if protocol.ready:
            since = protocol.lower
            self.announced = protocol.lower
            if position is not None and hasattr(self.order, "join"):
                # never below the position: the stream may not have reached it yet
                since = join(self.order, position, since)
        elif self.pending_gap is not None:
            since = self.pending_gap[2]
        else:  # the first join was not ready: nothing was handed out, join afresh
            since = position
        if self.pending_gap is None and (protocol.ready or since is not None):
            self.pending_gap = (reason, partition, since)
        return since

    def rejoined(self, protocol, fill: HistoryFill, durable: bool, last_epoch) -> tuple:
        """The re-join's new join is ready (``protocol``): ``(event, position)`` — a
        :class:`Rejoined` and the position history fills from, where the logs hold what was
        missed; else a :class:`Gap` and ``None``. A ``durable`` subscriber never skips: it
        raises :class:`~epochstream.errors.HistoryUnavailable` (or
        :class:`~epochstream.errors.SubscriptionExpired`) instead."""
        reason, culprit, since = self.pending_gap
        self.pending_gap = None
        if fill.has_history() and fill.plan(since, protocol.snapshots):
            withdraw = (LowerFrontierUpdate(tuple((t, -1) for t in self.announced))
                        if self.announced else None)
            return Rejoined(withdraw), since
        if durable:
            raise fill.unavailable(since)
        uppers = Antichain(dual(self.order))
        for s in protocol.snapshots.values():
            uppers.extend(s.upper)
        return Gap(reason, culprit, last_epoch, tuple(since), protocol.lower, uppers.elements,
                   self.order), None

    def check(self, now: float, snapshots: dict, joined: Callable[[int], str | None]) -> list:
        """Settle suspect partitions from the catalog (closed or aborted before answering our
        hello, aborted without its notice reaching us, restarted): the actions to carry out.
        ``snapshots``: the partitions that answered; ``joined(partition)``: the incarnation
        joined. Raises :class:`PublisherLost` past ``timeout``, :class:`PublisherAborted`."""
        if self._liveness.successor_check_due(now):
            action = self.check_awaiting(now)
            if action is not None:
                return [action]
        suspects = self._liveness.suspects(now)
        if not suspects:
            return []
        parts, actions = catalog_partitions(self._catalog, self.topic), []
        for partition, silent in suspects:
            p = parts.get(partition)
            if p is not None and partition not in snapshots and p.state == "closed":
                actions.append((CLOSED, partition, tuple(p.upper)))
                continue
            if p is not None and p.state == "aborted" and (
                    partition not in snapshots or p.incarnation == joined(partition)):
                actions.append((RETIRE, partition))  # its X aborted notice never reached us
                self.aborted(partition, None, joined(partition))
                continue
            if self.recover and _restarted(p, joined(partition)):
                actions.append((REJOIN, "restarted", partition))
                return actions
            if self._liveness.lost(silent):
                raise PublisherLost(f"topic {self.topic!r}: no message from partition {partition} "
                                    f"for {silent:.1f} s (timeout {self.timeout} s)",
                                    partition=partition)
        return actions

    def aborted(self, partition: int, notice: wire.Notice | None, joined: str | None) -> None:
        """A partition's publisher aborted (its ``X aborted`` notice, or the catalog says so;
        ``joined``: the incarnation joined). Without ``recover`` (or without a catalog to find
        a successor): :class:`PublisherAborted`. With it: await a new incarnation for up to
        ``timeout`` seconds (:meth:`check_awaiting`)."""
        reason = notice.message if notice is not None else "the catalog marks it aborted"
        incarnation = (notice.extra.get("incarnation") if notice is not None else None) or joined
        if not self.recover or self._catalog is None:
            raise PublisherAborted(f"topic {self.topic!r}: the publisher of partition {partition} "
                                   f"aborted; its open epochs never complete ({reason})",
                                   partition=partition, reason=reason)
        log.warning("topic %r: partition %s aborted (%s); waiting up to %s s for a new publisher",
                    self.topic, partition, reason, self.timeout)
        self._liveness.await_successor(partition, incarnation, _time.monotonic(), reason)

    def check_awaiting(self, now: float) -> tuple | None:
        """A :data:`REJOIN` action once an aborted partition has a new incarnation in the
        catalog (live, or one that ran and closed); :class:`PublisherAborted` when none
        appeared within ``timeout``."""
        parts = catalog_partitions(self._catalog, self.topic)
        for partition, (incarnation, deadline, reason) in list(self._liveness.awaiting.items()):
            p = parts.get(partition)
            if p is not None and p.state in ("live", "closed") and p.incarnation != incarnation:
                return (REJOIN, "aborted", partition)
            if now > deadline:
                raise PublisherAborted(
                    f"topic {self.topic!r}: the publisher of partition {partition} aborted "
                    f"({reason}) and no new publisher appeared within {self.timeout} s",
                    partition=partition, reason=reason)
        return None


def _restarted(p: PartitionInfo | None, known: str | None) -> bool:
    """True iff ``p`` (the catalog's entry for a partition joined at incarnation ``known``) is
    a live publisher with another incarnation, or a closed one (a successor that ran and
    finished before the subscriber noticed: re-joining takes its final upper frontier, and
    history, where kept, fills what it published)."""
    return (p is not None and p.state in ("live", "closed") and known is not None
            and p.incarnation != known)
