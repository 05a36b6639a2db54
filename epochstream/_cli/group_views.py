"""How the command line shows consumer groups: their stored units (:class:`GroupUnit`), the
table and JSON of ``epochstream group ls``, the lines and JSON of ``group info``, and the
consumer groups' rows of ``epochstream durable ls``.

A group's unit of work is ``(time, bucket)``: a whole epoch (bucket ``-1``, written as the time
alone) or, in ``key_shared`` mode, one bucket of an epoch (written ``3 (bucket 2)``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional


from ..catalog import Catalog
from ..catalog.group_records import GroupInfo
from .formats import fmt_time
from .output import err, escape
from .positions import fmt_position
from .tail_output import dumps

if TYPE_CHECKING:  # rich is imported by the functions that print
    from rich.table import Table

__all__ = ["GroupUnit", "group_units", "fmt_unit", "process_text", "groups_table", "group_json",
           "info_lines", "info_json", "group_durable_rows", "group_durable_json",
           "stopped_notice", "print_stopped", "STATE_STYLE"]

#: The colour of each group state in the tables.
STATE_STYLE = {"active": "green", "stopped": "red"}


@dataclass(frozen=True)
class GroupUnit:
    """One stored unit of a group: ``time``, ``bucket`` (``None``: the whole epoch), ``state``
    (``free``, ``leased``, ``acked``, ``dead``), ``deliveries``, the fencing ``token``, the
    leasing ``worker`` and its process (``pid``, ``host``, ``alive``), ``deadline`` (the lease's
    end, ``time.time()`` seconds), ``not_before`` (a nak's delay ends) and ``history``
    (``[[worker, time.time()], ...]`` per delivery)."""

    time: Any
    bucket: Optional[int]
    state: str
    deliveries: int
    token: int
    worker: Optional[str]
    pid: Optional[int]
    host: Optional[str]
    alive: bool
    deadline: float
    not_before: float

    def live(self, now: float) -> bool:
        """A lease that still holds: before its deadline, its worker's process running."""
        return self.state == "leased" and self.deadline >= now and self.alive

    def lapsed(self, now: float) -> bool:
        """A lease row whose deadline passed or whose worker is gone: offered again at the
        next fetch of any worker."""
        return self.state == "leased" and not self.live(now)


def group_units(cat: Catalog, topic: str, name: str) -> list[GroupUnit]:
    """Every unit the catalog stores for group ``name`` of ``topic`` (those at or beyond its
    position: settled units behind it are forgotten), sorted by time and bucket.

    :class:`~epochstream.catalog.groups.GroupInfo` names the leased units but not who holds
    them or until when: :meth:`~epochstream.catalog.Catalog.group_epochs` has the rows."""
    out = [GroupUnit(r.time, None if r.bucket < 0 else r.bucket, r.state, r.deliveries, r.token,
                     r.worker, r.pid, r.host, r.alive, r.deadline, r.not_before)
           for r in cat.group_epochs(topic, name)]
    return sorted(out, key=lambda u: (_key(u.time), -1 if u.bucket is None else u.bucket))


def _key(t: Any) -> tuple[Any, ...]:
    return (sum(t), t) if isinstance(t, tuple) else (t,)


def fmt_unit(t: Any, bucket: Optional[int]) -> str:
    """``3``, ``(3, 1)``, or ``3 (bucket 2)`` for a bucket of an epoch (``key_shared``)."""
    return fmt_time(t) if bucket is None or bucket < 0 else f"{fmt_time(t)} (bucket {bucket})"


def _units(units: list[GroupUnit]) -> str:
    return ", ".join(fmt_unit(u.time, u.bucket) for u in units) or "-"


def _order(cat: Catalog, topic: str, cache: dict[str, Any]) -> Any:
    order = cache.get(topic)
    if order is None:
        order = cache[topic] = cat.lookup(topic).order
    return order


def _state(info: GroupInfo) -> str:
    style = STATE_STYLE.get(info.state)
    return f"[{style}]{info.state}[/{style}]" if style else escape(info.state)


def _counts(units: list[GroupUnit], now: float) -> dict[str, int]:
    return {"leased": sum(u.live(now) for u in units),
            "expired": sum(u.lapsed(now) for u in units),
            "acked": sum(u.state == "acked" for u in units),
            "dead": sum(u.state == "dead" for u in units)}


def groups_table(cat: Catalog, groups: list[tuple[GroupInfo, list[GroupUnit]]]) -> Table:
    """The table of ``group ls``: topic, name, mode, position, the units leased (live leases;
    ``+N expired``: leases whose deadline passed or whose worker is gone), acked and
    dead-lettered beyond the position, state and the reason it stopped."""
    from rich.table import Table  # here: rich only for a command that prints

    now = time.time()
    table = Table(show_lines=False)
    for col in ("topic", "name", "mode", "position"):
        table.add_column(col, overflow="fold")
    for col in ("leased", "acked beyond", "dead beyond"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("reason", overflow="fold")
    orders: dict[str, Any] = {}
    for g, units in groups:
        c = _counts(units, now)
        leased = str(c["leased"]) + (f" (+{c['expired']} expired)" if c["expired"] else "")
        table.add_row(escape(g.topic), escape(g.name), g.mode,
                      fmt_position(_order(cat, g.topic, orders), g.position), leased,
                      str(c["acked"]), str(c["dead"]), _state(g), escape(g.reason or "-"))
    return table


def _pos(position: Optional[tuple[Any, ...]]) -> Optional[list[Any]]:
    return None if position is None else list(position)


def group_json(g: GroupInfo, units: list[GroupUnit]) -> str:
    """One JSON line for ``group ls --json``: the definition, position (``null`` before the
    first fetch), state, reason, and the counts of the table."""
    return dumps({"topic": g.topic, "name": g.name, "mode": g.mode, "ack_wait": g.ack_wait,
                  "max_deliver": g.max_deliver, "dead_letter": g.dead_letter,
                  "position": _pos(g.position), "state": g.state, "reason": g.reason,
                  **_counts(units, time.time())})


def process_text(u: GroupUnit) -> str:
    """``pid 12 on host (alive)``, ``pid 12 on host (gone)`` or ``-``: the process of the worker
    that leased ``u``."""
    if u.pid is None:
        return "-"
    return f"pid {u.pid} on {u.host} ({'alive' if u.alive else 'gone'})"


def _deadline(u: GroupUnit, now: float) -> str:
    if not u.alive:
        return "released: its worker is gone"
    left = u.deadline - now
    return f"in {left:.1f} s" if left >= 0 else f"passed {-left:.1f} s ago"


def info_lines(cat: Catalog, g: GroupInfo, units: list[GroupUnit]) -> tuple[list[str], Table,
                                                                              list[str]]:
    """What ``group info`` prints: the lines before the table of leased units, the table, and
    the lines after it."""
    now = time.time()
    order = cat.lookup(g.topic).order
    state = g.state if g.reason is None else f"{g.state}: {g.reason}"
    head = [f"consumer group {g.name!r} of topic {g.topic!r} in catalog {cat.where}",
            f"  mode         {g.mode}",
            f"  ack_wait     {g.ack_wait:g} s",
            f"  max_deliver  {g.max_deliver}",
            f"  dead_letter  {g.dead_letter or '-'}",
            f"  position     {fmt_position(order, g.position)}",
            f"  state        {state}"]
    leased = [u for u in units if u.state == "leased"]
    head.append(f"leased: {len(leased)} unit(s)" if leased else "leased: none")
    from rich.table import Table  # here: rich only for a command that prints

    table = Table(show_lines=False)
    table.add_column("time", overflow="fold")
    if g.mode == "key_shared":
        table.add_column("bucket", justify="right", no_wrap=True)
    table.add_column("worker", overflow="fold")
    table.add_column("process", overflow="fold")
    table.add_column("deliveries", justify="right", no_wrap=True)
    table.add_column("deadline", no_wrap=True)
    for u in leased:
        cells = [fmt_time(u.time)]
        if g.mode == "key_shared":
            cells.append("-" if u.bucket is None else str(u.bucket))
        cells += [escape(u.worker or "-"), escape(process_text(u)), str(u.deliveries),
                  _deadline(u, now)]
        table.add_row(*cells)
    tail = [f"acked beyond the position: {_units([u for u in units if u.state == 'acked'])}",
            f"dead-lettered beyond the position: "
            f"{_units([u for u in units if u.state == 'dead'])}"]
    # units that used up max_deliver: they stopped the group, or the next fetch dead-letters
    # them (or stops it); a live lease on its last delivery may still be acked
    exhausted = [u for u in units if u.state in ("free", "leased")
                 and u.deliveries >= g.max_deliver and (g.state == "stopped" or not u.live(now))]
    if exhausted:
        tail.append(f"delivered max_deliver={g.max_deliver} time(s) without an ack: "
                    f"{_units(exhausted)}")
    waiting = [u for u in units if u.state == "free" and u not in exhausted]  # given back
    if waiting:
        tail.append("given back, to be delivered again: " + ", ".join(
            f"{fmt_unit(u.time, u.bucket)} (delivered {u.deliveries} time(s)"
            + (f", not before {u.not_before - now:.1f} s" if u.not_before > now else "")
            + ")"
            for u in waiting))
    return head, table, tail


def _unit_json(u: GroupUnit, now: float) -> dict[str, Any]:
    obj: dict[str, Any] = {"time": u.time, "bucket": u.bucket, "deliveries": u.deliveries}
    if u.state == "leased":
        obj.update(worker=u.worker, pid=u.pid, host=u.host, worker_alive=u.alive,
                   token=u.token, deadline=u.deadline,
                   seconds_left=round(u.deadline - now, 3), live=u.live(now))
    elif u.state == "free":
        obj["not_before"] = u.not_before
    return obj


def info_json(g: GroupInfo, units: list[GroupUnit]) -> str:
    """The JSON object of ``group info --json``."""
    now = time.time()
    by = {s: [_unit_json(u, now) for u in units if u.state == s]
          for s in ("leased", "acked", "dead", "free")}
    return dumps({"topic": g.topic, "name": g.name, "mode": g.mode, "ack_wait": g.ack_wait,
                  "max_deliver": g.max_deliver, "dead_letter": g.dead_letter,
                  "position": _pos(g.position), "state": g.state, "reason": g.reason,
                  "leased": by["leased"], "acked": by["acked"], "dead": by["dead"],
                  "waiting": by["free"]})


def group_durable_rows(cat: Catalog, table: Table,
                       groups: list[tuple[GroupInfo, list[GroupUnit]]]) -> None:
    """Add the consumer groups' rows to the table of ``durable ls`` (its columns: topic, name,
    position, acked beyond, state, holder, last ack): name ``group:NAME``, the units acked
    beyond the position, the workers holding live leases; groups keep no last-ack time."""
    now = time.time()
    orders: dict[str, Any] = {}
    for g, units in groups:
        live = [u for u in units if u.live(now)]
        workers = {u.worker for u in live}
        holder = f"{len(live)} lease(s), {len(workers)} worker(s)" if live else "-"
        table.add_row(escape(g.topic), escape(f"group:{g.name}"),
                      fmt_position(_order(cat, g.topic, orders), g.position),
                      _units([u for u in units if u.state == "acked"]), _state(g),
                      escape(holder), "-")


def group_durable_json(g: GroupInfo, units: list[GroupUnit]) -> str:
    """One JSON line of ``durable ls --json`` for a consumer group (``"kind": "group"``)."""
    now = time.time()
    return dumps({"kind": "group", "topic": g.topic, "name": g.name, "mode": g.mode,
                  "position": _pos(g.position),
                  "acked": sorted({u.time for u in units if u.state == "acked"}, key=_key),
                  "state": g.state, "reason": g.reason,
                  "leased": sum(u.live(now) for u in units)})


def stopped_notice(g: GroupInfo) -> str:
    """The stderr line that follows a table listing the stopped group ``g``."""
    return (f"consumer group {g.name!r} of {g.topic!r} stopped: {g.reason}; once the cause is "
            f"fixed: epochstream group reset {g.topic} {g.name}")


def print_stopped(groups: Iterable[GroupInfo]) -> None:
    """After a table or lines that show ``groups``: the :func:`stopped_notice` of each stopped
    one, on stderr."""
    for g in groups:
        if g.state == "stopped":
            err().print(escape(stopped_notice(g)), soft_wrap=True)
