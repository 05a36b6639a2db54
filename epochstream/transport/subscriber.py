"""The subscriber of a topic, a thin object holding its parts (each with its own state), as
aiokafka's consumer holds its fetcher and coordinator:

- :class:`~.topic_join.TopicJoin`: the join of every partition — links, the merged Strymon
  protocol, liveness and recovery, events read and not handed out yet;
- :class:`~.filtering.FilterSession`: the record filter and its changes;
- :class:`~.fill.HistoryFill`: a join at a position, filled from the epoch logs;
- :class:`~.durable.DurableCursor`: a durable subscription's acked position;
- :class:`~.release.Release`: handed-out events into whole epochs;
- :class:`~.stream.EpochStream`: the one stream behind :meth:`Subscriber.epochs` and
  :meth:`Subscriber.fetch`.

The subscriber decodes and re-checks what it hands out (:meth:`Subscriber.hand_out`)."""

from __future__ import annotations

import collections
import logging
import threading
import time as _time
from typing import Any, Iterator

import zmq

from .. import wire
from ..zmq_context import default_context
from ..catalog import Catalog, TopicInfo
from ..events import Epoch, FetchResult, Gap
from ..filters import Filter
from ..order import TOTAL, by_name
from ..position import resolve_position
from ..options import Credit, Durable, subscriber_values
from ..security import Security
from .durable import DurableCursor
from .filtering import FilterSession
from .fill import HistoryFill
from .handout import HandOut
from .discovery import await_live, resolve_catalog
from .release import Release
from .stream import _GENERATOR, EpochStream, check_fetch, pop_event
from .topic_join import JoinSettings, TopicJoin, check_options

__all__ = ["Subscriber", "pop_event"]


log = logging.getLogger("epochstream.transport")


class Subscriber:
    """Subscribes to every partition of a topic and yields complete epochs (Strymon
    "Subscriber Logic" merged across partitions).

    - with ``endpoints`` (a list, one per partition) the catalog is not used and ``order``
      (default TOTAL) and ``codec`` (default ``"msgpack"``) must describe the topic;
    - otherwise the topic is looked up in ``catalog`` (a :class:`~epochstream.catalog.Catalog`, a
      path, or ``None`` for the default), waiting up to ``wait`` seconds for it to appear.
      Partitions the catalog lists as closed contribute their final upper frontier to the filter
      and nothing else. With ``start="latest"`` (and no ``durable``), a topic whose every
      partition has ended is waited on for up to ``wait`` seconds for new publishers; if none
      come and every partition is closed: :class:`~epochstream.errors.TopicClosed`.
    - ``timeout``: seconds a live partition may stay silent (no data, progress or heartbeat)
      before :class:`~epochstream.errors.PublisherLost` is raised.
    - ``recover``: instead of raising :class:`~epochstream.errors.SubscriberLagged`,
      :class:`~epochstream.errors.PublisherLost` (a restarted publisher) or
      :class:`~epochstream.errors.PublisherAborted` (a successor within ``timeout``), re-join
      and report a :class:`~epochstream.events.Gap`; no partial epoch, no epoch twice.
    - ``credit``: flow control, a :class:`~epochstream.options.Credit` (or an int with
      ``credit_unit``): publishers send at most that far ahead of what this subscriber read.
    - ``ping_interval``: seconds between pings to each publisher (restarts are noticed within
      about this time).
    - ``start``: where to begin (docs/history.md). ``"latest"`` (default) is Strymon's join:
      every epoch no partition had begun when the subscriber joined. ``"earliest"``: everything
      the topic's epoch logs retain. A time (an ``int``, or a ``tuple`` for product orders) or a
      list of times (a frontier ``A``): exactly the complete epochs ``t`` with ``A <= t``
      (inclusive), each whole, history and the live stream joined without a gap or a
      duplicate. Raises :class:`~epochstream.errors.HistoryUnavailable` (from the constructor
      when every partition is closed, else from the iterators once every snapshot is in) when
      a partition with data at or beyond the position keeps no log or retains less.
    - ``durable``: a :class:`~epochstream.options.Durable` (or a name, with ``takeover``):
      the catalog holds this subscription's position (created at ``start`` on first use);
      :meth:`ack` acknowledges an epoch, :attr:`position` is the acked frontier, a resume
      never redelivers an acked epoch and redelivers unacked ones whole. A second live holder
      raises :class:`~epochstream.errors.SubscriptionHeld` unless ``takeover``; one behind
      retention :class:`~epochstream.errors.SubscriptionExpired`. It never yields a ``Gap``.
    - ``record_filter`` (a :class:`~epochstream.filters.Filter`), or ``keys``, ``columns``,
      ``where``: a filter (docs/filters.md), applied by each publisher and re-checked here: an
      epoch is whole under the filter — exactly its matching records, or nothing of it.
      :meth:`update_filter` changes it at an epoch boundary. A malformed filter raises
      :class:`~epochstream.filters.FilterError` here; one the data cannot be evaluated against
      is refused by the publisher (:class:`~epochstream.errors.ProtocolError` from the
      iterators).
    - ``security``: ``None`` (plain TCP) or ``Security.curve(client_secret=...,
      server_public=...)`` (docs/security.md; ``server_public=None``: each partition's key from
      the catalog). A publisher that refuses this subscriber makes :meth:`wait_ready` and the
      iterators raise :class:`~epochstream.errors.NotAuthorized`, as does a catalog entry
      whose CURVE key does not match ``security`` (then from the constructor). A wrong key
      never completes the handshake: :class:`~epochstream.errors.PublisherLost` after
      ``timeout``.

    - ``wire_version``: the newest data-message version to offer publishers (2, the default:
      one frame per message; 1: ask every publisher for version 1) — docs/protocol.md §2.2.

    Iterate :meth:`epochs` for complete :class:`~epochstream.events.Epoch` objects, or
    :meth:`events` for delivered data (decoded) and merged frontier changes as they arrive.
    Failures are raised by the iterators after everything that arrived before them was handed
    out: :class:`~epochstream.errors.SubscriberLagged` (evicted),
    :class:`~epochstream.errors.PublisherLost`, :class:`~epochstream.errors.PublisherAborted`,
    :class:`~epochstream.errors.ProtocolError` (a publisher refused this subscriber or broke the
    protocol); the constructor: :class:`~epochstream.errors.TopicNotFound` (unknown topic).
    """

    def __init__(self, topic: str, catalog=None, *, endpoints=None, order=None, codec: str | None = None,
                 wait: float = 10.0, timeout: float = 10.0, rcvhwm: int = 1000, recover: bool = False,
                 credit: int | Credit | None = None, ping_interval: float = 1.0,
                 start: Any = "latest", durable: str | Durable | None = None,
                 takeover: bool = False, credit_unit: str = "messages",
                 context: zmq.Context | None = None, keys=None, columns=None, where=None,
                 security: Security | None = None, record_filter: Filter | None = None,
                 wire_version: int = 2):
        record_filter, flow, held = subscriber_values(record_filter, keys, columns, where,
                                                      credit, credit_unit, durable, takeover)
        self.security = check_options(security, endpoints)
        self.topic, self.timeout, self.recover = topic, float(timeout), bool(recover)
        credit, credit_unit = (None, credit_unit) if flow is None else (flow.count, flow.unit)
        durable, takeover = (None, False) if held is None else (held.name, held.takeover)
        self.credit, self.credit_unit, self.durable = credit, credit_unit, durable
        self.ping_interval = float(ping_interval)
        self._catalog: Catalog | None = None
        info = None
        if endpoints is None:
            self._catalog = resolve_catalog(catalog)
            info = self._catalog.lookup(topic, wait=wait)
            order, codec, n = info.order, info.codec, info.partitions
        else:
            order = by_name(order) if isinstance(order, str) else (order or TOTAL)
            codec, n = codec or "msgpack", len(endpoints)
        if durable is not None and self._catalog is None:
            raise ValueError("durable= needs a catalog (the position is held there)")
        self.order, self.codec, self.partitions = order, wire.codec(codec), n
        self._events_pending: collections.deque = collections.deque()  # events() read ahead
        self._closed = False
        import uuid  # here, not at import (see Publisher)

        self.id = uuid.uuid4().hex  # the same on every partition and every re-connection
        self.gaps: list[Gap] = []
        self.stats: collections.Counter = collections.Counter()
        self._filters = FilterSession(topic, order, self.codec.name, n, record_filter.keys,
                                      record_filter.columns, record_filter.where or None)
        self._durable = None if durable is None else \
            DurableCursor(topic, durable, self._catalog, order, self.id)
        self._fill = HistoryFill(topic, self._catalog, order, self.codec, self._filters,
                                 self.stats, timeout=self.timeout, security=self.security,
                                 durable=self._durable)
        self._release = Release(order, self.codec, self._durable, self._fill)
        self._hand_out = HandOut(self.codec, self._filters, self._durable, self._fill)
        settings = JoinSettings(topic, order, n, self.id, self.timeout, self.recover,
                                self.ping_interval, wait, rcvhwm, credit, credit_unit,
                                self.security, wire_version)
        self._join = TopicJoin(settings, self._catalog, endpoints and list(endpoints),
                               context or default_context(), filters=self._filters,
                               fill=self._fill, durable=self._durable, release=self._release,
                               stats=self.stats, gaps=self.gaps)
        self._stream = EpochStream(topic, self)  # behind epochs() and fetch()
        self._start(resolve_position(order, start), takeover, info, wait)

    def _start(self, position, takeover: bool, info: TopicInfo | None, wait: float) -> None:
        """The first join, at ``position`` (as resolved from ``start=``; a durable
        subscription's stored one takes precedence; ``None``: latest). Refused: nothing of it
        stays (sockets, the durable hold, a durable subscription it created)."""
        durable = self._durable
        if durable is not None:
            position = durable.claim(position, takeover)
        if position == "earliest":
            position = self._fill.earliest()
        if position is not None and durable is not None:
            durable.start(position)
        self._join.position = position
        try:
            if info is not None and position is None and durable is None:
                info = await_live(self._catalog, info, wait)  # "latest" of an ended topic
            self._join.join(as_of=position, info=info)
        except BaseException:
            if durable is not None:
                durable.refused = durable.created
            self.close()
            raise

    # -- queries ---------------------------------------------------------------------------
    ready = property(lambda self: self._join.protocol.ready,
                     doc="True once every partition's snapshot has arrived.")
    snapshots = property(lambda self: self._join.protocol.snapshots,
                         doc="``{partition: InitialFrontierSnapshot}`` as received.")
    incarnations = property(lambda self: dict(self._join.incarnations), doc="``{partition: "
                            "incarnation id}`` of the publishers as their snapshots announced.")
    lower = property(lambda self: self._join.protocol.lower,
                     doc="The merged lower frontier received (elements).")
    filter = property(lambda self: self._join.protocol.filter,
                      doc="The Strymon join filter's elements (empty once retired).")
    finished = property(lambda self: self._join.protocol.finished,
                        doc="True once every partition's lower frontier is empty.")
    last_epoch = property(lambda self: self._release.last_epoch, doc="The time of the last "
                          "epoch handed out by epochs()/fetch() (None: none yet).")

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
        self._join.links.send_all(filters.propose(new))
        try:
            while missing := filters.missing(self._join.links.live()):
                left = deadline - _time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"topic {self.topic!r}: partitions {sorted(missing)} did "
                                       f"not answer the filter update within {timeout} s")
                self._join.pump(min(left, 0.05))  # what arrives waits, parked
            b, frames = filters.settle()
        finally:
            filters.end_change()
        self._join.links.send_all(frames)
        self.stats["filter_updates"] += 1
        return b

    # -- iteration -------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = 10.0) -> bool:
        """Process messages until every partition's snapshot has arrived (data that arrives
        meanwhile is kept for :meth:`epochs`/:meth:`events`). Returns False on timeout (seconds;
        0: read what has arrived, without waiting); raises the failure that prevents it (e.g.
        the hello was refused)."""
        return self._join.wait_ready(timeout)

    def poll_encoded(self, timeout: float) -> list:
        """Wait up to ``timeout`` seconds; the events that arrived, with data still encoded
        (wire bytes, not re-checked): what a relay forwards (transport/relay.py). Not to be
        mixed with :meth:`epochs`, :meth:`fetch` or :meth:`events`."""
        return self._join.poll(timeout)

    @property
    def filtering(self) -> bool:
        """True iff a record filter is set (what :meth:`hand_out` re-checks)."""
        return self._filters.program is not None

    @property
    def drained(self) -> bool:
        """True once every partition finished and every event read was taken."""
        return self._join.protocol.finished and not self._join.parked

    def hand_out(self, m):
        """An event of :meth:`poll_encoded` as it is handed out: data decoded and re-checked
        against the record filter (``None``: nothing of it matches); the filter schedule
        pruned as the frontier moves (:class:`~epochstream.transport.handout.HandOut`)."""
        return self._hand_out(m)

    def events(self, timeout: float | None = None) -> Iterator:
        """Yield, as they arrive, :class:`~epochstream.events.DataMessage` (decoded records in
        ``data``, encoded size in ``nbytes``) for data that passed the filter,
        :class:`~epochstream.events.LowerFrontierUpdate` for merged frontier changes and, with
        ``recover=True``, a :class:`~epochstream.events.Gap` where the subscriber re-joined
        (after it, the merged frontier is announced afresh from empty). Ends when every
        partition finished. ``timeout``: seconds without any event before ``TimeoutError``.
        With ``durable=``, epochs acked in an earlier session are skipped; ``ack`` needs whole
        epochs (:meth:`epochs`, :meth:`fetch`). Events read but not handed out stay: a new
        ``events()`` (after ``break``) starts with them."""
        pending = self._events_pending
        last = _time.monotonic()
        while True:
            if pending:  # what a step returned: iterators of events (kept if the caller breaks)
                item = pending[0]
                if type(item) is _GENERATOR:
                    for event in item:  # a break leaves the rest in the iterator, in pending
                        yield event
                    pending.popleft()
                else:
                    yield pending.popleft()
                last = _time.monotonic()  # the timeout counts from the last event taken
                continue
            got = self._step_events(0.1)
            if got is None:
                return
            if not got and timeout is not None and _time.monotonic() - last > timeout:
                raise TimeoutError(f"no message for {timeout} s from topic {self.topic!r}")
            pending.extend(got)

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
        self._join.links.unsettle_all()  # an outside wait on the sockets takes their signals
        return self._step_events(timeout)

    def _step_events(self, timeout: float) -> list | None:
        join = self._join
        got = join.poll(timeout)
        if not got:
            return None if join.protocol.finished and not join.parked else []
        # handed out (decoded) one at a time as they are consumed, never a whole poll's batch
        # at once: 256 messages of 1000 records decoded together kept ~256,000 objects alive
        # and made the garbage collector run ~1,000 times more (half the records/s, measured)
        return [self._hand_out.batch(got)]

    @property
    def sockets(self) -> tuple:
        """The ``zmq.Socket`` DEALERs of the current join, one per live partition: what an
        event loop waits on (readable) between non-blocking steps (:meth:`step_events`,
        ``wait_ready(0)``, ``fetch(no_wait=True)``). A re-join replaces them."""
        return tuple(self._join.links.partition_of)

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
        epoch yet"; never splits an epoch. Full contract: docs/consumers.md, "Pull".

        - ``max_epochs`` (int >= 1): at most this many epochs.
        - ``max_bytes`` (int >= 1 or ``None``): their ``nbytes`` (encoded payload bytes) sum to
          at most this; one that does not fit stays buffered for the next call; one larger on
          its own comes alone with status ``"epoch_too_large"``.
        - ``expires`` (seconds >= 0, or ``None``): wait at most about this long (to within
          0.05 s) for ``max_epochs`` epochs, then return those there are (``"ok"``) or none
          (``"timeout"``). ``None``: block until one is there, then return it with those that
          have already arrived.
        - ``no_wait``: process what has already arrived (up to about 0.1 s) and return the
          complete epochs (``"ok"``) or none (``"no_data"``); ``expires`` is then ignored.

        ``"no_data"`` also when the stream ended (``finished=True``, at once on every later
        call), when a newer fetch from another thread superseded this one
        (``superseded=True``) or a failure is pending. Epochs returned count as handed out as
        with :meth:`epochs` (``ack`` them with ``durable=``); :meth:`epochs` and :meth:`fetch`
        may be mixed, :meth:`events` may not. A partition silent for two of its publisher's
        heartbeat intervals plus 0.5 s ends a waiting fetch (not with ``recover=True``).

        Raises, only after every epoch that arrived before the failure was handed out (and
        again on every later call): :class:`~epochstream.errors.PublisherLost`,
        :class:`~epochstream.errors.PublisherAborted`,
        :class:`~epochstream.errors.SubscriberLagged`,
        :class:`~epochstream.errors.ProtocolError`,
        :class:`~epochstream.errors.HistoryUnavailable` /
        :class:`~epochstream.errors.SubscriptionExpired`; ``ValueError`` for invalid
        arguments or a closed subscriber.
        """
        check_fetch(max_epochs, max_bytes, expires)
        if self._closed:
            raise ValueError(f"fetch() on a closed Subscriber of topic {self.topic!r}")
        return self._stream.fetch(max_epochs, max_bytes, expires, no_wait,
                                  lambda: self._join.failure)

    def _step(self, slice_s: float):
        """One poll of the epoch stream (transport/stream.py): ``None`` once the stream ended,
        else ``(events, read_at, idle)``."""
        join = self._join
        reads = not join.parked and join.failure is None  # else poll does not read
        n = self.stats["messages"]
        got = join.poll(slice_s)
        if not got and join.protocol.finished and not join.parked:
            return None
        return got, (_time.monotonic() if reads else None), \
            not got and self.stats["messages"] == n

    def _check_heartbeats(self, read_at: float) -> None:
        """After a fetch's poll that read the sockets (at ``read_at``): a partition silent past
        its publisher's heartbeats is lost (not with ``recover=True``: transport/topic_join.py)."""
        if not self.recover:
            self._join.check_heartbeats(read_at)

    def _released(self, outputs: Iterator) -> Iterator:
        """The one stream of released epochs behind :meth:`epochs` and :meth:`fetch`
        (transport/release.py), over the handed-out events ``outputs``."""
        return self._release.released(outputs)

    def ack(self, epoch) -> None:
        """Acknowledge a handed-out epoch (an :class:`~epochstream.events.Epoch` or its time)
        of a durable subscription: the catalog then holds the new :attr:`position` (one write),
        and a resume never redelivers it. Raises ``ValueError`` without ``durable=`` or for an
        epoch that is not an unacked handed-out one (acked already, never handed out),
        :class:`~epochstream.errors.SubscriptionHeld` if this subscriber's hold was taken over,
        reset, dropped or expired (fencing: the ack is refused)."""
        durable = self._durable
        if durable is None or durable.acks is None:
            raise ValueError("ack() needs a durable subscription: Subscriber(..., durable=name)")
        if self._closed:
            raise ValueError(f"durable subscription {self.durable!r}: this subscriber is closed "
                             f"(it released its hold); open it again to ack")
        durable.ack(epoch.time if isinstance(epoch, Epoch) else epoch)

    @property
    def position(self) -> tuple | None:
        """The acked position of a durable subscription (a tuple of times: every epoch not at or
        beyond it was acked), or ``None`` without ``durable=`` (or before a ``"latest"`` start
        is resolved, when the join is ready)."""
        return None if self._durable is None else self._durable.position

    def close(self) -> None:
        """Say goodbye to every publisher (so it frees our state at once), close the sockets,
        and release a durable subscription's hold in the catalog. May be called from another
        thread: one iterating :meth:`epochs`/:meth:`events` meanwhile ends its wait at once and
        raises ``ValueError`` (the subscriber was closed)."""
        if self._closed:
            return
        self._closed = True
        self._close_links()
        self._close_catalog()

    def _close_links(self) -> None:
        self._join.retire_all()
        self._fill.close()

    def _close_catalog(self) -> None:
        if self._durable is not None:  # (a refused start: drops what it created)
            self._durable.release()

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


