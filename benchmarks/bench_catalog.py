"""Case ``catalog`` (issue 13): what one catalog operation costs embedded (the SQLite file opened
in this process) and through the network catalog (``Catalog("tcp://127.0.0.1:PORT")`` against an
``epochstream catalog serve`` process on the same machine, over TCP loopback).

Operations, each ``CALLS`` times in a row on one thread (after ``WARMUP`` calls not counted),
wall time of every call (``perf_counter``), in µs:

- ``lookup`` — ``Catalog.lookup(topic)`` of a topic with 2 registered partitions (a read);
- ``register`` — ``Catalog.register_partition`` of one partition again with its own incarnation
  (a write transaction, fsync at commit; the remote one also carries the client's process and
  lease);
- ``history_epochs`` — ``Catalog.history_epochs(topic, 0)`` of a partition whose index holds
  ``INDEXED`` epochs (a read returning ``INDEXED`` ``EpochRecord`` objects);
- ``durable_ack`` — ``Catalog.durable_ack`` of a held durable subscription at a growing position
  (the consumer's hot path: a write on the thread's long-lived connection, fsync at commit);
- ``hello`` (remote only) — the service's description: one round trip with no SQLite work, the
  floor of every remote call.

Embedded and remote calls alternate (embedded, remote, embedded, ...: both see the same load),
each on its own catalog file in one fresh temporary directory (see ``storage``). The machine is shared (the load average is
recorded); the two cores also run the server process. The ratio remote ÷ embedded and the
difference are per median.

``python -m benchmarks.bench_catalog [--quick]`` runs the case alone and writes
``benchmarks/results/catalog.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import median, save_result
from .provenance import library as _library, storage as _storage

CALLS = 1000
CALLS_QUICK = 200
WARMUP = 50
INDEXED = 100
OPS = ("lookup", "register", "history_epochs", "durable_ack")


def _pct(v: list, q: float) -> float:
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def _dist_us(samples: list) -> dict:
    v = sorted(samples)
    return {"n": len(v), "median_us": round(median(v) * 1e6, 1),
            "p90_us": round(_pct(v, 0.90) * 1e6, 1), "p99_us": round(_pct(v, 0.99) * 1e6, 1),
            "mean_us": round(sum(v) / len(v) * 1e6, 1)}


def _prepare(cat, root: Path) -> dict:
    """The topic, partitions, index and durable subscription the operations use."""
    from epochstream.catalog.history import EpochRecord

    cat.create_topic("bench", partitions=2)
    incs = [cat.register_partition("bench", p, f"tcp://127.0.0.1:{7000 + p}") for p in (0, 1)]
    cat.history_begin("bench", 0, str(root / "logs"), [0], [])
    now = time.time()
    epochs = [EpochRecord(0, t, 0, ((t * 64, 64),), 64, 1, t, now) for t in range(INDEXED)]
    cat.history_commit("bench", 0, epochs=epochs, lower=[INDEXED], upper=[INDEXED - 1],
                       segment=0, committed=INDEXED * 64)
    cat.durable_claim("bench", "d", "bench-holder")
    return {"inc": incs[0]}


def _op(cat, op: str, state: dict):
    """``fn(i)``: one call of ``op`` on ``cat`` (``i`` a fresh number, for growing positions)."""
    inc = state["inc"]
    return {
        "lookup": lambda i: cat.lookup("bench"),
        "register": lambda i: cat.register_partition("bench", 0, "tcp://127.0.0.1:7000",
                                                     incarnation=inc),
        "history_epochs": lambda i: cat.history_epochs("bench", 0),
        "durable_ack": lambda i: cat.durable_ack("bench", "d", "bench-holder", [i]),
        "hello": lambda i: cat._call("hello"),
    }[op]


def _paired(cats: dict, op: str, n: int, states: dict) -> dict:
    """``{kind: [seconds per call]}``: ``n`` calls of ``op`` on each catalog, alternating
    (embedded, remote, embedded, ...) so that both see the same load, after ``WARMUP`` each."""
    fns = {kind: _op(cat, op, states[kind]) for kind, cat in cats.items()}
    for i in range(WARMUP):
        for fn in fns.values():
            fn(i)
    out: dict = {kind: [] for kind in fns}
    pc = time.perf_counter
    for i in range(WARMUP, WARMUP + n):
        for kind, fn in fns.items():
            t0 = pc()
            fn(i)
            out[kind].append(pc() - t0)
    return out


def _serve(db: Path, home: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, EPOCHSTREAM_HOME=str(home))
    env.pop("EPOCHSTREAM_CATALOG", None)
    proc = subprocess.Popen([sys.executable, "-m", "epochstream", "catalog", "serve", "--db",
                             str(db), "--bind", "tcp://127.0.0.1:*"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    m = re.match(r"catalog service on (tcp://\S+) ", line)
    if m is None:
        proc.kill()
        raise RuntimeError(f"epochstream catalog serve did not start: {line!r}")
    return proc, m.group(1)


def run(quick: bool = False, log=print) -> dict:
    from epochstream import Catalog

    n = CALLS_QUICK if quick else CALLS
    t_all = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="es-bench-catalog-"))
    proc = None
    try:
        os.environ["EPOCHSTREAM_HOME"] = str(root / "home")
        embedded = Catalog(root / "embedded" / "catalog.sqlite")
        proc, url = _serve(root / "served", root / "home")
        remote = Catalog(url)
        states = {"embedded": _prepare(embedded, root / "e"), "remote": _prepare(remote, root / "r")}
        rows = []
        for op in OPS:
            row = {"op": op}
            samples = _paired({"embedded": embedded, "remote": remote}, op, n, states)
            for kind in ("embedded", "remote"):
                row[kind] = _dist_us(samples[kind])
            row["remote_over_embedded"] = round(row["remote"]["median_us"]
                                                / row["embedded"]["median_us"], 2)
            row["added_us"] = round(row["remote"]["median_us"] - row["embedded"]["median_us"], 1)
            log(f"  {op:15s} embedded {row['embedded']['median_us']:8.1f} µs  remote "
                f"{row['remote']['median_us']:8.1f} µs  (×{row['remote_over_embedded']}, "
                f"+{row['added_us']} µs; p99 {row['embedded']['p99_us']} / "
                f"{row['remote']['p99_us']} µs)")
            rows.append(row)
        floor = _dist_us(_paired({"remote": remote}, "hello", n, states)["remote"])
        log(f"  {'hello (remote)':15s} {floor['median_us']:8.1f} µs: one round trip, no SQLite")
        remote.close()
        return {"quick": quick, "calls": n, "warmup": WARMUP, "indexed_epochs": INDEXED,
                "design": "embedded and remote calls alternate, one thread",
                "transport": "TCP loopback 127.0.0.1, server in its own process",
                "rows": rows, "round_trip": floor, "storage": _storage(str(root)),
                "library": _library(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                "machine_note": f"{os.cpu_count()} cores shared by the client, the server "
                                f"process and other sessions' runs",
                "ok": True, "wall_s": round(time.monotonic() - t_all, 1)}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in argv)
    path = save_result("catalog", result)
    print(json.dumps({r["op"]: [r["embedded"]["median_us"], r["remote"]["median_us"]]
                      for r in result["rows"]}), f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
