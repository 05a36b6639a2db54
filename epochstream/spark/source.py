"""The stream reader of the Python Data Source ``epochstream`` (PySpark >= 4): a topic's durable
history read as a Structured Streaming source, in micro-batches of whole epochs between two
frontiers, its position kept in a durable subscription of the catalog (docs/spark.md, "Spark as
a consumer (source)"). Read with::

    spark.readStream.format("epochstream").option("topic", "flights")
         .option("catalog", "/srv/.epochstream")          # path (or URL) of the catalog
         .option("startingPosition", "earliest")          # | "latest" | a frontier as JSON
         .option("maxEpochsPerTrigger", 10)               # whole epochs per micro-batch
         .load()

Its parts: :mod:`~epochstream.spark.source_options` (the options, :class:`SourceError`),
:mod:`~epochstream.spark.offsets` (offsets as frontiers, :func:`batch_end`),
:mod:`~epochstream.spark.source_history` (log states, the latest complete frontier, the start),
:mod:`~epochstream.spark.source_schema` (:func:`source_schema`, called at ``.load()``) and
:mod:`~epochstream.spark.source_read` (:class:`EpochSlice`, what a task reads); their public
names are importable from here too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader

from ..errors import SubscriptionExpired, SubscriptionHeld
from ..frontier import Antichain, join
from ..history import History
from .offsets import _canonical, _frontier, _offset, batch_end
from .source_history import _history, _latest, _resolve_start, _states
from .source_options import SourceError, SourceOptions
from .source_read import SLICE_BYTES, EpochSlice, _read_slice, _slices
from .source_schema import EPOCH_COLUMN, PARTITION_COLUMN, _arrow_schema, source_schema

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

CLAIM_WAIT = 10.0
"""Seconds the reader waits for a durable subscription held by another process to be freed
(a killed driver's Python worker may outlive it briefly) before raising ``SubscriptionHeld``."""


class EpochstreamStreamReader(*_READER_BASES):  # type: ignore[misc]
    """The stream reader (docs/spark.md, "Offsets are frontiers" and "Exactly once, and the
    durable subscription"). ``options``: the DataSource's options
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
        if self._arrow is None:
            self._arrow = _arrow_schema(self.schema)
        yield from _read_slice(partition, self._arrow)
