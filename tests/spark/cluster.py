"""The standalone Spark cluster of the cluster tests, and a Spark driver that runs on it.

- :func:`start_cluster` starts :class:`epochstream._demo.cluster.LocalCluster` (a master and
  two workers, each its own JVM started with PySpark's ``bin/spark-class``; 1 core and 1 GiB
  per worker; executors in the workers' own work directories). The session fixture
  ``spark_cluster`` (tests/spark/conftest.py) starts one for every test that asks for it and
  stops it after the last one.
- :class:`Driver` runs this file as a program: a Spark driver on the cluster, in a process
  group of its own (driver JVM and its Python workers), that says it is ready once its
  executors are registered, and then runs the commands it reads as JSON
  lines on stdin (``sink``, ``source``, ``exit``) and answers each with one JSON line on stdout.
  One driver serves several tests, so the cluster's executors start once. With a ``local[N]``
  master it is a local-mode driver of its own (no executors to wait for). A sink command may
  carry ``options`` (the sink's, e.g. ``{"epochColumn": "day_number"}``), ``first_date``
  (adds ``day_number``, days since that date) and ``watermark`` (adds ``ts``, the day of
  departure at the scheduled hour in UTC, under ``withWatermark("ts", WATERMARK)``). The driver gets the
  catalog as a ``tcp://`` URL in each command and nothing else: its environment has no
  ``EPOCHSTREAM_CATALOG`` and its working directory is a fresh one.
- :func:`open_paths` lists the files the executors' processes (JVMs and Python workers) have
  open: a catalog file opened by a task (the sink's workers cache their catalog connections)
  shows there.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ANSWER = "@@ "  # prefix of the driver's answers on stdout (anything else there is skipped)
QUERY_TIMEOUT = 120


def app_conf(cores: int) -> dict[str, str]:
    """Settings of an application on the test cluster: ``cores`` executors of 1 core (one per
    worker) with 512 MiB each (a worker has 1 GiB)."""
    return {"spark.cores.max": str(cores), "spark.executor.cores": "1",
            "spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2"}


def start_cluster(root: Path, *, wait: bool = True):
    """A :class:`~epochstream._demo.cluster.LocalCluster` in ``root``, started (``wait=False``:
    the workers may still be registering; a :class:`Driver` waits for its executors)."""
    from epochstream._demo.cluster import LocalCluster

    return LocalCluster(root, workers=2, cores=1, memory="1g").start(wait=wait)


def executor_processes(cluster) -> list:
    """The processes below the workers: executor JVMs and their Python daemons and workers
    (zombies left out)."""
    import psutil

    out = []
    for pid in cluster.pids()[1:]:
        try:
            out.extend(psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
    return [p for p in out if command(p)]


def command(p) -> str:
    """The command line of process ``p`` ("" if it is gone or a zombie)."""
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def open_paths(procs) -> set[str]:
    """Every file the processes ``procs`` have open."""
    import psutil

    paths: set[str] = set()
    for p in procs:
        try:
            paths.update(f.path for f in p.open_files())
        except psutil.Error:
            pass
    return paths


def catalog_connections(procs, url: str) -> list:
    """The processes among ``procs`` with a TCP connection to the catalog service at ``url``."""
    import psutil

    port = int(url.rsplit(":", 1)[1].split("?")[0].strip("/"))
    found = []
    for p in procs:
        try:
            if any(c.raddr and c.raddr.port == port for c in p.net_connections("tcp")):
                found.append(p)
        except psutil.Error:
            pass
    return found


def committed_parquet(out: Path):
    """The rows of the Parquet files Spark's file sink committed (those its ``_spark_metadata``
    log lists), as a pyarrow Table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for log in sorted((out / "_spark_metadata").iterdir()):
        if log.name.startswith(".") or log.name.endswith(".tmp"):
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry["action"] == "add":
                paths.append(entry["path"].removeprefix("file://"))
    return pa.concat_tables([pq.read_table(p) for p in paths]) if paths else pa.table({})


class Driver:
    """This file as a Spark driver on ``master`` (module docstring), started in ``cwd``."""

    def __init__(self, master: str, cwd: Path, *, cores: int = 2,
                 env: dict[str, str] | None = None, executor_env: dict[str, str] | None = None):
        self.log = cwd / "driver.log"
        run_env = {k: v for k, v in os.environ.items() if k != "EPOCHSTREAM_CATALOG"}
        run_env.update({"SPARK_LOCAL_IP": "127.0.0.1", **(env or {})})
        conf = {**app_conf(cores), **{f"spark.executorEnv.{k}": v
                                      for k, v in (executor_env or {}).items()}}
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, master, json.dumps(conf)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd, env=run_env,
                start_new_session=True)
        self.ready = self._answer(QUERY_TIMEOUT)
        assert self.ready.get("ready"), self.ready

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def _answer(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the driver did not answer within {timeout} s:\n"
                                         f"{self.tail()}")
                if not sel.select(min(left, 1.0)):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the driver exited ({self.proc.wait()}):\n{self.tail()}")
                if line.startswith(ANSWER):
                    return json.loads(line[len(ANSWER):])
        finally:
            sel.close()

    def send(self, op: str, **args: Any) -> None:
        """Send one command without waiting for its answer (a command that will be killed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (the Python driver, its JVM and their
        children), as a crash of its machine would; waits for the driver to be reaped."""
        import signal

        os.killpg(self.proc.pid, signal.SIGKILL)  # start_new_session: pid == pgid
        self.proc.wait(30)

    def call(self, op: str, timeout: float = QUERY_TIMEOUT, **args: Any) -> dict:
        """Run one command; returns its answer (raises AssertionError if the command failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(timeout)
        assert "error" not in answer, f"{answer['error']}\n{self.tail()}"
        return answer

    def close(self) -> None:
        from epochstream._demo.cluster import stop_group

        if self.proc.poll() is None:
            try:
                self.call("exit", timeout=30)
                self.proc.wait(30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                pass
        stop_group(self.proc, 10)


# ---- the driver program (runs in its own process)


def _event_columns(df, cmd: dict):
    """``day_number`` and/or ``ts`` (see the module docstring), as the command asks."""
    from pyspark.sql import functions as F

    if cmd.get("first_date"):
        df = df.withColumn("day_number", F.datediff(F.col("dep_date"),
                                                    F.lit(cmd["first_date"])).cast("int"))
    if cmd.get("watermark"):
        ts = F.timestamp_seconds(F.unix_date(F.col("dep_date")) * 86400 + F.col("hour") * 3600)
        df = df.withColumn("ts", ts).withWatermark("ts", cmd["watermark"])
    return df


def _sink(spark, cmd: dict) -> dict:
    from epochstream.spark import start_query

    df = (spark.readStream.schema(cmd["schema"])
          .option("maxFilesPerTrigger", cmd["files_per_day"]).parquet(cmd["input"]))
    q = start_query(spark, _event_columns(df, cmd), cmd["topic"], checkpoint=cmd["checkpoint"],
                    catalog=cmd["catalog"], trigger={"availableNow": True},
                    options=cmd.get("options"))
    return _finish(q)


def _sink_held(spark, cmd: dict) -> dict:
    """As :func:`_sink`, but batch ``hold_batch``'s first task writes its pid to ``hold_file``
    after handing over some rows and then sleeps (until the test kills the driver)."""
    from epochstream.spark import start_query

    hold_batch, hold_file = str(cmd["hold_batch"]), cmd["hold_file"]

    def hold(batches):
        import os as _os
        import time as _t
        from pyspark import TaskContext

        ctx = TaskContext.get()
        held = (ctx.getLocalProperty("streaming.sql.batchId") == hold_batch
                and ctx.partitionId() == 0)
        for i, b in enumerate(batches):
            yield b
            if held and i == 7:  # (800 rows handed over: the sink staged some of them)
                with open(hold_file, "w") as f:
                    f.write(str(_os.getpid()))
                _t.sleep(600)

    # small Arrow batches, so that rows reach the sink (and the host) before the task hangs
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    df = (spark.readStream.schema(cmd["schema"])
          .option("maxFilesPerTrigger", cmd["files_per_day"]).parquet(cmd["input"]))
    df = _event_columns(df, cmd)
    q = start_query(spark, df.mapInArrow(hold, df.schema), cmd["topic"],
                    checkpoint=cmd["checkpoint"], catalog=cmd["catalog"],
                    trigger={"availableNow": True}, options=cmd.get("options"))
    return _finish(q)


def _source(spark, cmd: dict) -> dict:
    df = (spark.readStream.format("epochstream").option("topic", cmd["topic"])
          .option("catalog", cmd["catalog"]).option("startingPosition", "earliest")
          .option("maxEpochsPerTrigger", cmd["max_epochs"]).load())
    q = (df.writeStream.format("parquet").option("path", cmd["output"])
         .option("checkpointLocation", cmd["checkpoint"]).trigger(availableNow=True).start())
    return _finish(q)


def _finish(q) -> dict:
    if not q.awaitTermination(QUERY_TIMEOUT):
        q.stop()
        return {"error": "the query did not finish"}
    if q.exception() is not None:
        return {"error": str(q.exception())}
    return {"batches": [p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0],
            "rows": sum(p["numInputRows"] for p in q.recentProgress),
            "batch_ms": [p["durationMs"].get("triggerExecution") for p in q.recentProgress]}


def main() -> int:
    master, conf = sys.argv[1], json.loads(sys.argv[2])
    from epochstream.spark import local_session, register

    spark = local_session("epochstream-cluster-tests", master=master, conf=conf)
    register(spark)
    wanted = int(conf.get("spark.cores.max", "1")) if master.startswith("spark://") else 0
    deadline = time.monotonic() + QUERY_TIMEOUT
    while wanted and spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < wanted + 1:
        if time.monotonic() > deadline:  # (+1: the driver's own block manager)
            raise SystemExit(f"fewer than {wanted} executors registered")
        time.sleep(0.1)

    def answer(obj: dict) -> None:
        sys.stdout.write(ANSWER + json.dumps(obj) + "\n")
        sys.stdout.flush()

    answer({"ready": True, "app": spark.sparkContext.applicationId, "pid": os.getpid()})
    ops = {"sink": _sink, "sink_held": _sink_held, "source": _source}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            answer({"bye": True})
            break
        try:
            answer(ops[cmd["op"]](spark, cmd))
        except Exception as e:  # noqa: BLE001 - reported to the test
            answer({"error": f"{type(e).__name__}: {e}"})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
