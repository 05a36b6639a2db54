"""examples/flights_pipeline.py: Spark publishes one epoch per day of real flights, a second Spark
query reads the topic with the epochstream source and writes per-day, per-carrier aggregates to
Parquet, a subscriber attached mid-stream prints them; the reading query is killed (its whole
process group, SIGKILL) after writing a batch's Parquet and before Spark committed the batch,
and restarted on the same checkpoint.

The example runs as a program (a process of its own, with its reading query in another one),
with the catalog as a ``tcp://`` URL (``epochstream catalog serve`` on a fresh database) and
local Spark (the cluster itself is covered by test_cluster.py). Its Parquet output is checked
here against pandas computed independently from the same flights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow.parquet as pq  # noqa: E402

from epochstream._demo import flights  # noqa: E402
from epochstream._demo.cluster import CatalogService  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.heavy]  # make test-heavy

EXAMPLE = Path(__file__).parents[2] / "examples" / "flights_pipeline.py"
DAYS = 5
CRASH_BATCH = 1


def _pandas_aggregates(days: int) -> dict[tuple[int, str], tuple[int, float]]:
    df = flights.load_flights(days)
    number = {d: i for i, d in enumerate(sorted(df["dep_date"].unique()))}
    out = {}
    for (date, carrier), g in df.groupby(["dep_date", "carrier"]):
        out[(number[date], str(carrier))] = (len(g), float(g["dep_delay"].mean()))
    return out


def test_pipeline_aggregates_exactly_once_across_a_killed_reader(tmp_path):
    home = tmp_path / "home"
    with CatalogService(tmp_path / "db" / "catalog.sqlite") as service:
        url = f"{service.url}?lease=3"  # the killed reader's durable subscription frees sooner
        env = {k: v for k, v in os.environ.items() if k != "EPOCHSTREAM_CATALOG"}
        env.update({"EPOCHSTREAM_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"})
        out = tmp_path / "out"
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--days", str(DAYS), "--catalog", url, "--out",
             str(out), "--epochs-per-batch", "2", "--crash-reader-at", str(CRASH_BATCH),
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=tmp_path, env=env, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:  # SIGTERM first: the example stops its reader processes
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    assert last.startswith("{"), f"no summary (exit status {proc.returncode}):\n{stdout[-5000:]}"
    summary = json.loads(last)

    # the reading query was killed inside batch CRASH_BATCH, after its Parquet was written
    first, second = summary["readers"]
    assert f"batch {CRASH_BATCH}: written" in first and f"batch {CRASH_BATCH}: holding" in first
    assert summary["crash"] == {"offsets_logged": True, "committed": False}
    assert second[0] == "standby"                         # a new driver, started meanwhile,
    assert second[1].startswith(f"batch {CRASH_BATCH}: epochs")   # re-ran that batch
    assert second[-1] == "done"

    # the Parquet aggregates (checked here, independently of the example's own checks): every
    # (day, carrier) exactly once, equal to pandas
    table = pq.read_table(out / "aggregates").to_pandas()
    keys = list(zip(table["epoch"].astype(int), table["carrier"]))
    assert len(keys) == len(set(keys)), "an aggregate was written twice"
    got = {k: (int(n), float(m)) for k, n, m in zip(keys, table["flights"],
                                                     table["mean_dep_delay"])}
    want = _pandas_aggregates(DAYS)
    assert got.keys() == want.keys()
    for k, (n, mean) in want.items():
        assert got[k][0] == n, k
        assert got[k][1] == pytest.approx(mean, rel=1e-12, abs=1e-12), k
    dates = sorted(flights.load_flights(DAYS)["dep_date"].unique())
    assert {int(e): d for e, d in zip(table["epoch"], table["dep_date"])} == \
        dict(enumerate(dates))

    # the subscriber joined after epoch DAYS // 2 - 1 and received every later epoch, whole
    assert summary["subscriber_epochs"] == list(range(DAYS // 2, DAYS))
    assert summary["subscriber_matches"] and summary["ok"]
    lines = [line for line in stdout.splitlines() if "subscriber: epoch" in line]
    assert len(lines) == DAYS - DAYS // 2
    assert proc.returncode == 0 and "all checks passed" in stdout, stdout[-5000:]
