"""The publisher of one partition (Strymon "Publisher Logic") over a ZeroMQ ROUTER.

Two threads. The calling thread validates each call against its own
:class:`~epochstream.protocol.PublisherProtocol` (errors are raised right there, nothing is sent)
and hands encoded frames to the loop through a :class:`~epochstream.transport.handoff.Handoff`.
The loop thread owns the ROUTER: it is the only place where subscribers are registered and
messages are sent, so a new subscriber's snapshot is taken and the subscriber registered in one
step — every later message reaches it, no earlier one does (Strymon's "new subscriber connects").
Who gets what is decided by the pure :class:`~epochstream.transport.fanout.Fanout` policy.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time as _time
import uuid

import zmq

from .. import wire
from ..catalog import Catalog
from ..epochlog import LogWriter
from ..errors import (CatalogError, CatalogUnavailable, Fenced,
                      HistoryWriteError, ProtocolError)
from ..events import LowerFrontierUpdate
from ..frontier import Antichain
from ..order import TOTAL, by_name, dual
from ..partitioning import HASH, PARTITIONINGS, check_records
from ..protocol import PublisherProtocol
from ..retention import Retention
from ..security import Authorizer, Security
from .fanout import Fanout
from .handoff import Handoff
from .lease_keeper import RENEW_S, LeaseKeeper
from .loop import ABORT, DATA, FRONTIER, STOP, SYNC, UPPER, PublisherLoop
from .sockets import bind_router
from .publisher_start import history_dir, inherited_upper, open_log, start_frontiers
from .upper import UpperRecorder

__all__ = ["Publisher", "inherited_upper", "history_dir", "advertised_endpoint"]

log = logging.getLogger("epochstream.transport")



def advertised_endpoint(bound: str, advertise: str | None = None) -> str:
    """The endpoint to register in the catalog for a ROUTER bound at ``bound`` (its
    ``LAST_ENDPOINT``): ``advertise`` if it is a whole endpoint (``"tcp://host:port"``; a
    missing or ``*`` port is the bound one), ``bound`` with its host replaced by ``advertise``
    (a host name or IP), or, without ``advertise``, ``bound`` itself — with
    ``socket.gethostname()`` for a wildcard host (``0.0.0.0``, ``*``, ``::``)."""
    scheme, _, rest = bound.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" and (advertise is None or "://" not in advertise):
        return bound
    if advertise is None:
        if host.strip("[]") not in ("0.0.0.0", "*", "::", ""):
            return bound
        advertise = socket.gethostname()
    if "://" in advertise:
        a_scheme, _, a_rest = advertise.partition("://")
        a_host, sep, a_port = a_rest.rpartition(":")
        if not sep or not a_port.isdigit() and a_port != "*" or "]" in a_port:
            a_host, a_port = a_rest, "*"
        return f"{a_scheme}://{a_host}:{port if a_port == '*' else a_port}"
    if ":" in advertise and not advertise.startswith("["):  # a bare IPv6 address
        advertise = f"[{advertise}]"
    return f"{scheme}://{advertise}:{port}"


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
        where to bind, e.g. ``"tcp://127.0.0.1:*"`` (a free port) or ``"tcp://0.0.0.0:7000"``;
        :attr:`endpoint` gives the bound address.
    advertise:
        the address registered in the catalog, for subscribers to connect to (Kafka's
        ``advertised.listeners``): a host name or IP (the bound port is kept) or a whole
        endpoint ``"tcp://host:port"``. Default: the bound address, except that a wildcard
        bind (``0.0.0.0``, ``*``, ``[::]``) advertises this machine's ``socket.gethostname()``.
        :attr:`advertised` gives it.
    catalog:
        a :class:`~epochstream.catalog.Catalog`, a path or a network catalog's URL
        ``"tcp://host:port"`` (or ``None``): the topic is created there if
        needed and this partition registered (``ingest`` is recorded with it); the upper
        frontier is recorded there before data at a new maximal time is sent; :meth:`close`
        marks it closed (:meth:`abort`: aborted) with the final upper frontier.
    heartbeat_interval:
        seconds of idleness after which a heartbeat (with the lower frontier) is broadcast; also
        the ZMTP heartbeat interval and the probing interval.
    sndhwm:
        per-subscriber ZeroMQ send high-water mark (messages).
    max_queue_messages, max_queue_bytes:
        bound on a subscriber's backlog beyond its ZeroMQ pipe; past it the subscriber is
        evicted with a ``lagged`` notice (a flow-controlled one holds the producer back instead).
    queue_hwm:
        how many calls the caller may be ahead of the loop before calls block.
    start:
        the initial capability (default ``order.minimum``): a restarted publisher resumes at the
        first epoch it has not completed. A publisher that starts past the minimum skips times
        its predecessor may have begun, so it must announce their upper frontier: it inherits
        the upper frontier the catalog recorded for this partition (every earlier incarnation
        recorded its own before sending data at a new maximal time). Without a recorded one, a
        total order uses ``start - 1``; any other order raises :class:`ProtocolError` (nothing
        could tell subscribers which epochs were begun). ``start=None`` starts a fresh stream.
        A list of times is an antichain of initial capabilities (needs ``upper``).
    upper:
        the upper frontier to announce from the start (a list of times: epochs some data was
        sent for already, which a new subscriber must drop), instead of the one inherited from
        the catalog — what a :class:`~epochstream.transport.relay.Relay` announces for the
        epochs its own upstream join began in the middle of. Not with ``retention``.
    strict:
        timely's capability rules for a single upstream (see
        :class:`~epochstream.protocol.PublisherProtocol`): never release a capability not held,
        never mint one that is not ``>=`` a held one.
    coalesce_bytes:
        batching without linger (Kafka's producer batching with ``linger.ms=0``): when the loop
        finds several data calls for the same time already queued, it sends them as one message
        of up to this many payload bytes (msgpack only: the arrays are concatenated without
        decoding; payloads of 4 KiB or more are sent as they are, since merging big arrays costs
        the subscriber garbage collections). Nothing waits for a batch to fill; 0 disables it.
    credit_timeout:
        seconds a flow-controlled subscriber may grant no credit while it holds the producer
        back (its backlog full) before it is evicted with a ``lagged`` notice (default 30 s, as
        NATS JetStream's default ``ack_wait``), so one hung consumer cannot stop a topic.
    retention:
        a :class:`~epochstream.retention.Retention` to keep this partition's epoch log (durable
        history: late joiners with ``Subscriber(start=...)``, durable subscriptions, restarts
        that remember; docs/history.md), or ``None`` (the default: no history). Needs a
        ``catalog`` (the log's index lives there). The loop thread appends each data message
        to the log; a frontier advance that completes epochs is written, synced
        (``Retention.fsync``) and indexed *before* it is sent (the frontier changes queued
        together share one commit: a group commit), so a subscriber never sees an epoch
        complete that the log does not hold; :meth:`flush` returns once everything before it
        is logged. A publisher started on a partition whose log is unfinished (its
        predecessor crashed, was killed or aborted) resumes from it: without ``start`` its
        capabilities are the logged lower frontier (see :attr:`lower`), with ``start`` that
        must be at or beyond it; the upper frontier is recovered too. On a partition whose
        logged stream finished (closed) the log continues with later epochs: without ``start``
        a total order resumes after the logged upper frontier (``pub.lower`` says where); other
        orders need ``start`` (not at or below the logged upper frontier). If the log cannot be
        written the publisher aborts (subscribers get
        :class:`~epochstream.errors.PublisherAborted`) and its next call raises
        :class:`~epochstream.errors.HistoryWriteError`: it never completes an epoch it could
        not log.
    key:
        the topic's key, for subscribers' ``keys=`` filters (docs/filters.md): a column name
        (dict records or Arrow; sent to subscribers in the snapshot so they re-check it), or a
        function ``record -> key`` (msgpack records; such filters are always applied here).
        ``None``: subscribers asking for keys are refused.
    partitioning:
        ``None`` (the default) or ``"hash"``: a key-partitioned topic (needs ``key`` a column
        name; recorded in the catalog as the topic's ``partition_key``). Each record must
        belong to this partition, ``epochstream.partitioning.partition_of(record[key],
        partitions) == partition`` (else ``send`` raises ``PartitioningError``;
        ``partitioning.split`` divides records among partitions), so a subscriber with
        ``keys=`` joins only the partitions that can hold its keys. ``send_encoded`` payloads
        are not checked.
    max_filter_classes:
        the bound on distinct filter programs this partition encodes for (data is filtered and
        encoded once per distinct program and message); a subscriber joining beyond it is sent
        everything and filters itself, which stays correct (default 32, as seed 001 suggests).
    security:
        ``None`` (the default: plain TCP) or ``Security.curve(server_secret=..., allow=...)``
        (docs/security.md): the ROUTER becomes a CURVE server with that key pair (its public
        key is :attr:`server_key` and is registered in the catalog with the partition), clients
        are authenticated by pyzmq's ZAP handler against the ``allow`` directory (``None``: any
        client key). With a catalog, a subscriber's hello (and a history read) is served only if
        its public key (or its certificate's name in ``allow``) holds a ``subscribe`` grant
        matching the topic (``Catalog.grant``); otherwise it gets ``X error`` "not authorised
        for topic ..." and nothing of the stream; grants are re-read every second and a
        subscriber whose grant was revoked is dropped. Without a catalog, ``allow`` is the only
        check.

    Flow control: a subscriber that opens with credit (``Subscriber(credit=N)``) is sent at most
    its granted ``D``/``F`` messages; beyond that its messages wait in its backlog, and when that
    backlog reaches ``max_queue_messages`` or ``max_queue_bytes`` the loop stops taking new
    calls, so :meth:`send` blocks (back-pressure) instead of the subscriber being evicted — for
    up to ``credit_timeout`` seconds without a grant. Peers that are sent nothing are probed
    with a heartbeat every ``heartbeat_interval``, so a dead one is freed within about
    ``3 * heartbeat_interval`` (the ZMTP heartbeat timeout, at least 0.5 s).

    Ending: :meth:`close` (or leaving a ``with`` block normally) releases every capability, so
    every open epoch completes. An exception leaving the ``with`` block (``KeyboardInterrupt``
    too) calls :meth:`abort` instead: open epochs never complete, subscribers raise
    :class:`~epochstream.errors.PublisherAborted`, the catalog marks the partition ``aborted``.

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
                 partitioning: str | None = None, publisher_gate=None):
        self._check_options(topic, partition, partitions, order, codec, key, partitioning)
        self.heartbeat_interval = float(heartbeat_interval)
        self.coalesce_bytes = int(coalesce_bytes) if self.codec.name == "msgpack" else 0
        self.max_filter_classes = int(max_filter_classes)
        self.gate = publisher_gate  # a Relay: downstream filters travel upstream (internal)
        self.incarnation = uuid.uuid4().hex
        if isinstance(catalog, (str, os.PathLike)):  # a path, or a network catalog's URL
            catalog = Catalog(catalog)
        self._catalog = catalog
        # the upper frontier goes to the catalog before data beyond it leaves (transport/upper.py)
        self._upper = None if catalog is None else UpperRecorder(catalog, topic, partition,
                                                                 self.incarnation)
        self.security = _server_security(security)
        #: this publisher's CURVE public key (Z85), registered in the catalog; None: plain TCP
        self.server_key: str | None = (None if self.security is None
                                       else self.security.server_public)
        self._authz = None if self.security is None else Authorizer(topic, self.security, catalog)
        self._fenced = False
        self._keeper: LeaseKeeper | None = None
        self.retention = retention
        self._protocol = self._start_protocol(retention, start, upper, strict, schema)
        self._last_time, self._last_header = object(), b""  # header of the last data time
        self._lock = threading.Lock()
        self._closed = False
        self._aborted: str | None = None  # the reason, once abort() ran
        self._closer: threading.Thread | None = None
        self._start_loop(context, endpoint, advertise, sndhwm, queue_hwm, max_queue_messages,
                         max_queue_bytes, credit_timeout)
        self._register(schema, ingest)
        self._thread.start()
        lease = getattr(self._catalog, "lease", None)
        self._keeper = None if lease is None else LeaseKeeper(
            self._catalog, self.topic, self.partition, self.incarnation,
            min(RENEW_S, lease / 3), self._on_fenced).start()
        if self._authz is not None:  # re-reads the grants while the loop runs
            self._authz.start(self._thread.is_alive)

    def _check_options(self, topic, partition, partitions, order, codec, key,
                       partitioning) -> None:
        """Set the topic's definition, after checking it (``ValueError``/``TypeError``)."""
        if isinstance(order, str):
            order = by_name(order)
        if not isinstance(partition, int) or not 0 <= partition < partitions:
            raise ValueError(f"partition {partition!r} out of range 0..{partitions - 1}")
        self.topic, self.partition, self.partitions, self.order = topic, partition, partitions, order
        self.codec = wire.codec(codec)
        if key is not None and not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key must be a column name or a function, got {type(key).__name__}")
        self.key = key
        if partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be None or {HASH!r}, got {partitioning!r}")
        if partitioning is not None and not isinstance(key, str):
            raise ValueError(f"partitioning={partitioning!r} needs the topic's key column "
                             f"(key='column'), got key={key!r}")
        self.partition_key = key if partitioning is not None else None

    def _start_protocol(self, retention, start, upper, strict: bool,
                        schema: str | None) -> PublisherProtocol:
        """The protocol state to start with: from the epoch log (``retention``), a given upper
        frontier (a relay) or the catalog's record (:mod:`epochstream.start` decides)."""
        order = self.order
        self._log: LogWriter | None = None
        self._resumed_at: tuple | None = None  # the lower frontier taken from the epoch log
        if retention is None:
            lower, upper = start_frontiers(self._catalog, self.topic, self.partition, order,
                                           start, upper)
            if lower is None:
                return PublisherProtocol(order, start=start, upper=upper, strict=strict)
            return PublisherProtocol(order, lower=lower, upper=upper, strict=strict)
        if upper is not None:
            raise ValueError("upper= is not for a publisher with retention (its log recovers it)")

        def create() -> None:
            self._catalog.create_topic(self.topic, order=order, codec=self.codec.name,
                                       partitions=self.partitions, schema=schema,
                                       **self._partitioned())
        self._log, lower, upper = open_log(self._catalog, retention, self.topic, self.partition,
                                           order, start, self.incarnation, create)
        if start is None and tuple(lower) != (order.minimum,):
            self._resumed_at = tuple(lower)
        return PublisherProtocol(order, lower=lower, upper=upper, strict=strict)

    def _start_loop(self, context, endpoint: str, advertise, sndhwm: int, queue_hwm: int,
                    max_queue_messages: int, max_queue_bytes: int,
                    credit_timeout: float) -> None:
        """Bind the ROUTER and build the loop (its thread is started after registering)."""
        self._ctx = context or zmq.Context.instance()
        self._router = bind_router(self._ctx, endpoint, sndhwm=sndhwm,
                                   heartbeat_interval=self.heartbeat_interval,
                                   security=self.security)
        self.endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.advertised: str = advertised_endpoint(self.endpoint, advertise)
        self._handoff = Handoff(self._ctx, queue_hwm, lambda: self._thread.is_alive())
        self._fanout = Fanout(f"{self.topic!r} partition {self.partition}", self.partition,
                              max_messages=max_queue_messages, max_bytes=max_queue_bytes,
                              credit_timeout=credit_timeout)
        self.stats = self._fanout.stats
        self._loop = PublisherLoop(self, self._router, self._handoff, self._fanout,
                                   self._protocol.lower, self._protocol.upper, lambda: self._closed)
        self._thread = threading.Thread(target=self._loop.run, daemon=True,
                                        name=f"epochstream-pub-{self.topic}-{self.partition}")

    def _partitioned(self) -> dict:
        """The topic definition's ``partition_key`` (left out when not key-partitioned)."""
        return {} if self.partition_key is None else {"partition_key": self.partition_key}

    def _register(self, schema: str | None, ingest: str | None) -> None:
        if self._catalog is None:
            return
        try:
            self._catalog.create_topic(self.topic, order=self.order, codec=self.codec.name,
                                       partitions=self.partitions, schema=schema,
                                       **self._partitioned())
            self.incarnation = self._catalog.register_partition(
                self.topic, self.partition, self.advertised, ingest=ingest,
                incarnation=self.incarnation, upper=list(self._protocol.upper),
                **({} if self.server_key is None else {"server_key": self.server_key}))
        except BaseException:
            self._close_sockets()
            raise

    # -- queries ---------------------------------------------------------------------------
    @property
    def max_queue_messages(self) -> int:
        """Backlog bound per subscriber, messages."""
        return self._fanout.max_messages

    @property
    def max_queue_bytes(self) -> int:
        """Backlog bound per subscriber, bytes."""
        return self._fanout.max_bytes

    @property
    def credit_timeout(self) -> float:
        """Seconds a flow-controlled subscriber may hold the producer back without a grant."""
        return self._fanout.credit_timeout

    @property
    def queue_hwm(self) -> int:
        """Calls the caller may be ahead of the loop before calls block."""
        return self._handoff.hwm

    @property
    def would_block(self) -> bool:
        """True while a call (``send``, ``advance_to``, ...) would block: the loop is
        :attr:`queue_hwm` calls behind (flow control holds it back while a subscriber's credit
        or backlog bound is exhausted). What an event loop polls before a call (``aio``)."""
        handoff = self._handoff
        return len(handoff.commands) >= handoff.hwm and self._thread.is_alive()

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

    # -- calls -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        refused = None if self._upper is None else self._upper.error
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
        if self._keeper is not None and not self._closed and not self._keeper.valid():
            self._fenced = True  # stopped past its lease: a successor may hold the partition
            self._end_locked(f"fenced: its lease of {self._keeper.lease:g} s was not renewed in "
                             f"time (the process was stopped or starved)", 0.0)
        if self._closed:
            state = f"aborted ({self._aborted})" if self._aborted is not None else "closed"
            if self._fenced:
                raise Fenced(f"publisher {self.topic}/{self.partition} is {state}",
                             topic=self.topic, partition=self.partition,
                             incarnation=self.incarnation)
            raise ProtocolError(f"publisher {self.topic}/{self.partition} is {state}")

    def _upper_refused(self, refused: CatalogError) -> None:
        """Abort (once) and raise after the catalog refused an upper frontier write."""
        what = f"publisher {self.topic}/{self.partition}"
        if isinstance(refused, Fenced):
            self._fenced = True  # the row is the successor's: never touched again
        if not self._closed:
            self._end_locked(f"the catalog refused its upper frontier: {refused}", 0.0)
        if isinstance(refused, Fenced):
            raise Fenced(f"{what} aborted: {refused}", topic=self.topic,
                         partition=self.partition, incarnation=self.incarnation) from refused
        if isinstance(refused, CatalogUnavailable):
            raise CatalogUnavailable(f"{what} aborted: {refused}", url=refused.url,
                                     timeout=refused.timeout, op=refused.op) from refused
        raise CatalogError(f"{what} aborted: {refused}") from refused

    def send(self, time, records) -> None:
        """Publish ``records`` at ``time``: encoded with the topic's codec (a list or tuple of
        records for msgpack; a ``pyarrow.RecordBatch``/``Table`` or list of dicts for arrow).

        Raises :class:`ProtocolError` if ``time`` has the wrong shape or no capability ``<= time``
        is held; :class:`WireError` if the records are not a sequence of records or the codec
        cannot encode them; :class:`~epochstream.partitioning.PartitioningError` on a
        key-partitioned topic for a record whose key belongs to another partition. Nothing is
        sent and no state changes when it raises."""
        if self.partition_key is not None:
            check_records(records, self.partition_key, self.partition, self.partitions)
        self.send_encoded(time, self.codec.encode(records))

    def send_encoded(self, time, payload) -> None:
        """Publish an already-encoded payload (bytes-like, in the topic's codec) at ``time``.
        With a catalog, a time that grows the upper frontier is recorded there before data at
        it is sent (by the loop thread, one write for a burst of new times: see
        :mod:`~epochstream.transport.upper`), so a restarted incarnation can announce it; if the
        catalog refuses (:class:`~epochstream.errors.Fenced`) or stays unreachable, the data is
        not sent and the next call raises that error (the publisher aborted)."""
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
            if not self._thread.is_alive() or self._closed:
                return True if not self._closed else self.join(timeout)
            self._enqueue((SYNC, ev, None))
        done = ev.wait(timeout)
        if self._loop.log_error is not None or (self._upper is not None
                                                and self._upper.error is not None):
            with self._lock:
                self._check_open()
        return done

    # -- ending ----------------------------------------------------------------------------
    def close(self, linger: float = 10.0, wait: bool = False) -> None:
        """Release every capability (the lower frontier becomes empty, so every open epoch
        completes and subscribers finish) and mark the partition closed in the catalog with its
        final upper frontier. Returns at once; the loop keeps delivering until every subscriber
        has acknowledged the end of the stream (a subscriber says ``bye`` when a partition's
        frontier becomes empty) or is found gone, for up to ``linger`` seconds, then closes its
        sockets. That wait runs in a non-daemon thread, so the interpreter does not exit before
        it ends (like ``zmq_ctx_term`` with ``ZMQ_LINGER``). ``wait=True`` (or :meth:`join`)
        blocks until it ended. A subscriber that did not read to the end within ``linger``
        misses it and reports :class:`~epochstream.errors.PublisherLost`. Idempotent; after
        :meth:`abort` it does nothing."""
        self._end(None, linger, wait)

    def abort(self, reason: str = "aborted", linger: float = 10.0, wait: bool = False) -> None:
        """End abnormally: keep every capability (open epochs never complete), tell every
        subscriber with an ``X aborted`` notice (they raise
        :class:`~epochstream.errors.PublisherAborted`, or re-join a later incarnation with
        ``recover=True``), and mark the partition ``aborted`` in the catalog. Messages queued
        before the abort (earlier, complete epochs) are still delivered first. ``linger`` and
        ``wait`` as for :meth:`close`. Idempotent; after :meth:`close` it does nothing."""
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
            log.warning("publisher %s/%s aborted: %s", self.topic, self.partition, abort_reason)
            self._handoff.put_final((ABORT, abort_reason, None))
            if self._log is not None and self._thread.is_alive():
                # wait until the loop closed the log: a successor (even in this process) may
                # open and recover it as soon as the catalog says aborted
                quiet = threading.Event()
                self._handoff.put_final((SYNC, quiet, None))
                quiet.wait(30.0)
        self._mark_ended(aborted=abort_reason is not None)
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
        self._fenced = True
        self.abort(f"fenced: {reason}", linger=0.0)

    def _mark_ended(self, aborted: bool) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        if self._catalog is None or self._fenced:  # the row is the successor's now
            return
        try:
            if self._upper is not None and self._upper.error is None:
                self._upper.flush()  # the loop's last request (refused once the row is closed)
            self._catalog.close_partition(self.topic, self.partition, self.incarnation,
                                          upper=list(self._protocol.upper), aborted=aborted)
        except Exception:  # the catalog may be gone; the stream itself ended correctly
            log.exception("could not mark %s/%s ended in the catalog", self.topic, self.partition)

    def _finish_close(self, linger: float) -> None:
        t0 = _time.monotonic()
        self._thread.join(linger + 5.0)
        if self._log is not None and not self._thread.is_alive():
            self._log.close()
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


def _server_security(security) -> Security | None:
    """A publisher's ``security`` (``None`` when off), checked: ``TypeError``/``ValueError``."""
    if security is not None and not isinstance(security, Security):
        raise TypeError(f"security must be a Security or None, got {type(security).__name__}")
    security = security if security is not None and security.enabled else None
    if security is not None and not security.is_server:
        raise ValueError("a publisher's security needs its key pair: "
                         "Security.curve(server_secret=..., allow=...)")
    return security
