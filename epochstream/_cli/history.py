"""Durable history on the command line: ``epochstream history`` (the retained epochs of a topic,
read from its epoch logs with no live publisher) and the deletion of a dropped topic's logs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from ..catalog import Catalog
from ..catalog.history import HistoryState
from ..errors import EpochstreamError, HistoryCorrupt, HistoryUnavailable, TopicNotFound
from ..history import History
from .catalogs import catalog_errors, unknown_topic
from .formats import fmt_bytes, fmt_when
from .output import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, err, fail
from .positions import fmt_position, parse_position
from .tail_output import TailWriter, stdout_to_devnull

__all__ = ["HistoryWriter", "print_history", "no_history", "DeletedLog", "delete_logs"]


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
    console = err()
    with catalog_errors(cat):
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
    if not writer.as_json:
        console.print(HistoryWriter.HEADER, soft_wrap=True)
    totals = _Totals()
    try:
        for epoch in hist.epochs(since=since_v, until=until_v):
            n = len(epoch)
            writer.history_epoch(epoch.time, epoch.records, n, epoch.nbytes, epoch.first_seen)
            totals.epochs += 1
            totals.records += n
            totals.bytes += epoch.nbytes
    except BrokenPipeError:
        stdout_to_devnull()  # the reader went away (| head): a normal end, quietly
        raise typer.Exit(EXIT_OK) from None
    except KeyboardInterrupt:
        console.print(f"interrupted after {totals.epochs} epoch(s)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TopicNotFound as e:  # dropped meanwhile
        raise unknown_topic(cat, e, can_wait=False) from None
    except HistoryUnavailable as e:
        hint = None
        if e.retained is not None:
            hint = (f"omit --since to read everything retained (since "
                    f"{fmt_position(order, e.retained)}), or pass a later --since")
        raise fail(str(e), EXIT_USAGE, hint=hint) from None
    except HistoryCorrupt as e:
        raise fail(f"HistoryCorrupt: {e} (after {totals.epochs} epoch(s))") from None
    except EpochstreamError as e:
        raise fail(f"{type(e).__name__}: {e} (after {totals.epochs} epoch(s))") from None
    console.print(f"{totals.epochs} epoch(s), {totals.records} record(s), "
                  f"{fmt_bytes(totals.bytes)}", soft_wrap=True)


def _option(order: Any, flag: str, text: Optional[str],
            allow: tuple[str, ...]) -> tuple[Any, Any]:
    """``(value, frontier)`` of a position option (``(None, None)`` if not given); a bad one
    ends the command (status 2)."""
    if text is None:
        return None, None
    try:
        return parse_position(order, text, allow=allow)
    except ValueError as e:
        raise fail(f"bad {flag} {text!r}: {e}", EXIT_USAGE) from None


@dataclass(frozen=True)
class DeletedLog:
    """A partition log directory :func:`delete_logs` removed: its segment files and bytes, and
    ``kept`` — other files found there, left in place (the directory then stays)."""

    partition: int
    dir: str
    segments: int
    bytes: int
    kept: tuple[str, ...]


def delete_logs(states: dict[int, HistoryState]) -> list[DeletedLog]:
    """Delete the segment files (``*.eslog``) of each partition log in ``states`` (read from the
    catalog *before* the topic was dropped), then the directory and its parent (the topic's
    directory) if that left them empty. Never deletes anything but segment files."""
    out = []
    for p, state in sorted(states.items()):
        d = Path(state.dir)
        n = nbytes = 0
        kept: list[str] = []
        if d.is_dir():
            for f in sorted(d.iterdir()):
                if f.suffix == ".eslog" and f.is_file():
                    nbytes += f.stat().st_size
                    f.unlink()
                    n += 1
                else:
                    kept.append(f.name)
            for directory in (d, d.parent):
                try:
                    os.rmdir(directory)
                except OSError:  # not empty (kept files, other partitions) or gone
                    break
        out.append(DeletedLog(p, str(d), n, nbytes, tuple(kept)))
    return out
