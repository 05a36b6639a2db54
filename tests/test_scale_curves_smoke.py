"""Smoke test of the curves of scale (issue 28): each case runs at a tiny size and returns the
shape the report reads — never a speed. Kept to a few seconds in all."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds benchmarks/

from benchmarks import bench_topics, curves

pytestmark = pytest.mark.timeout(60)


def test_fit_tells_constant_linear_and_logarithmic_apart():
    xs = [1, 10, 100, 1000]
    assert curves.fit(xs, [5.0, 5.1, 5.05, 5.2])["growth"] == "constant"
    assert curves.fit(xs, [2 + 3 * x for x in xs])["growth"] == "linear"
    import math
    assert curves.fit(xs, [10 + 4 * math.log2(x) for x in xs])["growth"] == "logarithmic"
    assert curves.fit(xs, [x * x for x in xs])["growth"] == "superlinear"


def test_topics_case_tiny():
    r = bench_topics.run(quick=True, counts=(0, 2), window=0.2, fanin=(3,))
    assert r["ok"], r["rows"]
    two = r["rows"][1]
    fan = r["rows"][2]
    assert fan["mode"] == "fanin" and fan["publishers_opened"] == 1 and fan["subscribers_opened"] == 3
    assert two["publishers_opened"] == 2 and two["subscribers_opened"] == 2
    assert two["publishers"]["end"]["threads"] > r["rows"][0]["publishers"]["end"]["threads"]
    assert "publishers.cpu_frac" in r["summary"]


def test_catalog_scale_case_tiny_sqlite():
    from benchmarks import bench_catalog_scale
    r = bench_catalog_scale.run(quick=True, stores=("sqlite",), counts=(1, 30), seconds=0.06)
    assert r["ok"], r["errors"]
    assert [x["count"] for x in r["rows"]] == [1, 30]
    for op in bench_catalog_scale.OPS:
        assert r["rows"][1][op]["calls"] > 0 and r["rows"][1][op]["median_us"] > 0


def test_partitions_case_tiny():
    from benchmarks import bench_partitions
    row = bench_partitions.partitions_run(3, 0.3)
    assert row["ok"], row.get("error")
    assert row["records"] == row["epochs"] * 3 * bench_partitions.PER_MESSAGE


def test_subscribers_case_tiny_through_a_relay_tree():
    from benchmarks import bench_subscribers
    row = bench_subscribers.point(2, "tree", 0.4, drain_s=0.3)
    assert row["ok"], row.get("error")
    assert row["relay_levels"] == 2 and row["records_sent"] > 0
    assert row["delivered_fraction"] == 1.0


def test_history_scale_case_tiny():
    from benchmarks import bench_history_scale
    r = bench_history_scale.run(quick=True, sizes=(2_000_000, 4_000_000), replay_s=0.1)
    assert r["ok"], r["error"]
    assert [x["log_bytes"] >= t for x, t in zip(r["rows"], (2_000_000, 4_000_000))] == [True, True]
    assert r["rows"][1]["first_mid"]["time"] >= r["rows"][1]["epochs"] // 2
