"""Lag, defined once: how far a reader is behind a topic, in epochs and in seconds, and a
Burrow-style status over a window. Pure: no I/O (:mod:`epochstream.report` reads the catalog).

Definitions, for a topic whose partitions' lower frontiers merge into the antichain ``L``
(timely's frontier: an epoch ``t`` is **complete** iff no element of ``L`` is ``<= t``):

- A reader at **position** ``P`` (an antichain: it has every epoch *not* at or beyond ``P``;
  a durable subscription's acked frontier, a consumer group's position) that also settled the
  epochs ``A`` at or beyond ``P`` out of order (a durable subscription's ``acked``, a group's
  acked and dead-lettered epochs) **has not passed** ``t`` iff some ``p`` in ``P`` has
  ``p <= t`` and ``t`` is not in ``A``.
- **Lag in epochs** = the number of complete epochs *with data* (the epochs the topic's epoch
  log indexes) the reader has not passed. For a total order that is the number of indexed
  epochs in ``[P, L)``. For a partial order (``product(k)``) it is the size of the set
  difference of two up-sets, counted over the epochs that exist: ``{t : P <= t}`` minus
  ``{t : L <= t}`` minus ``A``. Example (``product(2)``): ``P = [(1, 0), (0, 2)]``,
  ``L = [(3, 0), (0, 3)]``, indexed epochs ``(0, 0), (1, 1), (2, 0), (0, 2), (3, 1)``:
  ``(0, 0)`` is passed (no element of ``P`` is ``<=`` it), ``(3, 1)`` is incomplete
  (``(3, 0) <= (3, 1)``), so the lag is 3 epochs: ``(1, 1), (2, 0), (0, 2)``.
- **Lag in seconds** = ``now`` minus the completion time (wall clock, ``time.time()`` seconds,
  as the epoch log indexed it: the latest of its partitions') of the earliest-completed epoch
  the reader has not passed; 0 when the reader has passed every complete epoch. Materialize's
  wallclock lag, per reader.

**Status** (Burrow's evaluator, ``linkedin/Burrow core/internal/evaluator``, over the samples
of the last ``window`` seconds, newest last), first rule that holds:

1. ``ok`` when the newest lag is 0;
2. ``rewind`` when the position moved backwards between two samples of the window;
3. ``stop`` when the reader has not committed (acked) for longer than ``window`` while it lags
   (its ``committed_at``: the last ack, or when it was created if it never acked);
4. ``stall`` when the window spans at least ``window / 2`` seconds, the position did not move
   in it and the lag did not decrease (the reader commits, or holds leases, but does not
   advance);
5. ``warn`` when the window spans at least ``window / 2`` seconds, the position moved but the
   lag never decreased from one sample to the next (the reader falls behind);
6. ``ok`` otherwise (also with too few samples to judge).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from .frontier import Antichain

__all__ = ["OK", "WARN", "STALL", "STOP", "REWIND", "STATUSES", "Sample", "Lag", "lag",
           "evaluate", "LagWindow", "moved_back"]

OK, WARN, STALL, STOP, REWIND = "ok", "warn", "stall", "stop", "rewind"
STATUSES = (OK, WARN, STALL, STOP, REWIND)
"""Every status, healthiest first."""


@dataclass(frozen=True)
class Lag:
    """A reader's lag: ``epochs`` (count), ``seconds`` (``>= 0``), and ``oldest`` (the
    completion time of the earliest-completed epoch not passed, ``time.time()`` seconds, or
    ``None`` when there is none)."""

    epochs: int
    seconds: float
    oldest: float | None


def lag(order, position: Iterable[Any] | None, done: Iterable[Any], lower: Iterable[Any],
        epochs: Iterable[tuple[Any, float]], now: float) -> Lag:
    """The lag (module docstring) of a reader at ``position`` (``None``: it has not begun,
    every complete epoch counts) having settled ``done`` beyond it, for a topic whose merged
    lower frontier is ``lower``, given the indexed ``epochs`` as ``(time, completed_at)``
    pairs. ``now``: ``time.time()`` seconds."""
    pos = None if position is None else Antichain(order, position)
    low = Antichain(order, lower)
    settled = set(done)
    count, oldest = 0, None
    for t, completed in epochs:
        if low.less_equal(t):  # not complete yet
            continue
        if pos is not None and not pos.less_equal(t):  # passed
            continue
        if t in settled:
            continue
        count += 1
        if oldest is None or completed < oldest:
            oldest = completed
    return Lag(count, 0.0 if oldest is None else max(0.0, now - oldest), oldest)


def moved_back(order, before: Iterable[Any] | None, after: Iterable[Any] | None) -> bool:
    """True iff position ``after`` is strictly behind ``before``: it differs, and every epoch
    at or beyond ``before`` is at or beyond ``after`` (the reader would be given epochs it had
    passed). ``None`` (not begun) is behind every position."""
    if after is None:
        return before is not None
    if before is None:
        return False
    b, a = Antichain(order, before), Antichain(order, after)
    if set(b.elements) == set(a.elements):
        return False
    return all(a.less_equal(t) for t in b.elements) if b.elements else bool(a.elements)


@dataclass(frozen=True)
class Sample:
    """One observation of a reader: ``at`` (``time.time()`` seconds), ``position`` (a tuple of
    times or ``None``), ``lag`` (epochs) and ``committed_at`` (its last ack, ``time.time()``
    seconds, or ``None``)."""

    at: float
    position: tuple | None
    lag: int
    committed_at: float | None


def evaluate(order, samples: list[Sample], now: float, window: float) -> str:
    """The status (module docstring) from ``samples`` (oldest first; those older than
    ``window`` seconds before ``now`` are ignored). Returns one of :data:`STATUSES`."""
    recent = [s for s in samples if s.at >= now - window]
    if not recent:
        return OK
    last = recent[-1]
    if last.lag == 0:
        return OK
    if any(moved_back(order, a.position, b.position) for a, b in zip(recent, recent[1:])):
        return REWIND
    committed = max((s.committed_at for s in recent if s.committed_at is not None), default=None)
    if committed is not None and now - committed > window:
        return STOP
    if len(recent) < 2 or last.at - recent[0].at < window / 2:
        return OK
    same = all(s.position == recent[0].position for s in recent)
    never_decreased = all(b.lag >= a.lag for a, b in zip(recent, recent[1:]))
    if same and never_decreased:
        return STALL
    if never_decreased and last.lag > recent[0].lag:
        return WARN
    return OK


class LagWindow:
    """The samples of many readers over the last ``window`` seconds (at most ``max_samples``
    each: memory stays bounded however often it is fed), and their status. Keys are any
    hashable reader identity, e.g. ``("durable", topic, name)``. Not thread-safe."""

    def __init__(self, window: float = 300.0, max_samples: int = 120):
        if window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {window!r}")
        self.window = float(window)
        self.max_samples = int(max_samples)
        self._samples: dict[Any, deque] = {}

    def add(self, key: Any, sample: Sample) -> None:
        """Record ``sample`` for reader ``key`` (dropping its samples older than the window)."""
        q = self._samples.get(key)
        if q is None:
            q = self._samples[key] = deque(maxlen=self.max_samples)
        q.append(sample)
        while q and q[0].at < sample.at - self.window:
            q.popleft()

    def status(self, key: Any, order, now: float) -> str:
        """:func:`evaluate` over reader ``key``'s samples (``ok`` for an unknown reader)."""
        return evaluate(order, list(self._samples.get(key, ())), now, self.window)

    def forget(self, keep: set) -> None:
        """Drop every reader not in ``keep`` (readers that no longer exist)."""
        for key in [k for k in self._samples if k not in keep]:
            del self._samples[key]
