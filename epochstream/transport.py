"""Publisher and Subscriber over pyzmq (ROUTER ⇄ DEALER, one connection per partition).

:class:`Publisher` — one partition of a topic. Its background loop thread owns a ROUTER socket
and is the only place where subscribers are registered and messages are sent, so a new
subscriber's :class:`~epochstream.protocol.InitialFrontierSnapshot` is taken and the subscriber
registered in one step of the loop: every later message reaches it, no earlier one does (the
Strymon "new subscriber connects" step). The calling thread validates each call against its own
:class:`~epochstream.protocol.PublisherProtocol` (errors are raised right there, nothing is sent)
and hands the frames to the loop over an ``inproc`` pipe (it blocks when the loop is
``queue_hwm`` messages behind: back-pressure, never loss).

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
from .errors import (EpochstreamError, ProtocolError, PublisherLost, SubscriberLagged,
                     WireError)
from .order import TOTAL, by_name
from .protocol import (DataMessage, Epoch, EpochAssembler, InitialFrontierSnapshot,
                       LowerFrontierUpdate, PublisherProtocol, SubscriberProtocol)

__all__ = ["Publisher", "Subscriber"]

log = logging.getLogger("epochstream.transport")

_ids = itertools.count()

# loop command kinds (caller thread -> loop thread, over inproc)
_CMD_DATA = b"D"
_CMD_FRONTIER = b"F"
_CMD_SYNC = b"Y"
_CMD_STOP = b"Q"


class _Peer:
    """Loop-side state of one connected subscriber."""

    __slots__ = ("ident", "backlog", "backlog_bytes", "evicted", "notice", "joined", "sent")

    def __init__(self, ident: bytes, now: float):
        self.ident = ident
        self.backlog: collections.deque = collections.deque()
        self.backlog_bytes = 0
        self.evicted = False
        self.notice: list | None = None
        self.joined = now
        self.sent = 0


def _frames_nbytes(frames) -> int:
    return sum(len(f) for f in frames)


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

    Raises :class:`~epochstream.errors.ProtocolError` from :meth:`send`, :meth:`progress` and
    :meth:`advance_to` for invalid input (nothing is sent), ``zmq.ZMQError`` if the endpoint
    cannot be bound, :class:`~epochstream.errors.PartitionHeld` if a live publisher holds it.
    """

    def __init__(self, topic: str, partition: int = 0, *, order=TOTAL, codec: str = "msgpack",
                 endpoint: str = "tcp://127.0.0.1:*", catalog=None, partitions: int = 1,
                 schema: str | None = None, ingest: str | None = None,
                 heartbeat_interval: float = 1.0, sndhwm: int = 1000,
                 max_queue_messages: int = 100_000, max_queue_bytes: int = 256 << 20,
                 queue_hwm: int = 1000, context: zmq.Context | None = None):
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
        self.incarnation = uuid.uuid4().hex
        self._protocol = PublisherProtocol(order)
        self._capability = order.minimum
        self._lock = threading.Lock()
        self._closed = False
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

        addr = f"inproc://epochstream-pub-{os.getpid()}-{next(_ids)}"
        self._cmd_in = self._ctx.socket(zmq.PAIR)
        self._cmd_in.setsockopt(zmq.RCVHWM, queue_hwm)
        self._cmd_in.bind(addr)
        self._cmd = self._ctx.socket(zmq.PAIR)
        self._cmd.setsockopt(zmq.SNDHWM, queue_hwm)
        self._cmd.connect(addr)
        self._syncs: collections.deque = collections.deque()

        # loop-side state (touched only by the loop thread)
        self._peers: dict[bytes, _Peer] = {}
        self._loop_lower: dict = {order.minimum: True}
        from .frontier import Antichain
        from .order import dual
        self._loop_upper = Antichain(dual(order))
        self._last_broadcast = _time.monotonic()
        self.stats = collections.Counter()

        self._catalog = catalog
        if catalog is not None:
            try:
                catalog.create_topic(topic, order=order, codec=self.codec.name,
                                     partitions=partitions, schema=schema)
                self.incarnation = catalog.register_partition(
                    topic, partition, self.endpoint, ingest=ingest, incarnation=self.incarnation)
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
        if self._closed:
            raise ProtocolError(f"publisher {self.topic}/{self.partition} is closed")

    def send(self, time, records) -> None:
        """Publish ``records`` at ``time``: encoded with the topic's codec (a list of records for
        msgpack; a ``pyarrow.RecordBatch``/``Table``/list of dicts for arrow).

        Raises :class:`ProtocolError` if ``time`` has the wrong shape or no capability ``<= time``
        is held; :class:`WireError` if the codec cannot encode the records."""
        self.send_encoded(time, self.codec.encode(records))

    def send_encoded(self, time, payload) -> None:
        """Publish an already-encoded payload (bytes-like, in the topic's codec) at ``time``."""
        with self._lock:
            self._check_open()
            msg = self._protocol.data(time, None)
            self._cmd.send_multipart([_CMD_DATA, wire.encode_time(msg.time), payload], copy=False)
        self.stats["data_messages"] += 1

    def progress(self, updates) -> LowerFrontierUpdate | None:
        """Apply timely progress updates ``[(time, delta), ...]`` to the lower frontier and
        broadcast its net change. Returns the change, or ``None`` when the frontier did not move.
        Raises :class:`ProtocolError` for malformed updates (nothing applied)."""
        with self._lock:
            self._check_open()
            msg = self._protocol.progress(list(updates))
            if msg is not None:
                self._cmd.send_multipart([_CMD_FRONTIER, *wire.encode_frontier(msg)[1:]])
            return msg

    def advance_to(self, time) -> LowerFrontierUpdate | None:
        """Downgrade this publisher's input capability to ``time`` (timely
        ``InputHandle::advance_to``): every epoch ``< time`` may complete. The capability starts at
        ``order.minimum``. Raises :class:`ProtocolError` if ``time`` is not ``>=`` it."""
        with self._lock:
            self._check_open()
            check = getattr(self.order, "check", None)
            t = check(time) if check else time
            cap = self._capability
            if t == cap:
                return None
            if not self.order.le(cap, t):
                raise ProtocolError(f"advance_to({t!r}) would move the capability backwards from {cap!r}")
            msg = self._protocol.progress([(t, 1), (cap, -1)])
            self._capability = t
            if msg is not None:
                self._cmd.send_multipart([_CMD_FRONTIER, *wire.encode_frontier(msg)[1:]])
            return msg

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until the loop has handled every call made before (not until subscribers read
        it). Returns False on timeout (seconds)."""
        ev = threading.Event()
        with self._lock:
            if not self._thread.is_alive():
                return True
            self._syncs.append(ev)
            self._cmd.send(_CMD_SYNC)
        return ev.wait(timeout)

    def close(self, linger: float = 2.0) -> None:
        """Release every capability (the lower frontier becomes empty, so subscribers finish),
        deliver what is queued for up to ``linger`` seconds, stop the loop, and mark the
        partition closed in the catalog with its final upper frontier. Idempotent."""
        with self._lock:
            if self._closed:
                return
            msg = self._protocol.close()
            self._closed = True
            if msg is not None:
                self._cmd.send_multipart([_CMD_FRONTIER, *wire.encode_frontier(msg)[1:]])
        if self._catalog is not None:
            try:
                self._catalog.close_partition(self.topic, self.partition, self.incarnation,
                                              upper=list(self._protocol.upper))
            except Exception:  # the catalog may be gone; the stream itself is closed correctly
                log.exception("could not mark %s/%s closed in the catalog", self.topic, self.partition)
        with self._lock:
            self._cmd.send_multipart([_CMD_STOP, str(float(linger)).encode()])
        self._thread.join(linger + 5.0)
        self._close_sockets()

    def _close_sockets(self):
        for s in (getattr(self, "_cmd", None), getattr(self, "_cmd_in", None)):
            if s is not None:
                s.close(0)
        self._router.close(2000)

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Publisher({self.topic!r}, partition={self.partition}, endpoint={self.endpoint!r}, "
                f"lower={list(self.lower)!r}, upper={list(self.upper)!r})")

    # -- loop side -------------------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._cmd_in, zmq.POLLIN)
        stop_at = None
        try:
            while True:
                now = _time.monotonic()
                backlog = any(p.backlog or p.notice for p in self._peers.values())
                if stop_at is not None:
                    if not backlog or now >= stop_at:
                        return
                    timeout = 1
                elif backlog:
                    timeout = 1
                else:
                    due = self._last_broadcast + self.heartbeat_interval - now
                    timeout = max(1, int(due * 1000))
                events = dict(poller.poll(timeout))
                if self._router in events:
                    self._handle_peers()
                if self._cmd_in in events:
                    for _ in range(256):
                        try:
                            frames = self._cmd_in.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if self._handle_command(frames):
                            stop_at = _time.monotonic() + self._stop_linger
                            break
                if backlog:
                    self._drain_backlogs()
                if stop_at is None and _time.monotonic() - self._last_broadcast >= self.heartbeat_interval:
                    self._broadcast(wire.encode_heartbeat(list(self._loop_lower)))
        except Exception:  # a bug here must not pass silently
            log.exception("publisher loop %s/%s died", self.topic, self.partition)
            raise
        finally:
            while self._syncs:
                self._syncs.popleft().set()

    def _handle_command(self, frames) -> bool:
        kind = frames[0].bytes
        if kind == _CMD_DATA:
            header, payload = frames[1].bytes, frames[2]
            self._loop_upper.insert(wire.decode_time(header))
            self._broadcast([wire.DATA, header, payload])
        elif kind == _CMD_FRONTIER:
            header = frames[1].bytes
            for t, d in wire.decode([wire.FRONTIER, header]).updates:
                if d > 0:
                    self._loop_lower[t] = True
                else:
                    self._loop_lower.pop(t, None)
            self._broadcast([wire.FRONTIER, header])
        elif kind == _CMD_SYNC:
            self._syncs.popleft().set()
        elif kind == _CMD_STOP:
            self._stop_linger = float(frames[1].bytes)
            return True
        return False

    def _handle_peers(self) -> None:
        router = self._router
        for _ in range(256):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident, body = frames[0], frames[1:]
            try:
                kind, header = wire.decode_control(body)
            except WireError as exc:
                log.warning("%s/%s: bad message from subscriber %r: %s", self.topic, self.partition,
                            ident, exc)
                self.stats["bad_messages"] += 1
                self._send_direct(ident, wire.encode_notice("error", str(exc)))
                continue
            if kind == wire.HELLO:
                self._hello(ident, header)
            elif kind == wire.BYE:
                self._peers.pop(ident, None)
            # PING: nothing to do; ZMTP heartbeats keep the connection's liveness.

    def _hello(self, ident: bytes, header: dict) -> None:
        topic, partition = header.get("topic"), header.get("partition")
        if topic != self.topic or partition != self.partition:
            msg = (f"this publisher serves {self.topic!r} partition {self.partition}, "
                   f"not {topic!r} partition {partition!r}")
            log.warning("%s/%s: refused hello: %s", self.topic, self.partition, msg)
            self._send_direct(ident, wire.encode_notice("error", msg))
            return
        snap = InitialFrontierSnapshot(tuple(self._loop_lower), self._loop_upper.elements)
        frames = wire.encode_snapshot(
            snap, topic=self.topic, partition=self.partition, order=getattr(self.order, "name", ""),
            codec=self.codec.name, incarnation=self.incarnation, heartbeat=self.heartbeat_interval)
        self._peers.pop(ident, None)
        if self._send_direct(ident, frames):
            self._peers[ident] = _Peer(ident, _time.monotonic())
            self.stats["subscribers_joined"] += 1

    def _send_direct(self, ident: bytes, frames) -> bool:
        try:
            self._router.send_multipart([ident, *frames], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # Again (pipe full) or EHOSTUNREACH (gone)
            log.warning("%s/%s: could not send to %r: %s", self.topic, self.partition, ident, exc)
            return False

    def _broadcast(self, frames) -> None:
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
            if not peer.backlog:
                try:
                    router.send_multipart([peer.ident, *frames], zmq.NOBLOCK)
                    continue
                except zmq.Again:
                    pass
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        (gone := gone or []).append(peer.ident)
                        continue
                    raise
            peer.backlog.append(frames)
            peer.backlog_bytes += _frames_nbytes(frames)
            if (len(peer.backlog) > self.max_queue_messages
                    or peer.backlog_bytes > self.max_queue_bytes):
                self._evict(peer)
        if gone:
            for ident in gone:
                self._peers.pop(ident, None)
                self.stats["subscribers_lost"] += 1

    def _evict(self, peer: _Peer) -> None:
        queued, nbytes = len(peer.backlog), peer.backlog_bytes
        peer.backlog.clear()
        peer.backlog_bytes = 0
        peer.evicted = True
        message = (f"evicted from {self.topic!r} partition {self.partition}: {queued} messages / "
                   f"{nbytes} bytes queued beyond the socket's high-water mark "
                   f"(bounds {self.max_queue_messages} messages / {self.max_queue_bytes} bytes)")
        log.warning("%s", message)
        peer.notice = wire.encode_notice("lagged", message, partition=self.partition)
        self.stats["subscribers_evicted"] += 1

    def _drain_peer(self, peer: _Peer) -> bool:
        """Send what the peer's pipe takes from its backlog, then a pending notice. Returns
        True when the peer is finished with (notice delivered, or the connection is gone)."""
        router = self._router
        try:
            while peer.backlog:
                frames = peer.backlog[0]
                router.send_multipart([peer.ident, *frames], zmq.NOBLOCK)
                peer.backlog.popleft()
                peer.backlog_bytes -= _frames_nbytes(frames)
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


class Subscriber:
    """Subscribes to every partition of a topic and yields complete epochs (Strymon
    "Subscriber Logic" merged across partitions).

    ``Subscriber(topic, catalog=None, *, endpoints=None, order=None, codec=None, wait=10.0,
    timeout=10.0, rcvhwm=1000)``

    - with ``endpoints`` (a list, one per partition) the catalog is not used and ``order``
      (default TOTAL) and ``codec`` (default ``"msgpack"``) must describe the topic;
    - otherwise the topic is looked up in ``catalog`` (a :class:`~epochstream.catalog.Catalog`, a
      path, or ``None`` for the default), waiting up to ``wait`` seconds for it to appear.
      Partitions the catalog lists as closed contribute their final upper frontier to the filter
      and nothing else.
    - ``timeout``: seconds a live partition may stay silent (no data, progress or heartbeat)
      before :class:`~epochstream.errors.PublisherLost` is raised.

    Iterate :meth:`epochs` for complete :class:`~epochstream.protocol.Epoch` objects, or
    :meth:`events` for delivered data (decoded) and merged frontier changes as they arrive.
    Raises :class:`~epochstream.errors.SubscriberLagged` if a publisher evicted this subscriber,
    :class:`~epochstream.errors.TopicNotFound` for an unknown topic.
    """

    def __init__(self, topic: str, catalog=None, *, endpoints=None, order=None, codec: str | None = None,
                 wait: float = 10.0, timeout: float = 10.0, rcvhwm: int = 1000,
                 context: zmq.Context | None = None):
        self.topic = topic
        self.timeout = float(timeout)
        closed: dict[int, tuple] = {}
        self._catalog = None
        if endpoints is None:
            self._catalog = _resolve_catalog(catalog)
            info = self._catalog.lookup(topic, wait=wait)
            order = info.order
            codec = info.codec
            n = info.partitions
            by_index = {p.index: p for p in info.partition_info}
            endpoints = []
            for i in range(n):
                p = by_index.get(i)
                if p is None:
                    raise PublisherLost(f"topic {topic!r}: partition {i} has no publisher registered "
                                        f"after waiting {wait} s", partition=i)
                if p.state == "closed":
                    closed[i] = tuple(p.upper)
                    endpoints.append(None)
                elif p.state == "dead":
                    raise PublisherLost(f"topic {topic!r}: the publisher of partition {i} "
                                        f"(pid {p.pid}) is dead", partition=i)
                else:
                    endpoints.append(p.endpoint)
        else:
            endpoints = list(endpoints)
            if isinstance(order, str):
                order = by_name(order)
            order = order or TOTAL
            codec = codec or "msgpack"
        self.order = order
        self.codec = wire.codec(codec)
        self.partitions = len(endpoints)
        self._protocol = SubscriberProtocol(order, self.partitions)
        self._assembler = EpochAssembler(order, self.codec.combine)
        self._ctx = context or zmq.Context.instance()
        self._sockets: dict[zmq.Socket, int] = {}
        self._by_partition: dict[int, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._last_heard: dict[int, float] = {}
        self._part_lower: dict[int, set] = {}
        self._time_cache: dict[bytes, Any] = {}
        self._parked: list = []  # decoded (message, nbytes) outputs not yet handed out
        self._last_epoch = None
        self._closed = False
        self.stats = collections.Counter()
        now = _time.monotonic()
        hb_ms = 1000
        for i, ep in enumerate(endpoints):
            if ep is None:
                continue
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, int(rcvhwm))
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.HEARTBEAT_IVL, hb_ms)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * hb_ms)
            s.connect(ep)
            s.send_multipart(wire.encode_control(wire.HELLO, topic=topic, partition=i))
            self._sockets[s] = i
            self._by_partition[i] = s
            self._poller.register(s, zmq.POLLIN)
            self._last_heard[i] = now
        for i, upper in closed.items():
            self._accept_snapshot(i, InitialFrontierSnapshot((), upper))

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
    def _accept_snapshot(self, partition: int, snap: InitialFrontierSnapshot) -> None:
        self._part_lower[partition] = set(snap.lower)
        self._parked.extend(self._decoded(m) for m in self._protocol.receive(partition, snap))
        if not snap.lower:
            self._retire_socket(partition)

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

    def _decode_payload(self, message: DataMessage) -> tuple[DataMessage, int]:
        raw = message.data
        return DataMessage(message.time, self.codec.decode(raw)), len(raw)

    def _handle(self, partition: int, frames) -> list:
        """Process one multipart message; return protocol outputs (data still encoded)."""
        self.stats["messages"] += 1
        kind = frames[0]
        if kind == wire.DATA and len(frames) == 3:
            raw = frames[1]
            t = self._time_cache.get(raw)
            if t is None:
                t = wire.decode_time(raw)
                check = getattr(self.order, "check", None)
                if check is not None:
                    t = check(t)
                if len(self._time_cache) > 4096:
                    self._time_cache.clear()
                self._time_cache[raw] = t
            if self._protocol.ready and self._protocol._filter and not self._protocol.passes(t):
                self.stats["dropped"] += 1
                return []
            return self._protocol.receive(partition, DataMessage(t, frames[2]))
        msg = wire.decode(frames)
        if isinstance(msg, InitialFrontierSnapshot):
            self._part_lower[partition] = set(msg.lower)
            out = self._protocol.receive(partition, msg)
            if not msg.lower:
                self._retire_socket(partition)
            return out
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
                raise SubscriberLagged(f"{msg.message}; last complete epoch delivered: {self._last_epoch!r}",
                                       partition=partition, last_epoch=self._last_epoch)
            raise ProtocolError(f"publisher of partition {partition} rejected this subscriber: {msg.message}")
        return []  # heartbeat: liveness only

    def _poll(self, timeout_s: float | None) -> list:
        """Wait up to ``timeout_s`` for messages; return protocol outputs (data decoded)."""
        if self._parked:
            out, self._parked = self._parked, []
            return out
        if not self._sockets:
            return []
        out = []
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        events = self._poller.poll(ms)
        now = _time.monotonic()
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
                out.extend(self._handle(partition, frames))
                if partition not in self._by_partition:
                    break
        self._check_liveness(now)
        return [self._decoded(m) for m in out]

    def _decoded(self, m):
        if type(m) is DataMessage:
            decoded, nbytes = self._decode_payload(m)
            self.stats["delivered"] += 1
            self.stats["bytes"] += nbytes
            return decoded, nbytes
        return m, 0

    def _check_liveness(self, now: float) -> None:
        for partition, heard in list(self._last_heard.items()):
            if now - heard <= self.timeout:
                continue
            if partition not in self._protocol.snapshots and self._catalog is not None:
                # The publisher may have closed between our catalog lookup and our hello.
                try:
                    info = self._catalog.lookup(self.topic)
                    p = next((x for x in info.partition_info if x.index == partition), None)
                except EpochstreamError:
                    p = None
                if p is not None and p.state == "closed":
                    self._retire_socket(partition)
                    self._accept_snapshot(partition, InitialFrontierSnapshot((), tuple(p.upper)))
                    continue
            raise PublisherLost(f"topic {self.topic!r}: no message from partition {partition} "
                                f"for {now - heard:.1f} s (timeout {self.timeout} s)",
                                partition=partition)

    def wait_ready(self, timeout: float | None = 10.0) -> bool:
        """Process messages until every partition's snapshot has arrived (data that arrives
        meanwhile is kept for :meth:`epochs`/:meth:`events`). Returns False on timeout (seconds)."""
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self._protocol.ready:
            left = None if deadline is None else deadline - _time.monotonic()
            if left is not None and left <= 0:
                return False
            self._parked.extend(self._poll(min(left, 0.1) if left is not None else 0.1))
        return True

    def _outputs(self) -> Iterator:
        """Yield decoded outputs, and ``None`` after each idle poll (0.1 s); end when finished."""
        while True:
            got = self._poll(0.1)
            if got:
                yield from got
            elif self._protocol.finished:
                return
            else:
                yield None

    def events(self, timeout: float | None = None) -> Iterator:
        """Yield, as they arrive, ``(DataMessage(time, decoded records), nbytes)`` for data that
        passed the filter and ``(LowerFrontierUpdate(changes), 0)`` for merged frontier changes.
        Ends when every partition finished. ``timeout``: seconds without any output before
        ``TimeoutError``."""
        last = _time.monotonic()
        for item in self._outputs():
            if item is not None:
                last = _time.monotonic()
                yield item
            elif timeout is not None and _time.monotonic() - last > timeout:
                raise TimeoutError(f"no message for {timeout} s from topic {self.topic!r}")

    def epochs(self, timeout: float | None = None) -> Iterator[Epoch]:
        """Yield complete :class:`~epochstream.protocol.Epoch` objects in an order consistent
        with the partial order; ``records`` is a list (msgpack) or ``pyarrow.Table`` (arrow);
        ``first_seen``/``released_at`` are ``time.time()`` readings. Ends when every partition
        finished. ``timeout``: seconds without a new epoch before ``TimeoutError``."""
        asm = self._assembler
        last = _time.monotonic()
        for out in self._outputs():
            if out is None:
                if timeout is not None and _time.monotonic() - last > timeout:
                    raise TimeoutError(f"no complete epoch for {timeout} s from topic {self.topic!r}")
                continue
            item, nbytes = out
            if type(item) is DataMessage:
                asm.data(item, nbytes=nbytes, now=_time.time())
            else:
                done = asm.frontier_changed(item, now=_time.time())
                for epoch in done:
                    self._last_epoch = epoch.time
                    yield epoch
                if done:
                    last = _time.monotonic()

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
