"""The serving of one partition of a Spark-fed topic: its ingest ROUTER, staging ledger and
:class:`~epochstream.transport.Publisher`, on one thread of the
:class:`~epochstream.spark.host.SparkPublisherHost` (:class:`_PartitionServer`), with the pause
points and per-partition statistics the host hands out.

The serving loop only drives two things: it decodes each ingest message
(:mod:`epochstream.spark.ingest`), applies it to the partition's
:class:`~epochstream.spark.staging.StagingLedger`, carries out the ledger's
:class:`~epochstream.spark.staging.CommitPlan` on the Publisher (publish the payloads, then
``advance_to(epoch + 1)``, which completes the epoch for subscribers) and replies. The
partition's frontier (the first epoch not yet complete) is the Publisher's lower frontier; it is
stored nowhere else. A malformed or refused message gets an ``ERR`` reply and a log line; the
loop keeps going.

Security (docs/security.md): with ``security=`` the ingest ROUTERs are CURVE servers with the
publishers' key pair and ``allow`` directory (:func:`~epochstream.security.apply_server`, the
same ZAP handling), so the key the catalog records with each partition (``server_key``) is the
ingest endpoint's key too; every request is served only if the connection's principal (its
ZAP ``User-Id``) holds a ``publish`` (or ``admin``) grant for the topic in the catalog, else it
gets ``ERR`` with reason ``not_authorised`` before anything of it is staged.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from ..catalog import Catalog
from ..errors import EpochstreamError
from ..order import TOTAL
from ..security import NOT_AUTHORISED, Authorizer, Security, apply_server
from ..transport import Publisher
from . import ingest
from .event_commits import COMMIT_LOG_TIMEOUT, EventCommits, Tagged, event_request
from .ingest import AbortAck, Commit, CommitAck, Data, Flush, FlushAck, Refusal
from .pause import Pause
from .staging import StagingCounts, StagingLedger

__all__ = ["PartitionStats", "Pause"]

log = logging.getLogger("epochstream.spark.host")  # the host's logger, as before the split


@dataclass
class PartitionStats(StagingCounts):
    """A snapshot of one partition
    (:meth:`~epochstream.spark.host.SparkPublisherHost.stats`): its ledger's counters (see
    :class:`~epochstream.spark.staging.StagingCounts`), its refused messages, and what its
    Publisher's frontiers say."""

    errors: int = 0           # malformed / refused ingest messages
    unauthorised: int = 0     # of those: refused for want of a publish grant (security=)
    next_epoch: int = 0       # the partition's frontier: every epoch below it is complete
    data_upper: int = -1      # largest epoch with published data (-1: none)
    late_rows: int = 0        # event time, "watermark": rows of complete epochs, dropped
    open_epochs: int = 0      # event time: epochs with published rows, not yet complete
    frontier: tuple = ()      # the Publisher's lower frontier (tuples for a product order)


class _Host(Protocol):
    """What a partition server reads of its host
    (:class:`~epochstream.spark.host.SparkPublisherHost`)."""

    topic: str
    order: Any
    partitions: int
    catalog: Catalog
    schema: str | None
    bind_host: str
    security: Security | None
    publisher_kwargs: dict
    max_staged_bytes: int
    on_published: Callable[[int, int, int], None] | None
    _zctx: zmq.Context
    _stop: threading.Event
    _authz: Authorizer | None
    _abort_reason: str | None
    _pauses: list[Pause]


class _PartitionServer:
    """Serves one topic partition: its ingest ROUTER, ledger and Publisher, on one thread."""

    def __init__(self, host: _Host, index: int):
        self.host = host
        self.index = index
        self.ledger = StagingLedger(host.max_staged_bytes)
        self.errors = 0
        self.unauthorised = 0
        self._decided: dict[str, tuple[int, str | None]] = {}  # User-Id -> (grants version, why)
        self._warned: dict[str, float] = {}  # refusal message -> when last logged
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.endpoint: str | None = None
        self.ingest: str | None = None
        self.sock: zmq.Socket | None = None
        self.pub: Publisher | None = None
        self._closed_frontier: tuple | None = None  # the frontier when close() emptied it
        self.events = EventCommits(self)  # event time (epochs from the rows) and its state
        #: past the epochs an earlier incarnation began but never completed (the Publisher's
        #: start: its upper frontier + 1 when at or beyond its lower one, else the lower)
        self.begun_until = 0
        self.thread = threading.Thread(target=self._run, name=f"epochstream-ingest-{index}",
                                       daemon=True)

    # ---- derived state

    @property
    def next_epoch(self) -> int:
        """The first epoch not yet complete: the Publisher's lower frontier (the one it had when
        the host closed it; 0 before it exists)."""
        if self.pub is None:
            return TOTAL.minimum
        if self.product:
            return -1
        lower = self.pub.lower or self._closed_frontier or (TOTAL.minimum,)
        return lower[0]

    @property
    def product(self) -> bool:
        """True iff the topic's order is a product order (``epochColumns`` only)."""
        return getattr(self.host.order, "width", None) is not None

    @property
    def frontier(self) -> tuple:
        """The partition's lower frontier (its elements: ints, or tuples for a product
        order): every epoch not at or beyond it is complete."""
        if self.pub is None:
            return ()
        return tuple(self.pub.lower or self._closed_frontier or ())

    @property
    def data_upper(self) -> int:
        """The largest epoch with published data (the Publisher's upper frontier; -1: none)."""
        upper = self.pub.upper if self.pub is not None else ()
        return upper[0] if upper and not self.product else -1

    @property
    def publisher(self) -> Publisher:
        assert self.pub is not None, "the serving loop runs once the Publisher exists"
        return self.pub

    @property
    def logged(self) -> bool:
        """True iff the partition keeps an epoch log (the host has ``retention=``)."""
        return self.host.publisher_kwargs.get("retention") is not None

    @property
    def _socket(self) -> zmq.Socket:
        assert self.sock is not None, "the serving loop runs once the ingest socket exists"
        return self.sock

    def stats(self) -> PartitionStats:
        counts = dataclasses.asdict(self.ledger.counts)
        ev = self.events.state
        if ev.used:  # the ledger counts batches committed; with event time, epochs completed
            counts["epochs"] = ev.completed
        return PartitionStats(**counts, errors=self.errors,
                              unauthorised=self.unauthorised, next_epoch=self.next_epoch,
                              data_upper=self.data_upper, late_rows=ev.late_rows,
                              open_epochs=len(ev.open_rows), frontier=self.frontier)

    def _staging_frontier(self, event: bool) -> int:
        """The first batch id the ledger may still stage: with event time any (batch ids are
        per query: a re-run's rows are dropped at its COMMIT), else the first incomplete epoch
        (the batch is it)."""
        return 0 if event else self.next_epoch  # event time: duplicates decided at COMMIT

    # ---- lifecycle

    def _run(self) -> None:
        try:
            self._open()
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self.error = e
            if self.sock is not None:
                self.sock.close(0)  # or the host's context could never terminate
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self.host._stop.is_set():
                if self._socket.poll(50, zmq.POLLIN):
                    self._handle(self._socket.recv_multipart(copy=False))
        except BaseException as e:  # noqa: BLE001
            self.error = e
            log.exception("partition %d ingest loop died", self.index)
        finally:
            self._end()

    def _open(self) -> None:
        h = self.host
        self.sock = sock = h._zctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        apply_server(sock, h.security)  # CURVE server + ZAP, as the Publisher's ROUTER
        sock.bind(f"tcp://{h.bind_host}:*")
        self.ingest = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.pub = Publisher(h.topic, self.index, order=h.order, codec="arrow",
                             endpoint=f"tcp://{h.bind_host}:*", catalog=h.catalog,
                             partitions=h.partitions, schema=h.schema, ingest=self.ingest,
                             **h.publisher_kwargs)
        self.endpoint = self.pub.endpoint
        # an earlier incarnation may have sent rows of epochs it never completed (a resumed
        # epoch log whose upper frontier is at or beyond its lower one)
        self.begun_until = max(self.next_epoch, self.data_upper + 1)

    def _end(self) -> None:
        """Close the Publisher (every published epoch completes) — or abort it (open epochs
        never complete: subscribers get PublisherAborted) when the host aborted or the loop
        died — and the ingest socket."""
        reason = self.host._abort_reason or (repr(self.error) if self.error is not None else None)
        try:
            if reason is None:
                self._closed_frontier = self.publisher.lower
                self.publisher.close()
            else:
                self.publisher.abort(reason)
        except Exception:  # noqa: BLE001
            log.exception("ending the publisher of partition %d failed", self.index)
        self._socket.close(0)

    # ---- messages

    def _handle(self, frames: list) -> None:
        """Decode one ingest message (``[identity, kind, header, ...]``), apply it, reply."""
        ident = frames[0].bytes
        try:
            msg = ingest.decode_request(frames[1:])
        except ingest.IngestMessageError as e:
            return self._refuse(ident, e.req, str(e))
        if self.host._authz is not None:
            why = self._unauthorised(frames[-1])
            if why is not None:
                return self._refuse_unauthorised(ident, msg.req, why)
        try:
            reply = self._apply(msg)
        except (ValueError, TypeError, KeyError, IndexError, EpochstreamError) as e:
            return self._refuse(ident, msg.req, f"{msg.KIND.decode()}: {e}")
        if reply is not None:
            self._reply(ident, reply)

    def _apply(self, msg: ingest.Request) -> ingest.Reply | None:
        if self.product and not event_request(msg):
            raise EpochstreamError(
                f"topic {self.host.topic!r} has a product order: a query writes it with "
                f"option(\"epochColumns\", \"a,b\") (one integer column per coordinate), "
                f"not one epoch per micro-batch")
        if isinstance(msg, Data):
            event = msg.time is not None
            payload = msg.payload if not event else Tagged(msg.time, msg.rows, msg.payload)
            self.ledger.stage(self._staging_frontier(event), msg.epoch, msg.run, msg.attempt,
                              payload, msg.rows)
            return None
        if isinstance(msg, Flush):
            staged = self.ledger.flush(self._staging_frontier(msg.event), msg.epoch, msg.run,
                                       msg.attempt, msg.batches, msg.rows)
            if staged is None:  # the epoch is committed already
                return FlushAck(msg.req, 0, 0, stale=True)
            return FlushAck(msg.req, staged.batches, staged.rows)
        if isinstance(msg, Commit):
            if msg.event is None:
                return self._commit(msg)
            return (self.events.commit_product(msg) if self.product
                    else self.events.commit(msg))
        return AbortAck(msg.req, self.ledger.abort(msg.epoch))

    def _commit(self, msg: Commit) -> CommitAck:
        """Carry out the ledger's plan: publish the named attempts' batches, advance the
        Publisher past the epoch (completing it), tell ``on_published``."""
        plan = self.ledger.commit(self.next_epoch, msg.epoch, msg.attempts)
        if plan.duplicate:
            return CommitAck(msg.req, True, 0, 0, self.next_epoch)
        for payload in plan.payloads:
            self.publisher.send_encoded(plan.epoch, payload)
        self.pause_point((plan.epoch,), "data")
        self.advance(plan.next_epoch, plan.epoch)
        self.pause_point((plan.epoch,), "advanced")
        self.published(plan.epoch, plan.rows)
        return CommitAck(msg.req, False, plan.batches, plan.rows, self.next_epoch,
                         plan.empty_attempts)

    def advance(self, frontier: int, batch: int) -> None:
        """Advance the Publisher to ``frontier`` (completing every epoch below it) and, with an
        epoch log, wait until they are written."""
        self.publisher.advance_to(frontier)
        if self.logged and not self.publisher.flush(COMMIT_LOG_TIMEOUT):
            # never acknowledged before it is in the epoch log: a host killed after the ack
            # would otherwise restart without it while Spark goes on with the next batch
            raise EpochstreamError(f"batch {batch} was not written to the epoch log within "
                                   f"{COMMIT_LOG_TIMEOUT:g} s; the commit is not acknowledged")

    def published(self, epoch: int, rows: int) -> None:
        cb = self.host.on_published
        if cb is not None:
            try:
                cb(self.index, epoch, rows)
            except Exception:  # noqa: BLE001 - a callback must not kill the loop
                log.exception("on_published callback failed")

    def _reply(self, ident: bytes, reply: ingest.Reply) -> None:
        try:
            self._socket.send_multipart([ident, *ingest.encode_reply(reply)])
        except zmq.ZMQError as e:
            log.warning("partition %d: cannot reply to ingest peer: %s", self.index, e)

    def _refuse(self, ident: bytes, req: str | None, error: str) -> None:
        self.errors += 1
        log.warning("partition %d: refused ingest message: %s", self.index, error)
        self._reply(ident, Refusal(req, error))

    def _unauthorised(self, frame: zmq.Frame) -> str | None:
        """``None`` if the connection of ``frame`` may publish to the topic, else why not
        (decided once per principal and version of the grants)."""
        authz = self.host._authz
        assert authz is not None
        try:
            got = frame.get("User-Id")
        except (zmq.ZMQError, UnicodeDecodeError):
            got = None
        user = got if isinstance(got, str) and got else None
        if user is None:
            return authz.publish_refusal(None)
        seen = self._decided.get(user)
        if seen is None or seen[0] != authz.version:
            if len(self._decided) >= 4096:
                self._decided.clear()
            seen = self._decided[user] = (authz.version, authz.publish_refusal(user))
        return seen[1]

    def _refuse_unauthorised(self, ident: bytes, req: str | None, why: str) -> None:
        """Answer ``ERR`` (reason ``not_authorised``); logged once a minute per message text
        (a task may send thousands of DATA messages, each refused)."""
        self.errors += 1
        self.unauthorised += 1
        now = time.monotonic()
        if now - self._warned.get(why, -1e9) >= 60.0:
            if len(self._warned) > 1000:
                self._warned.clear()
            self._warned[why] = now
            log.warning("partition %d: refused ingest message: %s", self.index, why)
        self._reply(ident, Refusal(req, why, NOT_AUTHORISED))

    def pause_point(self, epochs, stage: str) -> None:
        """Stop at every pause point of this partition at ``stage`` of an epoch in ``epochs``
        (a container of epochs)."""
        for p in list(self.host._pauses):
            if p.partition == self.index and p.epoch in epochs and p.stage == stage:
                # the publisher's loop must have handled our calls before a subscriber's HELLO
                # is taken at this point: its snapshot then reflects exactly this state
                self.publisher.flush(10.0)
                p.reached.set()
                while not p._resume.wait(0.05):
                    if self.host._stop.is_set():
                        return
                self.host._pauses.remove(p)

