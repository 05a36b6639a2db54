"""Case ``pushdown`` (issue 14): filtering at the source against dropping at the subscriber.

One publisher process streams msgpack dict records (``RECORDS_PER_MESSAGE`` per message,
``MESSAGES_PER_EPOCH`` per epoch, key column ``k`` with ten values spread evenly over every
message) for a fixed time, to ``n`` subscriber processes, each with credit-based flow control
(``credit=256`` messages, so the publisher runs at the slowest subscriber's pace and nothing is
lost). Two ways for a subscriber to get the records whose key is in a set of 1, 5 or 10 of the
ten values (10 %, 50 %, 100 % selected):

- ``source``: ``Subscriber(..., keys=K)``: the publisher filters and re-encodes each message
  once per distinct filter; the subscriber re-checks what it receives (as always);
- ``local``: ``Subscriber(...)`` with no filter, and the consumer keeps the matching records of
  each epoch itself with the same evaluator (``Filter(keys=K).apply_records``) — what a user
  does without pushdown.

Both decode everything they receive. ``via``: ``direct`` (subscribers read the publisher) or
``relay`` (a ``Relay`` process between them, subscribers read ``topic@edge``; in ``source`` mode
the relay subscribes upstream with the cover of its subscribers' filters, so the upstream link
carries only those records too — ``upstream_bytes_per_record``, the relay's received payload
bytes per record a subscriber gets). Measured per run: records delivered (matching) per
second, bytes of payload received per delivered record (the subscriber's ``stats["bytes"]``:
what crossed the network, frames' payloads), subscriber CPU seconds per million delivered
records (mean over subscribers), publisher CPU seconds per million delivered records (all
subscribers' deliveries counted). Variants interleaved per repeat (paired.py rules); ratios
``local / source`` per repeat.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback

from . import paired
from .harness import reap, wait_report
from .provenance import library as _library

RECORDS_PER_MESSAGE = 1000
MESSAGES_PER_EPOCH = 10
KEYS = 10
SELECTIVITY = {10: 1, 50: 5, 100: 10}  # percent -> number of the ten key values
SUBSCRIBERS = (1, 8, 32)
VIAS = ("direct", "relay")
CREDIT = 256
QUEUE_BYTES = 16 << 20
"""Per-subscriber backlog bound of the publisher and the relay (``max_queue_bytes``): with
credit flow control the producer is held back once a subscriber's backlog reaches it, so the
stream runs at the subscribers' pace instead of queueing up to the 256 MiB default per
subscriber (which on two cores with 8+ subscribers takes longer to drain than a run lasts)."""

_ids = iter(range(1, 1 << 30))


def _records(msg: int) -> list:
    return [{"k": i % KEYS, "i": i, "m": msg, "v": i * 0.5, "s": "x" * 8}
            for i in range(RECORDS_PER_MESSAGE)]


def _pub_main(cfg, q, go):
    try:
        from epochstream import Catalog, Publisher
        from epochstream.wire import codec
        bodies = [codec("msgpack").encode(_records(m)) for m in range(8)]
        pub = Publisher(cfg["topic"], catalog=Catalog(cfg["dir"]), key="k", sndhwm=100_000,
                        heartbeat_interval=1.0, coalesce_bytes=0, max_queue_bytes=QUEUE_BYTES)
        q.put(("endpoint", None))
        if not go.wait(120):
            raise TimeoutError("never started")
        cpu0, t0 = time.process_time(), time.monotonic()
        e = msgs = 0
        while time.monotonic() - t0 < cfg["duration"]:
            for _ in range(MESSAGES_PER_EPOCH):
                pub.send_encoded(e, bodies[msgs % len(bodies)])
                msgs += 1
            pub.advance_to(e + 1)
            e += 1
        pub.flush(60)
        cpu = time.process_time() - cpu0
        stats = dict(pub.stats)
        pub.close(linger=30)
        q.put(("published", {"epochs": e, "messages": msgs, "cpu_s": cpu,
                             "wall_s": time.monotonic() - t0,
                             "filter_encodings": stats.get("filter_encodings", 0)}))
    except BaseException as exc:
        q.put(("error", f"publisher: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _relay_main(cfg, q, go):
    try:
        from epochstream import Catalog, Relay
        relay = Relay(cfg["topic"], Catalog(cfg["dir"]), tier="edge", credit=CREDIT,
                      heartbeat_interval=0.2, sndhwm=100_000, max_queue_bytes=QUEUE_BYTES)
        q.put(("relay-ready", None))
        cpu0 = time.process_time()
        if not relay.join(cfg["duration"] + 300):
            raise TimeoutError("the relay did not finish")
        q.put(("relay", {"upstream_bytes": relay._up.stats["bytes"],
                         "cpu_s": time.process_time() - cpu0,
                         "upstream_changes": relay.stats["upstream_changes"],
                         "error": None if relay.error is None else str(relay.error)}))
        relay.close()
    except BaseException as exc:
        q.put(("error", f"relay: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _sub_main(cfg, q, go):
    try:
        from epochstream import Catalog, Subscriber
        from epochstream.filters import Filter
        keys = set(range(SELECTIVITY[cfg["pct"]]))
        kw = {"keys": keys} if cfg["mode"] == "source" else {}
        topic = cfg["topic"] + ("@edge" if cfg["via"] == "relay" else "")
        sub = Subscriber(topic, Catalog(cfg["dir"]), credit=CREDIT, rcvhwm=100_000,
                         timeout=60, **kw)
        if not sub.wait_ready(30):
            raise TimeoutError("not ready")
        local = Filter(keys=keys) if cfg["mode"] == "local" else None
        q.put(("ready", None))
        cpu0 = time.process_time()
        n = 0
        t_first = t_end = None
        for ep in sub.epochs(timeout=60):
            records = ep.records if local is None else local.apply_records(ep.records, "k")
            n += len(records)
            if t_first is None:
                t_first = time.monotonic()
            t_end = time.monotonic()
        q.put(("done", {"records": n, "bytes": sub.stats["bytes"],
                        "messages": sub.stats["messages"], "cpu_s": time.process_time() - cpu0,
                        "t_first": t_first, "t_end": t_end}))
        sub.close()
    except BaseException as exc:
        q.put(("error", f"subscriber: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_one(mode: str, pct: int, n_subs: int, duration: float, via: str = "direct") -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go = ctx.Event()
    d = tempfile.mkdtemp(prefix="es-bench-pushdown-")
    cfg = {"topic": f"push-{os.getpid()}-{next(_ids)}", "dir": d, "mode": mode, "pct": pct,
           "duration": duration, "via": via}
    procs = [ctx.Process(target=_pub_main, args=(cfg, q, go), daemon=True)]
    row = {"mode": mode, "via": via, "selectivity_pct": pct, "subscribers": n_subs,
           "duration_s": duration,
           "loadavg_before": round(os.getloadavg()[0], 2)}
    try:
        procs[0].start()
        wait_report(q, procs, 60, "endpoint")
        if via == "relay":
            r = ctx.Process(target=_relay_main, args=(cfg, q, go), daemon=True)
            r.start()
            procs.append(r)
            wait_report(q, procs, 60, "relay-ready")
        for _ in range(n_subs):
            p = ctx.Process(target=_sub_main, args=(cfg, q, go), daemon=True)
            p.start()
            procs.append(p)
        for _ in range(n_subs):
            wait_report(q, procs, 60, "ready")
        t0 = time.monotonic()
        go.set()
        pub, subs, relay = None, [], None
        while pub is None or len(subs) < n_subs or (via == "relay" and relay is None):
            kind, value = wait_report(q, procs, duration + 120, None)
            if kind == "published":
                pub = value
            elif kind == "done":
                subs.append(value)
            elif kind == "relay":
                relay = value
        expect = pub["messages"] * RECORDS_PER_MESSAGE * SELECTIVITY[pct] // KEYS
        ok = all(s["records"] == expect for s in subs)
        delivered = sum(s["records"] for s in subs)
        secs = max(s["t_end"] for s in subs) - t0
        row.update(ok=ok, epochs=pub["epochs"], records_per_sub=expect,
                   records_per_s=delivered / secs / n_subs,
                   bytes_per_record=sum(s["bytes"] for s in subs) / delivered,
                   sub_cpu_s_per_M=sum(s["cpu_s"] for s in subs) / delivered * 1e6,
                   pub_cpu_s_per_M=pub["cpu_s"] / delivered * 1e6,
                   filter_encodings=pub["filter_encodings"], seconds=round(secs, 3),
                   loadavg_after=round(os.getloadavg()[0], 2))
        if relay is not None:
            row.update(upstream_bytes_per_record=relay["upstream_bytes"] / max(1, expect),
                       relay_cpu_s_per_M=relay["cpu_s"] / delivered * 1e6,
                       upstream_changes=relay["upstream_changes"])
        if not ok:
            row["error"] = (f"expected {expect} records per subscriber, got "
                            f"{[s['records'] for s in subs]}")
    except Exception as exc:
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        reap(procs)
        shutil.rmtree(d, ignore_errors=True)
    return row


def run(quick: bool = False, log=print, *, subs=None, vias=None, pcts=None, repeats=None,
        seconds=None) -> dict:
    """The grid ``subs`` × ``vias`` × ``pcts`` (defaults: :data:`SUBSCRIBERS`, :data:`VIAS`, the
    three selectivities; quick: 1 subscriber, direct), ``repeats`` paired repeats of
    ``seconds`` each (defaults: :mod:`paired`'s rules)."""
    seconds = seconds or paired.seconds(quick)
    n_rep = repeats or paired.repeats(quick)
    subs = subs or ((1,) if quick else SUBSCRIBERS)
    vias = vias or (("direct",) if quick else VIAS)
    pcts = pcts or tuple(SELECTIVITY)
    t_all = time.monotonic()
    rows = []
    for rep in range(n_rep):
        for via in vias:
            for n in subs:
                for pct in pcts:
                    for mode in ("source", "local"):
                        r = run_one(mode, pct, n, seconds, via)
                        r["variant"], r["repeat"] = f"{mode}-{pct}-{n}-{via}", rep
                        rows.append(r)
                        log(f"  pushdown #{rep} {r['variant']:20s}: "
                            + (f"{r['records_per_s'] / 1e6:.2f} M rec/s per sub, "
                               f"{r['bytes_per_record']:.1f} B/rec, sub "
                               f"{r['sub_cpu_s_per_M']:.3f} s/M, pub {r['pub_cpu_s_per_M']:.3f} "
                               f"s/M" if r.get("ok") else f"FAILED {r.get('error')}"))
    ratios = []
    for via, n, pct in ((v, n, p) for v in vias for n in subs for p in pcts):
        keys = [("bytes_per_record", "bytes on the wire per delivered record, local ÷ source",
                 5.0 if pct == 10 else None),
                ("sub_cpu_s_per_M", "subscriber CPU per delivered record, local ÷ source",
                 3.0 if pct == 10 else None),
                ("pub_cpu_s_per_M", "publisher CPU per delivered record, local ÷ source", None),
                ("records_per_s", "delivered records/s per subscriber, source ÷ local", None)]
        if via == "relay":
            keys.append(("upstream_bytes_per_record",
                         "bytes on the relay's upstream link per delivered record, local ÷ source",
                         None))
        for key, what, target in keys:
            a, b = f"local-{pct}-{n}-{via}", f"source-{pct}-{n}-{via}"
            if key == "records_per_s":
                a, b = b, a
            ps = paired.summary(paired.pair_ratios(rows, a, b, key=key))
            ratios.append({"subscribers": n, "via": via, "selectivity_pct": pct, "key": key,
                           "what": what, "target": target, "paired": ps,
                           "verdict": paired.verdict(ps, target) if target else None})
            if ps:
                log(f"  {n} sub {via}, {pct:3d} %: {what}: {ps['median']:.2f} "
                    f"({ps['min']:.2f}–{ps['max']:.2f}, n={ps['n']})"
                    + (f" target ≥ {target}: {ratios[-1]['verdict']}" if target else ""))
    return {"case": "pushdown", "quick": quick, "seconds_per_run": seconds, "repeats": n_rep,
            "records_per_message": RECORDS_PER_MESSAGE, "messages_per_epoch": MESSAGES_PER_EPOCH,
            "credit": CREDIT, "max_queue_bytes": QUEUE_BYTES, "library": _library(),
            "rows": rows, "ratios": ratios,
            "grid": {"subscribers": list(subs), "via": list(vias), "selectivity_pct": list(pcts)},
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t_all, 1)}


if __name__ == "__main__":
    import argparse
    import json
    from . import save_result
    ap = argparse.ArgumentParser(description="filters at the source against dropping locally")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--subs", help="comma-separated subscriber counts, e.g. 1,8,32")
    ap.add_argument("--via", help="direct,relay")
    ap.add_argument("--pct", help="selectivities in percent: 10,50,100")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--save", default="pushdown", help="result name (benchmarks/results/NAME.json)")
    a = ap.parse_args()
    ints = lambda v: tuple(int(x) for x in v.split(",")) if v else None  # noqa: E731
    res = run(quick=a.quick, subs=ints(a.subs), vias=tuple(a.via.split(",")) if a.via else None,
              pcts=ints(a.pct), repeats=a.repeats, seconds=a.seconds)
    print(json.dumps(res["ratios"], indent=1)[:4000])
    save_result(a.save, res)
