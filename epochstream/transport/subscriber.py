"""The subscriber of a topic: one DEALER per partition, merged by the pure
:class:`~epochstream.protocol.SubscriberProtocol` (Strymon "Subscriber Logic"), complete epochs
released by an :class:`~epochstream.protocol.EpochAssembler`, liveness decided by the pure
:class:`~epochstream.transport.liveness.Liveness` policy."""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time as _time
import uuid
from typing import Any, Iterator

import zmq

from .. import wire
from ..catalog import Catalog, TopicInfo
from ..errors import (EpochstreamError, NotAuthorized, ProtocolError, PublisherLost,
                      SubscriberLagged)
from ..events import (DataMessage, Epoch, FetchResult, Gap, InitialFrontierSnapshot,
                      LowerFrontierUpdate)
from ..filters import Filter
from ..frontier import Antichain, apply_changes
from ..order import TOTAL, by_name, dual
from ..position import resolve_position
from ..protocol import EpochAssembler, SubscriberProtocol
from ..security import NOT_AUTHORISED, Security
from .liveness import Liveness
from .membership import await_live, await_one_run, partition_endpoints, resolve_catalog
from .filtering import FilterSession
from .stream import EpochStream
from .recovery import Recovery
from .resume import HistoryBatch, Rejoined, Resume
from .links import PartitionLinks

__all__ = ["Subscriber", "pop_event"]

log = logging.getLogger("epochstream.transport")

# message kinds that spend flow-control credit (the stream proper; not S, H or X)
_CREDITED = frozenset((wire.DATA, wire.FRONTIER))
_GENERATOR = type(x for x in ())

#: seconds added to two heartbeat intervals before a fetch gives a silent partition up
FETCH_GRACE_S = 0.5

# messages read from one socket per poll: more makes the batch handed out bigger (and costlier
# per message: a probe measured ~7 µs/message more at 1,000 than at 64-128)
_DRAIN = 128


class Subscriber(Recovery, Resume):
    """Subscribes to every partition of a topic and yields complete epochs (Strymon
    "Subscriber Logic" merged across partitions).

    ``Subscriber(topic, catalog=None, *, endpoints=None, order=None, codec=None, wait=10.0,
    timeout=10.0, rcvhwm=1000, recover=False, credit=None, ping_interval=1.0, start="latest",
    durable=None, takeover=False)``

    - with ``endpoints`` (a list, one per partition) the catalog is not used and ``order``
      (default TOTAL) and ``codec`` (default ``"msgpack"``) must describe the topic;
    - otherwise the topic is looked up in ``catalog`` (a :class:`~epochstream.catalog.Catalog`, a
      path, or ``None`` for the default), waiting up to ``wait`` seconds for it to appear.
      Partitions the catalog lists as closed contribute their final upper frontier to the filter
      and nothing else. With ``start="latest"`` (and no ``durable``), a topic whose every
      partition has ended (an earlier run closed it, or its publishers aborted or died) is
      waited on for up to ``wait`` seconds until new publishers replace them; if none does and
      every partition is closed, :class:`~epochstream.errors.TopicClosed` is raised (it would
      receive nothing; ``start="earliest"`` replays what the topic retains).
    - ``timeout``: seconds a live partition may stay silent (no data, progress or heartbeat)
      before :class:`~epochstream.errors.PublisherLost` is raised.
    - ``recover``: instead of raising :class:`~epochstream.errors.SubscriberLagged` (evicted),
      :class:`~epochstream.errors.PublisherLost` for a publisher that restarted (new
      incarnation) or :class:`~epochstream.errors.PublisherAborted` (when a new incarnation
      appears within ``timeout``), re-join every partition with fresh snapshots and report a
      :class:`~epochstream.events.Gap` in the stream; no partial epoch and no epoch twice.
    - ``credit``: flow control — each publisher sends at most ``credit`` ``D``/``F`` messages
      ahead of what this subscriber has read; it grants more as it reads. A slow but steady
      consumer then slows the publisher down instead of being evicted. ``credit_unit="epochs"``
      counts the credit in epochs instead (frontier updates: at most ``credit`` frontier
      advances ahead, whatever the epochs' size; the unit for a pulling consumer,
      :meth:`fetch`); an older publisher that does not know the field counts messages.
    - ``ping_interval``: seconds between pings to each publisher (a restarted publisher answers
      a ping with a ``rejoin`` notice, so restarts are noticed within about this time).
    - ``start``: where to begin (docs/history.md). ``"latest"`` (default) is Strymon's join:
      every epoch no partition had begun when the subscriber joined. ``"earliest"``: everything
      the topic's epoch logs retain. A time (an ``int``, or a ``tuple`` for product orders) or a
      list of times (a frontier ``A``): exactly the complete epochs ``t`` with ``A <= t``
      (inclusive), each whole, history and the live stream joined without a gap or a
      duplicate. Raises :class:`~epochstream.errors.HistoryUnavailable` (from the constructor
      when every partition is closed, else from the iterators once every snapshot is in) when
      a partition with data at or beyond the position keeps no log or retains less.
    - ``durable``: a name; the catalog holds this subscription's position (created at
      ``start`` on first use). :meth:`ack` acknowledges an epoch; :attr:`position` is the acked
      frontier; the next ``Subscriber(..., durable=name)`` resumes there: acked epochs are never
      redelivered, unacked ones are redelivered whole. A second live holder of the name raises
      :class:`~epochstream.errors.SubscriptionHeld` unless ``takeover=True`` (the previous
      holder's acks are refused from then on); a subscription that fell behind retention raises
      :class:`~epochstream.errors.SubscriptionExpired`. With ``recover=True`` and history, a
      re-join is filled from the logs instead of yielding a :class:`~epochstream.events.Gap`
      (a durable subscriber never yields one: it raises instead).
    - ``keys``, ``columns``, ``where``: a filter (docs/filters.md, :class:`~epochstream.filters.Filter`):
      only records whose key (the publisher's ``key=``) is in ``keys`` and that satisfy every
      ``(column, op, value)`` of ``where``, projected on ``columns``. Each publisher applies it
      before sending (and skips data this subscriber's join would drop); this subscriber
      re-checks everything it receives. An epoch is whole under the filter: exactly its
      matching records, or nothing of it (an epoch nothing of which matches is not handed
      out; the frontier still passes it). :meth:`update_filter` changes it at an epoch
      boundary. A malformed filter raises :class:`~epochstream.filters.FilterError` here; one
      the data cannot be evaluated against (a column it lacks) is refused by the publisher
      (:class:`~epochstream.errors.ProtocolError` from the iterators).
    - ``security``: ``None`` (plain TCP, the default) or ``Security.curve(client_secret=...,
      server_public=...)`` (docs/security.md): every DEALER is a CURVE client with that key
      pair; ``server_public=None`` takes each partition's key from the catalog
      (:attr:`~epochstream.catalog.PartitionInfo.server_key`). A publisher that refuses this
      subscriber (no ``subscribe`` grant, or revoked) makes :meth:`wait_ready` and the
      iterators raise :class:`~epochstream.errors.NotAuthorized`; so does a catalog that
      records a CURVE key for a partition when ``security`` is ``None``, or none when it is
      set (then at once, from the constructor). A wrong server key or a key the publisher's
      ``allow`` directory lacks never completes the handshake: nothing arrives, and
      :class:`~epochstream.errors.PublisherLost` is raised after ``timeout``.

    Iterate :meth:`epochs` for complete :class:`~epochstream.events.Epoch` objects, or
    :meth:`events` for delivered data (decoded) and merged frontier changes as they arrive.
    Failures are raised by the iterators after everything that arrived before them was handed
    out: :class:`~epochstream.errors.SubscriberLagged` (evicted),
    :class:`~epochstream.errors.PublisherLost`, :class:`~epochstream.errors.PublisherAborted`,
    :class:`~epochstream.errors.ProtocolError` (a publisher refused this subscriber or broke the
    protocol); the constructor raises :class:`~epochstream.errors.TopicNotFound` for an unknown
    topic.
    """

    def __init__(self, topic: str, catalog=None, *, endpoints=None, order=None, codec: str | None = None,
                 wait: float = 10.0, timeout: float = 10.0, rcvhwm: int = 1000, recover: bool = False,
                 credit: int | None = None, ping_interval: float = 1.0, start: Any = "latest",
                 durable: str | None = None, takeover: bool = False,
                 credit_unit: str = "messages", context: zmq.Context | None = None,
                 keys=None, columns=None, where=None, security: Security | None = None):
        if security is not None and not isinstance(security, Security):
            raise TypeError(f"security must be a Security or None, got {type(security).__name__}")
        self.security = security if security is not None and security.enabled else None
        if self.security is not None and not self.security.is_client:
            raise ValueError("a subscriber's security needs its key pair: "
                             "Security.curve(client_secret=..., server_public=...)")
        if self.security is not None and endpoints is not None and \
                self.security.server_public is None:
            raise ValueError("a subscriber with endpoints= has no catalog to find the "
                             "publishers' keys in: pass Security.curve(server_public=...)")
        if not isinstance(takeover, bool):  # a truthy "false" must not take a live holder's name
            raise TypeError(f"takeover must be True or False, got {takeover!r}")
        if credit_unit not in ("messages", "epochs"):
            raise ValueError(f"credit_unit must be 'messages' or 'epochs', got {credit_unit!r}")
        least = 2 if credit_unit == "messages" else 1
        if credit is not None and (isinstance(credit, bool) or not isinstance(credit, int)
                                   or credit < least):
            raise ValueError(f"credit must be an int >= {least} ({credit_unit}), got {credit!r}")
        self.credit_unit = credit_unit
        self.topic = topic
        self.timeout = float(timeout)
        self.recover = bool(recover)
        self.credit = credit
        self.ping_interval = float(ping_interval)
        self._wait = wait
        self._catalog: Catalog | None = None
        self._static_endpoints = None if endpoints is None else list(endpoints)
        info = None
        if endpoints is None:
            self._catalog = resolve_catalog(catalog)
            info = self._catalog.lookup(topic, wait=wait)
            order, codec, n = info.order, info.codec, info.partitions
        else:
            order = by_name(order) if isinstance(order, str) else (order or TOTAL)
            codec = codec or "msgpack"
            n = len(self._static_endpoints)
        self.order = order
        self.codec = wire.codec(codec)
        self.partitions = n
        self._ctx = context or zmq.Context.instance()
        self._check = getattr(order, "check", None)
        self._filters = FilterSession(topic, order, self.codec.name, n, keys, columns, where)
        # the one stream of released epochs behind epochs() and fetch() (transport/stream.py)
        self._stream = EpochStream(topic, self)
        self._parked: list = []  # events not yet handed out (data still encoded)
        self._events_pending: collections.deque = collections.deque()  # events() read ahead
        self._last_epoch = None
        self._closed = False
        self._failure: EpochstreamError | None = None  # raised once the events before it are out
        self.id = uuid.uuid4().hex  # the same on every partition and every re-connection
        self.gaps: list[Gap] = []
        self.stats: collections.Counter = collections.Counter()
        # one DEALER per live partition (transport/links.py)
        self._links = PartitionLinks(self._ctx, rcvhwm=rcvhwm, ping_interval=self.ping_interval,
                                     security=self.security, credit=credit)
        self._liveness = Liveness(self.timeout, self.ping_interval)
        self._assembler = EpochAssembler(self.order, self.codec.combine)  # state of epochs()
        self._pending_gap: tuple | None = None  # (reason, partition, since) while re-joining
        self._announced: tuple = ()  # the merged lower frontier handed out before a re-join
        self._join_position = None
        self._join_position = self._init_resume(resolve_position(self.order, start), durable,
                                                takeover)
        try:
            if info is not None and self._join_position is None and durable is None:
                info = await_live(self._catalog, info, wait)  # "latest" of an ended topic
            self._join(floor=self._join_position, info=info)
        except BaseException:  # refused here: nothing of it stays (sockets, the durable hold,
            self._refused_new = self._durable_new  # a durable subscription it created)
            self.close()
            raise

    # -- joining ---------------------------------------------------------------------------
    def _join(self, floor, info: TopicInfo | None = None) -> None:
        if self._static_endpoints is not None:
            endpoints, closed, self._catalog_incarnations = list(self._static_endpoints), {}, {}
        else:
            if info is None:
                info = self._catalog.lookup(self.topic, wait=self._wait)
            info = await_one_run(self._catalog, info, self._wait)  # a run change under way
            endpoints, closed, self._catalog_incarnations = partition_endpoints(info, self._wait)
            for i in self._filters.pruned(info):  # key-partitioned: only where our keys live
                endpoints[i] = None
                closed[i] = ()
        keys = self._server_keys(info, endpoints)
        self._protocol = SubscriberProtocol(self.order, self.partitions, floor=floor)
        self._endpoints = {i: ep for i, ep in enumerate(endpoints) if ep is not None}
        # filter verdicts per raw data header: valid for this join's protocol state only
        self._time_cache: dict[bytes, Any] = {}
        self._part_lower: dict[int, dict] = {}
        self._incarnations: dict[int, str] = {}
        self._heartbeats: dict[int, float] = {}  # publishers' heartbeat intervals (s), for fetch()
        live = [i for i, ep in enumerate(endpoints) if ep is not None]
        self._liveness.join(live, _time.monotonic())
        for i in live:
            hello = {"topic": self.topic, "partition": i, "id": self.id}
            if self.credit is not None:
                hello["credit"] = self.credit
                if self.credit_unit == "epochs":
                    hello["credit_unit"] = "epochs"
            if self._filters.program is not None:
                hello["filter"] = self._filters.program.to_wire()
            self._links.connect(i, endpoints[i], hello, keys.get(i))
        for i, upper in closed.items():
            self._queue(self._snapshot(i, InitialFrontierSnapshot((), upper)))

    def _server_keys(self, info: TopicInfo | None, endpoints: list) -> dict:
        """``{partition: the publisher's CURVE key}`` to connect with (``security``'s
        ``server_public``, else the catalog's); raises :class:`NotAuthorized` when a live
        partition's catalog entry and ``security`` do not match (one is CURVE, the other not)."""
        recorded = {} if info is None else {p.index: p.server_key for p in info.partition_info}
        keys = {}
        for i, ep in enumerate(endpoints):
            if ep is None:
                continue
            key = recorded.get(i)
            if self.security is None:
                if key is not None:
                    raise NotAuthorized(
                        f"topic {self.topic!r}: the publisher of partition {i} requires CURVE "
                        f"(server key {key}); pass security=Security.curve(client_secret=...)",
                        topic=self.topic, partition=i)
                continue
            if self.security.server_public is not None:
                keys[i] = self.security.server_public
            elif key is None:
                raise NotAuthorized(
                    f"topic {self.topic!r}: the catalog records no CURVE key for partition {i} "
                    f"(its publisher serves plain TCP, without security=); pass "
                    f"Security.curve(server_public=...) or subscribe without security=",
                    topic=self.topic, partition=i)
            else:
                keys[i] = key
        return keys

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

    @property
    def record_filter(self) -> Filter:
        """The newest record filter (``keys``/``columns``/``where``; ``Filter()``: none). Not
        :attr:`filter`, which is the Strymon join filter's antichain."""
        return self._filters.record_filter

    @property
    def key_column(self) -> str | None:
        """The topic's key column as its publishers announced it (``None``: none, or not yet)."""
        return self._filters.topic_key

    # -- filters at the source (transport/filtering.py, docs/filters.md) -----------------------
    def update_filter(self, keys=None, columns=None, where=None, *,
                      timeout: float = 10.0) -> tuple:
        """Change the filter to ``Filter(keys, columns, where)`` (``Filter()`` for everything)
        and return the boundary ``B``, a tuple of times (a frontier): every epoch at or beyond
        ``B`` is handed out under the new filter, every other epoch under the old one — never
        a mix. Blocks until every live publisher answered (at most ``timeout`` seconds; data
        arriving meanwhile is kept). Raises :class:`~epochstream.filters.FilterError` for a
        malformed filter, one too big for the wire, or a change of ``keys`` on a topic whose
        publishers declare no key column (a key function: this subscriber cannot re-check keys;
        nothing changes), ``TimeoutError`` if a publisher did not answer (the change then stays
        pending-safe: later epochs are still whole under one of the two filters, released
        under the old one), ``NotImplementedError`` for orders other than total and product."""
        filters, new = self._filters, Filter(keys, columns, where)
        filters.check_change(new)
        deadline = _time.monotonic() + timeout
        if not self.wait_ready(timeout):
            raise TimeoutError(f"topic {self.topic!r}: not every partition's snapshot arrived "
                               f"within {timeout} s")
        self._links.send_all(filters.propose(new))
        try:
            while missing := filters.missing(self._links.live()):
                left = deadline - _time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"topic {self.topic!r}: partitions {sorted(missing)} did "
                                       f"not answer the filter update within {timeout} s")
                self._pump(min(left, 0.05))  # what arrives waits in _parked
            b, frames = filters.settle()
        finally:
            filters.end_change()
        self._links.send_all(frames)
        self.stats["filter_updates"] += 1
        return b

    # -- messages --------------------------------------------------------------------------
    def _snapshot(self, partition: int, snap: InitialFrontierSnapshot) -> list:
        self._part_lower[partition] = dict.fromkeys(snap.lower, True)
        was_ready = self._protocol.ready
        out = self._protocol.receive(partition, snap)
        if self._protocol.ready and not was_ready and self._pending_gap is None:
            out = self._ready_history(out)
        if self._pending_gap is not None and self._protocol.ready:
            reason, culprit, since = self._pending_gap
            self._pending_gap = None
            if self._catalog is not None and self._catalog.history_states(self.topic) and \
                    self._plan_history(since):
                self._join_position = since
                self.stats["rejoins_filled"] += 1
                withdraw = (LowerFrontierUpdate(tuple((t, -1) for t in self._announced))
                            if self._announced else None)
                out = [Rejoined(withdraw), *out]
                if not snap.lower:
                    self._retire_socket(partition)
                return out
            if self.durable is not None:
                raise self._history_unavailable(since)
            uppers = Antichain(dual(self.order))
            for s in self._protocol.snapshots.values():
                uppers.extend(s.upper)
            gap = Gap(reason, culprit, self._last_epoch, tuple(since), self._protocol.lower,
                      uppers.elements, self.order)
            self.gaps.append(gap)
            out = [gap, *out]
        if not snap.lower:
            self._retire_socket(partition)
        return out

    def _queue(self, outputs: list) -> None:
        """Append protocol outputs, in order, to the events not yet handed out (with a history
        fill running: the epochs it completes, ahead of each frontier change)."""
        if self._fill is not None:
            outputs = self._with_history(outputs)
        for m in outputs:
            if type(m) is DataMessage:
                self.stats["delivered"] += 1
                self.stats["bytes"] += m.nbytes
        self._parked.extend(outputs)

    def _retire_socket(self, partition: int, *, finished: bool = False) -> None:
        if finished and (self._fills_unread or self._fill is not None):
            # its publisher may still have to serve a history read of this join's fill
            self._retire_later.add(partition)
            self._liveness.forget(partition)
            return
        if self._links.retire(partition):
            self._liveness.forget(partition)

    def _handle(self, partition: int, frames: list) -> list:
        """Process one multipart message; return protocol outputs (data still encoded)."""
        self.stats["messages"] += 1
        if self.credit is not None and (frames[0] == wire.FRONTIER if self.credit_unit == "epochs"
                                        else frames[0] in _CREDITED):
            self._links.spend_credit(partition)
        if len(frames) == 3 and frames[0] == wire.DATA:
            return self._data(partition, frames[1], frames[2])
        msg = wire.decode(frames)
        if isinstance(msg, InitialFrontierSnapshot):
            meta = wire.decode_snapshot_meta(frames)
            self._incarnations[partition] = meta.get("incarnation")
            self._heartbeats[partition] = meta.get("heartbeat")
            self._filters.snapshot(partition, msg, meta, self._protocol)
            return self._snapshot(partition, msg)
        if isinstance(msg, LowerFrontierUpdate):
            pl = self._part_lower.setdefault(partition, {})
            apply_changes(pl, msg.updates)
            out = self._protocol.receive(partition, msg)
            if not pl:
                self._retire_socket(partition, finished=True)
            return out
        if isinstance(msg, wire.Notice):
            return self._notice(partition, msg)
        return []  # heartbeat: liveness only (never applied: it may overtake queued updates)

    def _data(self, partition: int, raw: bytes, payload) -> list:
        """Hot path: the filter verdict per raw header bytes is cached for this join (many
        messages share an epoch); the payload is decoded only when handed out."""
        protocol = self._protocol
        hit = self._time_cache.get(raw)
        if hit is None or hit[2] != protocol.version:
            t = hit[0] if hit is not None else wire.decode_time(raw)
            if hit is None:
                if self._check is not None:
                    t = self._check(t)
                self._filters.data_at(t)  # times data arrived for (a filter change's bound)
            ok = not protocol.ready or not protocol.filtering or protocol.passes(t)
            if len(self._time_cache) > 4096:
                self._time_cache.clear()
            hit = self._time_cache[raw] = (t, ok, protocol.version)
        t, ok, _ = hit
        if not protocol.ready:
            return protocol.receive(partition, DataMessage(t, payload, len(payload)))  # buffered
        if not ok:
            protocol.dropped += 1
            self.stats["dropped"] += 1
            return []
        return protocol.deliver(t, payload, len(payload))

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
            return self._aborted(partition, msg)
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

    # -- polling ---------------------------------------------------------------------------
    def _poll(self, timeout_s: float | None) -> list:
        """Wait up to ``timeout_s`` seconds for messages; return events (data still encoded).
        A failure (lagged, lost, aborted, a protocol violation by a publisher) is raised only
        after everything that arrived before it was returned."""
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
        liveness, links = self._liveness, self._links
        if not links:
            if liveness.awaiting:  # every socket retired, waiting for a new publisher
                _time.sleep(min(0.05, timeout_s if timeout_s is not None else 0.05))
                self._check_awaiting(_time.monotonic())
            return
        events = links.poll(None if timeout_s is None else max(0, int(timeout_s * 1000)))
        now = _time.monotonic()
        protocol = self._protocol
        for s, _ in events:
            partition = links.partition_of.get(s)
            if partition is None:
                continue
            receive = links.receivers[s]
            for _ in range(_DRAIN):
                try:
                    frames = receive()
                except zmq.Again:
                    break
                liveness.heard(partition, now)
                self._queue(self._handle(partition, frames))
                if self._protocol is not protocol or partition not in links.by_partition:
                    break  # re-joined (sockets replaced) or this partition finished
            if self._protocol is not protocol:
                break
        if liveness.ping_due(now):
            links.ping(wire.encode_control(wire.PING, id=self.id))
        self._check_liveness(now)

    # -- iteration -------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = 10.0) -> bool:
        """Process messages until every partition's snapshot has arrived (data that arrives
        meanwhile is kept for :meth:`epochs`/:meth:`events`). Returns False on timeout (seconds;
        0: read what has arrived, without waiting); raises the failure that prevents it (e.g.
        the hello was refused)."""
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self._protocol.ready:
            left = None if deadline is None else max(0.0, deadline - _time.monotonic())
            self._pump(min(left, 0.1) if left is not None else 0.1)
            if left is not None and left <= 0 and not self._protocol.ready:
                return False
        return True

    def _pump(self, timeout_s: float) -> None:
        """Read for up to ``timeout_s`` seconds even while events wait to be handed out (they
        stay in ``_parked``, in order); a failure is raised now, and again by the iterators
        once the events before it are out."""
        if self._failure is not None:
            raise self._failure
        try:
            self._read(timeout_s)
        except EpochstreamError as exc:
            self._failure = exc
            raise

    def _hand_out(self, m):
        """An event as it is handed out: data decoded and re-checked against the record
        filter (``None``: nothing of it matches); the program pruned as the frontier moves."""
        kind = type(m)
        if kind is DataMessage:
            if self._acks is not None and self._acks.skips(m.time):
                return None  # acked in an earlier session of this durable subscription
            records = self.codec.decode(m.data)
            if self._filters.program is not None:
                records = self._filters.recheck(m.time, records)
                if records is None:
                    return None
            return DataMessage(m.time, records, m.nbytes)
        if kind is LowerFrontierUpdate:
            self._filters.handed(m)
        elif kind is Gap or kind is Rejoined:
            self._filters.restarted()
        return m

    def events(self, timeout: float | None = None) -> Iterator:
        """Yield, as they arrive, :class:`~epochstream.events.DataMessage` (decoded records in
        ``data``, encoded size in ``nbytes``) for data that passed the filter,
        :class:`~epochstream.events.LowerFrontierUpdate` for merged frontier changes and, with
        ``recover=True``, a :class:`~epochstream.events.Gap` where the subscriber re-joined
        (after it, the merged frontier is announced afresh from empty). Ends when every
        partition finished. ``timeout``: seconds without any event before ``TimeoutError``.
        With ``durable=``, epochs acked in an earlier session are not handed out again; acking
        needs whole epochs (:meth:`epochs` or :meth:`fetch`), so ``ack`` refuses what only
        ``events()`` handed out. Events read but not handed out stay with the subscriber: a new
        ``events()`` (after ``break``) starts with them. Unpacking an event as
        ``(message, nbytes)`` still works until 0.3 (deprecated)."""
        pending = self._events_pending
        last = _time.monotonic()
        while True:
            item = pop_event(pending)
            if item is None:
                got = self.step_events(0.1)
                if got is None:
                    return
                if not got and timeout is not None and _time.monotonic() - last > timeout:
                    raise TimeoutError(f"no message for {timeout} s from topic {self.topic!r}")
                pending.extend(got)
                continue
            last = _time.monotonic()
            yield item

    def step_events(self, timeout: float = 0.0) -> list | None:
        """One non-blocking step of :meth:`events` (what ``aio`` drives): wait at most
        ``timeout`` seconds (0: not at all) for messages, then return the events ready to hand
        out, in order, as a list of *iterators* (each event — decoded
        :class:`~epochstream.events.DataMessage`, merged
        :class:`~epochstream.events.LowerFrontierUpdate`, :class:`~epochstream.events.Gap`, a
        history fill's ``DataMessage``\\ s — filtered and decoded as it is consumed: consume
        them, with :func:`pop_event`, before the next step) — ``[]`` if none, ``None`` once the
        stream ended (every partition finished, every event handed out). Raises what
        :meth:`events` raises, after the events that arrived before the failure. Wait on
        :attr:`sockets` between steps. Not to be mixed with :meth:`epochs`/:meth:`fetch`."""
        got = self._poll(timeout)
        if not got:
            return None if self._protocol.finished and not self._parked else []
        # handed out (decoded) one at a time as they are consumed, never a whole poll's batch
        # at once: 256 messages of 1000 records decoded together kept ~256,000 objects alive
        # and made the garbage collector run ~1,000 times more (half the records/s, measured)
        return [self._handed_out(got)]

    def _handed_out(self, got: list) -> Iterator:
        """The events of one poll's messages ``got``, each handed out (filtered, decoded) when
        it is consumed, in order; a history fill's messages read as they are consumed."""
        hand_out = self._hand_out
        for m in got:
            m = hand_out(m)
            if m is None:
                continue
            kind = type(m)
            if kind is HistoryBatch:
                yield from self._history_messages(m)
            elif kind is Rejoined:
                if m.withdraw is not None:
                    yield m.withdraw
            else:
                yield m

    @property
    def sockets(self) -> tuple:
        """The ``zmq.Socket`` DEALERs of the current join, one per live partition: what an
        event loop waits on (readable) between non-blocking steps (:meth:`step_events`,
        ``wait_ready(0)``, ``fetch(no_wait=True)``). A re-join replaces them."""
        return tuple(self._links.partition_of)

    def _history_messages(self, batch: HistoryBatch) -> Iterator[DataMessage]:
        """The :class:`DataMessage`\\ s of a history fill for :meth:`events` (and the aio
        twin's), read and decoded one at a time: epochs acked in an earlier session of a
        durable subscription skipped, records re-checked against the filter."""
        decode, filters = self.codec.decode, self._filters
        try:
            for t, _recs, payloads in self._history_reader().read(batch.epochs):
                if self._skipped(t):
                    continue
                for _, payload in payloads:
                    records = decode(payload)
                    if filters.program is not None:
                        records = filters.recheck(t, records)
                        if records is None:
                            continue
                    yield DataMessage(t, records, len(payload))
        finally:
            self._batch_read()

    def epochs(self, timeout: float | None = None) -> Iterator[Epoch | Gap]:
        """Yield complete :class:`~epochstream.events.Epoch` objects in an order consistent
        with the partial order; ``records`` is a list (msgpack) or ``pyarrow.Table`` (arrow);
        ``first_seen``/``released_at`` are ``time.time()`` readings. With ``recover=True`` a
        :class:`~epochstream.events.Gap` is yielded where the subscriber re-joined (epochs of
        the old join that were still incomplete are dropped there). Ends when every partition
        finished. ``timeout``: seconds without a new epoch before ``TimeoutError``. Draws from
        the stream :meth:`fetch` draws from: the two may be mixed (transport/stream.py)."""
        return self._stream.epochs(timeout)

    def fetch(self, max_epochs: int = 1, max_bytes: int | None = None,
              expires: float | None = None, no_wait: bool = False) -> FetchResult:
        """Pull up to ``max_epochs`` whole epochs: a :class:`~epochstream.events.FetchResult`
        (a sequence of :class:`~epochstream.events.Epoch`, in the order :meth:`epochs` yields
        them, plus ``status``, ``gaps``, ``finished``, ``superseded``). Never raises for "no
        epoch yet"; never splits an epoch.

        - ``max_epochs`` (int >= 1): at most this many epochs.
        - ``max_bytes`` (int >= 1 or ``None``): the epochs' ``nbytes`` (encoded payload bytes)
          sum to at most this. An epoch that does not fit stays buffered for the next call
          (nothing is lost or reordered); an epoch larger than ``max_bytes`` on its own is
          returned alone with status ``"epoch_too_large"`` (it can never fit; holding it back
          would block the stream for good).
        - ``expires`` (seconds >= 0, or ``None``): wait at most about this long (to within a
          poll slice, 0.05 s) for ``max_epochs`` epochs, then return those there are
          (``"ok"``) or none (``"timeout"``). ``None``: block until at least one epoch is
          there, then return it with those that have already arrived (up to ``max_epochs``,
          without waiting for more).
        - ``no_wait``: never wait for the network: process what has already arrived (up to
          about 0.1 s of processing; the rest is processed by the next call) and return the
          complete epochs (``"ok"``) or none (``"no_data"``). ``expires`` is then ignored.

        Statuses: ``"ok"`` (at least one epoch); ``"timeout"`` (none within ``expires``);
        ``"no_data"`` (none, without waiting out an ``expires``: ``no_wait``, the stream ended
        — ``finished=True`` — , superseded — ``superseded=True`` — , or a failure pending);
        ``"epoch_too_large"`` (see ``max_bytes``). With ``recover=True``, the
        :class:`~epochstream.events.Gap` events met are in ``gaps`` (a gap alone does not end
        a pull). When every partition finished and every epoch was handed out: ``"no_data"``
        with ``finished=True``, at once, on every later call.

        Epochs returned count as handed out exactly as with :meth:`epochs`: with
        ``durable=``, ``sub.ack(epoch)`` acknowledges them. :meth:`epochs` and :meth:`fetch`
        draw from one stream and may be mixed; :meth:`events` may not be mixed with them.

        Threads: a fetch called while another is waiting (from another thread) supersedes it:
        the waiting one returns within about 0.05 s with the epochs it already had (status as
        above, ``superseded=True``) and the new one proceeds. Otherwise a subscriber is used
        from one thread at a time.

        Liveness: a waiting fetch is kept alive by every message, including the publishers'
        idle heartbeats. A partition silent for more than two of its publisher's heartbeat
        intervals (``Publisher(heartbeat_interval=)``, announced in the snapshot) plus 0.5 s
        ends it with :class:`~epochstream.errors.PublisherLost` (with ``recover=True``, or
        before the partition's snapshot arrived, the subscriber's ``timeout`` applies instead:
        a restarted publisher is re-joined).

        Raises, like :meth:`epochs`, only after every epoch that arrived before the failure was
        handed out (a fetch that holds epochs returns them; the next call raises):
        :class:`~epochstream.errors.PublisherLost`,
        :class:`~epochstream.errors.PublisherAborted`,
        :class:`~epochstream.errors.SubscriberLagged`,
        :class:`~epochstream.errors.ProtocolError`,
        :class:`~epochstream.errors.HistoryUnavailable` /
        :class:`~epochstream.errors.SubscriptionExpired` (joining at a position); once raised,
        the failure is raised again by every later call. ``ValueError`` for invalid arguments or
        a closed subscriber.
        """
        _check_fetch(max_epochs, max_bytes, expires)
        if self._closed:
            raise ValueError(f"fetch() on a closed Subscriber of topic {self.topic!r}")
        return self._stream.fetch(max_epochs, max_bytes, expires, no_wait,
                                  lambda: self._failure)

    def _step(self, slice_s: float):
        """One poll of the epoch stream (transport/stream.py): ``None`` once the stream ended,
        else ``(events, read_at, idle)``."""
        reads = not self._parked and self._failure is None  # else _poll does not read
        n = self.stats["messages"]
        got = self._poll(slice_s)
        if not got and self._protocol.finished and not self._parked:
            return None
        return got, (_time.monotonic() if reads else None), \
            not got and self.stats["messages"] == n

    def _check_heartbeats(self, read_at: float) -> None:
        """After a fetch's poll that read the sockets (at ``read_at``): a partition silent for
        more than two heartbeat intervals of its publisher (announced in its snapshot) plus
        :data:`FETCH_GRACE_S` is lost. Not with ``recover=True`` (a restarted publisher is
        re-joined; the ``timeout`` applies)."""
        if self.recover or self._failure is not None:
            return
        beats = self._heartbeats
        for partition, heard in self._liveness.last_heard.items():
            hb = beats.get(partition)
            silent = read_at - heard
            if hb and silent > 2 * hb + FETCH_GRACE_S:
                self._failure = PublisherLost(
                    f"topic {self.topic!r}: no message from partition {partition} for "
                    f"{silent:.2f} s during a fetch: two heartbeats missed (its publisher sends "
                    f"one every {hb} s when idle)", partition=partition)
                return

    def _released(self, outputs: Iterator) -> Iterator:
        """The one stream of released epochs behind :meth:`epochs` and :meth:`fetch` (a single
        instance, kept by the EpochStream, transport/stream.py): epochs and gaps, and ``None`` for each ``None``
        of ``outputs`` (a tick after each poll)."""
        for item in outputs:
            kind = type(item)
            if kind is DataMessage:
                self._assembler.data(item, nbytes=item.nbytes, now=_time.time())
            elif kind is LowerFrontierUpdate:
                done = self._assembler.frontier_changed(item, now=_time.time())
                acks = self._acks
                if acks is not None:  # released: they hold the position back, and become
                    for epoch in done:  # ackable only as each is handed out
                        acks.released(epoch.time)
                    self._ack_frontier(self._assembler.frontier)
                for epoch in done:
                    if acks is not None:
                        if acks.skips(epoch.time):
                            acks.skip(epoch.time)  # acked in an earlier session
                            continue
                        acks.handed_out(epoch.time)
                    self._last_epoch = epoch.time
                    yield epoch
            elif kind is HistoryBatch:
                acks = self._acks
                if acks is not None:  # as for released epochs: the whole batch at once, and
                    for t, _ in item.epochs:  # the frontier: its lower, held back by the live
                        acks.released(t)     # epochs the following update releases
                    low = Antichain(self.order, item.lower)
                    self._ack_frontier([*item.lower, *(t for t in self._assembler.pending
                                                       if not low.less_equal(t))])
                released = set()
                for epoch in self._history_epochs(item, _time.time()):
                    released.add(epoch.time)
                    if acks is not None:
                        if acks.skips(epoch.time):
                            acks.skip(epoch.time)
                            continue
                        acks.handed_out(epoch.time)
                    self._last_epoch = epoch.time
                    yield epoch
                if acks is not None and len(released) < len(item.epochs):
                    for t, _ in item.epochs:  # nothing of it matched the filter: as an epoch
                        if t not in released:  # without data, it needs no ack
                            acks.skip(t)
            elif kind is Rejoined:  # the old join's incomplete epochs come from history
                self._assembler = EpochAssembler(self.order, self.codec.combine)
            elif kind is Gap:  # epochs of the old join still pending can never complete
                self._assembler = EpochAssembler(self.order, self.codec.combine)
                yield dataclasses.replace(item, last_epoch=self._last_epoch)
            elif item is None:
                yield None

    def close(self) -> None:
        """Say goodbye to every publisher (so it frees our state at once), close the sockets,
        and release a durable subscription's hold in the catalog."""
        if self._closed:
            return
        self._closed = True
        self._close_links()
        self._close_catalog()

    def _close_links(self) -> None:
        for partition in list(self._links.live()):
            self._retire_socket(partition)
        self._close_history()

    def _close_catalog(self) -> None:
        self._release_hold()
        if getattr(self, "_refused_new", False):  # refused start: drop what it created
            self._forget_new_durable()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # A garbage collection may run this inside a catalog write of this very thread (its
        # lock held): the catalog part of closing runs in a thread of its own, never here.
        try:
            if self._closed:
                return
            self._closed = True
            self._close_links()
            if self.durable is not None:
                threading.Thread(target=self._close_catalog, daemon=True,
                                 name="epochstream-subscriber-close").start()
        except Exception:
            pass


def _check_fetch(max_epochs, max_bytes, expires) -> None:
    """``ValueError`` for an invalid argument of :meth:`Subscriber.fetch`."""
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be an int >= 1, got {max_epochs!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise ValueError(f"max_bytes must be an int >= 1 (bytes) or None, got {max_bytes!r}")
    if expires is not None:
        if isinstance(expires, bool) or not isinstance(expires, (int, float)) or \
                math.isnan(expires) or expires < 0:
            raise ValueError(f"expires must be seconds >= 0 or None, got {expires!r}")


def pop_event(pending: collections.deque):
    """The next event of ``pending`` — a deque of what :meth:`Subscriber.step_events`
    returned: events, and iterators of a history fill's ``DataMessage``\\ s, read as they are
    handed out — or ``None`` when it is empty."""
    while pending:
        item = pending[0]
        if type(item) is not _GENERATOR:
            return pending.popleft()
        item = next(item, None)  # a history fill, read as it is handed out
        if item is not None:
            return item
        pending.popleft()
    return None
