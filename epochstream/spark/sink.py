"""The Spark side of the sink: the Python Data Source ``epochstream`` (PySpark >= 4), its stream
writer and commit message.

Write with ``df.writeStream.format("epochstream").option("topic", ...).option("catalog", ...)``.
Options: ``topic`` (required), ``catalog`` (catalog path; default as :class:`Catalog`),
``ackTimeout`` (seconds a task waits for its flush acknowledgement, default 60),
``commitTimeout`` (seconds the driver-side commit waits per partition, default 120),
``clientKey`` (for a host started with ``security=``: the tasks' and the driver-side commit's
CURVE key pair, the path of a ``NAME.key_secret`` certificate or a bare name looked up in
``$EPOCHSTREAM_KEYS`` of the process that reads it; default none: plain TCP), ``serverKey``
(pins the host's public key: Z85 text, a ``.key`` path or a name; default: the key the catalog
records with each partition, which the host registered next to its ingest endpoint). The key
pair needs a ``publish`` grant on the topic (docs/security.md); the option holds a path or a
name, never the secret itself (options show in Spark's plans and UI).

``write()`` runs once per task attempt on an executor: Spark partition ``i`` goes to topic
partition ``i % partitions``; each non-empty Arrow ``RecordBatch`` is sent to that partition's
ingest endpoint as a DATA message (Arrow IPC stream bytes, tagged run id, epoch = batch id, Spark
partition, task attempt id), then a FLUSH waits for the acknowledgement that every batch was
staged (ZeroMQ keeps per-connection order); only then does the task return its
:class:`EpochstreamCommitMessage`. ``commit()`` (a separate Python worker on the driver side)
sends COMMIT to every topic partition (:func:`~epochstream.spark.client.send_commit`);
``abort()`` sends ABORT, best effort. Spark builds a fresh writer for every batch and every
commit, so the writer holds only its options.

Errors at the start of a query: ``streamWriter()`` checks (one catalog lookup, via
:func:`~epochstream.spark.client.require_host`) that a live
:class:`~epochstream.spark.SparkPublisherHost` serves the topic, and otherwise raises an
:class:`IngestError` that says to start one. PySpark (4.x) calls ``streamWriter()`` in a Python
worker when it plans a micro-batch — not during ``DataStreamWriter.start()``, which has no hook
for a Python data source — so a query started without a host fails when it plans its first batch,
before any task runs, with that one message (from ``awaitTermination()`` / ``exception()``);
likewise when the host is secured and the sink has no ``clientKey`` (or the reverse), or the
key file cannot be read there. :func:`~epochstream.spark.start_query` makes the host check (not
the key checks) in the caller's process, so there ``start`` itself raises. A key the host does
not let in (not in its ``allow`` directory, the wrong ``serverKey``) fails the task at its next
send or wait, at once (the client socket's monitor sees the failed handshake), with a message
that says which; a key without a ``publish`` grant fails it with the host's "not authorised to
publish to topic 'T'" (the commit too); nothing of such a task is staged. A Spark worker whose
Python cannot import epochstream fails while unpickling this class, before any code of
epochstream runs: :func:`~epochstream.spark.register` (and so ``start_query``) checks the
workers' Python first (see :func:`~epochstream.spark.session.check_worker_python`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from ..wire import codec
from .client import (DEFAULT_COMMIT_TIMEOUT, IngestClient, client_for, drop_client,
                     ingest_targets, require_host, send_commit)
from .event_time import EventTime, check_schema, event_time, split
from .ingest import Abort, Data, EventTimes, Flush, FlushAck, IngestError
from .source import EpochstreamStreamReader, source_schema

__all__ = ["SOURCE_NAME", "DEFAULT_ACK_TIMEOUT", "EpochstreamDataSource", "EpochstreamStreamWriter",
           "EpochstreamCommitMessage"]

log = logging.getLogger(__name__)

SOURCE_NAME = "epochstream"
DEFAULT_ACK_TIMEOUT = 60.0

_ARROW = codec("arrow")  # a DATA payload is what the topic's codec publishes: Arrow IPC bytes


@dataclass
class EpochstreamCommitMessage(WriterCommitMessage):
    """What one successful task attempt reports to ``commit``: enough to name its staged data
    (``run_id``, ``task_attempt_id``) without a TaskContext on the driver."""

    query_id: str | None
    run_id: str
    epoch: int
    partition: int            # Spark partition id
    topic_partition: int
    task_attempt_id: int
    attempt_number: int
    rows: int
    batches: int
    epoch_lo: int | None = None   # event time: the least and greatest epoch of its rows
    epoch_hi: int | None = None
    event_max: int | None = None  # "watermark": its greatest event time, microseconds
    epoch_minima: list | None = None  # epochColumns: its rows' minimal and maximal epochs
    epoch_maxima: list | None = None


class _Written(NamedTuple):
    """What one task attempt sent: rows, batches (DATA messages), and with event time its
    epochs' range and greatest event time (``None`` without rows / without event time), and
    the distinct epochs (``epochColumns``: tuples)."""

    rows: int = 0
    batches: int = 0
    lo: int | None = None
    hi: int | None = None
    event_max: int | None = None
    epochs: frozenset = frozenset()


class _Task(NamedTuple):
    """The running task, from its TaskContext."""

    epoch: int                # the micro-batch id
    query_id: str | None      # stable across restarts of the query
    run_id: str               # new for every start of the query
    partition: int            # Spark partition id
    attempt: int              # task attempt id (unique within the SparkContext)
    attempt_number: int       # 0 for the first attempt of the task, 1 for its retry, ...

    @classmethod
    def current(cls) -> _Task:
        """Raises :class:`IngestError` outside a streaming write task."""
        ctx = TaskContext.get()
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if ctx is None or batch is None:
            raise IngestError("the epochstream sink writes only from a streaming query's task")
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        return cls(int(batch), query_id,
                   ctx.getLocalProperty("spark.jobGroup.id") or query_id or "run",
                   ctx.partitionId(), ctx.taskAttemptId(), ctx.attemptNumber())


class EpochstreamStreamWriter(DataSourceStreamArrowWriter):
    """The streaming writer (see the module docstring). Raises :class:`IngestError` without a
    ``topic`` option."""

    def __init__(self, options: Mapping[str, str], schema: Any = None):
        topic = options.get("topic")
        if not topic:
            raise IngestError('the epochstream sink needs a topic: .option("topic", "<name>")')
        self.topic: str = topic
        self.catalog = options.get("catalog") or None
        self.ack_timeout = float(options.get("ackTimeout", DEFAULT_ACK_TIMEOUT))
        self.commit_timeout = float(options.get("commitTimeout", DEFAULT_COMMIT_TIMEOUT))
        self.client_key: str | None = options.get("clientKey") or None
        self.server_key: str | None = options.get("serverKey") or None
        #: epochs from the rows (event time), or None: the batch is the epoch
        self.event: EventTime | None = event_time(options)
        if self.event is not None and schema is not None:
            self.event = check_schema(self.event, schema)

    def write(self, iterator: Iterator) -> EpochstreamCommitMessage:
        """Stage this task attempt's batches on its topic partition (executor side). Raises
        :class:`IngestError` when the host does not acknowledge them in time."""
        task = _Task.current()
        targets = ingest_targets(self.catalog, self.topic)
        tp = task.partition % len(targets)
        c = client_for(targets[tp], self.topic, self.client_key, self.server_key)
        try:
            w = self._stage(c, task, iterator)
        except BaseException:
            drop_client(targets[tp].endpoint)  # its queue may hold a half-sent attempt
            raise
        return EpochstreamCommitMessage(
            query_id=task.query_id, run_id=task.run_id, epoch=task.epoch,
            partition=task.partition, topic_partition=tp, task_attempt_id=task.attempt,
            attempt_number=task.attempt_number, rows=w.rows, batches=w.batches,
            epoch_lo=w.lo, epoch_hi=w.hi, event_max=w.event_max,
            **_extremes(self.event, w.epochs))

    def _pieces(self, batch: Any) -> list[tuple[int | None, Any, int | None]]:
        """``(epoch or None, rows, greatest event time or None)`` of one Arrow batch: the
        whole batch without event time, else its epochs' rows
        (:func:`~epochstream.spark.event_time.split`)."""
        if self.event is None:
            return [(None, batch, None)]
        return [(p.epoch, p.batch, p.event_max) for p in split(self.event, batch)]

    def _stage(self, c: IngestClient, task: _Task, iterator: Iterator) -> _Written:
        """Send every non-empty batch (with event time: each epoch's rows of it) as DATA, then
        FLUSH; returns what was sent. Raises :class:`~epochstream.spark.event_time.
        EventTimeError` for rows without a valid epoch (before anything of the batch is sent)."""
        w = _Written()
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            for time_, rows, event_max in self._pieces(batch):
                c.send(Data(task.run_id, task.epoch, task.partition, task.attempt,
                            rows.num_rows, _ARROW.encode(rows), time_), self.ack_timeout)
                if isinstance(time_, tuple):  # a product order: its epochs, not a range
                    w = w._replace(rows=w.rows + rows.num_rows, batches=w.batches + 1,
                                   epochs=w.epochs | {time_})
                    continue
                w = _Written(w.rows + rows.num_rows, w.batches + 1,
                             *_widen(w, time_, event_max))
        if w.batches:
            ack = cast(FlushAck, c.request(
                Flush(None, task.run_id, task.epoch, task.attempt, w.batches, w.rows,
                      self.event is not None), self.ack_timeout))
            if ack.batches != w.batches and not ack.stale:
                raise IngestError(f"ingest endpoint {c.endpoint} staged {ack.batches} of "
                                  f"{w.batches} batches of epoch {task.epoch}")
        return w

    def commit(self, messages: list, batchId: int) -> None:
        """COMMIT the batch on every topic partition (driver side); raises
        :class:`IngestError` when a partition refuses or does not answer in time."""
        query = next((m.query_id for m in messages if m is not None), None)
        send_commit(self.catalog, self.topic, int(batchId), messages, query_id=query,
                    timeout=self.commit_timeout, client_key=self.client_key,
                    server_key=self.server_key, event=self._event_times(messages))

    def _event_times(self, messages: list) -> EventTimes | None:
        """The whole batch's epochs and greatest event time, from its tasks' messages (``None``
        without event time)."""
        ev = self.event
        if ev is None:
            return None
        if ev.columns:  # a product order: the batch's minimal and maximal epochs
            lows = [tuple(t) for m in messages if m is not None for t in m.epoch_minima or ()]
            highs = [tuple(t) for m in messages if m is not None for t in m.epoch_maxima or ()]
            ext = _extremes(ev, frozenset(lows) | frozenset(highs))
            return EventTimes(ev.policy, None, minima=tuple(ext["epoch_minima"] or ()),
                              maxima=tuple(ext["epoch_maxima"] or ()))
        w = _Written()
        for m in messages:
            if m is not None and m.epoch_lo is not None:
                w = _Written(0, 0, *_widen(w, m.epoch_lo, m.event_max))
                w = _Written(0, 0, *_widen(w, m.epoch_hi, None))
        return EventTimes(ev.policy, None if w.lo is None else (w.lo, w.hi), w.event_max,
                          ev.length_us, ev.delay_us)

    def abort(self, messages: list, batchId: int) -> None:
        """ABORT the batch on every topic partition, best effort: failures are logged."""
        try:
            targets = ingest_targets(self.catalog, self.topic)
        except Exception as e:  # noqa: BLE001 - abort is best effort
            log.warning("abort of epoch %s: cannot look up topic %r: %s", batchId, self.topic, e)
            return
        for t in targets:
            try:
                c = client_for(t, self.topic, self.client_key, self.server_key)
                c.request(Abort(None, int(batchId)), min(10.0, self.ack_timeout))
            except Exception as e:  # noqa: BLE001
                drop_client(t.endpoint)
                log.warning("abort of epoch %s at %s failed: %s", batchId, t.endpoint, e)


def _extremes(ev: EventTime | None, epochs: frozenset) -> dict:
    """``epoch_minima``/``epoch_maxima`` of a commit message: the minimal and maximal
    ``epochs`` in the product order of ``ev.columns`` (``None`` without ``epochColumns`` or
    epochs)."""
    if ev is None or not ev.columns or not epochs:
        return {"epoch_minima": None, "epoch_maxima": None}
    from ..frontier import Antichain
    from ..order import dual, product

    order = product(len(ev.columns))
    return {"epoch_minima": sorted(Antichain(order, epochs).elements),
            "epoch_maxima": sorted(Antichain(dual(order), epochs).elements)}


def _widen(w: _Written, time_: int | None,
           event_max: int | None) -> tuple[int | None, int | None, int | None]:
    """``w``'s epoch range and greatest event time, widened by one more epoch (``None``:
    none) and event time."""
    lo, hi, top = w.lo, w.hi, w.event_max
    if time_ is not None:
        lo = time_ if lo is None else min(lo, time_)
        hi = time_ if hi is None else max(hi, time_)
    if event_max is not None:
        top = event_max if top is None else max(top, event_max)
    return lo, hi, top


class EpochstreamDataSource(DataSource):
    """Python Data Source ``epochstream``: a streaming sink (:meth:`streamWriter`) and a
    streaming source (:meth:`schema`, :meth:`streamReader`; :mod:`epochstream.spark.source`)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> Any:
        """The rows of ``spark.readStream.format("epochstream")...load()`` without a user
        schema: the topic's Arrow schema plus ``_epoch`` and ``_partition``. Raises at
        ``.load()`` what :func:`~epochstream.spark.source.source_schema` raises (unknown topic,
        no history, bad option, msgpack topic)."""
        return source_schema(self.options)

    def streamReader(self, schema: Any) -> EpochstreamStreamReader:
        """The stream reader of a query reading a topic
        (:class:`~epochstream.spark.source.EpochstreamStreamReader`)."""
        return EpochstreamStreamReader(self.options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> EpochstreamStreamWriter:
        """The writer of one micro-batch (planning) or of one commit/abort. Raises
        :class:`IngestError` without a ``topic`` option, or when no live
        :class:`~epochstream.spark.SparkPublisherHost` serves the topic (the message says to
        start one), or when the host's security and the ``clientKey`` option do not match: the
        query then fails before its first task."""
        writer = EpochstreamStreamWriter(self.options, schema)
        require_host(writer.catalog, writer.topic, check_keys=True, client_key=writer.client_key,
                     server_key=writer.server_key)
        return writer
