"""The Spark host with retention: committed epochs are logged, and COMMIT idempotency survives a
restart of the host (issue 11)."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")

from epochstream import History, Retention, Subscriber  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import EpochstreamStreamWriter, SparkPublisherHost  # noqa: E402
from spark_support import TOPIC, commit_message, stage, table  # noqa: E402

D0, D1, D2 = dt.date(2013, 1, 1), dt.date(2013, 1, 2), dt.date(2013, 1, 3)


def _commit(host, run, epoch, attempt, n, date):
    ep = host.ingest_endpoints[0]
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
    stage(ep, run, epoch, attempt, [table(n, date)])
    writer.commit([commit_message(run, epoch, attempt, n)], epoch)


def test_commit_of_an_epoch_committed_before_a_host_restart_is_a_duplicate(tmp_path):
    """Epochs 0 and 1 are committed, the host closes; a new host on the same catalog resumes at
    epoch 2: a re-run of epoch 1 (a query restarted from a checkpoint that had not recorded its
    commit) publishes nothing, epoch 2 is published, and the log holds 0, 1, 2 exactly once."""
    cat = Catalog(tmp_path / "cat")
    retention = Retention()
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat, retention=retention) as host:
        _commit(host, "run-a", 0, 1, 3, D0)
        _commit(host, "run-a", 1, 2, 4, D1)
        assert host.next_epoch() == 2
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat, retention=retention) as host:
        assert host.next_epoch() == 2  # before: 0 (the host forgot), and epoch 1 was published twice
        _commit(host, "run-b", 1, 3, 9, D1)   # the re-run of epoch 1: a duplicate
        _commit(host, "run-b", 2, 4, 5, D2)
        stats = host.stats(0)
    assert stats.duplicates == 1 and stats.epochs == 1 and stats.rows == 5
    epochs = [(e.time, e.records.num_rows) for e in History(TOPIC, catalog=cat).epochs()]
    assert epochs == [(0, 3), (1, 4), (2, 5)]
    with Subscriber(TOPIC, cat, start="earliest", timeout=5) as sub:
        assert [(e.time, e.records.num_rows) for e in sub.epochs(timeout=5)] == epochs
