"""The HTTP front of a catalog's metrics: ``/metrics``, ``/varz``, ``/topicz``, ``/healthz``.

An ASGI application (Starlette) served by uvicorn -- no HTTP server of our own. Needs the
``metrics`` extra (``pip install 'epochstream[metrics]'``). ``epochstream metrics serve``
runs :func:`serve` in the foreground.

- ``GET /metrics``: the Prometheus text format of a
  :class:`~epochstream.metrics.CatalogCollector` (its own registry: nothing global).
- ``GET /varz``: JSON in the spirit of NATS's ``/varz``: the server (version, start time,
  uptime seconds, scrapes), the catalog, and per topic its partitions' states and readers'
  worst lag.
- ``GET /topicz`` (``?topic=NAME`` for one): the full report of
  :func:`epochstream.report.read_report` as JSON (``CatalogReport.to_json``), statuses judged
  over the server's window.
- ``GET /healthz``: ``200 {"status": "ok"}`` when the catalog is readable and every topic is
  healthy (``TopicReport.healthy``), else ``503`` with ``{"status": "unhealthy", "problems":
  [...]}`` -- for an orchestrator's liveness or readiness probe.
"""

from __future__ import annotations

import socket
import threading
import time as _time
from typing import Any

from . import __version__
from .metrics import CatalogCollector, require_prometheus
from .report import CatalogReport, TopicReport

__all__ = ["app", "problems", "bind_socket", "serve", "serve_app"]


def problems(report: CatalogReport) -> list[str]:
    """What makes ``report`` unhealthy, one line each (``[]``: healthy)."""
    out = []
    for t in report.topics:
        out.extend(topic_problems(t))
    return out


def topic_problems(t: TopicReport) -> list[str]:
    """What makes topic ``t`` unhealthy, one line each."""
    out = [f"topic {t.name!r} partition {p.partition} is {p.state}" for p in t.partitions
           if p.state in ("aborted", "dead", "expired")]
    out += [f"topic {t.name!r} durable subscription {d.name!r} is "
            f"{'expired' if d.state != 'active' else d.status} (lag {d.lag_epochs} epochs, "
            f"{d.lag_seconds:.1f} s)" for d in t.durables
            if d.state != "active" or d.status in ("stall", "stop", "rewind")]
    out += [f"topic {t.name!r} consumer group {g.name!r} is "
            f"{'stopped' if g.state != 'active' else g.status} (lag {g.lag_epochs} epochs, "
            f"{g.lag_seconds:.1f} s)" for g in t.groups
            if g.state != "active" or g.status in ("stall", "stop", "rewind")]
    return out


def _summary(t: TopicReport) -> dict:
    states: dict[str, int] = {}
    for p in t.partitions:
        states[p.state] = states.get(p.state, 0) + 1
    readers = [*t.durables, *t.groups]
    return {"name": t.name, "order": t.order, "partitions": len(t.partitions),
            "partition_states": states, "durables": len(t.durables), "groups": len(t.groups),
            "max_lag_epochs": max((r.lag_epochs for r in readers), default=0),
            "max_lag_seconds": max((r.lag_seconds for r in readers), default=0.0),
            "healthy": t.healthy}


def app(collector: CatalogCollector) -> Any:
    """The ASGI application over ``collector`` (module docstring)."""
    require_prometheus()
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from starlette.concurrency import run_in_threadpool

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    started = _time.time()
    scrapes = {"metrics": 0, "varz": 0, "topicz": 0, "healthz": 0}
    lock = threading.Lock()

    def count(what: str) -> None:
        with lock:
            scrapes[what] += 1

    async def metrics(request: Request) -> Response:
        count("metrics")
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def varz(request: Request) -> Response:
        count("varz")
        reports = await run_in_threadpool(collector.read)
        return JSONResponse(_varz(collector, reports, started, scrapes))

    async def topicz(request: Request) -> Response:
        count("topicz")
        name = request.query_params.get("topic")
        reports = await run_in_threadpool(collector.read)
        body, status = _topicz(collector, reports, name)
        return JSONResponse(body, status_code=status)

    async def healthz(request: Request) -> Response:
        count("healthz")
        reports = await run_in_threadpool(collector.read)
        body, status = _healthz(collector, reports)
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/metrics", metrics), Route("/varz", varz),
                             Route("/topicz", topicz), Route("/healthz", healthz)])


def _where(catalog: Any) -> str:
    return getattr(catalog, "where", str(catalog))


def _varz(collector: CatalogCollector, reports: list[CatalogReport | None], started: float,
          scrapes: dict[str, int]) -> dict:
    """The body of ``/varz``: the server (``started``: when, ``scrapes``: the requests so far
    per endpoint), then each catalog of ``collector`` with its ``reports`` (``None``: it cannot
    be read) summed up per topic."""
    return {
        "server": {"version": __version__, "start": started,
                   "uptime_seconds": _time.time() - started, "requests": dict(scrapes)},
        "catalogs": [{"catalog": _where(c), "up": r is not None,
                      "topics": [] if r is None else [_summary(t) for t in r.topics]}
                     for c, r in zip(collector.catalogs, reports)]}


def _topicz(collector: CatalogCollector, reports: list[CatalogReport | None],
            name: str | None) -> tuple[dict, int]:
    """The body and status of ``/topicz``: each catalog's full report (only topic ``name``
    when given: 404 if no catalog has it)."""
    out = []
    for c, r in zip(collector.catalogs, reports):
        if r is None:
            out.append({"catalog": _where(c), "up": False})
            continue
        data = r.to_json()
        if name is not None:
            data["topics"] = [t for t in data["topics"] if t["name"] == name]
        out.append({"up": True, **data})
    if name is not None and not any(c.get("topics") for c in out):
        return {"error": f"unknown topic {name!r}"}, 404
    return {"catalogs": out}, 200


def _healthz(collector: CatalogCollector,
             reports: list[CatalogReport | None]) -> tuple[dict, int]:
    """The body and status of ``/healthz``: 200 when every catalog can be read and every topic
    is healthy, else 503 with the problems."""
    found = []
    for c, r in zip(collector.catalogs, reports):
        found += ([f"catalog {getattr(c, 'where', c)} cannot be read"] if r is None
                  else problems(r))
    if found:
        return {"status": "unhealthy", "problems": found}, 503
    return {"status": "ok"}, 200


def bind_socket(bind: str) -> socket.socket:
    """A listening TCP socket for ``tcp://HOST:PORT`` (``*`` or 0: any free port; ``HOST`` may
    be ``*`` for every interface). Raises ``ValueError`` for another form, ``OSError`` if the
    address cannot be bound."""
    if not bind.startswith("tcp://") or ":" not in bind[6:]:
        raise ValueError(f"--bind must be tcp://HOST:PORT (PORT may be *), got {bind!r}")
    host, _, port = bind[6:].rpartition(":")
    host = "0.0.0.0" if host in ("*", "") else host.strip("[]")
    try:
        number = 0 if port == "*" else int(port)
    except ValueError:
        raise ValueError(f"--bind: port must be a number or *, got {port!r}") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, number))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(collector: CatalogCollector, sock: socket.socket, stop: threading.Event) -> None:
    """Serve :func:`app` on the listening ``sock`` (uvicorn, in a thread of its own) until
    ``stop`` is set; returns once the server has shut down (up to 10 s)."""
    serve_app(app(collector), sock, stop)


def serve_app(asgi: Any, sock: socket.socket, stop: threading.Event,
              name: str = "epochstream-metrics") -> None:
    """Serve the ASGI application ``asgi`` on ``sock`` with uvicorn (in a thread ``name``-http)
    until ``stop`` is set; returns once the server has shut down (up to 10 s)."""
    import uvicorn

    config = uvicorn.Config(asgi, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"{name}-http")
    thread.start()  # (not the main thread: uvicorn leaves signals to the caller)
    while not stop.wait(0.2):
        if not thread.is_alive():
            break
    server.should_exit = True
    thread.join(10)
