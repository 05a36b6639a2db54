"""OpenTelemetry metrics of a catalog, through ``opentelemetry-api`` only (the SDK, exporters
and their configuration are the application's): observable gauges and counters the meter
provider collects when it likes, each collection reading the catalog once
(:func:`~epochstream.report.read_report`, the same numbers as the Prometheus collector and the
CLI; docs/operations.md, "OpenTelemetry").

>>> from epochstream.otel import instrument                       # doctest: +SKIP
>>> handle = instrument(".epochstream", meter_provider=provider)  # doctest: +SKIP

Instruments (attributes in braces), OpenTelemetry's naming (dots, units apart):

=====================================  =========  =========================================
``epochstream.partition.lower_epoch``  gauge      ``{topic, partition}``: total orders only
``epochstream.partition.upper_epoch``  gauge      ``{topic, partition}``: total orders only
``epochstream.partition.live``         gauge      ``{topic, partition}``: 1 live, 0 otherwise
``epochstream.durable.lag_epochs``     gauge      ``{topic, name}``
``epochstream.durable.lag``            gauge, s   ``{topic, name}``: lag in seconds
``epochstream.group.lag_epochs``       gauge      ``{topic, group}``
``epochstream.group.lag``              gauge, s   ``{topic, group}``
``epochstream.group.pending_epochs``   gauge      ``{topic, group}``
``epochstream.group.redelivered``      counter    ``{topic, group}``: deliveries after the first
``epochstream.group.dead_lettered``    counter    ``{topic, group}``
=====================================  =========  =========================================
"""

from __future__ import annotations

import threading
import time as _time
from typing import Any, Callable, Iterable

from .lag import LagWindow
from .report import CatalogReport, read_report

__all__ = ["instrument", "Instrumented", "INSTRUMENTS"]

#: name -> (kind, unit, description)
INSTRUMENTS = {
    "epochstream.partition.lower_epoch": ("gauge", "1", "a total order's lower frontier"),
    "epochstream.partition.upper_epoch": ("gauge", "1", "a total order's upper frontier"),
    "epochstream.partition.live": ("gauge", "1", "1 if the partition's publisher is live"),
    "epochstream.durable.lag_epochs": ("gauge", "1", "complete epochs not acked"),
    "epochstream.durable.lag": ("gauge", "s", "now minus the completion of the oldest "
                                              "epoch not acked"),
    "epochstream.group.lag_epochs": ("gauge", "1", "complete epochs not settled"),
    "epochstream.group.lag": ("gauge", "s", "now minus the completion of the oldest epoch "
                                            "not settled"),
    "epochstream.group.pending_epochs": ("gauge", "1", "epochs neither settled nor leased"),
    "epochstream.group.redelivered": ("counter", "1", "deliveries after the first"),
    "epochstream.group.dead_lettered": ("counter", "1", "epochs dead-lettered"),
}


def _total(frontier) -> int | None:
    """A total order's frontier as its one time (``None``: empty, or not a total order)."""
    if frontier and len(frontier) == 1 and isinstance(frontier[0], int):
        return frontier[0]
    return None


def _observations(report: CatalogReport) -> dict[str, list[tuple[float, dict]]]:
    """``{instrument: [(value, attributes)]}`` of one report (pure)."""
    out: dict[str, list[tuple[float, dict]]] = {name: [] for name in INSTRUMENTS}
    for t in report.topics:
        for p in t.partitions:
            at = {"topic": t.name, "partition": p.partition}
            for name, frontier in (("lower_epoch", p.lower), ("upper_epoch", p.upper)):
                v = _total(frontier) if t.order == "total" else None
                if v is not None:
                    out[f"epochstream.partition.{name}"].append((float(v), at))
            out["epochstream.partition.live"].append((1.0 if p.state == "live" else 0.0, at))
        for d in t.durables:
            at = {"topic": t.name, "name": d.name}
            out["epochstream.durable.lag_epochs"].append((float(d.lag_epochs), at))
            out["epochstream.durable.lag"].append((float(d.lag_seconds), at))
        for g in t.groups:
            at = {"topic": t.name, "group": g.name}
            for name, value in (("lag_epochs", g.lag_epochs), ("lag", g.lag_seconds),
                                ("pending_epochs", g.pending),
                                ("redelivered", g.redelivered_total),
                                ("dead_lettered", g.dead_total)):
                out[f"epochstream.group.{name}"].append((float(value), at))
    return out


class Instrumented:
    """The instruments registered for one catalog (what :func:`instrument` returns): reads
    the catalog at most once per ``reuse`` seconds (one collection calls every callback in
    turn) and judges statuses over ``window`` seconds. :attr:`errors`: failed reads."""

    def __init__(self, catalog, meter: Any, *, window: float, reuse: float = 0.5):
        self.catalog, self.errors = catalog, 0
        self._window, self._reuse = LagWindow(window), reuse
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._now: dict[str, list[tuple[float, dict]]] = {}
        from opentelemetry.metrics import Observation

        def callback(name: str) -> Callable[..., Iterable]:
            def observe(options: Any) -> Iterable:
                return [Observation(v, a) for v, a in self._observe(name)]
            return observe

        self.instruments = []
        for name, (kind, unit, doc) in INSTRUMENTS.items():
            create = meter.create_observable_counter if kind == "counter" else \
                meter.create_observable_gauge
            self.instruments.append(create(name, callbacks=[callback(name)], unit=unit,
                                           description=doc))

    def _observe(self, name: str) -> list[tuple[float, dict]]:
        with self._lock:
            if _time.monotonic() - self._read_at > self._reuse:
                try:
                    self._now = _observations(read_report(self.catalog, window=self._window))
                except Exception:  # noqa: BLE001 - a failed read observes nothing this time
                    self.errors += 1
                    self._now = {}
                self._read_at = _time.monotonic()
            return self._now.get(name, [])


def instrument(catalog, meter_provider: Any = None, *, window: float = 300.0) -> Instrumented:
    """Register :data:`INSTRUMENTS` for ``catalog`` (a :class:`~epochstream.catalog.Catalog`
    or a location) with ``meter_provider`` (``None``: OpenTelemetry's global one; nothing is
    exported until the application configures a provider with a reader). ``ImportError``
    without ``opentelemetry-api`` (``pip install 'epochstream[otel]'``)."""
    from opentelemetry import metrics

    from . import __version__
    from .transport.discovery import resolve_catalog

    provider = meter_provider or metrics.get_meter_provider()
    meter = provider.get_meter("epochstream", __version__)
    return Instrumented(resolve_catalog(catalog), meter, window=window)
