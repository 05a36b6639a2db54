"""Event-time commits of one partition of a Spark-fed topic (:mod:`epochstream.spark.event_time`
has the policy): a part of :class:`~epochstream.spark.partition_server._PartitionServer` with
its own state — the batch ids each streaming query committed here, the greatest event time
seen, the rows of epochs published but not complete — that carries out a COMMIT of a batch
whose rows carry their own epochs on the server's Publisher, pause points and ledger.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from ..errors import EpochstreamError
from .event_time import WATERMARK, decide, decide_product
from .ingest import Commit, CommitAck, Data, Flush
from . import ingest

__all__ = ["EventCommits", "Tagged", "event_request", "COMMIT_LOG_TIMEOUT"]

log = logging.getLogger("epochstream.spark.host")

COMMIT_LOG_TIMEOUT = 30.0
"""Seconds a COMMIT waits for its epochs to be in the epoch log (with ``retention=``) before
it is refused instead of acknowledged."""


class Tagged:
    """A staged payload whose rows carry their own epoch (event time): ``len()`` is the
    payload's, as the ledger counts bytes."""

    __slots__ = ("time", "rows", "payload")

    def __init__(self, time_: int, rows: int, payload) -> None:
        self.time, self.rows, self.payload = time_, rows, payload

    def __len__(self) -> int:
        return len(self.payload)



def event_request(msg: ingest.Request) -> bool:
    """True iff ``msg`` carries event time (its rows' own epochs), or is an ABORT."""
    if isinstance(msg, Data):
        return msg.time is not None
    if isinstance(msg, Flush):
        return msg.event
    if isinstance(msg, Commit):
        return msg.event is not None
    return True


@dataclass
class _EventState:
    """What event-time commits left on a partition (:class:`EventCommits`): per streaming
    query the first batch id not committed here, the greatest event time seen
    (microseconds), rows published per epoch not yet complete, epochs completed, late rows
    dropped."""

    used: bool = False
    warned_begun: bool = False
    batches: dict = dataclasses.field(default_factory=dict)  # query id -> next batch id
    event_max: int | None = None
    open_rows: dict = dataclasses.field(default_factory=dict)
    completed: int = 0
    late_rows: int = 0

    def next_batch(self, query: str | None) -> int | None:
        """The first batch id of streaming query ``query`` not committed here; 0 for a query
        new to a host that committed others since it started; ``None`` (unknown: maybe
        committed before this host restarted) when it committed nothing yet."""
        known = self.batches.get(query)
        return known if known is not None else (0 if self.batches else None)


class EventCommits:
    """``EventCommits(server)``: the event-time COMMITs of one partition server (its
    ``publisher``, ``ledger``, ``pause_point``, ``advance``, ``published``, ``logged``,
    ``frontier``, ``begun_until``); :attr:`state` is what they left."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.state = _EventState()

    def commit(self, msg: Commit) -> CommitAck:
        """An event-time COMMIT (:mod:`epochstream.spark.event_time`): the policy decides
        (a ``"batch"`` commit with rows of a complete epoch raises, nothing changed); the
        named attempts' rows of epochs not yet complete are published at their epochs, rows of
        complete epochs dropped and counted, and the Publisher advanced to the policy's
        frontier, completing the epochs below it."""
        srv = self.server
        ev, state, own = msg.event, self.state, srv.next_epoch
        assert ev is not None
        state.used = True
        frontier = self._watermark_floor(own) if ev.policy == WATERMARK else own
        next_batch = state.next_batch(msg.query)
        d = decide(ev.policy, msg.epoch, frontier, next_batch, ev.times, ev.event_max,
                   state.event_max, ev.length, ev.delay)
        if d.note:
            log.warning("partition %d: %s", srv.index, d.note)
        if d.duplicate:
            srv.ledger.duplicate(msg.epoch)
            state.batches[msg.query] = max(next_batch or 0, msg.epoch + 1)
            return CommitAck(msg.req, True, 0, 0, own)
        plan = srv.ledger.commit(next_batch or 0, msg.epoch, msg.attempts)
        keep = sorted((p for p in plan.payloads if p.time >= frontier), key=lambda p: p.time)
        late = sum(p.rows for p in plan.payloads if p.time < frontier)
        if late:
            state.late_rows += late
            log.warning("partition %d: batch %d: %d row(s) of epochs complete already (before "
                        "%d) dropped", srv.index, msg.epoch, late, frontier)
        for p in keep:
            srv.publisher.send_encoded(p.time, p.payload)
            state.open_rows[p.time] = state.open_rows.get(p.time, 0) + p.rows
        # the pause points of an event-time batch name any epoch with rows in the whole batch
        # (every partition sees the same range, whichever rows it holds)
        srv.pause_point(range(ev.times[0], ev.times[1] + 1) if ev.times else (), "data")
        if d.next_frontier > own:
            srv.advance(d.next_frontier, msg.epoch)
        state.batches[msg.query], state.event_max = msg.epoch + 1, d.event_max
        done = range(own, d.next_frontier)
        srv.pause_point(done, "advanced")
        for epoch in done:
            state.completed += 1
            srv.published(epoch, state.open_rows.pop(epoch, 0))
        return CommitAck(msg.req, False, len(keep), plan.rows - late, srv.next_epoch,
                         plan.empty_attempts)

    def commit_product(self, msg: Commit) -> CommitAck:
        """An event-time COMMIT on a product-order topic (``epochColumns``, the ``"batch"``
        policy): :func:`~epochstream.spark.event_time.decide_product` decides; the named
        attempts' rows are published at their epochs and the Publisher's frontier moves to the
        minimal times past every epoch at or below the batch's (a progress update)."""
        srv = self.server
        ev, state = msg.event, self.state
        assert ev is not None
        state.used = True
        before = list(srv.frontier)
        next_batch = state.next_batch(msg.query)
        d = decide_product(srv.host.order, msg.epoch, before, next_batch,
                           list(ev.minima), list(ev.maxima))
        if d.note:
            log.warning("partition %d: %s", srv.index, d.note)
        if d.duplicate:
            srv.ledger.duplicate(msg.epoch)
            state.batches[msg.query] = max(next_batch or 0, msg.epoch + 1)
            return CommitAck(msg.req, True, 0, 0, 0)  # (no int frontier: a product order)
        plan = srv.ledger.commit(next_batch or 0, msg.epoch, msg.attempts)
        keep = sorted(plan.payloads, key=lambda p: p.time)
        for p in keep:
            srv.publisher.send_encoded(p.time, p.payload)
            state.open_rows[p.time] = state.open_rows.get(p.time, 0) + p.rows
        after = d.next_antichain or before
        if after != before:
            srv.publisher.progress([*((t, -n) for t, n in srv.publisher.capabilities.items()),
                                    *((t, 1) for t in after)])
            if srv.logged and not srv.publisher.flush(COMMIT_LOG_TIMEOUT):
                raise EpochstreamError(f"batch {msg.epoch} was not written to the epoch log "
                                       f"within {COMMIT_LOG_TIMEOUT:g} s; not acknowledged")
        state.batches[msg.query] = msg.epoch + 1
        le = srv.host.order.le
        for t in [t for t in state.open_rows if not any(le(f, t) for f in after)]:
            state.completed += 1
            srv.published(t, state.open_rows.pop(t))  # type: ignore[arg-type]
        return CommitAck(msg.req, False, len(keep), plan.rows, 0, plan.empty_attempts)

    def _watermark_floor(self, own: int) -> int:
        """The first epoch a watermark commit may still add rows to: past the epochs an earlier
        incarnation of this host's partition sent rows of but never completed. Those rows died
        with it, so those epochs take no more (they complete without rows: whole or not at
        all; a batch policy's re-run batch instead re-sends them whole)."""
        srv = self.server
        if srv.begun_until <= own:
            return own
        if not self.state.warned_begun:
            self.state.warned_begun = True
            log.warning("partition %d: epochs %d..%d were open when this partition last "
                        "stopped; their earlier rows are lost: they complete without rows, "
                        "later rows of them are dropped as late", srv.index, own,
                        srv.begun_until - 1)
        return srv.begun_until
