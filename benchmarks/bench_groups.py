"""Case ``groups`` (issue 12): consumer groups (:class:`~epochstream.EpochGroup`) with worker
processes sharing the epochs of one topic through one catalog.

Every worker is its own process (``multiprocessing`` spawn, a pool kept for the whole case, so
process start-up is outside every measurement); the catalog and the epoch log are in a fresh
temporary directory per run (on the machine's disk, see ``storage`` in the result). The topic's
publisher is a process of its own with ``retention=Retention(fsync="none")`` (the group reads
the log; the fsync policy is a publisher-side cost, measured by the ``history`` case). It keeps
the backlog bounded: it publishes an epoch (``RECORDS_PER_EPOCH`` msgpack tuples,
``advance_to(e + 1)``) whenever fewer than ``LEAD`` published epochs are unacked, so the workers
never wait for data and a fetch sees about ``LEAD`` candidate epochs (a fetch's cost grows with
the backlog: measured apart, in-process, in ``backlog``).

1. **Scaling** (``shared`` mode): 1, 2 and 4 workers, each looping ``fetch(1)`` → ``sleep(work)``
   → ``ack()``, for ``work`` = 5 ms and 20 ms of sleep per epoch. Time-based: every worker starts
   at the same instant and stops fetching at the same deadline; an epoch counts if its ack
   returned before the deadline. Variants run in the same order in every repeat; per repeat and
   work time, speed-up = rate(k) ÷ rate(1) and efficiency = speed-up ÷ k (the ideal linear
   speed-up is k). Sleep is not CPU: sleeping workers scale past the machine's 2 cores until the
   coordination (fetch + ack, CPU in the workers and in SQLite) saturates them. Checked in every
   run: each epoch acked exactly once, whole (``RECORDS_PER_EPOCH`` records), and the acked epochs
   are exactly ``0 … n-1`` (shared mode leases the oldest free epoch).
2. **Latency of** ``Lease.ack()`` and ``EpochGroup.fetch(1)`` (wall time of the call in the
   worker, ``perf_counter``), median / p95 / p99 pooled over the repeats, from the same runs.
3. **Redelivery**: (a) a worker process leases the topic's only epoch with ``ack_wait`` =
   ``REDELIVERY_ACK_WAIT`` and keeps it; a second worker process polls ``fetch(1)``; delay = the
   moment its fetch returns the epoch − the first lease's deadline (``time.time()``, one clock),
   for ``poll_interval`` 0.01 s and 0.05 s (the default); the late ack of the first worker must be
   refused (fencing). (b) the same, but the holder (``ack_wait=30``) is a process killed with
   SIGKILL (and reaped at once, as a supervisor would); delay = return of the second worker's
   fetch − the ``kill``.
4. **Partial order** (``partial`` mode): ``product(2)`` times in ``CHAINS`` independent chains
   (chain ``c`` = ``(c·N + i, (CHAINS-1-c)·N + i)``, ``N = 10**9``: comparable within a chain,
   incomparable across chains), so at most ``CHAINS`` epochs may be in flight; 1 vs 2 workers with
   20 ms of work, paired; the ideal speed-up is 2. Checked: within a chain, no epoch is leased
   before the previous one's ack returned.
5. **Where a fetch and an ack spend their time**: a cProfile of an in-process worker looping
   ``fetch(1)`` + ``ack()`` (no work) with an in-process publisher refilling the backlog to
   ``LEAD``; per-call times of the catalog functions go to the result, the top functions to
   ``benchmarks/results/profile_groups_worker.txt``; and fetch/ack latency against backlog size
   (pre-published backlogs, in process).

``python -m benchmarks.bench_groups [--quick]`` runs the case alone.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as _queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .provenance import library as _library, storage as _storage
from . import RESULTS, median, paired

WORKS = (0.005, 0.020)           # seconds of sleep per epoch (the "work")
WORKERS = (1, 2, 4)
LEAD = 64                        # unacked published epochs the publisher keeps ahead
RECORDS_PER_EPOCH = 10
POLL = 0.01                      # the workers' poll_interval in the throughput runs
ACK_WAIT = 30.0
CHAINS = 2
CHAIN_OFFSET = 10 ** 9
PARTIAL_WORK = 0.020
PARTIAL_WORKERS = (1, 2)
REDELIVERY_ACK_WAIT = 0.2
REDELIVERY_POLLS = (0.01, 0.05)
BACKLOGS_FULL = (64, 1000, 4000)
BACKLOGS_QUICK = (64, 1000)

_ids = iter(range(1, 1 << 30))


def _pct(v: list, q: float):
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else None


def _dist_ms(vals) -> dict | None:
    """median / p95 / p99 / max / mean of seconds, in ms."""
    if not vals:
        return None
    v = sorted(vals)
    return {"n": len(v), "median_ms": _pct(v, 0.5) * 1e3, "p95_ms": _pct(v, 0.95) * 1e3,
            "p99_ms": _pct(v, 0.99) * 1e3, "max_ms": v[-1] * 1e3, "mean_ms": sum(v) / len(v) * 1e3}


def _chain_time(c: int, i: int, chains: int = CHAINS) -> tuple:
    return (c * CHAIN_OFFSET + i, (chains - 1 - c) * CHAIN_OFFSET + i)


def _records(t) -> list:
    tt = list(t) if isinstance(t, tuple) else [t]
    return [[*tt, j] for j in range(RECORDS_PER_EPOCH)]


# =============================================================================================
# processes: one publisher and a pool of workers, alive for the whole case

def _publisher_main(cmds, q, go, stop, acked):
    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        try:
            _feed(cmd, q, go, stop, acked)
        except BaseException as exc:
            q.put(("error", "publisher", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _feed(cfg, q, go, stop, acked):
    """Publish ``lead`` epochs, report ready, then keep ``published − acked < lead`` until
    ``stop``."""
    from epochstream import Catalog, Publisher, Retention
    chains = cfg.get("chains")
    lead = cfg["lead"]
    kw = {"order": "product(2)"} if chains else {}
    pub = Publisher(cfg["topic"], 0, catalog=Catalog(cfg["dir"]), retention=Retention(fsync="none"),
                    heartbeat_interval=1.0, **kw)
    step = 0
    published = 0
    if chains:  # one capability at the head of every chain
        pub.progress([(_chain_time(c, 0, chains), 1) for c in range(chains)] + [((0, 0), -1)])

    def one_step():
        nonlocal step, published
        if chains:
            for c in range(chains):
                pub.send(_chain_time(c, step, chains), _records(_chain_time(c, step, chains)))
            pub.progress([u for c in range(chains) for u in
                          ((_chain_time(c, step + 1, chains), 1), (_chain_time(c, step, chains), -1))])
            published += chains
        else:
            pub.send(step, _records(step))
            pub.advance_to(step + 1)
            published += 1
        step += 1

    while published < lead:
        one_step()
    q.put(("pub_ready", "publisher", published))
    go.wait(120)
    leads = []
    blocked = 0
    cpu0 = time.process_time()
    t0 = time.monotonic()
    while not stop.is_set():
        n = published - acked.value
        if n >= lead:
            blocked += 1
            time.sleep(0.0005)
            continue
        leads.append(n)
        one_step()
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - t0
    pub.close()
    leads.sort()
    q.put(("published", "publisher", {"epochs": published, "cpu_s": cpu, "wall_s": wall,
                                      "lead_at_publish_min": leads[0] if leads else None,
                                      "lead_at_publish_median": _pct(leads, 0.5),
                                      "lead_at_publish_p01": _pct(leads, 0.01),
                                      "blocked_checks": blocked}))


def _worker_main(wid, cmds, q, go, acked, clock):
    state = {}
    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        try:
            kind = cmd["cmd"]
            if kind == "throughput":
                _throughput(wid, cmd, q, go, acked, clock)
            elif kind == "hold":
                _hold(wid, cmd, q, state)
            elif kind == "ack_late":
                _ack_late(wid, q, state)
            elif kind == "wait_lease":
                _wait_lease(wid, cmd, q)
            else:
                raise ValueError(kind)
        except BaseException as exc:
            q.put(("error", f"worker {wid}", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _group(cfg, poll=None, ack_wait=None):
    from epochstream import Catalog, EpochGroup
    return EpochGroup(cfg["topic"], cfg["group"], Catalog(cfg["dir"]), mode=cfg["mode"],
                      ack_wait=ack_wait or cfg["ack_wait"], poll_interval=poll or cfg["poll"])


def _instrument(g) -> dict:
    """Wrap (on this worker's instances only, epochstream untouched) the calls a fetch and an
    ack make, accumulating their wall time: ``claim`` (``Catalog.group_claim``), ``settle``
    (``Catalog.group_settle``, the ack), ``records`` (``History.records``: the backlog's
    index), ``states`` (``History.states``), ``epoch`` (``EpochGroup._epoch``: read and decode
    the leased epoch), and inside every write transaction ``begin`` (new connection +
    ``BEGIN IMMEDIATE``, i.e. waiting for the catalog's write lock) and ``commit`` (``COMMIT``,
    an fsync of the WAL, and closing the connection). A few µs per call of overhead."""
    import contextlib
    perf = time.perf_counter
    acc = {k: 0.0 for k in ("claim", "settle", "records", "states", "epoch", "begin", "commit")}
    calls = {k: 0 for k in acc}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = perf()
            try:
                return fn(*a, **k)
            finally:
                acc[name] += perf() - t0
                calls[name] += 1
        return wrapper

    cat = g.catalog
    # the store's write transaction (issue 22: SqlCatalog holds its store; older: cat._write)
    owner = cat._store if hasattr(cat, "_store") and hasattr(cat._store, "write") else cat
    name = "write" if owner is not cat else "_write"
    orig_write = getattr(owner, name)

    @contextlib.contextmanager
    def timed_write(*a, **k):
        t0 = perf()
        with orig_write(*a, **k) as conn:
            acc["begin"] += perf() - t0
            calls["begin"] += 1
            yield conn
            t1 = perf()
        acc["commit"] += perf() - t1
        calls["commit"] += 1

    setattr(owner, name, timed_write)
    cat.group_claim = timed("claim", cat.group_claim)
    cat.group_settle = timed("settle", cat.group_settle)
    g.history.records = timed("records", g.history.records)
    g.history.states = timed("states", g.history.states)
    g._epoch = timed("epoch", g._epoch)
    return {"seconds": acc, "calls": calls}


def _throughput(wid, cfg, q, go, acked, clock):
    g = _group(cfg)
    parts = _instrument(g)
    q.put(("ready", wid, None))
    if not go.wait(120):
        raise TimeoutError("never started")
    t_start, t_end = clock[0], clock[1]
    mono, perf = time.monotonic, time.perf_counter
    while mono() < t_start:
        time.sleep(0.0002)
    work = cfg["work"]
    fetch_s, ack_s, acks, empty = [], [], [], 0
    cpu0 = time.process_time()
    while True:
        now = mono()
        if now >= t_end:
            break
        a = perf()
        leases = g.fetch(1, expires=max(0.01, t_end - now))
        b = perf()
        if not leases:
            empty += 1
            continue
        fetch_s.append(b - a)
        t_got = mono()
        for lease in leases:
            time.sleep(work)
            t_call = mono()
            a = perf()
            lease.ack()
            b = perf()
            ack_s.append(b - a)
            t_ack = mono()
            with acked.get_lock():
                acked.value += 1
            acks.append((lease.epoch.time, t_got, t_ack, lease.deliveries, len(lease.epoch.records), t_call))
    cpu = time.process_time() - cpu0
    q.put(("done", wid, {"fetch_s": fetch_s, "ack_s": ack_s, "acks": acks, "empty_fetches": empty,
                         "cpu_s": cpu, "parts": parts}))


def _hold(wid, cfg, q, state):
    g = _group(cfg)
    leases = g.fetch(1, expires=5.0)
    if not leases:
        raise RuntimeError("nothing to hold")
    state["lease"] = leases[0]
    q.put(("held", wid, {"deadline": leases[0].deadline, "token": leases[0].token,
                         "t": time.time()}))


def _ack_late(wid, q, state):
    from epochstream import LeaseExpired
    lease = state.pop("lease")
    try:
        lease.ack()
        refused = False
    except LeaseExpired:
        refused = True
    q.put(("late_ack", wid, {"refused": refused}))


def _wait_lease(wid, cfg, q):
    g = _group(cfg)
    q.put(("polling", wid, None))
    leases = g.fetch(1, expires=cfg["expires"])
    t = time.time()
    if not leases:
        q.put(("got", wid, {"t": t, "lease": None}))
        return
    lease = leases[0]
    lease.ack()
    q.put(("got", wid, {"t": t, "lease": {"time": lease.epoch.time, "deliveries": lease.deliveries,
                                          "token": lease.token}}))


class _Pool:
    def __init__(self, n_workers: int):
        self.ctx = mp.get_context("spawn")
        self.q = self.ctx.Queue()
        self.go = self.ctx.Event()
        self.stop = self.ctx.Event()
        self.acked = self.ctx.Value("q", 0)
        self.clock = self.ctx.RawArray("d", 2)
        self.pub_cmds = self.ctx.Queue()
        self.pub = self.ctx.Process(target=_publisher_main,
                                    args=(self.pub_cmds, self.q, self.go, self.stop, self.acked),
                                    daemon=True)
        self.pub.start()
        self.cmds = [self.ctx.Queue() for _ in range(n_workers)]
        self.workers = [self.ctx.Process(target=_worker_main,
                                         args=(i, self.cmds[i], self.q, self.go, self.acked, self.clock),
                                         daemon=True) for i in range(n_workers)]
        for p in self.workers:
            p.start()

    def get(self, timeout: float, want: str | None = None):
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.q.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except _queue.Empty:
                dead = [p for p in (self.pub, *self.workers) if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"a benchmark process died (exit code {dead[0].exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no report within {timeout} s" + (f" (waiting for {want})" if want else ""))
                continue
            if msg[0] == "error":
                raise RuntimeError(f"{msg[1]}: {msg[2]}")
            if want is not None and msg[0] != want:
                raise RuntimeError(f"expected {want!r}, got {msg[0]!r} from {msg[1]}")
            return msg

    def drain(self):
        while True:
            try:
                self.q.get(timeout=0.2)
            except _queue.Empty:
                return

    def close(self):
        self.pub_cmds.put(None)
        for c in self.cmds:
            c.put(None)
        for p in (self.pub, *self.workers):
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(2)


# =============================================================================================
# 1, 2, 4: throughput runs

def throughput_run(pool: _Pool, *, mode: str, work: float, workers: int, duration: float,
                   chains: int | None = None, base: str | None = None, time_limit: float = 60.0,
                   catalog: str | None = None) -> dict:
    """One time-based run: a fresh catalog (a SQLite file in a new directory, or ``catalog``,
    e.g. a new PostgreSQL database's URL), the pool's publisher feeding ``LEAD`` epochs ahead,
    ``workers`` pool workers in group ``mode``."""
    d = tempfile.mkdtemp(prefix="es-bench-groups-", dir=base)
    topic = f"jobs-{os.getpid()}-{next(_ids)}"
    cfg = {"dir": catalog or d, "topic": topic, "group": "g", "mode": mode, "work": work, "poll": POLL,
           "ack_wait": ACK_WAIT, "lead": LEAD, "chains": chains}
    row = {"mode": mode, "work_ms": work * 1e3, "workers": workers, "chains": chains,
           "duration_s": duration, "lead": LEAD, "records_per_epoch": RECORDS_PER_EPOCH,
           "poll_interval_s": POLL, "loadavg_before": round(os.getloadavg()[0], 2)}
    pool.go.clear()
    pool.stop.clear()
    pool.acked.value = 0
    pub_started = False
    try:
        pool.pub_cmds.put(cfg)
        pub_started = True
        pool.get(60, "pub_ready")
        for w in range(workers):
            pool.cmds[w].put(dict(cfg, cmd="throughput"))
        for _ in range(workers):
            pool.get(60, "ready")
        t0 = time.monotonic() + 0.05
        pool.clock[0], pool.clock[1] = t0, t0 + duration
        pool.go.set()
        got = []
        for _ in range(workers):
            got.append(pool.get(duration + time_limit, "done")[2])
        pool.stop.set()
        pub = pool.get(60, "published")[2]
        pub_started = False
        t_end = t0 + duration
        acks = sorted(a for r in got for a in r["acks"])
        times = [a[0] for a in acks]
        counted = [a for a in acks if a[2] <= t_end]
        errors = []
        if len(set(times)) != len(times):
            errors.append(f"{len(times) - len(set(times))} epoch(s) acked twice")
        if any(a[4] != RECORDS_PER_EPOCH for a in acks):
            errors.append("an epoch was not whole")
        if any(a[3] != 1 for a in acks):
            errors.append("an epoch was delivered more than once")
        violations = 0
        if chains:
            by_chain = {}
            for a in acks:
                by_chain.setdefault(a[0][0] // CHAIN_OFFSET, []).append(a)
            for c, xs in by_chain.items():
                xs.sort(key=lambda a: a[0])
                idx = [a[0][0] - c * CHAIN_OFFSET for a in xs]
                if idx != list(range(len(idx))):
                    errors.append(f"chain {c}: acked epochs are not 0..{len(idx) - 1}")
                # partial order: no epoch's fetch returned before its predecessor's ack was
                # called (sound: the claim precedes the return, the commit follows the call)
                violations += sum(1 for p, n in zip(xs, xs[1:]) if n[1] < p[5])
            row["acked_per_chain"] = {str(c): len(xs) for c, xs in sorted(by_chain.items())}
            if violations:
                errors.append(f"{violations} epoch(s) leased before their predecessor was acked")
        elif sorted(times) != list(range(len(times))):
            errors.append("acked epochs are not 0..n-1")
        in_flight = sum(min(a[2], t_end) - max(a[1], t0) for a in acks if a[1] < t_end) / duration
        fetch_s = [x for r in got for x in r["fetch_s"]]
        ack_s = [x for r in got for x in r["ack_s"]]
        n = len(counted)
        cpu = sum(r["cpu_s"] for r in got)
        parts = {k: sum(r["parts"]["seconds"][k] for r in got) for k in got[0]["parts"]["seconds"]}
        part_calls = {k: sum(r["parts"]["calls"][k] for r in got) for k in got[0]["parts"]["calls"]}
        row["ms_per_epoch"] = ({k: v / len(acks) * 1e3 for k, v in parts.items()} if acks else None)
        row["calls_per_epoch"] = ({k: v / len(acks) for k, v in part_calls.items()} if acks else None)
        row.update(ok=not errors and n > 0, epochs=n, epochs_acked_total=len(acks),
                   epochs_per_s=n / duration, per_worker=[sum(1 for a in r["acks"] if a[2] <= t_end) for r in got],
                   mean_in_flight=in_flight, empty_fetches=sum(r["empty_fetches"] for r in got),
                   fetch=_dist_ms(fetch_s), ack=_dist_ms(ack_s),
                   worker_cpu_ms_per_epoch=cpu / len(acks) * 1e3 if acks else None,
                   worker_cpu_s=round(cpu, 3), publisher=pub, order_violations=violations,
                   loadavg_after=round(os.getloadavg()[0], 2))
        row["_fetch_s"], row["_ack_s"] = fetch_s, ack_s  # pooled later, then dropped
        if errors:
            row["error"] = "; ".join(errors)
    except Exception as exc:
        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500], detail=str(exc)[-3000:])
        pool.stop.set()
        if pub_started:
            try:
                pool.get(30, "published")
            except Exception:
                pass
        pool.drain()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return row


# =============================================================================================
# 3: redelivery

_VICTIM = r"""
import json, sys, time
from epochstream import Catalog, EpochGroup
d, topic, name = sys.argv[1:4]
g = EpochGroup(topic, name, Catalog(d), mode="shared", ack_wait=30.0)
lease = g.fetch(1, expires=10)[0]
print(json.dumps({"deadline": lease.deadline, "token": lease.token}), flush=True)
time.sleep(600)
"""


def redelivery(pool: _Pool, samples: int, *, base: str | None = None, log=print) -> dict:
    """Expiry (``ack_wait=REDELIVERY_ACK_WAIT``) and SIGKILL redelivery delays, ``samples``
    per kind and poll interval, interleaved."""
    from epochstream import Catalog, Publisher, Retention
    d = tempfile.mkdtemp(prefix="es-bench-groups-redeliver-", dir=base)
    topic = "one"
    rows = []
    rng = random.Random(12)
    err = None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [_library()["dir"], os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    try:
        cat = Catalog(d)
        with Publisher(topic, catalog=cat, retention=Retention(fsync="none")) as pub:
            pub.send(0, _records(0))
            pub.advance_to(1)
        for i in range(samples):
            for kind in ("expiry", "kill"):
                for poll in REDELIVERY_POLLS:
                    name = f"{kind}-{poll}-{i}"
                    base_cfg = {"dir": d, "topic": topic, "group": name, "mode": "shared",
                                "poll": poll, "expires": 10.0}
                    row = {"kind": kind, "poll_interval_s": poll, "sample": i,
                           "loadavg_before": round(os.getloadavg()[0], 2)}
                    try:
                        if kind == "expiry":
                            cfg = dict(base_cfg, ack_wait=REDELIVERY_ACK_WAIT)
                            pool.cmds[0].put(dict(cfg, cmd="hold"))
                            held = pool.get(30, "held")[2]
                            pool.cmds[1].put(dict(cfg, cmd="wait_lease"))
                            pool.get(30, "polling")
                            got = pool.get(30, "got")[2]
                            pool.cmds[0].put({"cmd": "ack_late"})
                            late = pool.get(30, "late_ack")[2]
                            t_from = held["deadline"]
                            row["late_ack_refused"] = late["refused"]
                        else:
                            cfg = dict(base_cfg, ack_wait=30.0)
                            victim = subprocess.Popen([sys.executable, "-c", _VICTIM, d, topic, name],
                                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                      text=True, env=env)
                            try:
                                line = victim.stdout.readline()
                                held = json.loads(line)
                                pool.cmds[1].put(dict(cfg, cmd="wait_lease"))
                                pool.get(30, "polling")
                                time.sleep(rng.uniform(0.05, 0.1))  # the poller in its steady loop
                                t_from = time.time()
                                os.kill(victim.pid, signal.SIGKILL)
                                victim.wait(10)
                            finally:
                                if victim.poll() is None:
                                    victim.kill()
                                    victim.wait(10)
                            got = pool.get(30, "got")[2]
                        lease = got["lease"]
                        ok = (lease is not None and lease["deliveries"] == 2 and lease["token"] != held["token"]
                              and (kind == "kill" or row["late_ack_refused"]))
                        row.update(ok=ok, delay_ms=(got["t"] - t_from) * 1e3,
                                   deliveries=None if lease is None else lease["deliveries"])
                        if not ok:
                            row["error"] = f"unexpected redelivery: {lease}, late ack refused: {row.get('late_ack_refused')}"
                    except Exception as exc:
                        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500])
                        pool.drain()
                    rows.append(row)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    summary = []
    for kind in ("expiry", "kill"):
        for poll in REDELIVERY_POLLS:
            rs = [r for r in rows if r["kind"] == kind and r["poll_interval_s"] == poll]
            v = sorted(r["delay_ms"] for r in rs if r.get("ok"))
            s = {"kind": kind, "poll_interval_s": poll, "samples": len(rs),
                 "failed": sum(1 for r in rs if not r.get("ok"))}
            if v:
                s.update(median_ms=median(v), p95_ms=_pct(v, 0.95), min_ms=v[0], max_ms=v[-1])
            summary.append(s)
            if v:
                log(f"  redelivery after {kind:6s} (poll {poll * 1e3:.0f} ms): median {s['median_ms']:.1f} ms, "
                    f"p95 {s['p95_ms']:.1f} ms, {v[0]:.1f}–{v[-1]:.1f} ms, n={len(v)}, failed {s['failed']}")
    out = {"ack_wait_s": REDELIVERY_ACK_WAIT, "samples": samples, "rows": rows, "summary": summary,
           "ok": err is None and all(s["failed"] == 0 and s["samples"] == samples for s in summary)}
    if err:
        out["error"] = err
    return out


# =============================================================================================
# 5: profile and backlog

# (file suffix, function name) -> label; cumulative wall time per call of fetch / ack
_PROFILE_FUNCS = (
    ("group.py", "fetch", "EpochGroup.fetch (all)"),
    ("group.py", "ack", "Lease.ack (all)"),
    ("group.py", "_try", "EpochGroup._try (one attempt)"),
    ("history.py", "states", "History.states (catalog read)"),
    ("log/reader.py", "records", "History.records (index of the backlog)"),
    ("catalog/history.py", "history_epochs", "Catalog.history_epochs (SQL, per partition)"),
    ("catalog/history.py", "history_states", "Catalog.history_states (SQL)"),
    ("catalog/sqlcatalog.py", "lookup", "Catalog.lookup (SQL)"),
    ("catalog/groups.py", "group_claim", "Catalog.group_claim (BEGIN IMMEDIATE … COMMIT)"),
    ("catalog/groups.py", "_states", "group_claim: read the group's rows"),
    ("catalog/holders.py", "pid_alive", "pid_alive (psutil, per leased row)"),
    ("catalog/groups.py", "_set_position", "group_claim: store the position"),
    ("leases.py", "plan", "leases.plan"),
    ("leases.py", "group_position", "leases.group_position"),
    ("group.py", "_epoch", "EpochGroup._epoch (read + decode the epoch)"),
    ("log/format.py", "read_epoch", "read_epoch (segment read + crc)"),
    ("catalog/groups.py", "group_settle", "Catalog.group_settle (the ack's transaction)"),
    ("~", "<built-in method _sqlite3.connect>", "sqlite3.connect (a fresh connection)"),
    ("~", "<method 'execute' of 'sqlite3.Connection' objects>", "sqlite3 execute (all statements)"),
    ("~", "<method 'close' of 'sqlite3.Connection' objects>", "sqlite3 close"),
)


def _profile_funcs(st, calls_of) -> dict:
    funcs = {}
    for (fname, _line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():
        for suffix, name, label in _PROFILE_FUNCS:
            if func == name and (fname == suffix or fname.endswith("/" + suffix)):
                f = funcs.setdefault(label, {"calls": 0, "seconds": 0.0})
                f["calls"] += nc
                f["seconds"] += ct
    return {k: {"calls_per_fetch_ack": v["calls"] / calls_of, "us_per_fetch_ack": v["seconds"] / calls_of * 1e6}
            for k, v in funcs.items()}


def profile_worker(seconds: float = 2.0, out: Path | None = None, base: str | None = None) -> dict:
    """cProfile (wall clock) of ``fetch(1)`` + ``ack()`` in one process, ``shared`` mode, the
    backlog refilled to ``LEAD`` by an in-process publisher after every ack (its calls are in
    the profile too, but not in the per-call figures). Writes the top functions to ``out``."""
    import cProfile
    import io
    import pstats

    from epochstream import Catalog, EpochGroup, Publisher, Retention
    out = out or RESULTS / "profile_groups_worker.txt"
    d = tempfile.mkdtemp(prefix="es-bench-groups-prof-", dir=base)
    try:
        cat = Catalog(d)
        pub = Publisher("prof", catalog=cat, retention=Retention(fsync="none"))
        e = 0
        for e in range(LEAD):
            pub.send(e, _records(e))
            pub.advance_to(e + 1)
        e = LEAD
        g = EpochGroup("prof", "g", cat, poll_interval=POLL)
        prof = cProfile.Profile()
        n = 0
        t0 = time.monotonic()
        prof.enable()
        while time.monotonic() - t0 < seconds:
            lease = g.fetch(1)[0]
            lease.ack()
            n += 1
            pub.send(e, _records(e))
            pub.advance_to(e + 1)
            e += 1
        prof.disable()
        wall = time.monotonic() - t0
        pub.close()
        st = pstats.Stats(prof)
        result = {"seconds": seconds, "fetch_acks": n, "backlog": LEAD,
                  "us_per_iteration_profiled": wall / n * 1e6, "functions": _profile_funcs(st, n)}
        s = io.StringIO()
        st.stream = s
        st.sort_stats("tottime").print_stats(20)
        st.sort_stats("cumulative").print_stats(30)
        out.write_text(f"cProfile (wall clock) of one in-process EpochGroup worker, shared mode: fetch(1) + "
                       f"ack() with no work, the backlog refilled to {LEAD} epochs of {RECORDS_PER_EPOCH} "
                       f"tuples by an in-process publisher (Retention(fsync='none')) after every ack; "
                       f"{seconds:g} s, {n} fetch+ack, {wall / n * 1e6:.0f} µs per iteration "
                       f"(profiled); {time.strftime('%Y-%m-%d %H:%M')}, loadavg {os.getloadavg()[0]:.2f}\n\n"
                       + s.getvalue())
        result["file"] = (str(out.relative_to(RESULTS.parent.parent))
                          if out.is_relative_to(RESULTS.parent.parent) else str(out))
        return result
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sql_breakdown(iterations: int = 50, base: str | None = None) -> dict:
    """Wall time per SQLite statement of ``fetch(1)`` + ``ack()`` in one process (backlog
    ``LEAD``, no publisher running while measured): the catalog module's ``sqlite3.connect`` is
    swapped, for this measurement only, for one returning a connection subclass that times
    ``execute`` and ``close``. Returns ``{"statements": [{sql, calls, us} per iteration]}``."""
    import collections
    import re
    import sqlite3
    import types

    import epochstream.catalog.store as catalog_mod
    from epochstream import Catalog, EpochGroup, Publisher, Retention
    acc = collections.defaultdict(lambda: [0, 0.0])
    perf = time.perf_counter

    class TimedConnection(sqlite3.Connection):
        def execute(self, sql, *a):
            t0 = perf()
            try:
                return super().execute(sql, *a)
            finally:
                x = acc[re.sub(r"\s+", " ", sql.strip())[:90]]
                x[0] += 1
                x[1] += perf() - t0

        def close(self):
            t0 = perf()
            try:
                return super().close()
            finally:
                acc["<close a connection>"][0] += 1
                acc["<close a connection>"][1] += perf() - t0

    def connect(*a, **k):
        t0 = perf()
        c = sqlite3.connect(*a, factory=TimedConnection, **k)
        acc["<open a connection>"][0] += 1
        acc["<open a connection>"][1] += perf() - t0
        return c

    shim = types.SimpleNamespace(**{k: getattr(sqlite3, k) for k in dir(sqlite3) if not k.startswith("__")})
    shim.connect = connect
    d = tempfile.mkdtemp(prefix="es-bench-groups-sql-", dir=base)
    try:
        cat = Catalog(d)
        with Publisher("sql", catalog=cat, retention=Retention(fsync="none")) as pub:
            for e in range(LEAD + iterations):
                pub.send(e, _records(e))
                pub.advance_to(e + 1)
        g = EpochGroup("sql", "g", cat)
        g.fetch(1)[0].ack()  # warm
        cat._store.drop_hot()  # the thread's long-lived connection is opened again, through the shim
        real = catalog_mod.sqlite3
        catalog_mod.sqlite3 = shim
        try:
            t0 = perf()
            for _ in range(iterations):
                g.fetch(1)[0].ack()
            wall = perf() - t0
        finally:
            catalog_mod.sqlite3 = real
    finally:
        shutil.rmtree(d, ignore_errors=True)
    stm = [{"sql": k, "calls": v[0] / iterations, "us": v[1] / iterations * 1e6}
           for k, v in sorted(acc.items(), key=lambda kv: -kv[1][1])]
    return {"iterations": iterations, "backlog_at_start": LEAD + iterations - 1,
            "us_per_fetch_ack": wall / iterations * 1e6,
            "sqlite_us_per_fetch_ack": sum(x["us"] for x in stm), "statements": stm}


def backlog_latency(backlogs=BACKLOGS_FULL, samples: int = 100, base: str | None = None) -> list[dict]:
    """Fetch and ack latency in one process against a pre-published backlog of each size (no
    publisher running, ``samples`` fetch+ack each, so the backlog shrinks by ``samples``)."""
    from epochstream import Catalog, EpochGroup, Publisher, Retention
    rows = []
    for n in backlogs:
        d = tempfile.mkdtemp(prefix="es-bench-groups-backlog-", dir=base)
        try:
            cat = Catalog(d)
            with Publisher("b", catalog=cat, retention=Retention(fsync="none")) as pub:
                for e in range(n):
                    pub.send(e, _records(e))
                    pub.advance_to(e + 1)
            g = EpochGroup("b", "g", cat)
            f, a = [], []
            for _ in range(min(samples, n)):
                t0 = time.perf_counter()
                lease = g.fetch(1)[0]
                t1 = time.perf_counter()
                lease.ack()
                t2 = time.perf_counter()
                f.append(t1 - t0)
                a.append(t2 - t1)
            rows.append({"backlog": n, "fetch": _dist_ms(f), "ack": _dist_ms(a),
                         "loadavg": round(os.getloadavg()[0], 2)})
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return rows


# =============================================================================================

def _variants(quick: bool):
    out = [("shared", w, k, None) for w in WORKS for k in WORKERS]
    out += [("partial", PARTIAL_WORK, k, CHAINS) for k in PARTIAL_WORKERS]
    return out


def _label(mode, work, k, chains) -> str:
    return f"{mode} {work * 1e3:g}ms x{k}" + (f" chains={chains}" if chains else "")


def run(quick: bool = False, log=print) -> dict:
    seconds = paired.seconds(quick)
    n_rep = paired.repeats(quick)
    base = os.environ.get("BENCH_GROUPS_DIR") or None
    t_all = time.monotonic()
    library = _library()
    log(f"  epochstream from {library['dir']} (commit {library.get('commit', '?')[:10]}"
        + (", a snapshot)" if library.get("snapshot") else
           f", {library.get('uncommitted_in_epochstream', '?')} uncommitted file(s) in epochstream/)"))
    probe = tempfile.mkdtemp(prefix="es-bench-groups-probe-", dir=base)
    storage = _storage(os.path.join(probe, "x"))
    shutil.rmtree(probe, ignore_errors=True)
    variants = _variants(quick)
    pool = _Pool(max(max(WORKERS), max(PARTIAL_WORKERS), 2))
    rows = []
    try:
        for rep in range(n_rep):
            for mode, work, k, chains in variants:
                r = throughput_run(pool, mode=mode, work=work, workers=k, duration=seconds,
                                   chains=chains, base=base, time_limit=60)
                r["variant"], r["repeat"] = _label(mode, work, k, chains), rep
                rows.append(r)
                log(f"  groups #{rep} {r['variant']:28s}: " + _fmt(r))
        try:
            redeliv = redelivery(pool, 4 if quick else 20, base=base, log=log)
        except Exception as exc:
            redeliv = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "summary": []}
            log(f"  redelivery FAILED: {redeliv['error']}")
    finally:
        pool.close()
    # summaries
    summary = {"variants": [], "scaling": []}
    for mode, work, k, chains in variants:
        label = _label(mode, work, k, chains)
        rs = [r for r in rows if r["variant"] == label and r.get("ok")]
        fetch = [x for r in rs for x in r.pop("_fetch_s", [])]
        ack = [x for r in rs for x in r.pop("_ack_s", [])]
        s = {"variant": label, "mode": mode, "work_ms": work * 1e3, "workers": k, "chains": chains,
             "runs": sum(1 for r in rows if r["variant"] == label), "ok_runs": len(rs),
             "epochs_per_s": paired.summary([r["epochs_per_s"] for r in rs]),
             "mean_in_flight": paired.summary([r["mean_in_flight"] for r in rs]),
             "worker_cpu_ms_per_epoch": paired.summary([r["worker_cpu_ms_per_epoch"] for r in rs
                                                        if r.get("worker_cpu_ms_per_epoch")]),
             "fetch_median_ms": paired.summary([r["fetch"]["median_ms"] for r in rs if r.get("fetch")]),
             "ack_median_ms": paired.summary([r["ack"]["median_ms"] for r in rs if r.get("ack")]),
             "fetch_pooled": _dist_ms(fetch), "ack_pooled": _dist_ms(ack),
             "ms_per_epoch": {key: paired.summary([r["ms_per_epoch"][key] for r in rs if r.get("ms_per_epoch")])
                              for key in ("claim", "settle", "records", "states", "epoch", "begin", "commit")},
             "publisher_lead_min": min((r["publisher"].get("lead_at_publish_min") for r in rs
                                        if r["publisher"].get("lead_at_publish_min") is not None), default=None),
             "ideal_epochs_per_s": k / work if mode == "shared" else min(k, chains) / work}
        summary["variants"].append(s)
    for r in rows:  # failed rows still hold them
        r.pop("_fetch_s", None)
        r.pop("_ack_s", None)
    for mode, work, k, chains in variants:
        if k == 1:
            continue
        a, b = _label(mode, work, k, chains), _label(mode, work, 1, chains)
        sp = paired.pair_ratios(rows, a, b, key="epochs_per_s")
        ideal = k if mode == "shared" else min(k, chains)
        x = {"mode": mode, "work_ms": work * 1e3, "workers": k, "chains": chains, "ideal": ideal,
             "speedup": paired.summary(sp), "efficiency": paired.summary([v / ideal for v in sp])}
        summary["scaling"].append(x)
        if x["speedup"]:
            log(f"  speed-up {a} ÷ {b}: {x['speedup']['median']:.2f}× ({x['speedup']['min']:.2f}–"
                f"{x['speedup']['max']:.2f}, n={x['speedup']['n']}), efficiency {x['efficiency']['median']:.2f} "
                f"(min {x['efficiency']['min']:.2f}) of the ideal {ideal}×")
    try:
        prof = profile_worker(0.5 if quick else 2.0, base=base)
        f = prof["functions"]
        log(f"  profile: {prof['us_per_iteration_profiled']:.0f} µs per fetch+ack (profiled); "
            + ", ".join(f"{k.split(' (')[0]} {v['us_per_fetch_ack']:.0f} µs" for k, v in f.items()
                        if k.startswith(("EpochGroup.fetch", "Lease.ack", "Catalog.group_claim",
                                         "History.records", "Catalog.group_settle"))))
    except Exception as exc:
        prof = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        log(f"  profile FAILED: {prof['error']}")
    try:
        prof["sql"] = sql_breakdown(30 if quick else 100, base=base)
        q = prof["sql"]
        log(f"  SQLite: {q['sqlite_us_per_fetch_ack']:.0f} of {q['us_per_fetch_ack']:.0f} µs per fetch+ack; "
            + ", ".join(f"{x['sql'][:30]} {x['us']:.0f} µs ({x['calls']:.2g}×)" for x in q["statements"][:4]))
    except Exception as exc:
        prof["sql"] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"  SQL breakdown FAILED: {prof['sql']['error']}")
    try:
        backlog = backlog_latency(BACKLOGS_QUICK if quick else BACKLOGS_FULL, samples=50 if quick else 100,
                                  base=base)
        for b in backlog:
            log(f"  backlog {b['backlog']:5d}: fetch median {b['fetch']['median_ms']:.2f} ms p95 "
                f"{b['fetch']['p95_ms']:.2f} ms; ack median {b['ack']['median_ms']:.2f} ms")
    except Exception as exc:
        backlog = [{"error": f"{type(exc).__name__}: {exc}"}]
        log(f"  backlog FAILED: {backlog[0]['error']}")
    return {"quick": quick, "seconds_per_run": seconds, "repeats": n_rep, "lead": LEAD,
            "records_per_epoch": RECORDS_PER_EPOCH, "poll_interval_s": POLL, "ack_wait_s": ACK_WAIT,
            "chain_offset": CHAIN_OFFSET, "storage": storage, "library": library,
            "machine_note": (f"{os.cpu_count()} cores, shared with other sessions' runs while measuring "
                             "(loadavg_before/after per row; the 1-minute load average also counts this case's own publisher and worker processes). The work is sleep, which needs no core, so "
                             "workers can scale past the core count until the coordination's CPU "
                             "(fetch + ack in the workers and SQLite, the publisher) fills the cores"),
            "rows": rows, "summary": summary, "redelivery": redeliv, "profile": prof, "backlog": backlog,
            "ok": all(r.get("ok") for r in rows) and redeliv.get("ok", False),
            "wall_s": round(time.monotonic() - t_all, 1)}


def _fmt(r) -> str:
    if not r.get("ok"):
        return f"FAILED: {r.get('error')}"
    f, a = r.get("fetch") or {}, r.get("ack") or {}
    return (f"{r['epochs_per_s']:7.1f} epochs/s ({r['per_worker']}), in flight {r['mean_in_flight']:.2f}, "
            f"fetch median {f.get('median_ms', 0):.2f} p99 {f.get('p99_ms', 0):.2f} ms, ack median "
            f"{a.get('median_ms', 0):.2f} p99 {a.get('p99_ms', 0):.2f} ms, worker CPU "
            f"{r['worker_cpu_ms_per_epoch']:.2f} ms/epoch, pub lead min {r['publisher'].get('lead_at_publish_min')}, "
            f"load {r['loadavg_before']}")


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1, default=str)[:4000])
