"""``epochstream drop TOPIC``: delete a topic — its rows in the catalog (partitions, durable
subscriptions, consumer groups), the segment files of its epoch logs and their objects in an
object store (``Retention(store=...)``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import typer

from ..catalog.history_records import HistoryState
from ..errors import EpochstreamError
from .catalogs import open_existing_catalog
from .errors import exit_on_errors
from .formats import fmt_bytes
from .lookup import publishers
from .output import EXIT_ERROR, err, escape, fail, out
from .params import CatalogToChange, Topic

__all__ = ["commands", "drop", "DeletedLog", "delete_logs", "delete_objects"]

DROP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    dropped\n"
    "  1    refused: a publisher is live (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic\n"
)

commands = typer.Typer()
"""The command this module adds to the main app."""


@commands.command(short_help="Delete a topic from the catalog.",
                  help="Delete TOPIC, its partitions, durable subscriptions and consumer groups "
                       "from the catalog, the segment files of its epoch logs from disk and their "
                       "objects from an object store (Retention(store=...)). A "
                       "topic with a live publisher is refused (status 1) unless --force is "
                       "given.",
                  epilog=DROP_STATUS_HELP)
def drop(
    topic: Topic,
    catalog: CatalogToChange = None,
    force: bool = typer.Option(
        False, "--force", "-f",
        help="Drop it even while a publisher is live (its subscribers keep running until it "
             "ends; new ones cannot find it)."),
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors(cat):
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
    for line in delete_objects(topic, logs):
        console.print(escape(line), soft_wrap=True)


def delete_objects(topic: str, states: dict[int, HistoryState]) -> list[str]:
    """Delete the segment objects of each partition log in ``states`` whose store the catalog
    recorded as a URI (read before the topic was dropped); one line per partition saying what
    went. A store that cannot be opened or written: a line on stderr naming what is left."""
    from ..log.store import open_store  # pyarrow.fs: only when a store is involved

    lines = []
    for p, state in sorted(states.items()):
        if state.store is None or state.store.startswith("fs:"):
            continue
        try:
            n, nbytes = open_store(state.store, write=False).delete_segments(topic, p)
        except (OSError, ValueError, EpochstreamError) as e:
            err().print(escape(f"could not delete the objects of partition {p} in "
                               f"{state.store}: {' '.join(str(e).split())[:300]}"),
                        soft_wrap=True)
            continue
        lines.append(f"deleted {n} object(s) ({fmt_bytes(nbytes)}) of partition {p} from "
                     f"{state.store}")
    return lines


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
