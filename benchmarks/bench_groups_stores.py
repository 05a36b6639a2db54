"""Consumer groups on SQLite and on PostgreSQL: the speed-up of 4 workers over 1 at 5 ms of
work per epoch (issue 27's target: >= 3x, worst pair, on PostgreSQL), paired and interleaved.

Each repeat runs, in this order, SQLite x1, SQLite x4, PostgreSQL x1, PostgreSQL x4 (time-based
runs of ``benchmarks.bench_groups.throughput_run``: the same pool of worker processes, the same
publisher keeping 64 epochs ahead, a fresh catalog per run; PostgreSQL is a throwaway server
from ``epochstream.testing.postgres`` with fsync off, a fresh database per run). Speed-up per
store = rate(x4) / rate(x1) of the same repeat; also the PostgreSQL / SQLite ratio per worker
count. ``python -m benchmarks.bench_groups_stores [--quick]`` writes
``benchmarks/results/groups_stores.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import paired
from .bench_groups import _Pool, throughput_run

WORK = 0.005
WORKERS = (1, 4)
OUT = Path(__file__).parent / "results" / "groups_stores.json"


def run(quick: bool = False, log=print) -> dict:
    from epochstream.testing.postgres import PostgresServer

    seconds, n_rep = paired.seconds(quick), paired.repeats(quick)
    os.environ["EPOCHSTREAM_HOME"] = tempfile.mkdtemp(prefix="es-bench-groups-home-")
    pg = PostgresServer()
    pool = _Pool(max(WORKERS))
    rows = []
    t0 = time.monotonic()
    try:
        for rep in range(n_rep):
            for store in ("sqlite", "postgresql"):
                for k in WORKERS:
                    url = None if store == "sqlite" else pg.create_database(f"g{rep}_{k}")
                    r = throughput_run(pool, mode="shared", work=WORK, workers=k,
                                       duration=seconds, catalog=url)
                    r.pop("_fetch_s", None)
                    r.pop("_ack_s", None)
                    r["variant"], r["repeat"], r["store"] = f"{store} x{k}", rep, store
                    rows.append(r)
                    log(f"  #{rep} {r['variant']:14s}: {r.get('epochs_per_s', 0):8.1f} epochs/s"
                        f"{'' if r.get('ok') else '  FAILED: ' + str(r.get('error'))}")
    finally:
        pool.close()
        pg.close()
    summary = {}
    for store in ("sqlite", "postgresql"):
        sp = paired.pair_ratios(rows, f"{store} x4", f"{store} x1", key="epochs_per_s")
        summary[f"{store}_speedup_x4"] = paired.summary(sp)
        summary[f"{store}_epochs_per_s"] = {
            f"x{k}": paired.summary([r["epochs_per_s"] for r in rows
                                     if r["variant"] == f"{store} x{k}" and r.get("ok")])
            for k in WORKERS}
    for k in WORKERS:
        summary[f"postgresql_over_sqlite_x{k}"] = paired.summary(
            paired.pair_ratios(rows, f"postgresql x{k}", f"sqlite x{k}", key="epochs_per_s"))
    worst = (summary["postgresql_speedup_x4"] or {}).get("min")
    summary["target_4_workers_3x_on_postgresql"] = {
        "target": 3.0, "worst_pair": worst, "met": worst is not None and worst >= 3.0}
    result = {"benchmark": "groups_stores", "quick": quick, "seconds_per_run": seconds,
              "repeats": n_rep, "work_s": WORK, "workers": list(WORKERS),
              "postgresql": "throwaway server, fsync=off (epochstream.testing.postgres)",
              "machine": {"nproc": os.cpu_count(), "python": sys.version.split()[0],
                          "loadavg_end": os.getloadavg()},
              "wall_s": round(time.monotonic() - t0, 1), "summary": summary, "rows": rows}
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in argv)
    OUT.write_text(json.dumps(result, indent=1, default=str) + "\n")
    s = result["summary"]
    for store in ("sqlite", "postgresql"):
        x = s[f"{store}_speedup_x4"]
        if x:
            print(f"{store}: 4 workers / 1 = {x['median']:.2f}x ({x['min']:.2f}-{x['max']:.2f}, "
                  f"n={x['n']})")
    print(f"target >= 3x on PostgreSQL (worst pair): {s['target_4_workers_3x_on_postgresql']}")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
