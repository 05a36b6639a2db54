"""Event-time commits on a real host, without the JVM: tasks' DATA (each epoch's rows of a
batch, tagged with the epoch) staged on the host's ingest endpoints as the sink's tasks send
them, the real driver-side commit (``EpochstreamStreamWriter.commit``), a real Subscriber.
Hypothesis chooses how rows fall into batches, Spark partitions and attempts, which batches are
re-run after a commit (a driver restart from its checkpoint), and late rows."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from epochstream.catalog import Catalog
from epochstream.spark import EpochstreamCommitMessage, EpochstreamStreamWriter, SparkPublisherHost
from epochstream.spark.client import client, drop_client, ingest_targets
from epochstream.spark.event_time import EventTimeError
from epochstream.spark.ingest import Data, Flush, IngestError
from epochstream.transport import Subscriber
from epochstream.wire import codec

TOPIC = "events"
DAY_US = 86_400_000_000
_ids = itertools.count()


def rows_table(xs: list[int], epochs: list) -> pa.RecordBatch:
    if epochs and isinstance(epochs[0], tuple):  # a product order's epochs: x alone
        return pa.record_batch({"x": pa.array(xs, pa.int64())})
    return pa.record_batch({"x": pa.array(xs, pa.int64()), "day": pa.array(epochs, pa.int64())})


class Task:
    """One task attempt of a batch on Spark partition ``part``: sends each epoch's rows as the
    sink's ``write()`` does, returns the commit message it would report."""

    def __init__(self, target, batch: int, part: int, event_max: int | None = None):
        # target: a host, or its partitions' ingest endpoints
        self.endpoints = (target.ingest_endpoints if isinstance(target, SparkPublisherHost)
                          else list(target))
        self.batch, self.part = batch, part
        self.run, self.attempt = "run-a", next(_ids)
        self.event_max = event_max

    def write(self, by_epoch: dict[int, list[int]]) -> EpochstreamCommitMessage:
        targets = self.endpoints
        tp = self.part % len(targets)
        endpoint = targets[tp]
        assert endpoint is not None
        c = client(endpoint)
        arrow = codec("arrow")
        rows = batches = 0
        try:
            for epoch in sorted(by_epoch):
                xs = by_epoch[epoch]
                c.send(Data(self.run, self.batch, self.part, self.attempt, len(xs),
                            arrow.encode(rows_table(xs, [epoch] * len(xs))), epoch), 5)
                rows, batches = rows + len(xs), batches + 1
            if batches:
                c.request(Flush(None, self.run, self.batch, self.attempt, batches, rows, True), 5)
        except BaseException:
            drop_client(endpoint)
            raise
        times = sorted(by_epoch)
        return EpochstreamCommitMessage(
            query_id="q", run_id=self.run, epoch=self.batch, partition=self.part,
            topic_partition=tp, task_attempt_id=self.attempt, attempt_number=0, rows=rows,
            batches=batches, epoch_lo=times[0] if times else None,
            epoch_hi=times[-1] if times else None, event_max=self.event_max)


def collect(cat) -> tuple[Subscriber, dict[int, list[int]]]:
    sub = Subscriber(TOPIC, catalog=cat, wait=10.0, timeout=10.0)
    assert sub.wait_ready(20)
    return sub, {}


def drain(sub: Subscriber, got: dict[int, list[int]]) -> None:
    for e in sub.epochs(timeout=30):
        assert e.time not in got, f"epoch {e.time} delivered twice"
        got[e.time] = sorted(e.records.column("x").to_pylist()) if len(e) else []


@st.composite
def batch_plans(draw):
    """Epochs 0..n-1 cut into batches (an epoch never straddles two), each epoch's rows dealt
    to two Spark partitions; some batches re-run after their commit (a restarted query)."""
    n = draw(st.integers(1, 12))
    sizes = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4))) if n > 1 else []
    bounds = [0, *[c for c in cuts if c < n], n]
    x = itertools.count()
    batches = []
    for lo, hi in zip(bounds, bounds[1:]):
        parts: list[dict[int, list[int]]] = [{}, {}]
        for epoch in range(lo, hi):
            for _ in range(sizes[epoch]):
                parts[draw(st.integers(0, 1))].setdefault(epoch, []).append(next(x))
        batches.append((parts, draw(st.booleans())))
    return n, batches


@pytest.mark.spark
@settings(max_examples=examples(4), deadline=None)
@given(plan=batch_plans())
def test_batch_policy_on_a_host_every_epoch_once_and_whole(tmp_path_factory, plan):
    n, batches = plan
    cat = Catalog(tmp_path_factory.mktemp("cat"))
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": str(cat.path),
                                      "epochColumn": "day"})
    want: dict[int, list[int]] = {}
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub, got = collect(cat)
        for b, (parts, rerun) in enumerate(batches):
            for _ in range(2 if rerun else 1):  # a re-run: the same rows, new attempts
                msgs = [Task(host, b, p).write(parts[p]) for p in range(2)]
                writer.commit(msgs, b)
            for p in parts:
                for epoch, xs in p.items():
                    want.setdefault(epoch, []).extend(xs)
            top = max((e for p in parts for e in p), default=None)
            if top is not None:
                assert host.next_epoch() == top + 1
        stats = host.stats()
    drain(sub, got)
    sub.close()
    # every epoch up to the last one with rows completes; empty ones deliver nothing
    assert {e: sorted(xs) for e, xs in want.items()} == {e: xs for e, xs in got.items() if xs}
    assert sum(s.rows for s in stats) == sum(len(xs) for xs in want.values())
    assert sum(s.late_rows for s in stats) == 0


@pytest.mark.spark
def test_batch_policy_refuses_a_row_of_a_complete_epoch_and_publishes_nothing_of_it(tmp_path):
    cat = Catalog(tmp_path / "cat")
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": str(cat.path),
                                      "epochColumn": "day"})
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub, got = collect(cat)
        writer.commit([Task(host, 0, 0).write({0: [1, 2], 1: [3]}),
                       Task(host, 0, 1).write({1: [4]})], 0)
        assert host.next_epoch() == 2
        bad = [Task(host, 1, 0).write({2: [5]}), Task(host, 1, 1).write({1: [6], 3: [7]})]
        with pytest.raises(IngestError, match=r"batch 1 has rows of epoch 1, complete"):
            writer.commit(bad, 1)
        assert host.next_epoch() == 2 and host.data_upper() == 1  # nothing of batch 1
        good = [Task(host, 1, 0).write({2: [5]}), Task(host, 1, 1).write({3: [7]})]
        writer.commit(good, 1)  # the batch, fixed, commits
    drain(sub, got)
    sub.close()
    assert got == {0: [1, 2], 1: [3, 4], 2: [5], 3: [7]}


@pytest.mark.spark
def test_watermark_policy_completes_by_the_watermark_and_drops_late_rows(tmp_path):
    """Days as epochs, Spark's watermark delay 1 h: batch 0 (events up to day 2 + 6 h)
    completes days 0-1; batch 1 brings a late row of day 0 (dropped, counted), more rows of day
    2 (open: appended) and day 3; batch 2 moves the watermark past day 3."""
    cat = Catalog(tmp_path / "cat")
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": str(cat.path),
                                      "complete": "watermark", "eventTime": "ts",
                                      "epochLength": "1 day"})
    hour = 3_600_000_000
    assert writer.event is not None
    writer.event = dataclasses.replace(writer.event, delay_us=hour)  # what the schema says
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub, got = collect(cat)
        writer.commit([Task(host, 0, 0, 2 * DAY_US + 6 * hour).write({0: [1], 2: [2]}),
                       Task(host, 0, 1, DAY_US).write({1: [3]})], 0)
        assert host.next_epoch() == 2  # (2 d 6 h - 1 h) // 1 d
        writer.commit([Task(host, 1, 0, 3 * DAY_US + 2 * hour).write({0: [4], 2: [5], 3: [6]}),
                       Task(host, 1, 1, None).write({})], 1)
        assert host.next_epoch() == 3  # (3 d 2 h - 1 h) // 1 d
        writer.commit([Task(host, 1, 0, 3 * DAY_US + 2 * hour).write({0: [4], 2: [5], 3: [6]}),
                       Task(host, 1, 1, None).write({})], 1)  # batch 1 re-run: a duplicate
        writer.commit([Task(host, 2, 1, 5 * DAY_US).write({4: [7]}),
                       Task(host, 2, 0, None).write({})], 2)
        assert host.next_epoch() == 4
        stats = host.stats()
        assert sum(s.late_rows for s in stats) == 1
        assert sum(s.open_epochs for s in stats) == 1  # day 4, until the host closes
    drain(sub, got)
    sub.close()
    assert got == {0: [1], 1: [3], 2: [2, 5], 3: [6], 4: [7]}


def test_options_are_checked_when_the_writer_is_built():
    with pytest.raises(EventTimeError, match="epochLength"):
        EpochstreamStreamWriter({"topic": TOPIC, "complete": "watermark", "eventTime": "ts"})
    with pytest.raises(EventTimeError, match='"batch" or "watermark"'):
        EpochstreamStreamWriter({"topic": TOPIC, "epochColumn": "d", "complete": "eventually"})


@pytest.mark.spark
def test_batch_policy_rerun_after_a_host_restart_is_a_duplicate(tmp_path):
    """Batch 0 (epochs 0-2) commits, the host dies (abort: its logs unfinished); a new host on
    the same catalog and epoch log resumes both partitions at epoch 3, knowing no batch ids: the re-run of batch 0 (a query
    restarted from a checkpoint that had not recorded its commit) has only complete epochs and
    is taken as a duplicate; a batch mixing a complete epoch with new ones is refused; batch 1
    is published; the log holds 0-4 exactly once."""
    from epochstream import History, Retention

    cat = Catalog(tmp_path / "cat")
    retention = Retention()
    opts = {"topic": TOPIC, "catalog": str(cat.path), "epochColumn": "day"}
    host = SparkPublisherHost(TOPIC, partitions=2, catalog=cat, retention=retention).start()
    EpochstreamStreamWriter(opts).commit(
        [Task(host, 0, 0).write({0: [1], 2: [2]}), Task(host, 0, 1).write({1: [3]})], 0)
    assert host.next_epoch() == 3
    host.abort("crash")
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat, retention=retention) as host:
        assert [s.next_epoch for s in host.stats()] == [3, 3]
        writer = EpochstreamStreamWriter(opts)
        writer.commit([Task(host, 0, 0).write({0: [1], 2: [2]}),
                       Task(host, 0, 1).write({1: [3]})], 0)  # the re-run: a duplicate
        with pytest.raises(IngestError, match="batch 1 has rows of epoch 2"):
            writer.commit([Task(host, 1, 0).write({2: [9], 3: [4]}),
                           Task(host, 1, 1).write({})], 1)
        writer.commit([Task(host, 1, 0).write({3: [4]}), Task(host, 1, 1).write({4: [5]})], 1)
        assert host.next_epoch() == 5
    epochs = {e.time: sorted(e.records.column("x").to_pylist())
              for e in History(TOPIC, catalog=cat).epochs()}
    assert epochs == {0: [1], 1: [3], 2: [2], 3: [4], 4: [5]}


@pytest.mark.spark
def test_watermark_policy_host_restart_never_completes_an_open_epoch_partially(tmp_path):
    """Batch 0 sends rows of days 0 and 1; the watermark completes day 0, day 1 stays open. The
    host dies (abort: as a crash, its publishers never complete day 1). A new host on the same
    catalog and epoch log: a later batch brings more rows of day 1 and moves the watermark past
    it. Day 1 must never be delivered with only the later rows: either whole (impossible: the
    first rows died with the host) or not at all."""
    from epochstream import History, Retention

    hour = 3_600_000_000
    cat = Catalog(tmp_path / "cat")
    retention = Retention()
    opts = {"topic": TOPIC, "catalog": str(cat.path), "complete": "watermark",
            "eventTime": "ts", "epochLength": "1 day"}

    def writer():
        w = EpochstreamStreamWriter(opts)
        assert w.event is not None
        w.event = dataclasses.replace(w.event, delay_us=hour)
        return w

    host = SparkPublisherHost(TOPIC, partitions=1, catalog=cat, retention=retention).start()
    writer().commit([Task(host, 0, 0, DAY_US + 6 * hour).write({0: [1], 1: [2]})], 0)
    assert host.next_epoch() == 1
    host.abort("crash")
    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat, retention=retention) as host:
        try:
            writer().commit([Task(host, 1, 0, 3 * DAY_US).write({1: [3], 2: [4]})], 1)
        except IngestError:
            pass  # refusing is fine; completing day 1 with [3] alone is not
    epochs = {e.time: sorted(e.records.column("x").to_pylist())
              for e in History(TOPIC, catalog=cat).epochs()}
    assert epochs.get(0) == [1]
    assert epochs.get(1) in (None, [2, 3]), epochs


@pytest.mark.spark
@pytest.mark.slow
def test_batch_policy_host_killed_mid_commit_rerun_republishes_what_did_not_complete(tmp_path):
    """The host in its own process (tests/spark/host_history_peer.py). Batch 1 (epochs 2-3) is
    committed: partition 0 completes it (indexed in its epoch log), partition 1 has published
    its rows but not advanced (a pause point holds it there) when the host is killed -9.
    Spark's commit failed, so it re-runs batch 1 against a new host on the same catalog and
    epoch log: partition 0 (resumed at 4) takes it as a duplicate, partition 1 (resumed at 2)
    publishes its rows again, to completion. Every epoch is in the log once and whole."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from epochstream import History, Retention

    peer = Path(__file__).with_name("host_history_peer.py")
    cat_dir, ret = tmp_path / "cat", tmp_path / "ret"
    cat = Catalog(cat_dir)
    opts = {"topic": TOPIC, "catalog": str(cat.path), "epochColumn": "day",
            "commitTimeout": "5"}
    work = tmp_path / "host-1"
    with open(tmp_path / "host-1.log", "w") as out:
        proc = subprocess.Popen([sys.executable, str(peer), TOPIC, str(cat_dir), str(ret), "2",
                                 str(work), "pause", "1:2:data"], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (work / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "host-1.log").read_text()
            time.sleep(0.05)
        endpoints = [t.endpoint for t in ingest_targets(str(cat.path), TOPIC)]
        EpochstreamStreamWriter(opts).commit(
            [Task(endpoints, 0, 0).write({0: [1]}), Task(endpoints, 0, 1).write({1: [2]})], 0)
        batch1 = {0: {2: [3], 3: [4]}, 1: {2: [5], 3: [6]}}
        msgs = [Task(endpoints, 1, p).write(batch1[p]) for p in range(2)]
        failed: list[BaseException] = []

        def commit():
            try:
                EpochstreamStreamWriter(opts).commit(msgs, 1)
            except BaseException as e:  # noqa: BLE001 - the commit dies with the host
                failed.append(e)

        t = threading.Thread(target=commit, daemon=True)
        t.start()
        while not ((work / "hit").exists() and list(cat.history_state(TOPIC, 0).lower) == [4]):
            assert time.monotonic() < deadline, ((work / "hit").exists(),
                                                 cat.history_state(TOPIC, 0),
                                                 (tmp_path / "host-1.log").read_text())
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        t.join(30)
        assert failed, "the commit of batch 1 did not fail with its host"
    finally:
        if proc.poll() is None:
            proc.kill()
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat,
                            retention=Retention(dir=ret)) as host:
        assert [s.next_epoch for s in host.stats()] == [4, 2]
        endpoints = [e for e in host.ingest_endpoints if e is not None]
        EpochstreamStreamWriter(opts).commit([Task(endpoints, 1, p).write(batch1[p])
                                              for p in range(2)], 1)  # the re-run
        assert host.next_epoch() == 4
    epochs = {e.time: sorted(e.records.column("x").to_pylist())
              for e in History(TOPIC, catalog=cat).epochs()}
    assert epochs == {0: [1], 1: [2], 2: [3, 5], 3: [4, 6]}


@st.composite
def watermark_plans(draw):
    """Batches of rows with event times (hours into day 0..5), each row on one of two Spark
    partitions, and a watermark delay of 0-30 hours."""
    x = itertools.count()
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        rows = draw(st.lists(st.tuples(st.integers(0, 6 * 24 - 1), st.integers(0, 1)),
                             max_size=6))
        batches.append([(h, p, next(x)) for h, p in rows])
    return batches, draw(st.integers(0, 30))


@pytest.mark.spark
@settings(max_examples=examples(4), deadline=None)
@given(plan=watermark_plans())
def test_watermark_policy_on_a_host_against_a_model(tmp_path_factory, plan):
    """Whatever the rows' event times, batches and partitions: the delivered epochs are the
    rows grouped by day, minus exactly the rows whose day was complete when their batch
    committed (Spark's watermark so far: the greatest event time of the batches before, minus
    the delay), each day delivered once, whole."""
    batches, delay_h = plan
    hour = 3_600_000_000
    cat = Catalog(tmp_path_factory.mktemp("cat"))
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": str(cat.path),
                                      "complete": "watermark", "eventTime": "ts",
                                      "epochLength": "1 day"})
    assert writer.event is not None
    writer.event = dataclasses.replace(writer.event, delay_us=delay_h * hour)
    want: dict[int, list[int]] = {}
    late = 0
    frontier, top = 0, None
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub, got = collect(cat)
        for b, rows in enumerate(batches):
            msgs = []
            for p in range(2):
                mine = [(h, x) for h, q, x in rows if q == p]
                by_day: dict[int, list[int]] = {}
                for h, x in mine:
                    by_day.setdefault(h // 24, []).append(x)
                msgs.append(Task(host, b, p, max((h * hour for h, _ in mine), default=None))
                            .write(by_day))
            writer.commit(msgs, b)
            for h, _, x in rows:  # the model
                if h // 24 < frontier:
                    late += 1
                else:
                    want.setdefault(h // 24, []).append(x)
            if rows:
                top = max([h * hour for h, _, _ in rows] + ([top] if top is not None else []))
            if top is not None:
                frontier = max(frontier, (top - delay_h * hour) // (24 * hour))
            assert host.next_epoch() == frontier
        stats = host.stats()
    drain(sub, got)
    sub.close()
    assert {e: xs for e, xs in got.items() if xs} == {e: sorted(xs) for e, xs in want.items()}
    assert sum(s.late_rows for s in stats) == late


@pytest.mark.spark
def test_product_order_batches_complete_what_is_below_them_and_refuse_complete_epochs(tmp_path):
    """A ``product(2)`` topic (``epochColumns``): batch 0 brings (0, 1) and (1, 0), completing
    everything at or below them — the frontier becomes [(0, 2), (1, 1), (2, 0)]; batch 1 with a
    row of (0, 1) (complete) is refused and publishes nothing; batch 1 without it commits."""
    from epochstream.frontier import Antichain
    from epochstream.order import dual, product

    P = product(2)
    cat = Catalog(tmp_path / "cat")
    writer = EpochstreamStreamWriter({"topic": TOPIC, "catalog": str(cat.path),
                                      "epochColumns": "a,b"})

    def msgs(host, batch, parts):
        out = []
        for p, by_epoch in enumerate(parts):
            m = Task(host, batch, p).write(by_epoch)
            ts = list(by_epoch)
            out.append(dataclasses.replace(
                m, epoch_lo=None, epoch_hi=None,
                epoch_minima=sorted(Antichain(P, ts).elements) if ts else None,
                epoch_maxima=sorted(Antichain(dual(P), ts).elements) if ts else None))
        return out

    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat, order=P) as host:
        sub = Subscriber(TOPIC, catalog=cat, wait=10.0, timeout=10.0)
        assert sub.wait_ready(20)
        writer.commit(msgs(host, 0, [{(0, 1): [1]}, {(1, 0): [2], (0, 0): [3]}]), 0)
        assert [sorted(s.frontier) for s in host.stats()] == [[(0, 2), (1, 1), (2, 0)]] * 2
        with pytest.raises(IngestError, match=r"rows of epoch \(0, 1\), complete"):
            writer.commit(msgs(host, 1, [{(0, 1): [4], (2, 2): [5]}, {}]), 1)
        writer.commit(msgs(host, 1, [{(2, 2): [5]}, {(1, 1): [6]}]), 1)
        # everything at or below (2, 2) is complete now
        assert [sorted(s.frontier) for s in host.stats()] == [[(0, 3), (3, 0)]] * 2
    got = {}
    for e in sub.epochs(timeout=10):
        got[e.time] = sorted(e.records.column("x").to_pylist())
    sub.close()
    assert got == {(0, 0): [3], (0, 1): [1], (1, 0): [2], (1, 1): [6], (2, 2): [5]}
