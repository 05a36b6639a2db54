"""``epochstream tail TOPIC``: follow a topic — subscribe (at ``--from``, or as the durable
subscription ``--durable``), write each complete epoch with :class:`~.tail_output.TailWriter`
(and ack it once written, when durable), and end with a summary on stderr and an exit status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import typer

from ..catalog import Catalog, TopicInfo
from ..errors import EpochstreamError, HistoryUnavailable, SubscriptionExpired, SubscriptionHeld
from ..events import Epoch, Gap
from .catalogs import open_existing_catalog
from .errors import bad_value, exit_on_errors, interruptible, stream_errors
from .formats import fmt_bytes
from .lookup import find_topic
from .output import EXIT_ERROR, EXIT_STATUS_HELP, EXIT_USAGE, err, escape, fail
from .params import CatalogToRead, Records, Topic
from .positions import TIME_HELP, fmt_position, parse_position
from .tail_output import TailWriter

if TYPE_CHECKING:  # rich is imported when something is printed
    from rich.console import Console

__all__ = ["commands", "tail", "Start", "follow"]

commands = typer.Typer()
"""The command this module adds to the main app."""


@commands.command(
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
    topic: Topic,
    catalog: CatalogToRead = None,
    records: Records = False,
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
    with interruptible(), exit_on_errors():
        info = find_topic(cat, topic, wait, replays=replays)
    begin = Start(durable=durable, takeover=takeover)
    if start is not None:
        with bad_value(f"--from {start!r}"):
            value = parse_position(info.order, start, allow=("earliest", "latest"))[0]
        begin = Start(value, True, durable, takeover)
    follow(cat, topic, info, TailWriter(as_json=as_json, records=records), max_epochs, timeout,
           begin)


@dataclass(frozen=True)
class Start:
    """Where ``tail`` begins: ``position`` as ``Subscriber(start=)`` takes it (``"latest"``,
    ``"earliest"``, a time or a list of times; ``given``: whether ``--from`` was passed), and
    the durable subscription (``--durable``, ``--takeover``)."""

    position: Any = "latest"
    given: bool = False
    durable: Optional[str] = None
    takeover: bool = False

    @property
    def replays(self) -> bool:
        """Whether the tail may read history (then a closed topic is worth following)."""
        return self.durable is not None or self.position != "latest"


@dataclass
class _Totals:
    """What ``tail`` has written so far."""

    epochs: int = 0
    records: int = 0
    bytes: int = 0
    position: Any = field(default=None)  # the durable subscription's acked position
    joined: bool = False  # the subscriber was created (a durable name was claimed)


def follow(cat: Catalog, topic: str, info: TopicInfo, writer: TailWriter,
           max_epochs: Optional[int], timeout: Optional[float],
           start: Start = Start()) -> None:
    """Tail ``topic`` (described by ``info``) from ``start`` until every partition closed or
    ``max_epochs`` epochs were written, then print the summary. A closed stdout pipe ends it
    quietly (status 0); Ctrl-C, a topic dropped meanwhile, a lost publisher, ``timeout`` or a
    history error end it with its status (see the CLI)."""
    console = err()
    totals = _Totals()
    with stream_errors(cat, lambda: totals.epochs,
                       explain=lambda e: _history_failure(cat, topic, info, start, totals, e)):
        how = _stream(cat, topic, info, writer, console, totals, max_epochs, timeout, start)
    where = ("" if start.durable is None else
             f"; durable subscription {start.durable!r} at "
             f"{fmt_position(info.order, totals.position)}")
    console.print(escape(f"{totals.epochs} epoch(s), {totals.records} record(s), "
                         f"{fmt_bytes(totals.bytes)}; {how}{where}"), soft_wrap=True)


def _history_failure(cat: Catalog, topic: str, info: TopicInfo, start: Start, totals: _Totals,
                     e: EpochstreamError) -> Optional[typer.Exit]:
    """The Exit for a history error, with what to do: a position that is not retained (status
    2), an expired durable subscription (2), one held by another live subscriber (1); ``None``
    for another error."""
    order = info.order
    after = f" (after {totals.epochs} epoch(s))" if totals.epochs else ""
    if isinstance(e, SubscriptionExpired):
        retained = f" (retained since {fmt_position(order, e.retained)})" if e.retained else ""
        return fail(f"durable subscription {start.durable!r} of topic {topic!r} expired: "
                    f"epochs at or beyond its position {fmt_position(order, e.acked)} were "
                    f"deleted by retention{retained}{after}", EXIT_USAGE,
                    hint=f"go on from what is retained, skipping what was deleted: "
                         f"epochstream durable reset {topic} {start.durable}")
    if isinstance(e, SubscriptionHeld):
        d = cat.durable(topic, start.durable) if start.durable else None
        if d is not None and d.state == "expired":  # expired while tailing: the ack is refused
            return fail(f"{e}{after}", EXIT_USAGE,
                        hint=f"go on from what is retained, skipping what was deleted: "
                             f"epochstream durable reset {topic} {start.durable}")
        if totals.joined or d is None or not d.holder_alive:  # fenced while tailing
            return fail(f"{e}{after}", EXIT_ERROR)
        return fail(f"durable subscription {start.durable!r} of topic {topic!r} is held by a "
                    f"live subscriber (pid {d.holder_pid} on {d.holder_host})", EXIT_ERROR,
                    hint="stop that subscriber, or pass --takeover to take the subscription "
                         "over (its acks are refused from then on)")
    if not isinstance(e, HistoryUnavailable):
        return None
    hint = ("publish with Publisher(..., retention=Retention()) to keep history; without it, "
            "tail from the live stream (no --from)")
    if e.retained is not None:
        hint = (f"start at or after what is retained: --from earliest (= "
                f"{fmt_position(order, e.retained)}) or a later time")
    return fail(f"{e}{after}", EXIT_USAGE, hint=hint)


def _stream(cat: Catalog, topic: str, info: TopicInfo, writer: TailWriter, console: Console,
            totals: _Totals, max_epochs: Optional[int], timeout: Optional[float],
            start: Start) -> str:
    """Subscribe and write each complete epoch (counted in ``totals``; acked once written when
    durable); returns how it ended."""
    from ..transport import Subscriber  # here: zmq and the transport only for this command

    held = None if start.durable is None else cat.durable(topic, start.durable)
    resumed = None if held is None else held.position
    with Subscriber(topic, catalog=cat, wait=0.0, start=start.position, durable=start.durable,
                    takeover=start.takeover) as sub:
        totals.joined = True
        console.print(escape(f"tailing {topic!r} ({info.order_name}, {info.codec}, "
                             f"{info.partitions} partition(s)) from catalog {cat.where}"
                             f"{_from(info, start, resumed)}; Ctrl-C to stop"),
                      soft_wrap=True)
        if not writer.as_json:
            console.print(TailWriter.HEADER, soft_wrap=True)
        totals.position = sub.position
        for epoch in sub.epochs(timeout=timeout):
            if isinstance(epoch, Gap):  # only with recover=True, which tail does not use
                continue
            _write(writer, totals, epoch)
            if start.durable is not None:
                sub.ack(epoch)  # written (and flushed): never delivered again
                totals.position = sub.position
            if max_epochs is not None and totals.epochs >= max_epochs:
                return f"stopped after --max-epochs {max_epochs}"
        totals.position = sub.position
    return "the stream ended (every partition closed)"


def _from(info: TopicInfo, start: Start, resumed: Any) -> str:
    """Where the tail starts, for its header line (``resumed``: the position a durable
    subscription held before this run, ``None`` for a new one)."""
    order = info.order
    p = start.position
    asked = p if isinstance(p, str) else fmt_position(order, p if isinstance(p, list) else [p])
    if start.durable is None:
        return "" if p == "latest" else f", from {asked}"
    if resumed is None:
        return f", new durable subscription {start.durable!r} from {asked}"
    return (f", durable subscription {start.durable!r} resumed at "
            f"{fmt_position(order, resumed)}"
            + (" (--from applies only to a new one)" if start.given else ""))


def _write(writer: TailWriter, totals: _Totals, epoch: Epoch) -> None:
    """Count ``epoch`` and write it with its lag: now minus the arrival of its first data."""
    first_seen = getattr(epoch, "first_seen", None)
    lag = None if first_seen is None else max(0.0, time.time() - first_seen)
    n = len(epoch)
    nbytes = getattr(epoch, "nbytes", None)
    totals.epochs += 1
    totals.records += n
    totals.bytes += nbytes if isinstance(nbytes, int) else 0
    writer.epoch(epoch.time, epoch.records, n, nbytes, lag)
