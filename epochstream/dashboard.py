"""The dashboard: a web page of a catalog's topics, their frontiers advancing over time, their
readers' lag over time with its status, and an epoch browser (docs/operations.md, "Dashboard").

Served by Starlette and uvicorn (the ``metrics`` extra), offline: the page, its script and the
chart library (uPlot, MIT, vendored in ``epochstream/_dashboard/vendor`` with its license) come
from this package, nothing from a CDN. The page polls ``/api/state`` every second (live
updates).

- :class:`DashboardHistory` (pure): bounded series of what the catalog said at each sample —
  per partition its lower and upper frontier, per durable subscription and consumer group its
  lag in epochs and seconds and its Burrow-style status (:mod:`epochstream.lag`).
- :class:`Dashboard`: a sampler thread (one :func:`~epochstream.report.read_report` per
  ``interval`` seconds, through a :class:`~epochstream.metrics.CatalogCollector`, so statuses
  are judged over its window) and the HTTP server; ``Dashboard(catalog, "tcp://127.0.0.1:8080")
  .start()``, :attr:`Dashboard.url`, :meth:`Dashboard.stop`.

Endpoints: ``/`` the page; ``/api/state`` the series (JSON); ``/api/epochs?topic=T`` the
retained epochs (newest first, at most ``limit``); ``/api/epoch?topic=T&time=JSON&page=N`` one
epoch's records, ``size`` (default 50) per page; ``/healthz`` as the metrics server's.

A frontier is plotted as one number: a total order's single time; a product order's smallest
first coordinate over the antichain (the outer epoch every element has reached); the empty
frontier (a finished partition) as a gap.
"""

from __future__ import annotations

import collections
import json
import pathlib
import threading
import time as _time
from typing import Any

from .metrics import CatalogCollector, require_prometheus
from .report import CatalogReport, jsonable as _plain  # tuples as lists, NaN as None

__all__ = ["DashboardHistory", "Dashboard", "frontier_value", "epoch_list", "epoch_page",
           "dashboard_app", "STATIC"]

#: where the page, its script and the vendored chart library live
STATIC = pathlib.Path(__file__).with_name("_dashboard")


def frontier_value(frontier) -> int | None:
    """A frontier (a tuple of times) as the one number the page plots (module docstring);
    ``None`` for the empty frontier or none."""
    if not frontier:
        return None
    firsts = [t[0] if isinstance(t, (tuple, list)) else t for t in frontier]
    return min(firsts)


class DashboardHistory:
    """The last ``keep`` samples of a catalog's reports (``add`` each), as series per partition
    and per reader. Pure: no I/O, no clock of its own (each report carries its ``at``)."""

    def __init__(self, keep: int = 600):
        self.keep = int(keep)
        self.samples = 0
        self._parts: dict[tuple, dict] = {}
        self._readers: dict[tuple, dict] = {}
        self._latest: CatalogReport | None = None
        self._lock = threading.Lock()

    def _series(self, table: dict, key: tuple, names: tuple) -> dict:
        s = table.get(key)
        if s is None:
            s = table[key] = {n: collections.deque(maxlen=self.keep) for n in ("t", *names)}
        return s

    def add(self, report: CatalogReport) -> None:
        """One sample: every partition's frontiers, every reader's lag and status."""
        with self._lock:
            self.samples += 1
            self._latest = report
            for t in report.topics:
                for p in t.partitions:
                    s = self._series(self._parts, (t.name, p.partition), ("lower", "upper"))
                    s["t"].append(report.at)
                    s["lower"].append(frontier_value(p.lower))
                    s["upper"].append(frontier_value(p.upper))
                for kind, readers in (("durable", t.durables), ("group", t.groups)):
                    for r in readers:
                        s = self._series(self._readers, (t.name, kind, r.name),
                                         ("lag_epochs", "lag_seconds", "status"))
                        s["t"].append(report.at)
                        s["lag_epochs"].append(r.lag_epochs)
                        s["lag_seconds"].append(round(r.lag_seconds, 3))
                        s["status"].append(r.status)

    def to_json(self) -> dict:
        """``{"at", "samples", "topics": [{name, order, codec, lower, upper, partitions: [...,
        series], readers: [{kind, name, state, status, lag_epochs, lag_seconds, series}]}]}``
        (series: lists of equal length, ``t`` in seconds since the epoch)."""
        with self._lock:
            report = self._latest
            if report is None:
                return {"at": None, "samples": 0, "topics": []}
            topics = []
            for t in report.topics:
                parts = [{"partition": p.partition, "state": p.state, "lower": list(p.lower or ()),
                          "upper": list(p.upper), "retained": p.retained,
                          "series": _lists(self._parts.get((t.name, p.partition)))}
                         for p in t.partitions]
                readers = [{"kind": kind, "name": r.name, "state": r.state, "status": r.status,
                            "lag_epochs": r.lag_epochs, "lag_seconds": round(r.lag_seconds, 3),
                            "position": None if r.position is None else list(r.position),
                            "series": _lists(self._readers.get((t.name, kind, r.name)))}
                           for kind, rs in (("durable", t.durables), ("group", t.groups))
                           for r in rs]
                topics.append({"name": t.name, "order": t.order, "codec": t.codec,
                               "lower": None if t.lower is None else list(t.lower),
                               "upper": list(t.upper), "partitions": parts, "readers": readers})
            return _plain({"at": report.at, "samples": self.samples, "catalog": report.catalog,
                           "topics": topics})


def _lists(series: dict | None) -> dict:
    return {} if series is None else {k: list(v) for k, v in series.items()}




def epoch_list(catalog, topic: str, limit: int = 200) -> list:
    """The times of ``topic``'s retained complete epochs, newest first, at most ``limit``, with
    their record counts' source: ``[{"time", "partitions", "bytes"}]``. Raises
    :class:`~epochstream.errors.TopicNotFound`."""
    from .log.reader import History

    with History(topic, catalog) as h:
        recs = h.records()
    out = [{"time": t, "partitions": len(rs), "bytes": sum(r.nbytes for r in rs)}
           for t, rs in recs[-max(1, int(limit)):]]
    return _plain(out[::-1])


def epoch_page(catalog, topic: str, time: Any, page: int = 0, size: int = 50) -> dict:
    """Records ``page * size`` to ``(page + 1) * size`` of ``topic``'s retained epoch ``time``
    (decoded; Arrow rows as dicts): ``{"time", "total", "page", "size", "records"}``. Raises
    ``KeyError`` for an epoch not retained,
    :class:`~epochstream.errors.HistoryUnavailable`/``HistoryCorrupt`` as reading does."""
    from .log.reader import History
    from .wire import codec as codec_of

    with History(topic, catalog) as h:
        info = h.catalog.lookup(topic)
        want = tuple(time) if isinstance(time, list) else time
        found = [(t, rs) for t, rs in h.records(info=info) if t == want]
        if not found:
            raise KeyError(f"topic {topic!r} retains no epoch {time!r}")
        rows: list = []
        decode = codec_of(info.codec).decode
        for _t, _recs, payloads in h.read(found, info=info):
            for _p, payload in payloads:
                data = decode(payload)
                rows.extend(data.to_pylist() if hasattr(data, "to_pylist") else data)
    page, size = max(0, int(page)), max(1, min(500, int(size)))
    return _plain({"time": want, "total": len(rows), "page": page, "size": size,
                   "records": [r if isinstance(r, dict) else list(r) if isinstance(r, tuple)
                               else r for r in rows[page * size:(page + 1) * size]]})


def dashboard_app(collector: CatalogCollector, history: DashboardHistory) -> Any:
    """The ASGI application (Starlette): the page, its static files, the JSON API."""
    require_prometheus()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from .web import _healthz

    catalog = collector.catalogs[0]

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def state(request: Request) -> Response:
        return JSONResponse(history.to_json())

    async def epochs(request: Request) -> Response:
        topic = request.query_params.get("topic", "")
        try:
            body = await run_in_threadpool(epoch_list, catalog, topic,
                                           int(request.query_params.get("limit", 200)))
        except Exception as e:  # noqa: BLE001 - the page shows it
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=404)
        return JSONResponse({"topic": topic, "epochs": body})

    async def epoch(request: Request) -> Response:
        q = request.query_params
        try:
            body = await run_in_threadpool(epoch_page, catalog, q.get("topic", ""),
                                           json.loads(q.get("time", "null")),
                                           int(q.get("page", 0)), int(q.get("size", 50)))
        except Exception as e:  # noqa: BLE001 - the page shows it
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=404)
        return JSONResponse(body)

    async def healthz(request: Request) -> Response:
        body, status = _healthz(collector, await run_in_threadpool(collector.read))
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/", index), Route("/api/state", state),
                             Route("/api/epochs", epochs), Route("/api/epoch", epoch),
                             Route("/healthz", healthz),
                             Mount("/static", StaticFiles(directory=STATIC))])


class Dashboard:
    """The dashboard of ``catalog`` (a :class:`~epochstream.catalog.Catalog` or a location) on
    ``bind`` (``tcp://HOST:PORT``, port ``*`` or 0: any free one), sampled every ``interval``
    seconds, statuses judged over ``window`` seconds, ``keep`` samples per series.
    :meth:`start` binds (``OSError``: the address is taken; ``ValueError``: a malformed
    ``bind``) and starts the sampler and the server threads; :meth:`stop` ends both."""

    def __init__(self, catalog, bind: str = "tcp://127.0.0.1:8080", *, interval: float = 1.0,
                 window: float = 300.0, keep: int = 600):
        self.collector = CatalogCollector(catalog, window=window)
        self.history = DashboardHistory(keep)
        self.bind, self.interval = bind, float(interval)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.url: str | None = None

    def sample(self) -> None:
        """Read the catalog once into the history (a failed read is skipped)."""
        report = self.collector.read()[0]
        if report is not None:
            self.history.add(report)

    def _sampling(self) -> None:
        while not self._stop.is_set():
            started = _time.monotonic()
            self.sample()
            self._stop.wait(max(0.05, self.interval - (_time.monotonic() - started)))

    def start(self) -> "Dashboard":
        from .web import bind_socket, serve_app

        sock = bind_socket(self.bind)
        host, port = sock.getsockname()[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self.url = f"http://{host}:{port}/"
        self.sample()
        app = dashboard_app(self.collector, self.history)
        for target, args, name in ((self._sampling, (), "epochstream-dashboard-sampler"),
                                   (serve_app, (app, sock, self._stop, "epochstream-dashboard"),
                                    "epochstream-dashboard-http")):
            th = threading.Thread(target=target, args=args, daemon=True, name=name)
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        """Stop sampling and serving (returns once both ended, up to ~10 s)."""
        self._stop.set()
        for th in self._threads:
            th.join(12)

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
