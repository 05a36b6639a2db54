"""The curves of scale (issue 28) in docs/benchmarks.md: one section and one plot per case
(``topics``, ``subscribers``, ``partitions_wide``, ``catalog_scale``, ``history_scale``),
each with its measured growth (:mod:`benchmarks.curves`) and where it broke on this machine.
Called by :func:`benchmarks.report.write`; every number comes from ``benchmarks/results``."""

from __future__ import annotations

from . import load_result
from .curves import describe, fit
from .curves import fit as curves_fit


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, name: str) -> str:
    from . import IMG
    IMG.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(IMG / name, dpi=110)
    _plt().close(fig)
    return f"img/{name}"


def _load(r) -> str:
    la = r.get("loadavg_at_start")
    q = "**quick**" if r.get("quick") else "full"
    return f"{q} run, finished {r.get('finished')}" + (f", 1-minute load average at start {la[0]:.2f} on 2 cores" if la else "")


# ---------------------------------------------------------------------------------------------
def topics_section(r) -> list[str]:
    allrows = r["rows"]
    r = dict(r, rows=[x for x in allrows if x.get("mode", "topics") == "topics"])
    rows = [x for x in r["rows"] if x.get("ok")]
    s = r["summary"]
    out = ["## Curve: topics per process and the idle cost (`topics`)\n",
           f"Run: {_load(r)}; idle window {r['plan']['window_s']} s per point. One process holds N "
           "idle publishers (default options, heartbeat 1 s), another N idle subscribers (one "
           "thread each in `for e in sub.epochs()`, ping 1 s); nothing is published. CPU from "
           "`time.process_time()` (all threads), threads/fds/RSS from `/proc/self`. Per-topic "
           "figures subtract the bare process (N = 0).\n"]
    hdr = ["N topics", "pub % core", "pub threads", "pub fds", "pub RSS MiB", "sub % core", "sub threads",
           "sub fds", "sub RSS MiB"]
    body = []
    for x in r["rows"]:
        if not x.get("ok"):
            body.append((x["topics"], f"**broke**: {x.get('error', '')[:80]}", "", "", "", "", "", "", ""))
            continue
        p, q = x["publishers"], x["subscribers"]
        body.append((x["topics"], f"{p['cpu_frac'] * 100:.3f}", p["end"]["threads"], p["end"]["fds"],
                     f"{p['end']['rss_kib'] / 1024:.0f}", f"{q['cpu_frac'] * 100:.3f}", q["end"]["threads"],
                     q["end"]["fds"], f"{q['end']['rss_kib'] / 1024:.0f}"))
    from .report import _table
    out.append(_table(hdr, body))
    out.append("\nMeasured growth (least squares over N > 0, minus the bare process):\n")
    names = {"cpu_frac": ("% of a core", 100, "{:.4f}"), "threads": ("threads", 1, "{:.2f}"),
             "fds": ("file descriptors", 1, "{:.2f}"), "rss_kib": ("KiB", 1, "{:.1f}")}
    for role in ("publishers", "subscribers"):
        for key, (unit, scale, fmt) in names.items():
            e = s[f"{role}.{key}"]
            out.append(f"- {role[:-1]} {unit}: {describe(e['fit'], unit, 'topic', scale, fmt)}\n")
    one = next((x for x in rows if x["topics"] == 1), None)
    base = next((x for x in rows if x["topics"] == 0), None)
    if one and base:
        vals = [(one[k]["cpu_frac"] - base[k]["cpu_frac"]) * 100 for k in ("publishers", "subscribers")]
        slopes = [s[f"{k}.cpu_frac"]["fit"]["linear"]["slope"] * 100 for k in ("publishers", "subscribers")
                  if s.get(f"{k}.cpu_frac", {}).get("fit")]
        ok = all(v <= 0.1 for v in vals + slopes)
        out.append(f"\n**Idle target (≤ 0.1 % of a core per idle publisher or subscriber): {'met' if ok else 'missed'}** — "
                   f"one idle publisher {vals[0]:.3f} %, one idle subscriber {vals[1]:.3f} % above the bare process; "
                   + (f"per topic among many {slopes[0]:.4f} % and {slopes[1]:.4f} % (the slopes). " if len(slopes) == 2 else "")
                   + f"Load average at the start {r.get('loadavg_at_start', ['?'])[0]} on 2 cores.\n")
    br = s.get("breaks_at")
    out.append("\n" + (f"Broke at N = {br['topics']}: {br['error']}\n" if br else
                       f"No point broke up to N = {max(x['topics'] for x in rows)}.\n"))
    fan = [x for x in allrows if x.get("mode") == "fanin"]
    if fan:
        out.append("\nOne idle topic with N idle subscribers (`fanin`: the publisher's cost per idle subscriber — "
                   "a ping in and a heartbeat out per second each):\n\n")
        out.append(_table(["N subscribers", "pub % core", "pub fds", "subs % core"],
                          [(x["topics"], f"{x['publishers']['cpu_frac'] * 100:.3f}", x["publishers"]["end"]["fds"],
                            f"{x['subscribers']['cpu_frac'] * 100:.3f}") if x.get("ok") else
                           (x["topics"], f"**broke**: {str(x.get('error'))[:60]}", "", "") for x in fan]))
        out.append(f"\n- publisher CPU per idle subscriber: "
                   f"{describe(s.get('fanin.publishers.cpu_frac', {}).get('fit'), '% of a core', 'subscriber', 100, '{:.4f}')}\n")
    out += _topics_before(load_result("topics_before_fix"), s)
    if rows:
        out.append(f"\n![topics per process]({_topics_plot(r)})\n")
    return out


def _topics_before(b, s) -> list[str]:
    """The two fixes of issue 28, before and after, from ``topics_before_fix.json``."""
    if not b:
        return []
    out = ["\n**Fixed here** (before: `benchmarks/results/topics_before_fix.json`):\n"]
    d = b["default_context"]
    broke = next((x for x in d["rows"] if not x.get("ok")), None)
    last = max((x for x in d["rows"] if x.get("ok")), key=lambda x: x["topics"], default=None)
    if broke and last:
        out.append(f"- *One process held at most {broke.get('publishers_opened', '?')} publishers.* With "
                   f"`zmq.Context.instance()` as it comes, N = {last['topics']} worked and at N = {broke['topics']} "
                   f"publisher number {broke.get('publishers_opened', '?') + 1} failed: `{broke.get('error')}` "
                   f"— libzmq's default of 1,023 sockets per context, 3 per publisher (its ROUTER and "
                   f"the two ends of its wake-up pipe), with {last['publishers']['end']['fds']} of the "
                   "process's file descriptors in use. `epochstream.zmq_context.default_context()` raises "
                   "the shared context's limit to the file-descriptor limit (`RLIMIT_NOFILE`); "
                   "regression test `tests/test_many_topics.py` (400 publishers in one process).\n")
    i = b["idle_slice_0_1s"]
    one = next((x for x in i["rows"] if x.get("ok") and x["topics"] == 1), None)
    ten = next((x for x in i["rows"] if x.get("ok") and x["topics"] == 10), None)
    after = s.get("subscribers.cpu_frac", {}).get("points") or []
    a1 = next((y for x, y in after if x == 1), None)
    a10 = next((y for x, y in after if x == 10), None)
    if one and a1 is not None:
        out.append(f"- *An idle subscriber woke 10 times a second.* `epochs()` polled in 0.1 s slices: one "
                   f"idle subscriber cost {one['subscribers']['cpu_frac'] * 100:.3f} % of a core"
                   + (f", ten {ten['subscribers']['cpu_frac'] * 100:.3f} %" if ten else "")
                   + f" ({i['window_s']:.0f} s windows) — over the 0.1 % target. An idle poll now waits up to "
                   f"0.5 s (half the ping interval, within `timeout`; a message still wakes it at once): "
                   f"{a1 * 100:.3f} %" + (f", ten {a10 * 100:.3f} %" if a10 is not None else "")
                   + " (this run, above the bare process). Regression test `tests/test_idle_wakeups.py`.\n")
    out.append(_shared_loop_note(s))
    return out


def _shared_loop_note(s) -> str:
    """The third fix of issue 28 (one loop thread per process), read against this run's slopes:
    a run made before it still shows a thread and 5 descriptors per publisher."""
    def slope(key):
        return ((s.get(key) or {}).get("fit") or {}).get("linear", {}).get("slope")
    th, fd = slope("publishers.threads"), slope("publishers.fds")
    if th is None or th >= 0.5:
        run = ("This run is from before the fix: every `Publisher` ran its own loop thread (and 5 "
               "file descriptors, with its inproc wake-up pipe); at 1,000 topics that was 1,000 threads, ~90 KiB each. ")
    else:
        run = (f"Fixed: this run adds {th:.2f} threads and {fd:.2f} file descriptors per topic (before: "
               "a loop thread, ~90 KiB, and 5 descriptors per publisher). ")
    return ("- *A thread per publisher.* " + run + "A publisher's loop is now a bounded, non-blocking "
            "step (`PublisherLoop.wants` / `step`), and `transport/reactor.py` drives every publisher of "
            "the process that has no epoch log and no catalog from one thread: one `epoll` over each "
            "ROUTER's `zmq.FD` (`zmq.EVENTS` checked after every step, as `zmq.asyncio` does) and one "
            "`eventfd` that every publisher's hand-off wakes (no wake-up pipe per publisher), one heap of "
            "heartbeat and linger deadlines (an idle publisher costs nothing until its deadline), "
            "round-robin steps of at most 4096 commands; a loop that raises ends only its publisher. The "
            "thread starts with the first publisher and ends with the last. Publishers with `retention` "
            "(fsyncs, catalog commits, object-store waits in the loop) or a catalog (the upper-frontier "
            "write, once per burst of new epochs) keep a thread of their own by default, so a slow disk "
            "or catalog stalls no other topic; `Publisher(loop=\"shared\" | \"own\")` chooses. Regression "
            "test `tests/test_shared_loop.py` (300 publishers in one process: one more thread, 2 file "
            "descriptors each).\n")


def _topics_plot(r) -> str:
    plt = _plt()
    rows = [x for x in r["rows"] if x.get("ok") and x["topics"] > 0]
    n = [x["topics"] for x in rows]
    fig, ax = plt.subplots(1, 4, figsize=(14, 3.4))
    for role, style in (("publishers", "o-"), ("subscribers", "s--")):
        ax[0].plot(n, [x[role]["cpu_frac"] * 100 for x in rows], style, label=role)
        ax[1].plot(n, [x[role]["end"]["threads"] for x in rows], style, label=role)
        ax[2].plot(n, [x[role]["end"]["fds"] for x in rows], style, label=role)
        ax[3].plot(n, [x[role]["end"]["rss_kib"] / 1024 for x in rows], style, label=role)
    for a, t in zip(ax, ("idle CPU, % of a core", "threads", "open fds", "RSS, MiB")):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("idle topics in the process")
        a.set_title(t)
        a.grid(alpha=0.3)
    ax[0].axhline(0.1, color="grey", lw=0.8, ls=":")
    ax[0].legend(fontsize=8)
    return _save(fig, "curve_topics.png")


# ---------------------------------------------------------------------------------------------
def subscribers_section(r) -> list[str]:
    from .bench_subscribers import FANOUT, SUB_PROCESSES
    from .report import _table
    s = r["summary"]
    rows = r["rows"]
    out = ["## Curve: subscribers on one topic, directly and through relays (`subscribers`)\n",
           f"Run: {_load(r)}; window {r['plan']['window_s']} s per point. Offered load fixed: "
           f"{rows[0]['rate_epochs_per_s']} epochs/s of one {rows[0]['records_per_message']}-tuple msgpack "
           f"message ({rows[0]['rate_epochs_per_s'] * rows[0]['records_per_message']} records/s per subscriber). "
           f"Subscribers are threads (each a full `Subscriber` with its own connection, `epochs()`), "
           f"spread over {SUB_PROCESSES} processes; *tree* = {FANOUT} relays under the publisher and "
           f"{FANOUT} under each ({FANOUT * FANOUT} leaves), one process per level. CPU from "
           "`/proc/<pid>/task/*/schedstat` (every thread, ns) over the window; *delivered* = records counted by all subscribers "
           f"(after a drain) ÷ (records sent × N).\n"]
    body = []
    for x in rows:
        if not x.get("ok"):
            body.append((x["subscribers"], x["topology"], f"**failed**: {str(x.get('error'))[:80]}") + ("",) * 7)
            continue
        relay = " / ".join(f"{x.get(f'relay_level{lv}_cpu_us_per_record', 0):.2f}" for lv in (1, 2)) if x["relay_levels"] else "–"
        body.append((x["subscribers"], x["topology"], f"{x['delivered_fraction']:.3f}",
                     f"{x['records_per_s_delivered'] / 1e3:.0f}k", f"{x['pub_cpu_us_per_record']:.2f}",
                     f"{x['pub_cpu_ns_per_record_per_sub']:.0f}", relay, f"{x['sub_cpu_us_per_record']:.2f}",
                     f"{x['rss_kib']['publisher'] / 1024:.0f}", f"{x['rss_kib']['subscribers'] / 1024:.0f}"))
    out.append(_table(["N", "topology", "delivered", "records/s delivered", "pub µs CPU / record sent",
                       "pub ns CPU / record / subscriber", "relay µs CPU / record (level 1 / 2)",
                       "sub µs CPU / record", "pub RSS MiB", "subs RSS MiB"], body))
    out.append("\nMeasured growth (the slope of CPU per record sent against N is the marginal cost of "
               "one more subscriber per record; per record per subscriber only amortises the fixed cost):\n")
    for topo in ("direct", "tree"):
        out.append(f"- {topo}: publisher CPU per record sent — "
                   f"{describe(s.get(f'{topo}.pub_cpu_us_per_record'), 'µs', 'subscriber', 1, '{:.4g}')}; "
                   f"publisher RSS — {describe(s.get(f'{topo}.publisher_rss_kib'), 'KiB', 'subscriber')}; "
                   f"subscriber CPU per record — {describe(s.get(f'{topo}.sub_cpu_us_per_record'), 'µs', 'subscriber', 1, '{:.3g}')}; "
                   f"kept up (≥ 99 % delivered) up to N = {s.get(f'{topo}.kept_up_to')}, fell behind from "
                   f"N = {s.get(f'{topo}.fell_behind_from')}\n")
    for x in rows:
        if x.get("ok") and x["delivered_fraction"] < 0.99:
            busy = sum(x["cpu_s"].values()) / x["seconds"]
            out.append(f"- where it broke: {x['topology']} at N = {x['subscribers']} the subscribers got "
                       f"{x['delivered_fraction']:.0%} of the offered records; the subscriber processes used "
                       f"{x['cpu_s']['subscribers'] / x['seconds']:.2f} cores, all processes of the run "
                       f"{busy:.2f} cores of this machine's 2 (load average {x['loadavg_before'][0]:.1f} before it): "
                       "the subscribers' CPU, not the publisher's, is the limit here\n")
    tree = [x for x in rows if x.get("ok") and x["topology"] == "tree"]
    if tree:
        lv2 = curves_fit([x["subscribers"] for x in tree], [x.get("relay_level2_cpu_us_per_record") for x in tree])
        lv1 = curves_fit([x["subscribers"] for x in tree], [x.get("relay_level1_cpu_us_per_record") for x in tree])
        out.append(f"- tree, leaf relays (level 2, {FANOUT * FANOUT} relays sharing the subscribers) CPU per record sent: "
                   f"{describe(lv2, 'µs', 'subscriber', 1, '{:.4g}')}; level 1 ({FANOUT} relays, each serving "
                   f"{FANOUT} relays): {describe(lv1, 'µs', 'subscriber', 1, '{:.4g}')}\n")
    if any(x.get("ok") for x in rows):
        out.append(f"\n![subscribers]({_subscribers_plot(r)})\n")
    return out


def _subscribers_plot(r) -> str:
    plt = _plt()
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    for topo, style in (("direct", "o-"), ("tree", "s--")):
        sel = [x for x in r["rows"] if x["topology"] == topo and x.get("ok")]
        n = [x["subscribers"] for x in sel]
        ax[0].plot(n, [x["pub_cpu_us_per_record"] for x in sel], style, label=f"{topo}: publisher")
        if topo == "tree":
            for lv in (1, 2):
                ax[0].plot(n, [x.get(f"relay_level{lv}_cpu_us_per_record") for x in sel], ":", label=f"tree: relays, level {lv}")
        ax[1].plot(n, [x["records_per_s_delivered"] for x in sel], style, label=topo)
        ax[1].plot(n, [x["records_sent"] / x["seconds"] * x["subscribers"] for x in sel], "k:", lw=0.7)
        ax[2].plot(n, [x["delivered_fraction"] for x in sel], style, label=topo)
    ax[0].set_title("CPU µs per record sent")
    ax[1].set_title("records/s delivered (dotted: offered)")
    ax[2].set_title("fraction of offered delivered")
    for a in ax:
        a.set_xscale("log")
        a.set_xlabel("subscribers")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[0].set_yscale("log")
    ax[1].set_yscale("log")
    return _save(fig, "curve_subscribers.png")


# ---------------------------------------------------------------------------------------------
def catalog_scale_section(r) -> list[str]:
    from .bench_catalog_scale import OPS
    from .report import _table
    s = r["summary"]
    out = ["## Curve: durable subscriptions and groups in the catalog (`catalog_scale`)\n",
           f"Run: {_load(r)}; {r['plan']['seconds']} s per operation and count. N durable "
           "subscriptions and N consumer groups on one topic, added in bulk; each operation on random "
           "existing names, one client thread; latency = wall time of the call (µs). PostgreSQL: a "
           "throwaway server on this machine (`fsync=off`).\n"]
    for store in r["plan"]["stores"]:
        sel = [x for x in r["rows"] if x["store"] == store]
        if not sel:
            out.append(f"\n{store}: failed — {r.get('errors', {}).get(store)}\n")
            continue
        out.append(f"\n### {store}\n\n")
        out.append(_table(["N"] + [f"{op} µs p50 / p99" for op in OPS],
                          [(x["count"],) + tuple(f"{x[op].get('median_us', 0):.0f} / {x[op].get('p99_us', 0):.0f}"
                                                 for op in OPS) for x in sel]))
        out.append("\n")
        out.append(_table(["N"] + [f"{op} client µs CPU / call" for op in OPS],
                          [(x["count"],) + tuple(f"{x[op].get('client_cpu_us_per_call', 0):.0f}" for op in OPS)
                           for x in sel]))
        out.append("\nMeasured growth (median latency; client CPU per call):\n")
        for op in OPS:
            out.append(f"- `{op}`: {describe(s.get(f'{store}.{op}'), 'µs', 'entry', 1, '{:.4g}')}; CPU "
                       f"{describe(s.get(f'{store}.{op}.cpu'), 'µs', 'entry', 1, '{:.4g}')}\n")
    pg = [x for x in r["rows"] if x.get("server_execution_us")]
    if pg:
        from .bench_catalog_scale import PLANNED
        out.append("\nPostgreSQL's own execution time of the hot statements (`EXPLAIN ANALYZE`, median of 40 "
                   "random names, µs) — the store's work without the client, the socket and this busy machine's "
                   "scheduling:\n\n")
        out.append(_table(["N"] + list(PLANNED), [(x["count"],) + tuple(f"{x['server_execution_us'].get(w, 0):.0f}"
                                                                       for w in PLANNED) for x in pg]))
        out.append("\n" + "".join(f"- {w}: {describe(s.get(f'postgresql.server.{w}'), 'µs', 'entry', 1, '{:.3g}')}\n"
                                   for w in PLANNED))
    out.append("\n**No linear scan.** Every hot statement is an index search on both stores (the plans below, "
               "at the largest count). SQLite's wall times are its `fsync` at commit on a disk shared with other "
               "work on this machine — medians that jump without order with the count, hence verdicts such as "
               "*falling*; its client CPU per call is the store's own work (SQLite runs in the client) and is "
               "flat. PostgreSQL's execution time grows by a few µs per decade (B-tree depth, cache misses).\n")
    plans = [x for x in r["rows"] if x.get("plans")]
    for x in plans:
        out.append(f"\nPlans at N = {x['count']} on {x['store']}: " + "; ".join(
            f"{w}: `{(v[1] if x['store'] == 'postgresql' and len(v) > 1 and w.endswith('ack') else v[0]).strip()}`"
            for w, v in x["plans"].items()) + "\n")
    if r["rows"]:
        out.append(f"\n![catalog scale]({_catalog_plot(r)})\n")
    return out


def _catalog_plot(r) -> str:
    from .bench_catalog_scale import OPS
    plt = _plt()
    stores = [st for st in r["plan"]["stores"] if any(x["store"] == st for x in r["rows"])]
    fig, ax = plt.subplots(1, len(stores), figsize=(6 * len(stores), 3.6), squeeze=False)
    for a, store in zip(ax[0], stores):
        sel = [x for x in r["rows"] if x["store"] == store]
        for op in OPS:
            a.plot([x["count"] for x in sel], [x[op].get("median_us") for x in sel], "o-", label=op)
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("durable subscriptions (and groups) in the catalog")
        a.set_ylabel("median latency, µs")
        a.set_title(store)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return _save(fig, "curve_catalog_scale.png")


# ---------------------------------------------------------------------------------------------
def history_scale_section(r) -> list[str]:
    from .report import _table
    s = r["summary"]
    rows = r["rows"]
    out = ["## Curve: retained history (`history_scale`)\n",
           f"Run: {_load(r)}. One log grown in place to each size (msgpack tuples, "
           f"{r['records_per_message']} per message, {r['messages_per_epoch']} messages per epoch, "
           "`Retention(max_bytes=None, max_age=None, fsync=\"none\")`, 64 MiB segments, SQLite catalog); "
           "before each measurement the log's pages are dropped from the page cache "
           f"(`posix_fadvise(DONTNEED)`), so reads come from the disk. Replay: {r['plan']['replay_s']} s "
           "from `earliest` through `Subscriber.epochs()`, every record decoded.\n"]
    if r.get("error"):
        out.append(f"\n**Failed**: {r['error']}\n")
    out.append(_table(["log GB", "epochs", "written MB/s", "first epoch from earliest, ms",
                       "first epoch from the middle, ms", "replay records/s", "replay MB/s"],
                      [(f"{x['log_bytes'] / 1e9:.2f}", x["epochs"], f"{x['write_MB_per_s']:.0f}",
                        f"{x['first_earliest']['seconds'] * 1e3:.0f}", f"{x['first_mid']['seconds'] * 1e3:.0f}",
                        f"{x['replay']['records_per_s'] / 1e6:.2f}M", f"{x['replay']['MB_per_s']:.0f}")
                       for x in rows]))
    out.append("\nMeasured growth against the log's size:\n")
    out.append(f"- first epoch from `earliest`: {describe(s.get('first_earliest_s'), 'ms', 'GB', 1e3, '{:.3g}')}\n")
    out.append(f"- first epoch from the middle (the epoch index): {describe(s.get('first_mid_s'), 'ms', 'GB', 1e3, '{:.3g}')}\n")
    out.append(f"- replay rate: {describe(s.get('replay_records_per_s'), 'records/s', 'GB', 1, '{:.3g}')}\n")
    if rows:
        big = rows[-1]
        out.append(
            f"\n**Where it grew, and the fix (2026-11-27).** In this curve's run the time to the first "
            f"epoch grew with the log: at {big['log_bytes'] / 1e9:.0f} GB ({big['epochs']} epochs) "
            f"{big['first_earliest']['seconds'] * 1e3:.0f} ms from `earliest` and "
            f"{big['first_mid']['seconds'] * 1e3:.0f} ms from the middle. The epoch index found the position "
            "at once; what grew was the fill's reading of the index *after* it: `HistoryFill.insert` read "
            "every index row from the position to the subscriber's join (one `EpochRecord` each, ~10 µs a "
            "row) before the first epoch. The fill now reads the index a page at a time "
            "(`transport/fill_pages.py`, 1,000 rows per partition per page, "
            "`Catalog.history_epochs(after=, limit=)`), the next page as the batch's reader reaches it, "
            "while the batch holds back the live epochs behind it; which epochs a batch owes is fixed when "
            "it is made, so the join stays gap-free and duplicate-free (tests/history/test_fill_pages.py).\n")
        paged = _paged()
        if paged:
            out.append("\nBefore and after, one log measured by both code trees in fresh interpreters, "
                       "the page cache dropped, 3 alternating rounds, medians "
                       f"(`results/history_scale_paged.json`, `python -m benchmarks.bench_history_paged`; "
                       f"load average {paged['load']} on 2 cores):\n\n")
            out.append(_table(["log GB", "epochs", "from earliest, ms: before → after",
                               "from the middle, ms: before → after"], paged["rows"]))
        out.append(
            "\nThe curve above is the run before the fix; its table and fit are kept as measured. "
            "The replay rate falls as the log grows on this machine because the log no longer fits "
            "the page cache (23 GiB of RAM, 17 GiB free) and is read from the shared disk; decoding "
            "1,000-tuple messages caps it at ~5-6 M records/s when cached.\n")
        out.append(f"\n![retained history]({_history_plot(r)})\n")
    return out


def _paged() -> dict | None:
    """The before/after of the paged history fill (``results/history_scale_paged.json``)."""
    from .report import load_result
    r = load_result("history_scale_paged")
    if not r or not r.get("rows"):
        return None
    loads = [x["loadavg"][0] for x in r["rows"] if x.get("loadavg")]
    return {"load": f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?",
            "rows": [(f"{x['log_bytes'] / 1e9:.2f}", x["epochs"],
                      f"{x['before_first_earliest_ms']:.0f} → {x['after_first_earliest_ms']:.0f}",
                      f"{x['before_first_mid_ms']:.0f} → {x['after_first_mid_ms']:.0f}")
                     for x in r["rows"]]}


def _history_plot(r) -> str:
    plt = _plt()
    rows = r["rows"]
    gb = [x["log_bytes"] / 1e9 for x in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(gb, [x["first_earliest"]["seconds"] * 1e3 for x in rows], "o-", label="from earliest")
    ax[0].plot(gb, [x["first_mid"]["seconds"] * 1e3 for x in rows], "s--", label="from the middle")
    ax[0].set_title("time to the first epoch, ms (cold cache)")
    ax[1].plot(gb, [x["replay"]["records_per_s"] for x in rows], "o-")
    ax[1].set_title("replay from earliest, records/s")
    for a in ax:
        a.set_xscale("log")
        a.set_xlabel("retained log, GB")
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=8)
    ax[1].set_ylim(bottom=0)
    return _save(fig, "curve_history_scale.png")


# ---------------------------------------------------------------------------------------------
def partitions_section(r) -> list[str]:
    from .report import _table
    s = r["summary"]
    pmax = max(v for v, _ in s["partitions.records_per_s"]["by_value"])
    out = [f"## Curve: partitions 1 → {pmax} and antichain width 1 → 64 (`partitions_wide`)\n",
           f"Run: {_load(r)}; {r['seconds_per_run']} s per run, {r['repeats']} interleaved repeats, medians. "
           "Partitions: one publisher process holding all P `Publisher`s of the topic (no catalog: one "
           "shared loop thread since 2026-11-27, a loop thread each before), every epoch one 100-tuple message per partition then `advance_to` on each — an "
           "epoch completes when all P moved; the subscriber (`epochs()`, credit flow control) in "
           "another process. Width: the `scale` case's `product(2)` antichain run (w incomparable "
           "capabilities held throughout, each step completes w epochs).\n"]

    def med(key, v):
        x = dict(s[key]["by_value"]).get(v)
        return x["median"] if x else None
    pv = [v for v, _ in s["partitions.records_per_s"]["by_value"]]
    out.append(_table(["partitions", "records/s", "epochs/s", "sub µs CPU / epoch", "sub ns CPU / record",
                       "sub µs CPU / partition-message", "pub ns CPU / record"],
                      [(v, f"{(med('partitions.records_per_s', v) or 0) / 1e6:.2f}M",
                        f"{med('partitions.epochs_per_s', v) or 0:.0f}", f"{med('partitions.sub_cpu_us_per_epoch', v) or 0:.0f}",
                        f"{med('partitions.sub_cpu_ns_per_record', v) or 0:.0f}",
                        f"{med('partitions.sub_cpu_us_per_partition_message', v) or 0:.1f}",
                        f"{med('partitions.pub_cpu_ns_per_record', v) or 0:.0f}") for v in pv]))
    wv = [v for v, _ in s["widths.records_per_s"]["by_value"]]
    out.append("\n")
    out.append(_table(["width", "records/s", "epochs/s", "sub µs CPU / step", "sub µs CPU / epoch", "sub ns CPU / record"],
                      [(v, f"{(med('widths.records_per_s', v) or 0) / 1e6:.2f}M", f"{med('widths.epochs_per_s', v) or 0:.0f}",
                        f"{med('widths.sub_cpu_us_per_step', v) or 0:.0f}", f"{med('widths.sub_cpu_us_per_epoch', v) or 0:.1f}",
                        f"{med('widths.sub_cpu_ns_per_record', v) or 0:.0f}") for v in wv]))
    out.append("\nMeasured growth:\n")
    out.append(f"- partitions, subscriber CPU per epoch: {describe(s['partitions.sub_cpu_us_per_epoch']['fit'], 'µs', 'partition')}\n")
    out.append(f"- partitions, subscriber CPU per record: {describe(s['partitions.sub_cpu_ns_per_record']['fit'], 'ns', 'partition')}\n")
    out.append(f"- partitions, subscriber CPU per partition-message: "
               f"{describe(s['partitions.sub_cpu_us_per_partition_message']['fit'], 'µs', 'partition')}\n")
    out.append(f"- partitions, records/s: {describe(s['partitions.records_per_s']['fit'], 'records/s', 'partition')}\n")
    out.append(f"- partitions, publisher process CPU per record (all P publishers in one process: a loop thread each "
               f"before 2026-11-27, one shared reactor thread since): "
               f"{describe(s['partitions.pub_cpu_ns_per_record']['fit'], 'ns', 'partition')}\n")
    out.append(f"- width, subscriber CPU per step: {describe(s['widths.sub_cpu_us_per_step']['fit'], 'µs', 'unit of width')}\n")
    out.append(f"- width, subscriber CPU per epoch: {describe(s['widths.sub_cpu_us_per_epoch']['fit'], 'µs', 'unit of width')}\n")
    out.append(f"- width, records/s: {describe(s['widths.records_per_s']['fit'], 'records/s', 'unit of width')}\n")
    polls = r.get("poll") or []
    if polls:
        out.append("- one `zmq.Poller.poll(0)` over n idle sockets (what each read pass of a subscriber costs with n "
                   "partitions): " + ", ".join(f"{x['sockets']}: {x['cpu_us_per_poll']:.1f} µs" for x in polls)
                   + f" — {describe(s.get('poll_cpu_us'), 'µs', 'socket', 1, '{:.3g}')}\n")
        passes = r.get("passes") or []
        if passes:
            out.append("- one read pass of the subscriber's links (`PartitionLinks`) when 1 of n is ready — a ROUTER "
                       "sends one message, the pass waits for it and reads that link until `zmq.Again` "
                       "(`bench_partitions.pass_cost`, CPU of the whole process, best of 2 interleaved): "
                       + ", ".join(f"{x['sockets']}: {x['poller_us_per_pass']:.1f} µs with `zmq.Poller`, "
                                   f"{x['epoll_us_per_pass']:.1f} µs with `epoll`" for x in passes) + "\n")
            out.append("\n**Fixed here: the read pass no longer looks at every partition.** Before 2026-11-27 every "
                       "read pass polled every partition's socket (`zmq.Poller` over P DEALERs, 0.6 µs per "
                       "socket), so per epoch the subscriber paid ~P × P once the passes stopped batching several "
                       "partitions' messages (the rise at 256 partitions in the runs before). `transport/links.py` "
                       "now waits with one `epoll` on the sockets' `zmq.FD`s and hands out only the links that "
                       "fired or are *unsettled* (read without reaching `zmq.Again`, sent on, new, or after an "
                       "outside wait), as `zmq.asyncio` does; tests/sockets/test_wakeups.py tries to lose a "
                       "wake-up. The table above is from the run named at the top of this section.\n")
        else:
            out.append("\n**Where it broke.** Every read pass polled every partition's socket (`zmq.Poller` over P "
                       "DEALER sockets), a cost linear in P paid per pass; fixed on 2026-11-27 (one `epoll`, "
                       "transport/links.py), not yet re-measured in this run.\n")
    out.append(f"\n![partitions and width]({_partitions_plot(r)})\n")
    return out


def _partitions_plot(r) -> str:
    plt = _plt()
    s = r["summary"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, label, a in (("partitions", "partitions", ax[0]), ("widths", "antichain width", ax[1])):
        bv = [(v, x["median"]) for v, x in s[f"{key}.records_per_s"]["by_value"] if x]
        a.plot([v for v, _ in bv], [y for _, y in bv], "o-", label="records/s")
        a.set_xscale("log", base=2)
        a.set_xlabel(label)
        a.set_ylabel("records/s")
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        b = a.twinx()
        k2 = f"{key}.sub_cpu_us_per_epoch"
        cv = [(v, x["median"]) for v, x in s[k2]["by_value"] if x]
        b.plot([v for v, _ in cv], [y for _, y in cv], "s--", color="C1", label="sub µs CPU / epoch")
        b.set_ylabel("subscriber µs CPU per epoch")
        b.set_yscale("log")
        a.set_title(label)
    return _save(fig, "curve_partitions.png")


# ---------------------------------------------------------------------------------------------
SECTIONS = (("topics", topics_section), ("subscribers", subscribers_section),
            ("catalog_scale", catalog_scale_section), ("history_scale", history_scale_section),
            ("partitions_wide", partitions_section))


BEGIN, END = "<!-- curves of scale: begin -->", "<!-- curves of scale: end -->"


def sections() -> list[str]:
    """The curves' sections, between the :data:`BEGIN` and :data:`END` markers."""
    out = [BEGIN + "\n"]
    for case, fn in SECTIONS:
        r = load_result(case)
        if r and (r.get("rows") or r.get("summary")):
            try:
                out += fn(r) + ["\n"]
            except Exception as exc:  # a malformed result must not stop the whole report
                out.append(f"## `{case}`\n\nCould not render: {type(exc).__name__}: {exc}\n\n")
    out.append(END + "\n")
    return out


def splice(path=None) -> str:
    """Replace the curves' sections in docs/benchmarks.md (between the markers; before
    "## Import and start-up", or at the end, the first time) without regenerating the rest of
    the file (it holds hand-written sections the generator does not make)."""
    from . import DOCS
    path = path or DOCS / "benchmarks.md"
    text = path.read_text()
    new = "\n".join(x.rstrip("\n") + "\n" for x in sections() if x.strip())
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + new.rstrip("\n") + rest.split(END, 1)[1]
    elif "\n## Import and start-up" in text:
        head, rest = text.split("\n## Import and start-up", 1)
        text = head + "\n" + new + "\n## Import and start-up" + rest
    else:
        text = text.rstrip("\n") + "\n\n" + new
    path.write_text(text)
    return str(path)


if __name__ == "__main__":
    print(splice())


__all__ = ["sections", "fit"]
