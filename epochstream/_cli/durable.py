"""Durable subscriptions on the command line: ``epochstream durable ls`` (the table),
``durable reset`` (re-arm at a position, saying which epochs that skips or delivers again, like
Materialize's ``RESET``) and ``durable drop``."""

from __future__ import annotations

import time
from typing import Any, Optional

from rich.markup import escape
from rich.table import Table

from ..catalog import Catalog
from ..catalog.history import DurableInfo, position_available
from ..errors import EpochstreamError, HistoryUnavailable
from ..frontier import Antichain
from ..history import History
from .formats import fmt_seconds
from .output import EXIT_ERROR, EXIT_USAGE, fail
from .positions import fmt_position, fmt_times, parse_position
from .tail_output import dumps

__all__ = ["STATE_STYLE", "holder_text", "durables_table", "durable_json", "find_durable",
           "refuse_if_held", "reset_target", "reset_report"]

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
    try:
        value, frontier = parse_position(order, to, allow=("earliest", "latest"))
    except ValueError as e:
        raise fail(f"bad --to {to!r}: {e}", EXIT_USAGE) from None
    states = cat.history_states(topic)
    if value in ("earliest", "latest") and not states:
        raise fail(f"--to {value} needs the topic's history, and topic {topic!r} keeps none "
                   f"(its publishers run without retention)", EXIT_USAGE,
                   hint="pass a time, e.g. --to 10")
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
