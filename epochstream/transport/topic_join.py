"""A subscriber's join of every partition of a topic: connect, receive, merge (Strymon
"Subscriber Logic"), re-join.

:class:`TopicJoin` is composed into the :class:`~epochstream.transport.subscriber.Subscriber`
and holds its own state: the links to the publishers (:class:`~.links.PartitionLinks`), the
merged protocol state of the current join (:class:`~epochstream.protocol.SubscriberProtocol`,
replaced by a re-join), the liveness policy, the recovery decisions (:class:`~.recovery.Recovery`)
and the events read but not handed out yet, with the failure to raise once they are out. It
inserts the history fill's epochs (:class:`~.fill.HistoryFill`) ahead of the frontier changes
that complete them. Data payloads stay encoded here; the subscriber decodes what it hands out.
The hot path is :meth:`TopicJoin.poll` → ``_read`` → ``_drain`` → ``_handle`` → ``_data`` (the
filter verdict cached per raw header: most data messages cost one dict lookup)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time as _time
import weakref
from typing import Any

import zmq

from .. import wire
from ..catalog import Catalog, TopicInfo
from ..errors import (EpochstreamError, NotAuthorized, ProtocolError, PublisherLost,
                      SubscriberLagged)
from ..events import DataMessage, InitialFrontierSnapshot, LowerFrontierUpdate
from ..frontier import apply_changes
from ..protocol import SubscriberProtocol
from ..security import NOT_AUTHORISED, Security, checked
from .durable import DurableCursor
from .filtering import FilterSession
from .fill import HistoryFill
from .links import PartitionLinks
from .liveness import Liveness
from .discovery import await_one_run, partition_endpoints, server_keys
from .recovery import CLOSED, REJOIN, Recovery
from .release import Release

__all__ = ["TopicJoin", "JoinSettings", "check_options", "FETCH_GRACE_S"]

log = logging.getLogger("epochstream.transport")

# message kinds (frame 0's first two bytes) that spend flow-control credit (the stream proper;
# not S, H or X)
_CREDITED = frozenset((wire.DATA, wire.DATA2, wire.FRONTIER))

#: seconds added to two heartbeat intervals before a fetch gives a silent partition up
FETCH_GRACE_S = 0.5

# messages read from one socket per poll: more makes the batch handed out bigger (and costlier
# per message: a probe measured ~7 µs/message more at 1,000 than at 64-128)
_DRAIN = 128


@dataclasses.dataclass(frozen=True)
class JoinSettings:
    """How a subscriber joins (the :class:`~epochstream.transport.subscriber.Subscriber`'s
    options of the same names; seconds for ``timeout``, ``ping_interval``, ``wait``;
    messages for ``rcvhwm``; ``credit`` in ``credit_unit``)."""

    topic: str
    order: Any
    partitions: int
    id: str
    timeout: float
    recover: bool
    ping_interval: float
    wait: float
    rcvhwm: int = 1000
    credit: int | None = None
    credit_unit: str = "messages"
    security: Security | None = None
    #: the newest data-message version to offer (docs/protocol.md §2.2): 2, or 1 to ask
    #: every publisher for version 1
    wire: int = 2

    def __post_init__(self):
        if type(self.wire) is not int or self.wire not in (1, 2):
            raise ValueError(f"wire_version must be 1 or 2, got {self.wire!r}")


class TopicJoin:
    """The join of every partition of ``settings.topic``: with ``catalog`` (the partitions'
    endpoints, incarnations and keys come from it), or ``endpoints`` (one per partition, no
    catalog). Shares with its subscriber the ``filters`` session, the history ``fill``, the
    ``durable`` cursor (or ``None``), the ``release`` (the last epoch handed out), ``stats``
    and the list of ``gaps``. :meth:`join` starts it (again on a re-join); :meth:`poll` reads."""

    def __init__(self, settings: JoinSettings, catalog: Catalog | None, endpoints: list | None,
                 ctx: zmq.Context, *, filters: FilterSession, fill: HistoryFill,
                 durable: DurableCursor | None, release: Release,
                 stats: collections.Counter, gaps: list):
        s = settings
        self.topic, self.order, self.partitions, self.id = s.topic, s.order, s.partitions, s.id
        self.recover, self.timeout, self._wait = s.recover, s.timeout, s.wait
        self.credit, self.credit_unit, self.security = s.credit, s.credit_unit, s.security
        self._catalog, self._endpoints_given = catalog, endpoints
        self._filters, self.fill, self._durable, self._release = filters, fill, durable, release
        self.stats, self.gaps = stats, gaps
        self._check = getattr(s.order, "check", None)
        self.wire = s.wire
        self._decode2 = wire.decoder_for(s.order)
        self.links = PartitionLinks(ctx, rcvhwm=s.rcvhwm, ping_interval=s.ping_interval,
                                    security=s.security, credit=s.credit)
        self.liveness = Liveness(s.timeout, s.ping_interval)
        self._recovery = Recovery(s.topic, s.order, catalog, self.liveness, recover=s.recover,
                                  timeout=s.timeout)
        self.parked: list = []  # events not yet handed out (data still encoded)
        self._delivered = self._delivered_bytes = 0  # by _data since the last poll's count
        self.failure: EpochstreamError | None = None  # raised once the events before it are out
        self.position = None  # where this join starts (None: latest)
        self.protocol = SubscriberProtocol(s.order, s.partitions)  # (replaced by join())
        self.incarnations: dict[int, str] = {}
        self.heartbeats: dict[int, float] = {}  # publishers' heartbeat intervals (s)
        fill.retire = _weak(self.retire)  # a finished partition the fill kept open

    def join(self, as_of, info: TopicInfo | None = None) -> None:
        """Join every partition (afresh, on a re-join) at ``as_of`` (data not at or beyond it
        is dropped; ``None``: latest)."""
        if self._endpoints_given is not None:
            endpoints, closed, self._catalog_incarnations = list(self._endpoints_given), {}, {}
        else:
            if info is None:
                info = self._catalog.lookup(self.topic, wait=self._wait)
            info = await_one_run(self._catalog, info, self._wait)  # a run change under way
            endpoints, closed, self._catalog_incarnations = partition_endpoints(info, self._wait)
            for i in self._filters.pruned(info):  # key-partitioned: only where our keys live
                endpoints[i] = None
                closed[i] = ()
        keys = server_keys(self.topic, self.security, info, endpoints)
        self.protocol = SubscriberProtocol(self.order, self.partitions, as_of=as_of)
        self._endpoints = self.fill.endpoints = \
            {i: ep for i, ep in enumerate(endpoints) if ep is not None}
        # filter verdicts per raw data header: valid for this join's protocol state only
        self._time_cache: dict[bytes, Any] = {}
        self._part_lower: dict[int, dict] = {}
        self.incarnations: dict[int, str] = {}
        self.heartbeats: dict[int, float] = {}  # publishers' heartbeat intervals (s), for fetch()
        self.liveness.join(self._endpoints, _time.monotonic())
        for i, endpoint in self._endpoints.items():
            self.links.connect(i, endpoint, self._hello(i), keys.get(i))
        for i, upper in closed.items():
            self._queue(self._snapshot(i, InitialFrontierSnapshot((), upper)))

    def _hello(self, partition: int) -> dict:
        """The ``h`` message's fields for ``partition`` (docs/protocol.md §4)."""
        hello = {"topic": self.topic, "partition": partition, "id": self.id}
        if self.credit is not None:
            hello["credit"] = self.credit
            if self.credit_unit == "epochs":
                hello["credit_unit"] = "epochs"
        if self._filters.program is not None:
            hello["filter"] = self._filters.program.to_wire()
        if self.wire >= 2:  # (a publisher that does not know the field ignores it: version 1)
            hello["wire"] = [v for v in wire.WIRE_VERSIONS if v <= self.wire]
        return hello

    def _joined_incarnation(self, partition: int) -> str | None:
        return self.incarnations.get(partition) or self._catalog_incarnations.get(partition)

    def _rejoin(self, reason: str, partition: int) -> None:
        """Drop this join (its pending epochs are incomplete), re-join every partition with
        fresh snapshots; the gap is reported (or filled from history) once they are all in
        (transport/recovery.py)."""
        self.fill.join = None  # the old join's fill: the new join plans its own
        since = self._recovery.rejoin_as_of(reason, partition, self.protocol,
                                            self.position)
        for p in list(self.links.live()):
            self.retire(p)
        self.stats["rejoins"] += 1
        log.warning("topic %r: re-joining after %s on partition %s (last complete epoch %r)",
                    self.topic, reason, partition, self._release.last_epoch)
        self.join(as_of=since)

    def _settle(self, now: float) -> None:
        """Carry out what recovery decides about silent or changed partitions."""
        for action in self._recovery.check(now, self.protocol.snapshots,
                                           self._joined_incarnation):
            if action[0] == REJOIN:
                self._rejoin(action[1], action[2])
                return
            self.retire(action[1])
            if action[0] == CLOSED:  # closed between our catalog lookup and our hello
                self._queue(self._snapshot(action[1], InitialFrontierSnapshot((), action[2])))

    def _snapshot(self, partition: int, snap: InitialFrontierSnapshot) -> list:
        self._part_lower[partition] = dict.fromkeys(snap.lower, True)
        protocol = self.protocol
        was_ready = protocol.ready
        out = protocol.receive(partition, snap)
        if protocol.ready and self._recovery.pending_gap is not None:  # a re-join is complete
            event, position = self._recovery.rejoined(protocol, self.fill,
                                                      self._durable is not None,
                                                      self._release.last_epoch)
            if position is not None:  # history fills it
                self.position = position
                self.stats["rejoins_filled"] += 1
            else:
                self.gaps.append(event)
            out = [event, *out]
        elif protocol.ready and not was_ready:
            out = self._ready_history(out)
        if not snap.lower:
            self.retire(partition)
        return out

    def _ready_history(self, out: list) -> list:
        """The first join became ready (``out``: the protocol's outputs so far): resolve a
        durable ``"latest"`` start, and plan the history fill of a join at a position."""
        durable = self._durable
        if durable is not None and durable.resolve_at_ready:
            self.position = durable.resolve_latest(self.protocol.lower)
        position = self.position
        if position is None:
            return out
        if not self.fill.plan(position, self.protocol.snapshots):
            created = durable is not None and durable.created
            if durable is not None:
                durable.refused = created
            raise self.fill.unavailable(position, created=created)
        if durable is not None:
            durable.created = False  # its start is served: it stays, whatever happens next
        return out

    def _queue(self, outputs: list) -> None:
        """Append protocol outputs, in order, to the events not yet handed out (with a history
        fill running: the epochs it completes, ahead of each frontier change)."""
        if self.fill.join is not None and self.protocol.ready:
            outputs = self.fill.insert(outputs, self.protocol.lower)
        stats = self.stats
        for m in outputs:
            if type(m) is DataMessage:
                stats["delivered"] += 1
                stats["bytes"] += m.nbytes
        self.parked.extend(outputs)

    def retire(self, partition: int, *, finished: bool = False) -> None:
        if finished and self.fill.defer_retire(partition):
            self.liveness.forget(partition)  # its goodbye waits for the history fill
            return
        if self.links.retire(partition):
            self.liveness.forget(partition)

    def _handle(self, partition: int, frames: list) -> list:
        """Process one multipart message; return protocol outputs (data still encoded), or
        put a data message straight into :attr:`parked` (see :meth:`_data`)."""
        kind = frames[0][:2]
        if type(kind) is not bytes:  # a memoryview of a big frame (sockets.receive_from)
            kind = bytes(kind)
        if self.credit is not None and (kind == wire.FRONTIER if self.credit_unit == "epochs"
                                        else kind in _CREDITED):
            self.links.spend_credit(partition)
        if kind == wire.DATA2:  # one frame: one unpack_from, the payload a memoryview of it
            t, payload = self._decode2(frames)
            return self._data(partition, t, payload, None)
        if len(frames) == 3 and frames[0] == wire.DATA:
            raw = frames[1]  # the cache key: bytes (a big one arrives as a memoryview)
            raw = raw if type(raw) is bytes else bytes(raw)
            return self._data(partition, raw, frames[2], raw)
        msg = wire.decode(frames)
        if isinstance(msg, InitialFrontierSnapshot):
            meta = wire.decode_snapshot_meta(frames)
            self.incarnations[partition] = meta.get("incarnation")
            self.heartbeats[partition] = meta.get("heartbeat")
            self._filters.snapshot(partition, msg, meta, self.protocol)
            return self._snapshot(partition, msg)
        if isinstance(msg, LowerFrontierUpdate):
            pl = self._part_lower.setdefault(partition, {})
            apply_changes(pl, msg.updates)
            out = self.protocol.receive(partition, msg)
            if not pl:
                self.retire(partition, finished=True)
            return out
        if isinstance(msg, wire.Notice):
            return self._notice(partition, msg)
        return []  # heartbeat: liveness only (never applied: it may overtake queued updates)

    def _data(self, partition: int, key, payload, raw: bytes | None) -> list:
        """Hot path: the filter verdict is cached for this join per ``key`` (many messages
        share an epoch) — the raw msgpack header ``raw`` of a v1 message, the time a v2 header
        decoded to (``raw`` ``None``); the payload is decoded only when handed out."""
        protocol = self.protocol
        hit = self._time_cache.get(key)
        if hit is None or hit[2] != protocol.version:
            t = hit[0] if hit is not None else key if raw is None else wire.decode_time(raw)
            if hit is None:
                if self._check is not None:
                    t = self._check(t)
                self._filters.data_at(t)  # times data arrived for (a filter change's bound)
            ok = not protocol.ready or not protocol.filtering or protocol.passes(t)
            if len(self._time_cache) > 4096:
                self._time_cache.clear()
            hit = self._time_cache[key] = (t, ok, protocol.version)
        t, ok, _ = hit
        if not protocol.ready:
            return protocol.receive(partition, DataMessage(t, payload, len(payload)))  # buffered
        if not ok:
            protocol.dropped += 1
            self.stats["dropped"] += 1
            return []
        n = len(payload)
        if self.fill.join is not None:  # a history fill interleaves its epochs: see _queue
            return protocol.deliver(t, payload, n)
        m = protocol.deliver_message(t, payload, n)
        self._delivered += 1  # what _queue counts for a DataMessage, added to stats per poll
        self._delivered_bytes += n
        self.parked.append(m)
        return []

    def _notice(self, partition: int, msg: wire.Notice) -> list:
        if msg.code == "filter":
            self._filters.acked(partition, msg, self._check)
            return []
        if msg.code == "lagged":
            if self.recover:
                self._rejoin("lagged", partition)
                return []
            raise SubscriberLagged(msg.message, partition=partition)
        if msg.code == "aborted":
            incarnation = self._joined_incarnation(partition)
            self.retire(partition)
            self._recovery.aborted(partition, msg, incarnation)
            return []
        if msg.code == "rejoin":
            if self.recover:
                self._rejoin("restarted", partition)
                return []
            raise PublisherLost(f"topic {self.topic!r}: the publisher of partition {partition} "
                                f"no longer knows this subscriber (it restarted, or dropped "
                                f"this connection): {msg.message}", partition=partition)
        if msg.extra.get("reason") == NOT_AUTHORISED:  # a secured publisher refused us
            raise NotAuthorized(f"topic {self.topic!r}: the publisher of partition {partition} "
                                f"refused this subscriber: {msg.message}", topic=self.topic,
                                partition=partition, principal=str(msg.extra.get("principal", "")))
        raise ProtocolError(f"publisher of partition {partition} rejected this subscriber: {msg.message}")

    def poll(self, timeout_s: float | None) -> list:
        """Wait up to ``timeout_s`` seconds for messages; return events (data still encoded).
        A failure (lagged, lost, aborted, a protocol violation by a publisher) is raised only
        after everything that arrived before it was returned."""
        if self.parked:
            out, self.parked = self.parked, []
            return out
        if self.failure is not None:
            self._raise_failure()
        try:
            self._read(timeout_s)
        except EpochstreamError as exc:
            self.failure = exc
        result, self.parked = self.parked, []
        if not result and self.failure is not None:
            self._raise_failure()
        return result

    def _raise_failure(self):
        exc = self.failure
        if isinstance(exc, SubscriberLagged) and exc.last_epoch is None and self._release.last_epoch is not None:
            # name the last epoch actually handed out, now that everything before it was
            exc = self.failure = SubscriberLagged(
                f"{exc}; last complete epoch delivered: {self._release.last_epoch!r}",
                partition=exc.partition, last_epoch=self._release.last_epoch)
        raise exc

    def _read(self, timeout_s: float | None) -> None:
        """One poll: read what arrived (outputs go to ``_parked``), ping, check liveness."""
        with self.links.lock:  # (retire_all, from a closing thread, waits for the pass)
            self._read_pass(timeout_s)

    def _read_pass(self, timeout_s: float | None) -> None:
        liveness, links = self.liveness, self.links
        if links.closed:  # (Subscriber.close() from another thread while this one iterates)
            raise ValueError(f"topic {self.topic!r}: the subscriber was closed")
        if not links:
            if liveness.awaiting:  # every socket retired, waiting for a new publisher
                _time.sleep(min(0.05, timeout_s if timeout_s is not None else 0.05))
                action = self._recovery.check_awaiting(_time.monotonic())
                if action is not None:
                    self._rejoin(action[1], action[2])
            return
        events = links.poll(None if timeout_s is None else max(0, int(timeout_s * 1000)))
        now = _time.monotonic()
        received = [0]
        try:
            self._drain(events, now, received)
        finally:  # counted per poll, not per message (a Counter's += is ~0.1 µs)
            stats = self.stats
            stats["messages"] += received[0]
            if self._delivered:
                stats["delivered"] += self._delivered
                stats["bytes"] += self._delivered_bytes
                self._delivered = self._delivered_bytes = 0
        if liveness.ping_due(now):
            links.ping(wire.encode_control(wire.PING, id=self.id))
        self._settle(now)

    def _drain(self, events, now: float, received: list) -> None:
        """Read what the poll found (``_DRAIN`` messages a socket at most) into received[0]."""
        links, protocol, settled = self.links, self.protocol, self.links.unsettled.pop
        handle, queue, heard, live = self._handle, self._queue, self.liveness.heard, links.by_partition
        n = 0
        try:
            for s in events:
                partition = links.partition_of.get(s)
                if partition is None:
                    continue
                receive = links.receivers[s]
                for _ in range(_DRAIN):
                    try:
                        frames = receive()
                    except zmq.Again:
                        settled(s, None)  # its zmq.FD signals the next message
                        break
                    n += 1
                    heard(partition, now)
                    out = handle(partition, frames)
                    if out:
                        queue(out)
                    if self.protocol is not protocol or partition not in live:
                        break  # re-joined (sockets replaced) or this partition finished
                if self.protocol is not protocol:
                    break
        finally:
            received[0] = n

    def wait_ready(self, timeout: float | None = 10.0) -> bool:
        """Process messages until every partition's snapshot has arrived (data that arrives
        meanwhile is kept for :meth:`epochs`/:meth:`events`). Returns False on timeout (seconds;
        0: read what has arrived, without waiting); raises the failure that prevents it (e.g.
        the hello was refused)."""
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self.protocol.ready:
            left = None if deadline is None else max(0.0, deadline - _time.monotonic())
            self.pump(min(left, 0.1) if left is not None else 0.1)
            if left is not None and left <= 0 and not self.protocol.ready:
                return False
        return True

    def pump(self, timeout_s: float) -> None:
        """Read for up to ``timeout_s`` seconds even while events wait to be handed out (they
        stay in ``_parked``, in order); a failure is raised now, and again by the iterators
        once the events before it are out."""
        if self.failure is not None:
            raise self.failure
        try:
            self._read(timeout_s)
        except EpochstreamError as exc:
            self.failure = exc
            raise

    def check_heartbeats(self, read_at: float) -> None:
        """After a fetch's poll that read the sockets (at ``read_at``): a partition silent for
        more than two heartbeat intervals of its publisher (announced in its snapshot) plus
        :data:`FETCH_GRACE_S` is lost (the failure is kept; the next poll raises it)."""
        if self.failure is not None:
            return
        lost = self.liveness.missed_heartbeats(read_at, self.heartbeats, FETCH_GRACE_S)
        if lost is not None:
            partition, silent, hb = lost
            self.failure = PublisherLost(
                f"topic {self.topic!r}: no message from partition {partition} for "
                f"{silent:.2f} s during a fetch: two heartbeats missed (its publisher sends "
                f"one every {hb} s when idle)", partition=partition)

    def retire_all(self) -> None:
        """Closing: say goodbye to every live partition, close its link and the links' wait (a
        thread iterating meanwhile gets ``ValueError`` at its next pass)."""
        links = self.links
        links.closed = True
        links.interrupt()  # a pass waiting in another thread ends now, and gives up the lock
        with links.lock:
            for partition in list(links.live()):
                self.retire(partition)
            links.close()


def _weak(method):
    """``method`` (bound) called through a weak reference: the part holding it keeps no cycle
    back to its owner (a dropped subscriber is then closed at once, not by the garbage
    collector at any moment)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        m = ref()
        if m is not None:
            m(*args, **kwargs)
    return call


def check_options(security, endpoints) -> Security | None:
    """A subscriber's ``security`` (``None`` when off), checked against its ``endpoints``
    (``TypeError``/``ValueError`` naming the offender)."""
    security = checked(security, "client")
    if security is not None and endpoints is not None and security.server_public is None:
        raise ValueError("a subscriber with endpoints= has no catalog to find the "
                         "publishers' keys in: pass Security.curve(server_public=...)")
    return security
