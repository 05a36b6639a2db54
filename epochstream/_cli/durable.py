"""``epochstream durable ls|reset|drop``: durable subscriptions as a typer sub-app — ``ls``
(the table, consumer groups' rows too), ``reset`` (re-arm at a position, saying which epochs
that skips or delivers again, like Materialize's ``RESET``) and ``drop``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

import typer

from ..catalog import Catalog
from ..catalog.history_records import DurableInfo, position_available
from ..errors import EpochstreamError, HistoryUnavailable
from ..frontier import Antichain
from .catalogs import open_existing_catalog
from .errors import bad_value, exit_on_errors
from .formats import fmt_seconds
from .group_views import group_durable_json, group_durable_rows, group_units, print_stopped
from .output import EXIT_ERROR, EXIT_USAGE, err, escape, fail, out
from .params import CatalogToChange, CatalogToRead, Name, Topic, TopicOrAll, new_app
from .positions import TIME_HELP, fmt_position, fmt_times, parse_position
from .tail_output import dumps

if TYPE_CHECKING:  # rich is imported by the functions that print
    from rich.table import Table

__all__ = ["app", "STATE_STYLE", "holder_text", "durables_table", "durable_json", "find_durable",
           "refuse_if_held", "reset_target", "reset_report"]

DURABLE_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    done\n"
    "  1    refused: a live subscriber holds it (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic or name; a position\n"
    "       that is not retained\n"
)

app = new_app(
    "durable",
    help="List, reset and drop durable subscriptions: positions the catalog holds for "
         "subscribers created with durable=NAME (or epochstream tail --durable NAME).",
    short_help="List, reset and drop durable subscriptions.",
    epilog=DURABLE_STATUS_HELP)


@app.command(
    "ls", short_help="List durable subscriptions and their positions.",
    help="List the durable subscriptions (of TOPIC, or of every topic): the acked position "
         "(every epoch not at or beyond it was acked), epochs acked out of order beyond it, "
         "the state (active, or expired: retention deleted epochs it had not acked), who holds "
         "it and whether that process still runs, and when it last acked. Consumer groups are "
         "listed too, as group:NAME: their position is their acked frontier, their holder the "
         "workers with live leases (epochstream group ls shows more).",
    epilog=DURABLE_STATUS_HELP)
def durable_ls(
    topic: TopicOrAll = None,
    catalog: CatalogToRead = None,
    as_json: bool = typer.Option(
        False, "--json",
        help="Print one JSON object per durable subscription (\"kind\": \"durable\") or "
             "consumer group (\"kind\": \"group\")."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
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
    print_stopped(g for g, _ in groups)


@app.command(
    "reset", short_help="Move a durable subscription to another position.",
    help="Move the durable subscription NAME of TOPIC to --to (default: earliest, everything "
         "retained), active again and free, and say which epochs that skips (at or beyond the "
         "old position, not at or beyond the new one) or delivers again, like Materialize's "
         "RESET. Epochs acked out of order are forgotten. Refused while a live subscriber "
         "holds it, unless --force.",
    epilog=DURABLE_STATUS_HELP)
def durable_reset(
    topic: Topic,
    name: Name,
    to: str = typer.Option(
        "earliest", "--to", metavar="POSITION", show_default=False,
        help="earliest (default: everything retained), latest (the first epochs not complete "
             f"yet) or {TIME_HELP}."),
    catalog: CatalogToChange = None,
    force: bool = typer.Option(False, "--force", "-f",
                               help="Reset it even while a live subscriber holds it."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
        order, d = _to_change(cat, topic, name, "reset", force)
        new = reset_target(cat, topic, order, to)
        lines = reset_report(cat, d, order, new)
        cat.durable_reset(topic, name, list(new))
    console = out()
    for line in lines:
        console.print(escape(line), soft_wrap=True)


@app.command(
    "drop", short_help="Delete a durable subscription.",
    help="Delete the durable subscription NAME of TOPIC: its position is forgotten and "
         "retention no longer waits for it. Refused while a live subscriber holds it, unless "
         "--force.",
    epilog=DURABLE_STATUS_HELP)
def durable_drop(
    topic: Topic,
    name: Name,
    catalog: CatalogToChange = None,
    force: bool = typer.Option(False, "--force", "-f",
                               help="Drop it even while a live subscriber holds it."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
        order, d = _to_change(cat, topic, name, "drop", force)
        cat.durable_drop(topic, name)
    out().print(escape(f"dropped durable subscription {name!r} of topic {topic!r} (it was at "
                       f"{fmt_position(order, d.position)})"), soft_wrap=True)


#: The colour of each durable subscription state in the table.
STATE_STYLE = {"active": "green", "expired": "red"}

#: Retained epochs named one by one in a reset report (more: the first and last few).
SHOWN = 6


def holder_text(d: DurableInfo) -> str:
    """``pid 12 on host (alive)``, ``pid 12 on host (gone)`` or ``-`` (nobody holds it)."""
    if d.holder is None or d.holder_pid is None:
        return "-"
    return f"pid {d.holder_pid} on {d.holder_host} ({'alive' if d.holder_alive else 'gone'})"


def _age(ts: Optional[float], now: float) -> str:
    return "never" if ts is None else f"{fmt_seconds(max(0.0, now - ts))} ago"


def durables_table(cat: Catalog, durables: list[DurableInfo]) -> Table:
    """The table of ``durable ls``: topic, name, position, acked beyond it (out of order),
    state, holder (and whether its process runs) and the age of the last ack."""
    from rich.table import Table  # here: rich only for a command that prints

    now = time.time()
    table = Table(show_lines=False)
    for col in ("topic", "name"):
        table.add_column(col, overflow="fold")
    table.add_column("position", overflow="fold")
    table.add_column("acked beyond", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("holder", overflow="fold")
    table.add_column("last ack", no_wrap=True)
    orders: dict[str, Any] = {}
    for d in durables:
        order = orders.get(d.topic)
        if order is None:
            order = orders[d.topic] = cat.lookup(d.topic).order
        style = STATE_STYLE.get(d.state)
        state = f"[{style}]{d.state}[/{style}]" if style else escape(d.state)
        table.add_row(escape(d.topic), escape(d.name), fmt_position(order, d.position),
                      fmt_times(d.acked) or "-", state, escape(holder_text(d)),
                      _age(d.acked_at, now))
    return table


def durable_json(d: DurableInfo) -> str:
    """One JSON line for ``durable ls --json``; times as ints or lists."""
    return dumps({"topic": d.topic, "name": d.name,
                  "position": None if d.position is None else list(d.position),
                  "acked": list(d.acked), "state": d.state, "holder_pid": d.holder_pid,
                  "holder_host": d.holder_host, "holder_alive": d.holder_alive,
                  "created_at": d.created_at, "acked_at": d.acked_at, "reason": d.reason})


def find_durable(cat: Catalog, topic: str, name: str) -> DurableInfo:
    """The durable subscription ``name`` of ``topic`` (which exists); an unknown name ends the
    command (status 2), naming the topic's durable subscriptions."""
    d = cat.durable(topic, name)
    if d is None:
        known = ", ".join(x.name for x in cat.durables(topic)) or "none"
        raise fail(f"topic {topic!r} has no durable subscription {name!r} (existing: {known})",
                   EXIT_USAGE, hint=f"list them with: epochstream durable ls {topic}")
    return d


def _to_change(cat: Catalog, topic: str, name: str, verb: str,
               force: bool) -> tuple[Any, DurableInfo]:
    """The order of ``topic`` and its durable subscription ``name``, which ``durable VERB``
    changes: an unknown one ends the command (status 2), and one a live subscriber holds
    (status 1) unless ``force``."""
    order = cat.lookup(topic).order
    d = find_durable(cat, topic, name)
    if not force:
        refuse_if_held(d, verb)
    return order, d


def refuse_if_held(d: DurableInfo, verb: str) -> None:
    """End the command (status 1) if a live subscriber holds ``d`` (``--force`` skips this)."""
    if d.holder is not None and d.holder_alive:
        raise fail(f"durable subscription {d.name!r} of topic {d.topic!r} is held by a live "
                   f"subscriber (pid {d.holder_pid} on {d.holder_host})", EXIT_ERROR,
                   hint=f"stop that subscriber first, or pass --force to {verb} it anyway (its "
                        f"acks are refused from then on)")


def reset_target(cat: Catalog, topic: str, order: Any, to: str) -> tuple[Any, ...]:
    """The position ``--to`` names, as a tuple of times: ``earliest`` (everything retained),
    ``latest`` (the first epochs not complete yet: the logs' merged lower frontier; ``[]`` for
    a finished stream) or a time/frontier, which must still be retained. A position that cannot
    be served ends the command (status 2)."""
    with bad_value(f"--to {to!r}"):
        value, frontier = parse_position(order, to, allow=("earliest", "latest"))
    states = cat.history_states(topic)
    if value in ("earliest", "latest") and not states:
        raise fail(f"--to {value} needs the topic's history, and topic {topic!r} keeps none "
                   f"(its publishers run without retention)", EXIT_USAGE,
                   hint="pass a time, e.g. --to 10")
    from ..log.reader import History  # here: the log package only for a command that reads it

    if value == "earliest":
        return tuple(History(topic, catalog=cat).since)
    if value == "latest":
        lowers = Antichain(order, [t for s in states.values() for t in s.lower])
        return lowers.elements
    if states:
        since = History(topic, catalog=cat).since
        if not position_available(order, frontier, since):
            raise fail(f"position {fmt_position(order, frontier)} is older than what topic "
                       f"{topic!r} retains (since {fmt_position(order, since)})", EXIT_USAGE,
                       hint="pass --to earliest, or a later time")
    return tuple(frontier)


def _retained(cat: Catalog, topic: str, pred: Any) -> Optional[list[Any]]:
    """The retained epochs satisfying ``pred`` (a linear extension of the order), or ``None``
    when the history cannot be listed."""
    from ..log.reader import History

    try:
        return [t for t, _ in History(topic, catalog=cat).records() if pred(t)]
    except (HistoryUnavailable, EpochstreamError):
        return None


def _some(times: list[Any]) -> str:
    if len(times) <= SHOWN:
        return fmt_times(times)
    return f"{fmt_times(times[:SHOWN // 2])}, …, {fmt_times(times[-(SHOWN // 2):])}"


def _count(times: Optional[list[Any]]) -> str:
    if times is None:
        return ""
    if not times:
        return " (none of them retained now)"
    return f" ({len(times)} retained epoch(s): {_some(times)})"


def reset_report(cat: Catalog, d: DurableInfo, order: Any, new: tuple[Any, ...]) -> list[str]:
    """What resetting ``d`` to ``new`` changes, as lines: the epochs it skips (at or beyond the
    old position, not at or beyond the new one), those it delivers again, and the out-of-order
    acks it forgets. Call before the reset (it reads the old state)."""
    topic, name = d.topic, d.name
    head = (f"reset {name!r} of topic {topic!r} from {fmt_position(order, d.position)} to "
            f"{fmt_position(order, new)}")
    new_f = Antichain(order, new)
    if d.position is None:
        return [f"{head}: it had not started; it now delivers the epochs at or beyond "
                f"{fmt_position(order, new)}"]
    old_f = Antichain(order, d.position)
    old_s, new_s = fmt_position(order, d.position), fmt_position(order, new)
    acked = set(d.acked)
    skipped = _retained(cat, topic, lambda t: old_f.less_equal(t) and not new_f.less_equal(t)
                        and t not in acked)
    again = _retained(cat, topic, lambda t: new_f.less_equal(t) and not old_f.less_equal(t))
    parts = []
    if not all(new_f.less_equal(a) for a in old_f):
        parts.append(f"epochs at or beyond {old_s} and not at or beyond {new_s} will not be "
                     f"delivered{_count(skipped)}")
    if not all(old_f.less_equal(b) for b in new_f):
        parts.append(f"epochs at or beyond {new_s} and not at or beyond {old_s} will be "
                     f"delivered again{_count(again)}")
    forgotten = [a for a in d.acked if new_f.less_equal(a)]
    if forgotten:
        key = getattr(order, "key", None)
        parts.append(f"epochs acked out of order ({fmt_times(sorted(forgotten, key=key))}) will "
                     f"be delivered again")
    if not parts:
        return [f"{head}: nothing is skipped or delivered again"]
    return [f"{head}: {parts[0]}", *parts[1:]]
