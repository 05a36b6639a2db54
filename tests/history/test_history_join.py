"""Joining at a position: history and the live stream joined without a gap or a duplicate, over
real sockets (issue 11). Each test asserts the exact epochs and their records."""

from __future__ import annotations

import threading
import time

import pytest

from epochstream import (Catalog, Gap, HistoryUnavailable, Publisher, Retention, Subscriber,
                         product)


def _records(epoch):
    return sorted(map(tuple, epoch.records))


def _collect(sub, out, timeout=10.0):
    for e in sub.epochs(timeout=timeout):
        out.append(e)


def test_subscriber_started_after_the_publisher_finished_gets_every_epoch(tmp_path, catalog_location):
    """The README hello-world case: the subscriber starts second, after the stream ended."""
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    with Publisher("hello", catalog=cat, retention=Retention()) as pub:
        for t in range(3):
            pub.send(t, [["hello", t]])
            pub.advance_to(t + 1)
    with Subscriber("hello", cat, start="earliest", timeout=5) as sub:
        got = [(e.time, _records(e)) for e in sub.epochs(timeout=5)]
    assert got == [(0, [("hello", 0)]), (1, [("hello", 1)]), (2, [("hello", 2)])]


def test_a_position_is_inclusive(tmp_path, catalog_location):
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        for t in range(6):
            pub.send(t, [[t]])
            pub.advance_to(t + 1)
    with Subscriber("t", cat, start=3, timeout=5) as sub:
        assert [e.time for e in sub.epochs(timeout=5)] == [3, 4, 5]
    with Subscriber("t", cat, start=[6], timeout=5) as sub:
        assert [e.time for e in sub.epochs(timeout=5)] == []


def test_join_in_the_middle_of_an_epoch_of_two_product_partitions(tmp_path, catalog_location):
    """Partition 0 has sent half of epoch (1, 0) and all of (0, 1) when the subscriber joins at
    [(0, 0)]: the live filter drops both epochs; history supplies them, whole, once complete,
    and the later epochs come live; nothing twice."""
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    order = product(2)
    kw = dict(order=order, catalog=cat, partitions=2, retention=Retention())
    p0, p1 = Publisher("grid", 0, **kw), Publisher("grid", 1, **kw)
    try:
        for p in (p0, p1):
            p.send((0, 0), [[p.partition, "a"]])
        for p in (p0, p1):  # capabilities at (1, 0) and (0, 1): two incomparable open epochs
            p.progress([((0, 0), -1), ((1, 0), 1), ((0, 1), 1)])
        p0.send((1, 0), [[0, "half"]])
        p0.send((0, 1), [[0, "b"]])
        assert p0.flush() and p1.flush()  # the loops sent (and logged) all of it: the join's
        out: list = []                    # snapshot covers it, so history must supply it
        sub = Subscriber("grid", cat, start=[(0, 0)], timeout=10)
        assert sub.wait_ready(10)
        th = threading.Thread(target=_collect, args=(sub, out))
        th.start()
        p1.send((0, 1), [[1, "b"]])
        p1.send((1, 0), [[1, "other half"]])
        p0.send((1, 0), [[0, "second half"]])
        for p in (p0, p1):  # (1, 0) and (0, 1) complete; (1, 1) and (2, 0) open
            p.progress([((1, 0), -1), ((0, 1), -1), ((1, 1), 1), ((2, 0), 1)])
        for p in (p0, p1):
            p.send((1, 1), [[p.partition, "live"]])
            p.send((2, 0), [[p.partition, "live too"]])
    finally:
        p0.close()
        p1.close()
    th.join(20)
    sub.close()
    got = {e.time: _records(e) for e in out}
    assert len(out) == len(got), "an epoch was delivered twice"
    assert got == {
        (0, 0): [(0, "a"), (1, "a")],
        (0, 1): [(0, "b"), (1, "b")],
        (1, 0): [(0, "half"), (0, "second half"), (1, "other half")],
        (1, 1): [(0, "live"), (1, "live")],
        (2, 0): [(0, "live too"), (1, "live too")],
    }
    pos = {e.time: i for i, e in enumerate(out)}  # consistent with the partial order
    for a in got:
        for b in got:
            if a != b and order.le(a, b):
                assert pos[a] < pos[b], (a, b, [e.time for e in out])
    assert sub.stats["history_epochs"] >= 2


def test_position_without_history_for_begun_epochs_is_refused(tmp_path, catalog_location):
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    with Publisher("plain", catalog=cat) as pub:  # no retention
        pub.send(0, [[0]])
        pub.advance_to(1)
        with pytest.raises(HistoryUnavailable, match="keeps no epoch log"):
            with Subscriber("plain", cat, start=0, timeout=5) as sub:
                list(sub.epochs(timeout=5))
        # a position beyond everything sent needs no history
        with Subscriber("plain", cat, start=1, timeout=5) as sub:
            assert sub.wait_ready(5)
            pub.send(1, [[1]])
            pub.advance_to(2)
            it = sub.epochs(timeout=5)
            assert next(it).time == 1


def test_an_evicted_subscriber_with_recover_is_filled_from_history_not_a_gap(tmp_path, catalog_location):
    """A subscriber that is evicted (lagged) re-joins; with retention the epochs it missed come
    from the log: no Gap, every epoch once and whole."""
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    n_epochs, per = 40, 5
    pub = Publisher("lag", catalog=cat, retention=Retention(), max_queue_messages=5,
                    sndhwm=2)
    sub = Subscriber("lag", cat, recover=True, rcvhwm=2, timeout=10)
    got: list = []
    try:
        assert sub.wait_ready(5)
        for t in range(n_epochs):  # the subscriber reads nothing meanwhile: it is evicted
            for i in range(per):
                pub.send(t, [[t, i, "x" * 50_000]])
            pub.advance_to(t + 1)
        pub.flush()
        deadline = time.monotonic() + 5
        while pub.stats.get("subscribers_evicted", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub.stats.get("subscribers_evicted", 0) >= 1, pub.stats
        for e in sub.epochs(timeout=10):
            got.append(e)
            if isinstance(e, Gap) or e.time == n_epochs - 1:
                break
    finally:
        pub.close()
        sub.close()
    assert not [g for g in got if isinstance(g, Gap)]
    assert [e.time for e in got] == list(range(n_epochs))
    assert all(len(e.records) == per for e in got)
    assert sub.stats["rejoins_filled"] >= 1


def test_a_catch_up_that_races_retention_gets_an_explicit_error_not_corruption(tmp_path, catalog_location):
    """The subscriber joins (its history fill names epoch 0) but reads only after retention
    deleted epoch 0's segment: before, HistoryCorrupt ("missing"); now the durable subscription
    expires explicitly, and a plain subscriber gets HistoryUnavailable; nothing partial."""
    from epochstream import SubscriptionExpired
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    ret = Retention(max_epochs=4, segment_bytes=4096, max_bytes=None, max_age=None)
    pub = Publisher("r", catalog=cat, retention=ret)
    try:
        pub.send(0, [[0, "x" * 2000]])
        pub.advance_to(1)
        durable = Subscriber("r", cat, durable="d", start="earliest", timeout=5)
        plain = Subscriber("r", cat, start=0, timeout=5)
        assert durable.wait_ready(5) and plain.wait_ready(5)
        for t in range(1, 20):
            pub.send(t, [[t, "x" * 2000]])
            pub.advance_to(t + 1)
        assert pub.flush()  # (the loop logs: flush returns once everything is logged)
        assert cat.history_state("r", 0).since != (0,)
        with pytest.raises(SubscriptionExpired) as info:
            list(durable.epochs(timeout=5))
        assert info.value.name == "d" and info.value.retained
        with pytest.raises(HistoryUnavailable):
            list(plain.epochs(timeout=5))
    finally:
        pub.close()


def test_a_latest_subscriber_of_a_closed_topic_says_so_or_waits_for_the_next_run(tmp_path, catalog_location):
    """Issue 16: before, Subscriber("t") on a topic an earlier run closed succeeded with nothing
    (0 epochs). Now it raises TopicClosed after ``wait``, follows a new run that starts within
    ``wait``, and start="earliest" still replays what the topic retains."""
    from epochstream import TopicClosed
    cat = Catalog(catalog_location)  # on SQLite, then on PostgreSQL
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        pub.send(0, [[0]])
        pub.advance_to(1)
    t0 = time.monotonic()
    with pytest.raises(TopicClosed, match="topic 't' is closed .* start=\"earliest\""):
        Subscriber("t", cat, wait=0.5)
    assert time.monotonic() - t0 >= 0.5
    with Subscriber("t", cat, start="earliest", wait=0.5) as sub:
        assert [e.time for e in sub.epochs(timeout=5)] == [0]
    got: list = []

    def next_run():
        time.sleep(0.5)
        with Publisher("t", catalog=cat, retention=Retention()) as again:  # continues at 1
            deadline = time.monotonic() + 10
            while again.subscribers < 1 and time.monotonic() < deadline:
                time.sleep(0.02)  # the waiting subscriber joins it
            again.send(1, [[1]])
            again.advance_to(2)

    th = threading.Thread(target=next_run)
    th.start()
    with Subscriber("t", cat, wait=10) as sub:
        got = [e.time for e in sub.epochs(timeout=10)]
    th.join(10)
    assert got == [1]
