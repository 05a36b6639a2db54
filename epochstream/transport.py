"""Publisher and Subscriber over pyzmq (ROUTER ⇄ DEALER, one connection per partition).

:class:`Publisher` — one partition of a topic. Its background loop thread owns a ROUTER socket
and is the only place where subscribers are registered and messages are sent, so a new
subscriber's :class:`~epochstream.protocol.InitialFrontierSnapshot` is taken and the subscriber
registered in one step of the loop: every later message reaches it, no earlier one does (the
Strymon "new subscriber connects" step). The calling thread validates each call against its own
:class:`~epochstream.protocol.PublisherProtocol` (errors are raised right there, nothing is sent)
and hands the encoded frames to the loop through a deque, waking it with one byte over an
``inproc`` pipe per batch of calls (a call blocks while the loop is ``queue_hwm`` messages behind:
back-pressure, never loss).

No silent drops: the ROUTER has ``ROUTER_MANDATORY`` set and sends without blocking; when a
subscriber's pipe is full (``sndhwm`` messages) further messages wait in that subscriber's
bounded backlog (``max_queue_messages`` / ``max_queue_bytes``). Past the bound the subscriber is
evicted: its backlog is freed and it gets an ``X lagged`` notice, which its :class:`Subscriber`
raises as :class:`~epochstream.errors.SubscriberLagged`. Other subscribers are not slowed down.

Liveness: ZMTP heartbeats (``ZMQ_HEARTBEAT_IVL``/``TIMEOUT``) on both sockets let libzmq drop
dead connections, after which the publisher forgets the peer (``EHOSTUNREACH`` on send); the
publisher sends an application heartbeat carrying its lower frontier every
``heartbeat_interval`` seconds while idle, and a :class:`Subscriber` raises
:class:`~epochstream.errors.PublisherLost` when a partition stays silent for ``timeout`` seconds.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time as _time
import uuid
from typing import Any, Iterator

import zmq

from . import wire
from .errors import (EpochstreamError, ProtocolError, PublisherAborted, PublisherLost,
                     SubscriberLagged, WireError)
from .frontier import Antichain
from .order import TIME_MIN, TOTAL, by_name, check_time, dual
from .protocol import (DataMessage, Epoch, EpochAssembler, InitialFrontierSnapshot,
                       LowerFrontierUpdate, PublisherProtocol, SubscriberProtocol)

__all__ = ["Publisher", "Subscriber", "Gap"]

log = logging.getLogger("epochstream.transport")

_ids = itertools.count()

# loop command kinds (caller thread -> loop thread, over inproc)
_CMD_DATA = b"D"
_CMD_FRONTIER = b"F"
_CMD_SYNC = b"Y"
_CMD_STOP = b"Q"
_CMD_ABORT = b"A"

# message kinds that spend flow-control credit (the stream proper; not S, H or X)
_CREDITED = frozenset((wire.DATA, wire.FRONTIER))


class _Peer:
    """Loop-side state of one connected subscriber."""

    __slots__ = ("ident", "backlog", "backlog_bytes", "evicted", "notice", "credit", "sub_id",
                 "stalled_since")

    def __init__(self, ident: bytes, credit: int | None = None, sub_id: str | None = None):
        self.ident = ident
        self.sub_id = sub_id  # the subscriber's own stable id (survives reconnections)
        self.credit = credit  # None: no flow control; else D/F messages it may still be sent
        self.backlog: collections.deque = collections.deque()
        self.backlog_bytes = 0
        self.evicted = False
        self.notice: list | None = None
        self.stalled_since: float | None = None  # backlog full (holding the producer back) since

    def full(self, max_messages: int, max_bytes: int) -> bool:
        """True when the backlog reached either bound."""
        return len(self.backlog) >= max_messages or self.backlog_bytes >= max_bytes


def _frames_nbytes(frames) -> int:
    return sum(len(f) for f in frames)


def _inherited_upper(catalog, topic: str, partition: int, order, start) -> tuple:
    """The upper frontier a publisher starting at ``start`` must announce (see ``Publisher``'s
    ``start``): what the catalog recorded for the partition, plus ``start - 1`` for a total
    order. Empty for a fresh stream (``start`` is ``None`` or the minimum: every time is
    re-sent). Raises :class:`ProtocolError` when nothing safe can be derived."""
    if start is None:
        return ()
    start = check_time(order, start)
    if start == order.minimum:
        return ()
    recorded = None
    if catalog is not None:
        try:
            info = catalog.lookup(topic)
        except EpochstreamError:
            info = None
        if info is not None and info.order_name == getattr(order, "name", None):
            p = next((x for x in info.partition_info if x.index == partition), None)
            recorded = None if p is None else tuple(p.upper)
    if getattr(order, "name", None) == "total":
        return tuple({*(recorded or ()), start - 1}) if start > TIME_MIN else tuple(recorded or ())
    if recorded is None:
        raise ProtocolError(
            f"publisher {topic}/{partition}: start={start!r} skips times an earlier incarnation "
            f"may have begun, and no catalog records its upper frontier; a restart past the "
            f"minimum needs the catalog the earlier incarnation registered in")
    return recorded


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
    catalog:
        a :class:`~epochstream.catalog.Catalog` (or ``None``): the topic is created there if
        needed and this partition registered (``ingest`` is recorded with it); :meth:`close`
        marks it closed with the final upper frontier.
    heartbeat_interval:
        seconds of idleness after which a heartbeat (with the lower frontier) is broadcast; also
        the ZMTP heartbeat interval.
    sndhwm:
        per-subscriber ZeroMQ send high-water mark (messages).
    max_queue_messages, max_queue_bytes:
        bound on a subscriber's backlog beyond its ZeroMQ pipe; past it the subscriber is
        evicted with a ``lagged`` notice.
    queue_hwm:
        how many messages the caller may be ahead of the loop before calls block.
    start:
        the initial capability (default ``order.minimum``): a restarted publisher resumes at the
        first epoch it has not completed. A publisher that starts past the minimum skips times
        its predecessor may have begun, so it must announce their upper frontier: it inherits
        the upper frontier the catalog recorded for this partition (every earlier incarnation
        recorded its own before sending data at a new maximal time). Without a recorded one, a
        total order uses ``start - 1``; any other order raises :class:`ProtocolError` (nothing
        could tell subscribers which epochs were begun). ``start=None`` starts a fresh stream.
    strict:
        timely's capability rules for a single upstream (see
        :class:`~epochstream.protocol.PublisherProtocol`): never release a capability not held,
        never mint one that is not ``>=`` a held one.
    credit_timeout:
        seconds a flow-controlled subscriber may grant no credit while it holds the producer
        back (its backlog full) before it is evicted with a ``lagged`` notice (default 30 s, as
        NATS JetStream's default ``ack_wait``), so one hung consumer cannot stop a topic.
    coalesce_bytes:
        batching without linger (Kafka's producer batching with ``linger.ms=0``): when the loop
        finds several data calls for the same time already queued, it sends them as one message
        of up to this many payload bytes (msgpack only: the arrays are concatenated without
        decoding). Nothing waits for a batch to fill; 0 disables it.

    Flow control: a subscriber that opens with credit (``Subscriber(credit=N)``) is sent at most
    its granted ``D``/``F`` messages; beyond that its messages wait in its backlog, and when that
    backlog reaches ``max_queue_messages`` or ``max_queue_bytes`` the loop stops taking new
    calls, so :meth:`send` blocks (back-pressure) instead of the subscriber being evicted — for
    up to ``credit_timeout`` seconds without a grant. Peers whose credit is spent are probed
    with a heartbeat every ``heartbeat_interval``, so a dead one is freed within about
    ``3 * heartbeat_interval`` (the ZMTP heartbeat timeout).

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
                 endpoint: str = "tcp://127.0.0.1:*", catalog=None, partitions: int = 1,
                 schema: str | None = None, ingest: str | None = None,
                 heartbeat_interval: float = 1.0, sndhwm: int = 1000,
                 max_queue_messages: int = 100_000, max_queue_bytes: int = 256 << 20,
                 queue_hwm: int = 1000, start=None, strict: bool = True,
                 coalesce_bytes: int = 64 << 10, credit_timeout: float = 30.0,
                 context: zmq.Context | None = None):
        if isinstance(order, str):
            order = by_name(order)
        if not isinstance(partition, int) or not 0 <= partition < partitions:
            raise ValueError(f"partition {partition!r} out of range 0..{partitions - 1}")
        self.topic = topic
        self.partition = partition
        self.partitions = partitions
        self.order = order
        self.codec = wire.codec(codec)
        self.heartbeat_interval = float(heartbeat_interval)
        self.max_queue_messages = int(max_queue_messages)
        self.max_queue_bytes = int(max_queue_bytes)
        self.credit_timeout = float(credit_timeout)
        self.incarnation = uuid.uuid4().hex
        self._catalog = catalog
        upper = _inherited_upper(catalog, topic, partition, order, start)
        self._protocol = PublisherProtocol(order, start=start, upper=upper, strict=strict)
        self._last_time, self._last_header = object(), b""  # header of the last data time
        self.coalesce_bytes = int(coalesce_bytes) if self.codec.name == "msgpack" else 0
        self._lock = threading.Lock()
        self._closed = False
        self._aborted: str | None = None  # the reason, once abort() ran
        self._loop_error: BaseException | None = None
        self._ctx = context or zmq.Context.instance()

        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, int(sndhwm))
        router.setsockopt(zmq.RCVHWM, 1000)
        router.setsockopt(zmq.MAXMSGSIZE, 1 << 16)  # subscribers only send small control messages
        router.setsockopt(zmq.LINGER, 2000)
        hb_ms = max(1, int(self.heartbeat_interval * 1000))
        router.setsockopt(zmq.HEARTBEAT_IVL, hb_ms)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * hb_ms)
        try:
            router.bind(endpoint)
        except zmq.ZMQError:
            router.close(0)
            raise
        self.endpoint: str = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = router

        # caller -> loop: commands in a deque; one wake-up byte over inproc per batch of calls
        addr = f"inproc://epochstream-pub-{os.getpid()}-{next(_ids)}"
        self._cmd_in = self._ctx.socket(zmq.PAIR)
        self._cmd_in.bind(addr)
        self._cmd = self._ctx.socket(zmq.PAIR)
        self._cmd.connect(addr)
        self._commands: collections.deque = collections.deque()
        self._kicked = False
        self.queue_hwm = int(queue_hwm)
        self._space = threading.Condition(threading.Lock())
        self._waiting = 0

        # loop-side state (touched only by the loop thread)
        self._peers: dict[bytes, _Peer] = {}
        # ids of subscribers evicted recently -> notice; a ping from such an id on another
        # connection (libzmq reconnected it) is answered with its lagged notice again
        self._evicted_ids: collections.OrderedDict = collections.OrderedDict()
        # the loop's own copies of the frontiers (what it has sent): snapshots read these
        self._loop_lower: dict = dict.fromkeys(self._protocol.lower, True)
        self._loop_upper = Antichain(dual(order), self._protocol.upper)
        self._loop_aborted: list | None = None  # the X aborted notice, once the loop aborted
        self._last_broadcast = self._last_probe = _time.monotonic()
        self._flow_full = False  # set when a flow-controlled peer's backlog reached its bound
        self.stats = collections.Counter()

        if catalog is not None:
            try:
                catalog.create_topic(topic, order=order, codec=self.codec.name,
                                     partitions=partitions, schema=schema)
                self.incarnation = catalog.register_partition(
                    topic, partition, self.endpoint, ingest=ingest, incarnation=self.incarnation,
                    upper=list(self._protocol.upper))
            except BaseException:
                self._close_sockets()
                raise

        self._thread = threading.Thread(target=self._loop, name=f"epochstream-pub-{topic}-{partition}",
                                        daemon=True)
        self._thread.start()

    # -- caller side -----------------------------------------------------------------------
    @property
    def lower(self) -> tuple:
        """The lower frontier's elements (capabilities held), as of the calls made so far."""
        return self._protocol.lower

    @property
    def upper(self) -> tuple:
        """The upper frontier's elements (maximal times sent so far)."""
        return self._protocol.upper

    @property
    def subscribers(self) -> int:
        """Number of subscribers currently registered (approximate: read from another thread)."""
        return sum(1 for p in list(self._peers.values()) if not p.evicted)

    def _check_open(self):
        if self._loop_error is not None:
            raise ProtocolError(f"publisher {self.topic}/{self.partition}: its loop died "
                                f"({self._loop_error!r}); nothing more can be sent")
        if self._closed:
            state = f"aborted ({self._aborted})" if self._aborted is not None else "closed"
            raise ProtocolError(f"publisher {self.topic}/{self.partition} is {state}")

    def send(self, time, records) -> None:
        """Publish ``records`` at ``time``: encoded with the topic's codec (a list or tuple of
        records for msgpack; a ``pyarrow.RecordBatch``/``Table`` or list of dicts for arrow).

        Raises :class:`ProtocolError` if ``time`` has the wrong shape or no capability ``<= time``
        is held; :class:`WireError` if the records are not a sequence of records or the codec
        cannot encode them. Nothing is sent and no state changes when it raises."""
        self.send_encoded(time, self.codec.encode(records))

    def send_encoded(self, time, payload) -> None:
        """Publish an already-encoded payload (bytes-like, in the topic's codec) at ``time``.
        With a catalog, a time that grows the upper frontier is recorded there first (one
        write per new maximal time), so a restarted incarnation can announce it."""
        with self._lock:
            self._check_open()
            protocol = self._protocol
            t = protocol.check_data(time)
            if t != self._last_time or type(t) is not type(self._last_time):
                header = wire.encode_time(t)  # may raise: before any state changes
                if self._catalog is not None and protocol.extends_upper(t):
                    self._record_upper(t)
                self._last_time, self._last_header = t, header
            protocol.accept(t)
            self._enqueue((_CMD_DATA, t, [wire.DATA, self._last_header, payload]))

    def _record_upper(self, t) -> None:
        """Persist the upper frontier grown by ``t`` in the catalog before data at ``t`` leaves
        the process (see ``start``). Raises if the catalog refuses (nothing is sent then)."""
        upper = Antichain(dual(self.order), self._protocol.upper)
        upper.insert(t)
        if not self._catalog.record_upper(self.topic, self.partition, self.incarnation,
                                          list(upper.elements)):
            raise ProtocolError(f"publisher {self.topic}/{self.partition}: the catalog no longer "
                                f"lists this incarnation ({self.incarnation}); another publisher "
                                f"took the partition over or the topic was dropped")

    def progress(self, updates) -> LowerFrontierUpdate | None:
        """Apply timely progress updates ``[(time, delta), ...]`` to the lower frontier and
        broadcast its net change. Returns the change, or ``None`` when the frontier did not move.
        Raises :class:`ProtocolError` for malformed updates, releasing a capability not held or
        minting one not ``>=`` a held one (nothing applied, see ``strict``)."""
        with self._lock:
            self._check_open()
            msg = self._protocol.progress(updates)
            if msg is not None:
                self._enqueue((_CMD_FRONTIER, msg, wire.encode_frontier(msg)))
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
                self._enqueue((_CMD_FRONTIER, msg, wire.encode_frontier(msg)))
            return msg

    def _enqueue(self, command) -> None:
        """Hand a command to the loop (caller holds ``self._lock``). Blocks while the loop is
        ``queue_hwm`` commands behind; raises :class:`ProtocolError` if the loop died."""
        if len(self._commands) >= self.queue_hwm:
            with self._space:
                self._waiting += 1
                try:
                    while len(self._commands) >= self.queue_hwm and self._thread.is_alive():
                        self._space.wait(0.5)
                finally:
                    self._waiting -= 1
        if not self._thread.is_alive() and self._thread.ident is not None:
            self._loop_error = self._loop_error or RuntimeError("publisher loop ended")
            self._check_open()
        self._commands.append(command)
        if not self._kicked:
            self._kicked = True
            self._cmd.send(b"K")

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until the loop has handled every call made before (not until subscribers read
        it). Returns False on timeout (seconds)."""
        ev = threading.Event()
        with self._lock:
            if not self._thread.is_alive() or self._closed:
                return True if not self._closed else self.join(timeout)
            self._enqueue((_CMD_SYNC, ev, None))
        return ev.wait(timeout)

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
            self._closed = True
            if abort_reason is None:
                msg = self._protocol.close()
                if msg is not None:
                    self._enqueue_final((_CMD_FRONTIER, msg, wire.encode_frontier(msg)))
            else:
                self._aborted = abort_reason
                log.warning("publisher %s/%s aborted: %s", self.topic, self.partition, abort_reason)
                self._enqueue_final((_CMD_ABORT, abort_reason, None))
        if self._catalog is not None:
            try:
                self._catalog.close_partition(self.topic, self.partition, self.incarnation,
                                              upper=list(self._protocol.upper),
                                              aborted=abort_reason is not None)
            except Exception:  # the catalog may be gone; the stream itself ended correctly
                log.exception("could not mark %s/%s ended in the catalog", self.topic, self.partition)
        with self._lock:
            self._enqueue_final((_CMD_STOP, float(linger), None))
        self._closer = threading.Thread(target=self._finish_close, args=(float(linger),),
                                        name=f"epochstream-close-{self.topic}-{self.partition}")
        self._closer.start()
        if wait:
            self.join(linger + 5.0)

    def _enqueue_final(self, command) -> None:
        """Hand an end-of-stream command to the loop without waiting for queue space (at most
        three such commands exist), so close()/abort() never block behind flow control; a dead
        loop is not an error here."""
        self._commands.append(command)
        if self._thread.is_alive() and not self._kicked:
            self._kicked = True
            self._cmd.send(b"K")

    def _finish_close(self, linger: float) -> None:
        t0 = _time.monotonic()
        self._thread.join(linger + 5.0)
        self._close_sockets(max(0.0, linger - (_time.monotonic() - t0)))

    def join(self, timeout: float | None = None) -> bool:
        """Wait until a :meth:`close` finished delivering (see there); True if it did, False on
        timeout (seconds) or if the publisher was not closed."""
        closer = getattr(self, "_closer", None)
        if closer is None:
            return False
        closer.join(timeout)
        return not closer.is_alive()

    def _close_sockets(self, linger: float = 0.0):
        for s in (getattr(self, "_cmd", None), getattr(self, "_cmd_in", None)):
            if s is not None:
                s.close(0)
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

    # -- loop side -------------------------------------------------------------------------
    def _flow_blocked(self) -> bool:
        """True while a flow-controlled subscriber's backlog is full: stop taking calls."""
        limit, nbytes = self.max_queue_messages, self.max_queue_bytes
        blocked = any(p.credit is not None and p.full(limit, nbytes) for p in self._peers.values())
        self._flow_full = blocked
        return blocked

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug here must not pass silently: callers raise it
            self._loop_error = exc
            log.exception("publisher loop %s/%s died", self.topic, self.partition)
            raise
        finally:
            while self._commands:  # nobody may wait for a flush forever
                kind, arg, _ = self._commands.popleft()
                if kind == _CMD_SYNC:
                    arg.set()
            with self._space:
                self._space.notify_all()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._cmd_in, zmq.POLLIN)
        blocked_poller = zmq.Poller()  # while flow control holds the producer back
        blocked_poller.register(self._router, zmq.POLLIN)
        stop_at = None
        hb = self.heartbeat_interval
        while True:
            now = _time.monotonic()
            backlog = any(p.backlog or p.notice for p in self._peers.values())
            # Flow control holds the producer back, except once close()/abort() was called:
            # the end of the stream is never stuck behind a consumer (backlogs then grow by at
            # most ``queue_hwm`` more messages).
            blocked = backlog and stop_at is None and not self._closed and self._flow_blocked()
            if stop_at is not None:
                # Closing: wait until every subscriber acknowledged the end of the stream
                # (its ``bye`` once our frontier is empty) or is gone, up to the linger time.
                if not self._peers or now >= stop_at:
                    return
                timeout = 1 if backlog else 20
            elif backlog:
                timeout = 0 if (self._commands and not blocked) else 1
            elif self._commands:
                timeout = 0  # commands left from the last batch: serve peers, then go on
            else:
                due = min(self._last_broadcast, self._last_probe) + hb - now
                timeout = max(1, int(due * 1000))
            events = dict((blocked_poller if blocked else poller).poll(timeout))
            if self._router in events:
                self._handle_peers()
            if self._cmd_in in events:
                while True:  # wake-up bytes: at most one per batch of commands
                    try:
                        self._cmd_in.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                # Clear the flag only here, after consuming the wake-ups and before draining:
                # a command appended from now on kicks again; one appended before is drained
                # below (or, if flow control blocks, on a later pass).
                self._kicked = False
            if not blocked and stop_at is None and self._commands:
                if self._run_commands():
                    stop_at = _time.monotonic() + self._stop_linger
            if backlog:
                self._drain_backlogs()
            now = _time.monotonic()
            if now - self._last_probe >= hb:
                # Peers that are sent nothing (credit spent, pipe full) are probed: a dead one
                # is forgotten; a flow-controlled one silent past credit_timeout is evicted.
                self._last_probe = now
                self._probe(now, all_peers=stop_at is not None)
            if now - self._last_broadcast >= hb and stop_at is None:
                # idle (or held back by flow control): peers without a backlog hear from us
                self._broadcast(wire.encode_heartbeat(list(self._loop_lower)), counted=False)

    def _run_commands(self, limit: int = 4096) -> bool:
        """Run queued commands (at most ``limit``, then let the loop serve peers; fewer when a
        flow-controlled peer's backlog fills up); True on STOP."""
        commands = self._commands
        upper_insert = self._loop_upper.insert
        broadcast = self._broadcast
        data = 0
        stop = False
        self._flow_full = False
        for _ in range(limit):
            if not commands or self._flow_full:
                break
            kind, arg, frames = commands.popleft()
            if kind is _CMD_DATA:
                upper_insert(arg)
                if commands and self.coalesce_bytes:
                    frames = self._coalesce(arg, frames)
                broadcast(frames)
                data += 1
            elif kind is _CMD_FRONTIER:
                for t, d in arg.updates:
                    if d > 0:
                        self._loop_lower[t] = True
                    else:
                        self._loop_lower.pop(t, None)
                broadcast(frames)
            elif kind is _CMD_SYNC:
                arg.set()
            elif kind is _CMD_ABORT:
                self._abort_peers(arg)
            elif kind is _CMD_STOP:
                self._stop_linger = arg
                stop = True
                break
        self.stats["data_messages"] += data
        if self._waiting:
            with self._space:
                self._space.notify_all()
        return stop

    def _abort_peers(self, reason: str) -> None:
        """Queue an ``X aborted`` notice behind each peer's backlog (earlier, complete epochs
        still go first); later hellos get the notice instead of a snapshot."""
        self._loop_aborted = wire.encode_notice(
            "aborted", f"publisher of {self.topic!r} partition {self.partition} aborted: {reason}",
            partition=self.partition, incarnation=self.incarnation)
        for peer in self._peers.values():
            if not peer.evicted:
                peer.notice = self._loop_aborted
        self._drain_backlogs()

    def _coalesce(self, time, frames):
        """Merge the data commands for ``time`` queued right behind ``frames`` into one message
        (see ``coalesce_bytes``)."""
        commands = self._commands
        payloads = [frames[2]]
        size = len(frames[2])
        limit = self.coalesce_bytes
        while commands and size < limit:
            kind, t, nxt = commands[0]
            if kind is not _CMD_DATA or t != time or size + len(nxt[2]) > limit:
                break
            commands.popleft()
            payloads.append(nxt[2])
            size += len(nxt[2])
        if len(payloads) == 1:
            return frames
        merged = self.codec.merge(payloads)
        if merged is None:  # a payload that is not an array: send them one by one, in order
            for p in payloads[:-1]:
                self._broadcast([frames[0], frames[1], p])
            return [frames[0], frames[1], payloads[-1]]
        self.stats["coalesced"] += len(payloads) - 1
        return [frames[0], frames[1], merged]

    def _handle_peers(self) -> None:
        """Read up to 256 subscriber messages. Peer input never ends the loop: a message that
        does not decode, or whose handling fails, is answered with ``X error`` and logged."""
        router = self._router
        for _ in range(256):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident = frames[0]
            try:
                kind, header = wire.decode_control(frames[1:])
                self._control(ident, kind, header)
            except Exception as exc:  # noqa: BLE001 - the offender is refused, the loop goes on
                log.warning("%s/%s: bad message from subscriber %r: %r", self.topic, self.partition,
                            ident, exc)
                self.stats["bad_messages"] += 1
                self._send_direct(ident, wire.encode_notice("error", str(exc)))

    def _control(self, ident: bytes, kind: bytes, header: dict) -> None:
        """Act on one decoded (type-checked, see :func:`wire.decode_control`) control message."""
        if kind == wire.HELLO:
            self._hello(ident, header)
        elif kind == wire.CREDIT:
            peer = self._peers.get(ident)
            if peer is None or peer.credit is None:
                self._send_direct(ident, wire.encode_notice(
                    "error", "credit refused: not a registered flow-controlled subscriber"))
            else:
                peer.credit += header["messages"]
                peer.stalled_since = None
                self._drain_peer(peer)
        elif kind == wire.BYE:
            self._peers.pop(ident, None)
        elif ident not in self._peers and header.get("id") in self._evicted_ids:
            self._send_direct(ident, self._evicted_ids[header["id"]])  # lagged, again
        elif ident not in self._peers:  # PING from a peer we do not know (restart)
            self._send_direct(ident, self._loop_aborted or wire.encode_notice(
                "rejoin", f"publisher {self.topic!r} partition {self.partition} (incarnation "
                          f"{self.incarnation}) does not know this subscriber",
                incarnation=self.incarnation, partition=self.partition))
        # PING from a known peer: nothing to do (ZMTP heartbeats keep the connection).

    def _hello(self, ident: bytes, header: dict) -> None:
        topic, partition = header.get("topic"), header.get("partition")
        if topic != self.topic or partition != self.partition:
            msg = (f"this publisher serves {self.topic!r} partition {self.partition}, "
                   f"not {topic!r} partition {partition!r}")
            log.warning("%s/%s: refused hello: %s", self.topic, self.partition, msg)
            self._send_direct(ident, wire.encode_notice("error", msg))
            return
        if self._loop_aborted is not None:
            self._send_direct(ident, self._loop_aborted)
            return
        credit = header.get("credit")  # type-checked by wire.decode_control
        snap = InitialFrontierSnapshot(tuple(self._loop_lower), self._loop_upper.elements)
        frames = wire.encode_snapshot(
            snap, topic=self.topic, partition=self.partition, order=getattr(self.order, "name", ""),
            codec=self.codec.name, incarnation=self.incarnation, heartbeat=self.heartbeat_interval)
        self._peers.pop(ident, None)
        sub_id = header["id"]
        self._evicted_ids.pop(sub_id, None)
        if self._send_direct(ident, frames):
            self._peers[ident] = _Peer(ident, credit, sub_id)
            self.stats["subscribers_joined"] += 1

    def _send_direct(self, ident: bytes, frames) -> bool:
        try:
            self._router.send_multipart([ident, *frames], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # Again (pipe full) or EHOSTUNREACH (gone)
            log.warning("%s/%s: could not send to %r: %s", self.topic, self.partition, ident, exc)
            return False

    def _broadcast(self, frames, counted: bool = True) -> None:
        """Send ``frames`` to every registered peer, in stream order. ``counted``: a ``D`` or
        ``F`` message, which spends one credit of a flow-controlled peer and waits in its backlog
        when it has none; heartbeats (``counted=False``) are liveness only: they skip peers with
        a backlog (those are probed, see :meth:`_probe`) and spend no credit."""
        self._last_broadcast = _time.monotonic()
        if not self._peers:
            return
        router = self._router
        gone = None
        for peer in self._peers.values():
            if peer.evicted:
                continue
            if peer.backlog:
                self._drain_peer(peer)  # keep order: older queued messages go first
            if not peer.backlog and (not counted or peer.credit is None or peer.credit > 0):
                try:
                    router.send_multipart([peer.ident, *frames], zmq.NOBLOCK)
                    if counted and peer.credit is not None:
                        peer.credit -= 1
                    continue
                except zmq.Again:
                    pass
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        (gone := gone or []).append(peer.ident)
                        continue
                    raise
            if not counted:
                continue
            peer.backlog.append(frames)
            peer.backlog_bytes += _frames_nbytes(frames)
            if peer.credit is None:
                if (len(peer.backlog) > self.max_queue_messages
                        or peer.backlog_bytes > self.max_queue_bytes):
                    self._evict(peer, "messages / bytes queued beyond the socket's high-water mark")
            elif peer.full(self.max_queue_messages, self.max_queue_bytes):
                self._flow_full = True  # the producer is held back from now on
                if peer.stalled_since is None:
                    peer.stalled_since = self._last_broadcast
        if gone:
            for ident in gone:
                self._peers.pop(ident, None)
                self.stats["subscribers_lost"] += 1

    def _probe(self, now: float, all_peers: bool = False) -> None:
        """Send a heartbeat outside the stream (liveness only, no credit spent) to every peer
        that is being sent nothing — credit spent, or messages waiting in its backlog — or to
        every peer while closing: a peer whose connection is gone (ZMTP heartbeat timeout, or
        closed) is forgotten, which frees its backlog, unblocks the producer or lets the close
        finish. A flow-controlled peer that holds the producer back (backlog full) and granted
        nothing for ``credit_timeout`` seconds is evicted."""
        frames = wire.encode_heartbeat(list(self._loop_lower))
        for peer in list(self._peers.values()):
            if peer.evicted:
                continue
            spent = peer.credit is not None and peer.credit <= 0
            if not (all_peers or peer.backlog or spent):
                continue
            if peer.stalled_since is not None and not peer.full(self.max_queue_messages,
                                                                self.max_queue_bytes):
                peer.stalled_since = None  # it read enough: no longer holding the producer back
            if (peer.credit is not None and peer.stalled_since is not None
                    and now - peer.stalled_since >= self.credit_timeout):
                self._evict(peer, f"no credit granted for {now - peer.stalled_since:.1f} s while "
                                  f"it held the producer back (credit_timeout {self.credit_timeout} s)")
                self._drain_peer(peer)
                continue
            try:
                self._router.send_multipart([peer.ident, *frames], zmq.NOBLOCK)
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._peers.pop(peer.ident, None)
                self.stats["subscribers_lost"] += 1

    def _evict(self, peer: _Peer, why: str) -> None:
        queued, nbytes = len(peer.backlog), peer.backlog_bytes
        peer.backlog.clear()
        peer.backlog_bytes = 0
        peer.evicted = True
        peer.credit = None
        message = (f"evicted from {self.topic!r} partition {self.partition}: {why} ({queued} "
                   f"messages / {nbytes} bytes queued; bounds {self.max_queue_messages} messages "
                   f"/ {self.max_queue_bytes} bytes)")
        log.warning("%s", message)
        peer.notice = wire.encode_notice("lagged", message, partition=self.partition)
        if peer.sub_id is not None:
            self._evicted_ids[peer.sub_id] = peer.notice
            while len(self._evicted_ids) > 10_000:
                self._evicted_ids.popitem(last=False)
        self.stats["subscribers_evicted"] += 1

    def _drain_peer(self, peer: _Peer) -> bool:
        """Send what the peer's pipe takes from its backlog, then a pending notice. Returns
        True when the peer is finished with (notice delivered, or the connection is gone)."""
        router = self._router
        try:
            while peer.backlog:
                if peer.credit is not None:
                    if peer.credit <= 0:
                        return False
                frames = peer.backlog[0]
                router.send_multipart([peer.ident, *frames], zmq.NOBLOCK)
                peer.backlog.popleft()
                peer.backlog_bytes -= _frames_nbytes(frames)
                if peer.credit is not None:
                    peer.credit -= 1
            if peer.notice is not None:
                router.send_multipart([peer.ident, *peer.notice], zmq.NOBLOCK)
                peer.notice = None
                return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return True
            raise
        return False

    def _drain_backlogs(self) -> None:
        gone = [peer.ident for peer in self._peers.values()
                if (peer.backlog or peer.notice) and self._drain_peer(peer)]
        for ident in gone:
            self._peers.pop(ident, None)


def _resolve_catalog(catalog):
    from .catalog import Catalog  # the catalog layer sits above; only the convenience path needs it
    if catalog is None or isinstance(catalog, (str, os.PathLike)):
        return Catalog(catalog)
    return catalog


class Gap:
    """A subscriber re-joined its topic and may have missed epochs (``recover=True`` only).

    - ``reason``: ``"lagged"`` (a publisher evicted it), ``"restarted"`` (a publisher came back
      with a new incarnation) or ``"aborted"`` (a publisher aborted and a new incarnation took
      over);
    - ``partition``: the partition that caused it;
    - ``last_epoch``: the last complete epoch delivered before the gap (``None`` if none);
    - ``since``: the merged lower frontier before the gap (tuple of times): every epoch not at or
      beyond it had been delivered (or had no data);
    - ``until``: the merged lower frontier of the fresh snapshots: epochs not at or beyond it
      were complete before the re-join;
    - ``through``: the maximal upper-frontier elements of the fresh snapshots: epochs at or below
      them had begun before the re-join.

    An epoch ``t`` may have been missed (:meth:`may_have_missed`) iff it is at or beyond
    ``since`` and either below ``until`` or at or below some ``through`` element; every other
    epoch is delivered whole, and no epoch is delivered twice."""

    __slots__ = ("reason", "partition", "last_epoch", "since", "until", "through", "order")

    def __init__(self, reason, partition, last_epoch, since, order):
        self.reason = reason
        self.partition = partition
        self.last_epoch = last_epoch
        self.since = tuple(since)
        self.until: tuple = ()
        self.through: tuple = ()
        self.order = order

    def may_have_missed(self, t) -> bool:
        le = self.order.le
        if not any(le(s, t) for s in self.since):
            return False
        return not any(le(u, t) for u in self.until) or any(le(t, u) for u in self.through)

    def __repr__(self):
        return (f"Gap(reason={self.reason!r}, partition={self.partition}, last_epoch={self.last_epoch!r}, "
                f"since={list(self.since)!r}, until={list(self.until)!r}, through={list(self.through)!r})")


class Subscriber:
    """Subscribes to every partition of a topic and yields complete epochs (Strymon
    "Subscriber Logic" merged across partitions).

    ``Subscriber(topic, catalog=None, *, endpoints=None, order=None, codec=None, wait=10.0,
    timeout=10.0, rcvhwm=1000, recover=False, credit=None, ping_interval=1.0)``

    - with ``endpoints`` (a list, one per partition) the catalog is not used and ``order``
      (default TOTAL) and ``codec`` (default ``"msgpack"``) must describe the topic;
    - otherwise the topic is looked up in ``catalog`` (a :class:`~epochstream.catalog.Catalog`, a
      path, or ``None`` for the default), waiting up to ``wait`` seconds for it to appear.
      Partitions the catalog lists as closed contribute their final upper frontier to the filter
      and nothing else.
    - ``timeout``: seconds a live partition may stay silent (no data, progress or heartbeat)
      before :class:`~epochstream.errors.PublisherLost` is raised.
    - ``recover``: instead of raising :class:`~epochstream.errors.SubscriberLagged` (evicted) or
      :class:`~epochstream.errors.PublisherLost` for a publisher that restarted (new incarnation),
      re-join every partition with fresh snapshots and report a :class:`Gap` in the stream; no
      partial epoch and no epoch twice.
    - ``credit``: flow control — each publisher sends at most ``credit`` messages ahead of what
      this subscriber has read; it grants more as it reads. A slow but steady consumer then slows
      the publisher down instead of being evicted.
    - ``ping_interval``: seconds between pings to each publisher (a restarted publisher answers
      a ping with a ``rejoin`` notice, so restarts are noticed within about this time).

    Iterate :meth:`epochs` for complete :class:`~epochstream.protocol.Epoch` objects, or
    :meth:`events` for delivered data (decoded) and merged frontier changes as they arrive.
    Raises :class:`~epochstream.errors.SubscriberLagged` if a publisher evicted this subscriber,
    :class:`~epochstream.errors.TopicNotFound` for an unknown topic.
    """

    def __init__(self, topic: str, catalog=None, *, endpoints=None, order=None, codec: str | None = None,
                 wait: float = 10.0, timeout: float = 10.0, rcvhwm: int = 1000, recover: bool = False,
                 credit: int | None = None, ping_interval: float = 1.0,
                 context: zmq.Context | None = None):
        self.topic = topic
        self.timeout = float(timeout)
        self.recover = bool(recover)
        if credit is not None and (not isinstance(credit, int) or credit < 2):
            raise ValueError(f"credit must be an int >= 2 (messages), got {credit!r}")
        self.credit = credit
        self.ping_interval = float(ping_interval)
        self._rcvhwm = int(rcvhwm)
        self._wait = wait
        self._catalog = None
        self._static_endpoints = None
        self._catalog_incarnations: dict[int, str] = {}
        if endpoints is None:
            self._catalog = _resolve_catalog(catalog)
            info = self._catalog.lookup(topic, wait=wait)
            order, codec, n = info.order, info.codec, info.partitions
        else:
            self._static_endpoints = list(endpoints)
            if isinstance(order, str):
                order = by_name(order)
            order = order or TOTAL
            codec = codec or "msgpack"
            n = len(self._static_endpoints)
        self.order = order
        self.codec = wire.codec(codec)
        self.partitions = n
        self._ctx = context or zmq.Context.instance()
        self._check = getattr(order, "check", None)
        self._parked: list = []  # decoded (message, nbytes) outputs not yet handed out
        self._last_epoch = None
        self._closed = False
        self._pending_gap: Gap | None = None
        self._failure: EpochstreamError | None = None  # raised once the outputs before it are out
        self.id = uuid.uuid4().hex  # stable across re-connections; lets a publisher recognise us
        self.gaps: list[Gap] = []
        self.stats = collections.Counter()
        self._sockets: dict[zmq.Socket, int] = {}
        self._by_partition: dict[int, zmq.Socket] = {}
        self._assembler = EpochAssembler(self.order, self.codec.combine)
        self._join(floor=None, info=info if endpoints is None else None)

    # -- joining ---------------------------------------------------------------------------
    def _endpoints(self, info=None) -> tuple[list, dict]:
        """Current endpoints (``None`` for a closed partition) and closed partitions' uppers."""
        if self._static_endpoints is not None:
            return list(self._static_endpoints), {}
        if info is None:
            info = self._catalog.lookup(self.topic, wait=self._wait)
        by_index = {p.index: p for p in info.partition_info}
        endpoints, closed = [], {}
        self._catalog_incarnations = {}
        for i in range(self.partitions):
            p = by_index.get(i)
            if p is None:
                raise PublisherLost(f"topic {self.topic!r}: partition {i} has no publisher registered "
                                    f"after waiting {self._wait} s", partition=i)
            if p.state == "closed":
                closed[i] = tuple(p.upper)
                endpoints.append(None)
            elif p.state == "dead":
                raise PublisherLost(f"topic {self.topic!r}: the publisher of partition {i} "
                                    f"(pid {p.pid}) is dead", partition=i)
            elif p.state == "aborted":
                raise PublisherAborted(f"topic {self.topic!r}: the publisher of partition {i} "
                                       f"(pid {p.pid}) aborted; its open epochs never complete",
                                       partition=i)
            else:
                endpoints.append(p.endpoint)
                self._catalog_incarnations[i] = p.incarnation
        return endpoints, closed

    def _join(self, floor, info=None) -> None:
        endpoints, closed = self._endpoints(info)
        self._protocol = SubscriberProtocol(self.order, self.partitions, floor=floor)
        # filter verdicts per raw data header: valid for this join's protocol state only
        self._time_cache: dict[bytes, Any] = {}
        self._awaiting: dict[int, tuple] = {}  # aborted partition -> (incarnation, deadline, reason)
        self._poller = zmq.Poller()
        self._last_heard: dict[int, float] = {}
        self._last_ping = _time.monotonic()
        self._last_lookup = self._last_await_lookup = 0.0
        self._part_lower: dict[int, set] = {}
        self._incarnations: dict[int, str] = {}
        self._unacked: dict[int, int] = {}
        now = _time.monotonic()
        hb_ms = max(1, int(self.ping_interval * 1000))
        for i, ep in enumerate(endpoints):
            if ep is None:
                continue
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, self._rcvhwm)
            s.setsockopt(zmq.LINGER, 0)
            # ZMTP pings let the publisher see this subscriber is alive even while it reads
            # nothing. The ZMTP timeout on this side is one hour, in effect none: left unset,
            # libzmq would use the interval as the timeout, and a stalled reader never sees the
            # publisher's PONGs (they queue behind unread data), so it would drop its own
            # connection (libzmq 4.3.5 then aborts the process). A dead publisher is detected
            # by the application heartbeat and ``timeout`` instead.
            s.setsockopt(zmq.HEARTBEAT_IVL, hb_ms)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3_600_000)
            s.connect(ep)
            hello = {"topic": self.topic, "partition": i, "id": self.id}
            if self.credit is not None:
                hello["credit"] = self.credit
            s.send_multipart(wire.encode_control(wire.HELLO, **hello))
            self._sockets[s] = i
            self._by_partition[i] = s
            self._poller.register(s, zmq.POLLIN)
            self._last_heard[i] = now
            self._unacked[i] = 0
        for i, upper in closed.items():
            self._accept_snapshot(i, InitialFrontierSnapshot((), upper))

    def _rejoin(self, reason: str, partition: int) -> None:
        """Drop this join (pending epochs are incomplete), re-join every partition with fresh
        snapshots, and report a :class:`Gap` once they are in."""
        old = self._protocol
        since = old.lower if old.ready else (self._pending_gap.since if self._pending_gap else ())
        if old.ready:
            # Everything queued so far is a valid prefix of the old stream and stays. This marker
            # withdraws the old merged frontier for events() consumers; epochs() replaces its
            # epoch assembler here (pending, incomplete epochs are dropped; nbytes -1 marks it).
            self._parked.append((LowerFrontierUpdate(tuple((t, -1) for t in old.lower)), -1))
        for p in list(self._by_partition):
            self._retire_socket(p)
        if self._pending_gap is None:
            self._pending_gap = Gap(reason, partition, self._last_epoch, since, self.order)
        self.stats["rejoins"] += 1
        log.warning("topic %r: re-joining after %s on partition %s (last complete epoch %r)",
                    self.topic, reason, partition, self._last_epoch)
        self._join(floor=since)

    # -- queries ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once every partition's snapshot has arrived."""
        return self._protocol.ready

    @property
    def snapshots(self) -> dict:
        """``{partition: InitialFrontierSnapshot}`` as received."""
        return self._protocol.snapshots

    @property
    def incarnations(self) -> dict:
        """``{partition: incarnation id}`` of the publishers as announced in their snapshots."""
        return dict(self._incarnations)

    @property
    def lower(self) -> tuple:
        """The merged lower frontier (elements)."""
        return self._protocol.lower

    @property
    def filter(self) -> tuple:
        """The current filter's elements (empty once retired)."""
        return self._protocol.filter

    @property
    def finished(self) -> bool:
        """True once every partition's lower frontier is empty."""
        return self._protocol.finished

    # -- I/O -------------------------------------------------------------------------------
    def _snapshot_outputs(self, partition: int, snap: InitialFrontierSnapshot) -> list:
        self._part_lower[partition] = set(snap.lower)
        out = self._protocol.receive(partition, snap)
        if self._pending_gap is not None and self._protocol.ready:
            gap = self._pending_gap
            uppers = Antichain(dual(self.order))
            for snap in self._protocol.snapshots.values():
                uppers.extend(snap.upper)
            gap.through = uppers.elements
            gap.until = self._protocol.lower
            self._pending_gap = None
            self.gaps.append(gap)
            out = [gap, *out]
        if not snap.lower:
            self._retire_socket(partition)
        return out

    def _accept_snapshot(self, partition: int, snap: InitialFrontierSnapshot) -> None:
        self._queue(self._snapshot_outputs(partition, snap))

    def _queue(self, outputs) -> None:
        """Decode protocol outputs and append them, in order, to the output queue."""
        if outputs:
            self._parked.extend(self._decoded(m) for m in outputs)

    def _retire_socket(self, partition: int) -> None:
        s = self._by_partition.pop(partition, None)
        if s is None:
            return
        try:
            s.send_multipart(wire.encode_control(wire.BYE), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._poller.unregister(s)
        del self._sockets[s]
        s.close(100)
        self._last_heard.pop(partition, None)

    def _handle(self, partition: int, frames) -> list:
        """Process one multipart message; return protocol outputs (data still encoded)."""
        self.stats["messages"] += 1
        if self.credit is not None and frames[0] in _CREDITED:
            n = self._unacked.get(partition, 0) + 1
            if n >= self.credit // 2:
                s = self._by_partition.get(partition)
                if s is not None:
                    s.send_multipart(wire.encode_control(wire.CREDIT, messages=n))
                n = 0
            self._unacked[partition] = n
        if len(frames) == 3 and frames[0] == wire.DATA:
            # Hot path: the verdict per raw header bytes is cached while the filter is unchanged
            # (many messages share an epoch); the payload is decoded only if it passes.
            raw = frames[1]
            protocol = self._protocol
            hit = self._time_cache.get(raw)
            if hit is None or hit[2] != protocol.version:
                t = hit[0] if hit is not None else wire.decode_time(raw)
                if hit is None and self._check is not None:
                    t = self._check(t)
                ok = not protocol.ready or not protocol.filtering or protocol.passes(t)
                if len(self._time_cache) > 4096:
                    self._time_cache.clear()
                hit = self._time_cache[raw] = (t, ok, protocol.version)
            t, ok, _ = hit
            if not protocol.ready:
                return protocol.receive(partition, DataMessage(t, frames[2]))  # buffered
            if not ok:
                protocol.dropped += 1
                self.stats["dropped"] += 1
                return []
            return protocol.deliver(t, frames[2])
        msg = wire.decode(frames)
        if isinstance(msg, InitialFrontierSnapshot):
            meta = wire.decode_snapshot_meta(frames)
            self._incarnations[partition] = meta.get("incarnation")
            return self._snapshot_outputs(partition, msg)
        if isinstance(msg, LowerFrontierUpdate):
            pl = self._part_lower.setdefault(partition, set())
            for t, d in msg.updates:
                if d > 0:
                    pl.add(t)
                else:
                    pl.discard(t)
            out = self._protocol.receive(partition, msg)
            if not pl:
                self._retire_socket(partition)
            return out
        if isinstance(msg, wire.Notice):
            if msg.code == "lagged":
                if self.recover:
                    self._rejoin("lagged", partition)
                    return []
                raise SubscriberLagged(msg.message, partition=partition)
            if msg.code == "aborted":
                return self._aborted(partition, msg)
            if msg.code == "rejoin":
                if self.recover:
                    self._rejoin("restarted", partition)
                    return []
                raise PublisherLost(f"topic {self.topic!r}: the publisher of partition {partition} "
                                    f"no longer knows this subscriber (it restarted, or dropped "
                                    f"this connection): {msg.message}", partition=partition)
            raise ProtocolError(f"publisher of partition {partition} rejected this subscriber: {msg.message}")
        return []  # heartbeat: liveness only

    def _poll(self, timeout_s: float | None) -> list:
        """Wait up to ``timeout_s`` for messages; return outputs as ``(message, nbytes)``.
        A failure (lagged, lost, aborted, a protocol violation by a publisher) is raised only
        after everything that arrived before it was returned: see :attr:`_failure`."""
        if self._parked:
            out, self._parked = self._parked, []
            return out
        if self._failure is not None:
            self._raise_failure()
        try:
            self._read(timeout_s)
        except EpochstreamError as exc:
            self._failure = exc
        result, self._parked = self._parked, []
        if not result and self._failure is not None:
            self._raise_failure()
        return result

    def _raise_failure(self):
        exc = self._failure
        if isinstance(exc, SubscriberLagged) and exc.last_epoch is None and self._last_epoch is not None:
            # name the last epoch actually handed out, now that everything before it was
            exc = self._failure = SubscriberLagged(
                f"{exc}; last complete epoch delivered: {self._last_epoch!r}",
                partition=exc.partition, last_epoch=self._last_epoch)
        raise exc

    def _read(self, timeout_s: float | None) -> None:
        """One poll: read what arrived (outputs go to ``_parked``), ping, check liveness."""
        if not self._sockets:
            if self._awaiting:  # every socket retired, waiting for a new publisher
                _time.sleep(min(0.05, timeout_s if timeout_s is not None else 0.05))
                self._check_awaiting(_time.monotonic())
            return
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        events = self._poller.poll(ms)
        now = _time.monotonic()
        protocol = self._protocol
        for s, _ in events:
            partition = self._sockets.get(s)
            if partition is None:
                continue
            for _ in range(1000):
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._last_heard[partition] = now
                self._queue(self._handle(partition, frames))
                if self._protocol is not protocol or partition not in self._by_partition:
                    break  # re-joined (sockets replaced) or this partition finished
            if self._protocol is not protocol:
                break
        if now - self._last_ping >= self.ping_interval:
            self._last_ping = now
            for s in self._sockets:
                try:
                    s.send_multipart(wire.encode_control(wire.PING, id=self.id), zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        self._check_liveness(now)

    def _decoded(self, m):
        """Queue entry for a protocol output. Data stays encoded here and is decoded in
        :meth:`_outputs` when handed out: a burst of messages then never holds more than one
        decoded payload (millions of live records would make every GC pass crawl)."""
        if type(m) is DataMessage:
            n = len(m.data)
            self.stats["delivered"] += 1
            self.stats["bytes"] += n
            return m, n
        return m, 0

    def _catalog_partitions(self) -> dict:
        """``{index: PartitionInfo}`` from the catalog (``{}`` without one, or if unreadable)."""
        if self._catalog is None:
            return {}
        try:
            info = self._catalog.lookup(self.topic)
        except EpochstreamError:
            return {}
        return {p.index: p for p in info.partition_info}

    def _check_liveness(self, now: float) -> None:
        """Partitions silent for a few pings are looked up in the catalog (at most once per
        ping interval): one that closed or aborted before answering our hello is settled, a
        restarted one re-joined (``recover=True``); past ``timeout``: :class:`PublisherLost`."""
        suspect_after = min(self.timeout, 3 * self.ping_interval)
        suspects = [(p, now - h) for p, h in self._last_heard.items() if now - h > suspect_after]
        if self._awaiting:
            self._check_awaiting(now)
        if not suspects:
            return
        if now - self._last_lookup < self.ping_interval and all(t <= self.timeout for _, t in suspects):
            return
        self._last_lookup = now
        parts = self._catalog_partitions()
        for partition, silent in suspects:
            p = parts.get(partition)
            if p is not None and partition not in self._protocol.snapshots:
                if p.state == "closed":  # closed between our catalog lookup and our hello
                    self._retire_socket(partition)
                    self._accept_snapshot(partition, InitialFrontierSnapshot((), tuple(p.upper)))
                    continue
            if p is not None and p.state == "aborted" and p.incarnation == (
                    self._incarnations.get(partition) or self._catalog_incarnations.get(partition)):
                self._aborted(partition, None)  # its X aborted notice never reached us
                continue
            if self.recover and self._restarted(partition, p):
                self._rejoin("restarted", partition)
                return
            if silent > self.timeout:
                raise PublisherLost(f"topic {self.topic!r}: no message from partition {partition} "
                                    f"for {silent:.1f} s (timeout {self.timeout} s)",
                                    partition=partition)

    def _restarted(self, partition: int, p) -> bool:
        """True iff ``p`` (the catalog's entry for ``partition``) is a live publisher with
        another incarnation than the one this subscriber joined."""
        known = self._incarnations.get(partition) or self._catalog_incarnations.get(partition)
        return p is not None and p.state == "live" and known is not None and p.incarnation != known

    def _aborted(self, partition: int, notice) -> list:
        """A partition's publisher aborted (its ``X aborted`` notice, or the catalog says so).
        Without ``recover`` (or without a catalog to find a successor):
        :class:`PublisherAborted`. With it: wait up to ``timeout`` seconds for a new live
        incarnation in the catalog, then re-join and report a :class:`Gap`."""
        reason = notice.message if notice is not None else "the catalog marks it aborted"
        incarnation = ((notice.extra.get("incarnation") if notice is not None else None)
                       or self._incarnations.get(partition)
                       or self._catalog_incarnations.get(partition))
        self._retire_socket(partition)
        if not self.recover or self._catalog is None:
            raise PublisherAborted(f"topic {self.topic!r}: the publisher of partition {partition} "
                                   f"aborted; its open epochs never complete ({reason})",
                                   partition=partition, reason=reason)
        log.warning("topic %r: partition %s aborted (%s); waiting up to %s s for a new publisher",
                    self.topic, partition, reason, self.timeout)
        self._awaiting[partition] = (incarnation, _time.monotonic() + self.timeout, reason)
        return []

    def _check_awaiting(self, now: float) -> None:
        """Re-join once every aborted partition has a new live incarnation in the catalog;
        :class:`PublisherAborted` when one did not appear within ``timeout``."""
        if now - self._last_await_lookup < self.ping_interval / 4:
            return
        self._last_await_lookup = now
        parts = self._catalog_partitions()
        for partition, (incarnation, deadline, reason) in list(self._awaiting.items()):
            p = parts.get(partition)
            if p is not None and p.state == "live" and p.incarnation != incarnation:
                self._rejoin("aborted", partition)
                return
            if now > deadline:
                raise PublisherAborted(
                    f"topic {self.topic!r}: the publisher of partition {partition} aborted "
                    f"({reason}) and no new publisher appeared within {self.timeout} s",
                    partition=partition, reason=reason)

    def wait_ready(self, timeout: float | None = 10.0) -> bool:
        """Process messages until every partition's snapshot has arrived (data that arrives
        meanwhile is kept for :meth:`epochs`/:meth:`events`). Returns False on timeout (seconds)."""
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self._protocol.ready:
            left = None if deadline is None else deadline - _time.monotonic()
            if left is not None and left <= 0:
                return False
            got = self._poll(min(left, 0.1) if left is not None else 0.1)
            self._parked.extend(got)  # (evaluate _poll first: it swaps self._parked)
        return True

    def _outputs(self) -> Iterator:
        """Yield decoded outputs, and ``None`` after each idle poll (0.1 s); end when finished."""
        decode = self.codec.decode
        while True:
            got = self._poll(0.1)
            if got:
                for item in got:
                    m = item[0]
                    if type(m) is DataMessage:
                        item = (DataMessage(m.time, decode(m.data)), item[1])
                    yield item
            elif self._protocol.finished and not self._parked:
                return
            else:
                yield None

    def events(self, timeout: float | None = None) -> Iterator:
        """Yield, as they arrive, ``(DataMessage(time, decoded records), nbytes)`` for data that
        passed the filter, ``(LowerFrontierUpdate(changes), 0)`` for merged frontier changes and,
        with ``recover=True``, ``(Gap, 0)`` when the subscriber re-joined (the merged frontier
        is withdrawn before it and announced afresh after it). Ends when every partition
        finished. ``timeout``: seconds without any output before ``TimeoutError``."""
        last = _time.monotonic()
        for item in self._outputs():
            if item is not None:
                last = _time.monotonic()
                yield (item[0], 0) if item[1] < 0 else item
            elif timeout is not None and _time.monotonic() - last > timeout:
                raise TimeoutError(f"no message for {timeout} s from topic {self.topic!r}")

    def epochs(self, timeout: float | None = None) -> Iterator[Epoch]:
        """Yield complete :class:`~epochstream.protocol.Epoch` objects in an order consistent
        with the partial order; ``records`` is a list (msgpack) or ``pyarrow.Table`` (arrow);
        ``first_seen``/``released_at`` are ``time.time()`` readings. With ``recover=True`` a
        :class:`Gap` is yielded where the subscriber re-joined. Ends when every partition
        finished. ``timeout``: seconds without a new epoch before ``TimeoutError``."""
        last = _time.monotonic()
        for out in self._outputs():
            if out is None:
                if timeout is not None and _time.monotonic() - last > timeout:
                    raise TimeoutError(f"no complete epoch for {timeout} s from topic {self.topic!r}")
                continue
            item, nbytes = out
            kind = type(item)
            if kind is DataMessage:
                self._assembler.data(item, nbytes=nbytes, now=_time.time())
            elif kind is LowerFrontierUpdate:
                if nbytes < 0:  # re-join: incomplete epochs of the old join are dropped
                    self._assembler = EpochAssembler(self.order, self.codec.combine)
                    continue
                done = self._assembler.frontier_changed(item, now=_time.time())
                for epoch in done:
                    self._last_epoch = epoch.time
                    yield epoch
                if done:
                    last = _time.monotonic()
            elif kind is Gap:
                item.last_epoch = self._last_epoch  # what this iterator actually delivered
                yield item

    def close(self) -> None:
        """Say goodbye to every publisher (so it frees our state at once) and close sockets."""
        if self._closed:
            return
        self._closed = True
        for partition in list(self._by_partition):
            self._retire_socket(partition)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
