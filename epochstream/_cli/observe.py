"""``epochstream metrics serve``, ``epochstream health`` and ``epochstream top``: a catalog's
frontiers, readers' lag and status (:mod:`epochstream.report`), for Prometheus, orchestrators
and people.

- ``metrics serve --catalog C --bind tcp://HOST:PORT`` serves ``/metrics``, ``/varz``,
  ``/topicz`` and ``/healthz`` (:mod:`epochstream.web`) until SIGINT or SIGTERM; it prints one
  line on stdout once it serves, ``metrics on http://HOST:PORT/metrics (catalog WHERE)``.
- ``health TOPIC``: exit status 0 healthy, 1 unhealthy (one line per problem on stdout), 2 an
  unknown topic or a catalog that cannot be read.
- ``top --once [--json]``: one report on stdout (a table, or the JSON of
  ``CatalogReport.to_json``).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import EpochstreamError
from .catalogs import open_existing_catalog
from .output import EXIT_USAGE, err, fail, out, until_signal

__all__ = ["metrics_app", "health", "top"]

metrics_app = typer.Typer(
    name="metrics",
    help="Metrics of a catalog for Prometheus: 'epochstream metrics serve --catalog C --bind "
         "tcp://HOST:PORT' serves /metrics (Prometheus text format), /varz and /topicz (JSON) "
         "and /healthz. Needs the metrics extra: pip install 'epochstream[metrics]'.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_CATALOG = typer.Option(
    None, "--catalog", "-c", metavar="PATH",
    help="Catalog directory or .sqlite file, postgresql://... URL, or tcp://HOST:PORT service "
         "(default: $EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite).")


@metrics_app.command(
    "serve", short_help="Serve /metrics, /varz, /topicz and /healthz over HTTP.",
    help="Serve the catalog's metrics over HTTP on --bind until SIGINT or SIGTERM: /metrics "
         "(Prometheus text format; each scrape reads the catalog once), /varz and /topicz "
         "(JSON), /healthz (200 when every topic is healthy, else 503). Readers' status "
         "(ok, warn, stall, stop, rewind) is judged over the scrapes of the last --window "
         "seconds. Prints 'metrics on http://HOST:PORT/metrics (catalog WHERE)' once it serves.")
def serve_command(catalog: Optional[str] = _CATALOG,
                  bind: str = typer.Option("tcp://127.0.0.1:9464", "--bind", metavar="ENDPOINT",
                                           help="tcp://HOST:PORT to listen on (PORT may be *)."),
                  window: float = typer.Option(300.0, "--window", min=1.0,
                                               help="Seconds of samples a status is judged "
                                                    "over.")) -> None:
    try:
        from ..metrics import CatalogCollector
        from ..web import bind_socket, serve
    except ImportError as e:
        raise fail(f"{e}", hint="pip install 'epochstream[metrics]'") from None
    cat = open_existing_catalog(catalog)
    try:
        sock = bind_socket(bind)
    except ValueError as e:
        raise fail(str(e), EXIT_USAGE) from None
    except OSError as e:
        raise fail(f"cannot listen on {bind}: {e}") from None
    host, port = sock.getsockname()[:2]
    out().print(escape(f"metrics on http://{host}:{port}/metrics (catalog {cat.where})"),
                soft_wrap=True)
    sys.stdout.flush()
    try:
        with until_signal() as stop:
            serve(CatalogCollector(cat, window=window), sock, stop)
    finally:
        sock.close()
    err().print("metrics server stopped")


def health(topic: str, catalog: Optional[str]) -> None:
    """``epochstream health TOPIC`` (module docstring)."""
    from ..report import read_report
    from ..web import topic_problems

    cat = open_existing_catalog(catalog)
    try:
        report = read_report(cat, [topic])
    except EpochstreamError as e:
        raise fail(str(e), EXIT_USAGE) from None
    found = topic_problems(report.topic(topic))
    console = out()
    if not found:
        console.print(f"topic {escape(topic)}: healthy")
        return
    for line in found:
        console.print(escape(line), soft_wrap=True)
    raise typer.Exit(1)


def _fmt(frontier: tuple[Any, ...] | None) -> str:
    if frontier is None:
        return "-"
    return "[" + ", ".join(str(list(t)) if isinstance(t, tuple) else str(t)
                           for t in frontier) + "]"


def top(catalog: Optional[str], once: bool, as_json: bool) -> None:
    """``epochstream top`` (module docstring): one report."""
    from ..report import read_report

    if not once:
        raise fail("only --once is available yet: the live view comes next "
                   "(use: epochstream top --once [--json])", EXIT_USAGE)
    cat = open_existing_catalog(catalog)
    try:
        report = read_report(cat)
    except EpochstreamError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(report.to_json(), sort_keys=True))
        return
    console = out()
    console.print(f"catalog {escape(report.catalog)}")
    parts = Table("topic", "partition", "state", "run", "gen", "lower", "upper", "retained",
                  box=None, header_style="bold")
    for t in report.topics:
        for p in t.partitions:
            parts.add_row(t.name, str(p.partition), p.state, str(p.run), str(p.generation),
                          _fmt(p.lower), _fmt(p.upper), "-" if p.retained is None
                          else str(p.retained))
    console.print(parts)
    readers = Table("topic", "reader", "kind", "position", "lag epochs", "lag s", "status",
                    box=None, header_style="bold")
    for t in report.topics:
        for d in t.durables:
            readers.add_row(t.name, d.name, "durable", _fmt(d.position), str(d.lag_epochs),
                            f"{d.lag_seconds:.1f}", d.status if d.state == "active" else d.state)
        for g in t.groups:
            readers.add_row(t.name, g.name, "group", _fmt(g.position), str(g.lag_epochs),
                            f"{g.lag_seconds:.1f}", g.status if g.state == "active" else g.state)
    if readers.row_count:
        console.print(readers)
