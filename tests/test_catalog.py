"""Tests of epochstream.catalog against real SQLite files and real processes (no mocks)."""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from epochstream.catalog import SCHEMA_VERSION, Catalog, PartitionInfo, TopicInfo, pid_alive
from epochstream.errors import CatalogError, PartitionHeld, TopicNotFound
from epochstream.order import TOTAL, product

# A publisher stand-in: registers a partition (after an optional delay), prints the outcome,
# then stays alive until its stdin is closed.
_PUBLISHER = textwrap.dedent("""
    import sys, time
    from epochstream.catalog import Catalog
    from epochstream.errors import PartitionHeld
    path, topic, partition, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    time.sleep(delay)
    cat = Catalog(path)
    try:
        inc = cat.register_partition(topic, partition, f"tcp://127.0.0.1:{5000 + partition}")
        print("won", inc, flush=True)
    except PartitionHeld as e:
        print("held", e, flush=True)
    sys.stdin.read()
""")


def _spawn(path, topic, partition=0, delay=0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _PUBLISHER, str(path), topic, str(partition), str(delay)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def cat(catalog_location) -> Catalog:
    """The catalog of a test: on SQLite, then on PostgreSQL (tests/conftest.py)."""
    c = Catalog(catalog_location)
    yield c
    c.close()


# ---- paths -----------------------------------------------------------------------------------


def test_default_path_is_under_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    monkeypatch.chdir(tmp_path)
    c = Catalog()
    assert c.path == tmp_path / ".epochstream" / "catalog.sqlite"
    assert c.path.is_file()


def test_env_var_overrides_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPOCHSTREAM_CATALOG", str(tmp_path / "elsewhere" / "x.sqlite"))
    c = Catalog()
    assert c.path == tmp_path / "elsewhere" / "x.sqlite"
    assert not (tmp_path / ".epochstream").exists()


def test_directory_path_gets_default_file_name(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    assert Catalog(existing).path == existing / "catalog.sqlite"
    assert Catalog(tmp_path / "new" / "dir").path == tmp_path / "new" / "dir" / "catalog.sqlite"
    assert Catalog(str(tmp_path / "f.sqlite")).path == tmp_path / "f.sqlite"


@pytest.fixture
def sqlite_cat(tmp_path) -> Catalog:
    """A catalog on SQLite only (a test that reads the file itself)."""
    return Catalog(tmp_path / "cat.sqlite")


def test_wal_mode_and_schema(sqlite_cat):
    cat = sqlite_cat
    conn = sqlite3.connect(cat.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 1
    finally:
        conn.close()
    assert {"topics", "partitions"} <= tables


def test_unopenable_path_raises_catalog_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CatalogError, match="cannot create catalog directory"):
        Catalog(blocker / "sub" / "cat.sqlite")


def test_not_a_database_raises_catalog_error(tmp_path):
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"this is definitely not sqlite" * 100)
    with pytest.raises(CatalogError, match="bogus.sqlite"):
        Catalog(bogus)


# ---- topics ----------------------------------------------------------------------------------


def test_create_topic_returns_info_and_is_idempotent(cat):
    info = cat.create_topic("flights", order=product(2), codec="arrow", partitions=3,
                            schema='{"fields": []}')
    assert info == TopicInfo("flights", "product(2)", "arrow", 3, '{"fields": []}', ())
    assert info.order is product(2)
    again = cat.create_topic("flights", order="product(2)", codec="arrow", partitions=3,
                             schema='{"fields": []}')
    assert again == info
    assert [t.name for t in cat.topics()] == ["flights"]


def test_create_topic_defaults(cat):
    info = cat.create_topic("t")
    assert (info.order_name, info.codec, info.partitions, info.schema) == ("total", "msgpack", 1, None)
    assert info.order is TOTAL


def test_conflicting_definition_names_both(cat):
    cat.create_topic("t", order="total", partitions=2)
    with pytest.raises(CatalogError) as ei:
        cat.create_topic("t", order="product(3)", partitions=2)
    msg = str(ei.value)
    assert "'t'" in msg and "'total'" in msg and "'product(3)'" in msg
    with pytest.raises(CatalogError, match="partitions=4"):
        cat.create_topic("t", partitions=4)
    with pytest.raises(CatalogError, match="schema"):
        cat.create_topic("t", partitions=2, schema="x")
    assert cat.lookup("t").order_name == "total"  # unchanged


@pytest.mark.parametrize("kwargs, match", [
    ({"partitions": 0}, "partitions must be an int >= 1"),
    ({"partitions": True}, "partitions must be an int >= 1"),
    ({"partitions": 1.5}, "partitions must be an int >= 1"),
    ({"order": "lexicographic"}, "unknown order"),
    ({"order": 42}, "order must be"),
    ({"codec": ""}, "codec"),
    ({"schema": {"a": 1}}, "schema must be a str"),
])
def test_create_topic_rejects_bad_arguments(cat, kwargs, match):
    with pytest.raises(CatalogError, match=match):
        cat.create_topic("t", **kwargs)
    assert cat.topics() == []


def test_topics_sorted_and_drop(cat):
    for name in ("b", "c", "a"):
        cat.create_topic(name)
    cat.register_partition("b", 0, "tcp://b")
    assert [t.name for t in cat.topics()] == ["a", "b", "c"]
    cat.drop_topic("b")
    assert [t.name for t in cat.topics()] == ["a", "c"]
    with pytest.raises(TopicNotFound):
        cat.lookup("b")
    # re-creating after a drop starts with no partitions registered
    assert cat.create_topic("b", partitions=2).partition_info == ()
    with pytest.raises(TopicNotFound) as ei:
        cat.drop_topic("zzz")
    assert ei.value.existing == ("a", "b", "c")


def test_lookup_unknown_lists_existing(cat):
    cat.create_topic("beta")
    cat.create_topic("alpha")
    t0 = time.monotonic()
    with pytest.raises(TopicNotFound) as ei:
        cat.lookup("gamma", wait=0.1)
    assert time.monotonic() - t0 >= 0.1
    assert ei.value.topic == "gamma"
    assert ei.value.existing == ("alpha", "beta")
    assert "alpha, beta" in str(ei.value)


def test_infos_are_frozen(cat):
    cat.create_topic("t")
    cat.register_partition("t", 0, "tcp://x")
    info = cat.lookup("t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "u"
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.partition_info[0].state = "closed"


# ---- partitions ------------------------------------------------------------------------------


def test_register_and_lookup(cat):
    cat.create_topic("t", partitions=2)
    before = time.time()
    inc0 = cat.register_partition("t", 0, "tcp://h:1", ingest="tcp://h:2")
    inc1 = cat.register_partition("t", 1, "tcp://h:3", incarnation="fixed")
    assert len(inc0) == 32 and inc1 == "fixed"
    info = cat.lookup("t")
    assert info.complete
    assert info.endpoints == ("tcp://h:1", "tcp://h:3")
    p0, p1 = info.partition_info
    assert (p0.index, p0.endpoint, p0.ingest, p0.state, p0.incarnation, p0.pid, p0.upper) == \
        (0, "tcp://h:1", "tcp://h:2", "live", inc0, os.getpid(), ())
    assert p0.alive and p1.alive
    assert before <= p0.updated_at <= time.time()
    assert p1.ingest is None


def test_register_unknown_topic_and_bad_index(cat):
    cat.create_topic("t", partitions=2)
    with pytest.raises(TopicNotFound) as ei:
        cat.register_partition("nope", 0, "tcp://x")
    assert ei.value.existing == ("t",)
    for bad in (2, -1, 10):
        with pytest.raises(CatalogError, match=r"has 2 partition\(s\)"):
            cat.register_partition("t", bad, "tcp://x")
    with pytest.raises(CatalogError, match="must be an int"):
        cat.register_partition("t", "0", "tcp://x")
    assert cat.lookup("t").partition_info == ()


def test_live_holder_in_this_process_refuses_other_incarnation(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://a")
    with pytest.raises(PartitionHeld, match=inc):
        cat.register_partition("t", 0, "tcp://b")
    # same incarnation may re-register (e.g. a new endpoint after a rebind)
    assert cat.register_partition("t", 0, "tcp://c", incarnation=inc) == inc
    assert cat.lookup("t").endpoints == ("tcp://c",)


def test_closed_partition_can_be_taken_over(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://a")
    cat.close_partition("t", 0, inc, upper=[7])
    new = cat.register_partition("t", 0, "tcp://b")
    p = cat.lookup("t").partition_info[0]
    assert (p.state, p.incarnation, p.upper, p.endpoint) == ("live", new, (), "tcp://b")


def test_close_partition_stores_upper_as_tuples(cat):
    cat.create_topic("p", order="product(2)")
    cat.create_topic("t")
    ip = cat.register_partition("p", 0, "tcp://p")
    it = cat.register_partition("t", 0, "tcp://t")
    assert cat.close_partition("p", 0, ip, upper=[(3, 1), [1, 4]]) is True
    cat.close_partition("t", 0, it, upper=(12,))
    p = cat.lookup("p").partition_info[0]
    assert p.state == "closed" and not p.alive
    assert p.upper == ((3, 1), (1, 4))
    assert all(isinstance(t, tuple) for t in p.upper)
    assert cat.lookup("t").partition_info[0].upper == (12,)


def test_close_with_wrong_incarnation_is_noop(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://a")
    assert cat.close_partition("t", 0, "someone-else", upper=[5]) is False
    p = cat.lookup("t").partition_info[0]
    assert (p.state, p.incarnation, p.upper) == ("live", inc, ())


def test_heartbeat_updates_updated_at(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://a")
    first = cat.lookup("t").partition_info[0].updated_at
    time.sleep(0.02)
    assert cat.heartbeat("t", 0, inc) is True
    second = cat.lookup("t").partition_info[0].updated_at
    assert second > first
    assert cat.heartbeat("t", 0, "stale") is False
    assert cat.lookup("t").partition_info[0].updated_at == second


def test_endpoints_raises_when_incomplete(cat):
    cat.create_topic("t", partitions=3)
    cat.register_partition("t", 1, "tcp://one")
    info = cat.lookup("t")
    assert not info.complete
    assert [p.index for p in info.partition_info] == [1]
    with pytest.raises(CatalogError, match=r"partition\(s\) \[0, 2\] of 3 not registered"):
        info.endpoints


def test_lookup_wait_returns_partial_after_timeout(cat):
    cat.create_topic("t", partitions=2)
    cat.register_partition("t", 1, "tcp://one")
    t0 = time.monotonic()
    info = cat.lookup("t", wait=0.1)
    elapsed = time.monotonic() - t0
    assert 0.1 <= elapsed < 2
    assert [p.index for p in info.partition_info] == [1]


def test_lookup_without_wait_returns_immediately(cat):
    cat.create_topic("t", partitions=2)
    t0 = time.monotonic()
    assert cat.lookup("t").partition_info == ()
    assert time.monotonic() - t0 < 0.2


def test_lookup_waits_for_topic_and_partitions_from_thread(cat):
    def later():
        time.sleep(0.15)
        cat.create_topic("t", partitions=2)
        cat.register_partition("t", 0, "tcp://0")
        time.sleep(0.1)
        cat.register_partition("t", 1, "tcp://1")

    th = threading.Thread(target=later)
    th.start()
    try:
        t0 = time.monotonic()
        info = cat.lookup("t", wait=5)
        assert time.monotonic() - t0 < 3
        assert info.endpoints == ("tcp://0", "tcp://1")
    finally:
        th.join()


# ---- liveness across processes ---------------------------------------------------------------


def test_pid_alive_basics():
    assert pid_alive(os.getpid())
    assert not pid_alive(0)
    assert not pid_alive(-5)
    # a pid that exists but started at another time was reused: dead
    assert pid_alive(os.getppid())
    start = psutil.Process(os.getppid()).create_time()
    assert pid_alive(os.getppid(), start)
    assert not pid_alive(os.getppid(), start - 1000)
    # processes on another host cannot be checked: assumed alive
    assert pid_alive(999_999_999, None, host="some-other-host")


def test_live_subprocess_holds_then_dead_one_is_replaced(tmp_path):
    path = tmp_path / "cat.sqlite"
    cat = Catalog(path)
    cat.create_topic("t")
    proc = _spawn(path, "t")
    try:
        outcome, inc = proc.stdout.readline().split()
        assert outcome == "won"
        p = cat.lookup("t").partition_info[0]
        assert (p.state, p.pid, p.incarnation) == ("live", proc.pid, inc) and p.alive
        with pytest.raises(PartitionHeld, match=f"pid {proc.pid}"):
            cat.register_partition("t", 0, "tcp://mine")
    finally:
        proc.kill()
        proc.wait()
    p = cat.lookup("t").partition_info[0]
    assert p.state == "dead" and not p.alive
    assert [t.partition_info[0].state for t in cat.topics()] == ["dead"]
    mine = cat.register_partition("t", 0, "tcp://mine")
    p = cat.lookup("t").partition_info[0]
    assert (p.state, p.pid, p.incarnation, p.endpoint) == ("live", os.getpid(), mine, "tcp://mine")


def test_zombie_holder_counts_as_dead(cat):
    cat.create_topic("t")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "child did not exit"
            time.sleep(0.01)
        cat.register_partition("t", 0, "tcp://z", pid=proc.pid)
        assert cat.lookup("t").partition_info[0].state == "dead"
        cat.register_partition("t", 0, "tcp://mine")  # not refused
    finally:
        proc.wait()


def test_exactly_one_of_racing_processes_wins(catalog_location):
    path = catalog_location  # on SQLite, then on PostgreSQL
    Catalog(path).create_topic("t")
    procs = [_spawn(path, "t") for _ in range(4)]
    try:
        outcomes = [p.stdout.readline().split()[0] for p in procs]
        assert sorted(outcomes) == ["held", "held", "held", "won"]
        winner = procs[outcomes.index("won")]
        assert Catalog(path).lookup("t").partition_info[0].pid == winner.pid
    finally:
        for p in procs:
            _finish(p)


def test_lookup_waits_for_a_publisher_process(tmp_path):
    path = tmp_path / "cat.sqlite"
    cat = Catalog(path)
    cat.create_topic("t", partitions=2)
    procs = [_spawn(path, "t", 0, 0.0), _spawn(path, "t", 1, 0.15)]
    try:
        info = cat.lookup("t", wait=10)
        assert info.complete
        assert [p.pid for p in info.partition_info] == [procs[0].pid, procs[1].pid]
        assert all(p.state == "live" for p in info.partition_info)
    finally:
        for p in procs:
            _finish(p)


def test_lookup_waits_for_dead_holder_to_be_replaced(tmp_path):
    path = tmp_path / "cat.sqlite"
    cat = Catalog(path)
    cat.create_topic("t")
    dead = _spawn(path, "t")
    assert dead.stdout.readline().startswith("won")
    dead.kill()
    dead.wait()
    # with no wait, the dead holder is reported as is
    assert cat.lookup("t").partition_info[0].state == "dead"
    fresh = _spawn(path, "t", 0, 0.1)
    try:
        info = cat.lookup("t", wait=10)
        assert info.partition_info[0].state == "live"
        assert info.partition_info[0].pid == fresh.pid
    finally:
        _finish(fresh)


def test_concurrent_threads_share_one_catalog(cat):
    cat.create_topic("t", partitions=16)
    errors = []

    def work(i):
        try:
            inc = cat.register_partition("t", i, f"tcp://h:{i}")
            cat.heartbeat("t", i, inc)
            cat.lookup("t")
            cat.close_partition("t", i, inc, upper=[i])
        except Exception as e:  # collected and asserted on below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    info = cat.lookup("t")
    assert [(p.index, p.state, p.upper) for p in info.partition_info] == \
        [(i, "closed", (i,)) for i in range(16)]


def test_partition_info_positional_fields():
    p = PartitionInfo(0, "tcp://x", None, "closed", "inc", 1, (), 0.0)
    assert not p.alive
    assert [f.name for f in dataclasses.fields(p)][:8] == [
        "index", "endpoint", "ingest", "state", "incarnation", "pid", "upper", "updated_at"]
    t = TopicInfo("t", "total", "msgpack", 1, None, (p,))
    assert t.endpoints == ("tcp://x",) and t.order is TOTAL


def test_catalog_path_attribute_is_path(sqlite_cat, tmp_path):
    cat = sqlite_cat
    assert isinstance(cat.path, Path) and cat.path == tmp_path / "cat.sqlite"


# ---- creation by many processes at once ------------------------------------------------------

_PEER = Path(__file__).with_name("catalog_peer.py")


def _open_new_catalog_at_once(root: Path, n: int, rounds: int) -> list[str]:
    """Run ``n`` peers (tests/catalog_peer.py) for ``rounds`` rounds; each round they all open
    the fresh catalog ``root/r<round>/cat.sqlite`` at the same instant. Returns the failures."""
    procs = [subprocess.Popen([sys.executable, str(_PEER), str(root), str(rounds), str(n), str(i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    failures = []
    try:
        for r in range(rounds):
            for p in procs:
                assert p.stdout.readline().split() == ["ready", str(r)]
            start = time.time() + 0.02  # every peer sleeps until the same instant
            for p in procs:
                p.stdin.write(f"go {start!r}\n")
                p.stdin.flush()
            for i, p in enumerate(procs):
                _, rr, outcome, *error = p.stdout.readline().strip().split(maxsplit=3)
                assert rr == str(r)
                if outcome != "ok":
                    failures.append(f"round {r}, process {i}: {' '.join(error)}")
        for p in procs:
            assert p.wait(10) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return failures


def test_many_processes_create_the_same_new_catalog_at_once(tmp_path):
    """8 processes open the same *new* catalog file at the same instant, then create a topic and
    register one partition each; repeated on 30 fresh files. Before the fix, switching the new
    file to WAL mode failed at once with ``database is locked`` in 3 to 14 of the 30 rounds
    (8 runs on 2 cores); the deterministic form is the next test."""
    n, rounds = 8, 30
    failures = _open_new_catalog_at_once(tmp_path, n, rounds)
    assert failures == [], f"{len(failures)} of {n * rounds} opens failed: {failures[:5]}"
    for r in range(rounds):
        info = Catalog(tmp_path / f"r{r}" / "cat.sqlite").lookup("t")
        assert [p.index for p in info.partition_info] == list(range(n))


def test_new_catalog_waits_for_a_writer_holding_the_new_file(tmp_path):
    """Deterministic form of the race above: another connection holds the write lock of the new
    (not yet WAL) file. Switching to WAL then fails at once with ``database is locked`` -- SQLite
    does not call the busy handler for it -- unless the switch is retried; with the fix, Catalog
    waits until the writer is done (0.3 s here) and succeeds."""
    path = tmp_path / "cat.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    t0 = time.monotonic()
    try:
        cat = Catalog(path)
        waited = time.monotonic() - t0
    finally:
        release.join()
        other.close()
    assert 0.25 <= waited < 4
    cat.create_topic("t")
    assert cat.lookup("t").partition_info == ()


def test_writer_holding_a_new_file_too_long_is_reported(tmp_path, monkeypatch):
    """The retries stop at the busy timeout with a CatalogError naming the file."""
    from epochstream.catalog import sqlcatalog, store

    monkeypatch.setattr(sqlcatalog, "BUSY_TIMEOUT_S", 0.3)
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.3)
    path = tmp_path / "cat.sqlite"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        with pytest.raises(CatalogError, match=r"cat\.sqlite.*(WAL|locked)"):
            Catalog(path)
        assert 0.25 <= time.monotonic() - t0 < 3
    finally:
        other.execute("ROLLBACK")
        other.close()


# ---- schema version and migration --------------------------------------------------------------

# The DDL of catalog files written before schema versioning (user_version 0), verbatim.
_OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name        TEXT PRIMARY KEY,
    order_name  TEXT NOT NULL,
    codec       TEXT NOT NULL,
    partitions  INTEGER NOT NULL CHECK (partitions >= 1),
    schema      TEXT,
    created_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS partitions (
    topic       TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
    idx         INTEGER NOT NULL CHECK (idx >= 0),
    endpoint    TEXT NOT NULL,
    ingest      TEXT,
    state       TEXT NOT NULL CHECK (state IN ('live', 'closed')),
    incarnation TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    pid_start   REAL,
    host        TEXT,
    upper       TEXT NOT NULL DEFAULT '[]',
    updated_at  REAL NOT NULL,
    PRIMARY KEY (topic, idx)
);
"""


def _old_catalog(path: Path, t: str = "t") -> None:
    """An old-schema catalog: topic ``t`` (3 partitions: 0 live in this process, 1 closed, 2 not
    registered) and topic ``u`` (1 partition, live)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_OLD_SCHEMA)
        conn.execute("INSERT INTO topics VALUES (?, 'product(2)', 'arrow', 3, 'S', 1.0)", (t,))
        conn.execute("INSERT INTO topics VALUES ('u', 'total', 'msgpack', 1, NULL, 2.0)")
        start = psutil.Process(os.getpid()).create_time()
        conn.execute("INSERT INTO partitions VALUES (?, 0, 'tcp://a', 'tcp://i', 'live', 'i0', "
                     "?, ?, ?, '[]', 10.0)", (t, os.getpid(), start, socket.gethostname()))
        conn.execute("INSERT INTO partitions VALUES (?, 1, 'tcp://b', NULL, 'closed', 'i1', "
                     "?, ?, ?, '[[3, 1], [1, 4]]', 11.0)",
                     (t, os.getpid(), start, socket.gethostname()))
        conn.execute("INSERT INTO partitions VALUES ('u', 0, 'tcp://c', NULL, 'live', 'i2', "
                     "?, ?, ?, '[]', 12.0)", (os.getpid(), start, socket.gethostname()))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    finally:
        conn.close()


def test_old_catalog_file_is_migrated_keeping_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_catalog(path)
    cat = Catalog(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'partitions'").fetchone()[0]
        assert "'aborted'" in ddl
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"topics", "partitions", "history_partitions", "history_segments",
                          "history_epochs", "durables", "groups",
                          "group_epochs", "grants", "retention_leases",
                          "retention_limits"}  # no leftover of the rebuild
        fks = conn.execute("PRAGMA foreign_key_list(partitions)").fetchall()
        assert [(fk[2], fk[3], fk[4], fk[6]) for fk in fks] == \
            [("topics", "topic", "name", "CASCADE")]
    finally:
        conn.close()
    t = cat.lookup("t")
    assert (t.order_name, t.codec, t.partitions, t.schema) == ("product(2)", "arrow", 3, "S")
    rows = [(p.index, p.endpoint, p.ingest, p.state, p.incarnation, p.pid, p.upper, p.updated_at,
             p.host) for p in t.partition_info]
    host = socket.gethostname()
    assert rows == [(0, "tcp://a", "tcp://i", "live", "i0", os.getpid(), (), 10.0, host),
                    (1, "tcp://b", None, "closed", "i1", os.getpid(), ((3, 1), (1, 4)), 11.0, host)]
    assert t.partition_info[0].alive
    # the new state is accepted now (the old CHECK constraint refused it)
    assert cat.close_partition("t", 0, "i0", upper=[(5, 5)], aborted=True) is True
    assert cat.lookup("t").partition_info[0].state == "aborted"
    # the foreign key still cascades; the other topic is untouched
    cat.drop_topic("t")
    assert [(t.name, [p.incarnation for p in t.partition_info]) for t in cat.topics()] == \
        [("u", ["i2"])]
    # opening again changes nothing
    assert Catalog(path).lookup("u").partition_info[0].updated_at == 12.0


def test_old_catalog_opened_by_many_processes_at_once(tmp_path):
    """Every process sees version 0 and races to migrate: exactly one does, all succeed."""
    root = tmp_path / "r0"
    root.mkdir()
    _old_catalog(root / "cat.sqlite", t="old")
    failures = _open_new_catalog_at_once(tmp_path, 6, 1)  # round 0 opens root: the old file
    assert failures == []
    conn = sqlite3.connect(root / "cat.sqlite")
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'partitions'").fetchone()[0]
        assert "'aborted'" in ddl
    finally:
        conn.close()
    cat = Catalog(root / "cat.sqlite")
    assert [t.name for t in cat.topics()] == ["old", "t", "u"]
    assert [p.incarnation for p in cat.lookup("old").partition_info] == ["i0", "i1"]
    assert [p.index for p in cat.lookup("t").partition_info] == list(range(6))


def test_catalog_of_a_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    Catalog(path)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(CatalogError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Catalog(path)


# ---- upper frontiers and the aborted state -------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid no longer exists
    return proc.pid


def test_register_partition_stores_given_upper(cat):
    cat.create_topic("p", order="product(2)")
    cat.create_topic("t", partitions=2)
    cat.register_partition("p", 0, "tcp://p", upper=[(2, 0), [0, 3]])
    cat.register_partition("t", 0, "tcp://t0", upper=(7,))
    cat.register_partition("t", 1, "tcp://t1")  # default: nothing sent yet
    assert cat.lookup("p").partition_info[0].upper == ((2, 0), (0, 3))
    assert [p.upper for p in cat.lookup("t").partition_info] == [(7,), ()]


@pytest.mark.parametrize("bad", [[1.5], ["3"], [(1, "x")], 7, [None]])
def test_bad_upper_is_a_catalog_error(cat, bad):
    cat.create_topic("t")
    with pytest.raises(CatalogError, match="upper must be"):
        cat.register_partition("t", 0, "tcp://t", upper=bad)
    assert cat.lookup("t").partition_info == ()
    inc = cat.register_partition("t", 0, "tcp://t", upper=[1])
    with pytest.raises(CatalogError, match="upper must be"):
        cat.record_upper("t", 0, inc, bad)
    with pytest.raises(CatalogError, match="upper must be"):
        cat.close_partition("t", 0, inc, upper=bad)
    p = cat.lookup("t").partition_info[0]
    assert (p.state, p.upper) == ("live", (1,))


def test_record_upper_moves_the_stored_upper_while_live(cat):
    cat.create_topic("p", order="product(2)")
    inc = cat.register_partition("p", 0, "tcp://p")
    before = cat.lookup("p").partition_info[0].updated_at
    time.sleep(0.02)
    assert cat.record_upper("p", 0, inc, [(1, 0)]) is True
    assert cat.record_upper("p", 0, inc, [(2, 0), [0, 5]]) is True
    p = cat.lookup("p").partition_info[0]
    assert (p.state, p.upper) == ("live", ((2, 0), (0, 5)))
    assert p.updated_at > before
    # another Catalog object (another connection) sees it too, as does a fresh process' view
    assert Catalog(cat.path).lookup("p").partition_info[0].upper == ((2, 0), (0, 5))


def test_record_upper_after_replacement_is_a_noop(cat):
    cat.create_topic("t")
    old = cat.register_partition("t", 0, "tcp://old", pid=_dead_pid())
    assert cat.record_upper("t", 0, old, [4]) is True
    assert cat.lookup("t").partition_info[0].state == "dead"
    new = cat.register_partition("t", 0, "tcp://new", upper=[9])  # replaces the dead holder
    updated_at = cat.lookup("t").partition_info[0].updated_at
    assert cat.record_upper("t", 0, old, [100]) is False
    p = cat.lookup("t").partition_info[0]
    assert (p.incarnation, p.upper, p.updated_at) == (new, (9,), updated_at)
    assert cat.record_upper("t", 0, new, [10]) is True
    assert cat.lookup("t").partition_info[0].upper == (10,)
    # unknown topic / partition: nothing to update
    assert cat.record_upper("nope", 0, new, [1]) is False
    assert cat.record_upper("t", 1, new, [1]) is False


def test_record_upper_after_close_is_a_noop(cat):
    cat.create_topic("t", partitions=2)
    a = cat.register_partition("t", 0, "tcp://a")
    b = cat.register_partition("t", 1, "tcp://b")
    cat.close_partition("t", 0, a, upper=[5])
    cat.close_partition("t", 1, b, upper=[6], aborted=True)
    assert cat.record_upper("t", 0, a, [50]) is False
    assert cat.record_upper("t", 1, b, [60]) is False
    assert [(p.state, p.upper) for p in cat.lookup("t").partition_info] == \
        [("closed", (5,)), ("aborted", (6,))]


def test_upper_of_a_dead_partition_is_the_last_recorded(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://x", pid=_dead_pid(), upper=[1])
    cat.record_upper("t", 0, inc, [3])
    p = cat.lookup("t").partition_info[0]
    assert (p.state, p.upper) == ("dead", (3,))


def test_aborted_state_round_trips(cat):
    cat.create_topic("p", order="product(2)", partitions=2)
    inc = cat.register_partition("p", 0, "tcp://a")
    cat.register_partition("p", 1, "tcp://b")
    assert cat.close_partition("p", 0, inc, upper=[(3, 1), [1, 4]], aborted=True) is True
    p = cat.lookup("p").partition_info[0]
    assert (p.state, p.upper, p.incarnation) == ("aborted", ((3, 1), (1, 4)), inc)
    assert not p.alive
    assert [t.partition_info[0].state for t in cat.topics()] == ["aborted"]
    # stored as 'aborted', not 'closed'
    with cat._store.read() as conn:
        assert tuple(conn.execute("SELECT state FROM partitions WHERE idx = 0").fetchone()) == (
            "aborted",)
    # a wrong incarnation does not abort
    assert cat.close_partition("p", 1, "someone-else", aborted=True) is False
    assert cat.lookup("p").partition_info[1].state == "live"
    # aborted is final, like closed: lookup does not wait for it to be replaced ...
    t0 = time.monotonic()
    assert cat.lookup("p", wait=5).partition_info[0].state == "aborted"
    assert time.monotonic() - t0 < 2
    # ... but a new publisher may take the partition over
    new = cat.register_partition("p", 0, "tcp://c")
    p = cat.lookup("p").partition_info[0]
    assert (p.state, p.incarnation, p.upper) == ("live", new, ())


def test_aborted_by_a_process_that_is_gone_stays_aborted(cat):
    cat.create_topic("t")
    inc = cat.register_partition("t", 0, "tcp://x", pid=_dead_pid())
    assert cat.lookup("t").partition_info[0].state == "dead"
    cat.close_partition("t", 0, inc, upper=[2], aborted=True)
    assert cat.lookup("t").partition_info[0].state == "aborted"


def test_topics_command_shows_aborted(cat):
    from typer.testing import CliRunner

    from epochstream.cli import app

    cat.create_topic("t", partitions=2)
    inc = cat.register_partition("t", 0, "tcp://127.0.0.1:7100")
    cat.register_partition("t", 1, "tcp://127.0.0.1:7101")
    cat.close_partition("t", 0, inc, upper=[1], aborted=True)
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}).invoke(
        app, ["topics", "--catalog", str(cat.path)])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "tcp://127.0.0.1:71" in line]
    assert len(rows) == 2 and "aborted" in rows[0] and "live" in rows[1]


def test_record_upper_in_threads_and_a_forked_child(cat):
    """record_upper keeps one connection per thread, and a fresh one in a forked child."""
    cat.create_topic("t", partitions=4)
    incs = [cat.register_partition("t", i, f"tcp://h:{i}") for i in range(4)]
    cat.record_upper("t", 0, incs[0], [1])  # opens this thread's connection before the fork
    errors = []

    def work(i):
        try:
            for k in range(50):
                assert cat.record_upper("t", i, incs[i], [k])
        except Exception as e:  # collected and asserted on below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    store = cat._store
    inherited = store._local.conn if cat.store == "sqlite" else list(store._idle)
    assert inherited
    pid = os.fork()  # no other thread of this test is running now
    if pid == 0:  # child: must open its own connection, never use the parent's
        code = 1
        try:
            code = 0 if cat.record_upper("t", 3, incs[3], [77]) else 2
            if cat.store == "sqlite" and store._local.conn is inherited:
                code = 3
            if cat.store == "postgresql" and set(map(id, store._idle)) & set(map(id, inherited)):
                code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cat.record_upper("t", 0, incs[0], [2])  # the parent's connection still works
    assert [p.upper for p in cat.lookup("t").partition_info] == [(2,), (49,), (49,), (77,)]


def test_a_waiting_lookup_is_woken_by_postgres_notify(pg_url):
    """On PostgreSQL a waiter sleeps on LISTEN/NOTIFY (polling once a second as the fallback,
    store.POSTGRES_POLL_S): a registration wakes a waiting lookup at once, not at the next
    poll. Five rounds; each must be woken well before the fallback poll could."""
    from epochstream.catalog import store

    assert store.POSTGRES_POLL_S >= 1.0
    cat = Catalog(pg_url)
    cat.create_topic("w", partitions=5)
    woken = []
    for p in range(5):
        other = Catalog(pg_url)
        registered: list = []

        def register():
            time.sleep(0.3)
            registered.append(time.monotonic())
            other.register_partition("w", p, f"tcp://h:{p}")
        th = threading.Thread(target=register)
        th.start()
        info = cat.lookup("w", wait=10) if p == 4 else None
        if p < 4:  # waiting for partition p to be registered: poll the topic until it is
            while len(cat.lookup("w").partition_info) <= p:
                cat.lookup("w", wait=0.0)
                with cat._store.waker("w") as waker:
                    waker.wait(5.0)
        th.join()
        woken.append(time.monotonic() - registered[0])
        other.close()
    assert info is not None and info.complete
    assert max(woken) < 0.5, woken  # (a lost notification would take up to 1 s)


def test_a_waiting_lookup_does_not_poll_postgres_every_50_ms(pg_url, postgres):
    """A lookup waiting 2 s for a topic that does not come reads the catalog about twice (the
    once-a-second fallback), not forty times (SQLite's 50 ms poll): counted in the server's own
    statistics of committed transactions of the database. Each new session also commits its
    set-up (``idle_in_transaction_session_timeout``, catalog/store_postgres.py), so the bound
    is 20: half of what a 50 ms poll would make."""
    import psycopg

    cat = Catalog(pg_url)
    db = pg_url.rsplit("/", 1)[1]

    def commits() -> int:
        with psycopg.connect(postgres.admin_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                                (db,)).fetchone()[0]
    cat.create_topic("other")
    before = commits()
    with pytest.raises(TopicNotFound):
        cat.lookup("never", wait=2.0)
    time.sleep(0.6)  # the statistics collector's delay (stats_fetch_consistency, flushes)
    assert commits() - before <= 20, "the waiter polled the database"
    cat.close()
