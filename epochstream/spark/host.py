"""The host of a Spark-fed topic, in the user's driver program: per topic partition a
:class:`~epochstream.transport.Publisher` and an ingest ROUTER, served by one thread.

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
from typing import Any, overload

import zmq

from ..catalog import Catalog
from ..errors import EpochstreamError
from ..order import TOTAL
from ..retention import Retention
from ..security import (NOT_AUTHORISED, Authorizer, Security, apply_server,
                        release_authenticator)
from ..transport import Publisher
from . import ingest
from .ingest import AbortAck, Commit, CommitAck, Data, Flush, FlushAck, IngestError, Refusal
from .staging import DEFAULT_MAX_STAGED_BYTES, StagingCounts, StagingLedger

__all__ = ["SparkPublisherHost", "PartitionStats", "Pause"]

log = logging.getLogger(__name__)

_STAGES = ("data", "advanced")

COMMIT_LOG_TIMEOUT = 30.0
"""Seconds a COMMIT waits for its epoch to be in the epoch log (with ``retention=``) before
it is refused instead of acknowledged."""


class Pause:
    """A pause point: the serving thread of ``partition`` stops at ``stage`` of COMMIT(``epoch``)
    until :meth:`resume`. Stages: ``"data"`` — the epoch's data has been published, the
    partition has not advanced yet (the epoch is *active*, in flight); ``"advanced"`` — the
    partition has advanced past the epoch, the COMMIT is not yet acknowledged (so Spark cannot
    start the next batch). ``reached`` is set when the thread stops there."""

    def __init__(self, partition: int, epoch: int, stage: str):
        if stage not in _STAGES:
            raise ValueError(f"stage must be 'data' or 'advanced', got {stage!r}")
        self.partition, self.epoch, self.stage = partition, epoch, stage
        self.reached = threading.Event()
        self._resume = threading.Event()

    def resume(self) -> None:
        self._resume.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the pause point is reached; returns whether it was."""
        return self.reached.wait(timeout)


@dataclass
class PartitionStats(StagingCounts):
    """A snapshot of one partition (:meth:`SparkPublisherHost.stats`): its ledger's counters
    (see :class:`~epochstream.spark.staging.StagingCounts`), its refused messages, and what its
    Publisher's frontiers say."""

    errors: int = 0           # malformed / refused ingest messages
    unauthorised: int = 0     # of those: refused for want of a publish grant (security=)
    next_epoch: int = 0       # the partition's frontier: every epoch below it is complete
    data_upper: int = -1      # largest epoch with published data (-1: none)


class _PartitionServer:
    """Serves one topic partition: its ingest ROUTER, ledger and Publisher, on one thread."""

    def __init__(self, host: SparkPublisherHost, index: int):
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
        self.thread = threading.Thread(target=self._run, name=f"epochstream-ingest-{index}",
                                       daemon=True)

    # ---- derived state

    @property
    def next_epoch(self) -> int:
        """The first epoch not yet complete: the Publisher's lower frontier (the one it had when
        the host closed it; 0 before it exists)."""
        if self.pub is None:
            return TOTAL.minimum
        lower = self.pub.lower or self._closed_frontier or (TOTAL.minimum,)
        return lower[0]

    @property
    def data_upper(self) -> int:
        """The largest epoch with published data (the Publisher's upper frontier; -1: none)."""
        upper = self.pub.upper if self.pub is not None else ()
        return upper[0] if upper else -1

    @property
    def _publisher(self) -> Publisher:
        assert self.pub is not None, "the serving loop runs once the Publisher exists"
        return self.pub

    @property
    def _logged(self) -> bool:
        """True iff the partition keeps an epoch log (the host has ``retention=``)."""
        return self.host.publisher_kwargs.get("retention") is not None

    @property
    def _socket(self) -> zmq.Socket:
        assert self.sock is not None, "the serving loop runs once the ingest socket exists"
        return self.sock

    def stats(self) -> PartitionStats:
        return PartitionStats(**dataclasses.asdict(self.ledger.counts), errors=self.errors,
                              unauthorised=self.unauthorised, next_epoch=self.next_epoch,
                              data_upper=self.data_upper)

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
        self.pub = Publisher(h.topic, self.index, order=TOTAL, codec="arrow",
                             endpoint=f"tcp://{h.bind_host}:*", catalog=h.catalog,
                             partitions=h.partitions, schema=h.schema, ingest=self.ingest,
                             **h.publisher_kwargs)
        self.endpoint = self.pub.endpoint

    def _end(self) -> None:
        """Close the Publisher (every published epoch completes) — or abort it (open epochs
        never complete: subscribers get PublisherAborted) when the host aborted or the loop
        died — and the ingest socket."""
        reason = self.host._abort_reason or (repr(self.error) if self.error is not None else None)
        try:
            if reason is None:
                self._closed_frontier = self._publisher.lower
                self._publisher.close()
            else:
                self._publisher.abort(reason)
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
        if isinstance(msg, Data):
            self.ledger.stage(self.next_epoch, msg.epoch, msg.run, msg.attempt, msg.payload,
                              msg.rows)
            return None
        if isinstance(msg, Flush):
            staged = self.ledger.flush(self.next_epoch, msg.epoch, msg.run, msg.attempt,
                                       msg.batches, msg.rows)
            if staged is None:  # the epoch is committed already
                return FlushAck(msg.req, 0, 0, stale=True)
            return FlushAck(msg.req, staged.batches, staged.rows)
        if isinstance(msg, Commit):
            return self._commit(msg)
        return AbortAck(msg.req, self.ledger.abort(msg.epoch))

    def _commit(self, msg: Commit) -> CommitAck:
        """Carry out the ledger's plan: publish the named attempts' batches, advance the
        Publisher past the epoch (completing it), tell ``on_published``."""
        plan = self.ledger.commit(self.next_epoch, msg.epoch, msg.attempts)
        if plan.duplicate:
            return CommitAck(msg.req, True, 0, 0, self.next_epoch)
        for payload in plan.payloads:
            self._publisher.send_encoded(plan.epoch, payload)
        self._pause_point(plan.epoch, "data")
        self._publisher.advance_to(plan.next_epoch)
        if self._logged and not self._publisher.flush(COMMIT_LOG_TIMEOUT):
            # never acknowledged before it is in the epoch log: a host killed after the ack
            # would otherwise restart without it while Spark goes on with the next batch
            raise EpochstreamError(f"epoch {plan.epoch} was not written to the epoch log within "
                                   f"{COMMIT_LOG_TIMEOUT:g} s; the commit is not acknowledged")
        self._pause_point(plan.epoch, "advanced")
        self._published(plan.epoch, plan.rows)
        return CommitAck(msg.req, False, plan.batches, plan.rows, self.next_epoch,
                         plan.empty_attempts)

    def _published(self, epoch: int, rows: int) -> None:
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

    def _pause_point(self, epoch: int, stage: str) -> None:
        for p in list(self.host._pauses):
            if p.partition == self.index and p.epoch == epoch and p.stage == stage:
                # the publisher's loop must have handled our calls before a subscriber's HELLO
                # is taken at this point: its snapshot then reflects exactly this state
                self._publisher.flush(10.0)
                p.reached.set()
                while not p._resume.wait(0.05):
                    if self.host._stop.is_set():
                        return
                self.host._pauses.remove(p)


class SparkPublisherHost:
    """Hosts the publishers of a Spark-fed topic in the driver program (context manager).

    - ``topic``; ``partitions``: topic partitions (Spark partition ``i`` feeds ``i % partitions``);
    - ``catalog``: a :class:`~epochstream.catalog.Catalog`, a path, or ``None`` (the default
      catalog); :attr:`catalog_path` is what to pass to the query's ``catalog`` option;
    - ``host``: interface the publisher and ingest sockets bind to (ports are chosen freely);
    - ``schema``: schema text stored in the catalog (e.g. a Spark DDL string);
    - ``on_published(partition, epoch, rows)``: called on a serving thread after a partition
      completed an epoch (keep it quick);
    - ``max_staged_bytes``: bound on the bytes staged per partition (batches received from
      tasks, not yet committed or discarded); a batch past it is refused;
    - ``publisher_kwargs``: extra keyword arguments for each ``Publisher``;
    - ``security``: ``None`` (plain TCP, the default) or
      ``Security.curve(server_secret=..., allow=...)`` (docs/security.md): the publishers and
      the ingest endpoints become CURVE servers with that key pair (registered in the catalog
      as each partition's ``server_key``; the sink's tasks connect with it and their
      ``clientKey``), clients are authenticated against ``allow`` (``None``: any key), a
      subscriber needs a ``subscribe`` grant on the topic and a task (or the driver-side
      commit) a ``publish`` grant, read from the catalog (re-read every second);
    - ``retention``: a :class:`~epochstream.retention.Retention` to keep each partition's epoch
      log (``None``: no history). Each committed epoch is then written, synced and indexed
      before it completes, and a restarted host resumes each partition from its log: its
      frontier (:meth:`next_epoch`) is the first epoch not yet committed, so a COMMIT of an
      epoch committed before the restart is recognised as a duplicate and publishes nothing
      (COMMIT idempotency survives a restart of the host, not only of the query).

    :meth:`start` creates the topic (order ``total``, codec ``arrow``) and, per partition, a
    Publisher and an ingest endpoint registered next to it in the catalog. :meth:`pause`
    installs a pause point (see :class:`Pause`) so that a subscriber can attach at a precise
    moment; :meth:`wait_epoch` waits until every partition completed an epoch."""

    def __init__(self, topic: str, *, partitions: int = 2, catalog: Any = None,
                 host: str = "127.0.0.1", schema: str | None = None,
                 on_published: Callable[[int, int, int], None] | None = None,
                 max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES,
                 publisher_kwargs: dict | None = None, retention: Retention | None = None,
                 security: Security | None = None):
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        publisher_kwargs = dict(publisher_kwargs or {})
        if "security" in publisher_kwargs:  # the publishers and the ingest path share one value
            if security is not None and publisher_kwargs["security"] != security:
                raise ValueError("give security= once: it secures the publishers and the "
                                 "ingest endpoints alike (not also in publisher_kwargs)")
            security = publisher_kwargs.pop("security")
        if security is not None and not isinstance(security, Security):
            raise TypeError(f"security must be a Security or None, got {type(security).__name__}")
        self.security = security if security is not None and security.enabled else None
        if self.security is not None and not self.security.is_server:
            raise ValueError("a SparkPublisherHost's security needs its key pair: "
                             "Security.curve(server_secret=..., allow=...)")
        self.topic = topic
        self.partitions = partitions
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.catalog_path = str(self.catalog.path)
        self.bind_host = host
        self.schema = schema
        self.on_published = on_published
        self.max_staged_bytes = max_staged_bytes
        self.publisher_kwargs = publisher_kwargs
        if retention is not None:
            self.publisher_kwargs["retention"] = retention
        if self.security is not None:
            self.publisher_kwargs["security"] = self.security
        self._authz: Authorizer | None = None  # publish grants (security=), made by start()
        self._zctx = zmq.Context()
        self._stop = threading.Event()
        self._pauses: list[Pause] = []
        self._servers = [_PartitionServer(self, i) for i in range(partitions)]
        self._started = self._closed = False
        self._abort_reason: str | None = None

    def start(self) -> SparkPublisherHost:
        """Create the topic and start serving every partition; returns ``self``. Raises
        :class:`IngestError` (after closing) if a partition cannot start, e.g. because a live
        publisher holds it; what the catalog raises creating the topic (after closing), e.g.
        :class:`~epochstream.errors.NotAuthorized` from a secured catalog service for a key
        without a ``publish`` grant."""
        if self._started:
            return self
        self._started = True
        try:
            self.catalog.create_topic(self.topic, order="total", codec="arrow",
                                      partitions=self.partitions, schema=self.schema)
        except BaseException:
            self.close()
            raise
        if self.security is not None:  # reads the grants now, then every second
            self._authz = Authorizer(self.topic, self.security, self.catalog)
            self._authz.start(lambda: not self._stop.is_set())
        for s in self._servers:
            s.thread.start()
        for s in self._servers:
            s.ready.wait(30)
            if s.error is not None or not s.ready.is_set():
                self.close()
                raise IngestError(f"partition {s.index} of topic {self.topic!r} failed to start: "
                                  f"{s.error!r}") from s.error
        return self

    def __enter__(self) -> SparkPublisherHost:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Normal exit: :meth:`close`; an exception (``KeyboardInterrupt`` too): :meth:`abort`."""
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")

    def abort(self, reason: str = "aborted") -> None:
        """Stop serving and abort every publisher (see
        :meth:`~epochstream.transport.Publisher.abort`): epochs not completed yet never
        complete, subscribers raise :class:`~epochstream.errors.PublisherAborted`, the catalog
        marks the partitions ``aborted``. Idempotent; after :meth:`close` it does nothing."""
        if not self._closed:
            self._abort_reason = str(reason)
        self.close()

    def close(self) -> None:
        """Stop serving, close every publisher (every epoch published so far completes and
        subscribers see the stream end). A partition whose ingest loop failed is aborted
        instead."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for p in self._pauses:
            p.resume()
        for s in self._servers:
            if s.thread.is_alive():
                s.thread.join(30)
        release_authenticator(self._zctx)  # its sockets live in our context
        self._zctx.term()

    # ---- introspection

    @property
    def endpoints(self) -> list[str | None]:
        """Each partition's publisher endpoint (``None`` until started)."""
        return [s.endpoint for s in self._servers]

    @property
    def ingest_endpoints(self) -> list[str | None]:
        """Each partition's ingest endpoint (``None`` until started)."""
        return [s.ingest for s in self._servers]

    @overload
    def stats(self, partition: None = None) -> list[PartitionStats]: ...

    @overload
    def stats(self, partition: int) -> PartitionStats: ...

    def stats(self, partition: int | None = None) -> PartitionStats | list[PartitionStats]:
        """:class:`PartitionStats` of one partition, or a list for all."""
        if partition is not None:
            return self._servers[partition].stats()
        return [s.stats() for s in self._servers]

    def next_epoch(self) -> int:
        """The smallest partition frontier: every epoch below it is complete everywhere."""
        return min(s.next_epoch for s in self._servers)

    def data_upper(self) -> int:
        """The largest epoch any partition has published data of (``-1``: none)."""
        return max(s.data_upper for s in self._servers)

    def staged_bytes(self, partition: int | None = None) -> int:
        """Bytes staged (received from tasks, neither published nor discarded yet) on one
        partition, or summed over all: what a batch in flight, or the last batch of a killed
        driver, holds in this process (bounded by ``max_staged_bytes`` per partition)."""
        if partition is not None:
            return self._servers[partition].ledger.staged_bytes
        return sum(s.ledger.staged_bytes for s in self._servers)

    def subscribers(self) -> int:
        """Subscribers connected now (the largest count over the partitions' publishers)."""
        return max((s.pub.subscribers for s in self._servers if s.pub is not None), default=0)

    def errors(self) -> list[BaseException]:
        """The exceptions that ended partitions' serving loops (or their start)."""
        return [s.error for s in self._servers if s.error is not None]

    def pause(self, partition: int, epoch: int, stage: str = "data") -> Pause:
        """Install a pause point (see :class:`Pause`); resume it with ``Pause.resume()``."""
        p = Pause(partition, epoch, stage)
        self._pauses.append(p)
        return p

    def wait_epoch(self, epoch: int, timeout: float | None = None) -> bool:
        """Wait until every partition has completed ``epoch``; returns whether it did
        (``False`` after ``timeout`` seconds or once the host stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.next_epoch() <= epoch:
            if self._stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.01)
        return True
