"""SparkPublisherHost over real sockets, without a JVM: batches are staged on its ingest
endpoints as a task would (the ingest codec over a DEALER), commits go through the stream
writer's ``commit``/``abort``, and a real Subscriber checks what is published."""

from __future__ import annotations

import datetime as dt

import msgpack
import pytest
import zmq

pytest.importorskip("pyspark")

from epochstream.catalog import Catalog  # noqa: E402
from epochstream.errors import PublisherAborted  # noqa: E402
from epochstream.spark import EpochstreamStreamWriter, IngestError, SparkPublisherHost  # noqa: E402
from epochstream.spark.ingest import COMMIT, Refusal, decode_reply  # noqa: E402
from epochstream.transport import Subscriber  # noqa: E402
from spark_support import TOPIC, Collector, commit_message, stage, table  # noqa: E402

D0, D1 = dt.date(2013, 1, 1), dt.date(2013, 1, 2)


def test_commit_is_idempotent(tmp_path):
    """A repeated COMMIT and the re-run of a committed epoch (new run id) publish nothing; a
    losing attempt's batches are discarded."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
        sub = Collector(cat)
        ep = host.ingest_endpoints[0]
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        assert stage(ep, "run-a", 0, 11, [table(3, D0), table(4, D0)]).batches == 2
        assert stage(ep, "run-a", 0, 12, [table(50, D0)]).batches == 1  # a losing attempt

        writer.commit([commit_message("run-a", 0, 11, 7)], 0)
        writer.commit([commit_message("run-a", 0, 11, 7)], 0)   # a repeated commit
        stage(ep, "run-b", 0, 21, [table(9, D0)])                # a rerun of epoch 0 after restart
        writer.commit([commit_message("run-b", 0, 21, 9)], 0)   # ... committed again
        assert stage(ep, "run-a", 1, 13, [table(5, D1)]).batches == 1
        writer.commit([commit_message("run-a", 1, 13, 5)], 1)
        writer.abort([None], 2)                                 # harmless
        stats = host.stats(0)
    sub.join()
    assert [(e, n) for e, n, *_ in sub.epochs] == [(0, 7), (1, 5)]
    assert stats.duplicates == 2 and stats.rows == 12 and stats.epochs == 2
    assert stats.discarded_batches >= 1  # the losing attempt's batch


def test_malformed_ingest_messages_get_errors(tmp_path):
    """Each malformed message gets an ERR reply and is counted; the host keeps serving."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(host.ingest_endpoints[0])
        for frames in ([b"DATA"], [b"NOPE", msgpack.packb({"req": "r1"})],
                       [b"COMMIT", b"\xc1not msgpack"], [b"COMMIT", msgpack.packb({"req": "r2"})],
                       [b"DATA", msgpack.packb(["r", "x", 0, 1, 2]), b"payload"]):
            s.send_multipart(frames)
            assert s.poll(5000), frames
            reply = decode_reply(s.recv_multipart(), COMMIT)
            assert isinstance(reply, Refusal) and reply.error
        s.close()
        # still serving: a proper COMMIT of an empty epoch works
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        writer.commit([None], 0)
        assert host.next_epoch() == 1 and host.stats(0).errors == 5
        assert not host.errors()


def test_exception_inside_the_host_aborts_its_publishers(tmp_path):
    """An exception leaving ``with SparkPublisherHost`` must not complete the open epoch: the
    subscriber gets PublisherAborted after the committed epoch 0, the catalog says aborted."""
    cat = Catalog(tmp_path / "cat")
    got = []
    with pytest.raises(RuntimeError, match="driver failed"):
        with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
            sub = Subscriber(TOPIC, catalog=cat, timeout=10)
            assert sub.wait_ready(10)
            ep = host.ingest_endpoints[0]
            writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
            stage(ep, "run-a", 0, 1, [table(3, D0)])
            writer.commit([commit_message("run-a", 0, 1, 3, batches=1)], 0)
            assert host.wait_epoch(0, 10)
            raise RuntimeError("driver failed")
    with pytest.raises(PublisherAborted):
        for epoch in sub.epochs(timeout=10):
            got.append(epoch.time)
    sub.close()
    assert got == [0]
    assert [p.state for p in cat.lookup(TOPIC).partition_info] == ["aborted"]


def test_commit_refused_when_staged_rows_are_gone(tmp_path):
    """A late ABORT(epoch) (e.g. from a stopped run) drops staged rows; a COMMIT naming an
    attempt whose rows are gone is refused and the partition does not advance, instead of
    completing the epoch without them. The batch's re-run (a new attempt) then commits."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat) as host:
        sub = Collector(cat)
        ep = host.ingest_endpoints[0]
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path,
                                          "commitTimeout": "5"})
        assert stage(ep, "run-a", 0, 1, [table(7)]).rows == 7
        writer.abort([None], 0)                      # a late ABORT of epoch 0 drops them
        with pytest.raises(IngestError, match="staged rows differ"):
            writer.commit([commit_message("run-a", 0, 1, 7, batches=1)], 0)
        assert host.next_epoch() == 0 and sub.delivered() == []
        assert stage(ep, "run-b", 0, 2, [table(7)]).rows == 7  # the re-run after restart
        writer.commit([commit_message("run-b", 0, 2, 7, batches=1)], 0)
        assert sub.wait_for(0, 30)
        stats = host.stats(0)
    sub.join()
    assert [(e, n) for e, n, *_ in sub.epochs] == [(0, 7)]
    assert stats.rows == 7 and stats.errors == 1 and stats.aborts == 1


def test_frontier_and_data_upper_are_the_publishers(tmp_path):
    """The host's next epoch is its publisher's lower frontier, its data upper bound the
    publisher's upper frontier; after close both keep their last values."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        assert host.next_epoch() == 0 and host.data_upper() == -1
        assert [s.next_epoch for s in host.stats()] == [0, 0]
        ep = host.ingest_endpoints[1]
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        stage(ep, "run-a", 3, 1, [table(2, D0)])
        msg = commit_message("run-a", 3, 1, 2)
        msg.partition = msg.topic_partition = 1
        writer.commit([msg], 3)  # partition 0 commits epoch 3 with no rows
        assert host.next_epoch() == 4 and host.data_upper() == 3
        assert [s.data_upper for s in host.stats()] == [-1, 3]
        assert sub.wait_for(3, 30) and sub.sub.lower == (4,)  # what the publishers announced
    sub.join()
    assert [(e, n) for e, n, *_ in sub.epochs] == [(3, 2)]
    assert host.next_epoch() == 4 and [s.next_epoch for s in host.stats()] == [4, 4]
    assert host.data_upper() == 3


def test_staging_bound_refuses_batches_and_frees_on_commit(tmp_path):
    """Past ``max_staged_bytes`` a batch is refused (its FLUSH fails: the task fails); a
    commit frees what was staged."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat, max_staged_bytes=4000) as host:
        ep = host.ingest_endpoints[0]
        writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": host.catalog_path})
        assert stage(ep, "run-a", 0, 1, [table(10)]).batches == 1
        one = host.staged_bytes()
        assert 0 < one <= 4000
        with pytest.raises(IngestError, match="staging full"):
            stage(ep, "run-a", 0, 2, [table(10)] * (4000 // one + 1))
        assert host.staged_bytes() <= 4000 and host.stats(0).errors >= 1
        writer.commit([commit_message("run-a", 0, 1, 10)], 0)
        assert host.staged_bytes() == 0 and host.stats(0).rows == 10


def test_a_held_partition_fails_start_without_hanging(tmp_path):
    """A second host for a topic whose partitions are live is refused at ``start()``, at once
    (its ingest socket is closed, so closing the host does not wait for it forever)."""
    cat = Catalog(tmp_path / "cat")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat):
        second = SparkPublisherHost(TOPIC, partitions=1, catalog=cat)
        with pytest.raises(IngestError, match="failed to start"):
            second.start()
        assert second.errors()
