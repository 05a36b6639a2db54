"""The Spark side of the source: the stream reader of the Python Data Source ``epochstream``
(PySpark >= 4), which reads a topic's durable history as a Structured Streaming source.

Read with::

    spark.readStream.format("epochstream").option("topic", "flights")
         .option("catalog", "/srv/.epochstream")          # path (or URL) of the catalog
         .option("startingPosition", "earliest")          # | "latest" | a frontier as JSON
         .option("maxEpochsPerTrigger", 10)               # whole epochs per micro-batch
         .load()

Rows: the topic's columns, plus ``_epoch`` (the time: ``long``, or ``array<long>`` for a
``product(n)`` order) and ``_partition`` (``int``, the topic partition).

**Offsets are frontiers** (:mod:`epochstream.position`): an offset is the JSON object
``{"topic": <name>, "frontier": [<time>, ...]}``, the frontier an antichain of the topic's
times (ints, or lists of ints for product orders) in a linear extension of the order. A
micro-batch from ``start`` to ``end`` holds exactly the complete retained epochs ``t`` with
``start <= t`` (some element of ``start`` is ``<= t``) and not ``end <= t``: whole epochs, every
partition's records of them, valid for partial orders. Batch boundaries are therefore epoch
boundaries, and consecutive batches neither overlap nor leave a gap (each ``end`` is the next
batch's ``start``, and every ``end`` is at or beyond its ``start``).

- :meth:`EpochstreamStreamReader.latestOffset` only ever covers epochs that are complete *and*
  durably logged in every partition: the merged lower frontier of the partitions'
  :class:`~epochstream.catalog.history.HistoryState` ``lower`` (what
  :meth:`History.records <epochstream.history.History.records>` calls complete), a partition
  whose log has not started yet holding everything back. With a limit of ``n`` epochs
  (``maxEpochsPerTrigger``) the end is the frontier just after the first ``n`` epochs with data
  of a linear extension (:func:`batch_end`): a prefix of a linear extension is closed
  downwards, so that frontier cuts exactly those ``n`` epochs, never part of one.
- :meth:`~EpochstreamStreamReader.partitions` lists the epochs (their
  :class:`~epochstream.catalog.history.EpochRecord`\\ s, from the index) and
  :meth:`~EpochstreamStreamReader.read` is a pure function of that list: it reads the logged,
  checksummed bytes (:meth:`History.payloads <epochstream.history.History.payloads>`), so a
  retried or re-run task reads the same rows, or raises
  :class:`~epochstream.errors.HistoryUnavailable` if retention deleted them.
- :meth:`~EpochstreamStreamReader.commit` moves a **durable subscription** of the catalog
  (:meth:`Catalog.durable_claim <epochstream.catalog.history.HistoryCatalog.durable_claim>`,
  ``durable_ack``, ``durable_release``) to the committed end offset: ``epochstream durable ls``
  shows the query's position, and retention expires it (``SubscriptionExpired``, never a silent
  skip) if the limits delete epochs the query has not committed yet. Its name is the option
  ``durableName``; the default is ``spark-<topic>-<12 hex digits>``, a SHA-256 of the
  ``topic``, ``catalog`` and ``startingPosition`` options (the reader cannot see the query's
  checkpoint location: PySpark gives a stream reader its own options only). A new query
  (no checkpoint yet) starts where its durable subscription stands if it exists, else at
  ``startingPosition`` (and creates it there), so its first batch starts at the same frontier
  after a crash.

Errors at ``.load()`` (from :func:`source_schema`, which PySpark calls there unless the user
gave ``.schema(...)``): an unknown topic (:class:`~epochstream.errors.TopicNotFound`), a topic
that keeps no history (:class:`~epochstream.errors.HistoryUnavailable`), a bad option or a
msgpack topic without a schema (:class:`SourceError`). With a user schema PySpark runs no
Python code at ``.load()``; the same checks then fail the query when it starts, before its
first batch (``StreamingQuery.exception()``).

PySpark versions: 4.0 and 4.1 call ``latestOffset()`` without arguments (the reader then
derives the start from what it planned before, or from its durable subscription, and ignores
``maxEpochsPerTrigger`` when it cannot know it); 4.2 and later pass ``(start, limit)``, ask
:meth:`~EpochstreamStreamReader.getDefaultReadLimit` (``ReadMaxFiles(n)`` for
``maxEpochsPerTrigger=n``: an epoch counts as a file), and use ``Trigger.AvailableNow`` through
:meth:`~EpochstreamStreamReader.prepareForTriggerAvailableNow`.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..catalog.history import EpochRecord
from ..errors import (EpochstreamError, HistoryUnavailable, ProtocolError, SubscriptionExpired,
                      SubscriptionHeld)
from ..frontier import Antichain, join
from ..history import History
from ..order import dual, linear_extension
from ..position import resolve_position

try:  # PySpark >= 4.2: read limits and Trigger.AvailableNow for Python stream readers
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxBytes, ReadMaxFiles,
                                                  SupportsTriggerAvailableNow)
    _READER_BASES: tuple = (DataSourceStreamReader, SupportsTriggerAvailableNow)
except ImportError:  # PySpark 4.0, 4.1: latestOffset() without arguments
    ReadAllAvailable = ReadMaxBytes = ReadMaxFiles = None  # type: ignore[assignment,misc]
    _READER_BASES = (DataSourceStreamReader,)

__all__ = ["SourceError", "SourceOptions", "EpochSlice", "EpochstreamStreamReader",
           "source_schema", "batch_end", "EPOCH_COLUMN", "PARTITION_COLUMN",
           "SLICE_BYTES", "CLAIM_WAIT"]

EPOCH_COLUMN = "_epoch"
PARTITION_COLUMN = "_partition"
SLICE_BYTES = 64 << 20
"""Payload bytes per input partition (one Spark task): a topic partition's epochs of a batch are
cut into slices of about this size (whole epochs; one larger epoch is a slice of its own)."""
CLAIM_WAIT = 10.0
"""Seconds the reader waits for a durable subscription held by another process to be freed
(a killed driver's Python worker may outlive it briefly) before raising ``SubscriptionHeld``."""


class SourceError(EpochstreamError, ValueError):
    """A Spark read of a topic cannot work as configured: a missing or bad option, a msgpack
    topic without a user schema, a checkpoint of another topic. The message says what to
    change."""


# ---- options


class SourceOptions:
    """The reader's options, checked (keys are case-insensitive, as PySpark passes them):

    - ``topic`` (required);
    - ``catalog``: the catalog's path or URL (default: as :class:`~epochstream.catalog.Catalog`;
      give an absolute path: executors may run in another directory);
    - ``startingPosition``: ``"earliest"`` (everything retained), ``"latest"`` (the first epochs
      not complete yet; the default) or a frontier as JSON: ``3``, ``[3]``, ``[1, 2]`` (one
      ``product(2)`` time), ``[[1, 2], [2, 1]]``; inclusive;
    - ``maxEpochsPerTrigger``: an int >= 1, whole epochs with data per micro-batch (default: all
      available);
    - ``durableName``: the durable subscription that holds the query's position (default in
      the module docstring).

    Raises :class:`SourceError` for a missing topic or a malformed value."""

    def __init__(self, options: Mapping[str, str]):
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        topic = opts.get("topic")
        if not topic:
            raise SourceError('the epochstream source needs a topic: .option("topic", "<name>")')
        self.topic: str = str(topic)
        self.catalog: str | None = opts.get("catalog") or None
        self.starting: str = str(opts.get("startingposition") or "latest").strip()
        raw = opts.get("maxepochspertrigger")
        self.max_epochs: int | None = None
        if raw is not None and str(raw).strip() != "":
            try:
                self.max_epochs = int(str(raw).strip())
            except ValueError:
                self.max_epochs = 0
            if self.max_epochs < 1:
                raise SourceError(f"maxEpochsPerTrigger must be an int >= 1, got {raw!r}")
        name = opts.get("durablename")
        if name is None:
            digest = hashlib.sha256(json.dumps([self.topic, self.catalog, self.starting])
                                    .encode()).hexdigest()[:12]
            name = f"spark-{self.topic[:150]}-{digest}"
        self.durable_name: str = str(name)

    def position(self, order) -> str | tuple:
        """``startingPosition`` as ``"earliest"``, ``"latest"`` or a checked frontier (a tuple
        of times). Raises :class:`SourceError` naming what was expected."""
        text = self.starting
        if text in ("earliest", "latest"):
            return text
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        try:
            if isinstance(value, bool) or not isinstance(value, (int, list)):
                raise ValueError("not JSON of a time or a list of times")
            if isinstance(value, list) and getattr(order, "width", None) is not None and value \
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                value = tuple(value)  # one product time, [1, 2]
            elif isinstance(value, list):
                value = [tuple(v) if isinstance(v, list) else v for v in value]
            return tuple(resolve_position(order, value) or ())
        except (ValueError, ProtocolError) as e:
            raise SourceError(
                f"startingPosition {text!r} for topic {self.topic!r} (order {order.name}): {e}; "
                f"expected 'earliest', 'latest' or a frontier as JSON: a time (3, or [1, 2] for "
                f"a product time) or a list of times ([[1, 2], [2, 1]])") from None


# ---- offsets (JSON) <-> frontiers


def _json_time(t: Any) -> Any:
    return list(t) if isinstance(t, tuple) else t


def _canonical(order, frontier) -> tuple:
    """``frontier`` as its antichain's elements in a linear extension of ``order`` (so that
    equal frontiers have equal JSON: Spark compares offsets as text)."""
    return tuple(linear_extension(order, Antichain(order, frontier).elements))


def _offset(topic: str, order, frontier) -> dict:
    return {"topic": topic, "frontier": [_json_time(t) for t in _canonical(order, frontier)]}


def _frontier(topic: str, order, offset: Any) -> tuple:
    """The frontier of an offset this source produced (from Spark's offset log). Raises
    :class:`SourceError` for an offset of another topic or another shape."""
    if not isinstance(offset, dict) or not isinstance(offset.get("frontier"), list):
        raise SourceError(f"not an offset of the epochstream source: {offset!r}")
    if offset.get("topic") != topic:
        raise SourceError(f"the query's checkpoint holds offsets of topic {offset.get('topic')!r}, "
                          f"not {topic!r}: use a fresh checkpoint location for another topic")
    try:
        times = [tuple(t) if isinstance(t, list) else t for t in offset["frontier"]]
        return tuple(Antichain(order, [order.check(t) for t in times]).elements)
    except ProtocolError as e:
        raise SourceError(f"offset {offset!r} does not fit topic {topic!r}: {e}") from None


# ---- the pure planning rule


def batch_end(order, start, latest, epochs, *, max_epochs: int | None = None,
              max_bytes: int | None = None) -> tuple:
    """The end offset (a frontier) of a micro-batch starting at ``start``.

    ``latest``: the merged lower frontier (every epoch not at or beyond it is complete);
    ``epochs``: ``[(time, nbytes), ...]``, the complete retained epochs with data at or beyond
    ``start`` and not at or beyond ``latest``, in a linear extension of ``order`` (what
    :meth:`History.records <epochstream.history.History.records>` returns). Returns ``start``
    itself when ``epochs`` is empty (nothing to read: Spark runs no batch); otherwise ``E``
    such that the batch ``{t : start <= t and not E <= t}`` holds exactly the first ``n`` of
    ``epochs`` with ``n = len(epochs)`` capped by ``max_epochs`` and by ``max_bytes`` (but at
    least 1: a batch always makes progress), every time in it complete, and every element of
    ``E`` at or beyond ``start``:

        E = the antichain of  epochs[n:]  and  join(start, latest)

    A prefix of a linear extension is closed downwards (nothing outside it is ``<=`` anything
    in it), so no epoch left out is below one taken and ``E`` cuts exactly there, for any
    partial order. O(k·w) comparisons for k epochs left and an antichain of width w."""
    full = join(order, start, latest)
    if not epochs:
        return tuple(start)
    n = len(epochs)
    if max_epochs is not None:
        n = min(n, max(1, int(max_epochs)))
    if max_bytes is not None:
        total, take = 0, 0
        for _, nbytes in epochs[:n]:
            total += nbytes
            if take and total > max_bytes:
                break
            take += 1
        n = take
    return _canonical(order, [t for t, _ in epochs[n:]] + list(full))


# ---- partitions


class EpochSlice(InputPartition):
    """What one Spark task reads: ``records``, the :class:`EpochRecord`\\ s of whole epochs of
    topic partition ``partition`` (from the index, in a linear extension of the order), with
    the ``topic`` and ``catalog`` to read them from. ``value`` is ``(partition, times)``."""

    def __init__(self, topic: str, catalog: str | None, partition: int,
                 records: tuple[EpochRecord, ...]):
        super().__init__((partition, tuple(r.time for r in records)))
        self.topic = topic
        self.catalog = catalog
        self.partition = partition
        self.records = records


def _slices(topic: str, catalog: str | None, epochs) -> list[EpochSlice]:
    """Per topic partition, the batch's records cut into slices of about :data:`SLICE_BYTES`."""
    by_partition: dict[int, list[EpochRecord]] = {}
    for _, recs in epochs:
        for r in recs:
            by_partition.setdefault(r.partition, []).append(r)
    out = []
    for p in sorted(by_partition):
        chunk: list[EpochRecord] = []
        size = 0
        for r in by_partition[p]:
            if chunk and size + r.nbytes > SLICE_BYTES:
                out.append(EpochSlice(topic, catalog, p, tuple(chunk)))
                chunk, size = [], 0
            chunk.append(r)
            size += r.nbytes
        if chunk:
            out.append(EpochSlice(topic, catalog, p, tuple(chunk)))
    return out


# ---- the topic's state: logs, latest complete frontier


def _history(options: SourceOptions) -> History:
    """The topic's :class:`History`. Raises ``TopicNotFound``, ``HistoryUnavailable`` (no
    partition keeps a log, or a registered one does not)."""
    history = History(options.topic, catalog=options.catalog)
    _states(history)
    return history


def _states(history: History) -> tuple[dict, Any]:
    """The partitions' log states and the topic's :class:`~epochstream.catalog.records.TopicInfo`,
    checked: raises ``HistoryUnavailable`` if no partition keeps a log or a registered one keeps
    none (the source reads nothing but the logs)."""
    states = history.states()
    info = history.catalog.lookup(history.topic)
    unlogged = sorted(p.index for p in info.partition_info if p.index not in states)
    if not states or unlogged:
        which = f"partition(s) {unlogged}" if states else "no partition"
        raise HistoryUnavailable(
            f"topic {history.topic!r}: {which} keep(s) an epoch log; the Spark source reads "
            f"the topic's history: publish every partition with retention=Retention() "
            f"(SparkPublisherHost(..., retention=Retention()))")
    return states, info


def _after(order, upper) -> tuple:
    """The frontier of the times not ``<=`` any element of ``upper`` (the complement of its
    down-set), for the total and ``product(n)`` orders: ``[u + 1]``, or per ``u`` the ``n``
    unit steps ``(0, .., u_i + 1, .., 0)``, joined over ``upper`` (the intersection of their
    up-sets)."""
    out: tuple = (order.minimum,)
    width = getattr(order, "width", None)
    for u in upper:
        if width is None:
            step: tuple = (u + 1,)
        else:
            step = tuple(tuple(u[i] + 1 if j == i else order.minimum[j] for j in range(width))
                         for i in range(width))
        out = join(order, out, step)
    return out


def _latest(history: History, checked: tuple[dict, Any]) -> tuple:
    """The merged lower frontier of the logs: every epoch not at or beyond it is complete and
    logged in every partition (``History.records``' test). A partition without a log yet (not
    started) contributes the order's minimum: nothing is complete until it starts.

    A finished log (closed: an empty lower frontier) contributes :func:`_after` the topic's
    upper frontier (every partition's, logged and in the catalog; the minimum if no partition
    ever sent data) instead of nothing: a later run may continue the topic with later epochs,
    and an offset that reached the empty frontier could never read them."""
    states, info = checked
    order = history.order
    merged = Antichain(order)
    finished = False
    for s in states.values():
        merged.extend(s.lower)
        finished |= not s.lower
    if finished:
        upper = Antichain(dual(order))
        for s in states.values():
            upper.extend(s.upper)
        for p in info.partition_info:
            upper.extend(p.upper)
        merged.extend(_after(order, upper.elements))
    if len(states) < history.partitions:
        merged.insert(order.minimum)
    return _canonical(order, merged.elements)


def _resolve_start(history: History, options: SourceOptions, checked: tuple) -> tuple:
    """``startingPosition`` as a frontier: ``earliest`` the retained ``since``, ``latest`` the
    merged lower frontier now, or the given one, checked to be retained (raises
    ``HistoryUnavailable`` naming what is)."""
    order = history.order
    position = options.position(order)
    if position == "earliest":
        return _canonical(order, history.since)
    if position == "latest":
        return _latest(history, checked)
    retained = Antichain(order, history.since)
    if not all(retained.less_equal(a) for a in position):
        raise HistoryUnavailable(
            f"topic {history.topic!r}: startingPosition {list(position)} is older than what is "
            f"retained (since {list(history.since)}); start at 'earliest' or later",
            retained=tuple(history.since))
    return _canonical(order, position)


# ---- schema (DataSource.schema(), at .load())


def _meta_fields(order):
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StructField

    epoch = (LongType() if getattr(order, "width", None) is None
             else ArrayType(LongType(), containsNull=False))
    return [StructField(EPOCH_COLUMN, epoch, nullable=False),
            StructField(PARTITION_COLUMN, IntegerType(), nullable=False)]


def source_schema(options: Mapping[str, str]):
    """The rows' schema for ``.load()`` without a user schema: the topic's Arrow schema, taken
    from its newest retained epoch (or, with none retained yet, the catalog's schema text as a
    Spark DDL string, e.g. ``SparkPublisherHost(..., schema=...)``), plus ``_epoch`` and
    ``_partition``. Returns a ``StructType`` or a DDL string.

    Checks everything a query needs, so that ``.load()`` fails: raises ``TopicNotFound``,
    ``HistoryUnavailable`` (no log, or ``startingPosition`` older than what is retained) or
    :class:`SourceError` (bad option; a msgpack topic — give ``.schema(...)``; an Arrow topic
    with no retained epoch and no schema text; a column named ``_epoch`` or ``_partition``)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    opts = SourceOptions(options)
    history = History(opts.topic, catalog=opts.catalog)
    checked = _states(history)
    _resolve_start(history, opts, checked)
    info = checked[1]
    if history.codec.name != "arrow":
        raise SourceError(
            f"topic {opts.topic!r} uses codec {history.codec.name!r}: its records carry no "
            f"schema; give one with spark.readStream.schema(\"<columns>, _epoch "
            f"{'bigint' if getattr(history.order, 'width', None) is None else 'array<bigint>'}, "
            f"_partition int\") (records are dicts, read by column name, or sequences, by "
            f"position), or publish it with codec=\"arrow\"")
    retained = history.records()
    if retained:
        _, recs = retained[-1]
        _, payload = history.payloads(list(recs[:1]))[0]
        fields = list(from_arrow_schema(history.codec.decode(payload).schema).fields)
    elif info.schema:
        return f"{info.schema}, {EPOCH_COLUMN} " + (
            "BIGINT" if getattr(history.order, "width", None) is None else "ARRAY<BIGINT>") + \
            f", {PARTITION_COLUMN} INT"
    else:
        raise SourceError(
            f"topic {opts.topic!r} has no retained epoch yet to take its Arrow schema from, and "
            f"the catalog has no schema text for it: give one with "
            f"spark.readStream.schema(...) (its columns plus {EPOCH_COLUMN}, {PARTITION_COLUMN})")
    clash = [f.name for f in fields if f.name in (EPOCH_COLUMN, PARTITION_COLUMN)]
    if clash:
        raise SourceError(f"topic {opts.topic!r} has column(s) {clash}, which the source adds "
                          f"itself; rename them or give a schema with .schema(...)")
    return StructType(fields + _meta_fields(history.order))


def _arrow_schema(schema):
    """Spark ``StructType`` -> the exact ``pyarrow.Schema`` PySpark checks read batches
    against (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # PySpark 4.0: no timezone argument (timestamps are UTC)
        return to_arrow_schema(schema)


# ---- the reader


class EpochstreamStreamReader(*_READER_BASES):  # type: ignore[misc]
    """The stream reader (see the module docstring). ``options``: the DataSource's options
    (:class:`SourceOptions`); ``schema``: the rows' ``StructType``. Construction only parses
    the options (Spark builds a reader in every task too): the catalog is first read by the
    driver-side methods.

    Raises :class:`SourceError` for bad options; the driver-side methods raise
    ``TopicNotFound``, ``HistoryUnavailable`` (the start is no longer retained, or a partition
    keeps no log), ``SubscriptionExpired`` (retention deleted epochs the query had not
    committed) and ``SubscriptionHeld`` (another live reader or subscriber holds the durable
    name: give this query a ``durableName`` of its own)."""

    def __init__(self, options: Mapping[str, str], schema: Any = None):
        self.options = SourceOptions(options)
        self.schema = schema
        self._hist: History | None = None
        self._holder: str | None = None
        self._initial: tuple | None = None   # the initial frontier, once resolved
        self._start: tuple | None = None     # the next batch's start, for latestOffset()
        self._target: tuple | None = None    # Trigger.AvailableNow: latest frontier to reach
        self._arrow: Any = None

    # -- driver side -------------------------------------------------------------------
    @property
    def history(self) -> History:
        if self._hist is None:
            self._hist = _history(self.options)
        return self._hist

    def _hold(self) -> None:
        """Claim the durable subscription for this reader (once), waiting up to
        :data:`CLAIM_WAIT` seconds for a holder that is going away."""
        if self._holder is not None:
            return
        cat, topic, name = self.history.catalog, self.options.topic, self.options.durable_name
        holder = f"spark-source-{uuid.uuid4().hex}"
        deadline = time.monotonic() + CLAIM_WAIT
        while True:
            try:
                cat.durable_claim(topic, name, holder)
                break
            except SubscriptionHeld as e:
                if time.monotonic() >= deadline:
                    raise SubscriptionHeld(
                        f"{e}. A Spark query reads through its own durable subscription: give "
                        f"each query reading topic {topic!r} its own .option(\"durableName\", "
                        f"...) (the default, {name!r}, derives from topic, catalog and "
                        f"startingPosition only)") from None
                time.sleep(0.2)
        self._holder = holder

    def _ack(self, frontier: tuple) -> None:
        """Store ``frontier`` as the durable subscription's position (held by this reader)."""
        self._hold()
        cat, topic, name = self.history.catalog, self.options.topic, self.options.durable_name
        if cat.durable_ack(topic, name, str(self._holder), list(frontier)):
            return
        info = cat.durable(topic, name)
        if info is not None and info.state == "expired":
            raise SubscriptionExpired(
                f"durable subscription {name!r} of topic {topic!r} (this query's position) "
                f"expired: {info.reason}; epochs the query had not committed are gone",
                name=name, acked=info.position or (), retained=tuple(self.history.since))
        raise SubscriptionHeld(f"durable subscription {name!r} of topic {topic!r} was taken "
                               f"over, reset or dropped while this query held it")

    def initialOffset(self) -> dict:
        """Where a new query starts: its durable subscription's position if it has one, else
        ``startingPosition`` (the durable subscription is created there). The same frontier on
        every call (Spark asks again when it re-runs the first batch after a restart)."""
        h = self.history
        if self._initial is None:
            self._hold()
            info = h.catalog.durable(self.options.topic, self.options.durable_name)
            if info is not None and info.position is not None:
                start = _canonical(h.order, info.position)
            else:
                start = _resolve_start(h, self.options, _states(h))
                self._ack(start)
            self._initial = start
        if self._start is None:
            self._start = self._initial
        return _offset(self.options.topic, h.order, self._initial)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The end offset of the next batch from ``start`` (see :func:`batch_end`): all complete
        retained epochs, or the first ``n`` of them under ``ReadMaxFiles(n)`` (PySpark >= 4.2)
        or ``maxEpochsPerTrigger`` (PySpark 4.0/4.1, called without arguments), or as many
        whole epochs as fit ``ReadMaxBytes`` (at least one). Returns ``start`` when no new
        epoch with data is complete."""
        h, order, topic = self.history, self.history.order, self.options.topic
        self._hold()
        latest = _latest(h, _states(h))
        if self._target is not None:
            latest = self._target
        max_epochs = max_bytes = None
        if start is None:  # PySpark 4.0/4.1: latestOffset()
            if self._start is None:
                # a restarted query: the durable position is at or before the true start, and
                # join(position, latest) at or beyond it (as every end this reader plans is);
                # without the true start: no limit and no "nothing new" shortcut
                info = h.catalog.durable(topic, self.options.durable_name)
                if info is not None and info.position is not None:
                    base = tuple(info.position)
                else:
                    self.initialOffset()
                    base = self._initial or ()
                end = _canonical(order, join(order, base, latest))
                self._start = end
                return _offset(topic, order, end)
            begin = self._start
            max_epochs = self.options.max_epochs
        else:
            begin = _frontier(topic, order, start)
            if limit is not None and ReadMaxFiles is not None:
                if isinstance(limit, ReadMaxFiles):
                    max_epochs = limit.max_files
                elif isinstance(limit, ReadMaxBytes):
                    max_bytes = limit.max_bytes
                elif not isinstance(limit, ReadAllAvailable):
                    raise SourceError(f"the epochstream source supports the read limits "
                                      f"ReadAllAvailable, ReadMaxFiles (epochs) and ReadMaxBytes, "
                                      f"not {limit!r}")
        epochs = [(t, sum(r.nbytes for r in recs))
                  for t, recs in h.records(since=list(begin), until=list(latest))]
        end = batch_end(order, begin, latest, epochs, max_epochs=max_epochs, max_bytes=max_bytes)
        self._start = end
        return _offset(topic, order, end)

    def getDefaultReadLimit(self):
        """``ReadMaxFiles(maxEpochsPerTrigger)`` (an epoch counts as a file), or
        ``ReadAllAvailable()`` (PySpark >= 4.2)."""
        if self.options.max_epochs is not None:
            return ReadMaxFiles(self.options.max_epochs)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:
        """The merged lower frontier of the logs now, as an offset (the query status' latest
        offset)."""
        h = self.history
        return _offset(self.options.topic, h.order, _latest(h, _states(h)))

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: what is complete now is the target; later
        :meth:`latestOffset` calls never go beyond it."""
        h = self.history
        self._target = _latest(h, _states(h))

    def partitions(self, start: dict, end: dict) -> list[EpochSlice]:
        """The batch's epochs ``{t : start <= t and not end <= t}`` as :class:`EpochSlice`\\ s
        (per topic partition, about :data:`SLICE_BYTES` each; none when ``start == end``).
        Raises ``HistoryUnavailable`` if ``start`` is no longer retained."""
        h, order, topic = self.history, self.history.order, self.options.topic
        begin, stop = _frontier(topic, order, start), _frontier(topic, order, end)
        if self._start is None:  # PySpark 4.0/4.1 after a restart: the re-run batch's end
            self._start = stop
        if Antichain(order, begin) == Antichain(order, stop):
            return []
        return _slices(topic, self.options.catalog,
                       h.records(since=list(begin), until=list(stop)))

    def commit(self, end: dict) -> None:
        """Spark finished every batch up to ``end``: move the durable subscription there.
        Raises ``SubscriptionExpired`` if retention deleted epochs at or beyond its position
        meanwhile, ``SubscriptionHeld`` if it was taken over, reset or dropped."""
        frontier = _frontier(self.options.topic, self.history.order, end)
        if self._start is None:
            self._start = frontier
        self._hold()
        self._ack(frontier)

    def stop(self) -> None:
        """Let go of the durable subscription (its position stays)."""
        if self._holder is not None and self._hist is not None:
            try:
                self._hist.catalog.durable_release(self.options.topic, self.options.durable_name,
                                                   self._holder)
            finally:
                self._holder = None

    # -- executor side -----------------------------------------------------------------
    def read(self, partition: EpochSlice) -> Iterator:
        """The rows of ``partition``'s epochs as ``pyarrow.RecordBatch``\\ es of the query's
        schema, one per logged payload: a pure function of ``partition`` (the logged bytes are
        immutable and checksummed). Raises ``HistoryUnavailable`` if retention deleted an epoch,
        ``HistoryCorrupt`` if its bytes fail their checks, :class:`SourceError` if a column does
        not convert to the schema's type."""
        import pyarrow as pa

        if self._arrow is None:
            self._arrow = _arrow_schema(self.schema)
        target = self._arrow
        columns = [f.name for f in target if f.name not in (EPOCH_COLUMN, PARTITION_COLUMN)]
        history = History(partition.topic, catalog=partition.catalog)
        codec = history.codec
        for record in partition.records:
            epoch = _json_time(record.time)
            for p, payload in history.payloads([record]):
                data = codec.decode(payload)
                n = data.num_rows if codec.name == "arrow" else len(data)
                if n == 0:
                    continue
                arrays = []
                for field in target:
                    if field.name == EPOCH_COLUMN:
                        arrays.append(pa.array([epoch] * n, field.type))
                    elif field.name == PARTITION_COLUMN:
                        arrays.append(pa.array([p] * n, field.type))
                    else:
                        arrays.append(_column(data, codec.name, field, columns.index(field.name),
                                              n, partition.topic, record.time))
                yield pa.RecordBatch.from_arrays(arrays, schema=target)


def _column(data, codec: str, field, position: int, n: int, topic: str, t: Any):
    """Column ``field`` of one payload, converted to ``field.type``: an Arrow batch's column of
    that name (nulls if it has none); msgpack records' values, by name for dicts, else by
    ``position`` (among the schema's columns without ``_epoch``/``_partition``)."""
    import pyarrow as pa

    try:
        if codec == "arrow":
            i = data.schema.get_field_index(field.name)
            if i < 0:
                return pa.nulls(n, field.type)
            col = data.column(i)
            return col if col.type == field.type else col.cast(field.type)
        name = field.name
        values = [r.get(name) if isinstance(r, dict)
                  else (r[position] if isinstance(r, (list, tuple)) and position < len(r)
                        else None)
                  for r in data]
        return pa.array(values, field.type)
    except (pa.ArrowException, TypeError, ValueError, KeyError) as e:
        raise SourceError(f"topic {topic!r}, epoch {t!r}: column {field.name!r} does not "
                          f"convert to {field.type}: {e}") from None
