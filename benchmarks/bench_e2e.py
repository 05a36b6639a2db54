"""Case ``e2e``: epochstream end to end over tcp on 127.0.0.1, separate processes.

Publisher → 1, 2, 4 subscribers; 1 and 2 partitions (one publisher process each); 1, 100, 1000
records per message; msgpack dicts, msgpack tuples, Arrow record batches; the complete-epoch API
(``Subscriber.epochs()``) and the raw API (``Subscriber.events()``). Every record is counted at
every subscriber (a run with any loss is reported as failed). Latency runs send one epoch at a
time and measure the time from the start of the send of the epoch's last batch (+ its
``advance_to``) to the subscriber's ``Epoch``. See :mod:`benchmarks.harness` for the method.
"""

from __future__ import annotations

import itertools
import time

from . import harness

# rough records/s of one subscriber on the reference machine, used only to size runs
_EST = {("dicts", 1): 25e3, ("dicts", 100): 6e5, ("dicts", 1000): 7e5,
        ("tuples", 1): 25e3, ("tuples", 100): 1.2e6, ("tuples", 1000): 1.5e6,
        ("arrow", 1): 2e4, ("arrow", 100): 2e6, ("arrow", 1000): 8e6}


def budget(kind: str, per_message: int, subscribers: int, seconds: float) -> int:
    """Records to send so that a run takes about ``seconds``."""
    rate = _EST[(kind, per_message)] / max(1, subscribers if subscribers <= 2 else subscribers / 1.5)
    return max(int(rate * seconds), 20 * harness.messages_per_epoch(per_message) * per_message)


def plan(quick: bool):
    if quick:
        runs = [dict(subscribers=1, partitions=1, per_message=r, kind=k, api="epochs")
                for r in (1, 1000) for k in ("dicts", "arrow")]
        runs += [dict(subscribers=2, partitions=2, per_message=100, kind="tuples", api="events"),
                 dict(subscribers=4, partitions=1, per_message=1000, kind="arrow", api="epochs")]
        lat = [dict(subscribers=1, partitions=1, per_message=100, kind="dicts"),
               dict(subscribers=1, partitions=2, per_message=1000, kind="arrow")]
        return runs, lat, 0.5, 30
    runs = [dict(subscribers=s, partitions=p, per_message=r, kind=k, api=a)
            for s, p, r, k, a in itertools.product((1, 2, 4), (1, 2), (1, 100, 1000),
                                                   ("dicts", "tuples", "arrow"), ("epochs", "events"))]
    lat = [dict(subscribers=s, partitions=p, per_message=r, kind=k)
           for s, p, r, k in itertools.product((1,), (1, 2), (1, 100, 1000), ("dicts", "tuples", "arrow"))]
    lat += [dict(subscribers=4, partitions=2, per_message=1000, kind=k) for k in ("dicts", "arrow")]
    return runs, lat, 1.5, 200


def _fmt(r) -> str:
    if not r["ok"]:
        return f"FAILED: {r.get('error')}"
    if r["mode"] == "latency":
        return f"p50 {r['latency_p50_ms']:.2f} ms  p99 {r['latency_p99_ms']:.2f} ms"
    return (f"{r['records_per_s'] / 1e6:7.3f}M rec/s per subscriber, {r['messages_per_s']:9.0f} msg/s, "
            f"{r['records_per_s_total'] / 1e6:7.3f}M rec/s total")


def run(quick: bool = False, log=print) -> dict:
    runs, lat, seconds, lat_epochs = plan(quick)
    rows = []
    t0 = time.monotonic()
    for cfg in runs:
        rec = budget(cfg["kind"], cfg["per_message"], cfg["subscribers"], seconds)
        r = harness.run("epochstream", mode="throughput", records=rec, time_limit=60, **cfg)
        rows.append(r)
        log(f"  e2e {cfg['kind']:6s} R={cfg['per_message']:4d} subs={cfg['subscribers']} "
            f"parts={cfg['partitions']} {cfg['api']:6s}: {_fmt(r)}")
    for cfg in lat:
        r = harness.run("epochstream", mode="latency", epochs=lat_epochs, api="epochs", time_limit=60, **cfg)
        rows.append(r)
        log(f"  e2e latency {cfg['kind']:6s} R={cfg['per_message']:4d} subs={cfg['subscribers']} "
            f"parts={cfg['partitions']}: {_fmt(r)}")
    return {"quick": quick, "seconds_per_run": seconds, "rows": rows,
            "ok": all(r["ok"] for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
