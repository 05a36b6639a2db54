"""Case ``fanout``: one publisher → 1, 2, 4, 8, 16, 32, 64 subscriber processes.

Arrow batches of 1000 records (37.7 KB per message — the "38 KB message"; the Publisher never
coalesces Arrow, so one payload = one wire message), one partition, ``events()`` API,
time-based runs, window flow control against the slowest subscriber. The subscriber counts are
interleaved within each repeat (1, 2, 4, ..., 1, 2, 4, ...).

Reported per subscriber count: delivered records/s (slowest subscriber and all together),
publisher CPU per message and per message per subscriber, and the publisher's cost per *added*
subscriber per message, ``(cpu/msg(N) - cpu/msg(1)) / (N - 1)``, paired within a repeat (target:
<= 15 µs). Every process shares the machine's cores: from a few subscribers on, the subscribers
themselves saturate them, which the per-subscriber figures say openly.
"""

from __future__ import annotations

import time

from . import harness, paired

KIND, PER_MESSAGE = "arrow", 1000


def plan(quick: bool):
    if quick:
        return (1, 4), min(3, paired.repeats(True))
    # 2, 8 and 32 cut to keep `make bench` within 20 minutes: every subscriber is a process
    # to spawn (~0.5 s of CPU on these 2 cores), so the 7-point grid cost ~5 minutes alone
    return (1, 4, 16, 64), paired.repeats(False)  # 5: the rules' paired repeats


def _variant(label: str) -> tuple[str, int]:
    """``"16"`` -> ``("epochstream", 16)``; ``"zmq:16"`` -> the raw pyzmq peer (harness: a PUB
    socket, the same 38 KB frames, no protocol), the floor of what fanning out costs here."""
    system, _, n = label.rpartition(":")
    return system or "epochstream", int(n)


def run(quick: bool = False, log=print) -> dict:
    counts, n_rep = plan(quick)
    seconds = paired.seconds(quick)
    t0 = time.monotonic()

    def one(label, rep):
        system, n = _variant(label)
        r = harness.run(system, kind=KIND, per_message=PER_MESSAGE, subscribers=n,
                        api="events", duration=seconds, time_limit=120 + 3 * seconds)
        if r["ok"]:
            msgs = r["expected_records"] / PER_MESSAGE
            r["pub_cpu_us_per_message"] = sum(r["pub_cpu_s"]) / msgs * 1e6
            r["pub_cpu_us_per_message_per_sub"] = r["pub_cpu_us_per_message"] / n
            log(f"  fanout {system} subs={n:2d} #{rep}: {r['records_per_s'] / 1e6:6.2f}M rec/s per sub, "
                f"{r['records_per_s_total'] / 1e6:6.2f}M total, pub {r['pub_cpu_us_per_message']:.0f} µs/msg "
                f"({r['pub_cpu_us_per_message_per_sub']:.1f} µs/msg/sub), {r['seconds']:.1f} s")
        else:
            log(f"  fanout {system} subs={n:2d} #{rep}: FAILED {r.get('error')}")
        return r

    labels = [str(n) for n in counts] + [f"zmq:{n}" for n in counts]
    rows = paired.interleave(labels, n_rep, one, log=log)
    summary = []
    for label in labels:
        system, n = _variant(label)
        base_label = "1" if system == "epochstream" else "zmq:1"
        sel = [r for r in rows if r["variant"] == label and r["ok"]]
        added = []
        for r in sel:
            base = next((b for b in rows if b["variant"] == base_label and b["repeat"] == r["repeat"]
                         and b["ok"]), None)
            if base is not None and n > 1:
                added.append((r["pub_cpu_us_per_message"] - base["pub_cpu_us_per_message"]) / (n - 1))
        summary.append({
            "system": system, "subscribers": n,
            "runs": len([r for r in rows if r["variant"] == label]), "ok_runs": len(sel),
            "records_per_s_per_sub": paired.summary([r["records_per_s"] for r in sel]),
            "records_per_s_total": paired.summary([r["records_per_s_total"] for r in sel]),
            "pub_cpu_us_per_message": paired.summary([r["pub_cpu_us_per_message"] for r in sel]),
            "pub_cpu_us_per_message_per_sub": paired.summary([r["pub_cpu_us_per_message_per_sub"] for r in sel]),
            "pub_cpu_us_per_added_sub": paired.summary(added),
            "sub_cpu_s_per_M": paired.summary([x for r in sel for x in r["sub_cpu_s_per_M"]]),
        })
    return {"quick": quick, "repeats": n_rep, "seconds_per_run": seconds, "payload": KIND,
            "records_per_message": PER_MESSAGE, "rows": rows, "summary": summary,
            "ok": all(r["ok"] for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
