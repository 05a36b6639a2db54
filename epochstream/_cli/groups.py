"""``epochstream group ls|info|reset|drop``: consumer groups as a typer sub-app — list them,
show one with every unit it leases, re-activate a stopped one, delete one (what they show:
:mod:`.group_views`)."""

from __future__ import annotations

import time

import typer

from ..catalog import Catalog
from ..catalog.group_records import GroupInfo
from ..catalog.history_records import position_available
from ..errors import HistoryUnavailable
from .catalogs import open_existing_catalog
from .errors import exit_on_errors
from .group_views import (GroupUnit, group_json, group_units, groups_table, info_json,
                          info_lines, print_stopped, process_text)
from .output import EXIT_ERROR, EXIT_USAGE, escape, fail, out
from .params import CatalogToChange, CatalogToRead, Name, Topic, TopicOrAll, new_app
from .positions import fmt_position

__all__ = ["app", "find_group", "refuse_if_leased", "reset_check"]

GROUP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    done\n"
    "  1    refused: workers hold live leases (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic or group; a group\n"
    "       whose position is no longer retained (reset)\n\n"
    "Consumer groups: docs/consumers.md."
)

app = new_app(
    "group",
    help="List, inspect, reset and drop consumer groups: workers that share the epochs of a "
         "topic with leases, acks and redelivery (epochstream.EpochGroup; docs/consumers.md).",
    short_help="List, inspect, reset and drop consumer groups.",
    epilog=GROUP_STATUS_HELP)


@app.command(
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
    topic: TopicOrAll = None,
    catalog: CatalogToRead = None,
    as_json: bool = typer.Option(False, "--json",
                                 help="Print one JSON object per consumer group."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
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
    print_stopped(g for g, _ in groups)


@app.command(
    "info", short_help="Show a consumer group and every unit it leases.",
    help="Show the consumer group NAME of TOPIC: its definition (mode, ack_wait, max_deliver, "
         "dead_letter), position and state, every leased unit with its worker, that worker's "
         "process (alive or gone), its deliveries and the seconds to its deadline, then the "
         "units acked and dead-lettered beyond the position and those given back (nak) that "
         "wait to be delivered again.",
    epilog=GROUP_STATUS_HELP)
def group_info(
    topic: Topic,
    name: Name,
    catalog: CatalogToRead = None,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
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
    print_stopped([g])


@app.command(
    "reset", short_help="Re-activate a stopped consumer group.",
    help="Re-activate the consumer group NAME of TOPIC after it stopped (an epoch was "
         "delivered max_deliver times without an ack and the group has no dead-letter topic): "
         "its workers' fetches lease epochs again, at the group's position. Fix the cause "
         "first. A group stopped because retention deleted epochs at or beyond its position "
         "cannot go on from there: drop it instead.",
    epilog=GROUP_STATUS_HELP)
def group_reset(topic: Topic, name: Name, catalog: CatalogToChange = None) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
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


@app.command(
    "drop", short_help="Delete a consumer group.",
    help="Delete the consumer group NAME of TOPIC and its state (leases, acks, delivery "
         "counts, position): a worker that opens it again starts a new group at the earliest "
         "retained epoch. Refused while a worker holds a live lease, unless --force (the "
         "workers' next fetch, ack or nak then fails).",
    epilog=GROUP_STATUS_HELP)
def group_drop(
    topic: Topic,
    name: Name,
    catalog: CatalogToChange = None,
    force: bool = typer.Option(False, "--force", "-f",
                               help="Drop it even while workers hold live leases."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
        order = cat.lookup(topic).order
        g = find_group(cat, topic, name)
        if not force:
            refuse_if_leased(g, group_units(cat, topic, name), "drop")
        cat.group_drop(topic, name)
    out().print(escape(f"dropped consumer group {name!r} of topic {topic!r} (it was at "
                       f"{fmt_position(order, g.position)})"), soft_wrap=True)


def find_group(cat: Catalog, topic: str, name: str) -> GroupInfo:
    """The consumer group ``name`` of ``topic`` (which exists); an unknown name ends the
    command (status 2), naming the topic's groups."""
    for g in cat.groups(topic):
        if g.name == name:
            return g
    known = ", ".join(g.name for g in cat.groups(topic)) or "none"
    raise fail(f"topic {topic!r} has no consumer group {name!r} (existing: {known})", EXIT_USAGE,
               hint=f"list them with: epochstream group ls {topic}")


def refuse_if_leased(g: GroupInfo, units: list[GroupUnit], verb: str) -> None:
    """End the command (status 1) if a worker holds a live lease of ``g`` (``--force`` skips
    this)."""
    now = time.time()
    live = [u for u in units if u.live(now)]
    if live:
        workers = sorted({f"{u.worker} ({process_text(u)})" for u in live})
        raise fail(f"consumer group {g.name!r} of topic {g.topic!r} has {len(live)} live "
                   f"lease(s), held by {', '.join(workers)}", EXIT_ERROR,
                   hint=f"stop its workers first, or pass --force to {verb} it anyway")


def reset_check(cat: Catalog, g: GroupInfo) -> None:
    """End the command (status 2) if ``g`` cannot go on after a reset: its position is no
    longer retained (retention deleted epochs it had not settled), and a reset does not move
    it."""
    if g.position is None:
        return
    from ..log.reader import History  # here: the log package only for a command that reads it

    try:
        since = History(g.topic, catalog=cat).since
    except HistoryUnavailable:
        return
    order = cat.lookup(g.topic).order
    if not position_available(order, g.position, since):
        raise fail(f"consumer group {g.name!r} of topic {g.topic!r} is at "
                   f"{fmt_position(order, g.position)}, older than what topic {g.topic!r} "
                   f"retains (since {fmt_position(order, since)}): a reset does not move a "
                   f"group's position", EXIT_USAGE,
                   hint=f"drop it (epochstream group drop {g.topic} {g.name}); the next worker "
                        f"creates it again at the earliest retained epoch")
