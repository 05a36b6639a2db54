"""The exactly-once staging ledger of one topic partition: which task attempts staged what, and
what a COMMIT publishes. Pure: no I/O, no sockets, no Spark, no clock.

Spark's two-phase sink protocol: every task attempt's batches are *staged* under
``(epoch, run, attempt)`` as they arrive; the driver-side commit names the attempts Spark kept
(at most one per Spark partition — failed, killed and speculative attempts are not named), and
:meth:`StagingLedger.commit` hands back exactly their batches to publish, in the named order,
and discards every other attempt's batches of the epoch. The rules:

- **Idempotent.** The ledger does not store the partition's frontier (the first epoch not yet
  complete): its owner's publisher does, and passes it in as ``next_epoch``. A COMMIT of an
  epoch below it is a *duplicate* (a repeated commit, or the re-run of a batch after a restart):
  nothing is published; DATA of such an epoch is dropped on arrival, never staged.
- **Never an epoch with rows missing.** A COMMIT names each attempt with the row count its task
  reported; if any named attempt staged another count (e.g. its rows were dropped by a late
  ABORT of a stopped run) the COMMIT is refused (:class:`StagingRefused`) and nothing changes.
- **Bounded memory.** The staged payloads' bytes are counted; a batch that would take them past
  ``max_staged_bytes`` is refused. A commit of epoch ``e`` frees every staged epoch ``<= e``;
  an ABORT frees its epoch.

The owner (:mod:`epochstream.spark.host`) publishes :attr:`CommitPlan.payloads` at the epoch
and then advances its frontier to :attr:`CommitPlan.next_epoch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_MAX_STAGED_BYTES", "AttemptKey", "StagingRefused", "StagingCounts", "Staged",
           "CommitPlan", "StagingLedger"]

DEFAULT_MAX_STAGED_BYTES = 1 << 30

#: an attempt's name: (Spark run id, task attempt id)
AttemptKey = tuple[str, int]


class StagingRefused(ValueError):
    """The ledger refused a call; its state is unchanged: a batch that would exceed
    ``max_staged_bytes``, a FLUSH whose counts differ from what was staged, or a COMMIT whose
    named attempts staged other row counts than their tasks reported."""


@dataclass
class StagingCounts:
    """Counters of a ledger since it was created (batches are staged payloads)."""

    epochs: int = 0             # epochs committed (not counting duplicates)
    rows: int = 0               # rows handed out to publish
    batches: int = 0            # batches handed out to publish
    duplicates: int = 0         # COMMITs of an epoch below the frontier
    discarded_batches: int = 0  # staged batches of attempts that were not committed
    aborts: int = 0             # ABORTs received
    staged_batches: int = 0     # batches staged (published, discarded or still staged)


@dataclass(frozen=True)
class Staged:
    """What one attempt has staged of one epoch: ``batches`` payloads, ``rows`` rows, ``nbytes``
    bytes."""

    batches: int
    rows: int
    nbytes: int


@dataclass(frozen=True)
class CommitPlan:
    """What a COMMIT of ``epoch`` asks of the owner: publish ``payloads`` (in order) at
    ``epoch``, then advance the frontier to ``next_epoch`` (``epoch + 1``). A ``duplicate``
    plan publishes nothing and leaves the frontier (``next_epoch``) where it is.
    ``empty_attempts``: named attempts that had staged nothing (tasks without rows)."""

    epoch: int
    duplicate: bool
    next_epoch: int
    payloads: tuple = ()
    rows: int = 0
    empty_attempts: int = 0

    @property
    def batches(self) -> int:
        return len(self.payloads)


@dataclass
class _Slot:
    rows: int = 0
    nbytes: int = 0
    payloads: list = field(default_factory=list)


class StagingLedger:
    """Staged batches per ``(epoch, (run, attempt))`` with byte accounting (see the module
    docstring). Not thread-safe: one owner drives it. ``payload`` objects are opaque
    bytes-like values (``len()`` is their size in bytes); the ledger hands them back as given."""

    def __init__(self, max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES):
        if max_staged_bytes < 0:
            raise ValueError(f"max_staged_bytes must be >= 0, got {max_staged_bytes}")
        self.max_staged_bytes = int(max_staged_bytes)
        self._staged: dict[int, dict[AttemptKey, _Slot]] = {}
        self._bytes = 0
        self._counts = StagingCounts()

    # ---- queries

    @property
    def staged_bytes(self) -> int:
        """Bytes staged now (received, neither handed out to publish nor discarded)."""
        return self._bytes

    @property
    def counts(self) -> StagingCounts:
        """A copy of the counters."""
        return dataclasses.replace(self._counts)

    def epochs(self) -> tuple[int, ...]:
        """The epochs with staged batches, ascending."""
        return tuple(sorted(self._staged))

    def attempts(self, epoch: int) -> dict[AttemptKey, Staged]:
        """What each attempt has staged of ``epoch`` (empty if nothing)."""
        return {k: Staged(len(s.payloads), s.rows, s.nbytes)
                for k, s in self._staged.get(epoch, {}).items()}

    # ---- events

    def stage(self, next_epoch: int, epoch: int, run: str, attempt: int, payload: Any,
              rows: int) -> bool:
        """Stage one batch of ``rows`` rows of attempt ``(run, attempt)`` of ``epoch``. Returns
        False (nothing staged) when ``epoch < next_epoch``: a straggler of a committed epoch.
        Raises :class:`StagingRefused` when it would exceed ``max_staged_bytes``."""
        if epoch < next_epoch:
            return False
        nbytes = len(payload)
        if self._bytes + nbytes > self.max_staged_bytes:
            self.collect(next_epoch)
            if self._bytes + nbytes > self.max_staged_bytes:
                raise StagingRefused(f"staging full ({self._bytes} bytes): epoch {epoch} not "
                                     f"committed in time")
        slot = self._staged.setdefault(epoch, {}).setdefault((run, attempt), _Slot())
        slot.rows += rows
        slot.nbytes += nbytes
        slot.payloads.append(payload)
        self._bytes += nbytes
        self._counts.staged_batches += 1
        return True

    def flush(self, next_epoch: int, epoch: int, run: str, attempt: int, batches: int,
              rows: int) -> Staged | None:
        """Check that attempt ``(run, attempt)`` staged ``batches`` batches of ``rows`` rows of
        ``epoch``: returns what it staged, or ``None`` when the epoch is already committed
        (``epoch < next_epoch``: nothing needed). Raises :class:`StagingRefused` when the counts
        differ (e.g. batches lost, or dropped by an ABORT). Changes nothing."""
        if epoch < next_epoch:
            return None
        s = self.attempts(epoch).get((run, attempt), Staged(0, 0, 0))
        if (s.batches, s.rows) != (batches, rows):
            raise StagingRefused(f"epoch {epoch} attempt {attempt}: staged {s.batches} batches / "
                                 f"{s.rows} rows, the task sent {batches} / {rows}")
        return s

    def commit(self, next_epoch: int, epoch: int,
               attempts: Iterable[Sequence]) -> CommitPlan:
        """Commit ``epoch`` with exactly ``attempts`` — ``(run, attempt)`` or ``(run, attempt,
        rows)`` with ``rows`` the count the task reported (``None``: unchecked). Returns the
        :class:`CommitPlan`: a duplicate when ``epoch < next_epoch``; otherwise the named
        attempts' batches (in the named order) — every other attempt's batches of the epoch and
        everything staged for earlier epochs is discarded. Raises :class:`StagingRefused`, with
        nothing changed, when a named attempt staged other rows than reported."""
        names, reported = _named(attempts)
        if epoch < next_epoch:
            self._counts.duplicates += 1
            self.collect(next_epoch)
            return CommitPlan(epoch, True, next_epoch)
        self._check_rows(epoch, reported)
        staged = self._staged.pop(epoch, {})
        payloads: list = []
        rows = empty = 0
        for key in names:
            slot = staged.pop(key, None)
            if slot is None:
                empty += 1
                continue
            payloads += slot.payloads
            rows += slot.rows
            self._bytes -= slot.nbytes
        self._discard(staged.values())
        self.collect(epoch + 1)
        c = self._counts
        c.epochs, c.rows, c.batches = c.epochs + 1, c.rows + rows, c.batches + len(payloads)
        return CommitPlan(epoch, False, epoch + 1, tuple(payloads), rows, empty)

    def duplicate(self, epoch: int) -> int:
        """The owner found a COMMIT of ``epoch`` to be a duplicate by its own rule (event time:
        a batch id not in this ledger's frontier, :mod:`epochstream.spark.event_time`): count
        it and discard everything staged up to ``epoch``; returns how many batches."""
        self._counts.duplicates += 1
        return self.collect(epoch + 1)

    def abort(self, epoch: int) -> int:
        """Discard every staged batch of ``epoch`` (Spark aborted the batch); returns how
        many."""
        self._counts.aborts += 1
        return self._discard(self._staged.pop(epoch, {}).values())

    def collect(self, next_epoch: int) -> int:
        """Discard everything staged for epochs below ``next_epoch`` (they can never be
        committed); returns how many batches."""
        old = [e for e in self._staged if e < next_epoch]
        return sum(self._discard(self._staged.pop(e).values()) for e in old)

    # ---- internals

    def _check_rows(self, epoch: int, reported: list[tuple[AttemptKey, int]]) -> None:
        have = self._staged.get(epoch, {})
        short = [(key, have[key].rows if key in have else 0, rows) for key, rows in reported
                 if (have[key].rows if key in have else 0) != rows]
        if short:
            raise StagingRefused(f"epoch {epoch}: staged rows differ from what the tasks "
                                 f"reported (attempt, staged, reported): {short}; epoch not "
                                 f"committed")

    def _discard(self, slots: Iterable[_Slot]) -> int:
        n = 0
        for slot in slots:
            n += len(slot.payloads)
            self._bytes -= slot.nbytes
        self._counts.discarded_batches += n
        return n


def _named(attempts: Iterable[Sequence]) -> tuple[list[AttemptKey], list[tuple[AttemptKey, int]]]:
    """The distinct attempt keys in order, and every reported row count (an attempt named twice
    must match both)."""
    names: dict[AttemptKey, None] = {}
    reported: list[tuple[AttemptKey, int]] = []
    for entry in attempts:
        key = (entry[0], entry[1])
        names[key] = None
        rows = entry[2] if len(entry) > 2 else None
        if rows is not None:
            reported.append((key, rows))
    return list(names), reported
