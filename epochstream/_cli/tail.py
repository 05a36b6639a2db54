"""Following a topic (``epochstream tail``): subscribe, write each complete epoch with
:class:`~.tail_output.TailWriter`, and end with a summary on stderr and an exit status."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..catalog import Catalog, TopicInfo
from ..errors import EpochstreamError, TopicNotFound
from ..events import Epoch, Gap
from ..transport import Subscriber
from .catalogs import unknown_topic
from .formats import fmt_bytes
from .output import EXIT_INTERRUPTED, EXIT_OK, err, fail
from .tail_output import TailWriter, stdout_to_devnull

__all__ = ["follow"]


@dataclass
class _Totals:
    """What ``tail`` has written so far."""

    epochs: int = 0
    records: int = 0
    bytes: int = 0


def follow(cat: Catalog, topic: str, info: TopicInfo, writer: TailWriter,
           max_epochs: Optional[int], timeout: Optional[float]) -> None:
    """Tail ``topic`` (described by ``info``) until every partition closed or ``max_epochs`` epochs were written,
    then print the summary. A closed stdout pipe ends it quietly (status 0); Ctrl-C, a topic
    dropped meanwhile, a lost publisher or ``timeout`` end it with its status (see the CLI)."""
    console = err()
    totals = _Totals()
    try:
        how = _stream(cat, topic, info, writer, console, totals, max_epochs, timeout)
    except BrokenPipeError:
        stdout_to_devnull()  # the reader went away (| head): a normal end, quietly
        raise typer.Exit(EXIT_OK) from None
    except KeyboardInterrupt:
        console.print(f"interrupted after {totals.epochs} epoch(s)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TopicNotFound as e:  # dropped meanwhile
        raise unknown_topic(cat, e) from None
    except (EpochstreamError, TimeoutError) as e:
        raise fail(f"{type(e).__name__}: {e} (after {totals.epochs} epoch(s))") from None
    console.print(f"{totals.epochs} epoch(s), {totals.records} record(s), "
                  f"{fmt_bytes(totals.bytes)}; {how}", soft_wrap=True)


def _stream(cat: Catalog, topic: str, info: TopicInfo, writer: TailWriter, console: Console,
            totals: _Totals, max_epochs: Optional[int], timeout: Optional[float]) -> str:
    """Subscribe and write each complete epoch (counted in ``totals``); returns how it ended."""
    with Subscriber(topic, catalog=cat, wait=0.0) as sub:
        console.print(f"tailing {escape(repr(topic))} ({info.order_name}, "
                      f"{escape(info.codec)}, {info.partitions} partition(s)) from catalog "
                      f"{escape(str(cat.path))}; Ctrl-C to stop", soft_wrap=True)
        if not writer.as_json:
            console.print(TailWriter.HEADER, soft_wrap=True)
        for epoch in sub.epochs(timeout=timeout):
            if isinstance(epoch, Gap):  # only with recover=True, which tail does not use
                continue
            _write(writer, totals, epoch)
            if max_epochs is not None and totals.epochs >= max_epochs:
                return f"stopped after --max-epochs {max_epochs}"
    return "the stream ended (every partition closed)"


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
