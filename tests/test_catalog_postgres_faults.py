"""The catalog on PostgreSQL while its server crashes: SIGKILL (and ``pg_ctl stop -m
immediate``) at moments the test does not choose, a restart a moment later. Nothing the catalog
confirmed is lost, nothing is applied twice, no caller sees an error while the outage is shorter
than the retry deadline, and one longer than it is one clear ``CatalogUnavailable`` with nothing
half-applied. Each test runs its own server (the session's one is never killed)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from epochstream import Publisher, Subscriber
from epochstream.catalog import Catalog
from epochstream.catalog.history import EpochRecord
from epochstream.errors import CatalogError, CatalogUnavailable
from epochstream.order import TOTAL
from epochstream.retention import Retention
from epochstream.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow


@pytest.fixture
def pg():
    server = PostgresServer()
    yield server
    server.close()


def _outages(pg: PostgresServer, stop: threading.Event, rounds: int, rng: random.Random) -> list:
    """Kill (or stop immediately) the server ``rounds`` times at random moments, restarting
    it after 0.1-1.0 s each time; returns what was done."""
    done = []
    for _ in range(rounds):
        if stop.wait(rng.uniform(0.2, 0.8)):
            break
        how = rng.choice(["kill", "immediate"])
        if how == "kill":
            pg.kill()
        else:
            pg.stop("immediate")
        down = rng.uniform(0.1, 1.0)
        time.sleep(down)
        pg.start()
        done.append((how, round(down, 2)))
    return done


def test_operations_ride_out_server_crashes(pg):
    """Four threads write the way a publisher, its epoch log and two consumers do (frontier,
    index commits, durable acks, consumer-group fetch+ack) while the server is killed five
    times: no call fails, every index commit counts each epoch once, every ack is kept."""
    cat = Catalog(pg.url, timeout=20)
    cat.create_topic("t", partitions=1)
    inc = cat.register_partition("t", 0, "tcp://127.0.0.1:9")
    cat.history_begin("t", 0, "/tmp/es-pg-faults-log", [0], [0])
    cat.durable_claim("t", "d", "holder-1")
    cat.group_open("t", "g", mode="shared", ack_wait=30.0, max_deliver=5, dead_letter=None)
    stop = threading.Event()
    errors: list = []
    counts = {"upper": 0, "commit": 0, "ack": 0, "group": 0}

    def frontier():
        k = 0
        while not stop.is_set():
            k += 1
            assert cat.record_upper("t", 0, inc, [k])
            counts["upper"] = k

    def log():
        for e in range(10_000):
            if stop.is_set():
                return
            cat.history_commit("t", 0, epochs=[EpochRecord(0, e, 0, ((e * 10, 10),), 10, 1, e,
                                                           time.time())],
                               lower=[e + 1], upper=[e + 1], segment=0, committed=(e + 1) * 10)
            counts["commit"] = e + 1

    def acks():
        k = 0
        while not stop.is_set():
            k += 1
            assert cat.durable_ack("t", "d", "holder-1", [k])
            counts["ack"] = k

    def group():  # a worker's fetch (claim) and ack (settle) of epoch k, then k + 1, ...
        from epochstream.leases import WHOLE, plan

        k = 0
        while not stop.is_set():
            def decide(states, now, stored, k=k):  # as EpochGroup's: plan, then lease
                p = plan(TOTAL, "shared", [(k, WHOLE)], states, now=now, max_epochs=1,
                         max_deliver=5)
                return p, ((k,) if p.lease else None)
            claimed, _, _ = cat.group_claim("t", "g", "w", decide)
            assert [c.unit for c in claimed] == [(k, WHOLE)], (k, claimed)
            cat.group_settle("t", "g", claimed[0].unit, claimed[0].token, outcome="ack")
            k += 1
            counts["group"] = k

    def run(f):
        try:
            f()
        except BaseException as e:  # noqa: BLE001 - collected, asserted below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=run, args=(f,)) for f in (frontier, log, acks, group)]
    for th in threads:
        th.start()
    time.sleep(0.3)
    done = _outages(pg, stop, 5, random.Random(7))
    time.sleep(0.3)
    stop.set()
    for th in threads:
        th.join(60)
    assert errors == [], (done, errors)
    assert len(done) == 5 and min(counts.values()) > 0, (done, counts)
    state = cat.history_state("t", 0)
    indexed = cat.history_epochs("t", 0)
    assert len(indexed) == counts["commit"]
    assert state.segments[0].epochs == counts["commit"]  # each epoch counted once
    assert state.committed == counts["commit"] * 10
    assert cat.durable("t", "d").position == (counts["ack"],)
    assert cat.lookup("t").partition_info[0].upper == (counts["upper"],)
    # each epoch leased once and acked (acked ones behind the position are compacted away)
    assert cat.group_info("t", "g").position == (counts["group"] - 1,)
    assert [(e.time, e.state, e.deliveries) for e in cat.group_epochs("t", "g")] == \
        [(counts["group"] - 1, "acked", 1)]
    cat.close()


def test_a_publisher_with_history_keeps_publishing_through_crashes(pg, tmp_path):
    """A publisher with an epoch log on a PostgreSQL catalog sends 150 epochs while the server
    is killed three times: it never aborts, and a subscriber from ``earliest`` then gets every
    epoch once, whole, in order, from the log and the live stream."""
    url = pg.url
    stop = threading.Event()
    outages: list = []
    with Publisher("f", catalog=Catalog(url, timeout=20),
                   retention=Retention(dir=tmp_path / "log")) as pub:
        killer = threading.Thread(
            target=lambda: outages.extend(_outages(pg, stop, 3, random.Random(3))))
        killer.start()
        for e in range(150):
            pub.send(e, [{"e": e, "i": i} for i in range(3)])
            pub.advance_to(e + 1)
            time.sleep(0.01)
        stop.set()
        killer.join(60)
        got = []
        with Subscriber("f", catalog=url, start="earliest", wait=20) as sub:
            for epoch in sub.epochs(timeout=30):
                got.append((epoch.time, sorted(r["i"] for r in epoch.records)))
                if epoch.time == 149:
                    break
    assert outages, "the server was never killed"
    assert [t for t, _ in got] == list(range(150)), outages
    assert all(rs == [0, 1, 2] for _, rs in got)


def test_an_outage_longer_than_the_deadline_is_one_clear_error(pg):
    """Down for longer than ``timeout``: CatalogUnavailable naming the catalog (no password),
    after about ``timeout`` seconds; nothing half-applied; the next call after the restart
    works."""
    cat = Catalog(pg.url, timeout=1.0)
    cat.create_topic("t")
    pg.kill()
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable, match="cannot reach catalog postgresql://epochstream:\\*\\*\\*@") as info:
        cat.create_topic("u", partitions=2)
    assert 0.9 <= time.monotonic() - t0 < 5
    assert "epochstream:epochstream@" not in str(info.value)
    pg.start()
    assert [t.name for t in cat.topics()] == ["t"]
    cat.close()


def test_bad_urls_are_one_line_each(pg, tmp_path, monkeypatch):
    """A wrong password, a missing database, a URL scheme the catalog does not know: one clear
    line each, and nothing created anywhere (an unknown scheme used to become a directory)."""
    monkeypatch.chdir(tmp_path)
    wrong = pg.url.replace(":epochstream@", ":nope@")
    with pytest.raises(CatalogError, match="password authentication failed") as info:
        Catalog(wrong)
    assert "nope" not in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CatalogError, match='database "missing" does not exist'):
        Catalog(pg.url_of("missing"))
    for url in ("mysql://u@h/db", "s3://bucket/x", "http://h:1"):
        with pytest.raises(CatalogError, match="unknown catalog URL scheme"):
            Catalog(url)
    assert list(tmp_path.iterdir()) == []


def test_a_commit_whose_answer_is_lost_is_applied_once(pg_url, monkeypatch):
    """The worst moment of a crash: the transaction committed, its answer never arrived, the
    operation is retried. Each write finds its own effect: an index commit counts its epochs
    once, an ack is not refused as a lost lease, a registration does not take its own claim
    for another publisher's (each fails on the code before the retry-safe versions)."""
    from epochstream.catalog import store as store_mod

    lose = {"next": False, "lost": 0}

    def losing(real):  # the store's transaction (or atomic statement), its answer lost once
        return lambda self, synchronous=None: LoseAnswer(real(self, synchronous))

    class LoseAnswer:
        def __init__(s, cm):
            s.cm = cm

        def __enter__(s):
            return s.cm.__enter__()

        def __exit__(s, *exc):
            out = s.cm.__exit__(*exc)  # committed (or rolled back) for real
            if exc[0] is None and lose["next"]:
                lose["next"] = False
                lose["lost"] += 1
                raise store_mod.Transient("the answer of COMMIT was lost")
            return out

    write = losing(store_mod.PostgresStore.write)
    atomic = losing(store_mod.PostgresStore.atomic)

    monkeypatch.setattr(store_mod.PostgresStore, "write", write)
    monkeypatch.setattr(store_mod.PostgresStore, "hot_write", write)
    monkeypatch.setattr(store_mod.PostgresStore, "atomic", atomic)
    cat = Catalog(pg_url, timeout=10)
    cat.create_topic("t", partitions=1)
    cat.history_begin("t", 0, "/tmp/es-pg-lost-answer", [0], [0])
    cat.group_open("t", "g", mode="shared", ack_wait=30.0, max_deliver=5, dead_letter=None)

    lose["next"] = True
    inc = cat.register_partition("t", 0, "tcp://127.0.0.1:9")
    assert cat.lookup("t").partition_info[0].incarnation == inc
    lose["next"] = True
    cat.history_commit("t", 0, epochs=[EpochRecord(0, 0, 0, ((0, 10),), 10, 1, 0, time.time()),
                                       EpochRecord(0, 1, 0, ((10, 10),), 10, 1, 0, time.time())],
                       lower=[2], upper=[2], segment=0, committed=20)
    assert cat.history_state("t", 0).segments[0].epochs == 2
    assert len(cat.history_epochs("t", 0)) == 2

    def decide(states, now, stored):
        from epochstream.leases import WHOLE, plan
        from epochstream.order import TOTAL
        return plan(TOTAL, "shared", [(0, WHOLE), (1, WHOLE)], states, now=now, max_epochs=1,
                    max_deliver=5), stored
    lose["next"] = True  # the claim committed, its answer lost: the retry finds its lease
    claimed, _, _ = cat.group_claim("t", "g", "w", decide)
    assert [(c.unit[0], c.deliveries) for c in claimed] == [(0, 1)]
    lose["next"] = True
    cat.group_settle("t", "g", claimed[0].unit, claimed[0].token, outcome="ack")
    assert [e.state for e in cat.group_epochs("t", "g")][:1] == ["acked"]
    assert lose["lost"] == 4
    cat.close()


_FROZEN_WRITER = """
import os, signal, sys
from epochstream.catalog import store_postgres
from epochstream.catalog.retry import Transient
from epochstream.errors import CatalogError
store_postgres.IDLE_IN_TRANSACTION_S = float(sys.argv[2])
store = store_postgres.PostgresStore(sys.argv[1])
try:
    with store.write() as conn:  # holds the catalog's write lock
        conn.execute("UPDATE topics SET created_at = created_at WHERE name = 'x'")
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the transaction
        conn.execute("SELECT 1")
    print("committed", flush=True)
except (Transient, CatalogError) as e:
    print("ended", type(e).__name__, flush=True)
"""


def test_a_writer_stopped_inside_its_transaction_frees_the_write_lock(pg_url):
    """A process stopped (SIGSTOP) inside a catalog write transaction holds the catalog's write
    lock: the server ends its session once it was idle in the transaction for
    ``IDLE_IN_TRANSACTION_S`` (here 0.5 s), so the other processes' writes go on (before, every
    write of every process waited until it was continued or killed); continued, the stopped
    one's transaction fails as a transient error (retried by the catalog's operations), nothing
    of it applied."""
    import signal
    import subprocess
    import sys

    cat = Catalog(pg_url, timeout=10)
    cat.create_topic("x", partitions=1)
    child = subprocess.Popen([sys.executable, "-c", _FROZEN_WRITER, pg_url, "0.5"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().split() == ["locked"]
        done = threading.Event()
        writer = threading.Thread(target=lambda: (cat.create_topic("y", partitions=1),
                                                  done.set()), daemon=True)
        t0 = time.monotonic()
        writer.start()
        assert done.wait(10), "a write waited for the stopped process' lock"
        assert time.monotonic() - t0 < 5
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline().split() == ["ended", "Transient"]
        assert child.wait(10) == 0
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()
    assert sorted(t.name for t in cat.topics()) == ["x", "y"]
    cat.close()
