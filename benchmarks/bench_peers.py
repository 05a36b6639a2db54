"""Case ``peers``: epochstream vs raw pyzmq, Redis pub/sub and NATS core — same payloads, same
batching, paired and interleaved.

One subscriber, one partition. For each configuration (records per message × payload kind) the
variants run back to back, once per repeat (A, B, C, ... A, B, C, ...): every ratio is taken
between two runs of the same repeat, seconds apart, and reported as min / median / max over the
repeats. Every run is time-based (``paired.seconds``) and counts every record at the receiver; a
run that loses any is reported as failed.

Variants (every one sends the very same pre-encoded payload bytes, one payload per ``send``):

- ``epochstream`` — ``Publisher(coalesce_bytes=0)``: coalescing off, so one payload = one wire
  message, exactly like the peers (**equal batching**; this is the like-for-like comparison);
- ``epochstream+coalesce`` — the default ``Publisher``, which merges queued same-epoch msgpack
  payloads into one wire message (up to 64 KiB): *different batching* — reported beside, labelled,
  with its wire messages per record; not used for the equal-batching targets;
- ``zmq`` — raw pyzmq PUB/SUB, the same 3 frames, no protocol (a baseline with the same framing,
  batching and decoding — not "the limit of the transport": see the physical limits);
- ``redis`` — Redis pub/sub, redis-py with the hiredis parser, pipelined ``publish`` (64 per
  round trip), subscriber reading with ``pubsub.listen()`` (blocking reads);
- ``nats`` — NATS core, nats-py, async subscription callback; flow-control waits do not use
  ``asyncio.sleep`` polling.

Redis runs with ``client-output-buffer-limit pubsub 0 0 0``, NATS with ``max_pending: 1GB`` and a
raised ``pending_msgs_limit``/``pending_bytes_limit``; the brokers' CPU time is read with psutil.
"""

from __future__ import annotations

import contextlib
import time

from . import harness, paired, peers

VARIANTS = ("epochstream", "epochstream+coalesce", "zmq", "redis", "nats")
# (numerator, denominator, target or None, what)
RATIOS = (("epochstream", "zmq", 0.9, "equal batching"),
          ("epochstream", "redis", 1.3, "equal batching"),
          ("epochstream", "nats", 1.3, "equal batching"),
          ("epochstream+coalesce", "zmq", None, "epochstream batches, raw pyzmq does not"),
          ("epochstream+coalesce", "redis", None, "epochstream batches, Redis does not"),
          ("epochstream+coalesce", "nats", None, "epochstream batches, NATS does not"),
          ("epochstream+coalesce", "epochstream", None, "what coalescing buys"))


def target(a: str, b: str, records_per_message: int, stored=None) -> tuple | None:
    """Issue 28's target for ``a ÷ b`` at equal batching: ``(worst pair >=, median >=)`` —
    raw pyzmq 0.9 (and a median of 0.95 for msgpack); NATS 1.0 at 1 record per message, 1.3
    from 1000; Redis 1.3. ``stored``: the target a result file recorded (runs before 2026-11-27
    used 1.3 for NATS at any batching), for ratios of pairs this table does not know."""
    if a != "epochstream":
        return None
    if b == "zmq":
        return 0.9, (0.95 if records_per_message in (1, 1000) else None)
    if b == "nats":
        return (1.0 if records_per_message == 1 else 1.3), None
    if b == "redis":
        return 1.3, None
    return None if stored is None else (stored, None)


def verdict(s: dict | None, goal: tuple | None, payload: str = "") -> str | None:
    """``paired.verdict`` of the worst pair, and of the median where ``goal`` has one (not for
    Arrow, whose target is on the worst pair only)."""
    if goal is None:
        return None
    worst = paired.verdict(s, goal[0])
    if worst != "met" or goal[1] is None or payload == "arrow" or not s:
        return worst
    return "met" if s["median"] >= goal[1] else f"not met (median below {goal[1]})"


def plan(quick: bool):
    if quick:
        return [(1, "dicts"), (1000, "tuples")]
    # cut from 7 configurations to 3 to keep `make bench` within 20 minutes (each configuration
    # is 4-5 variants x 5 repeats x ~6 s = ~2.5 min): the two ends for msgpack and Arrow's
    # 38 KB message, which the fan-out and limits cases use too
    return [(1, "dicts"), (1000, "tuples"), (1000, "arrow")]


def _variants(kind, servers):
    out = []
    for v in VARIANTS:
        if v == "epochstream+coalesce" and kind == "arrow":
            continue  # the Publisher never coalesces Arrow payloads: identical to "epochstream"
        if v in ("redis", "nats") and v not in servers:
            continue
        if v in ("redis", "nats") and kind == "arrow":
            continue  # Arrow: epochstream vs raw pyzmq only (Redis/NATS cut for the 20-minute budget)
        out.append(v)
    return out


def _status(r) -> str:
    if not r["ok"]:
        return f"FAILED: {r.get('error')}"
    gc = r.get("sub_gc", [None])[0]
    b = r.get("broker_cpu_s_per_M")
    return (f"{r['records_per_s'] / 1e6:7.3f}M rec/s  {r['seconds']:.1f} s  "
            f"cpu/M rec: pub {r['pub_cpu_s_per_M']:.2f} s sub {r['sub_cpu_s_per_M'][0]:.2f} s"
            + (f" broker {b:.2f} s" if b is not None else "")
            + f"  wire msg/rec {r['wire_messages_per_record']:.4f}  sub gc {gc}")


def run(quick: bool = False, log=print) -> dict:
    configs = plan(quick)
    seconds, n_rep = paired.seconds(quick), paired.repeats(quick)
    servers, pids, notes = {}, {}, {}
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
                port, version, pid = stack.enter_context(starter(path))
            except Exception as exc:  # could not start: report, don't fake
                notes[peer] = f"unavailable: could not start {path}: {exc}"
                log(f"  peers: {notes[peer]}")
                continue
            servers[peer], pids[peer], notes[peer] = port, pid, version
        for per_message, kind in configs:
            def one(label, rep, per_message=per_message, kind=kind):
                system = label.split("+")[0]
                r = harness.run(system, kind=kind, per_message=per_message, api="events",
                                duration=seconds, time_limit=60 + 3 * seconds,
                                coalesce_bytes=None if label == "epochstream+coalesce" else 0,
                                redis_port=servers.get("redis"), nats_port=servers.get("nats"),
                                broker_pid=pids.get(system))
                log(f"  peers {kind:6s} R={per_message:4d} #{rep} {label:21s} {_status(r)}")
                return r
            rows += paired.interleave(_variants(kind, servers), n_rep, one, log=log)
    summary = []
    for per_message, kind in configs:
        where = (lambda r, pm=per_message, k=kind: r["records_per_message"] == pm and r["payload"] == k)
        entry = {"payload": kind, "records_per_message": per_message, "variants": {}, "ratios": []}
        for v in VARIANTS:
            sel = [r for r in rows if where(r) and r["variant"] == v]
            if not sel:
                continue
            good = [r for r in sel if r["ok"]]
            entry["variants"][v] = {
                "runs": len(sel), "failed": len(sel) - len(good),
                "records_per_s": paired.summary([r["records_per_s"] for r in good]),
                "pub_cpu_s_per_M": paired.summary([r["pub_cpu_s_per_M"] for r in good]),
                "sub_cpu_s_per_M": paired.summary([r["sub_cpu_s_per_M"][0] for r in good]),
                "broker_cpu_s_per_M": paired.summary([r["broker_cpu_s_per_M"] for r in good
                                                      if r.get("broker_cpu_s_per_M") is not None]),
                "wire_messages_per_record": paired.summary([r["wire_messages_per_record"] for r in good]),
                "sub_gc_collections": paired.summary([sum(r["sub_gc"][0]) for r in good]),
                "seconds": paired.summary([r["seconds"] for r in good]),
            }
        for a, b, _, what in RATIOS:
            if a in entry["variants"] and b in entry["variants"]:
                s = paired.summary(paired.pair_ratios(rows, a, b, where=where))
                goal = target(a, b, per_message)
                entry["ratios"].append({"a": a, "b": b, "target": goal and goal[0],
                                        "median_target": goal and goal[1], "what": what,
                                        "paired": s, "verdict": verdict(s, goal, kind)})
        summary.append(entry)
    return {"quick": quick, "repeats": n_rep, "seconds_per_run": seconds, "servers": notes,
            "rows": rows, "summary": summary, "ok": all(r["ok"] for r in rows),
            "wall_s": round(time.monotonic() - t0, 1)}
