"""Fixtures of the Spark tests. Test modules here import the helpers of ``tests/`` (e.g.
``hypothesis_profiles``) and of this folder (:mod:`spark_support`) as top-level modules: both
folders are put on ``sys.path`` (pytest's default import mode would only add this one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

for _folder in (Path(__file__).parent, Path(__file__).parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@pytest.fixture
def quiet_spark(spark):
    """The session with 100-row Arrow batches (a day of ~900 rows is > 64 KiB: the sink really
    receives and stages rows before an injected fault) and no logging of the injected failures."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    spark.sparkContext.setLogLevel("OFF")
    try:
        yield spark
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.sparkContext.setLogLevel("ERROR")


# ---- a standalone Spark cluster on this machine (tests/spark/cluster.py)

_cluster: dict = {}  # "cluster": the running LocalCluster; "last": nodeid of its last user


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(session, config, items):
    users = [item.nodeid for item in items if "spark_cluster" in getattr(item, "fixturenames", ())]
    _cluster["last"] = users[-1] if users else None


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the cluster right after the last test that uses it (not at the end of the session:
    its three JVMs would otherwise idle through the rest of the suite)."""
    if item.nodeid == _cluster.get("last") and "cluster" in _cluster:
        _cluster.pop("cluster").stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory, request):
    """A standalone Spark cluster on this machine, shared by the tests that ask for it: a master
    and two workers (1 core, 1 GiB each), each its own JVM (tests/spark/cluster.py); returned as
    soon as the master is up (``wait_workers()`` waits for the workers, a ``Driver`` for its
    executors). Every
    process it started is stopped after its last user (or at the end of the session), also
    when a test fails; its directory (logs, executors' work directories) is removed unless a
    test failed."""
    pytest.importorskip("pyspark")
    from cluster import start_cluster

    root = tmp_path_factory.mktemp("spark-cluster")
    failed_before = request.session.testsfailed
    c = start_cluster(root, wait=False)  # a driver may start while the workers register
    _cluster["cluster"] = c
    try:
        yield c
    finally:
        _cluster.pop("cluster", None)
        c.stop(remove=False)
        if request.session.testsfailed == failed_before:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
