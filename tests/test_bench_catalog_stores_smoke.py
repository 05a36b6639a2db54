"""Smoke test of ``benchmarks/bench_catalog_stores.py`` (the catalog's operations and a retention
publisher on SQLite and on PostgreSQL): the benchmark's functions in a tiny configuration —
0.1 s cells, one repeat, 1 and 2 client threads, 2 client processes (ack only), the fsync-on
cell at 2 clients — written to JSON and read back.

Checks the result's shape only — never speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds benchmarks/

from benchmarks import bench_catalog_stores as bcs

pytestmark = pytest.mark.timeout(120)

STORES = ("sqlite", "postgresql")
SPREAD = {"median", "min", "max", "n"}


def _spread(s):
    assert set(s) == SPREAD, s
    assert s["min"] <= s["median"] <= s["max"] and s["n"] >= 1


def test_tiny_run_writes_the_result_shape(tmp_path):
    result = bcs.run(seconds=0.1, repeats=1, concurrency=(1, 2), process_concurrency=(2,),
                     process_ops=("ack",), warmup=2, publisher_seconds=0.1, publisher_warmup=2,
                     fsync_clients=2, log=lambda m: None)
    path = bcs.write(result, tmp_path / "catalog_stores.json")
    r = json.loads(path.read_text())

    # machine and parameters
    for key in ("nproc", "python", "psycopg", "sqlite", "postgresql_server"):
        assert r["machine"][key], key
    par = r["parameters"]
    assert par["seconds_per_cell"] == 0.1 and par["repeats"] == 1
    assert par["thread_concurrency"] == [1, 2] and par["process_concurrency"] == [2]
    assert par["ops"] == list(bcs.OPS) and par["publisher_records_per_message"] == bcs.RECORDS
    assert r["postgresql_fsync"] is False and "fsync" in r["postgresql_fsync_note"]
    assert "threads" in r["notes"]["clients"] and "processes" in r["notes"]["clients"]
    assert isinstance(r["summary"], list) and all(isinstance(x, str) for x in r["summary"])
    assert r["storage"]["fstype"] and r["wall_s"] > 0

    # one row per store x op x configuration; every cell completed calls without errors
    configs = [("threads", 1), ("threads", 2)]
    expected = {(s, op, m, n) for s in STORES for op in bcs.OPS for m, n in configs}
    expected |= {(s, "ack", "processes", 2) for s in STORES}
    assert {(x["store"], x["op"], x["mode"], x["clients"]) for x in r["rows"]} == expected
    assert len(r["rows"]) == len(expected)
    for row in r["rows"]:
        assert row["repeat"] == 0 and row["variant"] == row["store"]
        assert row["ok"] and row["errors"] == 0, row
        assert row["ops"] > 0 and row["ops_per_s"] > 0 and row["seconds"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert len(row["per_client_ops"]) == row["clients"]
        assert row["cpu_us_per_op"] >= 0
        assert (row["server_cpu_us_per_op"] is None) == (row["store"] == "sqlite")

    # per cell: median and min-max over repeats per store; per pair the PostgreSQL / SQLite ratio
    keys = {f"{op} {m} x{n}" for op in bcs.OPS for m, n in configs} | {"ack processes x2"}
    assert set(r["cells"]) == keys and set(r["ratio_postgresql_over_sqlite_ops_per_s"]) == keys
    for key in keys:
        for store in STORES:
            cell = r["cells"][key][store]
            for metric in ("ops_per_s", "p50_ms", "p99_ms", "cpu_us_per_op"):
                _spread(cell[metric])
            assert cell["runs_with_errors"] == 0 and cell["failed_calls"] == 0
        _spread(r["ratio_postgresql_over_sqlite_ops_per_s"][key])
    tvp = r["threads_vs_processes"]
    assert set(tvp) == {f"ack {s} x2" for s in STORES}
    assert all(isinstance(v["threads_gil_bound"], bool) for v in tvp.values())

    # the fsync-on cell, the publisher pairs, the targets
    (fs,) = r["fsync_on"]
    assert fs["postgresql_fsync"] is True and fs["op"] == "ack" and fs["clients"] == 2
    assert fs["ops"] > 0
    assert {(x["store"], x["repeat"]) for x in r["publisher_rows"]} == {(s, 0) for s in STORES}
    for row in r["publisher_rows"]:
        assert row["ok"], row
        assert row["records"] == row["epochs"] * bcs.RECORDS and row["records_per_s"] > 0
    for store in STORES:
        _spread(r["publisher"]["records_per_s"][store])
    _spread(r["publisher"]["ratio_postgresql_over_sqlite"])
    ack = r["targets"]["ack_p99_postgresql"]
    assert ack["clients"] == 2 and set(ack["by_mode"]) == {"threads", "processes"}
    assert isinstance(ack["met"], bool) and isinstance(ack["with_fsync_on"]["met"], bool)
    pub = r["targets"]["publisher_postgresql_over_sqlite"]
    assert pub["target"] == bcs.TARGET_PUBLISHER_RATIO and isinstance(pub["met"], bool)
    assert pub["worst_pair"] == min(pub["ratios"])
