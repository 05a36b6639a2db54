"""The values of durable history as the catalog hands them out: :class:`EpochRecord` (one
epoch's entry in a partition's log index), :class:`HistoryState` (a partition's log),
:class:`DurableInfo` (a durable subscription), how a time is stored (:func:`encode_time`,
:func:`decode_time`) and whether a log still holds a position (:func:`position_available`).

Frozen values, no I/O: the tables that hold them and every read and write of them are
:mod:`epochstream.catalog.history`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from ..frontier import Antichain

__all__ = ["EpochRecord", "HistoryState", "DurableInfo", "encode_time", "decode_time", "store_usage",
           "position_available"]


def encode_time(t: Any) -> str:
    """A time (an int, or a tuple of ints) as the stored JSON text."""
    return json.dumps(list(t) if isinstance(t, tuple) else t)


def decode_time(text: str) -> Any:
    """The stored JSON text of a time as an int or a tuple of ints."""
    v = json.loads(text)
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True)
class EpochRecord:
    """The index entry of one complete epoch in one partition's log: ``segment`` (its file's
    number), ``extents`` (``((offset, length), ...)`` bytes of its ``D`` records in that file),
    ``nbytes`` (payload bytes), ``messages`` (``D`` records), ``crc`` (CRC-32 chained over the
    records' own CRC-32s, in order) and ``completed_at`` (``time.time()``, seconds);
    ``object``: the name, under the log's store's root, of an object holding every extent of
    the epoch at the same offsets (``None``: the epoch is not in an object store)."""

    partition: int
    time: Any
    segment: int
    extents: tuple
    nbytes: int
    messages: int
    crc: int
    completed_at: float
    object: str | None = None


@dataclass(frozen=True)
class HistoryState:
    """One partition's log as the index knows it: ``dir`` (its directory), ``since`` (every
    complete epoch ``t`` with ``since <= t`` is retained; a tuple of times), ``lower``/``upper``
    (frontiers as of the last commit), ``segment``/``committed`` (the segment being written
    and the bytes of it the index covers), ``segments`` (:class:`~epochstream.retention.SegmentStat`
    per retained segment, oldest first), ``updated_at`` (``time.time()`` of the last commit),
    ``store`` (the URI of the object store its sealed segments go to, without credentials;
    ``"fs:<type>"`` if given as a ``pyarrow.fs.FileSystem``; ``None``: no store)."""

    partition: int
    dir: str
    since: tuple
    lower: tuple
    upper: tuple
    segment: int
    committed: int
    segments: tuple
    updated_at: float
    store: str | None = None


@dataclass(frozen=True)
class DurableInfo:
    """A durable subscription: ``position`` (its acked frontier, a tuple of times, or ``None``
    before its first join), ``acked`` (epochs at or beyond the position acked out of order: a
    resume skips them), ``state`` (``"active"`` or ``"expired"``), ``holder`` (the holding
    subscriber's id or ``None``), ``holder_alive`` (whether that holder's process runs now),
    ``holder_pid``/``holder_host``, ``created_at``/``acked_at`` (``time.time()``, seconds) and
    ``reason`` (why it expired)."""

    topic: str
    name: str
    position: tuple | None
    acked: tuple
    state: str
    holder: str | None
    holder_alive: bool
    holder_pid: int | None
    holder_host: str | None
    created_at: float
    acked_at: float | None
    reason: str | None


def position_available(order, position: Iterable[Any], since: Iterable[Any]) -> bool:
    """True iff every epoch at or beyond ``position`` is at or beyond ``since`` (so a log that
    retains everything at or beyond ``since`` holds every epoch a resume at ``position`` asks
    for): each element of ``position`` is at or beyond ``since``."""
    s = Antichain(order, since)
    return all(s.less_equal(a) for a in position)


def store_usage(state: HistoryState) -> tuple[int, int, int]:
    """Where a partition's log is in its object store, from the index (no I/O): ``(bytes,
    objects, backlog)`` — the bytes of the indexed objects, their number, and the sealed
    segments holding epochs whose whole bytes are not in the store yet (the upload backlog as
    the index sees it: waiting, failing, or kept only locally past ``upload_backlog``)."""
    stored = [g for g in state.segments if g.object]
    backlog = sum(1 for g in state.segments if g.seq < state.segment and g.epochs
                  and (g.object_bytes or 0) < g.nbytes)
    return sum(g.object_bytes or 0 for g in stored), len(stored), backlog
