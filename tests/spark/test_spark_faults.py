"""Spark faults, each with a real local SparkSession, a real
:class:`SparkPublisherHost` and a real :class:`Subscriber` over ZeroMQ — nothing we ship is mocked.

1. a task's Python worker killed (SIGKILL) mid-write, after the sink staged some of its rows;
2. the query stopped while a batch is in flight (mid-write, or mid-commit), then restarted from
   the same checkpoint;
(The Spark driver killed with SIGKILL mid-batch and restarted from the same checkpoint while the
host keeps serving: on the standalone cluster, ``test_cluster_driver_kill.py``.)

(A COMMIT whose attempt lost its staged rows is refused: ``test_host.py``.)

Every test checks what a subscriber attached throughout received: each epoch exactly once, in
order, and whole (row counts and dates equal the pandas reference of
:mod:`epochstream._demo.flights`).
The numbers quoted in docs/reliability.md ("Spark faults") come from ``timings`` printed with
``pytest -s``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("pyspark")

from epochstream._demo import flights  # noqa: E402
from epochstream.catalog import Catalog  # noqa: E402
from epochstream.spark import SparkPublisherHost  # noqa: E402
from spark_support import (QUERY_TIMEOUT, TOPIC, Collector, await_query, check_whole,  # noqa: E402
                           start, stream, wait_until)


class _PublishTimes:
    """``on_published`` callback: when each (partition, epoch) was completed on the host."""

    def __init__(self):
        self.at: dict[tuple[int, int], float] = {}

    def __call__(self, partition, epoch, rows):
        self.at.setdefault((partition, epoch), time.time())


# ============================================================================================
# 1. a task's Python worker killed mid-write


def _writer_workers(port: int, exclude: int) -> list:
    """Spark's Python task workers (``pyspark.daemon`` forks running ``pyspark.worker``; the sink's
    ``write()`` runs in one, not in the ``write_into_data_source`` worker, which only builds the
    writer on the driver side) with a connection to the ingest ``port``, except pid ``exclude``."""
    import psutil

    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if (p.pid != exclude and p.cmdline()[-1:] == ["pyspark.worker"]
                    and any(c.raddr and c.raddr.port == port for c in p.net_connections("tcp"))):
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.spark
@pytest.mark.parametrize("victim", ["upstream", "writer"])
def test_task_worker_killed_mid_write(quiet_spark, tmp_path, victim):
    """Batch 2, Spark partition 0, attempt 0 is killed after the sink staged some of its rows.
    The task runs two Python worker processes: an upstream ``mapInArrow`` that yields eight
    100-row batches, and the sink's writer (``write()``), which sends them to the host.

    - ``upstream``: the mapInArrow worker SIGKILLs itself (after a second, so that the writer
      staged what it got past the JVM's ~64 KiB buffer);
    - ``writer``: the mapInArrow worker holds; the test finds the writer process (the worker
      connected to the ingest socket) and SIGKILLs it in the middle of the attempt.

    Spark treats a crashed Python worker like a failed task ("Python worker exited unexpectedly
    (crashed)") and retries it (local[2,2]); the query does not fail. The killed attempt's staged
    rows are discarded, the retry's are published once; every epoch arrives once and whole."""
    spark = quiet_spark
    marker, held, release = tmp_path / "killed-at", tmp_path / "held", tmp_path / "release"

    # nested: cloudpickle ships a local function by value (workers cannot import test modules)
    def _inject(batches, victim=victim, marker=str(marker), held=str(held), release=str(release)):
        import os
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        fault = (ctx.getLocalProperty("streaming.sql.batchId") == "2" and ctx.partitionId() == 0
                 and ctx.attemptNumber() == 0)
        for i, b in enumerate(batches):
            yield b
            if fault and i == 7:
                if victim == "upstream":
                    time.sleep(1.0)  # the writer (another Python worker) stages what it got
                    with open(marker, "w") as f:
                        f.write(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
                with open(held, "w") as f:
                    f.write(str(os.getpid()))
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)

    files = flights.day_files(4, files_per_day=1)  # one Spark partition (~900 rows) per day
    cat = Catalog(tmp_path / "cat")
    published = _PublishTimes()
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat, on_published=published) as host:
        sub = Collector(cat)
        df = stream(spark, files)
        q = start(spark, df.mapInArrow(_inject, df.schema), host, tmp_path / "ck")
        if victim == "writer":
            wait_until(lambda: held.exists() or not q.isActive, QUERY_TIMEOUT,
                        "the task of batch 2 to be held")
            assert q.isActive, f"the query ended without the fault: {q.exception()}"
            wait_until(lambda: host.staged_bytes(0) > 0, 60, "rows of batch 2 to be staged")
            port = int(host.ingest_endpoints[0].rsplit(":", 1)[1])
            writers = _writer_workers(port, exclude=int(held.read_text()))
            assert writers, "no writer worker connected to the ingest socket"
            marker.write_text(repr(time.time()))
            for p in writers:  # workers are reused: idle ones of earlier tasks may be there too
                p.kill()
            killed = len(writers)
            release.touch()
        await_query(q)
        stats = host.stats()
        left = host.staged_bytes()
    sub.join()
    check_whole(sub.epochs, files)
    assert marker.exists(), "the fault was not injected"
    killed_at = float(marker.read_text())
    s = stats[0]
    assert s.discarded_batches >= 1, stats          # the killed attempt had staged rows ...
    assert s.staged_batches == s.batches + s.discarded_batches  # ... none of them published
    assert s.rows == files.rows and stats[1].rows == 0
    assert all(x.duplicates == 0 for x in stats) and left == 0
    if victim == "writer":
        print(f"\nkilled {killed} writer worker(s)")
    print(f"\ntimings ({victim}): worker killed -> epoch 2 published "
          f"{published.at[(0, 2)] - killed_at:.2f} s; discarded {s.discarded_batches} staged "
          f"batches of the killed attempt; stats {stats}")


# ============================================================================================
# 2. the query stopped mid-batch, restarted from its checkpoint


@pytest.mark.spark
@pytest.mark.parametrize("where", ["mid-write", "mid-commit"])
def test_query_stopped_mid_batch_and_restarted(quiet_spark, tmp_path, where):
    """Stop the query while batch 2 is in flight, restart it from the same checkpoint with the
    same host; a subscriber attached throughout sees every epoch once and whole.

    - ``mid-write``: a task of batch 2 has sent rows that the host staged, and is held (it waits
      for a file) when ``q.stop()`` is called. Nothing of batch 2 is committed; the restart
      re-runs batch 2 under a new run id and the stopped run's staged rows are discarded.
    - ``mid-commit``: the host holds COMMIT(2) on topic partition 0 after publishing its data and
      before advancing (``pause(0, 2, "data")``); partition 1 has already completed epoch 2.
      ``q.stop()`` is called there; the host finishes the commit once resumed, so epoch 2 is
      complete for subscribers — but Spark never recorded batch 2 as committed: the restart
      re-runs it and the host acknowledges the repeated COMMIT without publishing anything."""
    spark = quiet_spark
    hold, release = tmp_path / "held", tmp_path / "release"

    def _hold(batches, hold=str(hold), release=str(release)):
        import os
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        held = (ctx.getLocalProperty("streaming.sql.batchId") == "2" and ctx.partitionId() == 0
                and not os.path.exists(release))
        for i, b in enumerate(batches):
            yield b
            if held and i == 7:
                open(hold, "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)

    # mid-write: one file (one Spark partition, ~900 rows > 64 KiB) per day, so that rows reach
    # the sink before the hold; mid-commit: two files per day, one per topic partition
    files = flights.day_files(5, files_per_day=1 if where == "mid-write" else 2)
    cat = Catalog(tmp_path / "cat")
    ck = tmp_path / "ck"
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        df = stream(spark, files)
        if where == "mid-write":
            df = df.mapInArrow(_hold, df.schema)
            pause = None
        else:
            release.touch()
            pause = host.pause(0, 2, "data")
        q = start(spark, df, host, ck)
        if pause is None:
            wait_until(lambda: hold.exists() or not q.isActive, QUERY_TIMEOUT,
                        "the task of batch 2 to be held")
            assert q.isActive, f"the query ended without the hold: {q.exception()}"
            wait_until(lambda: host.staged_bytes(0) > 0, 60, "rows of batch 2 to be staged")
            staged_before = host.stats(0).staged_batches - host.stats(0).batches
        else:
            assert pause.wait(QUERY_TIMEOUT), "COMMIT(2) never reached the pause point"
        assert host.next_epoch() == 2 and sub.wait_for(1)
        t0 = time.monotonic()
        stopper = threading.Thread(target=q.stop, daemon=True)
        stopper.start()
        wait_until(lambda: not q.isActive, 60, "the query to become inactive")
        inactive_after = time.monotonic() - t0
        if pause is None:
            stopper.join(60)
            assert not stopper.is_alive(), "q.stop() did not return while a task was held"
            release.touch()  # the held worker (if Spark did not kill it) may go on
            assert host.stats(0).next_epoch == 2 and sub.delivered() == [0, 1]
        else:
            # q.stop() waits for the batch thread, which waits for COMMIT(2)'s acknowledgement
            time.sleep(0.5)
            assert stopper.is_alive() and host.stats(0).next_epoch == 2
            assert sub.delivered() == [0, 1]  # epoch 2 is in flight: not delivered yet
            pause.resume()
            stopper.join(60)
            assert not stopper.is_alive(), "q.stop() did not return after the commit finished"
            assert sub.wait_for(2), "epoch 2 is complete on every partition: delivered"
        stopped_after = time.monotonic() - t0
        assert q.exception() is None, q.exception()
        assert [p["batchId"] for p in q.recentProgress] == [0, 1]  # batch 2 never finished
        before_restart = host.stats()

        t1 = time.monotonic()
        q2 = start(spark, df, host, ck)
        await_query(q2)
        restart_s = time.monotonic() - t1
        assert [p["batchId"] for p in q2.recentProgress] == [2, 3, 4]  # batch 2 re-ran
        stats = host.stats()
        left = host.staged_bytes()
    sub.join()
    check_whole(sub.epochs, files)
    assert sum(s.rows for s in stats) == files.rows
    assert all(s.staged_batches == s.batches + s.discarded_batches for s in stats)
    assert left == 0
    if where == "mid-write":
        # the stopped run's staged rows of epoch 2 were superseded by the re-run and discarded
        assert staged_before >= 1 and stats[0].discarded_batches >= staged_before, stats
        assert all(s.duplicates == 0 for s in stats)
    else:
        # the re-run COMMIT(2) was acknowledged as a duplicate on both partitions, and its rows
        # (which arrived after epoch 2 was complete) were dropped on arrival: never staged
        assert [s.duplicates for s in stats] == [1, 1], stats
        assert all(s.discarded_batches == 0 for s in stats), stats
        # after the restart only epochs 3 and 4 carried rows: the re-run of 2 published nothing
        assert (sum(s.rows for s in stats) - sum(s.rows for s in before_restart)
                == files.counts[3] + files.counts[4])
    print(f"\ntimings ({where}): inactive after {inactive_after:.2f} s, q.stop() returned after "
          f"{stopped_after:.2f} s, restart (batches 2-4) {restart_s:.2f} s; stats {stats}")
