"""Case ``scale``: partitions, antichain width and epoch size, end to end over tcp.

Three groups, each interleaved within a repeat (A, B, C, ..., A, B, C, ...), time-based runs
(``paired.seconds``), every record counted at the subscriber:

- **partitions** 1, 2, 4, 8, 16 (full; quick: 1, 4, 16): one publisher process per partition,
  one subscriber process, msgpack tuples, 100 records per message, 16 messages per epoch over
  all partitions (16/p per partition), ``epochs()`` API, harness window flow control;
- **antichain width** 1, 4, 16, 64 (full; quick: 1, 8, 64): a ``product(2)`` topic
  whose publisher holds ``w`` incomparable capabilities at once (:func:`streams.antichain_times`),
  sends 64 messages of 100 tuples per step round-robin over the ``w`` times, then one
  ``progress`` call downgrades all ``w`` by (1, 1) — so the lower frontier always has width
  ``w`` and every step completes ``w`` epochs. The subscriber (this process, ``epochs()``,
  ``Subscriber(credit=...)`` flow control) counts records and epochs;
- **epoch size vs records per message**: 1000-record epochs sent as 1 × 1000, 10 × 100 and
  100 × 10 records (msgpack tuples, one partition, ``epochs()``, harness), coalescing on (the
  default; the wire messages per record are reported) — does throughput depend on the epoch
  or on the message?
"""

from __future__ import annotations

import os
import time

from . import harness, paired
from .streams import PublisherProcess

PER_STEP = 64
CREDIT = 1000


def plan(quick: bool):
    if quick:
        return {"partitions": (1, 4, 16), "widths": (1, 8, 64), "epoch_sizes": ((1000, 1), (100, 10), (10, 100)),
                "repeats": 1}
    # widths 2, 8, 32 and a third repeat cut for the 20-minute budget of `make bench`
    return {"partitions": (1, 2, 4, 8, 16), "widths": (1, 4, 16, 64),
            "epoch_sizes": ((1000, 1), (100, 10), (10, 100)), "repeats": 2}


def antichain_run(width: int, seconds: float, per_message: int = 100) -> dict:
    from epochstream import Subscriber
    pub = PublisherProcess({"pattern": "antichain", "width": width, "messages_per_step": PER_STEP,
                            "duration": seconds, "kind": "tuples", "per_message": per_message,
                            "max_queue_messages": 2 * CREDIT})
    records = epochs = 0
    row = {"system": "epochstream", "order": "product(2)", "width": width, "records_per_message": per_message,
           "messages_per_step": PER_STEP, "duration_s": seconds, "ok": False}
    try:
        sub = Subscriber(pub.topic, endpoints=[pub.endpoint], order="product(2)", codec="msgpack",
                         rcvhwm=100_000, credit=CREDIT, timeout=60)
        if not sub.wait_ready(30):
            raise TimeoutError("subscriber not ready")
        cpu0 = time.process_time()
        t0 = time.monotonic()
        pub.start()
        for ep in sub.epochs(timeout=60):
            if hasattr(ep, "records"):
                records += len(ep.records)
                epochs += 1
        dt = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        stats = dict(sub.stats)
        sub.close()
        res = pub.result()
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row
    finally:
        pub.kill()
    ok = records == res["records"]
    row.update(ok=ok, records=records, published_records=res["records"], epochs=epochs, steps=res.get("steps"),
               seconds=dt, records_per_s=records / dt, epochs_per_s=epochs / dt,
               pub_cpu_s_per_M=res["cpu_s"] / (records / 1e6) if records else None,
               sub_cpu_s_per_M=cpu / (records / 1e6) if records else None,
               sub_cpu_us_per_step=cpu / res["steps"] * 1e6 if res.get("steps") else None,
               pub_cpu_us_per_step=res["cpu_s"] / res["steps"] * 1e6 if res.get("steps") else None,
               pub_stats=res.get("stats"), sub_stats=stats)
    if not ok:
        row["error"] = f"record count mismatch: sent {res['records']}, received {records}"
    return row


def _summ(rows, key):
    return paired.summary([r[key] for r in rows if r.get("ok") and r.get(key) is not None])


def run(quick: bool = False, log=print) -> dict:
    p = plan(quick)
    seconds = paired.seconds(quick)
    reps = paired.repeats(quick) if "BENCH_REPEATS" in os.environ else p["repeats"]
    t0 = time.monotonic()

    def part(label, rep):
        n = int(label)
        r = harness.run("epochstream", kind="tuples", per_message=100, partitions=n, messages_per_epoch=16,
                        api="epochs", duration=seconds, time_limit=90 + 3 * seconds)
        log(f"  scale partitions={n:2d} #{rep}: " + (f"{r['records_per_s'] / 1e6:.2f}M rec/s, pub CPU "
            f"{r['pub_cpu_s_per_M']:.2f} s/M, sub {r['sub_cpu_s_per_M'][0]:.2f} s/M" if r["ok"] else f"FAILED {r.get('error')}"))
        return r

    def width(label, rep):
        r = antichain_run(int(label), seconds)
        log(f"  scale width={int(label):2d} #{rep}: " + (f"{r['records_per_s'] / 1e6:.2f}M rec/s, "
            f"{r['epochs_per_s']:.0f} epochs/s, sub {r['sub_cpu_us_per_step']:.0f} µs CPU/step" if r["ok"]
            else f"FAILED {r.get('error')}"))
        return r

    def esize(label, rep):
        rpm, mpe = (int(x) for x in label.split("x"))
        r = harness.run("epochstream", kind="tuples", per_message=rpm, messages_per_epoch=mpe, api="epochs",
                        duration=seconds, time_limit=60 + 3 * seconds)
        log(f"  scale epoch 1000 = {mpe} x {rpm} #{rep}: " + (f"{r['records_per_s'] / 1e6:.2f}M rec/s, wire msgs/rec "
            f"{r['wire_messages_per_record']:.4f}" if r["ok"] else f"FAILED {r.get('error')}"))
        return r

    parts = paired.interleave([str(n) for n in p["partitions"]], reps, part, log=log)
    widths = paired.interleave([str(w) for w in p["widths"]], reps, width, log=log)
    sizes = paired.interleave([f"{rpm}x{mpe}" for rpm, mpe in p["epoch_sizes"]], reps, esize, log=log)

    def group(rows, labels, base):
        out = []
        for lab in labels:
            sel = [r for r in rows if r["variant"] == lab]
            e = {"variant": lab, "runs": len(sel), "ok_runs": sum(1 for r in sel if r["ok"]),
                 "records_per_s": _summ(sel, "records_per_s"), "pub_cpu_s_per_M": _summ(sel, "pub_cpu_s_per_M"),
                 "vs_first": paired.summary(paired.pair_ratios(rows, lab, base)) if lab != base else None}
            if sel and "epochs_per_s" in sel[0]:
                e["epochs_per_s"] = _summ(sel, "epochs_per_s")
                e["sub_cpu_us_per_step"] = _summ(sel, "sub_cpu_us_per_step")
                e["pub_cpu_us_per_step"] = _summ(sel, "pub_cpu_us_per_step")
                e["sub_cpu_s_per_M"] = _summ(sel, "sub_cpu_s_per_M")
            else:
                e["sub_cpu_s_per_M"] = paired.summary([r["sub_cpu_s_per_M"][0] for r in sel if r["ok"]])
                e["wire_messages_per_record"] = _summ(sel, "wire_messages_per_record")
            out.append(e)
        return out

    pl = [str(n) for n in p["partitions"]]
    wl = [str(w) for w in p["widths"]]
    sl = [f"{rpm}x{mpe}" for rpm, mpe in p["epoch_sizes"]]
    rows = parts + widths + sizes
    return {"quick": quick, "repeats": reps, "seconds_per_run": seconds, "plan": p,
            "partitions": group(parts, pl, pl[0]), "widths": group(widths, wl, wl[0]),
            "epoch_sizes": group(sizes, sl, sl[0]),
            "rows": {"partitions": parts, "widths": widths, "epoch_sizes": sizes},
            "ok": all(r["ok"] for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
