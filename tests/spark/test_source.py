"""The Spark source (epochstream/spark/source.py): ``spark.readStream.format("epochstream")``
reads a topic's durable history in micro-batches of whole epochs, offsets being frontiers.

Real components only: topics are published by real ``Publisher``\\ s with ``retention=``, read
by the shared local SparkSession (tests marked ``spark``) or, for the call sequences Spark does
not drive here (PySpark 4.0's ``latestOffset()``, retention racing a batch), by the reader's own
methods. Exactly once across a killed reader: tests/spark/test_pipeline.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa  # noqa: E402

from epochstream import Catalog, Publisher, Retention  # noqa: E402
from epochstream.errors import HistoryUnavailable, SubscriptionExpired  # noqa: E402
from epochstream.frontier import Antichain  # noqa: E402
from epochstream.order import TOTAL, linear_extension, product  # noqa: E402
from epochstream.spark import register  # noqa: E402
from epochstream.spark.source import (EpochstreamStreamReader, SourceError,  # noqa: E402
                                      batch_end, source_schema)

QUERY_TIMEOUT = 180


# ---- publishing (real Publishers, Arrow codec, with an epoch log)


def rows_of(t, partition: int) -> int:
    """Rows of epoch ``t`` in ``partition``: 0 to 3, so that some epochs have no rows in one
    partition."""
    key = t if isinstance(t, int) else sum(t)
    return (key * 7 + partition * 3) % 4


def batch_for(t, partition: int, next_id: list) -> pa.Table:
    n = rows_of(t, partition)
    ids = list(range(next_id[0], next_id[0] + n))
    next_id[0] += n
    return pa.table({"row": pa.array(ids, pa.int64()), "name": [f"r{i}" for i in ids]})


class Topic:
    """``partitions`` live Publishers of an Arrow topic with retention; ``published`` maps each
    row id to ``(epoch, partition)``."""

    def __init__(self, cat, name, *, partitions=1, order=TOTAL, retention=None):
        self.name, self.order = name, order
        self.pubs = [Publisher(name, catalog=cat, codec="arrow", partition=i,
                               partitions=partitions, order=order,
                               retention=retention or Retention())
                     for i in range(partitions)]
        self.published: dict[int, tuple] = {}
        self._next = [0]

    def send(self, t) -> None:
        for i, pub in enumerate(self.pubs):
            table = batch_for(t, i, self._next)
            if table.num_rows:
                pub.send(t, table)
                for r in table.column("row").to_pylist():
                    self.published[r] = (t, i)

    def advance_to(self, t) -> None:
        for pub in self.pubs:
            pub.advance_to(t)
        for pub in self.pubs:
            pub.flush()  # logged and indexed: the source sees it

    def close(self) -> None:
        for pub in self.pubs:
            pub.close()


def epochs_published(topic: Topic) -> dict:
    out: dict = {}
    for r, (t, _) in topic.published.items():
        out.setdefault(t, set()).add(r)
    return out


# ---- running a query on the shared session


def run_query(spark, options: dict, checkpoint, *, schema=None):
    """``readStream.format("epochstream")`` with ``options`` into ``foreachBatch`` (in this
    process), ``Trigger.AvailableNow``; returns ``[(batch id, [(row, epoch, partition), ...])]``
    (Spark runs a first batch even when the source's initial and latest offsets are equal)."""
    register(spark)
    batches: list = []

    def collect(df, batch_id):
        pdf = df.toPandas()
        epochs = [tuple(int(x) for x in e) if not isinstance(e, int) and hasattr(e, "__len__")
                  else int(e) for e in pdf["_epoch"]]
        batches.append((batch_id, list(zip(pdf["row"].astype(int), epochs,
                                           pdf["_partition"].astype(int)))))

    reader = spark.readStream.format("epochstream")
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    q = (reader.load().writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT), "query did not finish"
    assert q.exception() is None, q.exception()
    return batches


def check_batches(batches, topic: Topic, wanted_epochs, *, max_epochs=None):
    """Every wanted epoch in exactly one batch, with exactly the rows published for it (all
    partitions), nothing else; at most ``max_epochs`` epochs per batch; batches in an order
    consistent with the topic's order."""
    published = epochs_published(topic)
    seen: dict = {}
    order_of_batches = []
    for bid, rows in batches:
        epochs = {t for _, t, _ in rows}
        assert rows, f"batch {bid} is empty"
        if max_epochs is not None:
            assert len(epochs) <= max_epochs, (bid, epochs)
        for t in epochs:
            assert t not in seen, f"epoch {t} in batches {seen[t]} and {bid}: split or repeated"
            seen[t] = bid
            got = [r for r, e, _ in rows if e == t]
            assert sorted(got) == sorted(published[t]), f"epoch {t} of batch {bid} not whole"
        for r, t, p in rows:
            assert topic.published[r] == (t, p)
        order_of_batches.append(epochs)
    assert set(seen) == set(wanted_epochs)
    le = topic.order.le
    for i, earlier in enumerate(order_of_batches):
        for later in order_of_batches[i + 1:]:
            assert not any(le(b, a) and a != b for a in earlier for b in later), \
                "a batch holds an epoch below one of an earlier batch"


# ============================================================================================
# the planning rule, against a brute-force oracle


@pytest.mark.parametrize("order", [TOTAL, product(2)], ids=["total", "product2"])
def test_batch_end_cuts_exactly_a_prefix_of_whole_complete_epochs(order):
    """For random starts, merged lower frontiers and epochs with data (product(2): a 6x6 grid),
    the batch ``{t : start <= t, not E <= t}`` holds exactly the first n epochs with data of a
    linear extension, every time in it is complete (not at or beyond ``latest``), and ``E`` is
    at or beyond ``start``: checked time by time over the grid."""
    rng = random.Random(7)
    grid = list(range(8)) if order is TOTAL else [(a, b) for a in range(6) for b in range(6)]
    for _ in range(300):
        start = Antichain(order, rng.sample(grid, rng.randint(1, 2))).elements
        latest = Antichain(order, rng.sample(grid, rng.randint(0, 2))).elements
        s, low = Antichain(order, start), Antichain(order, latest)
        data = [t for t in grid if s.less_equal(t) and not low.less_equal(t) and rng.random() < .5]
        data = linear_extension(order, data)
        n = rng.choice([None, 1, 2, 3])
        end = batch_end(order, start, latest, [(t, 1) for t in data], max_epochs=n)
        e = Antichain(order, end)
        batch = [t for t in grid if s.less_equal(t) and not e.less_equal(t)]
        if not data:
            assert tuple(end) == tuple(start)
            continue
        take = data[:len(data) if n is None else n]
        assert {t for t in batch if t in data} == set(take), (start, latest, data, n, end)
        assert not any(low.less_equal(t) for t in batch), "an incomplete time in the batch"
        assert all(s.less_equal(x) for x in end), "end not at or beyond start"


# ============================================================================================
# Spark queries on the shared session


@pytest.mark.spark
def test_two_partitions_in_batches_of_whole_epochs(spark, tmp_path):
    """A topic with two partitions (some epochs have rows in one partition only, epoch 5 in
    none), read from ``earliest`` with ``maxEpochsPerTrigger=2``: every epoch with rows in
    exactly one batch, with both partitions' rows, at most two epochs per batch, in order; the
    durable subscription named by ``durableName`` ends at a batch boundary."""
    cat = Catalog(tmp_path / "cat")
    topic = Topic(cat, "two", partitions=2)
    for t in range(9):
        if t != 5:
            topic.send(t)
    topic.advance_to(9)
    batches = run_query(spark, {"topic": "two", "catalog": cat.path, "maxEpochsPerTrigger": 2,
                                "startingPosition": "earliest", "durableName": "q-two"},
                        tmp_path / "ck")
    topic.close()
    wanted = set(epochs_published(topic))
    check_batches(batches, topic, wanted, max_epochs=2)
    assert len(batches) == 4 and {p for b in batches for _, _, p in b[1]} == {0, 1}
    # Spark commits a batch to its source when it plans the next one: the position is the
    # start of the last batch (or its end), never inside a batch
    firsts = [min(t for _, t, _ in rows) for _, rows in batches]
    assert cat.durable("two", "q-two").position in {(firsts[-1],), (9,)}


@pytest.mark.spark
def test_product_order_topic_from_a_frontier_one_epoch_per_batch(spark, tmp_path):
    """``product(2)`` times ``(day, iteration)``, startingPosition ``[[1,1],[2,0]]`` (JSON),
    one epoch per batch: exactly the epochs at or beyond (1, 1) or (2, 0) — not (1, 0), not
    (0, x) — each alone in its batch, as an ``array<long>`` ``_epoch``, in an order consistent
    with the partial order."""
    cat = Catalog(tmp_path / "cat")
    topic = Topic(cat, "grid", partitions=2, order=product(2))
    for day in range(4):
        for it in range(2):
            topic.send((day, it))
        topic.advance_to((day + 1, 0))
    topic.close()
    start = Antichain(topic.order, [(1, 1), (2, 0)])
    wanted = {t for t in epochs_published(topic) if start.less_equal(t)}
    assert (1, 0) in epochs_published(topic) and (1, 0) not in wanted
    batches = run_query(spark, {"topic": "grid", "catalog": cat.path,
                                "startingPosition": "[[1,1],[2,0]]", "maxEpochsPerTrigger": 1},
                        tmp_path / "ck")
    check_batches(batches, topic, wanted, max_epochs=1)
    assert len(batches) == len(wanted)


@pytest.mark.spark
def test_latest_then_resume_reads_what_was_published_while_down(spark, tmp_path,
                                                                catalog_location):
    """``startingPosition=latest`` on a live topic with epochs 0-3 complete: the first run reads
    nothing (Spark runs its first batch anyway: an empty one, from [4] to [4]); epochs 4-6 are
    published while no query runs; the same query restarted from its checkpoint reads exactly
    4-6. On SQLite, then on PostgreSQL (the query's durable subscription lives there)."""
    cat = Catalog(catalog_location)
    topic = Topic(cat, "live", partitions=1)
    for t in range(4):
        topic.send(t)
    topic.advance_to(4)
    options = {"topic": "live", "catalog": cat.path}          # startingPosition: latest
    assert [rows for _, rows in run_query(spark, options, tmp_path / "ck")] in ([], [[]])
    for t in range(4, 7):
        topic.send(t)
    topic.advance_to(7)
    try:
        batches = run_query(spark, options, tmp_path / "ck")
    finally:
        topic.close()
    check_batches(batches, topic, {t for t in epochs_published(topic) if t >= 4})


def _topic_without_history(cat):
    with Publisher("nolog", catalog=cat, codec="arrow") as pub:
        pub.send(0, pa.table({"x": [1]}))
        pub.advance_to(1)


def _msgpack_topic(cat):
    with Publisher("packed", catalog=cat, retention=Retention()) as pub:
        pub.send(0, [{"row": 1, "s": "a"}, {"row": 2, "s": "b"}])
        pub.advance_to(1)


def _trimmed_topic(cat):
    with Publisher("trimmed", catalog=cat, codec="arrow",
                   retention=Retention(max_epochs=2, segment_bytes=4096)) as pub:
        for t in range(6):
            pub.send(t, pa.table({"row": [t], "pad": ["x" * 5000]}))  # a segment per epoch
            pub.advance_to(t + 1)


LOAD_ERRORS = {
    "unknown topic": ("nosuch", None, {}, "TopicNotFound"),
    "no history kept": ("nolog", _topic_without_history, {}, "keep(s) an epoch log"),
    "bad startingPosition": ("packed", _msgpack_topic, {"startingPosition": "[oops"},
                             "startingPosition '[oops'"),
    "wrong time shape": ("trimmed", _trimmed_topic, {"startingPosition": "[[1,2]]"},
                         "startingPosition"),
    "msgpack without schema": ("packed", _msgpack_topic, {}, "uses codec 'msgpack'"),
    "not retained": ("trimmed", _trimmed_topic, {"startingPosition": "0"},
                     "older than what is retained"),
    "bad maxEpochsPerTrigger": ("trimmed", _trimmed_topic, {"maxEpochsPerTrigger": "0"},
                                "maxEpochsPerTrigger must be an int >= 1"),
}


@pytest.mark.spark
@pytest.mark.parametrize("case", list(LOAD_ERRORS))
def test_errors_at_load(spark, tmp_path, case):
    """Each mistake fails ``.load()`` itself (PySpark calls the source's ``schema()`` there),
    with a message that names it; no query is started."""
    from pyspark.errors import AnalysisException

    name, make, extra, message = LOAD_ERRORS[case]
    cat = Catalog(tmp_path / "cat")
    if make is not None:
        make(cat)
    register(spark)
    reader = (spark.readStream.format("epochstream").option("topic", name)
              .option("catalog", str(cat.path)))
    for k, v in extra.items():
        reader = reader.option(k, v)
    with pytest.raises(AnalysisException) as info:
        reader.load()
    assert message in str(info.value)


@pytest.mark.spark
def test_with_a_user_schema_errors_fail_the_query_before_its_first_batch(quiet_spark, tmp_path):
    """With ``.schema(...)`` PySpark runs no source code at ``.load()``: an unknown topic then
    fails the query as it starts (``exception()``), before any batch ran."""
    spark = quiet_spark  # the query's failure is expected: no stack trace in the log
    register(spark)
    df = (spark.readStream.format("epochstream").schema("x long, _epoch long, _partition int")
          .option("topic", "nosuch").option("catalog", str(tmp_path / "cat")).load())
    q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(QUERY_TIMEOUT)
    except Exception:  # noqa: BLE001 - the exception is checked below
        pass
    finally:
        q.stop()
    assert q.exception() is not None and "TopicNotFound" in str(q.exception())
    assert q.lastProgress is None


@pytest.mark.spark
def test_msgpack_topic_with_a_user_schema(spark, tmp_path):
    """A msgpack topic's dict records, read by column name into the user's schema (a column the
    records lack is null)."""
    cat = Catalog(tmp_path / "cat")
    _msgpack_topic(cat)
    batches = run_query(spark, {"topic": "packed", "catalog": cat.path,
                                "startingPosition": "earliest"}, tmp_path / "ck",
                        schema="row long, s string, _epoch long, _partition int")
    assert [(b, sorted(rows)) for b, rows in batches] == [(0, [(1, 0, 0), (2, 0, 0)])]


@pytest.mark.spark
def test_docs_spark_md_example_runs_as_written(spark, capsys):
    """The Python block of docs/spark.md's source section prints the text block after it (the
    durable name's hash depends on the temporary catalog's path)."""
    text = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    section = text[text.index("## Spark as a consumer (source)"):]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    expected = section.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    exec(compile(code, "docs/spark.md", "exec"), {"__name__": "docs_spark_md"})
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == expected[:-1]
    assert out[-1].startswith("[('spark-trades-") and out[-1].endswith("', (3,))]")


# ============================================================================================
# the reader's methods directly (call sequences Spark 4.3 does not make here)


def _reader(cat, topic, **options):
    opts = {"topic": topic, "catalog": str(cat.path), **{k: str(v) for k, v in options.items()}}
    return EpochstreamStreamReader(opts, source_schema(opts))


def _rows(reader, start, end):
    return sorted((r, e) for p in reader.partitions(start, end) for b in reader.read(p)
                  for r, e in zip(b.column("row").to_pylist(), b.column("_epoch").to_pylist()))


def test_pyspark_4_0_latest_offset_without_arguments(tmp_path):
    """PySpark 4.0/4.1 call ``latestOffset()`` with no start: the reader plans from what it
    returned before (``maxEpochsPerTrigger`` applies), and after a restart from its durable
    subscription's position, never before the true start: no epoch twice, none lost."""
    cat = Catalog(tmp_path / "cat")
    topic = Topic(cat, "old", partitions=2)
    for t in range(6):
        topic.send(t)
    topic.advance_to(6)
    r = _reader(cat, "old", startingPosition="[1]", maxEpochsPerTrigger=2, durableName="old")
    start = r.initialOffset()
    end = r.latestOffset()                                 # the 4.0 call
    assert end["frontier"] == [3]
    first = _rows(r, start, end)
    r.commit(end)
    end2 = r.latestOffset()                                # planned from [3], not from [1]
    assert end2["frontier"] == [5]
    second = _rows(r, end, end2)
    r.stop()                                               # "killed" before commit(end2)
    for t in range(6, 8):
        topic.send(t)
    topic.advance_to(8)
    again = _reader(cat, "old", startingPosition="[1]", maxEpochsPerTrigger=2, durableName="old")
    end3 = again.latestOffset()                            # restarted: true start [5] unknown
    assert end3["frontier"] == [8]                         # join(position [3], latest [8])
    third = _rows(again, end2, end3)                       # Spark's next batch: (end2, end3]
    again.stop()
    topic.close()
    got = first + second + third
    assert sorted(r for r, _ in got) == sorted(r for r, (t, _) in topic.published.items()
                                               if t >= 1)


def test_initial_offset_is_kept_in_the_durable_subscription(tmp_path):
    """A new query's start is resolved once and kept in its durable subscription: a reader
    started again (Spark asks ``initialOffset`` again when it re-runs batch 0 after a restart)
    gets the same frontier although 'latest' moved on meanwhile; another durable name resolves
    'latest' anew."""
    cat = Catalog(tmp_path / "cat")
    topic = Topic(cat, "moving")
    topic.send(1)
    topic.advance_to(2)
    first = _reader(cat, "moving")                         # startingPosition: latest
    assert first.initialOffset()["frontier"] == [2]
    first.stop()
    topic.send(2)
    topic.advance_to(3)
    again = _reader(cat, "moving")
    assert again.initialOffset()["frontier"] == [2]
    again.stop()
    other = _reader(cat, "moving", durableName="other")
    assert other.initialOffset()["frontier"] == [3]
    other.stop()
    topic.close()


def test_latest_offset_waits_for_every_partition(tmp_path):
    """An epoch is read only once it is complete in every partition: nothing while partition 1
    has not started (its publisher could still send epoch 0), then only the epochs below the
    slower partition's frontier."""
    cat = Catalog(tmp_path / "cat")
    p0 = Publisher("slow", catalog=cat, codec="arrow", partition=0, partitions=2,
                   retention=Retention())
    for t in range(6):
        p0.send(t, pa.table({"row": [t]}))
    p0.advance_to(6)
    p0.flush()
    r = _reader(cat, "slow", startingPosition="earliest")
    start = r.initialOffset()
    assert r.latestOffset(start, None) == start            # partition 1 not started yet
    p1 = Publisher("slow", catalog=cat, codec="arrow", partition=1, partitions=2,
                   retention=Retention())
    for t in range(6):
        p1.send(t, pa.table({"row": [100 + t]}))
    p1.advance_to(3)
    p1.flush()
    end = r.latestOffset(start, None)
    assert end["frontier"] == [3]
    assert _rows(r, start, end) == [(0, 0), (1, 1), (2, 2), (100, 0), (101, 1), (102, 2)]
    p1.advance_to(6)
    p1.flush()
    assert r.latestOffset(end, None)["frontier"] == [6]
    r.stop()
    p0.close()
    p1.close()


def test_latest_offset_never_reaches_the_empty_frontier_of_a_closed_topic(tmp_path):
    """A closed topic's logs have an empty lower frontier; a later run continues them with
    later epochs. The source's offsets stop just after the last epoch ([3]), so a query reads
    the continuation's epochs (with [] it could never read anything again)."""
    cat = Catalog(tmp_path / "cat")
    with Publisher("again", catalog=cat, codec="arrow", retention=Retention()) as pub:
        for t in range(3):
            pub.send(t, pa.table({"row": [t]}))
            pub.advance_to(t + 1)
    r = _reader(cat, "again", startingPosition="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    assert end["frontier"] == [3]
    assert r.latestOffset(end, None) == end               # nothing new: no batch
    with Publisher("again", catalog=cat, codec="arrow", retention=Retention()) as pub:
        pub.send(3, pa.table({"row": [3]}))
        pub.advance_to(4)
    later = r.latestOffset(end, None)
    assert _rows(r, start, end) == [(0, 0), (1, 1), (2, 2)] and _rows(r, end, later) == [(3, 3)]
    r.stop()


def test_retention_deleting_a_planned_batch_is_a_clear_error(tmp_path):
    """Retention deletes the epochs of a planned batch before its tasks read them: ``read``
    raises ``HistoryUnavailable`` (never part of a batch), and the next ``commit`` raises
    ``SubscriptionExpired``: the query's durable subscription expired."""
    cat = Catalog(tmp_path / "cat")
    small = Retention(max_epochs=2, segment_bytes=4096)
    pub = Publisher("small", catalog=cat, codec="arrow", retention=small)
    for t in range(3):
        pub.send(t, pa.table({"row": [t], "pad": ["x" * 5000]}))  # a segment per epoch
        pub.advance_to(t + 1)
    pub.flush()
    r = _reader(cat, "small", startingPosition="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    parts = r.partitions(start, end)
    for t in range(3, 8):
        pub.send(t, pa.table({"row": [t], "pad": ["x" * 5000]}))
        pub.advance_to(t + 1)
    pub.close()
    with pytest.raises(HistoryUnavailable, match="deleted by retention"):
        [b for p in parts for b in r.read(p)]
    with pytest.raises(SubscriptionExpired, match="expired"):
        r.commit(end)
    r.stop()


def test_checkpoint_of_another_topic_is_refused(tmp_path):
    cat = Catalog(tmp_path / "cat")
    _trimmed_topic(cat)
    r = _reader(cat, "trimmed", startingPosition="earliest")
    with pytest.raises(SourceError, match="offsets of topic 'other'"):
        r.latestOffset({"topic": "other", "frontier": [0]}, None)
    r.stop()


# Exactly once across a killed reader: tests/spark/test_pipeline.py (the example pipeline's
# reading query is SIGKILLed after its batch's Parquet was written, before the commit).
