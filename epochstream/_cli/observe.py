"""``epochstream metrics serve``, ``epochstream health`` and ``epochstream top``: a catalog's
frontiers, readers' lag and status (:mod:`epochstream.report`), for Prometheus, orchestrators
and people.

- ``metrics serve --catalog C --bind tcp://HOST:PORT`` serves ``/metrics``, ``/varz``,
  ``/topicz`` and ``/healthz`` (:mod:`epochstream.web`) until SIGINT or SIGTERM; it prints one
  line on stdout once it serves, ``metrics on http://HOST:PORT/metrics (catalog WHERE)``.
- ``health TOPIC``: exit status 0 healthy, 1 unhealthy (one line per problem on stdout), 2 an
  unknown topic or a catalog that cannot be read.
- ``top``: a live view of the report on a terminal, refreshed every ``--interval`` seconds,
  sorted by ``--sort`` (``s`` cycles the sort key, ``q`` or Ctrl-C quits, the terminal restored);
  ``--once`` (or stdout not a terminal) prints one report (a table, or the JSON of
  ``CatalogReport.to_json`` with ``--json``) and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from .catalogs import open_existing_catalog
from .errors import exit_on_errors
from .output import EXIT_USAGE, err, escape, fail, out, until_signal
from .params import CatalogToRead, new_app

if TYPE_CHECKING:  # rich is imported by the functions that print
    from rich.table import Table

__all__ = ["app", "commands", "serve_command", "health", "top"]

app = new_app(
    "metrics",
    help="Metrics of a catalog for Prometheus: 'epochstream metrics serve --catalog C --bind "
         "tcp://HOST:PORT' serves /metrics (Prometheus text format), /varz and /topicz (JSON) "
         "and /healthz. Needs the metrics extra: pip install 'epochstream[metrics]'.",
    short_help="Serve a catalog's metrics for Prometheus: metrics serve --bind.")

commands = typer.Typer()
"""The commands this module adds to the main app: ``health`` and ``top``."""


@app.command(
    "serve", short_help="Serve /metrics, /varz, /topicz and /healthz over HTTP.",
    help="Serve the catalog's metrics over HTTP on --bind until SIGINT or SIGTERM: /metrics "
         "(Prometheus text format; each scrape reads the catalog once), /varz and /topicz "
         "(JSON), /healthz (200 when every topic is healthy, else 503). Readers' status "
         "(ok, warn, stall, stop, rewind) is judged over the scrapes of the last --window "
         "seconds. Prints 'metrics on http://HOST:PORT/metrics (catalog WHERE)' once it serves.")
def serve_command(catalog: Annotated[Optional[str], typer.Option(
                      "--catalog", "-c", metavar="PATH",
                      help="Catalog directory or .sqlite file, postgresql://... URL, or "
                           "tcp://HOST:PORT service (default: $EPOCHSTREAM_CATALOG, else "
                           "./.epochstream/catalog.sqlite).")] = None,
                  bind: str = typer.Option("tcp://127.0.0.1:9464", "--bind", metavar="ENDPOINT",
                                           help="tcp://HOST:PORT to listen on (PORT may be *)."),
                  window: float = typer.Option(300.0, "--window", min=1.0,
                                               help="Seconds of samples a status is judged "
                                                    "over.")) -> None:
    with exit_on_errors(others=(ImportError,), hint="pip install 'epochstream[metrics]'"):
        from ..metrics import CatalogCollector
        from ..web import bind_socket, serve
    cat = open_existing_catalog(catalog)
    try:
        with exit_on_errors(usage=(ValueError,)):
            sock = bind_socket(bind)
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


@commands.command(
    short_help="Is TOPIC healthy? Exit status 0 yes, 1 no, 2 unknown.",
    help="Check TOPIC for an orchestrator: no partition aborted, dead or expired, no durable "
         "subscription expired, stalled or stopped, no consumer group stopped or stalled. "
         "Prints 'topic TOPIC: healthy', or one line per problem. Exit status 0 healthy, 1 "
         "unhealthy, 2 an unknown topic, a catalog that cannot be read, or bad usage.")
def health(topic: Annotated[str, typer.Argument(metavar="TOPIC")],
           catalog: CatalogToRead = None) -> None:
    """``epochstream health TOPIC`` (module docstring)."""
    from ..report import read_report
    from ..web import topic_problems

    cat = open_existing_catalog(catalog)
    with exit_on_errors(status=EXIT_USAGE):
        report = read_report(cat, [topic])
    found = topic_problems(report.topic(topic))
    console = out()
    if not found:
        console.print(f"topic {escape(topic)}: healthy")
        return
    for line in found:
        console.print(escape(line), soft_wrap=True)
    raise typer.Exit(1)


SORTS = ("lag", "name", "status")
"""What ``top`` sorts readers by (``s`` cycles): lag in seconds (largest first), name, status
(worst first)."""

_STATUS_RANK = {"rewind": 0, "stop": 1, "stall": 2, "warn": 3, "ok": 4}


def _fmt(frontier: tuple[Any, ...] | None) -> str:
    if frontier is None:
        return "-"
    return "[" + ", ".join(str(list(t)) if isinstance(t, tuple) else str(t)
                           for t in frontier) + "]"


def _tables(report: Any, sort: str, rates: dict[Any, float]) -> list[Table]:
    """The partitions table and the readers table of ``report`` (readers sorted by ``sort``;
    ``rates``: epochs/s of each total-order partition's upper frontier since the last view)."""
    from rich.table import Table  # here: rich only for a command that prints

    parts = Table("topic", "partition", "state", "run", "gen", "lower", "upper", "epochs/s",
                  "retained", box=None, header_style="bold")
    for t in report.topics:
        for p in t.partitions:
            rate = rates.get((t.name, p.partition))
            parts.add_row(t.name, str(p.partition), p.state, str(p.run), str(p.generation),
                          _fmt(p.lower), _fmt(p.upper), "-" if rate is None else f"{rate:.1f}",
                          "-" if p.retained is None else str(p.retained))
    rows = []
    for t in report.topics:
        for d in t.durables:
            rows.append((t.name, d.name, "durable", _fmt(d.position), d.lag_epochs, d.lag_seconds,
                         d.status if d.state == "active" else d.state))
        for g in t.groups:
            rows.append((t.name, g.name, "group", _fmt(g.position), g.lag_epochs, g.lag_seconds,
                         g.status if g.state == "active" else g.state))
    if sort == "lag":
        rows.sort(key=lambda r: (-r[5], r[0], r[1]))
    elif sort == "status":
        rows.sort(key=lambda r: (_STATUS_RANK.get(r[6], -1), -r[5], r[0], r[1]))
    else:
        rows.sort(key=lambda r: (r[0], r[1]))
    readers = Table("topic", "reader", "kind", "position", "lag epochs", "lag s", "status",
                    box=None, header_style="bold")
    for topic, name, kind, pos, lag_epochs, lag_s, status in rows:
        readers.add_row(topic, name, kind, pos, str(lag_epochs), f"{lag_s:.1f}", status)
    return [parts, readers]


def _rates(report: Any, before: Any) -> dict[Any, float]:
    """Epochs/s of each total-order partition's upper frontier between two reports."""
    if before is None or report.at <= before.at:
        return {}
    old = {(t.name, p.partition): p.upper for t in before.topics for p in t.partitions}
    out = {}
    for t in report.topics:
        if t.order != "total":
            continue
        for p in t.partitions:
            prev = old.get((t.name, p.partition))
            if prev and p.upper:
                out[(t.name, p.partition)] = (max(p.upper) - max(prev)) / (report.at - before.at)
    return out


def _live(cat: Any, interval: float, sort: str, window: float) -> None:
    """The live view (module docstring) until ``q`` or Ctrl-C."""
    import select
    import termios
    import tty

    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from ..lag import LagWindow
    from ..report import read_report

    lags = LagWindow(window)
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    before = None
    try:
        if fd is not None:
            tty.setcbreak(fd)  # keys one by one, no echo; Ctrl-C still interrupts
        with Live(console=out(), auto_refresh=False, screen=False) as live:
            while True:
                report = read_report(cat, window=lags)
                head = Text(f"catalog {report.catalog}  ·  "
                            f"{time.strftime('%H:%M:%S', time.localtime(report.at))}  ·  "
                            f"sort: {sort}  ·  s: sort  q: quit")
                live.update(Group(head, *_tables(report, sort, _rates(report, before))),
                            refresh=True)
                before = report
                deadline = time.monotonic() + interval
                while (left := deadline - time.monotonic()) > 0:
                    if fd is None:
                        time.sleep(left)
                        break
                    ready, _, _ = select.select([fd], [], [], left)
                    if not ready:
                        break
                    key = os.read(fd, 1)
                    if key in (b"q", b"Q", b""):
                        return
                    if key in (b"s", b"S"):
                        sort = SORTS[(SORTS.index(sort) + 1) % len(SORTS)]
                        break
    except KeyboardInterrupt:
        return
    finally:
        if fd is not None and saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@commands.command(
    short_help="A live view of a catalog's topics, frontiers and readers' lag.",
    help="Report every topic of the catalog: partitions (state, run, generation, lower and "
         "upper frontier, retained epochs) and readers -- durable subscriptions and consumer "
         "groups -- with their lag in epochs and seconds and their status (ok, warn, stall, "
         "stop, rewind; docs/operations.md). On a terminal a live view, refreshed every "
         "--interval seconds ('s' cycles the sort, 'q' or Ctrl-C quits); --once, --json, or "
         "stdout not a terminal: one report (a table, or JSON) and exit.")
def top(catalog: CatalogToRead = None,
        once: bool = typer.Option(False, "--once", help="Print one report and exit."),
        as_json: bool = typer.Option(False, "--json", help="Print one report as JSON and exit."),
        interval: float = typer.Option(2.0, "--interval", min=0.1, metavar="SECONDS",
                                       help="Seconds between two refreshes of the live view."),
        sort: str = typer.Option("lag", "--sort", metavar="KEY",
                                 help="Sort readers by lag (largest first), name or status "
                                      "(worst first); 's' cycles it in the live view."),
        window: float = typer.Option(300.0, "--window", min=1.0, metavar="SECONDS",
                                     help="Seconds of refreshes a reader's status is judged "
                                          "over.")) -> None:
    """``epochstream top`` (module docstring)."""
    from ..report import read_report

    if sort not in SORTS:
        raise fail(f"--sort must be one of {', '.join(SORTS)}, got {sort!r}", EXIT_USAGE)
    cat = open_existing_catalog(catalog)
    if not (once or as_json) and sys.stdout.isatty():
        with exit_on_errors():
            _live(cat, interval, sort, window)
        return
    with exit_on_errors():
        report = read_report(cat)
    if as_json:
        typer.echo(json.dumps(report.to_json(), sort_keys=True))
        return
    console = out()
    console.print(f"catalog {escape(report.catalog)}")
    parts, readers = _tables(report, sort, {})
    console.print(parts)
    if readers.row_count:
        console.print(readers)
