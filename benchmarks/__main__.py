"""``python -m benchmarks [--quick] [--all] [--case NAME ...] [--no-report]``

Runs the benchmark cases (default: the core suite, :data:`CORE` — the transport's throughput,
latency, fan-out, scale, peers and this machine's ceilings, issue 10; ``--all`` adds the
feature cases :data:`FEATURES` — durable history, consumer groups, filters at the source, the
network catalog, the Spark source, CURVE — each also runnable alone with ``--case``), writes
``benchmarks/results/<case>.json`` after each case (and, with ``--all``, the curves of scale of
issue 28, :data:`CURVES`: docs/benchmarks.md's "Curve" sections and docs/scale.md's unit costs) (``$BENCH_RESULTS``: another directory, for
trial runs that must not replace the published results) and regenerates ``docs/benchmarks.md`` + ``docs/img/*.png`` from every result file present.
Installs what it needs when missing: the ``bench`` pip extras into this interpreter, and
redis-server / nats-server with apt-get (root). ``--quick`` runs a reduced grid with short runs
(0.6 s instead of 5 s, fewer repeats; the report labels them) in under 3 minutes, without the
``spark`` case (run it with ``--case spark``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import time

from . import RESULTS, save_result

CORE = ("filter", "e2e", "peers", "fanout", "spark", "frontier", "limits", "latejoin", "latency",
        "memory", "scale")
"""``make bench`` (≤ 20 minutes) and ``make bench-quick`` (≤ 3 minutes): issue 10's suite."""
FEATURES = ("history", "groups", "pushdown", "catalog", "spark_source", "security",
            "spark_event_time", "store")
"""``make bench-all`` adds these (about 20 minutes more in full): one case per feature issue."""
CURVES = ("topics", "subscribers", "partitions_wide", "catalog_scale", "history_scale")
"""The curves of scale (issue 28), in ``make bench-all`` and each alone with ``--case``."""
CASES = CORE + FEATURES + CURVES
MODULES = {"filter": "bench_filter", "e2e": "bench_e2e", "peers": "bench_peers",
           "fanout": "bench_fanout", "spark": "bench_spark", "frontier": "bench_frontier",
           "limits": "bench_limits", "latejoin": "bench_latejoin", "latency": "bench_latency",
           "memory": "bench_memory", "scale": "bench_scale", "history": "bench_history",
           "groups": "bench_groups", "pushdown": "bench_pushdown", "catalog": "bench_catalog",
           "spark_source": "bench_spark_source", "security": "bench_security",
           "spark_event_time": "bench_spark_event_time", "topics": "bench_topics",
           "subscribers": "bench_subscribers", "partitions_wide": "bench_partitions",
           "catalog_scale": "bench_catalog_scale", "history_scale": "bench_history_scale",
           "store": "bench_store"}
# left out of ``--quick`` unless named with --case: Spark's JVM start-up and warm-up alone take
# most of a minute, a third of the 3-minute budget (its last result file stays, dated, in the report)
NOT_QUICK = ("spark", "spark_source", "spark_event_time")
# import name -> pip requirement (the ``bench`` extra)
PIP = {"redis": "redis>=5", "hiredis": "hiredis>=2", "nats": "nats-py>=2.6",
       "matplotlib": "matplotlib>=3.8"}
NEEDS = {"peers": ("redis", "hiredis", "nats"), "report": ("matplotlib",)}


def ensure_pip(names, log=print) -> None:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if not missing:
        return
    reqs = [PIP[n] for n in missing]
    log(f"installing missing benchmark packages: {' '.join(reqs)}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *reqs])
    if proc.returncode != 0:
        log(f"warning: pip install {' '.join(reqs)} failed (exit {proc.returncode})")
    importlib.invalidate_caches()


def _frontier_available() -> bool:
    return importlib.util.find_spec(f"{__package__}.bench_frontier") is not None


def run_case(name: str, quick: bool, log=print) -> dict | None:
    mod = importlib.import_module(f"{__package__}.{MODULES[name]}")
    fn = getattr(mod, "run", None)
    if fn is None:  # a module with only a CLI entry point
        main = getattr(mod, "main", None)
        if main is None:
            raise RuntimeError(f"benchmarks/{MODULES[name]}.py has neither run() nor main()")
        main(["--quick"] if quick else [])
        return None
    params = inspect.signature(fn).parameters
    kwargs = {}
    if "quick" in params:
        kwargs["quick"] = quick
    if "log" in params:
        kwargs["log"] = log
    return fn(**kwargs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced grid, 0.6 s runs (labelled quick), about 3 minutes")
    ap.add_argument("--case", action="append", choices=CASES, metavar="NAME",
                    help=f"run only this case (repeatable): {', '.join(CASES)}")
    ap.add_argument("--all", action="store_true",
                    help=f"also the feature cases ({', '.join(FEATURES)}) and the curves of scale "
                         f"({', '.join(CURVES)})")
    ap.add_argument("--no-report", action="store_true", help="do not regenerate docs/benchmarks.md")
    args = ap.parse_args(argv)
    cases = args.case or [c for c in (CASES if args.all else CORE)
                          if (c != "frontier" or _frontier_available())
                          and not (args.quick and c in NOT_QUICK)]
    if "frontier" in cases and not _frontier_available():
        print("case 'frontier': benchmarks/bench_frontier.py is not there; skipped")
        cases = [c for c in cases if c != "frontier"]
    t_all = time.monotonic()
    if "peers" in cases:
        ensure_pip(NEEDS["peers"])
    if not args.no_report:
        ensure_pip(NEEDS["report"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in cases:
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        t0 = time.monotonic()
        own = RESULTS / f"{name}.json"
        mtime = own.stat().st_mtime if own.exists() else None
        load = [round(x, 2) for x in os.getloadavg()]
        try:
            result = run_case(name, args.quick, log=lambda m: print(m, flush=True))
            if isinstance(result, dict):
                result.setdefault("loadavg_at_start", load)  # 1/5/15-minute load averages
        except Exception as exc:  # one broken case must not hide the others' results
            import traceback
            traceback.print_exc()
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        dt = time.monotonic() - t0
        wrote_itself = own.exists() and own.stat().st_mtime != mtime
        if result is not None and wrote_itself and result.get("ok", True):
            print(f"== {name}: {dt:.1f} s -> {own.relative_to(RESULTS.parent.parent)} (written by the case)")
        elif result is not None:
            result.setdefault("wall_s", round(dt, 1))
            path = save_result(name, result)
            if not result.get("ok", True):
                failed.append(name)
            print(f"== {name}: {dt:.1f} s -> {path.relative_to(RESULTS.parent.parent)}", flush=True)
        else:
            print(f"== {name}: {dt:.1f} s", flush=True)
    if not args.no_report and cases and all(c in CURVES for c in cases):
        from . import report_curves  # only the curves' sections: the rest of the file stays
        print(f"report: {report_curves.splice()}")
    elif not args.no_report:
        from . import report
        out = report.write()
        print(f"report: {out}")
    print(f"total {time.monotonic() - t_all:.1f} s" + (f"; cases with failures: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
