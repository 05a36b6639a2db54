"""``epochstream history TOPIC``: the retained epochs of a topic, read from its epoch logs with
no live publisher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import typer

from ..catalog import Catalog
from ..catalog.history import HistoryState
from ..catalog.history_records import store_usage
from ..errors import EpochstreamError, HistoryUnavailable
from .catalogs import open_existing_catalog
from .errors import bad_value, exit_on_errors, stream_errors
from .formats import fmt_bytes, fmt_when
from .output import EXIT_USAGE, err, escape, fail
from .params import CatalogToRead, Records, Topic
from .positions import TIME_HELP, fmt_position, parse_position
from .tail_output import TailWriter

__all__ = ["commands", "history", "HistoryWriter", "print_history", "no_history", "where_lines"]

HISTORY_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    every retained epoch asked for was printed\n"
    "  1    a segment failed its checksum (HistoryCorrupt); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; the topic keeps no\n"
    "       history; --since older than the retained history\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Durable history: docs/history.md."
)

commands = typer.Typer()
"""The command this module adds to the main app."""


@commands.command(
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
    topic: Topic,
    catalog: CatalogToRead = None,
    since: Optional[str] = typer.Option(
        None, "--since", metavar="POSITION", show_default=False,
        help=f"Only epochs at or beyond POSITION: earliest (default) or {TIME_HELP}."),
    until: Optional[str] = typer.Option(
        None, "--until", metavar="POSITION", show_default=False,
        help="Only epochs not at or beyond POSITION (default: every retained epoch)."),
    records: Records = False,
    as_json: bool = typer.Option(
        False, "--json",
        help="Print JSON lines instead: one object per epoch {time, records, bytes, "
             "completed_at}, or with --records one per record {time, record}."),
) -> None:
    cat = open_existing_catalog(catalog)
    print_history(cat, topic, since, until, HistoryWriter(as_json=as_json, records=records))


class HistoryWriter(TailWriter):
    """Writes ``history``'s data to stdout like :class:`TailWriter` writes ``tail``'s: one line
    per epoch (time, records, bytes, when it completed) or a JSON object ``{time, records,
    bytes, completed_at}``; with ``--records`` the records (JSON: one object per record)."""

    HEADER = f"{'time':>16}  {'records':>10}  {'bytes':>12}  {'completed':>19}"

    def history_epoch(self, time_: Any, records: Any, n: int, nbytes: Any,
                      completed_at: Optional[float]) -> None:
        """Write one retained epoch: its line (or JSON object), then its records if asked."""
        self.write(time_, records, {"records": n, "bytes": nbytes, "completed_at": completed_at},
                   f"  {n:>10}  {fmt_bytes(nbytes):>12}  {fmt_when(completed_at):>19}")


def no_history(topic: str) -> typer.Exit:
    """The Exit (status 2) for a topic none of whose partitions keeps an epoch log."""
    return fail(f"topic {topic!r} keeps no history: none of its publishers ran with retention",
                EXIT_USAGE, hint="publish with Publisher(..., retention=Retention()) to keep "
                                 "its epochs (docs/history.md)")


@dataclass
class _Totals:
    epochs: int = 0
    records: int = 0
    bytes: int = 0


def print_history(cat: Catalog, topic: str, since: Optional[str], until: Optional[str],
                  writer: HistoryWriter) -> None:
    """Print the retained epochs of ``topic`` at or beyond ``since`` and not at or beyond
    ``until`` (command-line texts, ``None``: no bound), then a summary on stderr."""
    from ..log.reader import History  # here: the log package only for this command

    console = err()
    with exit_on_errors(cat):
        hist = History(topic, catalog=cat)
    order = hist.order
    since_v, since_f = _option(order, "--since", since, ("earliest",))
    until_v, until_f = _option(order, "--until", until, ())
    if since_v == "earliest":
        since_v = None
    states = hist.states()
    if not states:
        raise no_history(topic)
    info = cat.lookup(topic)
    retained = hist.since
    what = []
    if since_v is not None:
        what.append(f"at or beyond {fmt_position(order, since_f)}")
    if until_v is not None:
        what.append(f"not at or beyond {fmt_position(order, until_f)}")
    console.print(escape(f"history of {topic!r} ({info.order_name}, {info.codec}, "
                         f"{info.partitions} partition(s)) from catalog {cat.where}: retained "
                         f"since {fmt_position(order, retained)}"
                         + (f"; epochs {' and '.join(what)}" if what else "")), soft_wrap=True)
    for line in where_lines(states):
        console.print(escape(line), soft_wrap=True)
    if not writer.as_json:
        console.print(HistoryWriter.HEADER, soft_wrap=True)
    totals = _Totals()
    with stream_errors(cat, lambda: totals.epochs, can_wait=False, others=(),
                       explain=lambda e: _not_retained(order, e)):
        for epoch in hist.epochs(since=since_v, until=until_v):
            n = len(epoch)
            writer.history_epoch(epoch.time, epoch.records, n, epoch.nbytes, epoch.first_seen)
            totals.epochs += 1
            totals.records += n
            totals.bytes += epoch.nbytes
    console.print(f"{totals.epochs} epoch(s), {totals.records} record(s), "
                  f"{fmt_bytes(totals.bytes)}", soft_wrap=True)


def where_lines(states: dict[int, HistoryState]) -> list[str]:
    """One line per partition whose log also goes to an object store (``states``:
    ``{partition: HistoryState}``): the bytes of its retained segments (the publisher's
    disk), those in the store (objects indexed), and the sealed segments not in it yet (the
    upload backlog as the index sees it)."""
    out = []
    for p, state in sorted(states.items()):
        if state.store is None:
            continue
        in_store, objects, waiting = store_usage(state)
        out.append(f"partition {p}: log {fmt_bytes(sum(g.nbytes for g in state.segments))} in "
                   f"{state.dir}; store {state.store}: {fmt_bytes(in_store)} in {objects} "
                   f"object(s); {waiting} sealed segment(s) waiting for their upload")
    return out


def _not_retained(order: Any, e: EpochstreamError) -> Optional[typer.Exit]:
    """The Exit (status 2) for epochs asked for that are no longer retained (``None`` for
    another error)."""
    if not isinstance(e, HistoryUnavailable):
        return None
    hint = None
    if e.retained is not None:
        hint = (f"omit --since to read everything retained (since "
                f"{fmt_position(order, e.retained)}), or pass a later --since")
    return fail(str(e), EXIT_USAGE, hint=hint)


def _option(order: Any, flag: str, text: Optional[str],
            allow: tuple[str, ...]) -> tuple[Any, Any]:
    """``(value, frontier)`` of a position option (``(None, None)`` if not given); a bad one
    ends the command (status 2)."""
    if text is None:
        return None, None
    with bad_value(f"{flag} {text!r}"):
        return parse_position(order, text, allow=allow)
