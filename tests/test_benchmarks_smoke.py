"""Smoke test of the benchmark harness: one tiny case of each kind that needs no external server.

Checks result shapes and zero loss only — never speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds benchmarks/

from benchmarks import bench_filter, harness, paired

pytestmark = pytest.mark.timeout(60)


def test_filter_case_shape_and_counts():
    for method in bench_filter.METHODS:
        r = bench_filter.measure(method, "product(2)", 2, 100, 0.5, min_time=0.01)
        assert r["ok"], r
        assert r["method"] == method
        assert r["messages"] > 0 and r["delivered_messages"] == r["messages"] // 2
        # what passes is decoded and every delivered record visited, as a user's loop would
        assert r["delivered_records"] == r["delivered_messages"] * 100
        for key in ("messages_per_s", "records_per_s_consumed", "records_per_s_delivered"):
            assert isinstance(r[key], float) and r[key] > 0
    none_pass = bench_filter.measure("transport", "total", 1, 1, 0.0, min_time=0.01)
    assert none_pass["ok"] and none_pass["delivered_messages"] == 0


def _check_row(r, expected_records):
    assert r["ok"], r.get("detail") or r.get("error")
    assert r["expected_records"] == expected_records
    assert r["received_records"] == [expected_records] * r["subscribers"]
    for key in ("records_per_s", "records_per_s_total", "messages_per_s", "seconds"):
        assert isinstance(r[key], float) and r[key] > 0


@pytest.mark.parametrize("api", ["epochs", "events"])
def test_e2e_epochstream_tiny(api):
    # 3 epochs x 10 messages x 100 records, two subscribers, two partitions
    r = harness.run("epochstream", kind="dicts", per_message=100, subscribers=2, partitions=2,
                    api=api, epochs=3, time_limit=30)
    _check_row(r, 3 * 10 * 100)
    assert r["messages"] == 30


def test_time_based_run_two_partitions_coalescing_off():
    # publishers stop together at an epoch boundary after the duration; nothing lost
    r = harness.run("epochstream", kind="dicts", per_message=1, partitions=2, api="epochs",
                    duration=0.3, coalesce_bytes=0, time_limit=30)
    assert r["ok"], r.get("detail") or r.get("error")
    assert r["epochs"] >= 1 and r["expected_records"] == r["epochs"] * r["messages_per_epoch"]
    assert r["received_records"] == [r["expected_records"]]
    assert r["wire_messages_per_record"] == 1.0  # coalescing off: one payload per wire message
    assert len(r["sub_gc"][0]) == 3 and r["pub_cpu_s_per_M"] > 0 and r["sub_cpu_s_per_M"][0] > 0


def test_paired_ratios_and_verdict():
    rows = [{"variant": v, "repeat": k, "ok": True, "records_per_s": x}
            for k, (a, b) in enumerate([(2.0, 1.0), (1.0, 1.0), (3.0, 2.0)]) for v, x in (("A", a), ("B", b))]
    s = paired.summary(paired.pair_ratios(rows, "A", "B"))
    assert (s["n"], s["min"], s["median"], s["max"]) == (3, 1.0, 1.5, 2.0)
    assert paired.verdict(s, 0.9) == "met" and paired.verdict(s, 1.2) == "not met (min below target)"
    assert paired.verdict(s, 2.5) == "missed"


def test_e2e_raw_zmq_tiny():
    r = harness.run("zmq", kind="arrow", per_message=1, epochs=3, time_limit=30)
    _check_row(r, 3 * 100)


def test_fanout_raw_zmq_peer_tiny():
    """The fan-out case's floor: raw pyzmq's PUB to two subscriber processes, 38 KB frames."""
    from benchmarks import bench_fanout
    assert bench_fanout._variant("16") == ("epochstream", 16)
    assert bench_fanout._variant("zmq:4") == ("zmq", 4)
    r = harness.run("zmq", kind="arrow", per_message=1000, subscribers=2, epochs=3, time_limit=30)
    _check_row(r, 3 * 1000 * harness.messages_per_epoch(1000))
    assert len(r["pub_cpu_s"]) == 1


def test_latency_mode_tiny():
    r = harness.run("epochstream", kind="tuples", per_message=1000, mode="latency", epochs=5,
                    api="epochs", time_limit=30)
    _check_row(r, 5 * 4 * 1000)
    assert r["latency_samples"] == 5
    assert 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]


# -- the measurement cases added for issue 10 (tiny versions: shapes and counts, never speed) --

def test_limits_tiny():
    from benchmarks import bench_limits
    assert bench_limits.memcpy("bytearray", 0.01, size=1 << 20)["bytes_per_s"] > 0
    d = bench_limits.decode_loop("tuples", 100, 0.01)
    assert d["records_per_s"] > 0 and d["payload_bytes"] > 0
    zt = bench_limits.ZmqThroughput()
    try:
        for frames in (1, 3):
            r = zt.measure(4096, frames, 0.05)
            assert r["ok"] and r["messages"] == r["sent"] > 1 and r["messages_per_s"] > 0
    finally:
        zt.close()


def test_latejoin_tiny():
    from benchmarks import bench_latejoin
    r = bench_latejoin.run(samples=3, log=lambda m: None)
    assert r["summary"]["samples"] == 3 and r["summary"]["failed"] == 0
    assert all(x["epoch_records"] == bench_latejoin.MESSAGES_PER_EPOCH * bench_latejoin.PER_MESSAGE
               for x in r["rows"])


def test_latency_level_tiny():
    from benchmarks import bench_latency
    r = bench_latency._level(200.0, 20, log=lambda m: None)
    assert r["ok"] and r["samples"] == 20 and r["records"] == r["published_records"]
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"]


def test_memory_tiny():
    from benchmarks import bench_memory
    s = bench_memory.per_subscriber(n_max=3)
    assert s["ok"] and s["pub_stats"]["subscribers_joined"] == 3
    q = bench_memory.per_queued_message(2000)
    assert q["ok"] and q["pub_stats"]["data_messages"] == 2000 and q["rss_after"] > 0


def test_antichain_width_tiny():
    from benchmarks import bench_scale, streams
    ts = streams.antichain_times(4, 0)
    assert all(not (a[0] <= b[0] and a[1] <= b[1]) for a in ts for b in ts if a != b)
    r = bench_scale.antichain_run(4, 0.2)
    assert r["ok"], r.get("error")
    assert r["records"] == r["published_records"] and r["epochs"] == 4 * r["steps"]


# -- durable history (issue 11): tiny versions of the ``history`` case --

def test_history_tiny(tmp_path):
    from benchmarks import bench_history
    # a retained log written by a live run, then read back three ways; every record counted
    row, replays = bench_history.live_run("frontier", 0.2, messages_per_epoch=4,
                                          replays=bench_history.REPLAYS, base=str(tmp_path))
    assert row["ok"], row.get("detail") or row.get("error")
    assert row["received_records"] == row["records"] == row["epochs"] * 4 * 1000
    assert row["log_bytes"] > row["records"] and row["advance"]["n"] == row["epochs"]
    assert [r["variant"] for r in replays] == list(bench_history.REPLAYS)
    for r in replays:
        assert r["ok"], r.get("detail") or r.get("error")
        assert (r["records"], r["epochs"]) == (row["records"], row["epochs"])
        assert r["records_per_s"] > 0 and r["first_epoch_ms"] > 0
    off, none = bench_history.live_run("off", 0.1, base=str(tmp_path))
    assert off["ok"] and off["log_bytes"] == 0 and none == []
    fs = bench_history.fsync_cost(5, base=str(tmp_path))
    assert fs["fsync_100B"]["n"] == 5 and fs["fsync_epoch"]["median_ms"] > 0


def test_history_resume_tiny(tmp_path):
    from benchmarks import bench_history
    r = bench_history.resume_latency(1, base=str(tmp_path), log=lambda m: None)
    assert r["ok"], r.get("error") or r["rows"]
    durable = [x for x in r["rows"] if x["mode"] == "durable"][0]
    assert durable["epoch"] == durable["position"][0] and durable["history_epochs"] >= 1
    assert r["summary"]["latest"]["total_ms"]["median"] > 0


def test_history_profile_tiny(tmp_path):
    from benchmarks import bench_history
    p = bench_history.profile_publisher(0.1, out=tmp_path / "prof.txt")
    assert set(p["variants"]) == set(bench_history.VARIANTS)
    assert "os.fsync of the segment" in p["variants"]["frontier"]["functions"]
    assert "os.fsync of the segment" not in p["variants"]["nofsync"]["functions"]
    assert (tmp_path / "prof.txt").read_text().count("==== retention") == 3


def test_replay_profile_tiny():
    from benchmarks import bench_history, profile_replay
    r = profile_replay.run(epochs=3, repeats=2)  # every step asserts it counted every record
    assert r["records"] == 3 * profile_replay.MESSAGES * profile_replay.RECORDS
    assert {x["variant"] for x in r["rows"]} == set(r["median_cpu_s_per_M"]) >= {"read", "replay"}
    assert r["ratios_records_per_s"]["history_readahead ÷ history"]["n"] == 2
    # the history case's summary can be recomputed from its rows (the report relies on it)
    rows = [{"variant": v, "repeat": 0, "ok": True, "records_per_s": x, "sub_cpu_s_per_M": c}
            for v, x, c in (("off", 2.0, 0.2), ("replay", 3.0, 0.1))]
    ratios = {x["what"]: x for x in bench_history.summarize(rows)["ratios"]}
    replay = next(x for x in ratios.values() if x["target"] == 1.0)
    assert replay["paired"]["median"] == 1.5 and replay["verdict"].startswith("met")
    assert next(x for x in ratios.values() if x["key"] == "sub_cpu_s_per_M")["paired"]["median"] == 0.5


# -- consumer groups (issue 12): tiny versions of the ``groups`` case --

def test_groups_tiny(tmp_path):
    from benchmarks import bench_groups
    pool = bench_groups._Pool(2)
    try:
        # shared mode, two worker processes: every epoch acked once, whole, 0..n-1
        r = bench_groups.throughput_run(pool, mode="shared", work=0.002, workers=2, duration=0.3,
                                        base=str(tmp_path))
        assert r["ok"], r.get("detail") or r.get("error")
        assert r["epochs"] > 0 and r["epochs_acked_total"] >= r["epochs"] and len(r["per_worker"]) == 2
        assert r["fetch"]["n"] == r["ack"]["n"] == r["epochs_acked_total"]
        assert r["ms_per_epoch"]["claim"] > 0 and r["calls_per_epoch"]["settle"] == 1
        # partial mode over two independent product(2) chains
        p = bench_groups.throughput_run(pool, mode="partial", work=0.002, workers=2, duration=0.3,
                                        chains=2, base=str(tmp_path))
        assert p["ok"], p.get("detail") or p.get("error")
        assert p["order_violations"] == 0 and set(p["acked_per_chain"]) == {"0", "1"}
        # redelivery after an expired lease and after a SIGKILL, one sample each
        d = bench_groups.redelivery(pool, 1, base=str(tmp_path), log=lambda m: None)
        assert d["ok"], d.get("error") or d["rows"]
        assert {(x["kind"], x["samples"]) for x in d["summary"]} == {("expiry", 1), ("kill", 1)}
        assert all(x["late_ack_refused"] for x in d["rows"] if x["kind"] == "expiry")
    finally:
        pool.close()


def test_groups_profile_and_backlog_tiny(tmp_path):
    from benchmarks import bench_groups
    p = bench_groups.profile_worker(0.1, out=tmp_path / "prof.txt", base=str(tmp_path))
    assert p["fetch_acks"] > 0 and "Catalog.group_claim (BEGIN IMMEDIATE … COMMIT)" in p["functions"]
    assert (tmp_path / "prof.txt").read_text().startswith("cProfile")
    q = bench_groups.sql_breakdown(3, base=str(tmp_path))
    assert any(x["sql"] == "BEGIN IMMEDIATE" and x["calls"] == 2 for x in q["statements"])
    assert 0 < q["sqlite_us_per_fetch_ack"] < q["us_per_fetch_ack"]
    b = bench_groups.backlog_latency((5,), samples=3, base=str(tmp_path))
    assert b[0]["fetch"]["n"] == 3 and b[0]["ack"]["median_ms"] > 0


def test_report_keeps_the_sections_written_by_hand():
    """`python -m benchmarks.report` regenerates docs/benchmarks.md: the sections it does not
    generate sit between hand markers and are kept, markers and all, in their order."""
    from benchmarks.report import hand_sections

    text = ("# B\n## generated\nx\n<!-- hand: a (kept) -->\n## A\n1\n\n2\n<!-- /hand: a -->\n"
            "## more\n<!-- hand: b -->\n## B\n<!-- /hand: a -->\n3\n<!-- /hand: b -->\n")
    kept = hand_sections(text)
    assert kept == ["<!-- hand: a (kept) -->\n## A\n1\n\n2\n<!-- /hand: a -->\n",
                    "<!-- hand: b -->\n## B\n<!-- /hand: a -->\n3\n<!-- /hand: b -->\n"]
    doc = (Path(__file__).parent.parent / "docs" / "benchmarks.md").read_text()
    names = [s.split()[2] for s in hand_sections(doc)]
    assert set(names) >= {"store", "catalog_stores", "spark_event_time", "restructuring",
                          "metrics"}, names


def test_store_case_tiny(tmp_path, monkeypatch):
    """The ``store`` case's pieces on a real local S3 server (weed mini): one tiny live run with
    upload="sealed" and its two replays (from disk, from the store), and the visibility probe."""
    from benchmarks import bench_store

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # (restored after the test)
        monkeypatch.setenv(k, "x")
    weed = bench_store.start_weed(str(tmp_path))
    try:
        rows = bench_store.store_run("sealed", 0.2, weed.uri("smoke"), segment_bytes=1 << 20,
                                     replays=bench_store.REPLAYS, base=str(tmp_path))
        assert [r["variant"] for r in rows] == ["sealed", *bench_store.REPLAYS]
        assert all(r["ok"] for r in rows), rows
        assert rows[0]["segments_in_store"] == rows[0]["segments"] >= 1
        assert all(r["records"] == rows[0]["records"] for r in rows)
        vis = bench_store.visibility(weed.uri("smoke-vis"), 2, base=str(tmp_path))
        assert vis["frontier"]["readable_ms"]["n"] == 2 and vis["sealed"]["advance_ms"]["n"] == 2
    finally:
        weed.stop()
    assert bench_store.section({"ratios": []}) == []


def test_arrow_schema_measurement_tiny():
    from benchmarks import arrow_schema
    out = arrow_schema.run(rounds=2, seconds=0.01)
    assert set(out["us_per_call"]) == {"decode_today", "decode_batch_only", "encode_writer",
                                       "encode_today"}
    assert out["schema_message_bytes"] < out["batch_message_bytes"] < out["payload_bytes"]


def test_profile_pubsub_tiny():
    """The per-thread profile of 1-record messages: every record arrives, each side's CPU."""
    from benchmarks import profile_pubsub
    r = profile_pubsub.one(0.3)
    assert r["records"] > 0 and r["records_per_s"] > 0
    assert r["caller_us"] > 0 and r["loop_us"] > 0 and r["subscriber_us"] > 0
