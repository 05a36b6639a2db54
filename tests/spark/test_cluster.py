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

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa  # noqa: E402

from cluster import (Driver, catalog_connections, command, committed_parquet,  # noqa: E402
                     executor_processes, open_paths)
from epochstream import Catalog, Publisher, Retention  # noqa: E402
from epochstream._demo import flights  # noqa: E402
from epochstream._demo.cluster import CatalogService  # noqa: E402
from epochstream.spark import SparkPublisherHost  # noqa: E402
from spark_support import Collector, check_whole  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.heavy]  # make test-heavy


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

