"""What a user sees when a query into an epochstream topic cannot work: no SparkPublisherHost
serving the topic, or Spark workers whose Python cannot import epochstream. Real SparkSession
(the shared one); no query here reaches a task."""

from __future__ import annotations

import os
import stat
import sys

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import StreamingQueryException  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import (EpochstreamDataSource, IngestError,  # noqa: E402
                               SparkPublisherHost, register, start_query)

TOPIC = "nohost"


def _stream(spark):
    return spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()


@pytest.mark.spark
def test_start_query_without_a_host_fails_at_start(spark, tmp_path):
    before = len(spark.streams.active)
    with pytest.raises(IngestError) as info:
        start_query(spark, _stream(spark), TOPIC, checkpoint=tmp_path / "ck",
                    catalog=tmp_path / "cat")
    msg = str(info.value)
    assert "no running SparkPublisherHost serves topic 'nohost'" in msg
    assert "Start one in the driver program" in msg
    assert str(tmp_path / "cat") in msg              # names the catalog searched
    assert len(spark.streams.active) == before       # nothing was started


@pytest.mark.spark
def test_start_query_after_the_host_closed_fails_at_start(spark, tmp_path):
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat):
        pass  # registered, then closed
    with pytest.raises(IngestError, match="no running SparkPublisherHost serves topic 'nohost'"):
        start_query(spark, _stream(spark), TOPIC, checkpoint=tmp_path / "ck", catalog=cat)


@pytest.mark.spark
def test_plain_writestream_without_a_host_fails_before_its_first_task(spark, tmp_path):
    """``df.writeStream.format("epochstream").start()``: PySpark gives a Python data source no
    hook inside ``start()``; the query fails when it plans its first batch (in
    ``streamWriter``), before any task, with the one message that says what to do."""
    register(spark)
    q = (_stream(spark).writeStream.format("epochstream").option("topic", TOPIC)
         .option("catalog", str(tmp_path / "cat"))
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        with pytest.raises(StreamingQueryException) as info:
            q.awaitTermination(120)  # returns False (no exception) if it is still running
    finally:
        q.stop()
    err = str(info.value)
    assert "Failed to initialize Python data source writer" in err  # planning, not a task
    assert "no running SparkPublisherHost serves topic 'nohost'" in err
    assert "Start one in the driver program" in err
    assert q.lastProgress is None                                   # no batch ran


def _python_without_epochstream(tmp_path) -> str:
    """An interpreter that cannot import epochstream: this one, isolated and without
    site-packages (as a system ``python3`` next to a virtual environment)."""
    exe = tmp_path / "python-without-epochstream"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["lacks epochstream", "missing"])
def test_worker_python_without_epochstream_is_named_at_start(spark, tmp_path, monkeypatch, kind):
    """Spark starts its workers with ``sparkContext.pythonExec`` (PYSPARK_PYTHON): when that
    Python cannot import epochstream, ``start_query`` (via ``register``) says so and names
    PYSPARK_PYTHON, instead of a ModuleNotFoundError deep in PySpark at the first batch."""
    bad = (_python_without_epochstream(tmp_path) if kind == "lacks epochstream"
           else os.path.join(tmp_path, "no-such-python"))
    cat = Catalog(tmp_path / "cat")
    try:
        with SparkPublisherHost(TOPIC, partitions=1, catalog=cat):
            monkeypatch.setattr(spark.sparkContext, "pythonExec", bad)
            with pytest.raises(IngestError) as info:
                q = start_query(spark, _stream(spark), TOPIC, checkpoint=tmp_path / "ck",
                                catalog=cat)
                q.stop()
    finally:
        monkeypatch.undo()
        spark.dataSource.register(EpochstreamDataSource)  # never leave a bad registration behind
    msg = str(info.value)
    assert "PYSPARK_PYTHON" in msg and bad in msg
    if kind == "lacks epochstream":
        assert "cannot import epochstream" in msg
        assert "No module named 'epochstream'" in msg
    else:
        assert "cannot run the Spark workers' Python" in msg
