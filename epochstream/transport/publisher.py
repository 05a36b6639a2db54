"""The publisher of one partition (Strymon "Publisher Logic") over a ZeroMQ ROUTER.

The calling thread validates each call against its own
:class:`~epochstream.protocol.PublisherProtocol` (errors are raised right there, nothing is sent)
and hands encoded frames through a :class:`~epochstream.transport.handoff.Handoff` to the loop
(:mod:`~epochstream.transport.loop`; driven by the process's shared reactor or a thread of its
own: :mod:`~epochstream.transport.reactor`), which owns the ROUTER. The partition's standing
in the catalog is a composed :class:`~epochstream.transport.registration.Registration`.
"""

from __future__ import annotations

import logging
import os
import threading
import time as _time

import zmq

from .. import wire
from ..zmq_context import default_context
from ..catalog import Catalog
from ..errors import CatalogError, Fenced, HistoryWriteError, ProtocolError
from ..events import LowerFrontierUpdate
from ..frontier import Antichain
from ..order import TOTAL, dual
from ..partitioning import check_records
from ..retention import Retention
from ..security import Authorizer, Security, checked
from .fanout import Fanout
from .handoff import Handoff
from .loop import ABORT, DATA, FRONTIER, STOP, SYNC, UPPER, PublisherLoop
from .sockets import advertised_endpoint, bind_router
from .publisher_start import history_dir, inherited_upper, start_protocol, topic_definition
from .reactor import driver, loop_mode
from .registration import Registration

__all__ = ["Publisher", "inherited_upper", "history_dir", "advertised_endpoint"]

log = logging.getLogger("epochstream.transport")


class Publisher:
    """One partition of a topic (Strymon "Publisher Logic").

    Parameters
    ----------
    topic, partition:
        the topic name and this partition's index (``0 <= partition < partitions``).
    order:
        the topic's time order (:data:`~epochstream.order.TOTAL`, ``product(n)``, or a name).
    codec:
        payload codec name, ``"msgpack"`` or ``"arrow"`` (see :mod:`epochstream.wire`).
    endpoint:
        where to bind, ``"tcp://127.0.0.1:*"`` (a free port), ``"tcp://0.0.0.0:7000"``: see :attr:`endpoint`.
    advertise:
        the address registered in the catalog for subscribers (Kafka's
        ``advertised.listeners``): a host name or IP (the bound port kept) or a whole endpoint
        ``"tcp://host:port"``; default the bound address (a wildcard bind advertises
        ``socket.gethostname()``). :attr:`advertised` gives it.
    catalog:
        a :class:`~epochstream.catalog.Catalog`, a path, a network catalog's URL or ``None``:
        the topic is created and this partition registered there (with ``ingest``), the upper
        frontier recorded before data at a new maximal time is sent, the end marked.
    heartbeat_interval:
        seconds of idleness after which a heartbeat (with the lower frontier) is broadcast; also
        the ZMTP heartbeat and probing interval.
    sndhwm, max_queue_messages, max_queue_bytes, queue_hwm:
        per-subscriber ZeroMQ send high-water mark (messages); the bound on a subscriber's
        backlog beyond it (past it: evicted with a ``lagged`` notice, or, flow-controlled, the
        producer is held back); how many calls the caller may be ahead of the loop.
    start, upper:
        the initial capability (default ``order.minimum``; ``None``: a fresh stream; a list of
        times: an antichain, with ``upper``). A publisher starting past the minimum inherits
        the upper frontier the catalog recorded for the partition (without one: ``start - 1``
        for a total order, :class:`ProtocolError` otherwise); ``upper`` names it instead (a
        relay), not with ``retention``. The decisions: :mod:`epochstream.start`.
    strict:
        timely's capability rules (:class:`~epochstream.protocol.PublisherProtocol`).
    coalesce_bytes:
        batching without linger (Kafka's ``linger.ms=0``): data calls for one time already
        queued go as one message of up to this many payload bytes (msgpack; payloads of 4 KiB
        or more go as they are); 0 disables it.
    credit_timeout:
        seconds a flow-controlled subscriber may hold the producer back without granting
        credit before it is evicted (default 30 s, as NATS JetStream's ``ack_wait``).
    retention:
        a :class:`~epochstream.retention.Retention` to keep this partition's epoch log
        (docs/history.md; needs a ``catalog``), or ``None``: an epoch is logged and indexed
        before the update completing it is sent; an unfinished log is resumed, a finished one
        continued. A log that cannot be written aborts the publisher
        (:class:`~epochstream.errors.HistoryWriteError` from the next call).
    key, partitioning:
        the topic's key for subscribers' ``keys=`` filters (docs/filters.md): a column name or
        a function ``record -> key`` (msgpack); ``partitioning="hash"`` makes the topic
        key-partitioned (each record must belong to this partition:
        :func:`~epochstream.partitioning.partition_of`, else ``send`` raises
        ``PartitioningError``; ``send_encoded`` payloads are not checked).
    max_filter_classes, wire_version:
        the bound on distinct filter schedules this partition encodes for (a subscriber beyond
        it is sent everything and filters itself; default 32); the newest data-message version
        served (2; 1: every subscriber gets version 1 — docs/protocol.md §2.2).
    security:
        ``None`` (plain TCP) or ``Security.curve(server_secret=..., allow=...)``
        (docs/security.md): a CURVE server (its public key :attr:`server_key`, registered in the
        catalog), clients checked against ``allow`` and, with a catalog, their ``subscribe``
        grants (re-read every second; a revoked subscriber is dropped).
    loop:
        its driver (:mod:`~epochstream.transport.reactor`): ``"shared"``, the process's one
        reactor thread; ``"own"``, a thread of its own; ``None``: ``"shared"`` unless it has
        ``retention`` or a ``catalog`` (loops that block on I/O). ``ValueError``: another
        value, or ``"shared"`` with ``retention``.

    Flow control (docs/protocol.md): a subscriber with credit is sent at most what it granted;
    once its backlog is full, :meth:`send` blocks (back-pressure) for up to ``credit_timeout``
    seconds. A dead peer is freed within about ``3 * heartbeat_interval``. Ending:
    :meth:`close` (leaving a ``with`` block normally) or :meth:`abort` (an exception).

    Raises :class:`~epochstream.errors.ProtocolError` from :meth:`send`, :meth:`progress` and
    :meth:`advance_to` for invalid input (state unchanged, nothing sent), and from any call once
    the publisher is closed or its loop died; ``zmq.ZMQError`` if the endpoint cannot be bound;
    :class:`~epochstream.errors.PartitionHeld` if a live publisher holds the partition.
    """

    def __init__(self, topic: str, partition: int = 0, *, order=TOTAL, codec: str = "msgpack",
                 endpoint: str = "tcp://127.0.0.1:*", catalog: Catalog | str | None = None,
                 partitions: int = 1, schema: str | None = None, ingest: str | None = None,
                 heartbeat_interval: float = 1.0, sndhwm: int = 1000,
                 max_queue_messages: int = 100_000, max_queue_bytes: int = 256 << 20,
                 queue_hwm: int = 1000, start=None, strict: bool = True,
                 coalesce_bytes: int = 64 << 10, credit_timeout: float = 30.0,
                 retention: Retention | None = None, context: zmq.Context | None = None,
                 advertise: str | None = None, key=None, max_filter_classes: int = 32,
                 upper: list | None = None, security: Security | None = None,
                 partitioning: str | None = None, publisher_gate=None, wire_version: int = 2,
                 loop: str | None = None):
        self.topic, self.partition, self.partitions, self.key = topic, partition, partitions, key
        self.order, self.codec, self.partition_key = topic_definition(
            partition, partitions, order, codec, key, partitioning)
        mode = loop_mode(loop, log_kept=retention is not None, catalog=catalog is not None)
        self.heartbeat_interval = float(heartbeat_interval)
        self.coalesce_bytes = int(coalesce_bytes) if self.codec.name == "msgpack" else 0
        self.max_filter_classes, self.wire_version = int(max_filter_classes), int(wire_version)
        self.gate = publisher_gate  # a Relay: downstream filters travel upstream (internal)
        import uuid  # here: ~1.5 ms (uuid, platform) not paid by `import epochstream`

        self.incarnation = uuid.uuid4().hex
        if isinstance(catalog, (str, os.PathLike)):  # a path, or a network catalog's URL
            catalog = Catalog(catalog)
        self._catalog = catalog
        # registered, the upper frontier recorded, the lease kept (transport/registration.py)
        self._reg = Registration(catalog, topic, partition, self.incarnation)
        self._upper = self._reg.upper  # (what the loop records before data beyond it leaves)
        self.security = checked(security, "server")
        #: this publisher's CURVE public key (Z85), registered in the catalog; None: plain TCP
        self.server_key: str | None = (None if self.security is None
                                       else self.security.server_public)
        self._authz = None if self.security is None else Authorizer(topic, self.security, catalog)
        self.retention = retention
        # where it starts, from what its predecessors left (transport/publisher_start.py)
        self._protocol, self._log, self._resumed_at = start_protocol(
            catalog, retention, topic, partition, self.order, start, upper, strict,
            self.incarnation, lambda: self._create_topic(schema))
        self._last_time, self._last_header = object(), b""  # header of the last data time
        self._lock = threading.Lock()
        self._closed = False
        self._aborted: str | None = None  # the reason, once abort() ran
        self._closer: threading.Thread | None = None
        self._start_loop(context, endpoint, advertise, sndhwm, queue_hwm, max_queue_messages,
                         max_queue_bytes, credit_timeout, mode)
        self._register(schema, ingest)
        self._driver.start()
        self._reg.keep_lease(self._on_fenced)
        if self._authz is not None:  # re-reads the grants while the loop runs
            self._authz.start(self._driver.is_alive)

    def _start_loop(self, context, endpoint: str, advertise, sndhwm: int, queue_hwm: int,
                    max_queue_messages: int, max_queue_bytes: int, credit_timeout,
                    mode: str) -> None:
        """Bind the ROUTER, build the loop and its driver (started after registering)."""
        self._driver = driver(mode, f"epochstream-pub-{self.topic}-{self.partition}")
        self._ctx = context or default_context()
        self._router = bind_router(self._ctx, endpoint, sndhwm=sndhwm,
                                   heartbeat_interval=self.heartbeat_interval,
                                   security=self.security)
        self.endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.advertised: str = advertised_endpoint(self.endpoint, advertise)
        self._handoff = Handoff(self._ctx, queue_hwm, self._driver.is_alive, self._driver.wake)
        self._fanout = Fanout(f"{self.topic!r} partition {self.partition}", self.partition,
                              max_messages=max_queue_messages, max_bytes=max_queue_bytes,
                              credit_timeout=credit_timeout)
        self.stats = self._fanout.stats
        self._loop = PublisherLoop(self, self._router, self._handoff, self._fanout,
                                   self._protocol.lower, self._protocol.upper, lambda: self._closed,
                                   ctx=self._ctx, recorder=self._upper, log=self._log,
                                   authz=self._authz)
        self._driver.bind(self._loop, self._router)

    def _register(self, schema: str | None, ingest: str | None) -> None:
        try:
            self.incarnation = self._reg.register(
                lambda: self._create_topic(schema), self.advertised, ingest=ingest,
                upper=list(self._protocol.upper), server_key=self.server_key)
        except BaseException:
            self._close_sockets()
            raise

    def _create_topic(self, schema: str | None) -> None:
        key = {} if self.partition_key is None else {"partition_key": self.partition_key}
        self._catalog.create_topic(self.topic, order=self.order, codec=self.codec.name,
                                   partitions=self.partitions, schema=schema, **key)

    # -- queries ---------------------------------------------------------------------------
    max_queue_messages = property(lambda self: self._fanout.max_messages,
                                  doc="Backlog bound per subscriber, messages.")
    max_queue_bytes = property(lambda self: self._fanout.max_bytes,
                               doc="Backlog bound per subscriber, bytes.")
    credit_timeout = property(lambda self: self._fanout.credit_timeout, doc="Seconds a flow-"
                              "controlled subscriber may hold the producer back without a grant.")
    queue_hwm = property(lambda self: self._handoff.hwm,
                         doc="Calls the caller may be ahead of the loop before calls block.")
    closed = property(lambda self: self._closed, doc="True once closed or aborted.")

    @property
    def would_block(self) -> bool:
        """True while a call (``send``, ...) would block: the loop is :attr:`queue_hwm` calls
        behind (flow control holds it back). What an event loop polls before a call (``aio``)."""
        handoff = self._handoff
        return len(handoff.commands) >= handoff.hwm and self._driver.is_alive()

    @property
    def lower(self) -> tuple:
        """The lower frontier's elements (capabilities held), as of the calls made so far."""
        return self._protocol.lower

    @property
    def upper(self) -> tuple:
        """The upper frontier's elements (maximal times sent so far)."""
        return self._protocol.upper

    @property
    def capabilities(self) -> dict:
        """``{time: count}`` of the capabilities held, as of the calls made so far (a copy)."""
        return self._protocol.capabilities()

    @property
    def subscribers(self) -> int:
        """Number of subscribers currently registered (approximate: read from another thread)."""
        return self._fanout.registered()

    def queued(self) -> tuple[int, int, int]:
        """``(messages, bytes, stalled subscribers)`` in the subscribers' backlogs now (read from
        another thread: approximate)."""
        return self._fanout.queued()

    # -- calls -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        upper, loop, keeper = self._upper, self._loop, self._reg.keeper
        if ((upper is None or upper.error is None) and loop.log_error is None
                and loop.error is None and not self._closed
                and (keeper is None or keeper.valid())):
            return  # every call takes this path: the checks below only when one failed
        self._refuse_call()

    def _refuse_call(self) -> None:  # why no call is taken any more (aborting first if new)
        refused = self._reg.refused
        if refused is not None:  # the loop could not record the upper frontier: nothing sent
            self._upper_refused(refused)
        failed = self._loop.log_error
        if failed is not None:  # the loop could not log: it told subscribers (X aborted)
            if not self._closed:
                self._end_locked(f"the epoch log failed: {failed}", 10.0)
            raise HistoryWriteError(f"publisher {self.topic}/{self.partition}: {failed}; it "
                                    f"aborted: no epoch it could not log completes (restart it "
                                    f"to resume from the last logged frontier)") from failed
        if self._loop.error is not None:
            raise ProtocolError(f"publisher {self.topic}/{self.partition}: its loop died "
                                f"({self._loop.error!r}); nothing more can be sent")
        lapsed = None if self._closed else self._reg.lease_lapsed()
        if lapsed is not None:
            self._reg.fenced = True  # stopped past its lease: a successor may hold it
            self._end_locked(lapsed, 0.0)
        if self._closed:
            state = f"aborted ({self._aborted})" if self._aborted is not None else "closed"
            if self._reg.fenced:
                raise Fenced(f"publisher {self.topic}/{self.partition} is {state}",
                             topic=self.topic, partition=self.partition,
                             incarnation=self.incarnation)
            raise ProtocolError(f"publisher {self.topic}/{self.partition} is {state}")

    def _upper_refused(self, refused: CatalogError) -> None:
        """Abort (once) and raise after the catalog refused an upper frontier write."""
        if isinstance(refused, Fenced):
            self._reg.fenced = True  # the row is the successor's: never touched again
        if not self._closed:
            self._end_locked(f"the catalog refused its upper frontier: {refused}", 0.0)
        raise self._reg.refusal(f"publisher {self.topic}/{self.partition}", refused) from refused

    def send(self, time, records) -> None:
        """Publish ``records`` at ``time``: encoded with the topic's codec (a list or tuple of
        records for msgpack; a ``pyarrow.RecordBatch``/``Table`` or list of dicts for arrow). Raises :class:`ProtocolError` if ``time`` has the wrong shape or no capability ``<= time``
        is held; :class:`WireError` if the records are not a sequence of records or the codec
        cannot encode them; :class:`~epochstream.partitioning.PartitioningError` on a
        key-partitioned topic for a record whose key belongs to another partition. Nothing is
        sent and no state changes when it raises."""
        if self.partition_key is not None:
            check_records(records, self.partition_key, self.partition, self.partitions)
        self.send_encoded(time, self.codec.encode(records))

    def send_encoded(self, time, payload) -> None:
        """Publish an already-encoded payload (bytes-like: :func:`~epochstream.wire.as_payload`;
        in the topic's codec; ``TypeError`` otherwise, nothing sent) at ``time``. A time that grows the upper
        frontier is recorded in the catalog before data at it is sent (transport/upper.py); a
        refusal (:class:`~epochstream.errors.Fenced`, or unreachable) aborts: the next call raises."""
        if type(payload) is not bytes:  # (what codecs return: one check on the hot path)
            payload = wire.as_payload(payload)
        with self._lock:
            self._check_open()
            protocol = self._protocol
            try:
                t = protocol.check_data(time)
            except ProtocolError as e:
                if self._resumed_at is None:
                    raise
                raise ProtocolError(f"{e}; this publisher resumed its epoch log at "
                                    f"{list(self._resumed_at)!r} (earlier epochs are complete "
                                    f"in the log: see Publisher.lower)") from None
            request = None
            if t != self._last_time or type(t) is not type(self._last_time):
                header = wire.encode_time(t)  # may raise: before any state changes
                if self._upper is not None and protocol.extends_upper(t):
                    upper = Antichain(dual(self.order), protocol.upper)
                    upper.insert(t)  # recorded by the loop before this data is sent
                    request = self._upper.request(list(upper.elements))
                self._last_time, self._last_header = t, header
            protocol.accept(t)
            frames = [wire.DATA, self._last_header, payload]
            self._enqueue((DATA, t, frames) if request is None else (UPPER, (t, request), frames))

    def progress(self, updates) -> LowerFrontierUpdate | None:
        """Apply timely progress updates ``[(time, delta), ...]`` to the lower frontier and
        broadcast its net change. Returns the change, or ``None`` when the frontier did not move.
        Raises :class:`ProtocolError` for malformed updates, releasing a capability not held or
        minting one not ``>=`` a held one (nothing applied, see ``strict``)."""
        with self._lock:
            self._check_open()
            msg = self._protocol.progress(updates)
            if msg is not None:
                self._send_frontier(msg)
            return msg

    def advance_to(self, time) -> LowerFrontierUpdate | None:
        """Downgrade the held capabilities to ``time`` (timely ``InputHandle::advance_to``):
        every epoch ``< time`` may complete. The capability starts at ``start`` (default
        ``order.minimum``). Raises :class:`ProtocolError` (state unchanged) if some held
        capability is not ``<= time``."""
        with self._lock:
            self._check_open()
            msg = self._protocol.advance_to(time)
            if msg is not None:
                self._send_frontier(msg)
            return msg

    def _send_frontier(self, msg: LowerFrontierUpdate, final: bool = False) -> None:
        """Log (with retention: write, sync, index the epochs it completes) then send a lower
        frontier change (caller holds ``self._lock``)."""
        frames = wire.encode_frontier(msg)
        command = (FRONTIER, msg, frames)
        if final:
            self._handoff.put_final(command)
        else:
            self._enqueue(command)

    def _enqueue(self, command: tuple) -> None:
        """Hand a command to the loop (caller holds ``self._lock``); raises if the loop died."""
        if not self._handoff.put(command):
            self._loop.error = self._loop.error or RuntimeError("publisher loop ended")
            self._check_open()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until the loop has handled every call made before (not until subscribers read
        it; with retention: until it is logged). Returns False on timeout (seconds). Raises
        :class:`~epochstream.errors.HistoryWriteError` if the log failed meanwhile."""
        ev = threading.Event()
        with self._lock:
            if not self._driver.is_alive() or self._closed:
                return True if not self._closed else self.join(timeout)
            self._enqueue((SYNC, ev, None))
        done = ev.wait(timeout)
        if self._loop.log_error is not None or self._reg.refused is not None:
            with self._lock:
                self._check_open()
        return done

    # -- ending ----------------------------------------------------------------------------
    def close(self, linger: float = 10.0, wait: bool = False) -> None:
        """Release every capability (every open epoch completes, subscribers finish) and mark
        the partition closed in the catalog with its final upper frontier. Returns at once; the
        loop delivers until every subscriber acknowledged the end (``bye``) or is gone, for up
        to ``linger`` seconds, in a non-daemon thread (as ``zmq_ctx_term`` with
        ``ZMQ_LINGER``); ``wait=True`` (or :meth:`join`) blocks until then. A subscriber that
        did not read to the end within ``linger`` reports
        :class:`~epochstream.errors.PublisherLost`. Idempotent; after :meth:`abort`, nothing."""
        self._end(None, linger, wait)

    def abort(self, reason: str = "aborted", linger: float = 10.0, wait: bool = False) -> None:
        """End abnormally: keep every capability (open epochs never complete), send every
        subscriber ``X aborted`` (:class:`~epochstream.errors.PublisherAborted`, or a re-join
        with ``recover=True``), mark the partition ``aborted``; what was queued before is
        delivered first. ``linger``, ``wait``: as :meth:`close`. Idempotent."""
        self._end(str(reason), linger, wait)

    def _end(self, abort_reason: str | None, linger: float, wait: bool) -> None:
        with self._lock:
            if self._closed:
                if wait:
                    self.join(linger + 5.0)
                return
            self._end_locked(abort_reason, linger)
        if wait:
            self.join(linger + 5.0)

    def _end_locked(self, abort_reason: str | None, linger: float) -> None:
        """Close or abort (caller holds ``self._lock``; the publisher is still open)."""
        self._closed = True
        if abort_reason is None:
            msg = self._protocol.close()
            if msg is not None:
                self._send_frontier(msg, final=True)
            if self._log is not None:  # the final commit decides: closed, or aborted
                done = threading.Event()
                self._handoff.put_final((SYNC, done, None))
                done.wait(30.0)
                failed = self._loop.log_error
                if failed is not None or not done.is_set():
                    abort_reason = (f"the epoch log failed at close: {failed}" if failed
                                    else "the epoch log did not commit within 30 s at close")
        if abort_reason is not None:
            self._aborted = abort_reason
            if self._log is not None and self._log.tails is not None:
                self._log.tails.stop()  # (upload="frontier": a commit waiting for the store)
            log.warning("publisher %s/%s aborted: %s", self.topic, self.partition, abort_reason)
            self._handoff.put_final((ABORT, abort_reason, None))
            if self._log is not None and self._driver.is_alive():
                # until the loop closed the log: a successor may recover it once aborted
                quiet = threading.Event()
                self._handoff.put_final((SYNC, quiet, None))
                quiet.wait(30.0)
        self._reg.mark_ended(list(self._protocol.upper), aborted=abort_reason is not None)
        self._handoff.put_final((STOP, float(linger), None))
        # not a daemon, whichever thread closes (a thread inherits its starter's flag, and a
        # relay closes from its daemon thread): the rest of the stream is delivered (up to
        # ``linger``) even when the process's main thread returns meanwhile
        self._closer = threading.Thread(target=self._finish_close, args=(float(linger),),
                                        name=f"epochstream-close-{self.topic}-{self.partition}",
                                        daemon=False)
        self._closer.start()

    def _on_fenced(self, reason: str) -> None:
        """The lease keeper found this incarnation superseded: abort at once, leaving the
        partition's catalog row (the successor's) alone."""
        self._reg.fenced = True
        self.abort(f"fenced: {reason}", linger=0.0)

    def _finish_close(self, linger: float) -> None:
        t0 = _time.monotonic()
        self._driver.join(linger + 5.0)
        if self._log is not None and not self._driver.is_alive():
            self._log.close(uploads=True)  # (with a store: its uploads finish first)
        self._close_sockets(max(0.0, linger - (_time.monotonic() - t0)))

    def join(self, timeout: float | None = None) -> bool:
        """Wait until a :meth:`close` finished delivering (see there); True if it did, False on
        timeout (seconds) or if the publisher was not closed."""
        if self._closer is None:
            return False
        self._closer.join(timeout)
        return not self._closer.is_alive()

    def _close_sockets(self, linger: float = 0.0) -> None:
        handoff = getattr(self, "_handoff", None)
        if handoff is not None:
            handoff.close()
        self._router.close(int(linger * 1000))

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Normal exit: :meth:`close`. An exception (``KeyboardInterrupt`` included):
        :meth:`abort` with the exception's repr — a half-written epoch is never completed."""
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")

    def __repr__(self) -> str:
        return (f"Publisher({self.topic!r}, partition={self.partition}, endpoint={self.endpoint!r}, "
                f"lower={list(self.lower)!r}, upper={list(self.upper)!r})")

