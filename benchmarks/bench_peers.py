"""Case ``peers``: epochstream vs raw pyzmq, Redis pub/sub and NATS core — same payloads, same run.

One subscriber, one partition, 1 / 100 / 1000 records per message, msgpack dicts / msgpack
tuples / Arrow. For every configuration the systems run back to back (repeated ``repeats``
times, interleaved), so each ratio compares numbers taken minutes apart on the same machine.
Raw pyzmq uses epochstream's own framing without the protocol (the practical limit of this
transport); Redis (redis-py + hiredis, pipelined publish) and NATS (nats-py) carry
``kind + time + payload`` in one message. Every record is counted at the receiver; a run that
loses any is reported as failed. Redis runs with ``client-output-buffer-limit pubsub 0 0 0``, NATS
with ``max_pending: 1GB`` on the server and a raised ``pending_msgs_limit``/``pending_bytes_limit``
on the subscription.
"""

from __future__ import annotations

import contextlib
import time

from . import harness, median, peers
from .bench_e2e import budget

VARIANTS = (("epochstream", "epochs"), ("epochstream", "events"), ("zmq", None), ("redis", None),
            ("nats", None))


def plan(quick: bool):
    if quick:
        return [(r, k) for r in (1, 1000) for k in ("dicts", "arrow")], 1, 0.5, []
    lat = [(r, "dicts") for r in (1, 100, 1000)] + [(1000, "arrow")]
    return [(r, k) for r in (1, 100, 1000) for k in ("dicts", "tuples", "arrow")], 3, 1.5, lat


def _label(system, api):
    return system if api is None else f"{system}/{api}"


def run(quick: bool = False, log=print) -> dict:
    configs, repeats, seconds, lat = plan(quick)
    servers = {}
    notes = {}
    rows = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        for peer, starter in (("redis", peers.redis_server), ("nats", peers.nats_server)):
            path, note = peers.ensure_installed(peer, log=log)
            if path is None:
                notes[peer] = f"unavailable: {note}"
                log(f"  peers: {peer} unavailable: {note}")
                continue
            try:
                port, version = stack.enter_context(starter(path))
            except Exception as exc:  # could not start: report, don't fake
                notes[peer] = f"unavailable: could not start {path}: {exc}"
                log(f"  peers: {notes[peer]}")
                continue
            servers[peer] = port
            notes[peer] = version
        variants = [(s, a) for s, a in VARIANTS if s in ("epochstream", "zmq") or s in servers]
        for per_message, kind in configs:
            rec = budget(kind, per_message, 1, seconds)
            for rep in range(repeats):
                for system, api in variants:
                    r = harness.run(system, kind=kind, per_message=per_message, api=api or "events",
                                    records=rec, time_limit=60, redis_port=servers.get("redis"),
                                    nats_port=servers.get("nats"))
                    r["repeat"] = rep
                    r["variant"] = _label(system, api)
                    rows.append(r)
                    status = (f"{r['records_per_s'] / 1e6:7.3f}M rec/s" if r["ok"]
                              else f"FAILED: {r.get('error')}")
                    log(f"  peers {kind:6s} R={per_message:4d} #{rep} {r['variant']:20s} {status}")
        for per_message, kind in lat:
            for system, api in variants:
                r = harness.run(system, kind=kind, per_message=per_message, api=api or "epochs",
                                mode="latency", epochs=200, time_limit=60,
                                redis_port=servers.get("redis"), nats_port=servers.get("nats"))
                r["variant"] = _label(system, api)
                rows.append(r)
                status = (f"p50 {r['latency_p50_ms']:.2f} ms p99 {r['latency_p99_ms']:.2f} ms"
                          if r["ok"] else f"FAILED: {r.get('error')}")
                log(f"  peers latency {kind:6s} R={per_message:4d} {r['variant']:20s} {status}")
    summary = []
    for per_message, kind in configs:
        entry = {"payload": kind, "records_per_message": per_message}
        for system, api in VARIANTS:
            label = _label(system, api)
            sel = [r for r in rows if r["variant"] == label and r["mode"] == "throughput"
                   and r["payload"] == kind and r["records_per_message"] == per_message]
            if not sel:
                entry[label] = None
            elif not all(r["ok"] for r in sel):
                entry[label] = "failed"
            else:
                entry[label] = median(r["records_per_s"] for r in sel)
        for api in ("epochs", "events"):
            mine = entry.get(f"epochstream/{api}")
            for other in ("zmq", "redis", "nats"):
                theirs = entry.get(other)
                ok = isinstance(mine, float) and isinstance(theirs, float)
                entry[f"ratio_{api}_vs_{other}"] = mine / theirs if ok else None
        summary.append(entry)
    return {"quick": quick, "repeats": repeats, "seconds_per_run": seconds, "servers": notes,
            "rows": rows, "summary": summary, "ok": all(r["ok"] for r in rows),
            "wall_s": round(time.monotonic() - t0, 1)}
