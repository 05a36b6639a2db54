"""The Spark driver killed on the standalone cluster (tests/spark/cluster.py) with a PostgreSQL
catalog, and restarted on the same checkpoint. A module of its own: test_cluster.py's module
driver holds both of the cluster's cores until that module ends, and this test needs them for
drivers of its own."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyspark")

from cluster import Driver  # noqa: E402
from epochstream import Catalog  # noqa: E402
from epochstream._demo import flights  # noqa: E402
from epochstream.spark import SparkPublisherHost  # noqa: E402
from spark_support import Collector, check_whole  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.heavy]  # make test-heavy


def test_driver_killed_and_restarted_on_the_cluster_with_a_postgresql_catalog(
        spark_cluster, pg_url, tmp_path_factory, tmp_path):
    """A sink query on the cluster through a PostgreSQL catalog (the host, the drivers and the
    executors all reach it by URL). Batch 2's first task hands over some rows and hangs; the
    whole driver (its Python process, its JVM) is SIGKILLed, the cluster kills its executors.
    The host keeps serving while no driver runs: the subscriber keeps getting heartbeats, its
    lower frontier stays 2 (epochs 0-1 complete), the killed run's rows stay staged. A new
    driver on the same checkpoint re-runs batch 2 (a new run id) and batch 3: each of the four
    days arrives exactly once, whole (exactly-once across the driver's death), and the killed
    run's staged rows are discarded, never published."""
    files = flights.day_files(4, files_per_day=1)
    cat = Catalog(pg_url)
    ck, held = tmp_path / "checkpoint", tmp_path / "held"
    query = dict(topic="flights", catalog=pg_url, schema=flights.spark_schema_ddl(),
                 input=files.directory, files_per_day=files.files_per_day, checkpoint=str(ck))
    with SparkPublisherHost("flights", partitions=2, catalog=cat,
                            schema=flights.spark_schema_ddl()) as host:
        collector = Collector(cat, timeout=3.0)
        first = Driver(spark_cluster.master_url, tmp_path_factory.mktemp("driver-1"), cores=2)
        try:
            first.send("sink_held", hold_batch=2, hold_file=str(held), **query)
            deadline = time.monotonic() + 120
            while not held.exists():
                assert time.monotonic() < deadline and first.proc.poll() is None, first.tail()
                time.sleep(0.1)
            assert host.wait_epoch(1, 30) and host.next_epoch() == 2
            deadline = time.monotonic() + 30
            while host.staged_bytes() == 0:  # the held task's rows reached the host
                assert time.monotonic() < deadline, "no rows of batch 2 were staged"
                time.sleep(0.05)
            first.kill()
        finally:
            first.close()
        heard = collector.sub.stats["messages"]
        down = time.monotonic()
        second = Driver(spark_cluster.master_url, tmp_path_factory.mktemp("driver-2"), cores=2)
        try:
            # no driver ran for the new one's start-up (longer than the subscriber's 3 s
            # liveness timeout): the host kept serving, nothing of batch 2 was published
            assert time.monotonic() - down > 3.0
            assert collector.error is None and collector.thread.is_alive(), collector.error
            assert collector.sub.stats["messages"] > heard, "no heartbeats while down"
            assert collector.sub.lower == (2,) and collector.delivered() == [0, 1]
            assert host.staged_bytes() > 0
            assert second.call("sink", **query)["batches"] == [2, 3]  # resumed, not from 0
        finally:
            second.close()
        assert host.wait_epoch(3, 30)
        stats = host.stats()
        left = host.staged_bytes()
    collector.join()
    check_whole(collector.epochs, files)
    assert sum(s.rows for s in stats) == files.rows and left == 0
    assert all(s.discarded_batches >= 1 for s in stats[:1]), stats  # the killed run's rows
    assert all(x.duplicates == 0 for x in stats)
