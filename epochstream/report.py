"""What a catalog says about its topics now: frontiers, retained history, readers and their lag.

:func:`read_report` is the one place where lag is computed from the catalog (definitions in
:mod:`epochstream.lag`), so every process that reports it -- a Spark driver, a sidecar, the
metrics server (:mod:`epochstream.metrics`), ``epochstream top`` and ``health`` -- reports the
same numbers, read from the catalog alone (no executor or publisher process is asked).

What the catalog holds, and so what a report has: each partition's registration (state, run,
generation) and its recorded **upper** frontier; for partitions with an epoch log
(``retention=``), the log's **lower** frontier as last indexed, its retained epochs and bytes,
and each indexed epoch's completion time; durable subscriptions (position, out-of-order acks,
last ack) and consumer groups (position, units per state, running totals). A partition without
a log has no lower frontier in the catalog (``PartitionReport.lower`` is ``None``: its
publisher's in-process metrics have it, :class:`epochstream.metrics.PublisherCollector`).

Everything is a frozen dataclass of plain values; :meth:`CatalogReport.to_json` gives the JSON
shape of ``epochstream top --once --json`` and the metrics server's ``/varz``.
"""

from __future__ import annotations

import dataclasses
import time as _time
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .catalog.history_records import store_usage
from .errors import EpochstreamError
from .frontier import Antichain
from .lag import LagWindow, Sample, evaluate, lag

__all__ = ["jsonable", "PartitionReport", "DurableReport", "GroupReport", "TopicReport", "CatalogReport",
           "read_report"]

@dataclass(frozen=True)
class PartitionReport:
    """One partition: ``state`` (``live``, ``closed``, ``aborted``, ``dead``, ``expired``, or
    ``unregistered``), ``run`` and ``generation`` (0 when unregistered), ``upper`` (the
    recorded upper frontier: a tuple of times), ``lower`` (the epoch log's lower frontier as
    last indexed, a tuple of times, ``()`` once finished; ``None`` without a log), ``retained``
    (epochs in its log), ``retained_bytes`` (bytes of its log's segments), ``since`` (the
    earliest retained position; ``None`` without a log), ``updated_at`` (``time.time()`` of
    the last registration, heartbeat or frontier write); with an object store
    (``Retention(store=...)``), ``store_bytes`` (bytes of its indexed objects) and
    ``upload_backlog`` (sealed segments not whole in the store yet), else ``None``
    (:func:`~epochstream.catalog.history_records.store_usage`)."""

    partition: int
    state: str
    run: int
    generation: int
    upper: tuple
    lower: tuple | None
    retained: int | None
    retained_bytes: int | None
    since: tuple | None
    updated_at: float | None
    store_bytes: int | None = None
    upload_backlog: int | None = None


@dataclass(frozen=True)
class DurableReport:
    """A durable subscription: ``state`` (``active``/``expired``), ``position``, ``acked``
    (out of order beyond it), ``lag_epochs`` and ``lag_seconds`` (:mod:`epochstream.lag`),
    ``acked_at`` (its last ack, ``time.time()`` seconds, or ``None``), ``holder_alive``, and
    ``status`` (``ok``, ``warn``, ``stall``, ``stop``, ``rewind``)."""

    name: str
    state: str
    position: tuple | None
    acked: tuple
    lag_epochs: int
    lag_seconds: float
    acked_at: float | None
    holder_alive: bool
    status: str


@dataclass(frozen=True)
class GroupReport:
    """A consumer group: ``state`` (``active``/``stopped``), ``mode``, ``position``,
    ``pending`` (complete epochs at or beyond the position never leased or free again: NATS's
    ``num_pending``), ``leased`` (units under a lease: ``num_ack_pending``), ``acked_total``,
    ``dead_total``, ``redelivered_total`` (running totals), ``lag_epochs``/``lag_seconds``
    (epochs not all settled), ``settled_at`` (the last settlement, the catalog's clock) and
    ``status``. In ``key_shared`` mode an epoch counts as settled once every bucket leased so
    far is settled."""

    name: str
    state: str
    mode: str
    position: tuple | None
    pending: int
    leased: int
    acked_total: int
    dead_total: int
    redelivered_total: int
    lag_epochs: int
    lag_seconds: float
    settled_at: float | None
    status: str


@dataclass(frozen=True)
class TopicReport:
    """A topic: ``order`` (its name), ``codec``, ``partitions`` (one :class:`PartitionReport`
    per index ``0..n-1``), ``lower`` (the merged lower frontier of the partitions with a log,
    ``None`` if none has one), ``upper`` (the merged recorded upper frontier), ``durables``
    and ``groups``."""

    name: str
    order: str
    codec: str
    partitions: tuple[PartitionReport, ...]
    lower: tuple | None
    upper: tuple
    durables: tuple[DurableReport, ...]
    groups: tuple[GroupReport, ...]

    @property
    def healthy(self) -> bool:
        """No partition aborted, dead or expired, no reader stalled, stopped or rewound, no
        group stopped and no durable subscription expired."""
        bad_readers = [d for d in self.durables if d.state != "active" or d.status
                       in ("stall", "stop", "rewind")]
        bad_groups = [g for g in self.groups if g.state != "active" or g.status
                      in ("stall", "stop", "rewind")]
        return not (bad_readers or bad_groups
                    or any(p.state in ("aborted", "dead", "expired") for p in self.partitions))


@dataclass(frozen=True)
class CatalogReport:
    """``at`` (``time.time()`` of the read), ``catalog`` (where, password redacted) and the
    ``topics`` (:class:`TopicReport`, by name)."""

    at: float
    catalog: str
    topics: tuple[TopicReport, ...]

    def topic(self, name: str) -> TopicReport:
        """The report of topic ``name``; raises ``KeyError``."""
        for t in self.topics:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict:
        """The report as JSON-ready values (tuples become lists; times as in the topic)."""
        return jsonable(dataclasses.asdict(self))


def jsonable(x: Any) -> Any:
    """``x`` as JSON-ready values: tuples (times of product orders) as lists, NaN as None."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


def _merge_lower(order, lowers: list[tuple]) -> tuple:
    """The merged lower frontier: the minimal elements of all partitions' lower frontiers."""
    a = Antichain(order)
    for low in lowers:
        a.extend(low)
    return tuple(a.elements)


def _merge_upper(order, uppers: list[tuple]) -> tuple:
    """The merged upper frontier: the maximal elements of all partitions' upper frontiers."""
    from .order import dual

    a = Antichain(dual(order))
    for up in uppers:
        a.extend(up)
    return tuple(a.elements)


def _topic(catalog: Catalog, info: Any, durables: list, groups: list, now: float,
           window: LagWindow | None) -> TopicReport:
    name = info.name
    order = info.order
    states = catalog.history_states(name)
    registered = {p.index: p for p in info.partition_info}
    parts = []
    for i in range(info.partitions):
        p, s = registered.get(i), states.get(i)
        parts.append(PartitionReport(
            i, "unregistered" if p is None else p.state, 0 if p is None else p.run,
            0 if p is None else p.generation, () if p is None else tuple(p.upper),
            None if s is None else tuple(s.lower),
            None if s is None else sum(seg.epochs for seg in s.segments),
            None if s is None else sum(seg.nbytes for seg in s.segments),
            None if s is None else tuple(s.since), None if p is None else p.updated_at,
            *((None, None) if s is None or s.store is None else store_usage(s)[::2])))
    lower = _merge_lower(order, [tuple(s.lower) for s in states.values()]) if states else None
    upper = _merge_upper(order, [pr.upper for pr in parts])
    # the indexed epochs, each with its completion time (the latest of its partitions'); only
    # those at or beyond the earliest reader's position when every reader has one
    positions = [d.position for d in durables] + [g.position for g in groups]
    epochs: dict[Any, float] = {}
    if positions and states:
        firsts = [min((a[0] if isinstance(a, tuple) else a) for a in pos)
                  for pos in positions if pos]
        min_t0 = None if any(pos is None for pos in positions) or not firsts else min(firsts)
        for p in states:
            for r in catalog.history_epochs(name, p, min_t0=min_t0):
                if r.time not in epochs or r.completed_at > epochs[r.time]:
                    epochs[r.time] = r.completed_at
    complete = [(t, c) for t, c in epochs.items()]
    low = lower if lower is not None else ()
    durable_reports = []
    for d in durables:
        lg = lag(order, d.position, d.acked, low, complete, now)
        committed = d.acked_at if d.acked_at is not None else d.created_at
        status = _status(window, ("durable", name, d.name), order, now, d.position, lg.epochs,
                         committed)
        durable_reports.append(DurableReport(d.name, d.state, d.position, tuple(d.acked),
                                             lg.epochs, lg.seconds, d.acked_at, d.holder_alive,
                                             status))
    group_reports = []
    for g in groups:
        leased = {u[0] for u in g.leased}
        done = {u[0] for u in (*g.acked, *g.dead)} - leased
        lg = lag(order, g.position, done, low, complete, now)
        pending = lag(order, g.position, done | leased, low, complete, now).epochs
        committed = g.settled_at if g.settled_at is not None else g.created_at
        status = _status(window, ("group", name, g.name), order, now, g.position, lg.epochs,
                         committed)
        group_reports.append(GroupReport(g.name, g.state, g.mode, g.position, pending,
                                         len(g.leased), g.acked_total, g.dead_total,
                                         g.redelivered_total, lg.epochs, lg.seconds,
                                         g.settled_at, status))
    return TopicReport(name, info.order_name, info.codec, tuple(parts), lower, upper,
                       tuple(durable_reports), tuple(group_reports))


def _status(window: LagWindow | None, key, order, now: float, position, lag_epochs: int,
            committed: float | None) -> str:
    sample = Sample(now, None if position is None else tuple(position), lag_epochs, committed)
    if window is None:
        return evaluate(order, [sample], now, 300.0)
    window.add(key, sample)
    return window.status(key, order, now)


def read_report(catalog: Catalog | Any = None, topics: list[str] | None = None, *,
                window: LagWindow | None = None, now: float | None = None) -> CatalogReport:
    """Read ``catalog`` (a :class:`~epochstream.catalog.Catalog`, a location, or ``None``: the
    default one) now and compute every topic's report (``topics``: only these). ``window``
    (a :class:`~epochstream.lag.LagWindow` kept across calls, e.g. by a metrics server) adds
    this read's samples and judges each reader's status over it; without one, each status is
    judged from this read alone (``ok`` or ``stop``). ``now``: ``time.time()`` seconds. Raises
    :class:`~epochstream.errors.CatalogError` if the catalog cannot be read; a topic dropped
    while being read is left out."""
    from .transport.discovery import resolve_catalog

    cat = resolve_catalog(catalog)
    now = _time.time() if now is None else float(now)
    if topics is None:  # the whole catalog: each table read once, not once per topic
        infos = cat.topics()
        durables: dict[str, list] = {}
        for d in cat.durables():
            durables.setdefault(d.topic, []).append(d)
        groups: dict[str, list] = {}
        for g in cat.groups():
            groups.setdefault(g.topic, []).append(g)
    else:
        infos = [cat.lookup(name) for name in topics]
        durables = {name: cat.durables(name) for name in topics}
        groups = {name: cat.groups(name) for name in topics}
    out = []
    for info in infos:
        try:
            out.append(_topic(cat, info, durables.get(info.name, []),
                              groups.get(info.name, []), now, window))
        except EpochstreamError:
            if topics is not None:
                raise
    if window is not None:
        keep = {(kind, t.name, r.name) for t in out
                for kind, readers in (("durable", t.durables), ("group", t.groups))
                for r in readers}
        window.forget(keep)
    return CatalogReport(now, getattr(cat, "where", str(cat)), tuple(out))
