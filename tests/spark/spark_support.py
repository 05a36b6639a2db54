"""Helpers of the Spark tests: a real Subscriber collecting epochs on its own thread, the
flights stream and query, and staging batches on a host's ingest endpoint directly (through the
ingest codec, as a task would)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pyarrow as pa

from epochstream._demo import flights
from epochstream.spark import EpochstreamCommitMessage, start_query
from epochstream.spark.client import client, drop_client
from epochstream.spark.ingest import Data, Flush, FlushAck
from epochstream.transport import Subscriber
from epochstream.wire import codec

TOPIC = "flights"
QUERY_TIMEOUT = 180  # seconds: generous, the CI machine may be busy


class Collector:
    """A real Subscriber on its own thread, collecting (epoch, rows, dates, arrival time) until the
    stream ends (the host closes). ``sub`` is exposed for its frontier and message counters."""

    def __init__(self, catalog, *, timeout: float = 10.0):
        self.epochs: list[tuple[int, int, set, float]] = []
        self.error: BaseException | None = None
        self.sub: Subscriber | None = None
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, args=(catalog, timeout), daemon=True)
        self.thread.start()
        assert self.ready.wait(30), "subscriber not ready"
        if self.error is not None:
            raise self.error

    def _run(self, catalog, timeout):
        try:
            with Subscriber(TOPIC, catalog=catalog, wait=10.0, timeout=timeout) as sub:
                self.sub = sub
                assert sub.wait_ready(20)
                self.ready.set()
                for e in sub.epochs(timeout=QUERY_TIMEOUT):
                    t = e.records
                    dates = set(t.column("dep_date").to_pylist()) if len(e) else set()
                    with self.changed:
                        self.epochs.append((e.time, len(e), dates, time.time()))
                        self.changed.notify_all()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.ready.set()
            with self.changed:
                self.changed.notify_all()

    def wait_for(self, epoch: int, timeout: float = 60.0) -> bool:
        """Wait until ``epoch`` was delivered (or the subscriber failed)."""
        with self.changed:
            return self.changed.wait_for(
                lambda: self.error is not None or any(e == epoch for e, *_ in self.epochs), timeout)

    def delivered(self) -> list[int]:
        with self.changed:
            return [e for e, *_ in self.epochs]

    def join(self):
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def check_whole(collected, files):
    """Every epoch exactly once, in order, with exactly pandas' rows of exactly its day."""
    assert [e for e, *_ in collected] == list(range(files.days))
    for e, n, dates, _ in collected:
        assert n == files.counts[e], f"epoch {e}: {n} rows, pandas says {files.counts[e]}"
        assert dates == {files.dates[e]}


def stream(spark, files):
    """The flights day files as a stream, one day per micro-batch."""
    return (spark.readStream.schema(flights.spark_schema_ddl())
            .option("maxFilesPerTrigger", files.files_per_day).parquet(files.directory))


def start(spark, df, host, ck):
    return start_query(spark, df, TOPIC, checkpoint=ck, catalog=host.catalog_path,
                       trigger={"availableNow": True})


def await_query(q):
    assert q.awaitTermination(QUERY_TIMEOUT), "query did not finish"
    assert q.exception() is None, q.exception()


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ---- driving a host's ingest endpoint directly (no Spark)


def table(n: int, date=dt.date(2013, 1, 1)) -> pa.RecordBatch:
    return pa.record_batch({"dep_date": pa.array([date] * n, pa.date32()),
                            "x": pa.array(range(n), pa.int64())})


def stage(endpoint: str, run: str, epoch: int, attempt: int, batches) -> FlushAck:
    """Stage ``batches`` as attempt ``(run, attempt)`` of ``epoch`` (DATA ..., FLUSH), as a task
    of Spark partition 0 does; returns the FLUSH acknowledgement, raises IngestError."""
    c = client(endpoint)
    arrow = codec("arrow")
    try:
        for b in batches:
            c.send(Data(run, epoch, 0, attempt, b.num_rows, arrow.encode(b)), 5)
        reply = c.request(Flush(None, run, epoch, attempt, len(batches),
                                sum(b.num_rows for b in batches)), 5)
    except BaseException:
        drop_client(endpoint)  # as a task does: refusals of our DATA may still be queued
        raise
    assert isinstance(reply, FlushAck)
    return reply


def commit_message(run: str, epoch: int, attempt: int, rows: int, batches: int = 0):
    """What task attempt ``(run, attempt)`` of Spark partition 0 would report to ``commit``."""
    return EpochstreamCommitMessage(query_id="q", run_id=run, epoch=epoch, partition=0,
                                    topic_partition=0, task_attempt_id=attempt, attempt_number=0,
                                    rows=rows, batches=batches)
