"""The Spark sink and source on a standalone Spark cluster on this machine (a master and two
workers, each its own JVM: the ``spark_cluster`` fixture, tests/spark/cluster.py), with only a
``tcp://`` catalog URL given to the query.

The catalog is ``epochstream catalog serve`` (a process) on a database in a directory only this
module knows; the Spark driver (a process of its own, on the cluster) gets the URL in its
commands and nothing else (no ``EPOCHSTREAM_CATALOG``, a fresh working directory), and the
executors get what Spark ships them: the query's options. For the source, the executors and
the driver read the epochs through the publishers' endpoints
(``EPOCHSTREAM_HISTORY_SOURCE=publisher``), as they would on other machines than the one
holding the epoch logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa  # noqa: E402

from cluster import (Driver, catalog_connections, command, committed_parquet,  # noqa: E402
                     executor_processes, open_paths)
from epochstream import Catalog, Publisher, Retention, flights  # noqa: E402
from epochstream._demo.cluster import CatalogService  # noqa: E402
from epochstream.spark import SparkPublisherHost  # noqa: E402
from spark_support import Collector, check_whole  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    """The directory of the catalog's database: known to this module and the service only."""
    return tmp_path_factory.mktemp("catalog-db")


@pytest.fixture(scope="module")
def service(secret):
    """``epochstream catalog serve --db <secret>/catalog.sqlite --bind tcp://127.0.0.1:*``."""
    with CatalogService(secret / "catalog.sqlite", log=secret.parent / "catalog-serve.log") as s:
        yield s


@pytest.fixture(scope="module")
def driver(spark_cluster, tmp_path_factory):
    """One Spark driver on the cluster for this module's queries (two executors, one per
    worker); history is read through the publishers."""
    cwd = tmp_path_factory.mktemp("driver")
    env = {"EPOCHSTREAM_HISTORY_SOURCE": "publisher"}
    d = Driver(spark_cluster.master_url, cwd, cores=2, env=env, executor_env=env)
    try:
        yield d
    finally:
        d.close()


def _no_local_catalog(cluster, driver: Driver) -> None:
    """Nothing fell back to a catalog of its own: no ``.epochstream`` directory was created in
    the executors' or the driver's working directories."""
    dirs = [*cluster.executor_dirs(), driver.log.parent]
    made = [p for d in dirs for p in d.rglob(".epochstream")]
    assert made == []


def test_sink_on_the_cluster_with_only_a_catalog_url(spark_cluster, service, secret, driver,
                                                     tmp_path):
    """Three days of flights, one epoch per day, written by a query on the cluster through a
    SparkPublisherHost whose catalog is the URL; a plain Subscriber on the URL receives every
    epoch whole (pandas' row count, one day each). The tasks ran on both executors, which
    reached the catalog over TCP and have nothing of the catalog's directory open."""
    files = flights.day_files(3)
    cat = Catalog(service.url)
    with SparkPublisherHost("flights", partitions=2, catalog=cat,
                            schema=flights.spark_schema_ddl()) as host:
        collector = Collector(cat)
        answer = driver.call("sink", topic="flights", catalog=service.url,
                             schema=flights.spark_schema_ddl(), input=files.directory,
                             files_per_day=files.files_per_day,
                             checkpoint=str(tmp_path / "checkpoint"))
        assert answer["batches"] == [0, 1, 2]
        assert host.wait_epoch(2, 30)
        stats = host.stats()
        assert sum(s.rows for s in stats) == files.rows and all(s.rows for s in stats)
        procs = executor_processes(spark_cluster)
        app_dirs = [d for d in spark_cluster.executor_dirs()
                    if d.parent.name == driver.ready["app"]]
        assert {d.parents[1].name for d in app_dirs} == {"worker-0", "worker-1"}, app_dirs
        pythons = [p for p in procs if "python" in command(p)]
        assert pythons, "no Python worker runs under the executors"
        talking = catalog_connections(pythons, service.url)
        assert talking, "no executor's Python worker is connected to the catalog service"
        assert not [p for p in open_paths(procs) if p.startswith(str(secret))]
    collector.join()
    check_whole(collector.epochs, files)
    _no_local_catalog(spark_cluster, driver)


def test_source_on_the_cluster_with_only_a_catalog_url(spark_cluster, service, driver, tmp_path):
    """Four days of flights published by two live Publishers (retention on, catalog = the URL),
    a row id per flight; a query on the cluster reads the topic two epochs per batch through
    the URL and writes Parquet: every flight exactly once, with its epoch and partition, and the
    epochs' bytes came from the publishers' endpoints."""
    df = flights.load_flights(4).reset_index(drop=True)
    df["row"] = range(len(df))
    days = sorted(df["dep_date"].unique())
    cat = Catalog(service.url)
    pubs = [Publisher("trips", catalog=cat, codec="arrow", partition=i, partitions=2,
                      retention=Retention(dir=tmp_path / "logs")) for i in range(2)]
    expected: dict[int, tuple[int, int]] = {}
    out = tmp_path / "out"
    try:
        for t, day in enumerate(days):
            part = df[df["dep_date"] == day]
            half = len(part) // 2
            for i, rows in enumerate((part.iloc[:half], part.iloc[half:])):
                pubs[i].send(t, pa.Table.from_pandas(rows, preserve_index=False))
                expected.update((int(r), (t, i)) for r in rows["row"])
            for pub in pubs:
                pub.advance_to(t + 1)
        for pub in pubs:
            pub.flush()
        answer = driver.call("source", topic="trips", catalog=service.url, max_epochs=2,
                             output=str(out), checkpoint=str(tmp_path / "checkpoint"))
        assert answer["batches"] == [0, 1]
        assert answer["rows"] == len(df)
        served = sum(p.stats["history_reads"] for p in pubs)
        assert served >= 2, served               # both partitions' epochs, over the endpoints
    finally:
        for pub in pubs:
            pub.close()
    table = committed_parquet(out).to_pandas()
    assert len(table) == len(df) and table["row"].is_unique
    got = {int(r): (int(t), int(p)) for r, t, p in
           zip(table["row"], table["_epoch"], table["_partition"])}
    assert got == expected
    assert table.groupby("_epoch").size().to_dict() == \
        {t: int((df["dep_date"] == day).sum()) for t, day in enumerate(days)}
    _no_local_catalog(spark_cluster, driver)


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
