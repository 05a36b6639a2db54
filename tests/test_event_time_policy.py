"""The Spark sink's event-time policy on its own (:mod:`epochstream.spark.event_time`): options,
schema checks, splitting Arrow batches by epoch, and the completion decision, against plain
models. No JVM: pyspark's type classes and pyarrow only."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hypothesis_profiles  # noqa: F401 - the profile
from epochstream.spark.event_time import (BATCH, WATERMARK, EventTime, EventTimeError,
                                          check_schema, decide, event_time, parse_length, split)

pytest.importorskip("pyspark")
from pyspark.sql import types as T  # noqa: E402

DAY = 86_400_000_000
HOUR = 3_600_000_000


@pytest.mark.parametrize("text, us", [("1 day", DAY), ("2 days", 2 * DAY), ("6 hours", 6 * HOUR),
                                      ("1 hour 30 minutes", 90 * 60_000_000),
                                      ("500 milliseconds", 500_000), ("1 week", 7 * DAY),
                                      (" 3 Seconds ", 3_000_000)])
def test_lengths(text, us):
    assert parse_length(text) == us


@pytest.mark.parametrize("text", ["", "day", "1", "1.5 days", "-1 day", "0 days", "1 fortnight",
                                  "days 1", "1 day 2"])
def test_bad_lengths(text):
    with pytest.raises(EventTimeError, match="epochLength"):
        parse_length(text)


def test_options():
    assert event_time({}) is None
    assert event_time({"epochColumn": "day"}) == EventTime(BATCH, "day")
    assert event_time({"complete": "watermark", "eventTime": "ts", "epochLength": "1 hour"}) \
        == EventTime(WATERMARK, "ts", HOUR)
    for bad, match in [({"complete": "batch"}, "needs the epoch column"),
                       ({"complete": "watermark", "eventTime": "ts"}, "epochLength"),
                       ({"complete": "watermark", "epochColumn": "d", "eventTime": "ts",
                         "epochLength": "1 day"}, "not epochColumn"),
                       ({"eventTime": "ts"}, "needs option"),
                       ({"epochColumn": "d", "complete": "sometimes"}, "must be")]:
        with pytest.raises(EventTimeError, match=match):
            event_time(bad)


def test_schema_checks():
    wm = {"spark.watermarkDelayMs": 3_600_000}
    schema = T.StructType([T.StructField("day", T.IntegerType()),
                           T.StructField("name", T.StringType()),
                           T.StructField("ts", T.TimestampType(), metadata=wm),
                           T.StructField("bare", T.TimestampType())])
    assert check_schema(EventTime(BATCH, "day"), schema) == EventTime(BATCH, "day")
    assert check_schema(EventTime(WATERMARK, "ts", DAY), schema).delay_us == HOUR
    for ev, match in [(EventTime(BATCH, "nope"), "no column 'nope'"),
                      (EventTime(BATCH, "name"), "integer column, it is string"),
                      (EventTime(WATERMARK, "day", DAY), "timestamp column"),
                      (EventTime(WATERMARK, "bare", DAY), "withWatermark")]:
        with pytest.raises(EventTimeError, match=match):
            check_schema(ev, schema)


@given(st.lists(st.integers(0, 6), max_size=60))
def test_split_is_the_rows_grouped_by_epoch_in_order(epochs):
    batch = pa.record_batch({"day": pa.array(epochs, pa.int32()),
                             "i": pa.array(range(len(epochs)), pa.int64())})
    pieces = split(EventTime(BATCH, "day"), batch)
    assert [p.epoch for p in pieces] == sorted(set(epochs))
    for p in pieces:  # each epoch's rows, in their original order
        assert p.batch.column("i").to_pylist() == [i for i, e in enumerate(epochs) if e == p.epoch]
        assert set(p.batch.column("day").to_pylist()) == {p.epoch}


@given(st.lists(st.integers(0, 10 * DAY), min_size=1, max_size=40))
def test_split_by_event_time_windows(times):
    batch = pa.record_batch({"ts": pa.array(times, pa.timestamp("us", tz="UTC"))})
    pieces = split(EventTime(WATERMARK, "ts", DAY), batch)
    assert [p.epoch for p in pieces] == sorted({t // DAY for t in times})
    for p in pieces:
        mine = [t for t in times if t // DAY == p.epoch]
        assert p.event_max == max(mine) and p.batch.num_rows == len(mine)


@pytest.mark.parametrize("values, match", [([1, None], "null"), ([0, -3], "-3")])
def test_split_refuses_rows_without_a_valid_epoch(values, match):
    with pytest.raises(EventTimeError, match=match):
        split(EventTime(BATCH, "day"), pa.record_batch({"day": pa.array(values, pa.int64())}))
    with pytest.raises(EventTimeError, match="before 1970"):
        split(EventTime(WATERMARK, "ts", DAY),
              pa.record_batch({"ts": pa.array([-1], pa.timestamp("us"))}))


@given(st.lists(st.lists(st.integers(0, 30), max_size=5), min_size=1, max_size=8),
       st.sets(st.integers(0, 7)))
def test_batch_policy_model(batches, reruns):
    """Each batch's epochs against a model: published iff all are at or beyond the frontier,
    refused iff some is below it; re-runs of committed batches are duplicates; the frontier only
    grows and ends one past the greatest epoch published."""
    frontier, next_batch, published = 0, None, set()
    for b, epochs in enumerate(batches):
        for attempt in range(2 if b in reruns else 1):
            times = (min(epochs), max(epochs)) if epochs else None
            if attempt == 1 and next_batch == b + 1:  # committed: its re-run is a duplicate
                d = decide(BATCH, b, frontier, next_batch, times, None, None, 0, 0)
                assert d.duplicate and d.next_frontier == frontier
                continue
            if times is not None and times[0] < frontier:
                with pytest.raises(EventTimeError, match=f"rows of epoch {times[0]}"):
                    decide(BATCH, b, frontier, next_batch, times, None, None, 0, 0)
                continue
            d = decide(BATCH, b, frontier, next_batch, times, None, None, 0, 0)
            assert not d.duplicate and d.next_frontier >= frontier
            published |= set(epochs)
            frontier, next_batch = d.next_frontier, b + 1
    assert frontier == (max(published) + 1 if published else 0)


@given(st.lists(st.one_of(st.none(), st.integers(0, 20 * DAY)), min_size=1, max_size=10),
       st.integers(0, 3 * DAY))
def test_watermark_policy_model(maxima, delay):
    """The frontier after each batch is Spark's watermark (the greatest event time so far minus
    the delay) in whole windows, never decreasing."""
    frontier, seen = 0, None
    for b, event_max in enumerate(maxima):
        d = decide(WATERMARK, b, frontier, b, None, event_max, seen, DAY, delay)
        top = max([m for m in maxima[:b + 1] if m is not None], default=None)
        assert d.event_max == top
        want = 0 if top is None else max(0, (top - delay) // DAY)
        assert d.next_frontier == max(frontier, want) >= frontier
        frontier, seen = d.next_frontier, d.event_max


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=3))
def test_advance_past_completes_exactly_what_is_below_the_batch(starts, maxima):
    """On a 7x7 grid of product(2) times: after ``advance_past(F, M)``, a time is complete
    (no frontier element <= it) iff it was complete before or is <= some m in M; the result
    is an antichain."""
    from epochstream.frontier import Antichain
    from epochstream.order import product

    from epochstream.spark.event_time import advance_past

    P = product(2)
    before = sorted(Antichain(P, starts).elements)
    after = advance_past(P, before, maxima)
    assert sorted(Antichain(P, after).elements) == after
    for a in range(7):
        for b in range(7):
            t = (a, b)
            was = not any(P.le(f, t) for f in before)
            now = not any(P.le(f, t) for f in after)
            assert now == (was or any(P.le(t, m) for m in maxima)), (t, before, maxima, after)
