"""The catalog on SQLite vs PostgreSQL: hot operations at 1/8/32 clients, a retention publisher.

Issue 27: what the hot catalog operations cost on each store under 1, 8 and 32 concurrent
clients, and what a retention publisher streams on each.

**Operations** (each client: its own ``Catalog(location)`` — on PostgreSQL its own connections —
and its own durable name / partition; a topic of ``N`` partitions, ``N`` = clients):

- ``ack`` — ``durable_claim`` once, then ``durable_ack(topic, name, holder, [k])``, ``k``
  growing (a write transaction: SQLite ``BEGIN IMMEDIATE`` + fsync at commit; PostgreSQL the
  catalog's advisory write lock + a WAL flush at commit);
- ``renew`` — ``register_partition`` once, then ``heartbeat(topic, p, incarnation)`` (one
  autocommit ``UPDATE``, no write lock; SQLite ``synchronous=NORMAL``: no fsync);
- ``commit`` — ``history_begin`` once, then ``history_commit`` of one ``EpochRecord`` per call,
  epoch growing (a write transaction, as ``ack``);
- ``lookup`` — ``lookup(topic)`` (a read; each client registered its partition first, so it
  reads ``N`` live partitions).

Each cell (store x operation x clients x mode) is a time-based run (``SECONDS``, ``--quick``
``SECONDS_QUICK``) after ``WARMUP`` calls per client: all clients start together and call the
operation in a loop until the end of the run. Per cell: throughput (operations/s, all clients,
over the wall time from the start to the last client's last call), latency p50/p99 (ms, every
call's wall time in its client: in thread mode that includes waiting for the GIL), CPU seconds of
the client process(es) per operation, and on PostgreSQL the CPU of the server's processes per
operation (they share this machine's cores with the clients). Every cell runs on a fresh catalog:
a new SQLite file in a fresh temporary directory on the local disk, a new database on PostgreSQL.

**Clients** are threads of this process (1, 8, 32) and, at 8, also separate processes
(``PROCESS_CONCURRENCY``, a pool of spawned worker processes): thread clients share one GIL, so
what the thread cells measure may be this process's Python rather than the store; the result's
``notes.threads_vs_processes`` compares the two at 8 clients.

**Pairing**: ``REPEATS`` repeats; in each, for each operation and client configuration, the
SQLite cell and then the PostgreSQL cell (seconds apart, under the same load). Per cell the
median and min-max over repeats; per pair the ratio PostgreSQL / SQLite of the throughput
(median, min, max; :mod:`benchmarks.paired`). A target is met only if the worst pair meets it.

PostgreSQL is a throwaway server (:class:`epochstream.testing.postgres.PostgresServer`) with
``fsync = off`` (its default), which flatters PostgreSQL's commit latency; the ``ack`` cell at 8
clients is therefore also run once on a second server with ``fsync=True`` (``fsync_on``).

**Publisher** (``publisher``): end-to-end records/s of ``Publisher("bench", catalog=Catalog(loc),
retention=Retention(dir=...))`` sending epochs of one message of ``RECORDS`` small dicts, each
followed by ``advance_to(e + 1)``, time-based (``PUBLISHER_SECONDS``), until ``flush()`` returns
(every epoch logged and indexed), on a fresh catalog per run; paired SQLite / PostgreSQL repeats.

``python -m benchmarks.bench_catalog_stores [--quick] [--out PATH]`` writes
``benchmarks/results/catalog_stores.json`` (or ``PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from array import array
from pathlib import Path

from . import RESULTS, machine_info, median, paired
from .provenance import library as _library, storage as _storage

OPS = ("ack", "renew", "commit", "lookup")
STORES = ("sqlite", "postgresql")
CONCURRENCY = (1, 8, 32)
"""Client threads of one process."""
PROCESS_CONCURRENCY = (8,)
"""Client processes (one client each), besides the threads."""
SECONDS = 3.0
SECONDS_QUICK = 0.5
REPEATS = 5
WARMUP = 20
"""Calls per client before the run (connections opened, caches warm), not counted."""
FSYNC_CLIENTS = 8
PUBLISHER_SECONDS = 3.0
PUBLISHER_WARMUP = 20
"""Epochs a publisher sends (and flushes) before its timed run."""
RECORDS = 1000
"""Records per message (one message per epoch) in the publisher runs."""
TARGET_ACK_P99_MS = 10.0
TARGET_PUBLISHER_RATIO = 0.85
OUT = RESULTS / "catalog_stores.json"
TOPIC = "cs"
MAX_ERRORS = 50
"""A client stops its run after this many failed calls (each is counted, not timed)."""


# =============================================================================================
# statistics

def _pct(v: list, q: float) -> float:
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def _spread(values) -> dict | None:
    """``{"median", "min", "max", "n"}`` of ``values`` (``None`` left out), or ``None``."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _rounded(d, nd: int = 3):
    if isinstance(d, dict):
        return {k: _rounded(v, nd) for k, v in d.items()}
    if isinstance(d, list):
        return [_rounded(v, nd) for v in d]
    if isinstance(d, float):
        return round(d, nd)
    return d


# =============================================================================================
# CPU of the machine and of the PostgreSQL server

_TCK = os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """``(busy seconds of all cores, wall seconds)`` from ``/proc/stat`` (for the cores other
    work used during a cell)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return (sum(vals[:8]) - idle) / _TCK, time.monotonic()


def _busy_cores(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Cores busy on average between two :func:`_machine_busy` samples."""
    return (b[0] - a[0]) / max(1e-9, b[1] - a[1])


def _tree_cpu(root: int | None) -> float | None:
    """CPU seconds (user + system) of process ``root`` and its children (the postmaster and its
    backends), or ``None``."""
    if root is None:
        return None
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(d) == root or int(rest[1]) == root:
            total += int(rest[11]) + int(rest[12])
    return total / _TCK


# =============================================================================================
# one client (a thread here, or a worker process)

def _client(location: str, op: str, idx: int, root: str, warmup: int):
    """Open ``idx``'s own catalog, set up what ``op`` needs, make ``warmup`` calls; return
    ``(catalog, call, next_i)`` where ``call(i)`` is one operation."""
    from epochstream import Catalog
    from epochstream.catalog.history import EpochRecord

    cat = Catalog(location)
    if op == "ack":
        name, holder = f"d{idx}", f"holder-{idx}-{os.getpid()}"
        cat.durable_claim(TOPIC, name, holder)

        def call(i):
            if not cat.durable_ack(TOPIC, name, holder, [i]):
                raise RuntimeError(f"durable_ack of {name} returned False (no longer held)")
    elif op == "renew":
        inc = cat.register_partition(TOPIC, idx, "tcp://127.0.0.1:9")

        def call(i):
            if not cat.heartbeat(TOPIC, idx, inc):
                raise RuntimeError(f"heartbeat of partition {idx} returned False")
    elif op == "commit":
        cat.history_begin(TOPIC, idx, os.path.join(root, "logs", str(idx)), [0], [0])

        def call(i):
            cat.history_commit(TOPIC, idx, epochs=[EpochRecord(idx, i, 0, ((i * 10, 10),), 10,
                                                               1, i, time.time())],
                               lower=[i + 1], upper=[i + 1], segment=0, committed=(i + 1) * 10)
    elif op == "lookup":
        cat.register_partition(TOPIC, idx, "tcp://127.0.0.1:9")

        def call(i):
            cat.lookup(TOPIC)
    else:
        raise ValueError(f"unknown operation {op!r}")
    for i in range(warmup):
        call(i)
    return cat, call, warmup


def _loop(call, i: int, t0: float, deadline: float) -> dict:
    """Call ``call`` from ``t0`` (``time.monotonic``) until ``deadline``; the wall time of every
    successful call (s, an ``array('d')``), errors counted."""
    mono, pc = time.monotonic, time.perf_counter
    if t0 - mono() > 0.002:
        time.sleep(t0 - mono() - 0.002)
    while mono() < t0:
        pass
    lat = array("d")
    errors, first_error = 0, None
    b = pc()
    while True:
        a = pc()
        try:
            call(i)
        except Exception as e:  # noqa: BLE001 - counted and reported, the run goes on
            errors += 1
            first_error = first_error or f"{type(e).__name__}: {str(e).splitlines()[0]}"
            if errors >= MAX_ERRORS:
                break
        else:
            b = pc()
            lat.append(b - a)
        i += 1
        if mono() >= deadline:
            break
    return {"lat": lat, "end": mono(), "errors": errors, "first_error": first_error}


# ---- worker processes

def _worker_main(conn) -> None:
    """A client process: ``("setup", location, op, idx, root, warmup)`` -> ``("ready",)``;
    ``("go", t0, deadline)`` -> ``("done", result)``; ``("close",)`` -> ``("closed",)``;
    ``None``: exit."""
    cat = call = None
    i = 0
    while True:
        msg = conn.recv()
        if msg is None:
            return
        try:
            if msg[0] == "setup":
                cat, call, i = _client(*msg[1:])
                conn.send(("ready",))
            elif msg[0] == "go":
                cpu0 = time.process_time()
                r = _loop(call, i, msg[1], msg[2])
                r["cpu_s"] = time.process_time() - cpu0
                r["lat"] = r["lat"].tobytes()
                conn.send(("done", r))
            elif msg[0] == "close":
                if cat is not None:
                    cat.close()
                cat = call = None
                conn.send(("closed",))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            cat = call = None
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class _Pool:
    """``n`` spawned client processes, reused by every process cell."""

    def __init__(self, n: int):
        ctx = mp.get_context("spawn")
        # the function of the imported module (not of ``__main__`` under ``python -m``)
        target = importlib.import_module(f"{__package__}.bench_catalog_stores")._worker_main
        self.conns, self.procs = [], []
        for _ in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=target, args=(b,), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)

    def recv(self, k: int, timeout: float = 120.0, want: str | None = None):
        conn, proc = self.conns[k], self.procs[k]
        deadline = time.monotonic() + timeout
        while not conn.poll(0.5):
            if not proc.is_alive():
                raise RuntimeError(f"client process {k} died (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"client process {k}: no answer within {timeout} s")
        msg = conn.recv()
        if msg[0] == "error":
            raise RuntimeError(f"client process {k}: {msg[1]}")
        if want is not None and msg[0] != want:
            raise RuntimeError(f"client process {k}: expected {want!r}, got {msg[0]!r}")
        return msg

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(Exception):
                c.send(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(2)


# =============================================================================================
# one cell

def _prepare(location: str, clients: int) -> None:
    from epochstream import Catalog

    with Catalog(location) as cat:
        cat.create_topic(TOPIC, partitions=clients)


def _threads(location: str, op: str, clients: int, seconds: float, root: str, warmup: int,
             server_pid: int | None) -> dict:
    """``clients`` threads of this process, each with its own catalog object."""
    ready = threading.Barrier(clients + 1)
    go = threading.Event()
    release = threading.Event()
    start: list = []
    results: list = [None] * clients
    setup_errors: list = []

    def client(idx):
        cat = None
        try:
            try:
                cat, call, i = _client(location, op, idx, root, warmup)
            except BaseException as e:  # noqa: BLE001
                setup_errors.append(f"client {idx}: {type(e).__name__}: {e}")
                ready.wait()
                return
            ready.wait()
            go.wait()
            results[idx] = _loop(call, i, *start)
            release.wait()
        finally:
            if cat is not None:
                cat.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    if setup_errors:
        start.extend([0.0, 0.0])  # the clients that are ready make one call and end
        release.set()
        go.set()
        for t in threads:
            t.join(30)
        raise RuntimeError("; ".join(setup_errors[:3]))
    t0 = time.monotonic() + 0.02
    start.extend([t0, t0 + seconds])
    srv0, busy0, cpu0 = _tree_cpu(server_pid), _machine_busy(), time.process_time()
    go.set()
    while any(r is None for r in results) and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    cpu = time.process_time() - cpu0
    srv1, busy1 = _tree_cpu(server_pid), _machine_busy()
    release.set()
    for t in threads:
        t.join(60)
    if any(r is None for r in results):
        raise RuntimeError("a client thread ended without a result")
    return _cell_result(results, t0, cpu, None if srv0 is None else srv1 - srv0,
                        _busy_cores(busy0, busy1))


def _processes(pool: _Pool, location: str, op: str, clients: int, seconds: float, root: str,
               warmup: int, server_pid: int | None) -> dict:
    """``clients`` worker processes of ``pool``, one client each."""
    ks = range(clients)
    for k in ks:
        pool.conns[k].send(("setup", location, op, k, root, warmup))
    errors = []
    for k in ks:
        try:
            pool.recv(k, want="ready")
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0])
    if errors:
        for k in ks:
            pool.conns[k].send(("close",))
        for k in ks:
            with contextlib.suppress(Exception):
                pool.recv(k)
        raise RuntimeError("; ".join(errors[:3]))
    t0 = time.monotonic() + 0.05
    srv0, busy0 = _tree_cpu(server_pid), _machine_busy()
    for k in ks:
        pool.conns[k].send(("go", t0, t0 + seconds))
    results = []
    for k in ks:
        r = pool.recv(k, timeout=seconds + 120, want="done")[1]
        lat = array("d")
        lat.frombytes(r["lat"])
        r["lat"] = lat
        results.append(r)
    srv1, busy1 = _tree_cpu(server_pid), _machine_busy()
    for k in ks:
        pool.conns[k].send(("close",))
    for k in ks:
        pool.recv(k, want="closed")
    return _cell_result(results, t0, sum(r["cpu_s"] for r in results),
                        None if srv0 is None else srv1 - srv0, _busy_cores(busy0, busy1))


def _cell_result(results: list, t0: float, cpu: float, server_cpu: float | None,
                 busy: float) -> dict:
    lat = sorted(x for r in results for x in r["lat"])
    n = len(lat)
    wall = max(r["end"] for r in results) - t0
    errors = sum(r["errors"] for r in results)
    first = next((r["first_error"] for r in results if r["first_error"]), None)
    if n == 0:
        return {"ok": False, "error": first or "no call completed", "errors": errors}
    out = {"ok": errors == 0, "ops": n, "seconds": wall, "ops_per_s": n / wall,
           "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
           "max_ms": lat[-1] * 1e3, "mean_ms": sum(lat) / n * 1e3,
           "per_client_ops": [len(r["lat"]) for r in results],
           "cpu_us_per_op": cpu / n * 1e6, "client_cpu_cores": cpu / wall,
           "server_cpu_us_per_op": None if server_cpu is None else server_cpu / n * 1e6,
           "server_cpu_cores": None if server_cpu is None else server_cpu / wall,
           "machine_busy_cores": busy, "errors": errors}
    if errors:
        out["error"] = first
    return out


def run_cell(store: str, op: str, clients: int, mode: str, seconds: float, *, pg=None,
             pool: _Pool | None = None, root: str, name: str, warmup: int = WARMUP) -> dict:
    """One cell on a fresh catalog (a new SQLite file under ``root``, or a new database
    ``name`` on ``pg``); the row (``ok``, ``ops_per_s``, ``p50_ms``, ``p99_ms``, CPU, ...)."""
    cell_dir = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    location = None
    t_cell = time.monotonic()
    try:
        if store == "sqlite":
            location = os.path.join(cell_dir, "catalog.sqlite")
            server_pid = None
        else:
            location = pg.create_database(name)
            server_pid = pg.pid
        _prepare(location, clients)
        if mode == "threads":
            r = _threads(location, op, clients, seconds, cell_dir, warmup, server_pid)
        else:
            r = _processes(pool, location, op, clients, seconds, cell_dir, warmup, server_pid)
    except Exception as e:  # noqa: BLE001 - one failed cell must not hide the others
        r = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    finally:
        if store == "postgresql" and location is not None:
            _drop_database(pg, name)
        shutil.rmtree(cell_dir, ignore_errors=True)
    return {"store": store, "op": op, "clients": clients, "mode": mode, **r,
            "cell_wall_s": time.monotonic() - t_cell}


def _drop_database(pg, name: str) -> None:
    from psycopg import sql

    with contextlib.suppress(Exception):
        pg.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# =============================================================================================
# the retention publisher

def _records() -> list:
    return [{"id": i, "key": f"k{i % 100}", "value": i * 0.5} for i in range(RECORDS)]


def publisher_run(store: str, location: str, seconds: float, log_dir: str,
                  server_pid: int | None = None, warmup: int = PUBLISHER_WARMUP) -> dict:
    """One publisher on a fresh catalog: ``warmup`` epochs (flushed), then epochs of one message
    of :data:`RECORDS` records each followed by ``advance_to(e + 1)`` for ``seconds``, then
    ``flush()`` (every epoch logged and indexed): records/s over that wall time."""
    from epochstream import Catalog, Publisher, Retention

    records = _records()
    out = {"store": store}
    pub = cat = None
    try:
        cat = Catalog(location)
        pub = Publisher("bench", catalog=cat, retention=Retention(dir=log_dir))
        send, advance = pub.send, pub.advance_to
        for e in range(warmup):
            send(e, records)
            advance(e + 1)
        if not pub.flush(60):
            raise TimeoutError("warm-up flush did not finish in 60 s")
        e = e0 = warmup
        adv = array("d")
        pc = time.perf_counter
        srv0, busy0, cpu0 = _tree_cpu(server_pid), _machine_busy(), time.process_time()
        t0 = time.monotonic()
        end = t0 + seconds
        while True:
            send(e, records)
            a = pc()
            advance(e + 1)
            adv.append(pc() - a)
            e += 1
            if time.monotonic() >= end:
                break
        if not pub.flush(120):
            raise TimeoutError("flush did not finish in 120 s")
        wall = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        srv1, busy1 = _tree_cpu(server_pid), _machine_busy()
        epochs = e - e0
        adv_sorted = sorted(adv)
        out.update({
            "ok": True, "epochs": epochs, "records": epochs * RECORDS, "seconds": wall,
            "records_per_s": epochs * RECORDS / wall, "epochs_per_s": epochs / wall,
            "advance_to_p50_ms": _pct(adv_sorted, 0.5) * 1e3,
            "advance_to_p99_ms": _pct(adv_sorted, 0.99) * 1e3,
            "cpu_us_per_epoch": cpu / epochs * 1e6, "client_cpu_cores": cpu / wall,
            "server_cpu_us_per_epoch": None if srv0 is None else (srv1 - srv0) / epochs * 1e6,
            "machine_busy_cores": _busy_cores(busy0, busy1)})
    except Exception as e:  # noqa: BLE001
        out.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
    finally:
        if pub is not None:
            with contextlib.suppress(Exception):
                pub.close(linger=0, wait=True)
        if cat is not None:
            with contextlib.suppress(Exception):
                cat.close()
    return out


# =============================================================================================
# the whole case

def _versions(pg) -> dict:
    import sqlite3
    out = {"nproc": os.cpu_count(),
           "nproc_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else None,
           "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    try:
        import psycopg
        out["psycopg"] = psycopg.__version__
        out["libpq"] = psycopg.pq.version()
        out["psycopg_impl"] = psycopg.pq.__impl__
        with psycopg.connect(pg.url, connect_timeout=10) as conn:
            out["postgresql_server"] = conn.execute("SHOW server_version").fetchone()[0]
            out["postgresql_settings"] = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in
                                          ("fsync", "synchronous_commit", "full_page_writes",
                                           "wal_sync_method", "shared_buffers")}
    except Exception as e:  # noqa: BLE001
        out["psycopg_error"] = f"{type(e).__name__}: {e}"
    return out


def _pair_ratios(rows: list, key: str) -> list[float]:
    """Per repeat, PostgreSQL / SQLite of ``key``, over the pairs whose two cells both completed
    calls (a cell with some failed calls still counts: its ``errors`` say how many)."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["repeat"], {})[r["store"]] = r
    return [p["postgresql"][key] / p["sqlite"][key] for _, p in sorted(by.items())
            if p.get("postgresql", {}).get(key) and p.get("sqlite", {}).get(key)]


def _summarise(rows: list, configs: list) -> dict:
    cells: dict = {}
    ratios: dict = {}
    for op in sorted({r["op"] for r in rows}, key=OPS.index):
        for mode, n in configs:
            sel = [r for r in rows if r["op"] == op and r["clients"] == n and r["mode"] == mode]
            if not sel:
                continue
            key = f"{op} {mode} x{n}"
            cells[key] = {}
            for store in STORES:
                s = [r for r in sel if r["store"] == store and r.get("ops")]
                cells[key][store] = {
                    m: _spread([r.get(m) for r in s])
                    for m in ("ops_per_s", "p50_ms", "p99_ms", "cpu_us_per_op",
                              "server_cpu_us_per_op", "client_cpu_cores", "machine_busy_cores")}
                cells[key][store]["runs_with_errors"] = sum(1 for r in sel if r["store"] == store
                                                            and not r.get("ok"))
                cells[key][store]["failed_calls"] = sum(r.get("errors") or 0 for r in sel
                                                        if r["store"] == store)
            ratios[key] = paired.summary(_pair_ratios(sel, "ops_per_s"))
    return {"cells": cells, "ratio_postgresql_over_sqlite_ops_per_s": ratios}


def _verdicts(rows: list, pub_rows: list, fsync_rows: list, clients: int) -> dict:
    """The two targets, each judged on its worst pair. ``ack_p99_postgresql``: the largest p99
    of the PostgreSQL ack cells at ``clients`` clients (server fsync off), per client mode; met
    only if every mode's worst cell meets it. ``with_fsync_on``: the single run on a server with
    fsync on (reported beside it, judged the same way)."""
    modes = {}
    for mode in ("threads", "processes"):
        p99 = [r["p99_ms"] for r in rows if r["op"] == "ack" and r["store"] == "postgresql"
               and r["clients"] == clients and r["mode"] == mode and r.get("ops")]
        if p99:
            modes[mode] = {"worst_pair_p99_ms": max(p99), "p99_ms_per_repeat": p99,
                           "met": max(p99) <= TARGET_ACK_P99_MS}
    fs = next((r for r in fsync_rows if r.get("ops")), None)
    ack = {"target_ms": TARGET_ACK_P99_MS, "clients": clients, "server_fsync": "off",
           "by_mode": modes, "met": bool(modes) and all(m["met"] for m in modes.values()),
           "with_fsync_on": None if fs is None else {
               "mode": fs["mode"], "runs": 1, "p99_ms": fs["p99_ms"], "p50_ms": fs["p50_ms"],
               "ops_per_s": fs["ops_per_s"], "met": fs["p99_ms"] <= TARGET_ACK_P99_MS}}
    rat = paired.pair_ratios(pub_rows, "postgresql", "sqlite", key="records_per_s")
    s = paired.summary(rat)
    return {"ack_p99_postgresql": ack, "publisher_postgresql_over_sqlite": {
        "target": TARGET_PUBLISHER_RATIO, "records_per_message": RECORDS,
        "worst_pair": None if s is None else s["min"], "ratios": rat,
        "met": s is not None and s["min"] >= TARGET_PUBLISHER_RATIO}}


def _threads_vs_processes(rows: list, configs: list) -> dict:
    """At each client count run both ways: processes' / threads' median throughput, and the
    client CPU (cores) of the thread cells; threads count as GIL-bound where processes were
    > 10 % faster."""
    out = {}
    counts = sorted({n for m, n in configs if m == "processes"} & {n for m, n in configs
                                                                  if m == "threads"})
    for n in counts:
        for op in OPS:
            for store in STORES:
                def med(mode, key):
                    return median([r.get(key) for r in rows if r["op"] == op and r["store"] == store
                                   and r["clients"] == n and r["mode"] == mode and r.get("ops")])
                th, pr = med("threads", "ops_per_s"), med("processes", "ops_per_s")
                if th is None or pr is None:
                    continue
                out[f"{op} {store} x{n}"] = {
                    "processes_over_threads_ops_per_s": pr / th,
                    "threads_client_cpu_cores": med("threads", "client_cpu_cores"),
                    "processes_client_cpu_cores": med("processes", "client_cpu_cores"),
                    "threads_p99_ms": med("threads", "p99_ms"),
                    "processes_p99_ms": med("processes", "p99_ms"),
                    "threads_gil_bound": pr / th > 1.10}
    return out


def _clients_note(concurrency, process_concurrency, tvp: dict) -> str:
    """Which client modes ran and why, with the measured evidence (``threads_vs_processes``)."""
    at = ", ".join(map(str, process_concurrency)) or "no"
    gil = sorted(k for k, v in tvp.items() if v["threads_gil_bound"])
    cores = {k: v["threads_client_cpu_cores"] for k, v in tvp.items()}
    text = (f"threads of this process at {'/'.join(map(str, concurrency))} clients (each its own "
            "Catalog object: its own SQLite connection, its own PostgreSQL connection pool); at "
            f"{at} clients also separate processes (a pool of spawned workers, one client each), "
            "in every repeat, paired like the thread cells. Chosen: both, because thread clients "
            "share one GIL (the catalog's Python -- SQL text, encoding, psycopg's result "
            "handling -- runs under it; only SQLite's C calls and waits on the socket release "
            "it), so a thread cell may measure the client's Python rather than the store; "
            "processes remove that limit but compete for the same cores with each other and "
            "the PostgreSQL server. Threads count as GIL-bound where the processes were > 10 % "
            f"faster at the same client count (threads_vs_processes): {gil or 'none'}. ")
    if tvp:
        text += ("Client CPU of the thread cells (cores, median): " + ", ".join(
            f"{k} {_fmt(v)}" for k, v in cores.items()) + ". ")
    if tvp and not gil:
        text += ("Where that is near one core (the client's own work is large: renew, lookup; "
                 "SQLite's lookup also runs C code outside the GIL, hence > 1) separate processes "
                 "were not faster either, so the machine's cores (shared with the PostgreSQL "
                 "server), not the GIL, limit those cells: the thread cells stand, the process "
                 "cells are reported beside them.")
    elif gil:
        text += f"For {gil} read the process cells: the thread cells are limited by the GIL."
    return text


def _fmt(x, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _fmt_spread(s, nd=1) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.{nd}f} ({s['min']:.{nd}f}-{s['max']:.{nd}f})"


def _summary_text(summary: dict, verdicts: dict, pub: dict, tvp: dict) -> list[str]:
    lines = []
    ack = verdicts["ack_p99_postgresql"]
    modes = ", ".join(f"{m} {v['worst_pair_p99_ms']:.2f} ms" for m, v in ack["by_mode"].items())
    fs = ack["with_fsync_on"]
    lines.append(f"target ack p99 <= {TARGET_ACK_P99_MS:g} ms on PostgreSQL at {ack['clients']} "
                 f"clients (server fsync off, worst pair): {modes or 'not measured'} -> "
                 f"{'MET' if ack['met'] else 'NOT MET'}; with fsync on (one {fs['mode'] if fs else ''} "
                 f"run): p99 {'n/a' if fs is None else format(fs['p99_ms'], '.2f')} ms -> "
                 f"{'met' if fs and fs['met'] else 'not met'}")
    pv = verdicts["publisher_postgresql_over_sqlite"]
    s = pub.get("ratio_postgresql_over_sqlite")
    lines.append(f"target retention publisher on PostgreSQL >= {TARGET_PUBLISHER_RATIO}x SQLite "
                 f"({RECORDS} records/message): ratio {_fmt_spread(s, 3)}, worst pair "
                 f"{'n/a' if pv['worst_pair'] is None else round(pv['worst_pair'], 3)} -> "
                 f"{'MET' if pv['met'] else 'NOT MET'}; records/s SQLite "
                 f"{_fmt_spread(pub['records_per_s'].get('sqlite'), 0)}, PostgreSQL "
                 f"{_fmt_spread(pub['records_per_s'].get('postgresql'), 0)}")
    for key, cell in summary["cells"].items():
        r = summary["ratio_postgresql_over_sqlite_ops_per_s"].get(key)
        parts = []
        for store in STORES:
            c = cell[store]
            parts.append(f"{store} {_fmt_spread(c['ops_per_s'], 0)} ops/s p50 "
                         f"{_fmt_spread(c['p50_ms'], 2)} p99 {_fmt_spread(c['p99_ms'], 2)} ms")
        lines.append(f"{key}: " + "; ".join(parts) + f"; pg/sqlite {_fmt_spread(r, 2)}")
    gil = [k for k, v in tvp.items() if v["threads_gil_bound"]]
    if tvp:
        lines.append(f"threads vs processes: processes > 10 % faster than threads for {gil or 'none'}")
    return lines


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(quick: bool = False, log=print, *, seconds: float | None = None,
        repeats: int | None = None, concurrency=CONCURRENCY,
        process_concurrency=PROCESS_CONCURRENCY, ops=OPS, process_ops=None,
        warmup: int = WARMUP,
        publisher_seconds: float | None = None, publisher_warmup: int = PUBLISHER_WARMUP,
        fsync_check: bool = True, fsync_clients: int = FSYNC_CLIENTS) -> dict:
    """The whole case (module docstring); the keyword arguments shrink it (the smoke test)."""
    from epochstream.testing.postgres import PostgresServer

    seconds = seconds if seconds is not None else (SECONDS_QUICK if quick else SECONDS) * paired.scale()
    repeats = repeats if repeats is not None else int(os.environ.get("BENCH_REPEATS", REPEATS))
    publisher_seconds = (publisher_seconds if publisher_seconds is not None
                         else (SECONDS_QUICK if quick else PUBLISHER_SECONDS) * paired.scale())
    configs = [("threads", n) for n in concurrency] + [("processes", n) for n in process_concurrency]
    process_ops = tuple(ops if process_ops is None else process_ops)
    t_all = time.monotonic()
    root = tempfile.mkdtemp(prefix="es-bench-catalog-stores-")
    pg = pool = None
    rows: list = []
    pub_rows: list = []
    fsync_rows: list = []
    try:
        with _env(EPOCHSTREAM_HOME=os.path.join(root, "home")):
            pg = PostgresServer()
            versions = _versions(pg)
            if process_concurrency:
                pool = _Pool(max(process_concurrency))
            cell_no = 0
            for rep in range(repeats):
                for op in ops:
                    for mode, n in configs:
                        if mode == "processes" and op not in process_ops:
                            continue
                        pair = {}
                        for store in STORES:
                            cell_no += 1
                            r = run_cell(store, op, n, mode, seconds, pg=pg, pool=pool, root=root,
                                         name=f"c{cell_no}", warmup=warmup)
                            r["variant"], r["repeat"] = store, rep
                            rows.append(r)
                            pair[store] = r
                        log(f"  #{rep} {op:6s} {mode:9s} x{n:<2d} " + "  ".join(
                            f"{s}: {p['ops_per_s']:8.0f} ops/s p50 {p['p50_ms']:7.3f} p99 "
                            f"{p['p99_ms']:8.3f} ms" if p.get("ops") else f"{s}: FAILED {p.get('error')}"
                            for s, p in pair.items())
                            + ("" if all(p.get("ok") for p in pair.values()) else
                               "  (errors: " + "; ".join(f"{s} {p.get('errors')} {p.get('error')}"
                                                         for s, p in pair.items() if not p.get("ok")) + ")"))
            for rep in range(repeats):
                for store in STORES:
                    d = tempfile.mkdtemp(prefix=f"pub-{store}-", dir=root)
                    name = f"p{rep}"
                    loc = os.path.join(d, "catalog.sqlite") if store == "sqlite" else pg.create_database(name)
                    r = publisher_run(store, loc, publisher_seconds, os.path.join(d, "logs"),
                                      None if store == "sqlite" else pg.pid, warmup=publisher_warmup)
                    if store == "postgresql":
                        _drop_database(pg, name)
                    shutil.rmtree(d, ignore_errors=True)
                    r["variant"], r["repeat"] = store, rep
                    pub_rows.append(r)
                    log(f"  #{rep} publisher {store:10s}: " + (
                        f"{r['records_per_s']:10.0f} records/s ({r['epochs_per_s']:.0f} epochs/s, "
                        f"advance_to p99 {r['advance_to_p99_ms']:.3f} ms)" if r.get("ok")
                        else f"FAILED {r.get('error')}"))
            if fsync_check and "ack" in ops:
                pg_sync = PostgresServer(fsync=True)
                try:
                    r = run_cell("postgresql", "ack", fsync_clients, "threads", seconds,
                                 pg=pg_sync, root=root, name="fsync_ack", warmup=warmup)
                    r["postgresql_fsync"] = True
                    fsync_rows.append(r)
                    log(f"  ack threads x{fsync_clients} on PostgreSQL with fsync on (once): " + (
                        f"{r['ops_per_s']:.0f} ops/s p50 {r['p50_ms']:.3f} p99 "
                        f"{r['p99_ms']:.3f} ms" if r.get("ops") else f"FAILED {r.get('error')}"))
                finally:
                    pg_sync.close()
            sqlite_storage = _storage(root)
    finally:
        if pool is not None:
            pool.close()
        if pg is not None:
            pg.close()
        shutil.rmtree(root, ignore_errors=True)

    summary = _summarise(rows, configs)
    pub = {"records_per_s": {s: _spread([r.get("records_per_s") for r in pub_rows
                                          if r["store"] == s and r.get("ok")]) for s in STORES},
           "advance_to_p99_ms": {s: _spread([r.get("advance_to_p99_ms") for r in pub_rows
                                             if r["store"] == s and r.get("ok")]) for s in STORES},
           "cpu_us_per_epoch": {s: _spread([r.get("cpu_us_per_epoch") for r in pub_rows
                                            if r["store"] == s and r.get("ok")]) for s in STORES},
           "ratio_postgresql_over_sqlite": paired.summary(paired.pair_ratios(
               pub_rows, "postgresql", "sqlite", key="records_per_s"))}
    verdicts = _verdicts(rows, pub_rows, fsync_rows, fsync_clients)
    tvp = _threads_vs_processes(rows, configs)
    notes = {
        "postgresql_fsync": "off (PostgresServer's default: fsync = off, full_page_writes = off, "
                            "synchronous_commit = on). This flatters PostgreSQL's commit "
                            "latency (ack, commit) against SQLite, which fsyncs every ack and "
                            "index commit on the local disk; the ack cell at "
                            f"{fsync_clients} clients also ran once on a server with fsync on "
                            "(fsync_on).",
        "clients": _clients_note(concurrency, process_concurrency, tvp),
        "latency": "wall time of each call inside its client (perf_counter); in thread cells it "
                   "includes waiting for the GIL. Failed calls are counted (errors), not timed.",
        "throughput": "successful calls of all clients / (last client's end - common start).",
        "cpu": "cpu_us_per_op: CPU of the client process (threads) or the sum of the client "
               "processes, per call; server_cpu_us_per_op: the PostgreSQL postmaster and its "
               "backends (from /proc), per call; machine_busy_cores: all cores' busy time "
               "during the cell / wall time (what this machine spent, other work included).",
        "sqlite": "a fresh catalog file per cell in a temporary directory on the local disk "
                  "(storage); ack and commit commit with fsync (synchronous=FULL), renew "
                  "(heartbeat) with synchronous=NORMAL (no fsync), lookup opens a connection "
                  "per call (the implementation's read path).",
        "postgresql": "one throwaway server (epochstream.testing.postgres) on 127.0.0.1 over "
                      "TCP, a fresh database per cell (dropped after it); catalog writes (ack, "
                      "commit) take the catalog's advisory write lock (one writer at a time, as "
                      "on SQLite), heartbeat is one autocommit UPDATE.",
        "machine": f"{os.cpu_count()} cores, shared by the clients, the PostgreSQL server and "
                   "other work on this machine (tests of other sessions may run concurrently: "
                   "see machine_busy_cores and loadavg).",
    }
    result = {
        "case": "catalog_stores", "benchmark": "catalog_stores", "quick": quick,
        "parameters": {"seconds_per_cell": seconds, "repeats": repeats, "warmup_calls": warmup,
                       "ops": list(ops), "stores": list(STORES),
                       "thread_concurrency": list(concurrency),
                       "process_concurrency": list(process_concurrency),
                       "process_ops": list(process_ops),
                       "topic_partitions": "= clients (client k uses partition k / durable dk)",
                       "order": "per repeat, per op, per client configuration: sqlite cell then "
                                "postgresql cell",
                       "publisher_seconds": publisher_seconds, "publisher_warmup_epochs":
                           publisher_warmup, "publisher_records_per_message": RECORDS,
                       "publisher_messages_per_epoch": 1,
                       "publisher_record": _records()[1],
                       "fsync_check_clients": fsync_clients if fsync_check else None,
                       "targets": {"ack_p99_ms_postgresql_8_clients": TARGET_ACK_P99_MS,
                                   "publisher_postgresql_over_sqlite": TARGET_PUBLISHER_RATIO}},
        "postgresql_fsync": False, "postgresql_fsync_note": notes["postgresql_fsync"],
        "notes": notes,
        "summary": _summary_text(summary, verdicts, pub, tvp) + [
            f"PostgreSQL ran with fsync off (flatters its ack/commit latency; SQLite fsyncs "
            f"acks and commits); machine: {os.cpu_count()} cores shared by the clients, the "
            f"PostgreSQL server and other work (median busy cores during the cells "
            f"{_fmt_spread(_spread([r.get('machine_busy_cores') for r in rows]), 2)}, load "
            f"average at the end {[round(x, 2) for x in os.getloadavg()]})"],
        "targets": verdicts,
        "cells": summary["cells"],
        "ratio_postgresql_over_sqlite_ops_per_s": summary["ratio_postgresql_over_sqlite_ops_per_s"],
        "threads_vs_processes": tvp,
        "fsync_on": fsync_rows,
        "publisher": pub,
        "publisher_rows": pub_rows,
        "rows": rows,
        "machine": {**versions, "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "machine_info": machine_info(),
        "storage": sqlite_storage,
        "library": _library(),
        "ok": all(r.get("ok") for r in rows + pub_rows + fsync_rows),
        "wall_s": round(time.monotonic() - t_all, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return _rounded(result, 4)


def write(result: dict, path: Path | str = OUT) -> Path:
    """Write ``result`` as JSON to ``path`` (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_catalog_stores",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{SECONDS_QUICK} s cells instead of {SECONDS} s")
    ap.add_argument("--out", default=str(OUT), help=f"result file (default {OUT})")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    result = run(quick=args.quick, log=lambda m: print(m, flush=True))
    path = write(result, args.out)
    print("\n".join(result["summary"]))
    print(f"total {time.monotonic() - t0:.1f} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
