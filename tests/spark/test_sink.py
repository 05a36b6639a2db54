"""The Spark sink end to end: real SparkSession (one per test session), real host, real
Publisher/Subscriber over ZeroMQ. Tests that need the JVM are marked ``spark``."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from epochstream._demo import flights  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import EpochstreamStreamWriter, IngestError, SparkPublisherHost  # noqa: E402
from spark_support import (TOPIC, Collector, await_query, check_whole, start,  # noqa: E402
                           stream)


def _run(spark, df, host, tmp_path):
    q = start(spark, df, host, tmp_path / "ck")
    await_query(q)
    return q


@pytest.mark.spark
def test_five_days_through_the_sink(spark, tmp_path):
    files = flights.day_files(5)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        _run(spark, stream(spark, files), host, tmp_path)
        stats = host.stats()
    sub.join()
    check_whole(sub.epochs, files)
    assert all(s.rows > 0 for s in stats), "both topic partitions carry data"
    assert sum(s.rows for s in stats) == files.rows
    assert all(s.duplicates == 0 and s.discarded_batches == 0 for s in stats)


@pytest.mark.spark
def test_failed_attempt_is_never_published(quiet_spark, tmp_path, catalog_location):
    spark = quiet_spark

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
    cat = Catalog(catalog_location)  # SQLite, then PostgreSQL
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        df = stream(spark, files)
        df = df.mapInArrow(_fail_once, df.schema)
        _run(spark, df, host, tmp_path)
        stats = host.stats()
    sub.join()
    check_whole(sub.epochs, files)
    assert sum(s.rows for s in stats) == files.rows
    # the failed attempt staged at least its first batch, which was discarded, never published
    assert stats[0].discarded_batches >= 1, stats
    assert stats[0].staged_batches == stats[0].batches + stats[0].discarded_batches


def test_missing_topic_option_is_a_clear_error():
    with pytest.raises(IngestError, match="topic"):
        EpochstreamStreamWriter({})


@pytest.mark.spark
def test_demo_three_days(spark, tmp_path):
    """The demo on three days passes its own checks, publishing into a temporary catalog (not
    ./.epochstream of the working directory)."""
    from epochstream.demo import main

    assert main(days=3, catalog=tmp_path / "cat") == 0
    assert (tmp_path / "cat" / "catalog.sqlite").is_file()
