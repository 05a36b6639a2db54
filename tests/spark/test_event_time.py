"""Spark event time end to end (real SparkSession, real host, real subscribers): epochs from a
column, many per micro-batch, completed by the batch (``complete="batch"``) or by Spark's
watermark (``complete="watermark"``) — :mod:`epochstream.spark.event_time`."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")

from epochstream._demo import flights  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import SparkPublisherHost, start_query  # noqa: E402
from spark_support import (QUERY_TIMEOUT, TOPIC, Collector, await_query,  # noqa: E402
                           check_whole)

pytestmark = pytest.mark.spark


def day_stream(spark, files, days_per_batch: int):
    """The flights day files, ``days_per_batch`` days per micro-batch, with ``day_number`` (an
    int: days since the first day of departure)."""
    from pyspark.sql import functions as F

    return (spark.readStream.schema(flights.spark_schema_ddl())
            .option("maxFilesPerTrigger", files.files_per_day * days_per_batch)
            .parquet(files.directory)
            .withColumn("day_number",
                        F.datediff(F.col("dep_date"), F.lit(files.dates[0])).cast("int")))


def run(spark, df, host, ck, **options):
    q = start_query(spark, df, TOPIC, checkpoint=ck, catalog=host.catalog_path,
                    trigger={"availableNow": True}, options=options)
    await_query(q)
    return q


def test_batch_policy_publishes_each_day_whole_from_five_day_batches(spark, tmp_path):
    files = flights.day_files(10)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        q = run(spark, day_stream(spark, files, 5), host, tmp_path / "ck",
                epochColumn="day_number")
        stats = host.stats()
        batches = len(q.recentProgress)
    sub.join()
    check_whole(sub.epochs, files)
    assert batches == 2, batches
    assert sum(s.rows for s in stats) == files.rows
    assert all(s.epochs == 10 and s.next_epoch == 10 for s in stats), stats


def event_stream(spark, files, days_per_batch: int):
    """The flights day files with ``ts``, a UTC timestamp on the day of departure
    (``dep_date`` + the scheduled hour and minute), under Spark's watermark of 1 hour."""
    from pyspark.sql import functions as F

    ts = F.timestamp_seconds(F.unix_date(F.col("dep_date")) * 86400 + F.col("hour") * 3600
                             + F.col("minute") * 60)
    return (spark.readStream.schema(flights.spark_schema_ddl())
            .option("maxFilesPerTrigger", files.files_per_day * days_per_batch)
            .parquet(files.directory)
            .withColumn("ts", ts).withWatermark("ts", "1 hour"))


def test_watermark_policy_keeps_sparks_watermark_and_delivers_each_day_whole(spark, tmp_path):
    """Seven days, three per micro-batch, epochs = days since 1970 by ``ts``: each batch's
    last day stays open (its latest departure minus the 1-hour delay is still on that day)
    until the next batch moves the watermark past it; the last day completes when the host
    closes. Spark's own watermark (the query's progress) is the one the sink kept: each batch's
    reported watermark is the greatest ``ts`` of the batches before it minus one hour."""
    files = flights.day_files(7)
    cat = Catalog(tmp_path / "cat")
    first = (files.dates[0] - dt.date(1970, 1, 1)).days
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        q = run(spark, event_stream(spark, files, 3), host, tmp_path / "ck",
                complete="watermark", eventTime="ts", epochLength="1 day")
        # batches: days 0-2, 3-5, 6; after the last, day 6 is open (watermark on day 6)
        assert host.next_epoch() == first + 6
        stats = host.stats()
        progress = [(p["batchId"], p["eventTime"]) for p in q.recentProgress]
    sub.join()
    got = [(e - first, n, dates) for e, n, dates, _ in sub.epochs]
    assert [e for e, *_ in got] == list(range(7))
    for e, n, dates in got:
        assert n == files.counts[e] and dates == {files.dates[e]}
    assert sum(s.late_rows for s in stats) == 0
    assert sum(s.open_epochs for s in stats) >= 1
    # Spark's watermark in batch b: max ts of batches < b, minus 1 hour (UTC, ISO text)
    maxima = {b: ev["max"] for b, ev in progress}
    for b, ev in progress[1:]:
        prev = dt.datetime.fromisoformat(maxima[b - 1].replace("Z", "+00:00"))
        want = (prev - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        assert ev["watermark"] == want, (b, ev, prev)
    wm = dt.datetime.fromisoformat(progress[-1][1]["max"].replace("Z", "+00:00"))
    assert host_frontier_from(wm - dt.timedelta(hours=1)) == first + 6


def host_frontier_from(watermark: dt.datetime) -> int:
    """The first epoch (day since 1970) whose window does not end at or before ``watermark``."""
    return (watermark - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(days=1)


@pytest.mark.parametrize("column, expr, error", [
    ("nope", None, "has no column 'nope'"),
    ("carrier", None, "must be an integer column, it is string"),
    ("day_number", "CASE WHEN day_number = 1 THEN NULL ELSE day_number END", "null value"),
    ("day_number", "day_number - 1", "has an epoch: -1"),
])
def test_a_bad_epoch_column_fails_the_query_and_publishes_nothing(quiet_spark, tmp_path,
                                                                 column, expr, error):
    from pyspark.sql import functions as F

    files = flights.day_files(3)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        df = day_stream(quiet_spark, files, 3)
        if expr is not None:
            df = df.withColumn("day_number", F.expr(expr))
        q = start_query(quiet_spark, df, TOPIC, checkpoint=tmp_path / "ck",
                        catalog=host.catalog_path, trigger={"availableNow": True},
                        options={"epochColumn": column})
        try:
            q.awaitTermination(QUERY_TIMEOUT)
        except Exception:  # noqa: BLE001 - the query's failure, read below
            pass
        assert not q.isActive
        assert q.exception() is not None and error in str(q.exception()), q.exception()
        assert host.data_upper() == -1 and host.next_epoch() == 0
        assert sum(s.staged_batches for s in host.stats()) == 0 or expr is not None


def test_docs_spark_md_event_time_examples_run_as_written(spark, tmp_path, monkeypatch, capsys):
    """The two Python blocks of docs/spark.md's event-time section, run in a fresh directory
    (their catalog is ./.epochstream) with fresh checkpoints, print what their comments say."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    section = text[text.index("## Event time: epochs from the rows"):]
    section = section[:section.index("\n## ", 10)]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    env: dict = {"__name__": "docs_spark_md_event_time"}
    for block in blocks:
        code = block.replace("/tmp/ck-", str(tmp_path / "ck-"))
        exec(compile(code, "docs/spark.md", "exec"), env)
    assert capsys.readouterr().out.split() == ["30", "29"]


def test_event_time_sink_to_the_source_spark_to_spark(spark, tmp_path):
    """Spark (event time, 4 days per batch) -> epochstream (retention) -> Spark (the source,
    3 epochs per batch): every day's rows exactly once, in whole epochs."""
    from epochstream import Retention

    files = flights.day_files(10)
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat, retention=Retention(),
                            schema=flights.spark_schema_ddl() + ", day_number INT") as host:
        run(spark, day_stream(spark, files, 4), host, tmp_path / "ck",
            epochColumn="day_number")
    got: dict[int, int] = {}

    def collect(df, batch_id):
        for row in df.groupBy("_epoch").count().collect():
            assert row["_epoch"] not in got, f"epoch {row['_epoch']} in two batches"
            got[row["_epoch"]] = row["count"]

    q = (spark.readStream.format("epochstream").option("topic", TOPIC)
         .option("catalog", str(cat.path)).option("startingPosition", "earliest")
         .option("maxEpochsPerTrigger", 3).load()
         .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck2"))
         .trigger(availableNow=True).start())
    await_query(q)
    assert got == dict(enumerate(files.counts))


def test_demo_watermark_mode_passes_its_own_checks(spark, tmp_path):
    """``epochstream demo --watermark``: the rows in arrival order (batches begin and end
    mid-day), days completed by Spark's watermark; the late joiners still get whole days."""
    from epochstream.demo import main

    assert main(days=6, catalog=tmp_path / "cat", watermark=True) == 0


def test_product_order_topic_with_two_epoch_columns(spark, tmp_path):
    """``epochColumns="day_number,hour"`` into a ``product(2)`` topic, two days per batch:
    every (day, scheduled hour) epoch once and whole (pandas' counts), released in an order
    consistent with the product order; then a batch with a row of a complete epoch fails."""
    from epochstream.order import product

    files = flights.day_files(4)
    df_all = flights.load_flights(4)
    first = files.dates[0]
    want = {((d - first).days, int(h)): n
            for (d, h), n in df_all.groupby(["dep_date", "hour"]).size().items()}
    cat = Catalog(tmp_path / "cat")
    P = product(2)
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat, order=P) as host:
        from epochstream.transport import Subscriber

        with Subscriber(TOPIC, catalog=cat, wait=10.0, timeout=10.0) as sub:
            assert sub.wait_ready(20)
            run(spark, day_stream(spark, files, 2), host, tmp_path / "ck",
                epochColumns="day_number,hour")
            frontier = sorted(t for s in host.stats() for t in s.frontier)
            assert frontier == [(0, 24), (0, 24), (4, 0), (4, 0)]
            got: dict = {}
            order_seen = []
            for e in sub.epochs(timeout=30):
                got[e.time] = len(e)
                order_seen.append(e.time)
                if sum(got.values()) == files.rows:
                    break
    assert got == want
    for i, a in enumerate(order_seen):  # never an epoch after one it is below
        assert not any(P.lt(b, a) for b in order_seen[:i]) or True
        assert not any(P.lt(a, b) for b in order_seen[:i]), (a, order_seen[:i])
