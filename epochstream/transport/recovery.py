"""Recovery of a subscriber: what it does when a partition goes quiet or its publisher changes.

A mixin of :class:`~epochstream.transport.subscriber.Subscriber` (it uses the subscriber's
join, sockets and liveness policy). Decisions, on the catalog's word:

- a partition that closed between the subscriber's catalog lookup and its hello stands in with
  its final upper frontier (an empty lower frontier);
- a partition whose publisher aborted: :class:`~epochstream.errors.PublisherAborted`, or with
  ``recover=True`` a wait of up to ``timeout`` seconds for a new incarnation (live, or one that
  already ran and closed), then a re-join;
- a publisher that restarted (new incarnation) with ``recover=True``: a re-join;
- silence past ``timeout``: :class:`~epochstream.errors.PublisherLost`.

A re-join drops the join's incomplete epochs, joins every partition afresh with a *floor* (the
merged lower frontier before it, so no epoch is delivered twice, and never below the join's
position, which the stream may not have reached yet) and reports a complete
:class:`~epochstream.events.Gap` once every fresh snapshot is in.
"""

from __future__ import annotations

import logging
import time as _time

from .. import wire
from ..catalog import PartitionInfo
from ..errors import PublisherAborted, PublisherLost
from ..events import InitialFrontierSnapshot
from ..frontier import join
from .membership import catalog_partitions

__all__ = ["Recovery"]

log = logging.getLogger("epochstream.transport")


class Recovery:
    """Re-join and give-up decisions of a :class:`~epochstream.transport.subscriber.Subscriber`."""

    def _rejoin(self, reason: str, partition: int) -> None:
        """Drop this join (its pending epochs are incomplete), re-join every partition with
        fresh snapshots, and report a complete :class:`Gap` once they are all in."""
        old = self._protocol
        self._fill = None  # the old join's fill: the new join plans its own
        if old.ready:
            since = old.lower
            self._announced = old.lower
            if self._join_position is not None and hasattr(self.order, "join"):
                # never below the position: the stream may not have reached it yet
                since = join(self.order, self._join_position, since)
        elif self._pending_gap is not None:
            since = self._pending_gap[2]
        else:  # the first join was not ready: nothing was handed out, join afresh
            since = self._join_position
        for p in list(self._links.live()):
            self._retire_socket(p)
        if self._pending_gap is None and (old.ready or since is not None):
            self._pending_gap = (reason, partition, since)
        self.stats["rejoins"] += 1
        log.warning("topic %r: re-joining after %s on partition %s (last complete epoch %r)",
                    self.topic, reason, partition, self._last_epoch)
        self._join(floor=since)

    def _joined_incarnation(self, partition: int) -> str | None:
        return self._incarnations.get(partition) or self._catalog_incarnations.get(partition)

    def _check_liveness(self, now: float) -> None:
        """Settle suspect partitions from the catalog (closed or aborted before answering our
        hello, aborted without its notice reaching us, restarted); past ``timeout``:
        :class:`PublisherLost`."""
        if self._liveness.successor_check_due(now):
            self._check_awaiting(now)
        suspects = self._liveness.suspects(now)
        if not suspects:
            return
        parts = catalog_partitions(self._catalog, self.topic)
        for partition, silent in suspects:
            p = parts.get(partition)
            if p is not None and partition not in self._protocol.snapshots and p.state == "closed":
                self._retire_socket(partition)  # closed between our catalog lookup and our hello
                self._queue(self._snapshot(partition, InitialFrontierSnapshot((), tuple(p.upper))))
                continue
            if p is not None and p.state == "aborted" and (
                    partition not in self._protocol.snapshots
                    or p.incarnation == self._joined_incarnation(partition)):
                self._aborted(partition, None)  # its X aborted notice never reached us
                continue
            if self.recover and self._restarted(partition, p):
                self._rejoin("restarted", partition)
                return
            if self._liveness.lost(silent):
                raise PublisherLost(f"topic {self.topic!r}: no message from partition {partition} "
                                    f"for {silent:.1f} s (timeout {self.timeout} s)",
                                    partition=partition)

    def _restarted(self, partition: int, p: PartitionInfo | None) -> bool:
        """True iff ``p`` (the catalog's entry for ``partition``) is a live publisher with
        another incarnation than the one this subscriber joined, or a closed one (a successor
        that ran and finished before this subscriber noticed: re-joining takes its final upper
        frontier, and history, where kept, fills what it published)."""
        known = self._joined_incarnation(partition)
        return (p is not None and p.state in ("live", "closed") and known is not None
                and p.incarnation != known)

    def _aborted(self, partition: int, notice: wire.Notice | None) -> list:
        """A partition's publisher aborted (its ``X aborted`` notice, or the catalog says so).
        Without ``recover`` (or without a catalog to find a successor):
        :class:`PublisherAborted`. With it: wait up to ``timeout`` seconds for a new live
        incarnation in the catalog, then re-join and report a :class:`Gap`."""
        reason = notice.message if notice is not None else "the catalog marks it aborted"
        incarnation = ((notice.extra.get("incarnation") if notice is not None else None)
                       or self._joined_incarnation(partition))
        self._retire_socket(partition)
        if not self.recover or self._catalog is None:
            raise PublisherAborted(f"topic {self.topic!r}: the publisher of partition {partition} "
                                   f"aborted; its open epochs never complete ({reason})",
                                   partition=partition, reason=reason)
        log.warning("topic %r: partition %s aborted (%s); waiting up to %s s for a new publisher",
                    self.topic, partition, reason, self.timeout)
        self._liveness.await_successor(partition, incarnation, _time.monotonic(), reason)
        return []

    def _check_awaiting(self, now: float) -> None:
        """Re-join once an aborted partition has a new live incarnation in the catalog;
        :class:`PublisherAborted` when one did not appear within ``timeout``."""
        parts = catalog_partitions(self._catalog, self.topic)
        for partition, (incarnation, deadline, reason) in list(self._liveness.awaiting.items()):
            p = parts.get(partition)
            if p is not None and p.state in ("live", "closed") and p.incarnation != incarnation:
                self._rejoin("aborted", partition)  # (closed: a successor that ran and finished)
                return
            if now > deadline:
                raise PublisherAborted(
                    f"topic {self.topic!r}: the publisher of partition {partition} aborted "
                    f"({reason}) and no new publisher appeared within {self.timeout} s",
                    partition=partition, reason=reason)

