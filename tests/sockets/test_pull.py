"""Subscriber.fetch() (issue 12, "Pull") over real ZeroMQ sockets on 127.0.0.1: timeouts,
no_wait, batching with buffered leftovers, max_bytes and epoch_too_large, superseded pulls, end
of stream, mixing with epochs(), a publisher killed during a long pull, durable + ack."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochstream import Catalog, FetchResult, Retention
from epochstream.errors import PublisherAborted, PublisherLost
from epochstream.transport import Publisher, Subscriber
from epochstream.wire import codec

from peer_processes import kill, read_until

FAULT_PEER = str(Path(__file__).with_name("fault_peer.py"))
SIZE = {n: len(codec("msgpack").encode(list(range(n)))) for n in (10, 200)}


def _records(t, n=3):
    return [[t, i] for i in range(n)]


def _publish(pub, times, n=3):
    """One message per epoch in ``times``, then one frontier advance past them all (so the
    epochs complete together)."""
    for t in times:
        pub.send(t, _records(t, n))
    pub.advance_to(max(times) + 1)
    pub.flush()


def _ready(pub, **kw):
    sub = Subscriber("t", endpoints=[pub.endpoint], **kw)
    assert sub.wait_ready(5)
    return sub


def _contents(result):
    return [(e.time, [list(r) if isinstance(r, (list, tuple)) else r for r in e.records])
            for e in result]


# -- timeouts and no_wait --------------------------------------------------------------------
def test_expires_returns_timeout_status_not_an_exception_then_ok():
    with Publisher("t") as pub, _ready(pub) as sub:
        t0 = time.monotonic()
        r = sub.fetch(expires=0.3)
        took = time.monotonic() - t0
        assert isinstance(r, FetchResult)
        assert (r.status, list(r), r.gaps, r.finished, r.superseded) == ("timeout", [], (), False,
                                                                          False)
        assert not r and len(r) == 0
        assert 0.3 <= took < 0.6
        r = sub.fetch(expires=0.0)  # one pass, no wait
        assert r.status == "timeout" and not r
        with pytest.raises(TimeoutError):  # epochs(timeout=) still raises
            next(sub.epochs(timeout=0.2))
        _publish(pub, [0])
        t0 = time.monotonic()
        r = sub.fetch(expires=5)  # max_epochs=1: returns as soon as it is there
        assert time.monotonic() - t0 < 2
        assert r.status == "ok" and _contents(r) == [(0, [[0, 0], [0, 1], [0, 2]])]
        assert r.nbytes == r[0].nbytes == len(codec("msgpack").encode(_records(0)))
        assert sub.fetch(expires=0.2).status == "timeout"


def test_no_wait_on_an_idle_stream_is_no_data_at_once_and_never_waits():
    with Publisher("t") as pub, _ready(pub) as sub:
        for _ in range(3):
            t0 = time.monotonic()
            r = sub.fetch(no_wait=True, expires=10)  # expires is ignored
            assert time.monotonic() - t0 < 0.2
            assert (r.status, list(r), r.finished) == ("no_data", [], False)
        _publish(pub, [0, 1, 2])
        got, deadline = [], time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            r = sub.fetch(max_epochs=10, no_wait=True)
            assert r.status == ("ok" if r else "no_data")
            got += r.times
            if not r:
                time.sleep(0.02)
        assert got == [0, 1, 2]
        assert sub.fetch(no_wait=True).status == "no_data"


def test_arguments_are_checked():
    with Publisher("t") as pub, _ready(pub) as sub:
        for kw in ({"max_epochs": 0}, {"max_epochs": 1.5}, {"max_epochs": True},
                   {"max_bytes": 0}, {"max_bytes": 2.0}, {"expires": -1},
                   {"expires": float("nan")}, {"expires": "1"}):
            with pytest.raises(ValueError):
                sub.fetch(**kw)
    with pytest.raises(ValueError, match="closed"):
        sub.fetch(no_wait=True)


# -- batching --------------------------------------------------------------------------------
def test_max_epochs_batches_keep_the_leftovers_in_order():
    with Publisher("t") as pub, _ready(pub) as sub:
        _publish(pub, range(7))  # one frontier update completes all seven at once
        r1 = sub.fetch(max_epochs=3, expires=5)
        r2 = sub.fetch(max_epochs=3, no_wait=True)
        t0 = time.monotonic()
        r3 = sub.fetch(max_epochs=3, expires=0.3)  # only one left: waits out expires, then "ok"
        took = time.monotonic() - t0
        assert [(r.status, r.times) for r in (r1, r2, r3)] == [
            ("ok", [0, 1, 2]), ("ok", [3, 4, 5]), ("ok", [6])]
        assert 0.3 <= took < 0.6
        assert _contents(r2) == [(t, [[t, 0], [t, 1], [t, 2]]) for t in (3, 4, 5)]
        assert sub.fetch(max_epochs=3, no_wait=True).status == "no_data"
        # expires=None: blocks for the first epoch, then returns what already arrived
        _publish(pub, [7, 8])
        r = sub.fetch(max_epochs=10)
        assert r.status == "ok" and r.times == [7, 8]


def test_max_bytes_never_splits_and_an_oversized_epoch_comes_alone():
    small, big = SIZE[10], SIZE[200]
    with Publisher("t") as pub, _ready(pub) as sub:
        for t, n in enumerate([10, 10, 200, 10, 10, 10]):
            pub.send(t, list(range(n)))
        pub.advance_to(6)
        pub.flush()
        budget = 2 * small + 1  # two small epochs fit, three do not, the big one never
        t0 = time.monotonic()
        results = [sub.fetch(max_epochs=10, max_bytes=budget, expires=5) for _ in range(3)]
        assert time.monotonic() - t0 < 2  # each ended by its budget, not by expires
        results.append(sub.fetch(max_epochs=10, max_bytes=budget, no_wait=True))
        assert [(r.status, r.times, r.nbytes) for r in results] == [
            ("ok", [0, 1], 2 * small),
            ("epoch_too_large", [2], big),
            ("ok", [3, 4], 2 * small),
            ("ok", [5], small)]
        assert [list(e.records) for r in results for e in r] == [
            list(range(n)) for n in (10, 10, 200, 10, 10, 10)]
        # a budget that the next epoch fits exactly
        pub.send(6, list(range(10)))
        pub.send(7, list(range(10)))
        pub.advance_to(8)
        pub.flush()
        r = sub.fetch(max_epochs=10, max_bytes=small, expires=5)
        assert (r.status, r.times) == ("ok", [6])
        r = sub.fetch(max_epochs=10, max_bytes=small, no_wait=True)
        assert (r.status, r.times) == ("ok", [7])


# -- superseded pulls ------------------------------------------------------------------------
def _in_thread(fn):
    out = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        out["at"] = time.monotonic()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def test_a_new_fetch_supersedes_a_waiting_one_which_returns_what_it_had():
    with Publisher("t") as pub, _ready(pub) as sub:
        th, out = _in_thread(lambda: sub.fetch(max_epochs=5, expires=20))
        time.sleep(0.2)
        _publish(pub, [0, 1])
        time.sleep(0.5)  # the waiting fetch takes both, still wants three more
        assert th.is_alive()
        later = threading.Timer(0.3, _publish, (pub, [2]))  # while the new fetch waits
        later.start()
        t0 = time.monotonic()
        r2 = sub.fetch(max_epochs=5, expires=1.0)
        later.join()
        th.join(5)
        r1 = out["result"]
        assert out["at"] - t0 < 0.5  # promptly, not after its 20 s
        assert (r1.status, r1.times, r1.superseded) == ("ok", [0, 1], True)
        assert (r2.status, r2.times, r2.superseded) == ("ok", [2], False)


def test_a_superseded_empty_pull_is_no_data_and_the_new_one_proceeds():
    with Publisher("t") as pub, _ready(pub) as sub:
        th, out = _in_thread(lambda: sub.fetch())  # expires=None: would block for good
        time.sleep(0.3)
        assert th.is_alive()
        t0 = time.monotonic()
        r2 = sub.fetch(no_wait=True)
        th.join(5)
        assert out["at"] - t0 < 0.5
        r1 = out["result"]
        assert (r1.status, list(r1), r1.superseded, r1.finished) == ("no_data", [], True, False)
        assert (r2.status, list(r2), r2.superseded) == ("no_data", [], False)
        _publish(pub, [0])  # nothing orphaned: the next pull gets the epoch
        assert sub.fetch(expires=5).times == [0]


# -- end of stream ---------------------------------------------------------------------------
def test_end_of_stream_is_no_data_finished_never_a_hang():
    with Publisher("t") as pub, _ready(pub) as sub:
        _publish(pub, [0, 1])
        pub.close()
        r1 = sub.fetch(max_epochs=2, expires=5)
        assert (r1.status, r1.times) == ("ok", [0, 1])
        for kw in ({}, {"expires": 5}, {"no_wait": True}, {"max_epochs": 3}):
            t0 = time.monotonic()
            r = sub.fetch(**kw)
            assert time.monotonic() - t0 < 0.5
            assert (r.status, list(r), r.finished) == ("no_data", [], True)
        assert list(sub.epochs(timeout=1)) == []


def test_the_last_epochs_come_with_finished_when_the_end_is_seen():
    with Publisher("t") as pub, _ready(pub) as sub:
        _publish(pub, [0, 1, 2])
        pub.close()
        time.sleep(0.3)
        r = sub.fetch(max_epochs=10)  # holds epochs, takes what arrived: the end too
        assert (r.status, r.times, r.finished) == ("ok", [0, 1, 2], True)


# -- mixing with epochs() --------------------------------------------------------------------
def test_fetch_and_epochs_share_one_stream():
    with Publisher("t") as pub, _ready(pub) as sub:
        _publish(pub, range(8))  # all eight complete at once
        assert sub.fetch(max_epochs=2, expires=5).times == [0, 1]
        it = sub.epochs(timeout=5)
        assert [next(it).time, next(it).time] == [2, 3]
        del it  # abandoned: nothing it released is lost
        assert sub.fetch(max_epochs=1, no_wait=True).times == [4]
        # an epoch a fetch held back (max_bytes) comes first from epochs() too
        r = sub.fetch(max_epochs=5, max_bytes=len(codec("msgpack").encode(_records(5))),
                      no_wait=True)
        assert r.times == [5]
        assert next(sub.epochs(timeout=5)).time == 6
        _publish(pub, [8])
        pub.close()
        assert sub.fetch(max_epochs=1, expires=5).times == [7]
        assert [e.time for e in sub.epochs(timeout=5)] == [8]
        r = sub.fetch(no_wait=True)
        assert (r.status, r.finished) == ("no_data", True)


# -- liveness --------------------------------------------------------------------------------
def test_a_failure_is_raised_only_after_the_epochs_before_it_were_returned():
    with Publisher("t") as pub, _ready(pub) as sub:
        _publish(pub, [0, 1])
        pub.send(2, ["never complete"])
        pub.abort("test")
        time.sleep(0.3)  # epochs and the abort notice have all arrived
        t0 = time.monotonic()
        r = sub.fetch(max_epochs=10, expires=5)
        assert time.monotonic() - t0 < 1  # not after expires: the failure ended it
        assert (r.status, r.times) == ("ok", [0, 1])  # the failure is pending
        for _ in range(2):  # then raised, and again
            with pytest.raises(PublisherAborted, match="aborted"):
                sub.fetch(no_wait=True)


def test_heartbeats_keep_a_long_pull_alive_and_a_killed_publisher_ends_it(tmp_path):
    cat = tmp_path / "cat.db"
    # partition 0 of "k": epoch 0, then idle with a heartbeat every 0.2 s until killed
    proc = subprocess.Popen([sys.executable, FAULT_PEER, "publisher", str(cat), "k", "0", "1",
                             "100"], stdout=subprocess.PIPE, text=True)
    try:
        read_until(proc, "EPOCH")
        with Subscriber("k", Catalog(cat), timeout=30) as sub:
            assert sub.wait_ready(10)
            # silent but for heartbeats for 1.5 s (> 2 heartbeats): alive, status "timeout"
            r = sub.fetch(max_epochs=5, expires=1.5)
            assert (r.status, list(r)) == ("timeout", [])
            killed = {}

            def kill_later():
                time.sleep(0.5)
                killed["at"] = time.monotonic()
                kill(proc)

            th = threading.Thread(target=kill_later, daemon=True)
            th.start()
            with pytest.raises(PublisherLost, match="two heartbeats missed") as info:
                sub.fetch(max_epochs=5)  # a long pull (no expires)
            lost_at = time.monotonic()
            th.join(5)
            assert info.value.partition == 0
            # two heartbeats (0.4 s) + grace (0.5 s), far below the subscriber's timeout (30 s)
            print(f"PublisherLost {lost_at - killed['at']:.2f} s after the kill (heartbeat 0.2 s)")
            assert 0.6 < lost_at - killed["at"] < 2.5  # silent since the last beat before it
            with pytest.raises(PublisherLost):  # the failure stays
                sub.fetch(no_wait=True)
    finally:
        kill(proc)


def test_gaps_of_a_recovering_subscriber_come_with_the_results(tmp_path):
    cat = Catalog(tmp_path / "cat.db")
    pub = Publisher("t", catalog=cat, heartbeat_interval=0.2)
    sub = Subscriber("t", catalog=cat, timeout=10, recover=True, ping_interval=0.2)
    pub2 = None
    try:
        assert sub.wait_ready(5)
        pub.send(0, [0])
        pub.advance_to(1)
        pub.send(1, ["half"])
        pub.abort("test")  # epoch 1 never completes in this incarnation
        r = sub.fetch(max_epochs=5, expires=0.3)
        assert (r.status, _contents(r), r.gaps) == ("ok", [(0, [0])], ())
        pub2 = Publisher("t", catalog=cat, heartbeat_interval=0.2, start=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = sub.fetch(max_epochs=5, expires=0.3)
            if r.gaps:
                break
            assert (r.status, list(r)) == ("timeout", [])
        # a gap alone does not end a pull: nothing was published yet, so "timeout"
        assert (r.status, list(r), len(r.gaps)) == ("timeout", [], 1)
        gap = r.gaps[0]
        assert (gap.reason, gap.last_epoch, gap.partition) == ("aborted", 0, 0)
        assert gap.may_have_missed(1) and sub.gaps == [gap]
        pub2.send(1, ["whole-1"])
        pub2.send(2, ["whole-2"])
        pub2.advance_to(3)
        r = sub.fetch(max_epochs=5, expires=0.5)
        # epoch 1 was begun before the re-join: the gap covers it, the filter drops it
        assert (r.status, _contents(r), r.gaps) == ("ok", [(2, ["whole-2"])], ())
    finally:
        sub.close()
        if pub2 is not None:
            pub2.close(linger=1)


# -- durable subscriptions -------------------------------------------------------------------
def test_fetched_epochs_of_a_durable_subscription_are_acked_like_epochs(tmp_path):
    cat = Catalog(tmp_path / "cat.db")
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        _publish(pub, range(5))
        with Subscriber("t", cat, durable="w", start="earliest") as sub:
            r = sub.fetch(max_epochs=2, expires=5)
            assert _contents(r) == [(t, [[t, 0], [t, 1], [t, 2]]) for t in (0, 1)]
            for e in r:
                sub.ack(e)
            r = sub.fetch(max_epochs=2, expires=5)
            assert r.times == [2, 3]
            sub.ack(r[0])  # 3 is not acked
            assert sub.position == (3,)
            with pytest.raises(ValueError, match="unacked epoch handed out"):
                sub.ack(2)  # twice
        _publish(pub, [5])
        with Subscriber("t", cat, durable="w") as sub:  # resumes at 3: 3 is redelivered
            r = sub.fetch(max_epochs=3, expires=5)
            assert r.times == [3, 4, 5]
            with pytest.raises(ValueError):
                sub.ack(6)  # never handed out
            sub.ack(3)
            sub.ack(r[1])
            assert sub.position == (5,)
        assert cat.durable("t", "w").position == (5,)


def test_a_puller_with_credit_in_epochs_holds_the_publisher_to_its_pace():
    """Subscriber(credit=1, credit_unit="epochs") that does not read: the publisher sends it one
    frontier advance (and the data before it) and keeps the rest in its backlog; each fetch
    grants one more, and every epoch arrives whole and in order."""
    with Publisher("ep", max_queue_messages=1000) as pub:
        sub = Subscriber("ep", endpoints=[pub.endpoint], credit=1, credit_unit="epochs")
        try:
            assert sub.wait_ready(5)
            for t in range(6):
                for i in range(3):
                    pub.send(t, [[t, i]])
                pub.advance_to(t + 1)
            assert pub.flush()
            time.sleep(0.2)
            (peer,) = pub._fanout.peers.values()  # (internal: what the publisher holds back)
            held = [f[0] for f in peer.backlog].count(b"F\x01")
            assert peer.epochs and held == 5  # one epoch went out; the other five wait
            got = []
            while len(got) < 6:
                result = sub.fetch(max_epochs=1, expires=5)
                assert result.status == "ok", result
                got.extend((e.time, sorted(e.records)) for e in result)
            assert got == [(t, [(t, 0), (t, 1), (t, 2)]) for t in range(6)]
        finally:
            sub.close()
