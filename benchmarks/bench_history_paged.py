"""Before/after of the paged history fill (``transport/fill_pages.py``): time to the first epoch
from ``earliest`` and from the middle, on one log, measured by two code trees.

The log is ``bench_history_scale``'s (its writer process: epochs of 10 messages of 1,000
msgpack tuples, ~209 KB an epoch, a SQLite catalog, the publisher idle and live while it is
measured), grown to each size of ``--sizes``. At each size, ``--repeats`` rounds; in each
round every tree (``--before``, ``--after``: directories holding ``epochstream``), in turn
(the order alternates between rounds), runs a fresh interpreter that makes one unrecorded
subscriber at the log's last epoch (imports), then, after dropping the log's pages from the
page cache, ``first_epoch(start="earliest")``, and again for ``start=E // 2`` — the same
function as ``bench_history_scale``. Medians of the rounds are reported, all values kept.

    PYTHONPATH=$PWD python -m benchmarks.bench_history_paged --before /work/main \\
        --after $PWD --sizes 1e9 4e9 --repeats 3 --out benchmarks/results/history_scale_paged.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import bench_history_scale as hs
from . import curves

_CHILD = r"""
import json, sys
tree, catalog, logdir, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, tree)
from benchmarks import bench_history_scale as hs
import epochstream
assert epochstream.__file__.startswith(tree), epochstream.__file__
hs.first_epoch(catalog, epochs - 1)  # imports, not the log's size
out = {}
for name, start in (("first_earliest", "earliest"), ("first_mid", epochs // 2)):
    hs.drop_cache(logdir)
    out[name] = hs.first_epoch(catalog, start)
print(json.dumps(out))
"""


def measure(tree: str, catalog: str, logdir: str, epochs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    got = subprocess.run([sys.executable, "-c", _CHILD, tree, catalog, logdir, str(epochs)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tree)
    if got.returncode != 0:
        raise RuntimeError(f"{tree}: {got.stderr[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def run(before: str, after: str, sizes, repeats: int, log=print) -> dict:
    base = tempfile.mkdtemp(prefix="es-histpaged-", dir=os.environ.get("BENCH_HISTORY_DIR"))
    catalog, logdir = os.path.join(base, "catalog.db"), os.path.join(base, "logs")
    ctx = mp.get_context("spawn")
    q, cmd = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=hs._writer, args=(catalog, logdir, q, cmd), daemon=True)
    proc.start()
    rows = []
    try:
        curves.expect(q, "ready", 120)
        for size in sizes:
            cmd.put(int(size))
            at = curves.expect(q, "at", 3600)
            row = {"target_bytes": int(size), "log_bytes": at["bytes"], "epochs": at["epochs"],
                   "loadavg": curves.loadavg(), "runs": {"before": [], "after": []}}
            trees = [("before", before), ("after", after)]
            for r in range(repeats):
                for name, tree in (trees if r % 2 == 0 else trees[::-1]):
                    row["runs"][name].append(measure(tree, catalog, logdir, at["epochs"]))
            for name in ("before", "after"):
                for case in ("first_earliest", "first_mid"):
                    row[f"{name}_{case}_ms"] = round(1e3 * statistics.median(
                        x[case]["seconds"] for x in row["runs"][name]), 1)
            rows.append(row)
            log(f"  {at['bytes'] / 1e9:.2f} GB, {at['epochs']} epochs: earliest "
                f"{row['before_first_earliest_ms']} -> {row['after_first_earliest_ms']} ms, "
                f"middle {row['before_first_mid_ms']} -> {row['after_first_mid_ms']} ms")
        cmd.put(None)
    finally:
        proc.kill()
        proc.join(10)
        shutil.rmtree(base, ignore_errors=True)
    return {"case": "history_scale_paged", "before": before, "after": after,
            "repeats": repeats, "rows": rows, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e9, 4e9])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    res = run(os.path.abspath(a.before), os.path.abspath(a.after), a.sizes, a.repeats)
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
