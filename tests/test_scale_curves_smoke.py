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
    r = bench_topics.run(quick=True, counts=(0, 2), window=0.2)
    assert r["ok"], r["rows"]
    two = r["rows"][1]
    assert two["publishers_opened"] == 2 and two["subscribers_opened"] == 2
    assert two["publishers"]["end"]["threads"] > r["rows"][0]["publishers"]["end"]["threads"]
    assert "publishers.cpu_frac" in r["summary"]
