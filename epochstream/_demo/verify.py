"""The demo's verification: what each of its subscribers received, checked against pandas'
per-day figures (every epoch whole and one day, none missing, repeated or delivered early, the
first one the first latent at the join), and the table and summary printed at the end."""

from __future__ import annotations

from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .flights import DayFiles
from .subscribers import SubResult

__all__ = ["Check", "verify", "verification_table", "print_report"]

#: One check of a subscriber: (name, passed, detail).
Check = tuple[str, bool, str]

_FOOTNOTE = ("* checks: first epoch = first latent at join | every later epoch once, in order | "
             "nothing published before join | each epoch whole (count = pandas) | each epoch = "
             "one day")


def verify(res: SubResult, counts: list[int], dates: list[Any]) -> list[Check]:
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


def verification_table(subs: Sequence[SubResult], counts: list[int],
                       dates: list[Any]) -> tuple[Table, list[str]]:
    """The table of every subscriber's checks (a mark per check but "no error", and PASS or
    FAIL), and a line per failed check."""
    table = Table(title="verification: pandas per-day counts as reference")
    for col in ("sub", "joined", "upper@join", "first (expected)", "epochs", "checks*",
                "result"):
        table.add_column(col)
    failures = []
    mark = {True: "[green]✓[/]", False: "[red]✗[/]"}
    for res in subs:
        checks = verify(res, counts, dates)
        ok = all(c[1] for c in checks)
        failures += [f"{res.name}: {n}: {d}" for n, c_ok, d in checks if not c_ok]
        first = res.epochs[0][0] if res.epochs else "-"
        table.add_row(res.name, res.when, str(list(res.snapshot_upper)),
                      f"{first} ({res.expected_first})", str(len(res.epochs)),
                      "".join(mark[c[1]] for c in checks[1:]),
                      "[green]PASS[/]" if ok else "[red]FAIL[/]")
    return table, failures


def print_report(console: Console, subs: Sequence[SubResult], files: DayFiles, stats: list[Any],
                 query_ok: bool, timing: tuple[float, float, float], pace: float,
                 offset: int = 0) -> bool:
    """Print the verification table, the failed checks, the host's figures (its ``stats``, one
    per partition) and the throughput; returns whether everything passed: the query (see
    ``query_ok``), every subscriber's checks, and the rows the host published. ``timing``: when
    the set-up began, the query started and ended (``time.time()``); ``offset``: the first
    day's epoch."""
    table, failures = verification_table(subs, list(files.counts), list(files.dates))
    pub_rows = sum(s.rows for s in stats)
    if pub_rows != files.rows:
        failures.append(f"host published {pub_rows} rows, the table has {files.rows}")
    console.print(table)
    console.print(_FOOTNOTE, style="dim")
    for f in failures:
        console.print(f"[red]FAIL[/] {escape(f)}")
    console.print(f"host: {min(s.next_epoch for s in stats) - offset} epochs complete, "
                  f"{pub_rows:,} rows published (table: {files.rows:,}), "
                  f"{sum(s.discarded_batches for s in stats)} staged batches discarded")
    t_setup, t_query, t_end = timing
    wall = max(t_end - t_query, 1e-9)
    paced = f", paced {pace:g} s/epoch" if pace > 0 else ""
    console.print(f"wall time {wall:.1f} s for {files.days} epochs ({wall / files.days * 1000:.0f} "
                  f"ms/epoch{paced}), {files.rows / wall:,.0f} rows/s through Spark -> "
                  f"epochstream (setup {t_query - t_setup:.1f} s, duplicate commits "
                  f"{sum(s.duplicates for s in stats)})")
    ok_all = query_ok and not failures
    console.print("[bold green]all checks passed[/]" if ok_all else "[bold red]checks failed[/]")
    return ok_all

