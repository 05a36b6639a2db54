"""Following a topic (``epochstream tail``): subscribe (at ``--from``, or as the durable
subscription ``--durable``), write each complete epoch with :class:`~.tail_output.TailWriter`
(and ack it once written, when durable), and end with a summary on stderr and an exit status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..catalog import Catalog, TopicInfo
from ..errors import (EpochstreamError, HistoryUnavailable, SubscriptionExpired,
                      SubscriptionHeld, TopicNotFound)
from ..events import Epoch, Gap
from ..transport import Subscriber
from .catalogs import unknown_topic
from .formats import fmt_bytes
from .output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, err, fail
from .positions import fmt_position
from .tail_output import TailWriter, stdout_to_devnull

__all__ = ["Start", "follow"]


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
    try:
        how = _stream(cat, topic, info, writer, console, totals, max_epochs, timeout, start)
    except BrokenPipeError:
        stdout_to_devnull()  # the reader went away (| head): a normal end, quietly
        raise typer.Exit(EXIT_OK) from None
    except KeyboardInterrupt:
        console.print(f"interrupted after {totals.epochs} epoch(s)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TopicNotFound as e:  # dropped meanwhile
        raise unknown_topic(cat, e) from None
    except (HistoryUnavailable, SubscriptionExpired, SubscriptionHeld) as e:
        raise _history_failure(cat, topic, info, start, totals, e) from None
    except (EpochstreamError, TimeoutError) as e:
        raise fail(f"{type(e).__name__}: {e} (after {totals.epochs} epoch(s))") from None
    where = ("" if start.durable is None else
             f"; durable subscription {start.durable!r} at "
             f"{fmt_position(info.order, totals.position)}")
    console.print(escape(f"{totals.epochs} epoch(s), {totals.records} record(s), "
                         f"{fmt_bytes(totals.bytes)}; {how}{where}"), soft_wrap=True)


def _history_failure(cat: Catalog, topic: str, info: TopicInfo, start: Start, totals: _Totals,
                     e: EpochstreamError) -> typer.Exit:
    """The Exit for a history error, with what to do: a position that is not retained (status
    2), an expired durable subscription (2), one held by another live subscriber (1)."""
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
    assert isinstance(e, HistoryUnavailable)
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
