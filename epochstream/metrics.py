"""Metrics for Prometheus: collectors the user registers into their own registry.

Nothing is registered at import and no server starts unless asked
(``epochstream metrics serve``, :func:`serve`). Needs ``prometheus_client``
(``pip install epochstream[metrics]``).

- :class:`CatalogCollector` reports what the catalog says (:func:`epochstream.report.read_report`:
  one read per scrape, the same numbers in every process): partitions' frontiers and state,
  retained history, durable subscriptions' and consumer groups' lag and status.
- :class:`PublisherCollector` reports a process's own publishers (their hot-path counters:
  nothing of it is in the catalog).

::

    from prometheus_client import CollectorRegistry, generate_latest
    from epochstream import Catalog
    from epochstream.metrics import CatalogCollector

    registry = CollectorRegistry()
    registry.register(CatalogCollector(Catalog("/var/lib/epochstream")))
    print(generate_latest(registry).decode())

**Names** (units in the name, Prometheus style; labels ``catalog`` -- the catalog's location,
password redacted -- and ``topic``, then ``partition``, ``name`` or ``group``):

- ``epochstream_partition_upper_epoch``, ``epochstream_partition_lower_epoch``: for a topic of
  total order, the frontier's single time (lower: the first epoch not complete; ``+Inf`` once
  the partition finished). Topics of a partial order (``product(k)``) report each frontier
  element's coordinates instead, as ``epochstream_partition_upper_time`` and
  ``epochstream_partition_lower_time`` with labels ``element`` (its index in the frontier,
  sorted) and ``dim`` (0..k-1), and ``epochstream_partition_frontier_elements`` (the
  antichain's width, label ``frontier`` = ``lower``/``upper``). An empty upper frontier (no data
  yet) has no sample; the lower frontier exists only for partitions with an epoch log.
- ``epochstream_partition_state{state}`` (1 for the partition's state), ``…_generation``,
  ``…_run``, ``epochstream_partition_retained_epochs``, ``…_retained_bytes``; with an
  object store, ``epochstream_partition_store_bytes`` and
  ``epochstream_partition_upload_backlog_segments``.
- ``epochstream_durable_lag_epochs``, ``epochstream_durable_lag_seconds``,
  ``epochstream_durable_last_ack_timestamp_seconds``, ``epochstream_durable_status{status}``,
  ``epochstream_durable_expired``.
- ``epochstream_group_pending_epochs``, ``…_leased_epochs``, ``…_lag_epochs``,
  ``…_lag_seconds``, ``…_status{status}``, ``…_stopped``, and the counters
  ``epochstream_group_redelivered_total``, ``…_acked_total``, ``…_dead_lettered_total``.
- ``epochstream_catalog_up`` (1 if the last read succeeded), ``…_read_seconds``.

Two catalogs go into one registry as one collector, ``CatalogCollector(a, b)`` (their series
differ by the ``catalog`` label); registering two collectors that report the same names into one
registry is refused by ``prometheus_client`` (``Duplicated timeseries``).
"""

from __future__ import annotations

import threading
import time as _time
from typing import Any, Iterable

from .lag import STATUSES, LagWindow
from .report import CatalogReport, TopicReport, read_report

__all__ = ["CatalogCollector", "PublisherCollector", "SubscriberCollector", "metric_families",
           "require_prometheus"]


def require_prometheus() -> Any:
    """The ``prometheus_client`` module; raises ``ImportError`` naming the extra to install."""
    try:
        import prometheus_client
    except ImportError as e:  # pragma: no cover - exercised without the extra only
        raise ImportError("epochstream.metrics needs prometheus_client: "
                          "pip install 'epochstream[metrics]'") from e
    return prometheus_client


def _order_dims(order_name: str) -> int | None:
    """``None`` for a total order; the number of coordinates of a ``product(k)`` order."""
    if order_name == "total":
        return None
    if order_name.startswith("product(") and order_name.endswith(")"):
        return int(order_name[len("product("):-1])
    return -1  # another order: its frontiers are not exported as numbers


def metric_families(report: CatalogReport, *, up: bool = True, read_seconds: float = 0.0
                    ) -> list:
    """The Prometheus metric families of ``report`` (module docstring)."""
    require_prometheus()
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    c = report.catalog
    fam: dict[str, Any] = {}

    def gauge(name: str, doc: str, labels: list[str]):
        if name not in fam:
            fam[name] = GaugeMetricFamily(name, doc, labels=["catalog", *labels])
        return fam[name]

    def counter(name: str, doc: str, labels: list[str]):
        if name not in fam:
            fam[name] = CounterMetricFamily(name, doc, labels=["catalog", *labels])
        return fam[name]

    gauge("epochstream_catalog_up", "1 if the catalog was read in this scrape", []
          ).add_metric([c], 1.0 if up else 0.0)
    gauge("epochstream_catalog_read_seconds", "Seconds this scrape's catalog read took", []
          ).add_metric([c], read_seconds)
    for t in report.topics:
        _topic_families(c, t, gauge, counter)
    return list(fam.values())


def _topic_families(c: str, t: TopicReport, gauge, counter) -> None:
    gauge("epochstream_topic_partitions", "Partitions of the topic", ["topic"]
          ).add_metric([c, t.name], float(len(t.partitions)))
    _partition_families(c, t, gauge)
    _reader_families(c, t, gauge, counter)


def _partition_families(c: str, t: TopicReport, gauge) -> None:
    dims = _order_dims(t.order)
    for p in t.partitions:
        lab = [c, t.name, str(p.partition)]
        for state in ("live", "closed", "aborted", "dead", "expired", "unregistered"):
            gauge("epochstream_partition_state", "1 for the partition's state",
                  ["topic", "partition", "state"]).add_metric([*lab, state],
                                                              1.0 if p.state == state else 0.0)
        gauge("epochstream_partition_generation", "The partition's generation (registrations)",
              ["topic", "partition"]).add_metric(lab, float(p.generation))
        gauge("epochstream_partition_run", "The topic run the partition belongs to",
              ["topic", "partition"]).add_metric(lab, float(p.run))
        if p.retained is not None:
            gauge("epochstream_partition_retained_epochs", "Epochs in the partition's epoch log",
                  ["topic", "partition"]).add_metric(lab, float(p.retained))
            gauge("epochstream_partition_retained_bytes", "Bytes of the partition's epoch log "
                  "segments", ["topic", "partition"]).add_metric(lab, float(p.retained_bytes or 0))
        if p.store_bytes is not None:
            gauge("epochstream_partition_store_bytes", "Bytes of the partition's epoch log "
                  "objects in its object store", ["topic", "partition"]
                  ).add_metric(lab, float(p.store_bytes))
            gauge("epochstream_partition_upload_backlog_segments", "Sealed segments of the "
                  "partition's epoch log not in its object store yet", ["topic", "partition"]
                  ).add_metric(lab, float(p.upload_backlog or 0))
        for which, frontier in (("upper", p.upper), ("lower", p.lower)):
            if frontier is None:
                continue
            if dims is None:
                if which == "upper" and frontier:
                    gauge("epochstream_partition_upper_epoch", "Total order: the newest epoch "
                          "the partition sent data at", ["topic", "partition"]
                          ).add_metric(lab, float(max(frontier)))
                elif which == "lower":
                    gauge("epochstream_partition_lower_epoch", "Total order: the first epoch "
                          "not complete in the partition (+Inf once it finished)",
                          ["topic", "partition"]).add_metric(
                        lab, float(min(frontier)) if frontier else float("inf"))
            elif dims > 0:
                gauge("epochstream_partition_frontier_elements", "Elements of the partition's "
                      "frontier (an antichain)", ["topic", "partition", "frontier"]
                      ).add_metric([*lab, which], float(len(frontier)))
                for k, element in enumerate(sorted(frontier)):
                    for dim, value in enumerate(element):
                        gauge(f"epochstream_partition_{which}_time", "Partial order: coordinate "
                              "dim of element element of the partition's frontier",
                              ["topic", "partition", "element", "dim"]
                              ).add_metric([*lab, str(k), str(dim)], float(value))


def _reader_families(c: str, t: TopicReport, gauge, counter) -> None:
    for d in t.durables:
        lab = [c, t.name, d.name]
        gauge("epochstream_durable_lag_epochs", "Complete epochs the durable subscription has "
              "not acked", ["topic", "name"]).add_metric(lab, float(d.lag_epochs))
        gauge("epochstream_durable_lag_seconds", "Seconds since the oldest complete epoch the "
              "durable subscription has not acked completed", ["topic", "name"]
              ).add_metric(lab, d.lag_seconds)
        if d.acked_at is not None:
            gauge("epochstream_durable_last_ack_timestamp_seconds", "When the durable "
                  "subscription last acked (seconds since the epoch)", ["topic", "name"]
                  ).add_metric(lab, d.acked_at)
        gauge("epochstream_durable_expired", "1 if retention expired the durable subscription",
              ["topic", "name"]).add_metric(lab, 1.0 if d.state == "expired" else 0.0)
        for status in STATUSES:
            gauge("epochstream_durable_status", "1 for the durable subscription's status",
                  ["topic", "name", "status"]).add_metric([*lab, status],
                                                          1.0 if d.status == status else 0.0)
    for g in t.groups:
        lab = [c, t.name, g.name]
        for name, doc, value in (
                ("pending_epochs", "Complete epochs not leased yet (or free again)", g.pending),
                ("leased_epochs", "Units under a lease, not settled yet", g.leased),
                ("lag_epochs", "Complete epochs not all settled", g.lag_epochs),
                ("lag_seconds", "Seconds since the oldest complete epoch not settled completed",
                 g.lag_seconds),
                ("stopped", "1 if the group stopped", 1.0 if g.state != "active" else 0.0)):
            gauge(f"epochstream_group_{name}", doc, ["topic", "group"]).add_metric(
                lab, float(value))
        for name, doc, value in (
                ("redelivered", "Deliveries of a unit after its first", g.redelivered_total),
                ("acked", "Units acked", g.acked_total),
                ("dead_lettered", "Units dead-lettered", g.dead_total)):
            counter(f"epochstream_group_{name}", doc, ["topic", "group"]).add_metric(
                lab, float(value))
        for status in STATUSES:
            gauge("epochstream_group_status", "1 for the group's status",
                  ["topic", "group", "status"]).add_metric([*lab, status],
                                                           1.0 if g.status == status else 0.0)


class CatalogCollector:
    """A ``prometheus_client`` custom collector of one or more catalogs
    (``CatalogCollector(catalog, ...)``: :class:`~epochstream.catalog.Catalog` objects or
    locations). Each scrape reads every catalog once (:func:`~epochstream.report.read_report`)
    and judges readers' status over the samples of the last ``window`` seconds of scrapes.
    A catalog that cannot be read reports ``epochstream_catalog_up 0`` and nothing else.
    :attr:`last` is the last successful report of each catalog (for JSON endpoints)."""

    def __init__(self, *catalogs: Any, window: float = 300.0):
        from .transport.discovery import resolve_catalog

        if not catalogs:
            raise ValueError("CatalogCollector needs at least one catalog")
        self.catalogs = [resolve_catalog(c) for c in catalogs]
        self._windows = [LagWindow(window) for _ in self.catalogs]
        self._lock = threading.Lock()
        self.last: list[CatalogReport | None] = [None] * len(self.catalogs)

    def describe(self) -> list:
        """The families' names (so that a registry refuses a second collector of them)."""
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily("epochstream_catalog_up", "", labels=["catalog"])]

    def _read(self, i: int) -> tuple[CatalogReport | None, float]:
        """Read catalog ``i`` now: its report (``None`` if it cannot be read) and seconds."""
        t0 = _time.perf_counter()
        with self._lock:
            try:
                report = read_report(self.catalogs[i], window=self._windows[i])
            except Exception:  # noqa: BLE001 - reported as catalog_up 0
                return None, _time.perf_counter() - t0
            self.last[i] = report
        return report, _time.perf_counter() - t0

    def read(self) -> list[CatalogReport | None]:
        """Read every catalog now (a failed read: ``None``); keeps :attr:`last`."""
        return [self._read(i)[0] for i in range(len(self.catalogs))]

    def collect(self) -> Iterable:
        """One read of every catalog, as metric families (``prometheus_client``'s collector
        API; a catalog that cannot be read yields only ``epochstream_catalog_up 0``)."""
        from prometheus_client.core import GaugeMetricFamily

        for i, cat in enumerate(self.catalogs):
            report, seconds = self._read(i)
            if report is None:
                g = GaugeMetricFamily("epochstream_catalog_up", "1 if the catalog was read in "
                                      "this scrape", labels=["catalog"])
                g.add_metric([getattr(cat, "where", str(cat))], 0.0)
                yield g
                continue
            yield from metric_families(report, read_seconds=seconds)


class _Held:
    """The objects a process-local collector reports (``add``/``remove`` them any time; a
    scrape takes the list as it is then)."""

    def __init__(self, *held: Any):
        self._held = list(held)
        self._lock = threading.Lock()

    def add(self, obj: Any) -> None:
        """Report ``obj`` too, from the next scrape."""
        with self._lock:
            self._held.append(obj)

    def remove(self, obj: Any) -> None:
        """Stop reporting ``obj`` (its series disappear from the next scrape)."""
        with self._lock:
            self._held = [x for x in self._held if x is not obj]

    def describe(self) -> list:
        """Nothing: they come and go (the registry does not check their names)."""
        return []

    def held(self) -> list:
        with self._lock:
            return list(self._held)


class PublisherCollector(_Held):
    """A ``prometheus_client`` collector of this process's publishers
    (``PublisherCollector(pub, ...)``; :meth:`add`/:meth:`remove` later): per partition,
    data messages sent, subscribers, evictions, the epoch log's commits, and whether it is
    closed. Reads counters the publishers keep anyway (no cost on their hot path)."""

    def collect(self) -> Iterable:
        """The families of the publishers held now (``prometheus_client``'s collector API)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pubs = self.held()
        labels = ["topic", "partition"]
        counters = {key: CounterMetricFamily(f"epochstream_publisher_{name}", doc, labels=labels)
                    for key, name, doc in _PUBLISHER_COUNTERS}
        refused = CounterMetricFamily("epochstream_publisher_refusals",
                                      "What subscribers sent that the publisher refused, by "
                                      "reason (quota: a flood; cut: a connection cut; "
                                      "bad_message: malformed)", labels=[*labels, "reason"])
        gauges = {name: GaugeMetricFamily(f"epochstream_publisher_{name}", doc, labels=labels)
                  for name, doc in _PUBLISHER_GAUGES}
        for p in pubs:
            lab = [p.topic, str(p.partition)]
            stats = p.stats
            for key, family in counters.items():
                family.add_metric(lab, float(stats.get(key, 0)))
            for reason, key in (("quota", "peers_refused_quota"), ("cut", "connections_cut"),
                                ("bad_message", "bad_messages")):
                refused.add_metric([*lab, reason], float(stats.get(key, 0)))
            messages, nbytes, holding = p.queued()
            for name, value in (("subscribers", p.subscribers), ("queued_messages", messages),
                                ("queued_bytes", nbytes), ("stalled_subscribers", holding),
                                ("closed", 1 if p.closed else 0)):
                gauges[name].add_metric(lab, float(value))
        yield from (*counters.values(), refused, *gauges.values())


#: (stats key, metric name, help) of the publisher collector's counters
_PUBLISHER_COUNTERS = (
    ("data_messages", "data_messages", "Data messages the publisher's loop sent"),
    ("log_commits", "log_commits", "Group commits of the epoch log"),
    ("subscribers_evicted", "evictions", "Subscribers cut for falling behind"),
    ("subscribers_joined", "subscribers_joined", "Subscribers registered (hellos served)"),
    ("subscribers_lost", "subscribers_lost", "Subscribers found gone (their connection "
                                             "dropped)"))
#: (metric name, help) of its gauges
_PUBLISHER_GAUGES = (
    ("subscribers", "Subscribers registered now"),
    ("queued_messages", "Messages waiting in subscribers' backlogs"),
    ("queued_bytes", "Bytes waiting in subscribers' backlogs"),
    ("stalled_subscribers", "Flow-controlled subscribers holding the producer back"),
    ("closed", "1 once the publisher is closed or aborted"))


class SubscriberCollector(_Held):
    """A ``prometheus_client`` collector of this process's live subscribers
    (``SubscriberCollector(sub, ...)``; :meth:`add`/:meth:`remove` later): what the catalog
    cannot know, read from counters the subscribers keep anyway. Labels ``topic``,
    ``subscriber`` (the first 8 hex digits of its id), ``durable`` (its name, or empty):
    messages and bytes delivered, messages dropped by the join's filter, gaps, re-joins; for a
    total order the merged lower frontier received (``…_lower_epoch``), the last epoch handed out
    (``…_handed_out_epoch``) and ``epochstream_subscriber_lag_epochs``: epochs complete at this
    subscriber and not handed out yet (lower frontier minus the epoch after the last handed
    out) — its own consumer's lag; what waits in the publisher's backlog for it is the
    publisher's ``…_queued_messages``."""

    def collect(self) -> Iterable:
        """The families of the subscribers held now (``prometheus_client``'s collector API)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        subs = self.held()
        labels = ["topic", "subscriber", "durable"]
        counters = {key: CounterMetricFamily(f"epochstream_subscriber_{name}", doc, labels=labels)
                    for key, name, doc in (
                        ("delivered", "delivered_messages", "Data messages delivered"),
                        ("bytes", "delivered_bytes", "Payload bytes delivered"),
                        ("dropped", "dropped_messages", "Data messages the join's filter dropped"),
                        ("rejoins", "rejoins", "Re-joins (recover=True)"))}
        gaps = CounterMetricFamily("epochstream_subscriber_gaps", "Gaps reported", labels=labels)
        gauges = {key: GaugeMetricFamily(f"epochstream_subscriber_{key}", doc, labels=labels)
                  for key, doc in (("lower_epoch", "total order: the merged lower frontier "
                                                   "received"),
                                   ("handed_out_epoch", "total order: the last epoch handed out"),
                                   ("lag_epochs", "total order: epochs complete here, not "
                                                  "handed out yet"))}
        for s in subs:
            lab = [s.topic, s.id[:8], s.durable or ""]
            for key, family in counters.items():
                family.add_metric(lab, float(s.stats.get(key, 0)))
            gaps.add_metric(lab, float(len(s.gaps)))
            lower, last = s.lower, s.last_epoch
            if getattr(s.order, "name", None) == "total" and len(lower) == 1:
                gauges["lower_epoch"].add_metric(lab, float(lower[0]))
                if last is not None:
                    gauges["handed_out_epoch"].add_metric(lab, float(last))
                    since = last + 1
                else:  # nothing handed out yet: the epochs complete since it joined
                    since = min((x.lower[0] for x in s.snapshots.values() if x.lower),
                                default=lower[0])
                gauges["lag_epochs"].add_metric(lab, float(max(0, lower[0] - since)))
        yield from (*counters.values(), gaps, *gauges.values())
