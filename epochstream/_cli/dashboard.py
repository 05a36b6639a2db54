"""``epochstream dashboard --catalog C --bind tcp://HOST:PORT``: the dashboard of a catalog
(:mod:`epochstream.dashboard`) until SIGINT or SIGTERM; it prints one line on stdout once it
serves, ``dashboard on http://HOST:PORT/ (catalog WHERE)``."""

from __future__ import annotations

import typer

from .catalogs import open_existing_catalog
from .errors import exit_on_errors
from .output import announce, err, fail, until_signal
from .params import CatalogToRead

__all__ = ["commands", "dashboard"]

commands = typer.Typer()
"""The command this module adds to the main app: ``dashboard``."""


@commands.command(
    "dashboard", short_help="Serve a web dashboard of a catalog: frontiers, lag, epochs.",
    help="Serve a web page of the catalog on --bind until SIGINT or SIGTERM: its topics; per "
         "partition the frontier over time; per durable subscription and consumer group the "
         "lag in epochs and seconds over time with its status; an epoch browser. Works "
         "offline. Prints 'dashboard on http://HOST:PORT/ (catalog WHERE)' once it serves. "
         "Needs the metrics extra: pip install 'epochstream[metrics]'.")
def dashboard(catalog: CatalogToRead = None,
              bind: str = typer.Option("tcp://127.0.0.1:8080", "--bind", metavar="ENDPOINT",
                                       help="tcp://HOST:PORT to listen on (PORT may be *)."),
              interval: float = typer.Option(1.0, "--interval", min=0.1,
                                             help="Seconds between samples of the catalog."),
              window: float = typer.Option(300.0, "--window", min=1.0,
                                           help="Seconds of samples a status is judged over.")
              ) -> None:
    with exit_on_errors(others=(ImportError,), hint="pip install 'epochstream[metrics]'"):
        from ..dashboard import Dashboard
    cat = open_existing_catalog(catalog)
    board = Dashboard(cat, bind, interval=interval, window=window)
    try:
        with exit_on_errors(usage=(ValueError,)):
            board.start()
    except OSError as e:
        raise fail(f"cannot listen on {bind}: {e}") from None
    announce(f"dashboard on {board.url} (catalog {cat.where})")
    try:
        with until_signal() as stop:
            stop.wait()
    finally:
        board.stop()
    err().print("dashboard stopped")
