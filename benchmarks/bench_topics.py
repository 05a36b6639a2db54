"""Case ``topics``: topics per process 1 → 1,000 and the idle cost (issue 28).

One point = ``N`` idle topics: a *publisher process* holding ``N`` ``Publisher`` objects (one
partition each, default options: ``heartbeat_interval=1.0``, the shared
``zmq.Context.instance()``) and a *subscriber process* holding ``N`` ``Subscriber`` objects
(one per topic, ``endpoints=``, no catalog, default ``ping_interval=1.0``), each driven by a
thread of its own blocked in ``for epoch in sub.epochs()`` — as an application with one
consumer thread per topic would. Nothing is published: the only traffic is the publishers'
heartbeats and the subscribers' pings.

Both processes are ``multiprocessing`` spawn children. Once every subscriber is ready, both
wait ``settle`` seconds, then read ``/proc/self`` (threads, open file descriptors, VmRSS) and
``time.process_time()`` (CPU of every thread, libzmq's I/O thread included) at the start and the end of
a ``window`` of idle seconds. ``N = 0`` is the bare process (interpreter, epochstream imported,
nothing opened): the per-topic figures are ``(value(N) - value(0)) / N``.

``fanin``: one idle publisher with N idle subscribers (N in ``plan()["fanin"]``): the
publisher's CPU per idle subscriber (pings in, heartbeats out).

A point that fails (the process cannot open its ``N``-th publisher or subscriber) is recorded
with how many it got and the error: that is where the curve breaks on this machine.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback

from . import curves

FULL_COUNTS = (0, 1, 10, 100, 300, 1000)
QUICK_COUNTS = (0, 1, 10, 100)
FANIN_FULL = (1, 10, 100, 300)
FANIN_QUICK = (1, 30)


def plan(quick: bool) -> dict:
    if quick:
        return {"counts": QUICK_COUNTS, "fanin": FANIN_QUICK, "window_s": 1.5, "settle_s": 0.5}
    return {"counts": FULL_COUNTS, "fanin": FANIN_FULL, "window_s": 20.0, "settle_s": 2.0}


def _open_publishers(n: int) -> tuple[list, str | None]:
    from epochstream import Publisher
    pubs, err = [], None
    try:
        for i in range(n):
            pubs.append(Publisher(f"idle-{i}", codec="msgpack"))
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    return pubs, err


def _open_subscribers(endpoints: list, fanin: bool = False) -> tuple[list, str | None]:
    from epochstream import Subscriber
    subs, err = [], None
    try:
        for i, ep in enumerate(endpoints):
            subs.append(Subscriber("idle-0" if fanin else f"idle-{i}", endpoints=[ep], codec="msgpack",
                                   timeout=60))
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
    for s in subs:
        threading.Thread(target=_consume, args=(s,), daemon=True).start()
    return subs, err


def _consume(sub) -> None:
    try:
        for _ in sub.epochs():
            pass
    except Exception:
        pass


def _holder(role: str, n: int, endpoints, q, go, window: float, settle: float, fanin: bool = False) -> None:
    try:
        import epochstream  # noqa: F401  (the bare process has the package imported)
        base = curves.proc_status()
        if role == "pub":
            objs, err = _open_publishers(1 if fanin and n else n)
            q.put(("endpoints", [p.endpoint for p in objs], err))
        else:
            objs, err = _open_subscribers(endpoints, fanin)
            q.put(("ready", len(objs), err))
        if not go.wait(300):
            raise TimeoutError("never told to measure")
        time.sleep(settle)
        s0 = curves.proc_status()
        time.sleep(window)
        s1 = curves.proc_status()
        q.put(("measured", role, {"opened": len(objs), "error": err, "base": base, "start": s0,
                                  "end": s1, "cpu_frac": (s1["cpu_s"] - s0["cpu_s"]) / window}))
        time.sleep(600)  # the parent kills this process
    except BaseException as exc:
        q.put(("error", role, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _get(q, procs, kind: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = q.get(timeout=1.0)
        except Exception:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                raise TimeoutError(f"no {kind!r} from the holder processes") from None
            continue
        if msg[0] == "error":
            raise RuntimeError(f"{msg[1]}: {msg[2]}")
        if msg[0] == kind:
            return msg


def point(n: int, window: float, settle: float, fanin: bool = False) -> dict:
    """Measure ``n`` idle topics (``fanin``: one idle topic with ``n`` subscribers); returns the
    row (``ok`` False with the error if it broke)."""
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    procs = []
    row = {"topics": n, "mode": "fanin" if fanin else "topics", "window_s": window, "loadavg_before": curves.loadavg(), "ok": False}
    try:
        pub = ctx.Process(target=_holder, args=("pub", n, None, q, go, window, settle, fanin), daemon=True)
        pub.start()
        procs.append(pub)
        _, endpoints, perr = _get(q, procs, "endpoints", 120 + n * 0.2)
        if fanin:
            endpoints = endpoints * n
        sub = ctx.Process(target=_holder, args=("sub", n, endpoints, q, go, window, settle, fanin), daemon=True)
        sub.start()
        procs.append(sub)
        _, ready, serr = _get(q, procs, "ready", 120 + n * 0.2)
        go.set()
        got = {}
        for _ in range(2):
            _, role, m = _get(q, procs, "measured", window + settle + 60)
            got[role] = m
        row.update(publishers=got["pub"], subscribers=got["sub"], publishers_opened=got["pub"]["opened"],
                   subscribers_opened=got["sub"]["opened"], ok=not perr and not serr,
                   error=perr or serr)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    row["loadavg_after"] = curves.loadavg()
    return row


def _per_topic(rows, role: str, key: str) -> list:
    """(N, value(N) - value(0)) for the successful points N > 0 of one process role."""
    rows = [r for r in rows if r.get("mode", "topics") == "topics"]
    base = next((r for r in rows if r["topics"] == 0 and r["ok"]), None)
    if base is None:
        return []
    if key == "cpu_frac":
        b = base[role]["cpu_frac"]
        return [(r["topics"], r[role]["cpu_frac"] - b) for r in rows if r["ok"] and r["topics"] > 0]
    b = base[role]["end"][key]
    return [(r["topics"], r[role]["end"][key] - b) for r in rows if r["ok"] and r["topics"] > 0]


def summarise(rows) -> dict:
    out = {}
    for role in ("publishers", "subscribers"):
        for key in ("threads", "fds", "rss_kib", "cpu_frac"):
            pts = _per_topic(rows, role, key)
            out[f"{role}.{key}"] = {"points": pts, "fit": curves.fit([x for x, _ in pts], [y for _, y in pts]),
                                    "per_topic_at_max": (pts[-1][1] / pts[-1][0]) if pts else None}
    fan = [r for r in rows if r.get("mode") == "fanin" and r["ok"]]
    if fan:
        for role in ("publishers", "subscribers"):
            pts = [(r["topics"], r[role]["cpu_frac"]) for r in fan]
            out[f"fanin.{role}.cpu_frac"] = {"points": pts, "fit": curves.fit([x for x, _ in pts], [y for _, y in pts])}
    broke = [r for r in rows if not r["ok"]]
    out["breaks_at"] = ({"topics": broke[0]["topics"], "publishers_opened": broke[0].get("publishers_opened"),
                         "subscribers_opened": broke[0].get("subscribers_opened"), "error": broke[0].get("error")}
                        if broke else None)
    return out


def run(quick: bool = False, log=print, counts=None, window=None, fanin=None) -> dict:
    p = plan(quick)
    if counts is not None:
        p["counts"] = tuple(counts)
    if fanin is not None:
        p["fanin"] = tuple(fanin)
    if window is not None:
        p["window_s"] = float(window)
    t0 = time.monotonic()
    rows = []
    for n in p["counts"]:
        r = point(n, p["window_s"], p["settle_s"])
        rows.append(r)
        if r["ok"]:
            log(f"  topics N={n:4d}: pub {r['publishers']['cpu_frac'] * 100:.3f} % core, "
                f"{r['publishers']['end']['threads']} threads, {r['publishers']['end']['fds']} fds, "
                f"{r['publishers']['end']['rss_kib'] / 1024:.0f} MiB | sub {r['subscribers']['cpu_frac'] * 100:.3f} % core, "
                f"{r['subscribers']['end']['threads']} threads, {r['subscribers']['end']['fds']} fds, "
                f"{r['subscribers']['end']['rss_kib'] / 1024:.0f} MiB")
        else:
            log(f"  topics N={n:4d}: BROKE {r.get('error')}")
    for n in p.get("fanin", ()):
        r = point(n, p["window_s"], p["settle_s"], fanin=True)
        rows.append(r)
        log(f"  one topic, {n:4d} idle subscribers: " + (
            f"pub {r['publishers']['cpu_frac'] * 100:.3f} % core, {r['publishers']['end']['fds']} fds | subs "
            f"{r['subscribers']['cpu_frac'] * 100:.3f} % core" if r["ok"] else f"BROKE {r.get('error')}"))
    return {"quick": quick, "plan": p, "rows": rows, "summary": summarise(rows),
            "ok": all(r["ok"] for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
