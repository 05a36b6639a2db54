"""The cost model of docs/scale.md (issue 28, "on paper, beyond one machine"):
``python -m benchmarks.scale_model`` reads the per-unit costs from the result files of the
curves (``subscribers``, ``partitions_wide``, ``topics``, ``catalog_scale``) and of the older
cases (``catalog_stores``, ``fanout``) and prints, as Markdown, the unit costs with the file and
key each comes from, and the prediction for a deployment (:data:`DEPLOYMENT`) in three
topologies. Every number docs/scale.md quotes is printed here.

The model is deliberately first-order: a component's CPU = Σ (rate × unit cost); a component is
saturated at one core per process (a Python process's hot loop holds the GIL: a publisher's loop
thread, a subscriber's consuming thread, a relay's thread) and a machine at its cores.
"""

from __future__ import annotations

import json
import math

from . import RESULTS

DEPLOYMENT = {
    "subscribers": 10_000,
    "partitions": 1_000,
    "records_per_message": 100,
    "epochs_per_s": 1.0,  # every partition advances once a second (an epoch per second)
    "durable_fraction": 1.0,  # every subscriber durable, acking every epoch
    "cores_per_machine": 16,
}


def _load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _median_of(by_value, v):
    d = dict((k, x) for k, x in by_value)
    x = d.get(v)
    return x["median"] if x else None


def unit_costs() -> dict:
    """``{name: (value, unit, source)}`` — each measured unit cost and where it comes from."""
    out = {}
    subs, parts, topics = _load("subscribers"), _load("partitions_wide"), _load("topics")
    cat, stores = _load("catalog_scale"), _load("catalog_stores")
    mem = _load("memory")
    if mem.get("summary", {}).get("bytes_per_subscriber"):
        out["sub_rss_idle"] = (mem["summary"]["bytes_per_subscriber"]["median"] / 1024, "KiB of publisher memory per "
                               "connected idle subscriber", "memory.json summary.bytes_per_subscriber.median / 1024")
    if subs:
        f = subs["summary"]["direct.pub_cpu_us_per_record"]
        out["fan"] = (f["linear"]["slope"], "µs CPU per record per subscriber (publisher, marginal)",
                      "subscribers.json summary['direct.pub_cpu_us_per_record'].linear.slope")
        f3 = subs["summary"].get("direct.publisher_rss_kib")
        if f3:
            out["sub_rss"] = (f3["linear"]["slope"], "KiB of publisher memory per connected subscriber",
                              "subscribers.json summary['direct.publisher_rss_kib'].linear.slope")
        f2 = subs["summary"].get("tree.pub_cpu_us_per_record")
        ok_tree = [r for r in subs["rows"] if r.get("ok") and r["topology"] == "tree"
                   and r["delivered_fraction"] >= 0.99]
        if ok_tree:
            r = max(ok_tree, key=lambda x: x["subscribers"])
            out["relay_hop"] = (r["relay_level1_cpu_us_per_record"] / 2,
                                "µs CPU per record per relay (level 1: a relay serving 2 relays, at "
                                f"{r['rate_epochs_per_s']} messages/s: includes its idle cost)",
                                f"subscribers.json rows[topology=tree, N={r['subscribers']}]."
                                "relay_level1_cpu_us_per_record / 2")
        if f2:
            out["pub_fixed_low_rate"] = (f2["linear"]["intercept"], "µs CPU per record of a publisher at "
                                         "20 messages/s (fixed costs: catalog, heartbeats, timers)",
                                         "subscribers.json summary['tree.pub_cpu_us_per_record'].linear.intercept")
    if parts:
        s = parts["summary"]
        one = _median_of(s["partitions.sub_cpu_ns_per_record"]["by_value"], 1)
        out["sub_record"] = (one / 1e3, "µs CPU per record delivered (subscriber, 100 tuples/message, "
                             "1 partition, flat out)", "partitions_wide.json summary['partitions.sub_cpu_ns_per_record'] at 1")
        pub = _median_of(s["partitions.pub_cpu_ns_per_record"]["by_value"], 1)
        out["pub_record"] = (pub / 1e3, "µs CPU per record sent (publisher process, 1 subscriber, flat out)",
                             "partitions_wide.json summary['partitions.pub_cpu_ns_per_record'] at 1")
        pm = _median_of(s["partitions.sub_cpu_us_per_partition_message"]["by_value"], 32)
        out["partition_msg"] = (pm, "µs subscriber CPU per partition-message at 32 partitions (a 100-tuple "
                                "message decoded and its partition's frontier update merged; flat from 2 to 128)",
                                "partitions_wide.json summary['partitions.sub_cpu_us_per_partition_message'] at 32")
        pf, passes = s.get("poll_cpu_us"), parts.get("passes")
        if passes:  # the read pass waits with one epoll (transport/links.py): what is ready, not P
            xs = [x["sockets"] for x in passes]
            ys = [x["epoll_us_per_pass"] for x in passes]
            slope = max(0.0, (ys[-1] - ys[0]) / (xs[-1] - xs[0])) if len(xs) > 1 else 0.0
            out["poll_per_socket"] = (slope, "µs CPU per partition socket per read pass (one epoll: "
                                      f"{ys[0]:.1f} µs a pass at {xs[0]} link, {ys[-1]:.1f} µs at {xs[-1]}; "
                                      "the difference over the links between)",
                                      "partitions_wide.json passes[].epoll_us_per_pass, first and last")
        elif pf:
            out["poll_per_socket"] = (pf["linear"]["slope"], "µs CPU per partition socket per read pass "
                                      "(zmq poll over every partition)",
                                      "partitions_wide.json summary['poll_cpu_us'].linear.slope")
    if topics:
        s = topics["summary"]
        out["idle_pub"] = (s["publishers.cpu_frac"]["fit"]["linear"]["slope"] * 100, "% of a core per idle "
                           "publisher (heartbeats, one subscriber)", "topics.json summary['publishers.cpu_frac'].fit.linear.slope")
        out["idle_sub"] = (s["subscribers.cpu_frac"]["fit"]["linear"]["slope"] * 100, "% of a core per idle "
                           "subscriber", "topics.json summary['subscribers.cpu_frac'].fit.linear.slope")
        out["pub_rss"] = (s["publishers.rss_kib"]["fit"]["linear"]["slope"], "KiB per publisher",
                          "topics.json summary['publishers.rss_kib'].fit.linear.slope")
        out["pub_fds"] = (s["publishers.fds"]["fit"]["linear"]["slope"], "file descriptors per publisher "
                          "(one subscriber)", "topics.json summary['publishers.fds'].fit.linear.slope")
        f = (s.get("fanin.publishers.cpu_frac") or {}).get("fit")
        if f:
            out["idle_pair"] = (f["linear"]["slope"] * 1e6, "µs CPU per second per idle subscriber on its "
                                "publisher (a ping in, a heartbeat out)",
                                "topics.json summary['fanin.publishers.cpu_frac'].fit.linear.slope × 1e6")
    if cat:
        for store in ("sqlite", "postgresql"):
            rows = [r for r in cat["rows"] if r["store"] == store]
            if rows:
                big = rows[-1]
                out[f"ack_{store}"] = (big["durable_ack"]["median_us"], f"µs per durable ack on {store} at "
                                       f"N = {big['count']} (one client)",
                                       f"catalog_scale.json rows[store={store}, count={big['count']}].durable_ack.median_us")
    if stores:
        for key, label in (("ack threads x1", "1 client"), ("ack threads x32", "32 clients")):
            c = stores.get("cells", {}).get(key, {})
            for store in ("sqlite", "postgresql"):
                v = (c.get(store) or {}).get("ops_per_s", {}).get("median")
                if v:
                    out[f"acks_per_s_{store}_{label.split()[0]}"] = (
                        v, f"durable acks/s on {store}, {label} (fsync off on PostgreSQL)",
                        f"catalog_stores.json cells['{key}'].{store}.ops_per_s.median")
    return out


def predict(u: dict, d: dict = DEPLOYMENT) -> dict:
    """The deployment ``d`` in two topologies — every subscriber connected to every partition
    (``direct``), and a two-level relay tree (``tree``) — and the catalog; see docs/scale.md."""
    S, P, rpm, E = d["subscribers"], d["partitions"], d["records_per_message"], d["epochs_per_s"]
    per_msg = rpm  # the unit costs were measured at 100 records per message, as here
    fan_msg = u["fan"][0] * per_msg            # µs per message per subscriber, publisher side
    pub_msg = u["pub_record"][0] * per_msg     # µs per message, publisher, one subscriber
    sub_msg = u["partition_msg"][0]            # µs per partition-message, subscriber (decode + merge)
    poll = u.get("poll_per_socket", (0.0,))[0]  # µs per partition socket per read pass
    pair = u.get("idle_pair", (0.0,))[0]       # µs/s per connected idle subscriber, publisher side
    out = {"records_per_s_topic": P * rpm * E, "messages_per_s_topic": P * E,
           "unit": {"fan_msg_us": fan_msg, "pub_msg_us": pub_msg, "sub_msg_us": sub_msg,
                    "poll_us_per_socket": poll, "idle_pair_us_per_s": pair}}

    def reader(partitions, msgs_per_s, passes_per_s):
        """CPU (cores) of one process reading ``partitions`` sockets."""
        return (msgs_per_s * sub_msg + passes_per_s * partitions * poll) / 1e6

    # direct: every subscriber connects to every partition
    out["direct"] = {
        "publisher_cores_per_partition": (E * (pub_msg + S * fan_msg) + S * pair) / 1e6,
        "publisher_rss_gib_per_partition": S * u["sub_rss"][0] / 2**20 if "sub_rss" in u else None,
        "publisher_rss_gib_per_partition_idle": S * u["sub_rss_idle"][0] / 2**20 if "sub_rss_idle" in u else None,
        "connections": S * P, "fds_per_partition_publisher": S + 4, "fds_per_subscriber": 2 * P,
        "subscriber_cores_each_best": reader(P, P * E, E),  # one read pass per epoch
        "subscriber_cores_each_worst": reader(P, P * E, P * E),  # one pass per message
    }
    # a relay subscribes to every partition of its upstream topic (merged) and republishes every
    # message to its k downstream subscribers
    def relay(k, partitions):
        return {"best": reader(partitions, P * E, E) + P * E * (pub_msg + k * fan_msg) / 1e6,
                "worst": reader(partitions, P * E, P * E) + P * E * (pub_msg + k * fan_msg) / 1e6}

    def k_at_one_core(partitions, case):
        base = relay(0, partitions)[case]
        return max(0, int((1.0 - base) / (P * E * fan_msg / 1e6))) if fan_msg else 0
    k1 = {c: k_at_one_core(P, c) for c in ("best", "worst")}
    k2 = {c: k_at_one_core(1, c) for c in ("best", "worst")}
    leaves = math.ceil(S / max(1, k2["best"]))
    level1 = math.ceil(leaves / max(1, k1["best"])) if k1["best"] else None
    out["tree"] = {
        "leaf_relay_max_fanout_at_1_core": k2, "level1_relay_max_fanout_at_1_core": k1,
        "leaf_relays": leaves, "level1_relays": level1,
        "publisher_cores_per_partition": (E * (pub_msg + (level1 or 0) * fan_msg) + (level1 or 0) * pair) / 1e6,
        "subscriber_cores_each": reader(1, P * E, P * E),
        "relay_cores_total": leaves * relay(k2["best"], 1)["best"] + (level1 or 0) * relay(k1["best"], P)["best"],
        "connections": P * (level1 or 0) + (level1 or 0) * k1["best"] + S,
    }
    out["tree"]["machines_for_relays"] = math.ceil(out["tree"]["relay_cores_total"] / d["cores_per_machine"])
    if "relay_hop" in u:  # the relay's cost per message as measured at 20 messages/s (idle included)
        hop = u["relay_hop"][0] * per_msg
        k_p = max(1, int((1e6 / (P * E) - hop) / fan_msg)) if 1e6 / (P * E) > hop else 0
        leaves_p = math.ceil(S / k_p) if k_p else None
        out["tree_pessimistic"] = {"relay_us_per_message_measured": hop, "max_fanout_at_1_core": k_p,
                                   "leaf_relays": leaves_p,
                                   "level1_relays": math.ceil(leaves_p / k_p) if k_p else None,
                                   "machines_for_relays": math.ceil(((leaves_p or 0) + math.ceil((leaves_p or 0) / max(1, k_p)))
                                                                    / d["cores_per_machine"])}
    acks = S * d["durable_fraction"] * E
    cap = {k.replace("acks_per_s_", ""): v[0] for k, v in u.items() if k.startswith("acks_per_s_")}
    out["catalog"] = {"acks_per_s": acks, "capacity_acks_per_s": cap,
                      "max_epochs_per_s_acking_every_epoch": {k: v / (S * d["durable_fraction"]) for k, v in cap.items()},
                      "ack_every_k_epochs_on_postgresql": math.ceil(acks / cap["postgresql_1"]) if cap.get("postgresql_1") else None}
    return out


def markdown() -> str:
    u = unit_costs()
    lines = ["| unit cost | value | source |", "|---|---|---|"]
    for name, (v, unit, src) in u.items():
        lines.append(f"| `{name}`: {unit} | {v:.4g} | `{src}` |")
    out = "\n".join(lines) + "\n"
    if all(k in u for k in ("fan", "pub_record", "sub_record", "partition_msg")):
        p = predict(u)
        out += "\n```\n" + json.dumps({"deployment": DEPLOYMENT, **p}, indent=1, default=str) + "\n```\n"
    return out


if __name__ == "__main__":
    print(markdown())
