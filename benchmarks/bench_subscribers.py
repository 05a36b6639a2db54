"""Case ``subscribers``: one topic, 1 → 1,000 subscribers, directly and through a tree of relays
(issue 28).

A fixed offered load, so that cost per subscriber is what grows: one publisher process sends
``RATE`` epochs a second, one message of ``PER_MESSAGE`` msgpack tuples each (``send_encoded``,
``advance_to``), for ``window`` seconds. Subscribers are threads — ``N`` of them spread over
``SUB_PROCESSES`` subscriber processes (one process for N = 1), each thread in
``for epoch in sub.epochs()`` counting records — because 1,000 subscriber processes would not
fit on this 2-core machine; each thread is a full ``Subscriber`` with its own connection.

Two topologies:

- ``direct`` — every subscriber connects to the publisher;
- ``tree`` — two levels of :class:`~epochstream.Relay` (``FANOUT`` relays under the publisher,
  ``FANOUT`` under each of them: ``FANOUT²`` leaves), the relays of one level as threads of one
  process (a relay is a thread already); subscribers are spread round-robin over the leaves.
  Relays need the catalog (a throwaway SQLite file).

Measured per point by the parent from ``/proc/<pid>/task/*/schedstat`` (CPU of every thread, in
nanoseconds) and ``/proc/<pid>/status`` (VmRSS) of every process at the start and the end of the window:
publisher CPU per record sent and per record per subscriber, relay CPU per record per level,
subscriber CPU per record delivered, records delivered per second (all subscribers) and the
fraction of the offered records delivered (after a drain of ``DRAIN_S`` seconds; quick: 1 s), and memory.
Where the machine cannot keep up the fraction falls below 1: that is where the curve breaks here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import traceback

from . import curves, payloads

RATE = 20  # epochs per second offered
PER_MESSAGE = 100
SUB_PROCESSES = 2
FANOUT = 2
DRAIN_S = 3.0


def plan(quick: bool) -> dict:
    if quick:
        return {"counts": (1, 10, 40), "topologies": ("direct", "tree"), "window_s": 1.5, "drain_s": 1.0}
    return {"counts": (1, 10, 100, 300, 1000), "topologies": ("direct", "tree"), "window_s": 5.0,
            "drain_s": DRAIN_S}


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of process ``pid``, at nanosecond resolution: the sum of
    ``/proc/<pid>/task/*/schedstat``'s first field (``/proc/<pid>/stat`` counts 10 ms ticks,
    too coarse for a 5 s window of a mostly idle publisher)."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def proc_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------------------------------------
def _publisher(topic, catalog, q, go, stop, sent):
    try:
        from epochstream import Publisher
        body = payloads.encoded("tuples", PER_MESSAGE)[0]
        pub = Publisher(topic, catalog=catalog, codec="msgpack", max_queue_messages=1_000_000,
                        max_queue_bytes=4 << 30, sndhwm=100_000)
        q.put(("endpoint", pub.endpoint))
        go.wait(600)
        t0, e = time.monotonic(), 0
        while not stop.is_set():
            due = t0 + e / RATE
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            pub.send_encoded(e, body)
            e += 1
            pub.advance_to(e)
            sent.value = e
        time.sleep(600)
    except BaseException as exc:
        q.put(("error", f"publisher: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _relays(specs, catalog, q):
    """One process per tree level: ``specs`` = [(upstream topic, tier)]."""
    try:
        from epochstream import Relay
        relays = [Relay(up, catalog, tier=tier, wait=30, timeout=60, max_queue_messages=1_000_000,
                        sndhwm=100_000) for up, tier in specs]
        q.put(("relays", [(r.name, r.endpoint) for r in relays]))
        time.sleep(3600)
    except BaseException as exc:
        q.put(("error", f"relays: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _subscribers(targets, q, stop, drain_s=DRAIN_S):
    try:
        from epochstream import Subscriber
        counts = [0] * len(targets)
        subs = [Subscriber(t, endpoints=[ep], codec="msgpack", timeout=120, rcvhwm=100_000)
                for t, ep in targets]
        for s in subs:
            if not s.wait_ready(60):
                raise TimeoutError("a subscriber not ready")

        def consume(i, sub):
            try:
                for ep in sub.epochs():
                    counts[i] += len(ep.records)
            except Exception:
                pass
        for i, s in enumerate(subs):
            threading.Thread(target=consume, args=(i, s), daemon=True).start()
        q.put(("ready", len(subs)))
        stop.wait(3600)
        time.sleep(drain_s)
        q.put(("counted", sum(counts), min(counts) if counts else 0))
        time.sleep(3600)
    except BaseException as exc:
        q.put(("error", f"subscribers: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _get(q, kind, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            raise TimeoutError(f"no {kind!r} within {timeout} s") from None
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        if msg[0] == kind:
            return msg


# ---------------------------------------------------------------------------------------------
def _tree(ctx, topic, catalog, procs) -> tuple[list, list]:
    """Start the two relay levels; returns the leaves [(topic, endpoint)] and [(level, pid)]."""
    levels, ups = [], [topic]
    for level in (1, 2):
        specs = [(up, f"l{level}{chr(97 + k)}") for up in ups for k in range(FANOUT)]
        q = ctx.Queue()
        p = ctx.Process(target=_relays, args=(specs, catalog, q), daemon=True)
        p.start()
        procs.append(p)
        _, made = _get(q, "relays", 120)
        levels.append((level, p.pid))
        ups = [name for name, _ in made]
        leaves = made
    return leaves, levels


def point(n: int, topology: str, window: float, drain_s: float = DRAIN_S) -> dict:
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="es-subs-")
    catalog = os.path.join(tmp, "catalog.db")
    topic = f"fan-{n}-{topology}"
    q, go, stop, sent = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Value("q", 0, lock=False)
    procs = []
    row = {"subscribers": n, "topology": topology, "window_s": window, "rate_epochs_per_s": RATE,
           "records_per_message": PER_MESSAGE, "loadavg_before": curves.loadavg(), "ok": False}
    try:
        pub = ctx.Process(target=_publisher, args=(topic, catalog, q, go, stop, sent), daemon=True)
        pub.start()
        procs.append(pub)
        _, endpoint = _get(q, "endpoint", 60)
        levels = []
        targets = [(topic, endpoint)]
        if topology == "tree":
            targets, levels = _tree(ctx, topic, catalog, procs)
        k = 1 if n == 1 else SUB_PROCESSES
        shares = [[targets[i % len(targets)] for i in range(j, n, k)] for j in range(k)]
        sq, sstop = ctx.Queue(), ctx.Event()
        subs = []
        for share in shares:
            p = ctx.Process(target=_subscribers, args=(share, sq, sstop, drain_s), daemon=True)
            p.start()
            procs.append(p)
            subs.append(p)
        for _ in subs:
            _get(sq, "ready", 120 + n * 0.1)
        roles = [("publisher", pub.pid)] + [(f"relays_level{lv}", pid) for lv, pid in levels] + \
            [("subscribers", p.pid) for p in subs]
        cpu0 = {pid: proc_cpu_s(pid) for _, pid in roles}
        go.set()
        t0 = time.monotonic()
        time.sleep(window)
        stop.set()
        dt = time.monotonic() - t0
        cpu1 = {pid: proc_cpu_s(pid) for _, pid in roles}
        rss = {pid: proc_rss_kib(pid) for _, pid in roles}
        sstop.set()
        delivered = min_sub = 0
        for i in range(len(subs)):
            _, total, least = _get(sq, "counted", 60 + drain_s)
            delivered += total
            min_sub = least if i == 0 else min(min_sub, least)
        records = sent.value * PER_MESSAGE
        cpu = {}
        for role, pid in roles:
            cpu[role] = cpu.get(role, 0.0) + cpu1[pid] - cpu0[pid]
        mem = {}
        for role, pid in roles:
            mem[role] = mem.get(role, 0) + rss[pid]
        row.update(ok=True, seconds=dt, records_sent=records, records_delivered=delivered,
                   delivered_fraction=delivered / (records * n) if records else None,
                   slowest_subscriber_fraction=min_sub / records if records else None,
                   records_per_s_delivered=delivered / dt, cpu_s=cpu, rss_kib=mem,
                   pub_cpu_us_per_record=cpu["publisher"] / records * 1e6 if records else None,
                   pub_cpu_ns_per_record_per_sub=cpu["publisher"] / (records * n) * 1e9 if records else None,
                   sub_cpu_us_per_record=cpu["subscribers"] / delivered * 1e6 if delivered else None,
                   relay_levels=len(levels))
        for lv, _ in levels:
            c = cpu[f"relays_level{lv}"]
            row[f"relay_level{lv}_cpu_us_per_record"] = c / records * 1e6 if records else None
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(10)
        shutil.rmtree(tmp, ignore_errors=True)
    row["loadavg_after"] = curves.loadavg()
    return row


def summarise(rows) -> dict:
    out = {}
    for topo in ("direct", "tree"):
        sel = [r for r in rows if r["topology"] == topo and r.get("ok")]
        xs = [r["subscribers"] for r in sel]
        for key in ("pub_cpu_us_per_record", "pub_cpu_ns_per_record_per_sub", "sub_cpu_us_per_record",
                    "records_per_s_delivered", "delivered_fraction"):
            out[f"{topo}.{key}"] = curves.fit(xs, [r.get(key) for r in sel])
        out[f"{topo}.publisher_rss_kib"] = curves.fit(xs, [r["rss_kib"]["publisher"] for r in sel])
        full = [r["subscribers"] for r in sel if r["delivered_fraction"] is not None and r["delivered_fraction"] >= 0.99]
        short = [r["subscribers"] for r in sel if r["delivered_fraction"] is not None and r["delivered_fraction"] < 0.99]
        out[f"{topo}.kept_up_to"] = max(full) if full else None
        out[f"{topo}.fell_behind_from"] = min(short) if short else None
    return out


def run(quick: bool = False, log=print, counts=None, window=None) -> dict:
    p = plan(quick)
    if counts is not None:
        p["counts"] = tuple(counts)
    if window is not None:
        p["window_s"] = float(window)
    t0 = time.monotonic()
    rows = []
    for n in p["counts"]:
        for topo in p["topologies"]:  # interleaved: both topologies of a count run back to back
            r = point(n, topo, p["window_s"], p.get("drain_s", DRAIN_S))
            rows.append(r)
            if r["ok"]:
                log(f"  subscribers N={n:4d} {topo:6s}: delivered {r['delivered_fraction']:.3f} of offered, "
                    f"{r['records_per_s_delivered'] / 1e3:.0f}k rec/s, pub {r['pub_cpu_us_per_record']:.2f} µs/rec "
                    f"({r['pub_cpu_ns_per_record_per_sub']:.0f} ns/rec/sub), sub {r['sub_cpu_us_per_record']:.2f} µs/rec, "
                    f"pub RSS {r['rss_kib']['publisher'] / 1024:.0f} MiB")
            else:
                log(f"  subscribers N={n:4d} {topo}: FAILED {r.get('error')}")
    return {"quick": quick, "plan": p, "rows": rows, "summary": summarise(rows),
            "ok": all(r["ok"] for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
