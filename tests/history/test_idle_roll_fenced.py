"""A publisher whose idle segment roll (the age limit applied while nothing is committed) is
refused by the catalog — another incarnation holds the partition now — fails its log as for
any other refused index write: the loop keeps serving (subscribers are told, calls raise
``HistoryWriteError``) instead of dying with a traceback. Real Publisher, real SQLite catalog,
real log; the successor is a registration through the catalog's API."""

from __future__ import annotations

import time

import pytest

from epochstream import Catalog, Publisher, Retention
from epochstream.errors import HistoryWriteError


def test_a_refused_idle_segment_roll_fails_the_log_not_the_loop(tmp_path):
    cat = Catalog(str(tmp_path / "cat"))
    cat.create_topic("t", partitions=1)
    pub = Publisher("t", 0, catalog=cat, retention=Retention(
        dir=str(tmp_path / "log"), max_age=0.5, max_bytes=None, max_epochs=None))
    try:
        pub.send(0, [1])
        pub.advance_to(1)
        assert pub.flush(10)
        mine = cat.lookup("t").partition_info[0].incarnation
        # a successor takes the partition over (this one marked closed, as after a lost lease)
        cat.close_partition("t", 0, mine)
        cat.register_partition("t", 0, "tcp://127.0.0.1:9", incarnation="successor")
        deadline = time.monotonic() + 10  # the segment ages (0.5 s), the roll is refused
        while pub._loop.log_error is None and pub._loop.error is None and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub._loop.error is None, pub._loop.error  # the loop did not die
        assert pub._driver.is_alive()
        assert isinstance(pub._loop.log_error, HistoryWriteError)
        assert "refused" in str(pub._loop.log_error) or "roll" in str(pub._loop.log_error)
        with pytest.raises(HistoryWriteError):
            pub.send(1, [2])
        assert cat.history_state("t", 0).lower == (1,)  # nothing of it indexed after the refusal
    finally:
        pub.abort("test over", linger=0)
