"""Retention of the epoch log: the configuration (:class:`Retention`) and the pure policy that
decides which whole segments to delete (:func:`segments_to_delete`). No I/O: the log writer
(:mod:`epochstream.epochlog`) feeds it the segments' sizes and ages and deletes what it returns.

Model (docs/history.md): a partition's log is a sequence of segment files; a segment holds
whole epochs only (segments roll at epoch boundaries), so deleting the oldest segments removes
whole epochs. The limits are upper bounds, as NATS JetStream's ``LimitsPolicy`` and Kafka's
``retention.bytes``/``retention.ms``: nothing is deleted before a limit requires it, so every
durable subscription whose acked position is within the limits keeps its history ("held back
within those limits"); one that falls behind them expires
(:class:`~epochstream.errors.SubscriptionExpired`), never a silent skip.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Retention", "SegmentStat", "segments_to_delete", "segment_aged", "check_interval",
           "FSYNC_POLICIES", "DEFAULT_MAX_AGE", "DEFAULT_MAX_BYTES", "DEFAULT_SEGMENT_BYTES",
           "MAX_CHECK_INTERVAL", "DEFAULT_UPLOAD_BACKLOG", "UPLOAD_MODES"]

FSYNC_POLICIES = ("frontier", "none", "every")
UPLOAD_MODES = ("sealed", "frontier")
"""What goes to the store when (``Retention.upload``)."""
DEFAULT_MAX_BYTES = 1 << 30
"""1 GiB per partition."""
DEFAULT_MAX_AGE = 7 * 24 * 3600.0
"""7 days, in seconds (Kafka's default ``retention.ms``)."""
MAX_CHECK_INTERVAL = 60.0
"""Longest time, seconds, between two age checks of an idle log (:func:`check_interval`)."""
DEFAULT_SEGMENT_BYTES = 64 << 20
"""64 MiB."""
DEFAULT_UPLOAD_BACKLOG = 64
"""Sealed segments waiting for their upload to the store, at most (``Retention.upload_backlog``)."""


@dataclass(frozen=True)
class Retention:
    """How a publisher keeps its partition's epoch log (``Publisher(..., retention=...)``).

    - ``dir``: directory of the logs (``<dir>/<topic>/<partition>/``); ``None`` = ``history/``
      next to the catalog file.
    - ``max_bytes``: bytes of segments kept per partition (default 1 GiB; ``None``: no limit).
    - ``max_age``: seconds an epoch is kept after it completed (default 7 days; ``None``: no
      limit). A segment is deleted once its *newest* epoch is older; the segment being written
      is closed at the first epoch boundary after its *oldest* epoch is older (Kafka closes a
      segment after ``segment.ms``), so an epoch is deleted between ``max_age`` and about
      ``2 * max_age`` after it completed, also while the publisher is idle (checked every
      :func:`check_interval`).
    - ``max_epochs``: epochs kept per partition (``None``, the default: no limit).
    - ``segment_bytes``: a segment is closed and a new one started at the first epoch boundary
      after it reached this size (default 64 MiB; a soft limit: a segment never splits an epoch).
    - ``fsync``: ``"frontier"`` (default: one ``fsync`` per frontier advance that completes
      epochs, before they are indexed and before the frontier update leaves the process — an
      epoch is announced complete only once it is on disk), ``"none"`` (written to the OS, no
      ``fsync``: survives a crash of the process, not of the machine), ``"every"`` (an ``fsync``
      after every data message too).
    - ``store``: an object store for the log's *sealed* segments (docs/history.md, "Object
      stores"): a URI ``pyarrow.fs.FileSystem.from_uri`` opens (``"s3://bucket/prefix"``, with
      ``?endpoint_override=host:port&scheme=http`` for a local S3; ``"file:///shared/dir"``),
      or a ``pyarrow.fs.FileSystem``; ``None`` (default): the log stays on local disk only.
      Checked here for its type only; the publisher opens and probes it at construction.
    - ``upload_backlog``: sealed segments waiting for their upload, at most (default 64);
      past it the oldest waiting one is kept only locally, with a WARNING (a publisher that
      opens the log later uploads it).
    - ``upload``: ``"sealed"`` (default: each sealed segment is uploaded in the background; the
      segment being written is only on local disk until the publisher closes) or
      ``"frontier"`` (needs ``store``: also, at every frontier advance, the bytes the segment
      being written gained are uploaded and indexed *before* the advance is indexed and
      announced — for a publisher whose disk may vanish with its machine; while the store is
      down, frontier advances wait: docs/history.md, "Upload modes").

    Retention is **off by default** (``retention=None``): Strymon's publishers are stateless by
    design, and logging costs disk space and an ``fsync`` per frontier advance, so a user turns
    it on where late joiners, resume or durable subscriptions are wanted (as a NATS user
    creates a JetStream stream). The limits bound the log whatever durable subscriptions hold.

    Raises ``ValueError`` for a limit that is not a positive number (or ``None``), a
    ``segment_bytes`` below 4 KiB, an unknown ``fsync`` policy, a ``store`` that is neither a
    URI (``scheme://...``) nor a filesystem, an ``upload_backlog`` below 1, or an ``upload``
    that is not one of :data:`UPLOAD_MODES` (or ``"frontier"`` without a ``store``).
    """

    dir: str | os.PathLike | None = None
    max_bytes: int | None = DEFAULT_MAX_BYTES
    max_age: float | None = DEFAULT_MAX_AGE
    max_epochs: int | None = None
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    fsync: str = "frontier"
    store: Any = dataclasses.field(default=None, repr=False)  # (a URI may hold credentials)
    upload_backlog: int = DEFAULT_UPLOAD_BACKLOG
    upload: str = "sealed"

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_epochs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Retention.{name} must be an int >= 1 or None, got {v!r}")
        v = self.max_age
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v <= 0):
            raise ValueError(f"Retention.max_age must be seconds > 0 or None, got {v!r}")
        v = self.segment_bytes
        if isinstance(v, bool) or not isinstance(v, int) or v < 4096:
            raise ValueError(f"Retention.segment_bytes must be an int >= 4096, got {v!r}")
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"Retention.fsync must be one of {FSYNC_POLICIES}, got {self.fsync!r}")
        if self.dir is not None and not isinstance(self.dir, (str, os.PathLike)):
            raise ValueError(f"Retention.dir must be a path or None, got {self.dir!r}")
        v = self.store
        if v is not None and not (isinstance(v, str) and "://" in v) \
                and not (hasattr(v, "open_input_file") and hasattr(v, "type_name")):
            raise ValueError(f"Retention.store must be a URI like 's3://bucket/prefix' or "
                             f"'file:///dir', a pyarrow.fs.FileSystem, or None; got {v!r}")
        v = self.upload_backlog
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"Retention.upload_backlog must be an int >= 1, got {v!r}")
        if self.upload not in UPLOAD_MODES:
            raise ValueError(f"Retention.upload must be one of {UPLOAD_MODES}, got "
                             f"{self.upload!r}")
        if self.upload == "frontier" and self.store is None:
            raise ValueError("Retention.upload='frontier' needs a store (Retention(store=...))")

    def replace(self, **changes) -> "Retention":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SegmentStat:
    """What the policy needs to know of one segment: ``seq`` (its number, increasing),
    ``nbytes`` (file size, bytes), ``epochs`` (complete epochs indexed in it) and
    ``last_completed`` (``time.time()`` when its newest epoch completed, seconds; ``None`` if
    it holds none yet); ``object``/``object_bytes``: the object in the log's store holding the
    segment's first ``object_bytes`` bytes, or ``None`` (not uploaded)."""

    seq: int
    nbytes: int
    epochs: int
    last_completed: float | None
    object: str | None = None
    object_bytes: int | None = None


def segments_to_delete(segments: Sequence[SegmentStat], retention: Retention,
                       now: float) -> int:
    """How many of the oldest ``segments`` (sorted by ``seq``, the last one being written) to
    delete so that the rest are within ``retention``'s limits at ``now`` (``time.time()``,
    seconds): the shortest prefix that removes every segment whose newest epoch is older than
    ``max_age`` and brings the totals within ``max_bytes`` and ``max_epochs``. A segment with no
    epoch (only frontier records) has no age of its own: it goes with the prefix before an
    older-than-``max_age`` segment. The segment being written is never deleted (segments go
    oldest first, as Kafka deletes whole segments).
    Limits are therefore enforced at segment granularity: the log may exceed one by up to the
    segment being written (choose ``segment_bytes`` well below ``max_bytes``).

    >>> r = Retention(max_epochs=10, max_bytes=None, max_age=None)
    >>> segs = [SegmentStat(0, 100, 6, 1.0), SegmentStat(1, 100, 6, 2.0), SegmentStat(2, 10, 1, 3.0)]
    >>> segments_to_delete(segs, r, now=4.0)
    1
    """
    if len(segments) < 2:
        return 0
    older = segments[:-1]  # the segment being written is never deleted
    n = 0
    if retention.max_age is not None:  # ages grow with seq: the last too-old one decides
        for i, s in enumerate(older):
            if s.last_completed is not None and now - s.last_completed > retention.max_age:
                n = i + 1
    total_bytes = sum(s.nbytes for s in segments)
    total_epochs = sum(s.epochs for s in segments)
    for i, s in enumerate(older):
        too_big = retention.max_bytes is not None and total_bytes > retention.max_bytes
        too_many = retention.max_epochs is not None and total_epochs > retention.max_epochs
        if not (too_big or too_many):
            break
        total_bytes -= s.nbytes
        total_epochs -= s.epochs
        n = max(n, i + 1)
    return n


def segment_aged(oldest_completed: float | None, retention: Retention, now: float) -> bool:
    """True iff the segment being written should be closed at the next epoch boundary because
    its oldest epoch completed (``oldest_completed``, ``time.time()`` seconds; ``None``: it
    holds no complete epoch) more than ``max_age`` seconds before ``now``: otherwise a log that
    grows slower than ``segment_bytes`` per ``max_age`` would keep its epochs for ever, the
    segment being written never being deleted.

    >>> segment_aged(100.0, Retention(max_age=60), now=161.0), segment_aged(None, Retention(), 1e12)
    (True, False)
    """
    return (retention.max_age is not None and oldest_completed is not None
            and now - oldest_completed > retention.max_age)


def check_interval(retention: Retention) -> float | None:
    """Seconds between two age checks of a log whose publisher commits nothing (idle): a tenth
    of ``max_age``, at most :data:`MAX_CHECK_INTERVAL`; ``None`` without ``max_age`` (the other
    limits only change when epochs are committed, and are applied then).

    >>> check_interval(Retention()), check_interval(Retention(max_age=2.0)), check_interval(Retention(max_age=None))
    (60.0, 0.2, None)
    """
    if retention.max_age is None:
        return None
    return min(MAX_CHECK_INTERVAL, retention.max_age / 10)
