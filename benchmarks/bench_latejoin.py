"""Case ``latejoin``: time from ``Subscriber(...)`` to its first complete epoch while a publisher
streams at a steady rate.

A publisher process sends epochs of a fixed size (10 messages × 100 msgpack tuples) at a
steady rate (100 epochs/s, i.e. a new epoch every 10 ms) for the whole case. This process then,
``samples`` times: waits a random 0–10 ms (so joins fall at every phase of the epoch cycle),
constructs ``Subscriber(topic, endpoints=[...])``, iterates ``epochs()`` until the first
complete :class:`Epoch`, records the time since just before the constructor
(``time.perf_counter``), and closes the subscriber. Reported: p50/p90/p99/max, and how the time
splits into "constructor returned" and "first epoch", with the epoch period for scale (a join
must wait for the next epoch to begin and complete: up to about one period).
"""

from __future__ import annotations

import os
import random
import time

from . import paired
from .streams import PublisherProcess, percentile

RATE = 100.0           # epochs/s
MESSAGES_PER_EPOCH = 10
PER_MESSAGE = 100


def run(quick: bool = False, log=print, samples: int | None = None) -> dict:
    """``samples``: joins to time (default 40 quick, 200 full; the result is ``ok`` only with at
    least 30, all successful)."""
    from epochstream import Subscriber
    if samples is None:
        samples = 40 if quick else 200
        if "BENCH_SCALE" in os.environ:
            samples = max(30, int(samples * min(1.0, paired.scale())))
    t0 = time.monotonic()
    pub = PublisherProcess({"pattern": "steady", "rate": RATE, "messages_per_epoch": MESSAGES_PER_EPOCH,
                            "kind": "tuples", "per_message": PER_MESSAGE})
    rows = []
    rng = random.Random(1)
    try:
        pub.start()
        time.sleep(0.3)  # streaming steadily before the first join
        for i in range(samples):
            time.sleep(rng.uniform(0, 1.0 / RATE))
            t_a = time.perf_counter()
            sub = Subscriber(pub.topic, endpoints=[pub.endpoint], codec="msgpack", timeout=10)
            t_b = time.perf_counter()
            first = None
            try:
                for ep in sub.epochs(timeout=10):
                    if hasattr(ep, "records"):
                        first = ep
                        break
            finally:
                t_c = time.perf_counter()
                sub.close()
            ok = first is not None and len(first.records) == MESSAGES_PER_EPOCH * PER_MESSAGE
            rows.append({"sample": i, "ok": ok, "join_to_epoch_ms": (t_c - t_a) * 1e3,
                         "constructor_ms": (t_b - t_a) * 1e3,
                         "epoch_records": None if first is None else len(first.records),
                         "epoch_messages": None if first is None else first.messages})
        pub.stop()
        published = pub.result()
    finally:
        pub.kill()
    lat = sorted(r["join_to_epoch_ms"] for r in rows if r["ok"])
    ctor = sorted(r["constructor_ms"] for r in rows if r["ok"])
    summary = {"samples": len(lat), "failed": len(rows) - len(lat),
               "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "p99_ms": percentile(lat, 99),
               "max_ms": lat[-1] if lat else None, "min_ms": lat[0] if lat else None,
               "constructor_p50_ms": percentile(ctor, 50), "constructor_p99_ms": percentile(ctor, 99)}
    log(f"  latejoin: {summary['samples']} samples, p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms "
        f"(constructor p50 {summary['constructor_p50_ms']:.1f} ms); epoch period {1e3 / RATE:.0f} ms")
    return {"quick": quick, "rate_epochs_per_s": RATE, "messages_per_epoch": MESSAGES_PER_EPOCH,
            "records_per_message": PER_MESSAGE, "payload": "tuples", "rows": rows, "summary": summary,
            "publisher": published, "ok": not summary["failed"] and len(lat) >= 30,
            "wall_s": round(time.monotonic() - t0, 1)}
