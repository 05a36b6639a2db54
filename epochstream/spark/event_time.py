"""Event time in the Spark sink: epochs read from the rows, many per micro-batch, completed by
the batch or by Spark's event-time watermark. Pure: no sockets, no Spark session, no clock
(pyarrow computes on the rows).

Without the options below the sink keeps its original mapping: one micro-batch is one epoch
(epoch = batch id). With them, the batch is only Spark's unit of staging and commit, and each
row carries its epoch (timely's model: data carries its time, progress says which times are
final):

- ``option("epochColumn", "day")`` — the epoch is an integer column (Spark ``tinyint`` ..
  ``bigint``), ``>= 0``, never null. Completion policy ``option("complete", "batch")`` (the
  default with ``epochColumn``): every epoch up to the greatest one present in a committed
  batch is complete when that batch commits (for sources that deliver whole periods per batch,
  e.g. one file per day with ``maxFilesPerTrigger``). A batch with a row of an epoch that an
  earlier batch completed fails at its commit (:class:`EventTimeError` naming the epoch) and
  publishes nothing — never a reopened or partial epoch.
- ``option("epochColumns", "day,hour")`` — for a topic with a product order (``product(k)``,
  the host's ``order=``): ``k`` integer columns, in the topic's order, each ``>= 0``; the epoch
  is the tuple. Only ``complete="batch"``: when a batch commits, every epoch at or below one
  of its epochs (in the product order) is complete — the partition's new frontier is the set of
  minimal times of what remains (:func:`advance_past`). A row of an epoch already complete
  fails the batch as above.
- ``option("complete", "watermark")`` with ``option("eventTime", "ts")`` (a ``timestamp``
  column) and ``option("epochLength", "1 day")``: epochs are tumbling windows of event time,
  ``epoch = floor((ts - 1970-01-01T00:00:00Z) / length)`` (1-day epochs count days since 1970,
  UTC). Spark's watermark completes them: the query must declare
  ``withWatermark("ts", delay)`` — Spark marks the column with ``spark.watermarkDelayMs`` in the
  schema it hands the sink, and the sink reads Spark's own delay from there. Python sinks see no
  watermark (the commit has only the batch id; a ``StreamingQueryListener``'s progress arrives
  asynchronously, after later batches may have started), so the sink keeps Spark's watermark
  itself, with Spark's semantics (checked against ``lastProgress["eventTime"]["watermark"]``
  in the tests): after batch ``b`` the watermark is ``max(event time of batches <= b) -
  delay``, never decreasing; the epochs whose window ends at or before it (``(e + 1) * length
  <= watermark``) complete at ``b``'s commit — the watermark Spark uses in batch ``b + 1``,
  applied as soon as it is known. A row whose epoch is already complete when its batch commits
  is **dropped and counted** (``late_rows`` in the host's statistics, a warning in its log);
  rows behind Spark's watermark in an epoch not yet complete are kept (the epoch is not final,
  nothing is appended to a complete epoch). An epoch may collect rows over many batches; it is
  complete (and released to subscribers, whole) only once the watermark passes its end. An idle
  stream completes nothing more until more data moves the watermark, or the host closes (which
  completes every epoch).

Bad input is refused before anything is published: a missing column or one of the wrong type
fails the query when it plans its first batch; nulls, negative epochs or timestamps before 1970
fail the task that reads them (Spark then fails the batch, nothing of it is committed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EpochstreamError

__all__ = ["BATCH", "WATERMARK", "POLICIES", "WATERMARK_DELAY_KEY", "EventTimeError",
           "EventTime", "Piece", "event_time", "parse_length", "check_schema", "split",
           "CommitDecision", "decide", "decide_product", "advance_past"]

BATCH, WATERMARK = "batch", "watermark"
POLICIES = (BATCH, WATERMARK)
"""The completion policies (``option("complete", ...)``)."""

WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
"""The metadata key Spark puts on the event-time column of ``withWatermark`` (milliseconds)."""

_UNITS_US = {"microsecond": 1, "millisecond": 1_000, "second": 1_000_000,
             "minute": 60_000_000, "hour": 3_600_000_000, "day": 86_400_000_000,
             "week": 604_800_000_000}
_INTEGER_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")
_TIMESTAMP_TYPES = ("TimestampType", "TimestampNTZType")


class EventTimeError(EpochstreamError, ValueError):
    """Event-time options or rows the sink cannot publish: a bad option, a missing or mistyped
    column, a null or negative epoch, a row of an epoch already complete (``complete="batch"``).
    The message names the column, the epoch or the batch."""


@dataclass(frozen=True)
class EventTime:
    """The sink's event-time options: ``policy`` (``"batch"``/``"watermark"``), ``column`` (the
    epoch column or the event-time column), ``length_us`` (the watermark policy's epoch length,
    microseconds; 0 for ``"batch"``), ``delay_us`` (Spark's watermark delay, microseconds, read
    from the schema; 0 until :func:`check_schema`, and for ``"batch"``)."""

    policy: str
    column: str
    length_us: int = 0
    delay_us: int = 0
    columns: tuple[str, ...] = ()  # epochColumns (a product order), else ()

    @property
    def width(self) -> int | None:
        """The product order's width (``len(columns)``), or ``None`` for a total order."""
        return len(self.columns) or None


def parse_length(text: str) -> int:
    """``"1 day"``, ``"6 hours"``, ``"90 seconds"``, ``"500 milliseconds"`` (Spark's interval
    words, singular or plural; several parts add up: ``"1 hour 30 minutes"``) in microseconds,
    ``> 0``. Raises :class:`EventTimeError`."""
    tokens = text.strip().lower().replace(",", " ").split()
    units = [u[:-1] if u.endswith("s") and u[:-1] in _UNITS_US else u for u in tokens[1::2]]
    if (not tokens or len(tokens) % 2 or not all(n.isdigit() for n in tokens[::2])
            or any(u not in _UNITS_US for u in units)):
        raise EventTimeError(f'epochLength must be an interval such as "1 day", "6 hours" or '
                             f'"15 minutes" (units: {", ".join(_UNITS_US)}), got {text!r}')
    total = sum(int(n) * _UNITS_US[u] for n, u in zip(tokens[::2], units))
    if total <= 0:
        raise EventTimeError(f"epochLength must be > 0, got {text!r}")
    return total


def event_time(options: Mapping[str, str]) -> EventTime | None:
    """The sink's event-time options from its writer options, or ``None`` when it maps one
    batch to one epoch (neither ``epochColumn`` nor ``complete`` given). Raises
    :class:`EventTimeError` for a contradictory or incomplete set."""
    column = options.get("epochColumn") or None
    policy = options.get("complete") or None
    many = options.get("epochColumns") or None
    if many is not None:
        cols = tuple(c.strip() for c in many.split(","))
        if column is not None or policy not in (None, BATCH) or not all(cols):
            raise EventTimeError('option("epochColumns", "a,b") (a product-order topic) takes '
                                 'complete="batch" only, and not epochColumn as well; got '
                                 f'epochColumns={many!r}')
        return EventTime(BATCH, cols[0], columns=cols)
    if column is None and policy is None:
        for key in ("eventTime", "epochLength"):
            if options.get(key):
                raise EventTimeError(f'option {key!r} needs option("complete", "watermark")')
        return None
    policy = policy or BATCH
    if policy not in POLICIES:
        raise EventTimeError(f'option("complete") must be "batch" or "watermark", got {policy!r}')
    if policy == BATCH:
        if column is None:
            raise EventTimeError('complete="batch" needs the epoch column: '
                                 'option("epochColumn", "<integer column>")')
        return EventTime(BATCH, column)
    ts, length = options.get("eventTime") or None, options.get("epochLength") or None
    if column is not None or ts is None or length is None:
        raise EventTimeError('complete="watermark" takes option("eventTime", "<timestamp '
                             'column>") and option("epochLength", "<interval>", e.g. "1 day"), '
                             'not epochColumn')
    return EventTime(WATERMARK, ts, parse_length(length))


def check_schema(ev: EventTime, schema: Any) -> EventTime:
    """Check the query's schema (a Spark ``StructType``) against ``ev``: the column exists, is
    an integer (``"batch"``) or a timestamp with Spark's watermark delay on it
    (``"watermark"``). Returns ``ev`` with ``delay_us`` set. Raises :class:`EventTimeError`."""
    fields = {f.name: f for f in schema.fields}
    for name in ev.columns or (ev.column,):
        f = fields.get(name)
        if f is None:
            raise EventTimeError(f"the query has no column {name!r} (its columns: "
                                 f"{', '.join(fields) or 'none'})")
        if ev.policy == BATCH and type(f.dataType).__name__ not in _INTEGER_TYPES:
            raise EventTimeError(f"epochColumn {name!r} must be an integer column, it is "
                                 f"{f.dataType.simpleString()}")
    if ev.policy == BATCH:
        return ev
    f = fields[ev.column]
    kind = type(f.dataType).__name__
    if kind not in _TIMESTAMP_TYPES:
        raise EventTimeError(f"eventTime {ev.column!r} must be a timestamp column, it is "
                             f"{f.dataType.simpleString()}")
    delay = (f.metadata or {}).get(WATERMARK_DELAY_KEY)
    if not isinstance(delay, int) or delay < 0:
        raise EventTimeError(f'complete="watermark" needs Spark\'s watermark on {ev.column!r}: '
                             f'df.withWatermark("{ev.column}", "<delay>") before writeStream')
    return EventTime(ev.policy, ev.column, ev.length_us, delay * 1000, ev.columns)


@dataclass(frozen=True)
class Piece:
    """The rows of one epoch in one Arrow batch: ``epoch``, ``batch`` (a ``pyarrow``
    ``RecordBatch``), ``event_max`` (the greatest event time among them, microseconds since
    1970; ``None`` under ``"batch"``)."""

    epoch: int
    batch: Any
    event_max: int | None


def split(ev: EventTime, batch: Any) -> list[Piece]:
    """Split a ``pyarrow.RecordBatch`` into its epochs' rows, ascending by epoch (the rows of an
    epoch keep their order). Raises :class:`EventTimeError` for nulls, negative epochs or a
    timestamp before 1970."""
    import numpy as np
    import pyarrow as pa

    if ev.columns:
        return _split_product(ev, batch)
    col = batch.column(batch.schema.get_field_index(ev.column))
    if col.null_count:
        raise EventTimeError(f"column {ev.column!r} has {col.null_count} null value(s): every "
                             f"row needs its epoch")
    if ev.policy == BATCH:
        times = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
        event = None
    else:
        event = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64()).to_numpy(
            zero_copy_only=False)
        times = event // ev.length_us
    if len(times) and times.min() < 0:
        what = "an epoch" if ev.policy == BATCH else "an event time before 1970-01-01"
        raise EventTimeError(f"column {ev.column!r} has {what}: {int(times.min())} (epochs "
                             f"are >= 0)")
    if len(times) == 0:
        return []
    lo, hi = int(times.min()), int(times.max())
    if lo == hi:
        return [Piece(lo, batch, None if event is None else int(event.max()))]
    order = np.argsort(times, kind="stable")
    ordered = times[order]
    cuts = np.flatnonzero(np.diff(ordered)) + 1
    taken = batch.take(pa.array(order))
    pieces = []
    for start, end in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(times)]))):
        idx = order[start:end]
        pieces.append(Piece(int(ordered[start]), taken.slice(int(start), int(end - start)),
                            None if event is None else int(event[idx].max())))
    return pieces


def _split_product(ev: EventTime, batch: Any) -> list[Piece]:
    """:func:`split` for ``epochColumns``: each row's epoch is the tuple of its columns;
    pieces in lexicographic order of their epochs (a linear extension of the product order)."""
    import numpy as np
    import pyarrow as pa

    cols = []
    for name in ev.columns:
        col = batch.column(batch.schema.get_field_index(name))
        if col.null_count:
            raise EventTimeError(f"column {name!r} has {col.null_count} null value(s): every "
                                 f"row needs its epoch")
        values = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
        if len(values) and values.min() < 0:
            raise EventTimeError(f"column {name!r} has an epoch: {int(values.min())} (epochs "
                                 f"are >= 0)")
        cols.append(values)
    if batch.num_rows == 0:
        return []
    keys = np.stack(cols, axis=1)
    order = np.lexsort(tuple(reversed(cols)))  # first column most significant
    ordered = keys[order]
    cuts = np.flatnonzero(np.any(np.diff(ordered, axis=0) != 0, axis=1)) + 1
    taken = batch.take(pa.array(order))
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(order)]))
    return [Piece(tuple(int(x) for x in ordered[a]), taken.slice(int(a), int(b - a)), None)
            for a, b in zip(starts, ends)]


def advance_past(order: Any, frontier: list, maxima: list) -> list:
    """The frontier after completing every time at or below one of ``maxima`` (a partial
    order's times, e.g. ``product(k)`` tuples), from ``frontier`` (an antichain): the minimal
    times of ``up(frontier)`` minus ``down(maxima)``. For each ``m`` in turn, an element ``f <=
    m`` is replaced by the least times above ``f`` not ``<= m``: ``f`` with one coordinate
    raised to ``m_i + 1``; then only the minimal elements are kept. Pure."""
    from ..frontier import Antichain

    current = list(frontier)
    for m in maxima:
        nxt: list = []
        for f in current:
            if order.le(f, m):
                nxt += [tuple(m[i] + 1 if j == i else f[j] for j in range(len(f)))
                        for i in range(len(f))]
            else:
                nxt.append(f)
        current = list(Antichain(order, nxt).elements)
    return sorted(current)


def decide_product(order: Any, batch: int, frontier: list, next_batch: int | None,
                   minima: list, maxima: list) -> CommitDecision:
    """:func:`decide` for ``epochColumns`` (``complete="batch"`` on a product order):
    ``frontier`` the partition's antichain, ``minima``/``maxima`` the minimal and maximal
    epochs with rows in the whole batch. An epoch ``t`` is complete iff no element of the
    frontier is ``<= t``; a batch with a complete epoch has a complete minimal one. Returns
    ``next_frontier`` as a sorted list of times. Raises :class:`EventTimeError`."""
    if next_batch is not None and batch < next_batch:
        return CommitDecision(True, 0, None, None, list(frontier))
    if not minima:
        return CommitDecision(False, 0, None, None, list(frontier))
    le = order.le
    complete = [m for m in minima if not any(le(f, m) for f in frontier)]
    if complete and len(complete) == len(minima) and next_batch is None:
        return CommitDecision(True, 0, None, (
            f"batch {batch}: its epochs are complete already; taken as the re-run of a batch "
            f"committed before this host restarted (nothing published again)"), list(frontier))
    if complete:
        raise EventTimeError(
            f"batch {batch} has rows of epoch {tuple(complete[0])}, complete since an earlier "
            f"batch (the topic's frontier is {sorted(frontier)}): with complete=\"batch\" every "
            f"row of an epoch must come in one micro-batch; nothing of batch {batch} was "
            f"published")
    return CommitDecision(False, 0, None, None, advance_past(order, frontier, maxima))


@dataclass(frozen=True)
class CommitDecision:
    """What a partition does with an event-time COMMIT of batch ``batch``: ``duplicate`` — it
    was committed already, publish nothing; else publish the staged rows of epochs ``>=
    frontier`` (the partition's frontier before the commit), drop (and count) those below it
    (``"watermark"``), and advance to ``next_frontier``; ``event_max``: the greatest event time
    seen so far (``"watermark"``). ``note``: a line for the host's log, or ``None``."""

    duplicate: bool
    next_frontier: int
    event_max: int | None = None
    note: str | None = None
    next_antichain: list | None = None  # a product order's next frontier (decide_product)


def decide(policy: str, batch: int, frontier: int, next_batch: int | None,
           times: tuple[int, int] | None, event_max: int | None, seen_max: int | None,
           length_us: int, delay_us: int) -> CommitDecision:
    """The completion policy, one COMMIT at a time (see the module docstring).

    ``frontier``: the partition's first incomplete epoch; ``next_batch``: the first batch id not
    committed here (``None``: unknown, the host restarted); ``times``: ``(lo, hi)`` epochs with
    rows in the whole batch (``None``: none); ``event_max``: the batch's greatest event time
    and ``seen_max`` the greatest before it (microseconds; ``"watermark"``). Raises
    :class:`EventTimeError`, changing nothing, for a ``"batch"`` commit with rows of an epoch
    already complete."""
    if next_batch is not None and batch < next_batch:
        return CommitDecision(True, frontier, seen_max)
    if policy == BATCH:
        if times is None:
            return CommitDecision(False, frontier)
        lo, hi = times
        if lo >= frontier:
            return CommitDecision(False, hi + 1)
        if hi < frontier and next_batch is None:
            return CommitDecision(True, frontier, None, (
                f"batch {batch}: epochs {lo}..{hi} are complete already; taken as the re-run of "
                f"a batch committed before this host restarted (nothing published again)"))
        raise EventTimeError(
            f"batch {batch} has rows of epoch {lo}, complete since an earlier batch (the "
            f"topic's frontier is {frontier}): with complete=\"batch\" every row of an epoch must "
            f"come in one micro-batch; nothing of batch {batch} was published")
    top = max(x for x in (seen_max, event_max) if x is not None) if (
        seen_max is not None or event_max is not None) else None
    if top is None:
        return CommitDecision(False, frontier, None)
    complete = max(0, (top - delay_us) // length_us)  # windows ending at or before the mark
    return CommitDecision(False, max(frontier, complete), top)
