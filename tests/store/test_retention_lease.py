"""Retention by a lease holder (issue 23): the catalog's retention lease (SQLite, PostgreSQL and
the network catalog), its holders (a publisher, ``epochstream retention run``) racing, and a
runner killed with SIGKILL mid-deletion. Real processes, a ``file://`` store and SeaweedFS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochstream import Catalog, History, Publisher, Retention
from epochstream.errors import Fenced, HistoryUnavailable
from peer_processes import kill, read_until


def _log(cat, topic="t"):
    cat.create_topic(topic)
    cat.history_begin(topic, 0, "/tmp/nowhere-lease", [0], [])


def test_the_lease_has_one_holder_until_it_lapses(catalog_location):
    """Taken by one holder, refused to another (naming the holder) until it lapses on the
    catalog's clock; renewed by its holder; released; recorded limits read back."""
    cat = Catalog(catalog_location)
    _log(cat)
    assert cat.retention_acquire("t", 0, "a", lease=0.5) == (True, "a")
    ok, who = cat.retention_acquire("t", 0, "b", lease=30)
    assert not ok and who.startswith("a (pid ") and "lease 0.5 s" in who
    assert cat.retention_acquire("t", 0, "a", lease=0.5)[0]  # renewed
    time.sleep(0.7)
    assert cat.retention_acquire("t", 0, "b", lease=30) == (True, "b")  # lapsed: taken
    assert not cat.retention_acquire("t", 0, "a", lease=0.5)[0]
    assert not cat.retention_release("t", 0, "a") and cat.retention_release("t", 0, "b")
    assert cat.retention_acquire("t", 0, "b", lease=30)[0]
    cat.drop_topic("t")  # the lease and the limits go with the topic
    _log(cat)
    assert cat.retention_acquire("t", 0, "a", lease=30)[0]
    assert cat.retention_acquire("nope", 0, "a", lease=30) == \
        (False, "nobody: the topic does not exist")
    assert cat.retention_limits("t") is None
    cat.retention_record("t", {"max_bytes": 10, "max_age": 1.5, "max_epochs": None})
    assert cat.retention_limits("t") == {"max_bytes": 10, "max_age": 1.5, "max_epochs": None}
    with pytest.raises(Exception, match="must be a number"):
        cat.retention_record("t", {"max_bytes": -1})
    with pytest.raises(Exception, match="lease"):
        cat.retention_acquire("t", 0, "a", lease=-1)


def test_a_trim_without_the_lease_is_fenced_and_changes_nothing(catalog_location):
    cat = Catalog(catalog_location)
    _log(cat)
    cat.history_commit("t", 0, epochs=[], lower=[1], upper=[], segment=0, committed=0,
                       roll_to=1)
    before = cat.history_state("t", 0)
    with pytest.raises(Fenced, match="does not hold the retention lease .held by nobody"):
        cat.history_trim("t", 0, 1, "x")
    cat.retention_acquire("t", 0, "a", lease=30)
    with pytest.raises(Fenced, match="held by a "):
        cat.history_trim("t", 0, 1, "x")
    assert cat.history_state("t", 0) == before
    since, _ = cat.history_trim("t", 0, 1, "a")
    assert since == (1,)


def test_a_dead_holder_on_this_host_loses_the_lease_at_once(tmp_path):
    """The same-host fast path: a holder whose process is gone holds nothing, whatever its
    lease (as a partition's row, catalog/holders.py)."""
    cat = Catalog(tmp_path / "cat")
    _log(cat)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert cat.retention_acquire("t", 0, "other", lease=600, pid=p.pid)[0]
        assert not cat.retention_acquire("t", 0, "me", lease=30)[0]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert cat.retention_acquire("t", 0, "me", lease=30) == (True, "me")


def test_the_network_catalog_grants_the_lease(tmp_path):
    from epochstream.catalog.server import CatalogServer

    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        cat = Catalog(srv.endpoint)
        _log(cat)
        assert cat.retention_acquire("t", 0, "a", lease=30) == (True, "a")
        ok, who = cat.retention_acquire("t", 0, "b", lease=30)
        assert not ok and f"pid {os.getpid()}" in who
        with pytest.raises(Fenced):
            cat.history_trim("t", 0, 0, "b")
        cat.retention_record("t", {"max_epochs": 3})
        assert cat.retention_limits("t") == {"max_bytes": None, "max_age": None,
                                             "max_epochs": 3}
        assert cat.retention_release("t", 0, "a")
        # the runner through the service: the index trimmed there, the objects here
        store = f"file://{tmp_path / 'shared'}"
        with Publisher("net", catalog=cat, retention=Retention(
                dir=tmp_path / "logs", store=store, segment_bytes=4096, max_bytes=None,
                max_age=None)) as pub:
            for t in range(4):
                pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
                pub.advance_to(t + 1)
        pub.join(30)
        p = subprocess.run([sys.executable, "-m", "epochstream", "retention", "run", "net",
                            "--catalog", srv.endpoint, "--max-epochs", "1"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "3 segment(s) deleted from the index, 3 object(s)" in p.stdout, p.stdout
        assert store_objects(tmp_path / "shared") == indexed(cat, "net")
        cat.close()


# ---- epochstream retention run: real processes ------------------------------------------------

PEER = str(Path(__file__).with_name("store_peer.py"))


def peer(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PEER, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)


def retention_run(cat, topic, *args, wait=True):
    cmd = [sys.executable, "-m", "epochstream", "retention", "run", topic, "--catalog", str(cat),
           *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def store_objects(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*.eslog")}


def indexed(cat, topic) -> set:
    return {g.object for g in cat.history_state(topic, 0).segments if g.object}


def closed_log(tmp_path, epochs=8, store=None, **limits) -> tuple:
    """A closed topic ``t`` whose log has one sealed segment per epoch in a file:// store (or
    ``store``), all uploaded; its publisher recorded ``limits`` (default: none at all)."""
    cat = Catalog(tmp_path / "cat")
    store = store or f"file://{tmp_path / 'shared'}"
    limits = {"max_bytes": None, "max_age": None, **limits}
    with Publisher("t", catalog=cat, retention=Retention(
            dir=tmp_path / "logs", store=store, segment_bytes=4096, **limits)) as pub:
        for t in range(epochs):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
    pub.join(30)
    return cat, store


def test_retention_run_applies_the_recorded_limits_index_then_store(tmp_path):
    """A closed topic: the runner applies the limits its publisher recorded (max_age), the
    index rows and the objects go, the store keeps exactly the indexed objects, a reader gets
    the rest whole; without limits recorded or given it refuses (status 2), an unknown topic
    too."""
    cat, _ = closed_log(tmp_path, max_age=1.0)
    assert cat.retention_limits("t") == {"max_bytes": None, "max_age": 1.0, "max_epochs": None}
    root = tmp_path / "shared"
    assert len(store_objects(root)) == 8 and store_objects(root) == indexed(cat, "t")
    time.sleep(1.2)
    p = retention_run(tmp_path / "cat", "t")
    assert p.returncode == 0, p.stderr
    assert "t partition 0: " in p.stdout and "deleted from the index" in p.stdout, p.stdout
    left = indexed(cat, "t")
    assert store_objects(root) == left and len(left) < 8
    times = [e.time for e in History("t", catalog=cat, source="store").epochs()]
    assert times == list(range(8 - len(times), 8))
    assert cat.retention_acquire("t", 0, "after", lease=30)[0]  # released at the end
    cat.retention_release("t", 0, "after")
    p = retention_run(tmp_path / "cat", "nope")
    assert p.returncode == 2 and "unknown topic 'nope'" in p.stderr, p.stderr
    cat.retention_record("t", {"max_bytes": None, "max_age": None, "max_epochs": None})
    p = retention_run(tmp_path / "cat", "t")
    assert p.returncode == 2 and "no retention limits recorded" in p.stderr, p.stderr
    p = retention_run(tmp_path / "cat", "t", "--once", "--interval", 1)
    assert p.returncode == 2 and "exclude each other" in p.stderr, p.stderr
    cat.create_topic("bare")
    p = retention_run(tmp_path / "cat", "bare", "--max-epochs", 1)
    assert p.returncode == 2 and "keeps no epoch log" in p.stderr, p.stderr


def test_a_live_publisher_holds_the_lease_and_the_runner_refuses(tmp_path):
    """While the topic's publisher runs (another process) the runner is refused, status 1,
    naming the holder, nothing deleted; once the publisher is killed -9 on this host its lease
    is gone at once and the runner applies the limits given as options."""
    cat, store = closed_log(tmp_path)
    before = cat.history_state("t", 0)
    pub = peer("publish", tmp_path / "cat", "t", store, "--dir", tmp_path / "logs",
               "--first", 8, "--last", 9, "--keep-all")
    try:
        read_until(pub, "hanging")
        p = retention_run(tmp_path / "cat", "t", "--max-epochs", 2)
        assert p.returncode == 1, p.stderr
        assert "the retention lease is held by publisher:" in p.stderr, p.stderr
        assert cat.history_state("t", 0).segments[0] == before.segments[0]
    finally:
        kill(pub)
    p = retention_run(tmp_path / "cat", "t", "--max-epochs", 2)
    assert p.returncode == 0, p.stderr
    assert [e.time for e in History("t", catalog=cat).epochs()][-1] == 8


def test_a_runner_and_a_publisher_race_for_the_lease_one_deletes(tmp_path):
    """A runner (``--max-epochs 3``) and a publisher (max_epochs=3, which applies it when it
    opens the log) start at once on a closed log of 8 epochs: exactly one deletes — the other
    is refused while the first holds the lease (the runner: status 1; the publisher leaves
    retention to the holder), or comes after it and finds nothing beyond the limits — and the
    store ends with exactly the indexed objects."""
    cat, store = closed_log(tmp_path)
    pub = peer("publish", tmp_path / "cat", "t", store, "--dir", tmp_path / "logs", "--first",
               8, "--last", 8, "--max-epochs", 3, "--keep-all", "--end", "close")
    run = retention_run(tmp_path / "cat", "t", "--max-epochs", 3, wait=False)
    r_out, r_err = run.communicate(timeout=60)
    p_out, p_err = pub.communicate(timeout=60)
    assert pub.returncode == 0 and "closed" in p_out, p_err
    runner_deleted = run.returncode == 0 and "deleted from the index" in r_out
    publisher_deleted = "retention deleted" in p_err
    if run.returncode == 1:
        assert "the retention lease is held by publisher:" in r_err, r_err
    else:
        assert run.returncode == 0, r_err
    assert runner_deleted != publisher_deleted, (r_out, r_err, p_err)
    assert len(indexed(cat, "t")) == 3
    assert store_objects(tmp_path / "shared") == indexed(cat, "t")


def _reader(cat, stop, seen, bad):
    while not stop.is_set():
        try:
            for e in History("t", catalog=cat, source="store").epochs():
                ok = all(r["t"] == e.time and len(r["pad"]) == 5000 for r in e.records)
                seen.append(e.time) if ok and e.records else bad.append(e.time)
        except HistoryUnavailable:
            seen.append("unavailable")
        except Exception as e:  # noqa: BLE001 - reported by the test
            bad.append(repr(e))


def test_a_runner_killed_mid_deletion_leaves_objects_the_next_one_removes(weed, tmp_path):
    """On SeaweedFS: a runner killed -9 as soon as its trim reached the index leaves every
    indexed object in place (index rows first, objects after); a concurrent History reader
    never gets part of an epoch; the next runner takes the dead runner's lease at once and
    deletes the objects left behind. Then, deterministically, the state a runner killed exactly
    between the two steps leaves (index trimmed by a holder that died, objects all there) is
    cleaned the same way."""
    import uuid

    store = weed.uri(f"lease/{uuid.uuid4().hex[:8]}")
    cat, _ = closed_log(tmp_path, epochs=24, store=store)
    fs = weed.filesystem()
    bucket_root = store.split("://", 1)[1].split("?", 1)[0]

    def objects() -> set:
        import pyarrow.fs as pafs
        sel = pafs.FileSelector(bucket_root, recursive=True, allow_not_found=True)
        return {i.path[len(bucket_root) + 1:] for i in fs.get_file_info(sel)
                if i.path.endswith(".eslog")}

    assert objects() == indexed(cat, "t") and len(objects()) == 24
    stop, seen, bad = threading.Event(), [], []
    reader = threading.Thread(target=_reader, args=(cat, stop, seen, bad), daemon=True)
    reader.start()
    env = {**os.environ, **weed.env()}
    run = subprocess.Popen([sys.executable, "-m", "epochstream", "retention", "run", "t",
                            "--catalog", str(tmp_path / "cat"), "--max-epochs", "12"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 30
    while cat.history_state("t", 0).since == (0,) and time.monotonic() < deadline:
        time.sleep(0.002)
    run.send_signal(signal.SIGKILL)
    run.wait(10)
    assert indexed(cat, "t") <= objects()  # no indexed object deleted before its row
    left = len(objects() - indexed(cat, "t"))  # (12 here: killed right after the trim)
    again = subprocess.run([sys.executable, "-m", "epochstream", "retention", "run", "t",
                            "--catalog", str(tmp_path / "cat"), "--max-epochs", "12"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0, again.stderr
    assert f"{left} left-over object(s)" in again.stdout or left == 0, again.stdout
    assert objects() == indexed(cat, "t")
    # the state exactly between the two steps: a holder (dead now) trimmed the index only
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert cat.retention_acquire("t", 0, "doomed", lease=600, pid=dead.pid)[0]
    state = cat.history_state("t", 0)
    cat.history_trim("t", 0, state.segments[4].seq, "doomed")
    kill(dead)
    assert len(objects() - indexed(cat, "t")) == 4
    again = subprocess.run([sys.executable, "-m", "epochstream", "retention", "run", "t",
                            "--catalog", str(tmp_path / "cat"), "--max-epochs", "12"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "4 left-over object(s)" in again.stdout, again.stdout
    assert objects() == indexed(cat, "t")
    stop.set()
    reader.join(30)
    assert not bad, bad
    assert seen


def test_retention_run_with_an_interval_holds_the_lease_until_sigterm(tmp_path):
    """``--interval``: the runner applies the age limit as epochs age while it runs, keeps the
    lease (renewed every third of ``--lease``) against another runner, and releases it at
    SIGTERM (status 0)."""
    cat, _ = closed_log(tmp_path, max_age=1.0)
    run = retention_run(tmp_path / "cat", "t", "--interval", 0.2, "--lease", 2, wait=False)
    try:
        deadline = time.monotonic() + 20
        while len(indexed(cat, "t")) == 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(indexed(cat, "t")) < 8
        time.sleep(2.2)  # past one lease: renewed meanwhile
        other = retention_run(tmp_path / "cat", "t")
        assert other.returncode == 1 and "held by retention-run:" in other.stderr, other.stderr
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=30)
    assert run.returncode == 0, err
    assert store_objects(tmp_path / "shared") == indexed(cat, "t")
    assert cat.retention_acquire("t", 0, "next", lease=30)[0]


def test_a_publisher_without_the_lease_deletes_nothing(tmp_path, caplog):
    """Another live holder has the lease (here: a runner of this process): the publisher
    applies no limit — no index row, no object, no file goes — and says who holds it; it
    records its limits all the same."""
    import logging

    cat = Catalog(tmp_path / "cat")
    cat.create_topic("t")
    cat.history_begin("t", 0, str(tmp_path / "logs" / "t" / "0"), [0], [])
    assert cat.retention_acquire("t", 0, "retention-run:other", lease=30)[0]
    caplog.set_level(logging.INFO, logger="epochstream.history")
    with Publisher("t", catalog=cat, retention=Retention(
            dir=tmp_path / "logs", store=f"file://{tmp_path / 'shared'}", segment_bytes=4096,
            max_epochs=2)) as pub:
        for t in range(6):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
    pub.join(30)
    assert [e.time for e in History("t", catalog=cat).epochs()] == list(range(6))
    assert len(indexed(cat, "t")) == 6 == len(store_objects(tmp_path / "shared"))
    assert "the retention lease is held by retention-run:other" in caplog.text
    assert cat.retention_limits("t")["max_epochs"] == 2
