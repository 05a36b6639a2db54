"""Case ``e2e``: epochstream end to end over tcp on 127.0.0.1, separate processes.

Publisher → 1 subscriber (fan-out: the ``fanout`` case); 1 and 2 partitions (one publisher
process each); time-based runs (``paired.seconds``); 1, 100, 1000 records per message; msgpack dicts, msgpack tuples, Arrow record batches; the complete-epoch API
(``Subscriber.epochs()``) and the raw API (``Subscriber.events()``). Every record is counted at
every subscriber (a run with any loss is reported as failed). Latency runs send one epoch at a
time and measure the time from the start of the send of the epoch's last batch (+ its
``advance_to``) to the subscriber's ``Epoch``. See :mod:`benchmarks.harness` for the method.
"""

from __future__ import annotations

import itertools
import time

from . import harness, paired

def plan(quick: bool):
    """Throughput runs (time-based) and latency runs (one epoch at a time). Subscriber counts
    are the ``fanout`` case's business; this case covers partitions, payloads and both APIs."""
    if quick:
        runs = [dict(subscribers=1, partitions=1, per_message=1000, kind="tuples", api=a)
                for a in ("epochs", "events")]
        runs += [dict(subscribers=1, partitions=2, per_message=1000, kind="arrow", api="epochs")]
        lat = [dict(subscribers=1, partitions=1, per_message=100, kind="dicts")]
        return runs, lat, 30
    # one partition (partitions 1..16: the ``scale`` case), the ``epochs()`` API at every size and
    # payload, ``events()`` at 1000 tuples (``events()`` at the other sizes: the ``peers`` case);
    # idle latency at 100 dicts per message (under load: the ``latency`` case)
    runs = [dict(subscribers=1, partitions=1, per_message=r, kind=k, api="epochs")
            for r, k in itertools.product((1, 100, 1000), ("dicts", "tuples", "arrow"))]
    runs += [dict(subscribers=1, partitions=1, per_message=1000, kind="tuples", api="events")]
    lat = [dict(subscribers=1, partitions=1, per_message=100, kind="dicts")]
    return runs, lat, 200


def _fmt(r) -> str:
    if not r["ok"]:
        return f"FAILED: {r.get('error')}"
    if r["mode"] == "latency":
        return f"p50 {r['latency_p50_ms']:.2f} ms  p99 {r['latency_p99_ms']:.2f} ms"
    return (f"{r['records_per_s'] / 1e6:7.3f}M rec/s, {r['messages_per_s']:9.0f} msg/s, {r['seconds']:.1f} s, "
            f"cpu/M rec pub {r['pub_cpu_s_per_M']:.2f} s sub {r['sub_cpu_s_per_M'][0]:.2f} s, "
            f"wire msg/rec {r['wire_messages_per_record']:.4f}, sub gc {r['sub_gc'][0]}")


def run(quick: bool = False, log=print) -> dict:
    runs, lat, lat_epochs = plan(quick)
    seconds = paired.seconds(quick)
    rows = []
    t0 = time.monotonic()
    for cfg in runs:
        r = harness.run("epochstream", mode="throughput", duration=seconds,
                        time_limit=60 + 3 * seconds, **cfg)
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
