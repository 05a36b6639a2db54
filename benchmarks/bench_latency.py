"""Case ``latency``: epoch latency under load — p50/p99/p99.9 at 10 %, 50 % and 90 % of peak.

Configuration: msgpack tuples, 100 records per message, 10 messages per epoch (1000 records
per epoch), one partition, one subscriber, the default Publisher (coalescing on).

1. Peak: a time-based throughput run of exactly this configuration through the harness (window
   flow control, every record counted) in the same run: ``peak`` records/s → ``peak / 1000``
   epochs/s.
2. For each load level (10 %, 50 %, 90 % of peak, in that order) a publisher process sends
   epochs open loop at that rate (epoch ``e`` is due at ``t0 + e / rate``; a late one goes out at
   once, the schedule does not shift). It reads ``time.time()`` just before the last send of each
   epoch (then ``advance_to(e + 1)``); this process is the subscriber (``epochs()``), whose
   ``Epoch.released_at`` is the ``time.time()`` of the release. Latency = release − last send.
   ``time.time()`` is one system clock, shared by the two processes on this machine. The first
   ``WARMUP`` epochs are not counted.

Full mode: >= 10,000 samples per level (capped at ``MAX_LEVEL_S`` seconds of sending per level;
the result says when the cap cut samples). Quick mode: 1,000 samples per level, labelled.
"""

from __future__ import annotations

import time

from . import harness, paired
from .streams import PublisherProcess, percentile

KIND, PER_MESSAGE, MPE = "tuples", 100, 10
LEVELS = (0.1, 0.5, 0.9)
WARMUP = 50
MAX_LEVEL_S = 60.0


def _level(rate_eps: float, samples: int, log) -> dict:
    from epochstream import Subscriber
    n = samples + WARMUP
    pub = PublisherProcess({"pattern": "paced", "rate": rate_eps, "epochs": n, "messages_per_epoch": MPE,
                            "kind": KIND, "per_message": PER_MESSAGE}, t_send_len=n)
    release = {}
    records = 0
    try:
        sub = Subscriber(pub.topic, endpoints=[pub.endpoint], codec="msgpack", rcvhwm=1_000_000, timeout=30)
        if not sub.wait_ready(30):
            raise TimeoutError("subscriber not ready")
        cpu0 = time.process_time()
        pub.start()
        for ep in sub.epochs(timeout=30):
            if hasattr(ep, "records"):
                release[ep.time] = ep.released_at
                records += len(ep.records)
        cpu = time.process_time() - cpu0
        sub.close()
        published = pub.result()
    finally:
        pub.kill()
    t_send = pub.t_send
    lat = sorted((release[e] - t_send[e]) * 1e3 for e in range(WARMUP, n) if e in release)
    ok = records == published["records"] and len(release) == n
    return {"ok": ok, "rate_epochs_per_s": rate_eps, "rate_records_per_s": rate_eps * MPE * PER_MESSAGE,
            "epochs": n, "warmup": WARMUP, "samples": len(lat), "records": records,
            "published_records": published["records"],
            "achieved_epochs_per_s": published.get("achieved_epochs_per_s"),
            "late_epochs": published.get("late_epochs"), "pub_cpu_s": published["cpu_s"], "sub_cpu_s": cpu,
            "pub_stats": published.get("stats"),
            "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "p99_ms": percentile(lat, 99),
            "p999_ms": percentile(lat, 99.9), "max_ms": lat[-1] if lat else None,
            "min_ms": lat[0] if lat else None}


def run(quick: bool = False, log=print) -> dict:
    t0 = time.monotonic()
    seconds = paired.seconds(quick)
    target = 1000 if quick else 10_000
    target = max(100, int(target * min(1.0, paired.scale())))
    peak = harness.run("epochstream", kind=KIND, per_message=PER_MESSAGE, messages_per_epoch=MPE,
                       api="epochs", duration=seconds, time_limit=60 + 3 * seconds)
    if not peak["ok"]:
        return {"quick": quick, "ok": False, "error": f"peak run failed: {peak.get('error')}", "peak": peak,
                "wall_s": round(time.monotonic() - t0, 1)}
    peak_eps = peak["records_per_s"] / (MPE * PER_MESSAGE)
    log(f"  latency: peak {peak['records_per_s'] / 1e6:.2f}M rec/s = {peak_eps:.0f} epochs/s ({peak['seconds']:.1f} s)")
    levels = []
    for frac in LEVELS:
        rate = frac * peak_eps
        samples = target
        capped = False
        if samples / rate > MAX_LEVEL_S:
            samples, capped = int(rate * MAX_LEVEL_S), True
        r = _level(rate, samples, log)
        r["fraction_of_peak"] = frac
        r["capped_by_time"] = capped
        levels.append(r)
        log(f"  latency {frac:.0%} of peak ({rate:.0f} epochs/s, {r['samples']} samples): "
            f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms p99.9 {r['p999_ms']:.2f} ms "
            f"max {r['max_ms']:.1f} ms; achieved {r['achieved_epochs_per_s']:.0f} epochs/s, "
            f"{r['late_epochs']} late{'' if r['ok'] else '; FAILED (count mismatch)'}")
    return {"quick": quick, "seconds_per_run": seconds, "samples_target": target, "payload": KIND,
            "records_per_message": PER_MESSAGE, "messages_per_epoch": MPE,
            "peak": peak, "peak_records_per_s": peak["records_per_s"], "peak_epochs_per_s": peak_eps,
            "levels": levels, "ok": all(r["ok"] for r in levels),
            "wall_s": round(time.monotonic() - t0, 1)}
