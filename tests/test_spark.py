"""The Spark sink end to end: real SparkSession (one per test session), real host, real
Publisher/Subscriber over ZeroMQ. Tests that need the JVM are marked ``spark``."""

from __future__ import annotations

import threading

import msgpack
import pyarrow as pa
import pytest
import zmq

pytest.importorskip("pyspark")

from epochstream import flights  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import (EpochstreamCommitMessage, EpochstreamStreamWriter,  # noqa: E402
                               IngestError, SparkPublisherHost, _client, _ipc_bytes, start_query)
from epochstream.transport import Subscriber  # noqa: E402

TOPIC = "flights"


class Collector:
    """A real Subscriber on its own thread, collecting (epoch, rows, dates) until the stream ends."""

    def __init__(self, catalog):
        self.epochs: list[tuple[int, int, set]] = []
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(catalog,), daemon=True)
        self.thread.start()
        assert self.ready.wait(30), "subscriber not ready"

    def _run(self, catalog):
        try:
            with Subscriber(TOPIC, catalog=catalog, wait=10.0) as sub:
                assert sub.wait_ready(20)
                self.ready.set()
                for e in sub.epochs(timeout=120):
                    t = e.records
                    dates = set(t.column("dep_date").to_pylist()) if len(e) else set()
                    self.epochs.append((e.time, len(e), dates))
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.ready.set()

    def join(self):
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def _stream(spark, files):
    return (spark.readStream.schema(flights.spark_schema_ddl())
            .option("maxFilesPerTrigger", files.files_per_day).parquet(files.directory))


def _run(spark, df, host, tmp_path, timeout=120):
    q = start_query(spark, df, TOPIC, checkpoint=tmp_path / "ck", catalog=host.catalog_path,
                    trigger={"availableNow": True})
    assert q.awaitTermination(timeout), "query did not finish"
    assert q.exception() is None, q.exception()
    return q


def _check_whole(collected, files):
    assert [e for e, _, _ in collected] == list(range(files.days))  # each epoch once, in order
    for e, n, dates in collected:
        assert n == files.counts[e], f"epoch {e}: {n} rows, pandas says {files.counts[e]}"
        assert dates == {files.dates[e]}


@pytest.mark.spark
def test_five_days_through_the_sink(spark, tmp_path):
    files = flights.day_files(5)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        _run(spark, _stream(spark, files), host, tmp_path)
        stats = host.stats()
    sub.join()
    _check_whole(sub.epochs, files)
    assert all(s.rows > 0 for s in stats), "both topic partitions carry data"
    assert sum(s.rows for s in stats) == files.rows
    assert all(s.duplicates == 0 and s.discarded_batches == 0 for s in stats)


@pytest.mark.spark
def test_failed_attempt_is_never_published(spark, tmp_path):
    # nested: cloudpickle ships a local function by value (workers cannot import test modules)
    def _fail_once(batches):
        """mapInArrow body: for batch 2, Spark partition 0, first attempt: yield eight batches of
        100 rows (more than the JVM's 64 KiB buffer towards the writer's Python worker, so the
        sink really receives and stages some), give the sink time to stage them, then fail
        (Spark retries the task: local[2,2] allows one retry)."""
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        fail = (ctx.getLocalProperty("streaming.sql.batchId") == "2" and ctx.partitionId() == 0
                and ctx.attemptNumber() == 0)
        for i, b in enumerate(batches):
            yield b
            if fail and i == 7:
                time.sleep(1.0)
                raise RuntimeError("injected failure after sending rows")

    # one file (one Spark partition, ~900 rows) per day: enough rows to pass the JVM's buffer
    files = flights.day_files(4, files_per_day=1)
    cat = Catalog(tmp_path / "cat")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    spark.sparkContext.setLogLevel("OFF")  # the injected failure logs long stack traces
    try:
        with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
            sub = Collector(cat)
            df = _stream(spark, files)
            df = df.mapInArrow(_fail_once, df.schema)
            _run(spark, df, host, tmp_path)
            stats = host.stats()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.sparkContext.setLogLevel("ERROR")
    sub.join()
    _check_whole(sub.epochs, files)
    assert sum(s.rows for s in stats) == files.rows
    # the failed attempt staged at least its first batch, which was discarded, never published
    assert stats[0].discarded_batches >= 1, stats
    assert stats[0].staged_batches == stats[0].batches + stats[0].discarded_batches


def _table(n, date):
    return pa.record_batch({"dep_date": pa.array([date] * n, pa.date32()),
                            "x": pa.array(range(n), pa.int64())})


def _stage(endpoint, run, epoch, attempt, batches):
    c = _client(endpoint)
    rows = 0
    for b in batches:
        c.send_data([b"DATA", msgpack.packb([run, epoch, 0, attempt, b.num_rows]), _ipc_bytes(b)], 5)
        rows += b.num_rows
    return c.request(b"FLUSH", {"run": run, "epoch": epoch, "attempt": attempt,
                                "batches": len(batches), "rows": rows}, 5)


def test_commit_is_idempotent(tmp_path):
    import datetime as dt

    d0, d1 = dt.date(2013, 1, 1), dt.date(2013, 1, 2)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
        sub = Collector(cat)
        ep = host.ingest_endpoints[0]
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        assert _stage(ep, "run-a", 0, 11, [_table(3, d0), _table(4, d0)])["batches"] == 2
        assert _stage(ep, "run-a", 0, 12, [_table(50, d0)])["batches"] == 1  # a losing attempt

        def msg(epoch, attempt, rows):
            return EpochstreamCommitMessage(query_id="q", run_id="run-a", epoch=epoch, partition=0,
                                            topic_partition=0, task_attempt_id=attempt,
                                            attempt_number=0, rows=rows, batches=0)

        writer.commit([msg(0, 11, 7)], 0)
        writer.commit([msg(0, 11, 7)], 0)                     # a repeated commit
        _stage(ep, "run-b", 0, 21, [_table(9, d0)])            # a rerun of epoch 0 after restart
        writer.commit([msg(0, 21, 9)], 0)                     # ... committed again
        assert _stage(ep, "run-a", 1, 13, [_table(5, d1)])["batches"] == 1
        writer.commit([msg(1, 13, 5)], 1)
        writer.abort([None], 2)                               # harmless
        stats = host.stats(0)
    sub.join()
    assert [(e, n) for e, n, _ in sub.epochs] == [(0, 7), (1, 5)]
    assert stats.duplicates == 2 and stats.rows == 12 and stats.epochs == 2
    assert stats.discarded_batches >= 1  # the losing attempt's batch


def test_malformed_ingest_messages_get_errors(tmp_path):
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(host.ingest_endpoints[0])
        for frames in ([b"DATA"], [b"NOPE", msgpack.packb({"req": "r1"})],
                       [b"COMMIT", b"\xc1not msgpack"], [b"COMMIT", msgpack.packb({"req": "r2"})],
                       [b"DATA", msgpack.packb(["r", "x", 0, 1, 2]), b"payload"]):
            s.send_multipart(frames)
            assert s.poll(5000), frames
            status, body = s.recv_multipart()
            assert status == b"ERR" and msgpack.unpackb(body)["error"]
        s.close()
        # still serving: a proper COMMIT of an empty epoch works
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        writer.commit([None], 0)
        assert host.next_epoch() == 1 and host.stats(0).errors == 5
        assert not host.errors()


def test_missing_topic_option_is_a_clear_error():
    with pytest.raises(IngestError, match="topic"):
        EpochstreamStreamWriter({})


@pytest.mark.spark
def test_demo_three_days(spark):
    from epochstream.demo import main

    assert main(days=3) == 0


def test_exception_inside_the_host_aborts_its_publishers(tmp_path):
    """An exception leaving ``with SparkPublisherHost`` must not complete the open epoch: the
    subscriber gets PublisherAborted after the committed epoch 0, the catalog says aborted."""
    import datetime as dt

    from epochstream.errors import PublisherAborted

    cat = Catalog(tmp_path / "cat")
    got = []
    with pytest.raises(RuntimeError, match="driver failed"):
        with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
            sub = Subscriber(TOPIC, catalog=cat, timeout=10)
            assert sub.wait_ready(10)
            ep = host.ingest_endpoints[0]
            writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
            _stage(ep, "run-a", 0, 1, [_table(3, dt.date(2013, 1, 1))])
            writer.commit([EpochstreamCommitMessage(
                query_id="q", run_id="run-a", epoch=0, partition=0, topic_partition=0,
                task_attempt_id=1, attempt_number=0, rows=3, batches=1)], 0)
            assert host.wait_epoch(0, 10)
            raise RuntimeError("driver failed")
    with pytest.raises(PublisherAborted):
        for epoch in sub.epochs(timeout=10):
            got.append(epoch.time)
    sub.close()
    assert got == [0]
    assert [p.state for p in cat.lookup(TOPIC).partition_info] == ["aborted"]
