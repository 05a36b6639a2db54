"""``epochstream topics``: the catalog's topics, as a table with one row per partition of each
topic (its endpoint, state, coloured, and publisher pid), and a line per topic with an object
store (its bytes there and its upload backlog)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from ..catalog import TopicInfo
from .catalogs import open_existing_catalog
from .errors import exit_on_errors
from .output import escape, out
from .params import CatalogToRead

if TYPE_CHECKING:  # rich is imported by the functions that print
    from rich.table import Table

__all__ = ["commands", "topics", "STATE_STYLE", "topics_table", "store_lines"]

commands = typer.Typer()
"""The command this module adds to the main app."""

#: The colour of each partition state in the table.
STATE_STYLE = {"live": "green", "closed": "blue", "aborted": "magenta", "dead": "red",
               "expired": "red", "unregistered": "yellow"}


def topics_table(topics: list[TopicInfo]) -> Table:
    """The table of ``topics``; a partition no publisher registered is ``unregistered``."""
    from rich.table import Table  # here: rich only for a command that prints

    table = Table(show_lines=False)
    table.add_column("topic", overflow="fold")
    for col in ("order", "codec", "parts", "part"):
        table.add_column(col, no_wrap=True)
    table.add_column("endpoint", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("pid", no_wrap=True)
    for info in topics:
        by_index = {p.index: p for p in info.partition_info}
        for i in range(info.partitions):
            head = ([escape(info.name), info.order_name, escape(info.codec), str(info.partitions)]
                    if i == 0 else ["", "", "", ""])
            p = by_index.get(i)
            if p is None:
                state, endpoint, pid = "unregistered", "-", "-"
            else:
                state, endpoint, pid = p.state, p.endpoint, str(p.pid)
            style = STATE_STYLE.get(state)
            shown = f"[{style}]{state}[/{style}]" if style else escape(state)
            table.add_row(*head, str(i), escape(endpoint), shown, pid)
    return table


@commands.command(
    short_help="List topics and the state of their partitions.",
    help="List the catalog's topics and the state of each partition: its endpoint, state (live, "
         "closed, aborted, dead, unregistered) and publisher pid. A 'dead' partition was live "
         "but its process is gone. A topic whose logs go to an object store gets a line: its "
         "bytes in the store and its upload backlog (sealed segments not in the store yet).")
def topics(catalog: CatalogToRead = None) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors():
        infos = cat.topics()
    console = out()
    if not infos:
        console.print(f"no topics in catalog {escape(cat.where)}")
        return
    console.print(f"catalog {escape(cat.where)}")
    console.print(topics_table(infos))
    with exit_on_errors():
        lines = store_lines(cat, infos)
    for line in lines:
        console.print(escape(line), soft_wrap=True)


def store_lines(cat: Any, infos: list[TopicInfo]) -> list[str]:
    """One line per topic whose epoch logs go to an object store: the store(s), the bytes of
    the objects indexed there and the sealed segments still waiting for their upload, summed
    over its partitions (per partition: ``epochstream history TOPIC``)."""
    from ..catalog.history_records import store_usage
    from .formats import fmt_bytes

    out = []
    for info in infos:
        states = [s for s in cat.history_states(info.name).values() if s.store is not None]
        if not states:
            continue
        usage = [store_usage(s) for s in states]
        stores = ", ".join(sorted({str(s.store) for s in states}))
        out.append(f"{info.name}: store {stores}: {fmt_bytes(sum(u[0] for u in usage))} in "
                   f"{sum(u[1] for u in usage)} object(s); upload backlog "
                   f"{sum(u[2] for u in usage)} sealed segment(s)")
    return out
