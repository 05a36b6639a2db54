"""Case ``security`` (issue 15): the throughput cost of CURVE (docs/security.md).

One publisher process streams msgpack dict records (``RECORDS_PER_MESSAGE`` per message,
``MESSAGES_PER_EPOCH`` per epoch, pre-encoded bodies) for a fixed time to one subscriber
process with credit-based flow control (``credit=256`` messages: the publisher runs at the
subscriber's pace and nothing is lost). Two variants of the same run:

- ``plain``: ``Publisher(...)``, ``Subscriber(...)`` over plain TCP (the default);
- ``curve``: ``Publisher(..., security=Security.curve(server_secret=..., allow=...))`` and
  ``Subscriber(..., security=Security.curve(client_secret=...))``, the key found in the
  catalog, a ``subscribe`` grant checked at the hello.

Both decode everything they receive. Measured per run: delivered records per second (first
epoch to last), publisher and subscriber CPU seconds per million records (``process_time``).
Variants interleaved per repeat (paired.py rules: the same run lengths and repeats as every
case, ``BENCH_SCALE`` and ``BENCH_REPEATS`` change them); ratios per repeat: ``plain / curve`` records/s and
``curve / plain`` CPU per record. ``python -m benchmarks.bench_security`` writes
``benchmarks/results/security.json``; run it on a quiet machine.
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
CREDIT = 256
VARIANTS = ("plain", "curve")

_ids = iter(range(1, 1 << 30))


def _records(msg: int) -> list:
    return [{"k": i % 10, "i": i, "m": msg, "v": i * 0.5, "s": "x" * 8}
            for i in range(RECORDS_PER_MESSAGE)]


def _security(cfg, side: str):
    if cfg["mode"] != "curve":
        return None
    from epochstream import Security
    if side == "pub":
        return Security.curve(server_secret=os.path.join(cfg["keys"], "server.key_secret"),
                              allow=cfg["allow"])
    return Security.curve(client_secret=os.path.join(cfg["keys"], "client.key_secret"))


def _pub_main(cfg, q, go):
    try:
        from epochstream import Catalog, Publisher
        from epochstream.wire import codec
        bodies = [codec("msgpack").encode(_records(m)) for m in range(8)]
        pub = Publisher(cfg["topic"], catalog=Catalog(cfg["dir"]), sndhwm=100_000,
                        heartbeat_interval=1.0, coalesce_bytes=0,
                        security=_security(cfg, "pub"))
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
        pub.close(linger=30)
        pub.join(35)
        q.put(("published", {"epochs": e, "messages": msgs, "cpu_s": cpu,
                             "wall_s": time.monotonic() - t0}))
    except BaseException as exc:
        q.put(("error", f"publisher: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _sub_main(cfg, q, go):
    try:
        from epochstream import Catalog, Subscriber
        sub = Subscriber(cfg["topic"], Catalog(cfg["dir"]), credit=CREDIT, rcvhwm=100_000,
                         timeout=60, security=_security(cfg, "sub"))
        if not sub.wait_ready(30):
            raise TimeoutError("not ready")
        q.put(("ready", None))
        cpu0 = time.process_time()
        n = 0
        t_first = t_end = None
        for ep in sub.epochs(timeout=60):
            n += len(ep.records)
            if t_first is None:
                t_first = time.monotonic()
            t_end = time.monotonic()
        q.put(("done", {"records": n, "cpu_s": time.process_time() - cpu0,
                        "t_first": t_first, "t_end": t_end}))
        sub.close()
    except BaseException as exc:
        q.put(("error", f"subscriber: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _keys(d: str) -> tuple[str, str]:
    """Key pairs ``server`` and ``client`` in ``d/keys``, the client's public certificate in
    ``d/allow``, and a grant for it in the catalog at ``d/catalog``."""
    import zmq.auth

    from epochstream import Catalog
    keys, allow = os.path.join(d, "keys"), os.path.join(d, "allow")
    os.makedirs(allow)
    os.makedirs(keys)
    zmq.auth.create_certificates(keys, "server")
    pub_file, _ = zmq.auth.create_certificates(keys, "client")
    shutil.copy(pub_file, allow)
    Catalog(os.path.join(d, "catalog")).grant("client", "*", "subscribe")
    return keys, allow


def run_one(mode: str, duration: float) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go = ctx.Event()
    d = tempfile.mkdtemp(prefix="es-bench-security-")
    keys, allow = _keys(d)
    cfg = {"topic": f"sec-{os.getpid()}-{next(_ids)}", "dir": os.path.join(d, "catalog"),
           "mode": mode, "duration": duration, "keys": keys, "allow": allow}
    procs = [ctx.Process(target=_pub_main, args=(cfg, q, go), daemon=True)]
    row = {"mode": mode, "duration_s": duration, "loadavg_before": round(os.getloadavg()[0], 2)}
    try:
        procs[0].start()
        wait_report(q, procs, 60, "endpoint")
        procs.append(ctx.Process(target=_sub_main, args=(cfg, q, go), daemon=True))
        procs[1].start()
        wait_report(q, procs, 60, "ready")
        go.set()
        pub = sub = None
        while pub is None or sub is None:
            kind, value = wait_report(q, procs, duration + 120, None)
            if kind == "published":
                pub = value
            elif kind == "done":
                sub = value
        expect = pub["messages"] * RECORDS_PER_MESSAGE
        ok = sub["records"] == expect and sub["t_first"] is not None
        secs = (sub["t_end"] - sub["t_first"]) if ok else 0.0
        row.update(ok=ok and secs > 0, epochs=pub["epochs"], records=sub["records"],
                   records_per_s=sub["records"] / secs if secs > 0 else None,
                   pub_cpu_s_per_M=pub["cpu_s"] / max(1, sub["records"]) * 1e6,
                   sub_cpu_s_per_M=sub["cpu_s"] / max(1, sub["records"]) * 1e6,
                   seconds=round(secs, 3), loadavg_after=round(os.getloadavg()[0], 2))
        if not ok:
            row["error"] = f"expected {expect} records, got {sub['records']}"
    except Exception as exc:
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        reap(procs)
        shutil.rmtree(d, ignore_errors=True)
    return row


def run(quick: bool = False, log=print) -> dict:
    seconds = paired.seconds(quick)  # the measurement rules: 5 s runs, 5 paired repeats
    n_rep = paired.repeats(quick)
    t_all = time.monotonic()

    def one(mode, rep):
        r = run_one(mode, seconds)
        log(f"  security #{rep} {mode:5s}: "
            + (f"{r['records_per_s'] / 1e6:.2f} M rec/s, pub {r['pub_cpu_s_per_M']:.3f} s/M, "
               f"sub {r['sub_cpu_s_per_M']:.3f} s/M" if r.get("ok")
               else f"FAILED {r.get('error')}"))
        return r

    rows = paired.interleave(list(VARIANTS), n_rep, one, log=log)
    ratios = []
    for key, what, a, b in (("records_per_s", "records/s, plain ÷ curve", "plain", "curve"),
                            ("pub_cpu_s_per_M", "publisher CPU per record, curve ÷ plain",
                             "curve", "plain"),
                            ("sub_cpu_s_per_M", "subscriber CPU per record, curve ÷ plain",
                             "curve", "plain")):
        ps = paired.summary(paired.pair_ratios(rows, a, b, key=key))
        ratios.append({"key": key, "what": what, "paired": ps})
        if ps:
            log(f"  {what}: {ps['median']:.2f} ({ps['min']:.2f}–{ps['max']:.2f}, n={ps['n']})")
    return {"case": "security", "quick": quick, "seconds_per_run": seconds, "repeats": n_rep,
            "records_per_message": RECORDS_PER_MESSAGE, "messages_per_epoch": MESSAGES_PER_EPOCH,
            "credit": CREDIT, "library": _library(), "rows": rows, "ratios": ratios,
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t_all, 1)}


if __name__ == "__main__":
    import json
    import sys
    from . import save_result
    res = run(quick="--quick" in sys.argv)
    print(json.dumps(res["ratios"], indent=1)[:4000])
    if "--no-save" not in sys.argv:
        save_result("security", res)
