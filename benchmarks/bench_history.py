"""Case ``history`` (issue 11): what durable history costs and what it buys.

Four measurements, each in separate processes over tcp on 127.0.0.1 (``multiprocessing``
spawn, like :mod:`benchmarks.harness`), with the catalog and the epoch logs in a fresh
temporary directory per run (on the machine's disk, see ``storage`` in the result):

1. **Publisher → one live subscriber**, msgpack tuples, ``RECORDS_PER_MESSAGE`` records per
   message, ``MESSAGES_PER_EPOCH`` messages per epoch, ``advance_to(e + 1)`` after each epoch;
   time-based (the publisher stops at the first epoch boundary after the run's duration), window
   flow control against the subscriber (as the harness), every record counted. Variants, in the
   same order in every repeat: ``off`` (``retention=None``), ``nofsync``
   (``Retention(fsync="none")``) and ``frontier`` (``Retention(fsync="frontier")``, the
   default); every variant's publisher has the same catalog (so the catalog's per-epoch upper
   frontier write is in all three and the ratios isolate the log). Measured: records/s at the
   subscriber, CPU s per million records of the publisher process (all its threads) and of the
   subscriber, and the wall time of each ``advance_to`` call in the publisher (where the log
   writes its ``F`` record, ``fsync``\\ s and indexes the epoch) and of the ``send_encoded``
   calls (where it appends the ``D`` records).
2. **Catch-up from history**, in the same repeat, on the log the ``frontier`` run just wrote
   (its publisher stays alive and idle): a new subscriber process with ``start="earliest"``
   reads every epoch of it through ``epochs()`` (decoding and counting every record, as the
   live subscriber's loop does) — ``replay`` with the segments still in the OS page cache
   (written seconds before), ``replay_cold`` after ``posix_fadvise(DONTNEED)`` of the segment
   files (so they are read from the disk); and ``history``: ``History(topic).epochs()`` in a
   new process (no subscriber, no publisher involved); ``replay_remote`` and ``history_remote``:
   the same two with the bytes read through the live publisher's endpoint (remote history,
   ``EPOCHSTREAM_HISTORY_SOURCE=publisher`` / ``History(source="publisher")``), as a reader
   on another machine would. Records/s from just before the
   constructor to the last epoch; paired with the live runs of the same repeat.
3. **Resume latency**: a publisher process with retention streams steady epochs (10 × 100
   tuples, 100 epochs/s); for each sample the durable subscription is reset to
   ``RESUME_BACKLOG`` epochs behind the publisher, then a new ``python -c`` process opens
   ``Subscriber(topic, catalog, durable=...)`` and takes its first epoch. Latency = first
   epoch handed out − the moment just before the process was spawned (one wall clock),
   split into interpreter start, ``import epochstream``, the constructor and the first epoch.
   Interleaved with the same for ``start="latest"``, which must wait for the next live epoch.
4. **fsync on this machine**: the wall time of ``os.fsync`` after appending 100 bytes to a file
   in the same directory as the logs (it bounds the epochs/s of ``fsync="frontier"``).

5. **Where the cost goes**: a cProfile (wall clock) of an in-process publisher's calling thread
   (the one the log runs on) sending the same stream with no subscriber, per retention setting;
   per-epoch times of the log's functions go to the result, the top functions to
   ``benchmarks/results/profile_history_publisher.txt``
   (``python -m benchmarks.bench_history --profile`` runs it alone).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import queue as _queue
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .provenance import library as _library, storage as _storage
from . import RESULTS, median, paired, payloads

KIND = "tuples"
RECORDS_PER_MESSAGE = 1000
MESSAGES_PER_EPOCH = 10
VARIANTS = ("off", "nofsync", "frontier")  # live publisher → subscriber, same stream
REPLAYS = ("replay", "history", "replay_remote", "history_remote", "replay_cold")
RESUME_RATE = 100.0      # epochs/s of the steady publisher in the resume measurement
RESUME_MPE = 10
RESUME_RPM = 100
RESUME_BACKLOG = 10      # epochs between the durable position and the publisher's frontier
DURABLE = "bench"

_topic_ids = iter(range(1, 1 << 30))


def _retention(variant: str):
    from epochstream import Retention
    if variant == "off":
        return None
    return Retention(fsync={"nofsync": "none", "frontier": "frontier", "every": "every"}[variant])


def _window(rpm: int, mpe: int) -> int:
    """Records the publisher may be ahead of the subscriber (the harness's formula)."""
    msg_bytes = len(payloads.encoded(KIND, rpm, variants=1)[0])
    window = max(4 * mpe * rpm, 256 * rpm * 4)
    return max(min(window, (32 << 20) // msg_bytes * rpm), 2 * mpe * rpm)


def _dist(vals) -> dict | None:
    """median / p99 / max / mean of a list of seconds, in ms."""
    if not vals:
        return None
    v = sorted(vals)
    p = lambda q: v[min(len(v) - 1, int(round(q * (len(v) - 1))))]  # noqa: E731
    return {"n": len(v), "median_ms": p(0.5) * 1e3, "p99_ms": p(0.99) * 1e3, "max_ms": v[-1] * 1e3,
            "mean_ms": sum(v) / len(v) * 1e3}


# =============================================================================================
# processes

def _pub_main(cfg, q, go, stop, consumed, total):
    try:
        _pub(cfg, q, go, stop, consumed, total)
    except BaseException as exc:
        q.put(("error", "publisher", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _pub(cfg, q, go, stop, consumed, total):
    from epochstream import Catalog, Publisher
    rpm, mpe = cfg["per_message"], cfg["messages_per_epoch"]
    bodies = payloads.encoded(KIND, rpm)
    nb = len(bodies)
    pub = Publisher(cfg["topic"], 0, catalog=Catalog(cfg["dir"]), codec="msgpack",
                    retention=cfg.get("retention") or _retention(cfg["variant"]), sndhwm=100_000,
                    max_queue_messages=10_000_000, max_queue_bytes=8 << 30, queue_hwm=10_000,
                    heartbeat_interval=1.0)
    q.put(("endpoint", "publisher", pub.endpoint))
    if not go.wait(120):
        raise TimeoutError("never started")
    send, advance = pub.send_encoded, pub.advance_to
    perf, mono = time.perf_counter, time.monotonic
    adv_times = []
    send_s = 0.0
    sent = msgs = e = 0
    window = cfg.get("window")
    gc0 = [g["collections"] for g in gc.get_stats()]
    cpu0 = time.process_time()
    t0 = mono()
    if cfg["pattern"] == "throughput":
        duration = cfg["duration"]
        while True:
            for j in range(mpe):
                while consumed.value < sent - window:  # flow control (as the harness)
                    time.sleep(0.0002)
                a = perf()
                send(e, bodies[msgs % nb])
                send_s += perf() - a
                msgs += 1
                sent += rpm
            last = mono() - t0 >= duration
            if last:
                total.value = e + 1  # before the update that completes it: the subscriber stops there
            a = perf()
            advance(e + 1)
            adv_times.append(perf() - a)
            e += 1
            if last:
                break
    else:  # "steady": RESUME_RATE epochs/s until stop
        rate = cfg["rate"]
        while not stop.is_set():
            due = t0 + e / rate
            now = mono()
            if now < due:
                time.sleep(due - now)
            for j in range(mpe):
                send(e, bodies[msgs % nb])
                msgs += 1
            sent += mpe * rpm
            a = perf()
            advance(e + 1)
            adv_times.append(perf() - a)
            e += 1
    pub.flush(60)
    cpu = time.process_time() - cpu0
    wall = mono() - t0
    q.put(("published", "publisher", {
        "records": sent, "messages": msgs, "epochs": e, "cpu_s": cpu, "wall_s": wall,
        "send_s": send_s, "advance": _dist(adv_times), "advance_s": sum(adv_times),
        "gc": [g["collections"] - c for g, c in zip(gc.get_stats(), gc0)],
        "stats": {k: v for k, v in dict(pub.stats).items() if isinstance(v, (int, float))}}))
    if cfg.get("linger"):  # stay alive (idle: heartbeats only) until the parent is done
        stop.wait(600)
    pub.close(linger=30)


def _sub_main(cfg, q, go, consumed, total):
    try:
        _sub(cfg, q, go, consumed, total)
    except BaseException as exc:
        q.put(("error", f"subscriber ({cfg['mode']})", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _sub(cfg, q, go, consumed, total):
    from epochstream import Catalog, History, Subscriber
    mode = cfg["mode"]
    limit = cfg["time_limit"]
    mono = time.monotonic
    cat = Catalog(cfg["dir"])
    n = epochs = msgs = 0
    t_first = None
    if mode == "live":
        sub = Subscriber(cfg["topic"], cat, rcvhwm=1_000_000, timeout=limit)
        if not sub.wait_ready(30):
            raise TimeoutError("subscriber not ready after 30 s")
        q.put(("ready", mode, None))
        gc0 = [g["collections"] for g in gc.get_stats()]
        cpu0 = time.process_time()
        t0 = None
        for ep in sub.epochs(timeout=limit):
            if not hasattr(ep, "records"):
                continue
            n += len(ep.records)
            msgs += ep.messages
            epochs += 1
            consumed.value = n
            if t_first is None:
                t_first = mono()
            if total.value and epochs >= total.value:
                break
        t_end = mono()
        sub.close()
    else:
        go.wait(60)
        expected = cfg["expected_epochs"]
        gc0 = [g["collections"] for g in gc.get_stats()]
        cpu0 = time.process_time()
        t0 = mono()
        if mode in ("history", "history_remote", "history_store"):
            source = History(cfg["topic"], catalog=cat, source={
                "history_remote": "publisher", "history_store": "store"}.get(mode, "disk")).epochs()
            sub = None
        else:  # replay / replay_cold: a subscriber joining at the earliest retained epoch
            if mode == "replay_remote":  # its history read through the live publisher
                os.environ["EPOCHSTREAM_HISTORY_SOURCE"] = "publisher"
            sub = Subscriber(cfg["topic"], cat, start="earliest", rcvhwm=1_000_000, timeout=limit)
            source = sub.epochs(timeout=limit)
        for ep in source:
            if not hasattr(ep, "records"):
                continue
            n += len(ep.records)
            msgs += ep.messages
            epochs += 1
            if t_first is None:
                t_first = mono()
            if epochs >= expected:
                break
        t_end = mono()
        if sub is not None:
            sub.close()
    q.put(("done", mode, {"records": n, "messages": msgs, "epochs": epochs, "t0": t0,
                          "t_first": t_first, "t_end": t_end, "cpu_s": time.process_time() - cpu0,
                          "gc": [g["collections"] - c for g, c in zip(gc.get_stats(), gc0)]}))


class _Procs:
    """Spawned processes of one measurement; ``get`` raises a process's reported error."""

    def __init__(self):
        self.ctx = mp.get_context("spawn")
        self.q = self.ctx.Queue()
        self.procs = []

    def start(self, target, *args):
        p = self.ctx.Process(target=target, args=(*args,), daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def get(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.q.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except _queue.Empty:
                dead = [p for p in self.procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"a benchmark process died (exit code {dead[0].exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no report within {timeout} s")
                continue
            if msg[0] == "error":
                raise RuntimeError(f"{msg[1]}: {msg[2]}")
            return msg

    def close(self):
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(2)


# =============================================================================================
# 1 + 2: throughput with and without retention, then catch-up on the frontier run's log

def live_run(variant: str, duration: float, *, per_message: int = RECORDS_PER_MESSAGE,
             messages_per_epoch: int = MESSAGES_PER_EPOCH, base: str | None = None,
             time_limit: float = 60.0, replays=(), keep: bool = False) -> tuple[dict, list[dict]]:
    """One time-based publisher → subscriber run with retention ``variant``; then, on its log
    (publisher alive and idle), each of ``replays``. Returns (live row, replay rows). ``keep``:
    leave the temporary directory (for tests)."""
    d = tempfile.mkdtemp(prefix="es-bench-history-", dir=base)
    topic = f"hist-{os.getpid()}-{next(_topic_ids)}"
    cfg = {"topic": topic, "dir": d, "variant": variant, "per_message": per_message,
           "messages_per_epoch": messages_per_epoch, "pattern": "throughput",
           "duration": duration, "window": _window(per_message, messages_per_epoch),
           "time_limit": time_limit, "linger": bool(replays)}
    row = {"variant": variant, "payload": KIND, "records_per_message": per_message,
           "messages_per_epoch": messages_per_epoch, "duration_s": duration,
           "loadavg_before": round(os.getloadavg()[0], 2)}
    rrows = []
    P = _Procs()
    go, stop = P.ctx.Event(), P.ctx.Event()
    consumed, total = P.ctx.RawValue("q", 0), P.ctx.RawValue("q", 0)
    try:
        P.start(_pub_main, cfg, P.q, go, stop, consumed, total)
        P.get(60)  # endpoint
        P.start(_sub_main, dict(cfg, mode="live"), P.q, go, consumed, total)
        P.get(60)  # ready
        t_start = time.monotonic()
        go.set()
        got = {}
        while len(got) < 2:
            kind, who, value = P.get(time_limit + 30)
            got[kind] = value
        pub, sub = got["published"], got["done"]
        ok = sub["records"] == pub["records"] and sub["epochs"] == pub["epochs"]
        secs = sub["t_end"] - t_start
        mrec = pub["records"] / 1e6
        log_bytes = _log_bytes(d)
        row.update(ok=ok, records=pub["records"], epochs=pub["epochs"], received_records=sub["records"],
                   seconds=round(secs, 4), records_per_s=pub["records"] / secs,
                   epochs_per_s=pub["epochs"] / secs,
                   pub_cpu_s_per_M=pub["cpu_s"] / mrec, sub_cpu_s_per_M=sub["cpu_s"] / mrec,
                   pub_cpu_s=round(pub["cpu_s"], 3), sub_cpu_s=round(sub["cpu_s"], 3),
                   advance=pub["advance"], advance_s_per_M=pub["advance_s"] / mrec,
                   send_s_per_M=pub["send_s"] / mrec, log_bytes=log_bytes,
                   log_bytes_per_record=log_bytes / pub["records"] if pub["records"] else None,
                   sub_gc=sub["gc"], pub_gc=pub["gc"], loadavg_after=round(os.getloadavg()[0], 2))
        if not ok:
            row["error"] = (f"count mismatch: published {pub['records']} records in {pub['epochs']} "
                            f"epochs, received {sub['records']} in {sub['epochs']}")
        for mode in (replays if ok else ()):
            rrows.append(_replay(P, cfg, mode, pub, time_limit))
    except Exception as exc:
        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500], detail=str(exc)[-3000:])
    finally:
        stop.set()
        P.close()
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    if keep:
        row["dir"] = d
    return row, rrows


def _log_bytes(d: str) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*.eslog"))


def _drop_cache(d: str, pattern: str = "*.eslog") -> int:
    """``posix_fadvise(DONTNEED)`` every segment file under ``d`` (fsynced first, so its pages
    are clean and can be dropped: checked with ``fincore`` while writing this case, 0 pages
    resident after); returns the bytes advised. The machine's virtual disk may still be served
    from the host's cache (see ``fsync.read_after_dontneed_bytes_per_s``)."""
    n = 0
    for p in Path(d).rglob(pattern):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return n


def _replay(P: _Procs, cfg: dict, mode: str, pub: dict, time_limit: float) -> dict:
    row = {"variant": mode, "payload": KIND, "records_per_message": cfg["per_message"],
           "messages_per_epoch": cfg["messages_per_epoch"], "expected_epochs": pub["epochs"],
           "expected_records": pub["records"], "loadavg_before": round(os.getloadavg()[0], 2)}
    try:
        if mode == "replay_cold":
            row["cache_dropped_bytes"] = _drop_cache(cfg["dir"])
        go = P.ctx.Event()
        p = P.start(_sub_main, dict(cfg, mode=mode if mode != "replay_cold" else "replay",
                                    expected_epochs=pub["epochs"]), P.q, go, None, None)
        go.set()  # the clock starts in the process, just before the constructor
        kind, who, r = P.get(time_limit + 30)
        p.join(10)
        secs = r["t_end"] - r["t0"]
        ok = r["records"] == pub["records"] and r["epochs"] == pub["epochs"]
        mrec = r["records"] / 1e6 if r["records"] else None
        row.update(ok=ok, records=r["records"], epochs=r["epochs"], seconds=round(secs, 4),
                   records_per_s=r["records"] / secs if secs > 0 else None,
                   first_epoch_ms=None if r["t_first"] is None else (r["t_first"] - r["t0"]) * 1e3,
                   sub_cpu_s_per_M=r["cpu_s"] / mrec if mrec else None, sub_cpu_s=round(r["cpu_s"], 3),
                   sub_gc=r["gc"], loadavg_after=round(os.getloadavg()[0], 2))
        if not ok:
            row["error"] = (f"count mismatch: expected {pub['records']} records in {pub['epochs']} "
                            f"epochs, got {r['records']} in {r['epochs']}")
    except Exception as exc:
        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500], detail=str(exc)[-3000:])
    return row


# =============================================================================================
# 3: resume latency of a new process

_CHILD = r"""
import json, sys, time
t0 = time.time()
from epochstream import Catalog, Subscriber
t1 = time.time()
d, topic, mode, name = sys.argv[1:5]
cat = Catalog(d)
kw = {"durable": name} if mode == "durable" else {"start": "latest"}
sub = Subscriber(topic, cat, timeout=10, **kw)
t2 = time.time()
first = None
for ep in sub.epochs(timeout=10):
    if hasattr(ep, "records"):
        first = ep
        break
t3 = time.time()
out = {"t_start": t0, "t_import": t1, "t_ctor": t2, "t_first": t3,
       "epoch": None if first is None else first.time,
       "records": None if first is None else len(first.records),
       "history_epochs": sub.stats.get("history_epochs", 0)}
sub.close()
print(json.dumps(out), flush=True)
"""


def resume_latency(samples: int, *, base: str | None = None, log=print) -> dict:
    """``samples`` new processes per mode (``durable`` resume with a backlog, ``latest``),
    interleaved, against a steady publisher with retention."""
    from epochstream import Catalog
    d = tempfile.mkdtemp(prefix="es-bench-resume-", dir=base)
    topic = f"resume-{os.getpid()}-{next(_topic_ids)}"
    cfg = {"topic": topic, "dir": d, "variant": "frontier", "per_message": RESUME_RPM,
           "messages_per_epoch": RESUME_MPE, "pattern": "steady", "rate": RESUME_RATE}
    P = _Procs()
    go, stop = P.ctx.Event(), P.ctx.Event()
    rows = []
    rng = random.Random(11)
    err = None
    published = None
    try:
        P.start(_pub_main, cfg, P.q, go, stop, P.ctx.RawValue("q", 0), P.ctx.RawValue("q", 0))
        P.get(60)
        go.set()
        cat = Catalog(d)
        time.sleep(0.5)  # a retained log of ~50 epochs before the first sample
        holder = "bench-setup"
        cat.durable_claim(topic, DURABLE, holder)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the child imports the same epochstream
            [_library()["dir"], os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        for i in range(samples):
            for mode in ("durable", "latest"):
                time.sleep(rng.uniform(0.05, 0.05 + 1.0 / RESUME_RATE))
                position = None
                if mode == "durable":
                    lower = cat.history_state(topic, 0).lower
                    position = [max(0, lower[0] - RESUME_BACKLOG)]
                    cat.durable_reset(topic, DURABLE, position)
                t_spawn = time.time()
                proc = subprocess.run([sys.executable, "-c", _CHILD, d, topic, mode, DURABLE],
                                      capture_output=True, text=True, timeout=60, env=env)
                row = {"sample": i, "mode": mode, "position": position}
                try:
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    row.update(ok=False, error=(proc.stderr or proc.stdout).strip()[-500:])
                    rows.append(row)
                    continue
                ok = r["records"] is not None and (mode != "durable" or r["epoch"] == position[0])
                row.update(ok=ok, total_ms=(r["t_first"] - t_spawn) * 1e3,
                           interpreter_ms=(r["t_start"] - t_spawn) * 1e3,
                           import_ms=(r["t_import"] - r["t_start"]) * 1e3,
                           constructor_ms=(r["t_ctor"] - r["t_import"]) * 1e3,
                           first_epoch_ms=(r["t_first"] - r["t_ctor"]) * 1e3,
                           in_process_ms=(r["t_first"] - r["t_import"]) * 1e3,
                           epoch=r["epoch"], records=r["records"], history_epochs=r["history_epochs"])
                if not ok:
                    row["error"] = f"first epoch {r['epoch']} ({r['records']} records), expected {position}"
                rows.append(row)
        stop.set()
        kind, who, published = P.get(60)
    except Exception as exc:
        err = str(exc).strip().splitlines()[0][:500]
    finally:
        stop.set()
        P.close()
        shutil.rmtree(d, ignore_errors=True)
    summary = {}
    for mode in ("durable", "latest"):
        rs = [r for r in rows if r["mode"] == mode and r.get("ok")]
        s = {"samples": len(rs), "failed": sum(1 for r in rows if r["mode"] == mode and not r.get("ok"))}
        for key in ("total_ms", "interpreter_ms", "import_ms", "constructor_ms", "first_epoch_ms",
                    "in_process_ms"):
            v = sorted(r[key] for r in rs)
            if v:
                s[key] = {"median": median(v), "p95": v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))],
                          "min": v[0], "max": v[-1]}
        summary[mode] = s
    out = {"rate_epochs_per_s": RESUME_RATE, "messages_per_epoch": RESUME_MPE,
           "records_per_message": RESUME_RPM, "backlog_epochs": RESUME_BACKLOG, "samples": samples,
           "rows": rows, "summary": summary, "publisher": published,
           "ok": err is None and all(summary[m]["failed"] == 0 and summary[m]["samples"] == samples
                                     for m in summary)}
    if err:
        out["error"] = err
    for mode in ("durable", "latest"):
        s = summary[mode]
        if s.get("total_ms"):
            log(f"  resume {mode:7s}: {s['samples']} samples, spawn → first epoch median "
                f"{s['total_ms']['median']:.0f} ms, p95 {s['total_ms']['p95']:.0f} ms (in process "
                f"{s['in_process_ms']['median']:.1f} ms; import {s['import_ms']['median']:.0f} ms)")
    return out


# =============================================================================================
# 4: fsync

def fsync_cost(n: int = 300, base: str | None = None) -> dict:
    """Wall time of ``os.fsync`` after appending (``write`` + ``flush``) 100 bytes, and after
    appending one epoch of the case's stream (``MESSAGES_PER_EPOCH`` payloads), ``n`` times
    each, to a file in a new directory under ``base``; and the read speed of a 64 MiB file
    after ``posix_fadvise(DONTNEED)`` (what ``replay_cold`` reads from) and again (page cache)."""
    d = tempfile.mkdtemp(prefix="es-bench-fsync-", dir=base)
    out = {"storage": _storage(os.path.join(d, "x"))}
    epoch_bytes = sum(len(b) for b in payloads.encoded(KIND, RECORDS_PER_MESSAGE, variants=MESSAGES_PER_EPOCH))
    try:
        for label, size in (("fsync_100B", 100), ("fsync_epoch", epoch_bytes)):
            ts = []
            with open(os.path.join(d, label), "ab") as f:
                blob = b"x" * size
                for _ in range(n):
                    f.write(blob)
                    f.flush()
                    a = time.perf_counter()
                    os.fsync(f.fileno())
                    ts.append(time.perf_counter() - a)
            out[label] = _dist(ts)
        out["epoch_bytes"] = epoch_bytes
        path = os.path.join(d, "read")
        with open(path, "wb") as f:
            f.write(os.urandom(64 << 20))
        dropped = _drop_cache(d, pattern="read")
        for label in ("read_after_dontneed_bytes_per_s", "read_cached_bytes_per_s"):
            a = time.perf_counter()
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
            out[label] = (64 << 20) / (time.perf_counter() - a)
        out["read_dropped_bytes"] = dropped
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


# =============================================================================================

def summarize(rows: list[dict]) -> dict:
    """The per-variant summaries and the paired ratios (with their targets and verdicts) of the
    throughput and catch-up ``rows`` of :func:`run`."""
    summary = {"variants": {}, "ratios": []}
    for v in (*VARIANTS, *REPLAYS):
        rs = [r for r in rows if r["variant"] == v and r.get("ok")]
        s = {"runs": sum(1 for r in rows if r["variant"] == v), "ok_runs": len(rs)}
        for key in ("records_per_s", "epochs_per_s", "pub_cpu_s_per_M", "sub_cpu_s_per_M",
                    "advance_s_per_M", "send_s_per_M", "log_bytes_per_record", "first_epoch_ms"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            s[key] = paired.summary(vals)
        adv = [r["advance"]["median_ms"] for r in rs if r.get("advance")]
        s["advance_median_ms"] = paired.summary(adv)
        adv99 = [r["advance"]["p99_ms"] for r in rs if r.get("advance")]
        s["advance_p99_ms"] = paired.summary(adv99)
        summary["variants"][v] = s
    for a, b, key, target, what in (
            ("frontier", "off", "records_per_s", 0.85, "retention fsync=frontier ÷ no retention, records/s"),
            ("nofsync", "off", "records_per_s", None, "retention fsync=none ÷ no retention, records/s"),
            ("frontier", "nofsync", "records_per_s", None, "fsync=frontier ÷ fsync=none, records/s"),
            ("frontier", "off", "pub_cpu_s_per_M", None, "publisher CPU per record, fsync=frontier ÷ off"),
            ("nofsync", "off", "pub_cpu_s_per_M", None, "publisher CPU per record, fsync=none ÷ off"),
            ("replay", "off", "records_per_s", 1.0, "history replay (subscriber, start=earliest, page cache) ÷ live delivery without retention"),
            ("replay", "frontier", "records_per_s", None, "history replay ÷ live delivery of the same epochs (fsync=frontier run)"),
            ("replay_cold", "off", "records_per_s", None, "history replay after dropping the segments from the page cache ÷ live (off)"),
            ("history", "off", "records_per_s", None, "History(topic).epochs() ÷ live (off)"),
            ("replay_remote", "off", "records_per_s", None, "history replay read through the live publisher (remote history) ÷ live (off)"),
            ("history_remote", "off", "records_per_s", None, "History(topic, source=\"publisher\").epochs() ÷ live (off)"),
            ("replay", "off", "sub_cpu_s_per_M", None, "subscriber CPU per record (process), history replay ÷ live (off)")):
        ps = paired.summary(paired.pair_ratios(rows, a, b, key=key))
        summary["ratios"].append({"a": a, "b": b, "key": key, "what": what, "target": target,
                                  "paired": ps,
                                  "verdict": paired.verdict(ps, target) if target else None})
    return summary


def run(quick: bool = False, log=print) -> dict:
    seconds = paired.seconds(quick)
    n_rep = paired.repeats(quick)
    base = os.environ.get("BENCH_HISTORY_DIR") or None
    t_all = time.monotonic()
    fs = fsync_cost(100 if quick else 500, base=base)
    log(f"  fsync after a 100 B append: median {fs['fsync_100B']['median_ms'] * 1e3:.0f} µs, "
        f"p99 {fs['fsync_100B']['p99_ms'] * 1e3:.0f} µs ({fs['storage']['fstype']} on {fs['storage']['device']})")
    library = _library()
    log(f"  epochstream from {library['dir']} (commit {library.get('commit', '?')[:10]}, "
        f"{library.get('uncommitted_in_epochstream', '?')} uncommitted file(s) in epochstream/)")
    rows = []
    for rep in range(n_rep):
        for v in VARIANTS:
            row, rrows = live_run(v, seconds, base=base, time_limit=60 + 3 * seconds,
                                  replays=REPLAYS if v == "frontier" else ())
            for r in [row, *rrows]:
                r["repeat"] = rep
                rows.append(r)
                log(f"  history #{rep} {r['variant']:11s}: " + _fmt(r))
    summary = summarize(rows)
    for x in summary["ratios"]:
        p = x["paired"]
        if p:
            log(f"  {x['what']}: {p['median']:.3f} ({p['min']:.3f}–{p['max']:.3f}, n={p['n']})"
                + (f" target ≥ {x['target']}: {x['verdict']}" if x["target"] else ""))
    try:
        resume = resume_latency(6 if quick else 25, base=base, log=log)
    except Exception as exc:  # keep the throughput results
        resume = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "detail": traceback.format_exc()[-3000:]}
        log(f"  resume latency FAILED: {resume['error']}")
    try:
        prof = profile_publisher(0.5 if quick else 2.0)
    except Exception as exc:
        prof = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "variants": {}}
        log(f"  profile FAILED: {prof['error']}")
    fs_end = fsync_cost(100 if quick else 500, base=base)  # again: the disk is shared too
    log(f"  fsync after a 100 B append, at the end: median {fs_end['fsync_100B']['median_ms'] * 1e3:.0f} µs, "
        f"p99 {fs_end['fsync_100B']['p99_ms'] * 1e3:.0f} µs")
    for v, x in prof["variants"].items():
        f = x["functions"]
        log(f"  profile {v:8s}: {x['us_per_epoch_profiled']:.0f} µs per epoch on the calling thread; "
            + ", ".join(f"{k.split(' (')[0]} {f[k]['us_per_epoch']:.0f} µs" for k in
                        ("LogWriter.data (D record: crc32 + writes)", "LogWriter.frontier (F record, fsync, index)",
                         "os.fsync of the segment", "Catalog.history_commit (SQLite transaction)") if k in f))
    return {"quick": quick, "seconds_per_run": seconds, "repeats": n_rep,
            "payload": KIND, "records_per_message": RECORDS_PER_MESSAGE,
            "messages_per_epoch": MESSAGES_PER_EPOCH, "storage": fs["storage"], "fsync": fs,
            "library": library, "fsync_end": fs_end,
            "machine_note": "2 cores shared with other sessions' test runs while measuring (see "
                            "loadavg_before/after per row): expect a wide spread; compare paired ratios",
            "rows": rows, "summary": summary, "resume": resume, "profile": prof,
            "ok": all(r.get("ok") for r in rows) and resume.get("ok", False),
            "wall_s": round(time.monotonic() - t_all, 1)}


def _fmt(r) -> str:
    if not r.get("ok"):
        return f"FAILED: {r.get('error')}"
    s = f"{r['records_per_s'] / 1e6:6.3f}M rec/s, {r['seconds']:.2f} s"
    if "pub_cpu_s_per_M" in r:
        adv = r.get("advance") or {}
        s += (f", {r['epochs_per_s']:.0f} epochs/s, CPU s/M rec pub {r['pub_cpu_s_per_M']:.3f} sub "
              f"{r['sub_cpu_s_per_M']:.3f}, advance_to median {adv.get('median_ms', 0):.3f} ms "
              f"p99 {adv.get('p99_ms', 0):.3f} ms, load {r['loadavg_before']}")
    else:
        s += (f", first epoch {r['first_epoch_ms']:.1f} ms, sub CPU s/M rec {r['sub_cpu_s_per_M']:.3f}, "
              f"load {r['loadavg_before']}")
    return s


# =============================================================================================
# profile: where the retention cost goes (the publisher's calling thread, which runs the log)

# (file suffix, function name) -> label; cumulative wall time per epoch is reported
_PROFILE_FUNCS = (
    ("publisher.py", "send_encoded", "Publisher.send_encoded (all)"),
    ("publisher.py", "advance_to", "Publisher.advance_to (all)"),
    ("epochlog.py", "data", "LogWriter.data (D record: crc32 + writes)"),
    ("epochlog.py", "frontier", "LogWriter.frontier (F record, fsync, index)"),
    ("catalog/history.py", "history_commit", "Catalog.history_commit (SQLite transaction)"),
    ("~", "<built-in method posix.fsync>", "os.fsync of the segment"),
    ("~", "<built-in method _sqlite3.connect>", "sqlite3.connect (new connection)"),
    ("~", "<method 'execute' of 'sqlite3.Connection' objects>", "sqlite3 execute (all statements)"),
    ("~", "<method 'close' of 'sqlite3.Connection' objects>", "sqlite3 close"),
    ("catalog/sqlcatalog.py", "record_upper", "Catalog.record_upper (upper frontier, per epoch)"),
    ("~", "<built-in method zlib.crc32>", "zlib.crc32"),
    ("~", "<method 'write' of '_io.BufferedWriter' objects>", "file write"),
    ("socket.py", "send", "zmq send (hand-off to the loop thread)"),
)


def profile_publisher(seconds: float = 2.0, out: Path | None = None) -> dict:
    """cProfile (wall clock) of an in-process publisher sending the case's stream with no
    subscriber (its loop thread discards what no one reads) for ``seconds`` per retention
    setting. Returns per setting: epochs, records/s sent while profiled, and per epoch the
    cumulative time and calls of the functions in ``_PROFILE_FUNCS``; writes the top functions
    to ``out`` (default ``benchmarks/results/profile_history_publisher.txt``)."""
    import cProfile
    import io
    import pstats

    from epochstream import Catalog, Publisher
    from epochstream.transport.loop import PublisherLoop
    out = out or RESULTS / "profile_history_publisher.txt"
    bodies = payloads.encoded(KIND, RECORDS_PER_MESSAGE)
    text = [f"cProfile (wall clock) of the publisher's calling thread and its loop thread (which "
            f"writes the epoch log), merged: {KIND}, {RECORDS_PER_MESSAGE} "
            f"records per message, {MESSAGES_PER_EPOCH} messages per epoch, advance_to after each "
            f"epoch, no subscriber, {seconds:g} s per setting; {time.strftime('%Y-%m-%d %H:%M')}, "
            f"loadavg {os.getloadavg()[0]:.2f}\n"]
    result = {"seconds": seconds, "variants": {}}
    for variant in VARIANTS:
        d = tempfile.mkdtemp(prefix="es-bench-prof-")
        loop_prof = cProfile.Profile()
        original_run = PublisherLoop.run

        def profiled_run(self, _p=loop_prof, _run=original_run):  # the loop thread writes the log
            _p.enable()
            try:
                _run(self)
            finally:
                _p.disable()

        PublisherLoop.run = profiled_run
        try:
            pub = Publisher(f"prof-{variant}", 0, catalog=Catalog(d), codec="msgpack",
                            retention=_retention(variant), sndhwm=100_000,
                            max_queue_messages=10_000_000, max_queue_bytes=8 << 30, queue_hwm=10_000)
            prof = cProfile.Profile()
            e = msgs = 0
            t0 = time.monotonic()
            cpu0 = time.process_time()
            prof.enable()
            while time.monotonic() - t0 < seconds:
                for j in range(MESSAGES_PER_EPOCH):
                    pub.send_encoded(e, bodies[msgs % len(bodies)])
                    msgs += 1
                pub.advance_to(e + 1)
                e += 1
            prof.disable()
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - t0
            pub.close(linger=1, wait=True)
            PublisherLoop.run = original_run
            st = pstats.Stats(prof)
            st.add(loop_prof)  # both threads: the caller's calls and the loop's log writes
            funcs = {}
            for (fname, _line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():
                for suffix, name, label in _PROFILE_FUNCS:
                    if func == name and (fname == suffix or fname.endswith("/" + suffix)):
                        f = funcs.setdefault(label, {"calls": 0, "seconds": 0.0})
                        f["calls"] += nc
                        f["seconds"] += ct
            per_epoch = {k: {"calls_per_epoch": v["calls"] / e, "us_per_epoch": v["seconds"] / e * 1e6}
                         for k, v in funcs.items()}
            records = msgs * RECORDS_PER_MESSAGE
            result["variants"][variant] = {
                "epochs": e, "records": records, "records_per_s_profiled": records / wall,
                "us_per_epoch_profiled": wall / e * 1e6, "cpu_s_per_M": cpu / (records / 1e6),
                "functions": per_epoch}
            s = io.StringIO()
            st.stream = s
            st.sort_stats("tottime").print_stats(18)
            st.sort_stats("cumulative").print_stats(22)
            text.append(f"\n==== retention {variant}: {e} epochs, {records / wall / 1e6:.2f}M records/s "
                        f"sent (profiled), {wall / e * 1e6:.0f} µs per epoch, process CPU "
                        f"{cpu / (records / 1e6):.3f} s per M records\n")
            text.append(s.getvalue())
        finally:
            PublisherLoop.run = original_run
            shutil.rmtree(d, ignore_errors=True)
    out.write_text("".join(text))
    result["file"] = str(out.relative_to(RESULTS.parent.parent)) if out.is_relative_to(RESULTS.parent.parent) else str(out)
    return result


if __name__ == "__main__":
    if "--profile" in sys.argv:
        print(json.dumps(profile_publisher(), indent=1))
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=1, default=str)[:4000])
