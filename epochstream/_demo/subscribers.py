"""The demo's own subscribers: each runs in a thread, joins the topic through the catalog at a
moment the demo chooses, and records what it receives (:class:`SubResult`) for the checks of
:mod:`.verify`; it prints a line per epoch (every 30th on long runs)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from rich.markup import escape

from ..catalog import Catalog
from ..events import Epoch, Gap
from ..transport import Subscriber
from . import TOPIC

__all__ = ["SubResult", "DemoSubscribers", "run_subscriber"]

Printer = Callable[[str], None]


@dataclass
class SubResult:
    """What one of the demo's subscribers saw (filled in by its thread)."""

    name: str
    when: str
    expected_first: int | None = None     # from the host's state at the join point
    snapshot_upper: tuple[int, ...] = ()  # merged (max) upper frontier of the snapshots
    snapshot_lower: tuple[int, ...] = ()
    published_before: int = -1            # host.data_upper() right before joining
    # (epoch, rows, dates set, mean delay)
    epochs: list[tuple[int, int, set[Any], float | None]] = field(default_factory=list)
    error: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def run_subscriber(res: SubResult, catalog: Catalog, host: Any, printer: Printer,
                   every: int, offset: int = 0) -> None:
    """The body of a subscriber's thread: note ``host``'s published data, join, record the
    snapshots' frontiers (then ``res.ready`` is set), and record every epoch until the stream
    ends, printing the first one and every ``every``-th. Epochs are recorded as day numbers:
    minus ``offset``, the first day's epoch. An error ends it into ``res.error``;
    ``res.ready`` and ``res.done`` are set in any case."""
    try:
        res.published_before = host.data_upper() - offset
        with Subscriber(TOPIC, catalog=catalog, wait=30.0) as sub:
            sub.wait_ready(60.0)
            _record_snapshots(res, sub, offset)
            res.ready.set()
            for i, epoch in enumerate(sub.epochs(timeout=None)):
                if isinstance(epoch, Gap):  # only with recover=True
                    continue
                _record_epoch(res, epoch, offset)
                if i == 0 or every <= 1 or i % every == 0:
                    printer(_epoch_line(res.name, *res.epochs[-1]))
    except Exception as e:  # noqa: BLE001 - reported in the verification table
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.ready.set()
        res.done.set()


def _record_snapshots(res: SubResult, sub: Subscriber, offset: int = 0) -> None:
    """The frontiers the subscriber joined at, merged over the partitions' snapshots: the
    largest upper and the smallest lower time (minus ``offset``)."""
    snaps = dict(sub.snapshots)
    uppers = [t - offset for s in snaps.values() for t in s.upper]
    lowers = [t - offset for s in snaps.values() for t in s.lower]
    res.snapshot_upper = (max(uppers),) if uppers else ()
    res.snapshot_lower = (min(lowers),) if lowers else ()


def _record_epoch(res: SubResult, epoch: Epoch, offset: int = 0) -> None:
    """Record ``epoch``'s time (minus ``offset``), row count, days of departure and mean
    departure delay."""
    table = epoch.records
    n = len(epoch)
    dates = set(pc.unique(table.column("dep_date")).to_pylist()) if n else set()
    delay = pc.mean(table.column("dep_delay")).as_py() if n else None
    res.epochs.append((epoch.time - offset, n, dates, delay))


def _epoch_line(name: str, time: int, n: int, dates: set[Any], delay: float | None) -> str:
    """The line that shows one recorded epoch: its day, flights and mean departure delay."""
    d = next(iter(dates)) if len(dates) == 1 else sorted(dates)
    return (f"[bold]{name}[/] epoch {time:>3}  {d}  {n:>5} flights  mean dep delay "
            f"{'-' if delay is None else f'{delay:6.2f}'} min")


class DemoSubscribers:
    """The demo's subscribers of one run, each in a daemon thread (see :func:`run_subscriber`),
    on ``catalog`` while ``host`` publishes; their lines go to ``printer``."""

    def __init__(self, catalog: Catalog, host: Any, printer: Printer, every: int,
                 offset: int = 0) -> None:
        self.offset = offset  # the first day's epoch: recorded epochs are day numbers
        self.catalog = catalog
        self.host = host
        self.printer = printer
        self.every = every
        self.results: list[SubResult] = []
        self.threads: list[threading.Thread] = []

    def attach(self, name: str, when: str, expected_first: int) -> SubResult:
        """Start subscriber ``name`` and wait (up to 60 s) until it has joined; print its join
        point, or why it could not join."""
        res = SubResult(name, when, expected_first=expected_first)
        t = threading.Thread(target=run_subscriber,
                             args=(res, self.catalog, self.host, self.printer, self.every,
                                   self.offset),
                             name=name, daemon=True)
        self.results.append(res)
        self.threads.append(t)
        t.start()
        if not res.ready.wait(60):
            res.error = res.error or "not ready after 60 s"
        if res.error is not None:
            self.printer(f"[red]{name} could not join {when}:[/] {escape(res.error)}")
        else:
            self.printer(f"[bold]{name}[/] joined {when}: upper frontier "
                         f"{list(res.snapshot_upper)}, so its first epoch will be "
                         f"{expected_first}")
        return res

    def receiving(self) -> int:
        """How many of them are connected: joined without error and not ended yet."""
        return sum(1 for r in self.results if r.error is None and not r.done.is_set())

    def join(self, timeout: float) -> None:
        """Wait for their threads to end (their streams end when the host closes)."""
        for t in self.threads:
            t.join(timeout)
