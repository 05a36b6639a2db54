"""Spark event time, the driver killed -9 at the worst moments and restarted from its
checkpoint: a local-mode driver in a process group of its own (tests/spark/cluster.py's
``Driver``: its Python, its JVM and their workers are SIGKILLed together), the host and a
subscriber in this process. Each day is delivered exactly once, whole."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

pytest.importorskip("pyspark")

from cluster import Driver  # noqa: E402
from epochstream import Catalog  # noqa: E402
from epochstream._demo import flights  # noqa: E402
from epochstream.spark import SparkPublisherHost  # noqa: E402
from spark_support import TOPIC, Collector, check_whole, wait_until  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.heavy]  # make test-heavy


def _query(files, cat, ck, days_per_batch: int, **extra) -> dict:
    return dict(topic=TOPIC, catalog=str(cat.path), schema=flights.spark_schema_ddl(),
                input=files.directory, files_per_day=files.files_per_day * days_per_batch,
                checkpoint=str(ck), **extra)


def test_driver_killed_under_each_policy_and_restarted(tmp_path_factory, tmp_path):
    """Both policies, one after the other, on three drivers (a driver's start-up is most of
    the cost; the second one serves both policies):

    1. ``"batch"``, two days per batch (epochs 0-1, 2-3, 4-5, 6-7). The host holds COMMIT of
       batch 2 on partition 0 after publishing its rows, before completing epochs 4-5; driver 1
       is killed there. The host then finishes the commit (the epochs complete, whole); Spark
       never recorded it, so driver 2 re-runs batch 2: a duplicate on both partitions, nothing
       published twice; batch 3 follows.
    2. ``"watermark"``, two days per batch under a 1-hour watermark. Batch 1's first task hands
       over rows (the host stages them) and hangs; driver 2 is killed there. Batch 0 completed
       day 0 only (day 1 is open: its last departures are within the delay); the killed run's
       staged rows are never published. Driver 3 re-runs batch 1 under a new run id: every day
       once, whole (the last one when the host closes)."""
    try:
        second = _batch_policy_killed_mid_commit(tmp_path_factory, tmp_path / "batch")
        _watermark_policy_killed_between_stage_and_commit(tmp_path_factory,
                                                          tmp_path / "watermark", second)
    finally:
        _close_spares()


class _Spare:
    """A driver started on a thread of its own (a warm spare: its start-up overlaps the running
    driver's query instead of following its death). Every spare is closed when the test ends
    (:data:`_SPARES`), used or not."""

    def __init__(self, tmp_path_factory, name: str):
        _SPARES.append(self)
        self.driver: Driver | None = None
        self.error: BaseException | None = None
        cwd = tmp_path_factory.mktemp(name)
        self.thread = threading.Thread(target=self._start, args=(cwd,), daemon=True)
        self.thread.start()

    def _start(self, cwd) -> None:
        try:
            self.driver = Driver("local[2]", cwd)
        except BaseException as e:  # noqa: BLE001 - raised by get()
            self.error = e

    def get(self) -> Driver:
        self.thread.join(180)
        if self.error is not None:
            raise self.error
        assert self.driver is not None, "the spare driver did not start"
        return self.driver


_SPARES: list[_Spare] = []


def _close_spares() -> None:
    while _SPARES:
        sp = _SPARES.pop()
        sp.thread.join(180)
        if sp.driver is not None:
            sp.driver.close()


def _batch_policy_killed_mid_commit(tmp_path_factory, tmp_path) -> Driver:
    """Part 1 (see the test); returns driver 2, alive."""
    files = flights.day_files(8)
    cat = Catalog(tmp_path / "cat")
    query = _query(files, cat, tmp_path / "ck", 2, first_date=str(files.dates[0]),
                   options={"epochColumn": "day_number"})
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        pause = host.pause(0, 4, "data")
        first = Driver("local[2]", tmp_path_factory.mktemp("driver-1"))
        spare = _Spare(tmp_path_factory, "driver-2")
        try:
            first.send("sink", **query)
            assert pause.wait(120), first.tail()
            first.kill()
        finally:
            first.close()
        assert sub.delivered() == [0, 1, 2, 3]  # 4-5 in flight: not delivered
        pause.resume()
        wait_until(lambda: host.next_epoch() == 6, 30, "the held commit to finish")
        assert sub.wait_for(5)
        second = spare.get()
        assert second.call("sink", **query)["batches"] == [2, 3]  # batch 2 re-ran
        stats = host.stats()
    sub.join()
    check_whole(sub.epochs, files)
    assert [s.duplicates for s in stats] == [1, 1], stats
    assert sum(s.rows for s in stats) == files.rows
    return second


def _watermark_policy_killed_between_stage_and_commit(tmp_path_factory, tmp_path,
                                                      driver: Driver) -> None:
    """Part 2 (see the test): ``driver`` is killed, a third one restarts the query."""
    files = flights.day_files(6, files_per_day=1)
    first_day = (files.dates[0] - dt.date(1970, 1, 1)).days
    cat = Catalog(tmp_path / "cat")
    held = tmp_path / "held"
    query = _query(files, cat, tmp_path / "ck", 2, watermark="1 hour",
                   options={"complete": "watermark", "eventTime": "ts", "epochLength": "1 day"})
    with SparkPublisherHost(TOPIC, partitions=2, catalog=cat) as host:
        sub = Collector(cat)
        spare = _Spare(tmp_path_factory, "driver-3")
        driver.send("sink_held", hold_batch=1, hold_file=str(held), **query)
        deadline = time.monotonic() + 120
        while not held.exists():
            assert time.monotonic() < deadline and driver.proc.poll() is None, driver.tail()
            time.sleep(0.1)
        wait_until(lambda: host.staged_bytes() > 0, 30, "rows of batch 1 to be staged")
        assert host.next_epoch() == first_day + 1
        driver.kill()
        time.sleep(1.0)
        assert sub.delivered() == [first_day]
        assert spare.get().call("sink", **query)["batches"] == [1, 2]
        stats = host.stats()
        left = host.staged_bytes()
    sub.join()
    got = [(e - first_day, n, dates, t) for e, n, dates, t in sub.epochs]
    check_whole(got, files)
    assert left == 0 and sum(s.late_rows for s in stats) == 0
    assert sum(s.discarded_batches for s in stats) >= 1, stats  # the killed run's rows
