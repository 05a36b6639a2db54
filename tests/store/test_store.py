"""Epoch logs in an object store (issue 23): a real S3 (SeaweedFS, ``weed`` fixture) and a
``file://`` directory shared by processes; publishers and readers in processes of their own,
killed with SIGKILL. No mock of S3."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.errors import HistoryCorrupt, HistoryUnavailable, HistoryWriteError
from peer_processes import kill, read_until
from store_fixtures import WeedS3

PEER = str(Path(__file__).with_name("store_peer.py"))


def peer(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PEER, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            env=env)


def read_in_process(cat, topic, *args, env=None) -> tuple[int, list, str]:
    """Run ``store_peer.py read`` in a process of its own: (exit status, [(t, [i...], ok)],
    stdout)."""
    p = subprocess.run([sys.executable, PEER, "read", str(cat), topic, *args], env=env,
                       capture_output=True, text=True, timeout=60)
    got = [(int(w[1]), json.loads(w[2]), w[3] == "True")
           for w in (line.split(" ", 3) for line in p.stdout.splitlines())
           if w[0] == "epoch"]
    return p.returncode, got, p.stdout + p.stderr


def whole(times, msgs=3) -> list:
    return [(t, list(range(msgs)), True) for t in times]


def sealed_objects(cat, topic) -> list:
    state = cat.history_state(topic, 0)
    return [g for g in state.segments if g.seq < state.segment and g.epochs]


def wait_until(check, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


# ---- bad input: one clear line at construction, nothing created --------------------------------

def test_bad_store_fails_at_construction(weed, tmp_path):
    cat = Catalog(tmp_path / "cat")
    with pytest.raises(ValueError, match="Retention.store must be a URI"):
        Retention(store="just-a-name")
    with pytest.raises(ValueError, match="pyarrow cannot open this URI"):
        Publisher("bad", catalog=cat, retention=Retention(store="nosuchscheme://x/y"))
    with pytest.raises(HistoryWriteError, match="bucket 'no-such-bucket' does not exist") as e:
        Publisher("bad", catalog=cat, retention=Retention(store=weed.uri("p", "no-such-bucket")))
    assert "\n" not in str(e.value)
    wrong = weed.uri("p").replace("s3://", "s3://epochstream-test:not-the-secret@")
    with pytest.raises(HistoryWriteError, match="ACCESS_DENIED|Access ?Denied|SignatureDoesNot") \
            as e:
        Publisher("bad", catalog=cat, retention=Retention(store=wrong))
    assert "\n" not in str(e.value) and "not-the-secret" not in str(e.value)
    assert cat.topics() == []  # nothing half-applied: the topic was never created
    with Publisher("good", catalog=cat, retention=Retention(store=weed.uri("good"))) as pub:
        pub.send(0, ["a"])
        pub.advance_to(1)
    with pytest.raises(HistoryUnavailable, match="bucket 'no-such-bucket' does not exist"):
        History("good", catalog=cat, store=weed.uri("good", "no-such-bucket"))
    with pytest.raises(ValueError, match="pyarrow cannot open"):
        History("good", catalog=cat, store="nosuchscheme://x")


# ---- another process, only the catalog and the store -----------------------------------------

def test_reader_elsewhere_replays_after_publisher_killed(weed, tmp_path, catalog_location):
    """The publisher is killed -9 once its sealed segments are uploaded, and its log directory
    deleted: a reader in another process, with the catalog alone (the store's URI is in it),
    replays every epoch whole, once, in order — on SQLite and on PostgreSQL. (A Subscriber
    refuses a topic whose publisher is dead, store or not: PublisherLost.)"""
    topic = f"k9-{uuid.uuid4().hex[:6]}"
    store = weed.uri(f"k9/{uuid.uuid4().hex[:8]}")
    pub = peer("publish", catalog_location, topic, store, "--dir", tmp_path / "logs",
               "--last", 12, "--wait-uploads")
    try:
        log_dir = read_until(pub, "ready")[1]
        assert int(read_until(pub, "uploaded")[1]) >= 6
        read_until(pub, "hanging")
    finally:
        kill(pub)
    shutil.rmtree(log_dir)
    rc, got, text = read_in_process(catalog_location, topic)
    assert rc == 0, text
    assert got == whole(range(12)), text


def test_file_store_shared_by_two_processes(tmp_path):
    """``file://`` on a directory both processes see: a closed publisher's epochs (all of
    them: the segment being written is uploaded at close) read by another process, by History,
    by a Subscriber's catch-up and by a durable subscriber, with the publisher's log directory
    gone."""
    cat = tmp_path / "cat"
    store = f"file://{tmp_path / 'shared'}"
    pub = peer("publish", cat, "shared", store, "--dir", tmp_path / "logs", "--last", 7,
               "--end", "close")
    out, err = pub.communicate(timeout=60)
    assert pub.returncode == 0 and "closed" in out, err
    shutil.rmtree(tmp_path / "logs")
    for args in ((), ("--subscribe",), ("--durable", "billing")):
        rc, got, text = read_in_process(cat, "shared", *args)
        assert rc == 0, text
        assert got == whole(range(7)), text
    assert Catalog(cat).durable("shared", "billing").position == (7,)


# ---- faults ------------------------------------------------------------------------------------

def test_kill9_mid_upload_indexes_nothing_and_the_restart_uploads(tmp_path):
    """The store hangs (SIGSTOP) while segments are sealed and uploading; the publisher is
    killed -9 mid-upload: no object is indexed. Its successor (another incarnation) uploads
    the sealed segments under names of its own; a reader elsewhere then reads all of it."""
    own = WeedS3(tmp_path / "weed")
    own.start()
    env = own.env()
    cat_path, store = tmp_path / "cat", own.uri("mid")
    try:
        pub = peer("publish", cat_path, "mid", store, "--dir", tmp_path / "logs", "--last", 6,
                   "--pause", env=env)
        try:
            read_until(pub, "ready")
            os.killpg(own.proc.pid, signal.SIGSTOP)  # the store hangs mid-request
            pub.stdin.write("go\n")
            pub.stdin.flush()
            read_until(pub, "hanging")
            time.sleep(0.5)  # the uploads are under way, and hang
        finally:
            kill(pub)
            os.killpg(own.proc.pid, signal.SIGCONT)
        cat = Catalog(cat_path)
        sealed = sealed_objects(cat, "mid")
        assert len(sealed) >= 5 and all(g.object is None for g in sealed)
        pub = peer("publish", cat_path, "mid", store, "--dir", tmp_path / "logs", "--first", 6,
                   "--last", 8, "--wait-uploads", "--end", "close", env=env)
        out, err = pub.communicate(timeout=60)
        assert pub.returncode == 0 and "closed" in out, err
        state = cat.history_state("mid", 0)
        names = [g.object for g in state.segments if g.epochs]
        assert all(names) and len(set(names)) == len(names)
        shutil.rmtree(tmp_path / "logs")
        rc, got, text = read_in_process(cat_path, "mid", env=env)
        assert rc == 0, text
        assert got == whole(range(8)), text
    finally:
        own.stop()


def test_corrupt_object_is_history_corrupt(weed, tmp_path):
    """A bit flipped in an object, or an object cut short: HistoryCorrupt naming the object;
    the epoch is never delivered as data (the epochs before it are)."""
    cat = Catalog(tmp_path / "cat")
    store = weed.uri(f"corrupt/{uuid.uuid4().hex[:8]}")
    pub = Publisher("bad-bytes", catalog=cat, retention=Retention(store=store, segment_bytes=4096))
    for t in range(6):
        pub.send(t, [{"t": t, "i": i, "pad": "x" * 2000} for i in range(3)])
        pub.advance_to(t + 1)
    pub.close(wait=True)
    segments = {g.seq: g for g in cat.history_state("bad-bytes", 0).segments if g.object}
    assert len(segments) == 6
    assert [e.time for e in History("bad-bytes", catalog=cat, source="store").epochs()] == \
        list(range(6))
    fs, root = pafs.FileSystem.from_uri(store)
    flip, cut = segments[2].object, segments[4].object
    with fs.open_input_file(f"{root}/{flip}") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x01
    with fs.open_output_stream(f"{root}/{flip}") as f:
        f.write(bytes(data))
    got = []
    with pytest.raises(HistoryCorrupt, match="fails its checksum") as e:
        for epoch in History("bad-bytes", catalog=cat, source="store").epochs():
            got.append(epoch.time)
    assert flip in str(e.value) and flip in e.value.path
    assert got == [0, 1]
    with fs.open_output_stream(f"{root}/{flip}") as f:  # put it right again
        data[len(data) // 2] ^= 0x01
        f.write(bytes(data))
    with fs.open_input_file(f"{root}/{cut}") as f:
        data = f.read()
    with fs.open_output_stream(f"{root}/{cut}") as f:
        f.write(data[:-100])
    got = []
    with pytest.raises(HistoryCorrupt, match="truncated") as e:
        for epoch in History("bad-bytes", catalog=cat, source="store").epochs():
            got.append(epoch.time)
    assert cut in str(e.value)
    assert got == [0, 1, 2, 3]


def test_store_down_while_segments_seal(tmp_path):
    """The store goes down (killed) while segments seal: the publisher keeps serving a live
    subscriber, the upload backlog stays within its bound (the oldest kept only locally, with
    a warning), uploads resume when the store is back — the dropped segments too, found again
    in the index. The store is given as a FileSystem object (one attempt per
    request, short timeouts), so readers are given it too."""
    own = WeedS3(tmp_path / "weed")
    own.start()
    fs = pafs.SubTreeFileSystem(f"{own.bucket}/down", own.filesystem(
        connect_timeout=0.5, request_timeout=1.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1)))
    cat = Catalog(tmp_path / "cat")
    retention = Retention(store=fs, segment_bytes=4096, upload_backlog=3)
    try:
        pub = Publisher("down", catalog=cat, retention=retention)
        uploader = pub._log.uploader
        sub = Subscriber("down", catalog=cat)
        assert sub.wait_ready(30)  # joined before epoch 0 (it saw 2.. on a busy machine)
        seen: list = []
        reader = threading.Thread(target=lambda: seen.extend(e.time for e in sub.epochs()),
                                  daemon=True)
        reader.start()

        def epochs(first, last):
            for t in range(first, last):
                pub.send(t, [{"t": t, "i": i, "pad": "x" * 2000} for i in range(3)])
                pub.advance_to(t + 1)
            pub.flush()

        epochs(0, 2)
        wait_until(lambda: uploader.stats["uploaded"] == 2, what="2 uploads")
        own.stop()
        t0 = time.monotonic()
        epochs(2, 12)  # 10 segments seal while the store is down
        wait_until(lambda: seen[-1:] == [11], timeout=10, what="live delivery of epoch 11")
        assert time.monotonic() - t0 < 5.0  # served at once, not held by the store
        assert uploader.backlog <= 3 and uploader.stats["dropped"] >= 6
        assert uploader.stats["uploaded"] == 2
        own.start()  # back: the queued ones go, then those dropped (read again from the index)
        wait_until(lambda: uploader.stats["uploaded"] == 12, timeout=30,
                   what="every sealed segment uploaded")
        epochs(12, 14)
        pub.close(wait=True)
        sub.close()
        reader.join(10)
        assert seen == list(range(14))
        assert all(g.object for g in cat.history_state("down", 0).segments if g.epochs)
        shutil.rmtree(cat.history_state("down", 0).dir)
        with pytest.raises(HistoryUnavailable, match="pass History"):
            list(History("down", catalog=cat).epochs())
        assert [e.time for e in History("down", catalog=cat, store=fs).epochs()] == \
            list(range(14))
    finally:
        own.stop()


# ---- retention ---------------------------------------------------------------------------------

def test_retention_deletes_index_rows_then_objects(tmp_path):
    """The publisher (the log's retention holder) trims: the index rows go first, then their
    objects; the store keeps exactly the indexed objects. A reader holding index entries of
    the deleted epochs gets HistoryUnavailable, never part of an epoch."""
    cat = Catalog(tmp_path / "cat")
    shared = tmp_path / "shared"
    pub = Publisher("trim", catalog=cat, retention=Retention(
        store=f"file://{shared}", segment_bytes=4096, max_epochs=3))
    for t in range(4):
        pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
        pub.advance_to(t + 1)
    pub.flush()
    uploader = pub._log.uploader
    wait_until(lambda: uploader.stats["uploaded"] == 4, what="uploads")  # (every epoch)
    h = History("trim", catalog=cat, source="store")
    early = h.records()
    for t in range(4, 10):
        pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
        pub.advance_to(t + 1)
    pub.close(wait=True)
    state = cat.history_state("trim", 0)
    indexed = {g.object for g in state.segments if g.object}
    wait_until(lambda: {str(p.relative_to(shared)) for p in shared.rglob("*.eslog")} == indexed,
               what="only the indexed objects left in the store")
    assert uploader.stats["deleted"] >= 6
    assert [e.time for e in History("trim", catalog=cat, source="store").epochs()] == \
        [7, 8, 9]
    with pytest.raises(HistoryUnavailable, match="deleted by retention"):
        list(h.read(early))


def test_history_command_shows_where_the_log_lives(tmp_path):
    """``epochstream history`` says, per partition with a store, the log's bytes, the store's
    bytes and objects, and the sealed segments still waiting for their upload."""
    cat = Catalog(tmp_path / "cat")
    store = f"file://{tmp_path / 'shared'}"
    with Publisher("cli", catalog=cat, retention=Retention(store=store,
                                                           segment_bytes=4096)) as pub:
        for t in range(3):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
    pub.join(30)
    p = subprocess.run([sys.executable, "-m", "epochstream", "history", "cli", "--catalog",
                        str(tmp_path / "cat")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("partition 0:"))
    assert f"store {store}:" in line and "in 3 object(s)" in line, line
    assert "0 sealed segment(s) waiting" in line, line


def test_network_catalog_and_s3_store(weed, tmp_path):
    """Publisher and reader share only the catalog service's URL and the store: the uploads
    are indexed through the network catalog (from the uploader's thread), and a reader in
    another process replays with the publisher's log directory gone."""
    from epochstream.catalog.server import CatalogServer

    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        store = weed.uri(f"net/{uuid.uuid4().hex[:8]}")
        pub = peer("publish", srv.endpoint, "net", store, "--dir", tmp_path / "logs",
                   "--last", 6, "--end", "close")
        out, err = pub.communicate(timeout=60)
        assert pub.returncode == 0 and "closed" in out, err
        shutil.rmtree(tmp_path / "logs")
        rc, got, text = read_in_process(srv.endpoint, "net")
        assert rc == 0, text
        assert got == whole(range(6)), text


def test_names_and_uris():
    """Object names hold their size and are never reused across incarnations or lengths;
    the catalog's URI carries no credentials."""
    from epochstream.log.store import object_bytes, object_name, public_uri

    a = object_name("a b/c", 2, 7, "inc1", 6072)
    assert a == "a%20b%2Fc/2/0000000007-inc1-6072.eslog" and object_bytes(a) == 6072
    assert len({a, object_name("a b/c", 2, 7, "inc2", 6072),
                object_name("a b/c", 2, 7, "inc1", 9000)}) == 3
    assert public_uri("s3://KEY:SECRET@bucket/p?endpoint_override=h:9&scheme=http") == \
        "s3://bucket/p?endpoint_override=h:9&scheme=http"
    assert "SECRET" not in repr(Retention(store="s3://KEY:SECRET@bucket/p"))


def test_a_damaged_local_segment_is_read_from_the_store(tmp_path):
    """Reading the local files (the log's own host), an epoch whose segment file is gone or
    damaged comes from its object instead, checked the same way; with source="disk" it is
    HistoryCorrupt as without a store."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("both", catalog=cat, retention=Retention(
        store=f"file://{tmp_path / 'shared'}", segment_bytes=4096))
    for t in range(4):
        pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
        pub.advance_to(t + 1)
    pub.close(wait=True)
    state = cat.history_state("both", 0)
    files = sorted(Path(state.dir).glob("*.eslog"))
    files[0].unlink()
    data = bytearray(files[1].read_bytes())
    data[100] ^= 0x01
    files[1].write_bytes(bytes(data))
    assert [e.time for e in History("both", catalog=cat).epochs()] == [0, 1, 2, 3]
    with pytest.raises(HistoryCorrupt, match="missing"):
        list(History("both", catalog=cat, source="disk").epochs())


def test_drop_deletes_the_objects_too(weed, tmp_path):
    """``epochstream drop`` deletes a topic's segment objects from its store, besides the
    local segment files."""
    cat = Catalog(tmp_path / "cat")
    prefix = f"drop/{uuid.uuid4().hex[:8]}"
    with Publisher("gone", catalog=cat, retention=Retention(store=weed.uri(prefix),
                                                            segment_bytes=4096)) as pub:
        for t in range(3):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
    pub.join(30)
    fs, root = pafs.FileSystem.from_uri(weed.uri(prefix))
    listed = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    assert sum(i.path.endswith(".eslog") for i in fs.get_file_info(listed)) == 3
    p = subprocess.run([sys.executable, "-m", "epochstream", "drop", "gone", "--catalog",
                        str(tmp_path / "cat")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "deleted 3 object(s)" in p.stdout, p.stdout
    assert not any(i.path.endswith(".eslog") for i in fs.get_file_info(listed))


def test_a_publisher_elsewhere_continues_the_log_from_the_store(weed, tmp_path):
    """The publisher's host is gone (its log directory deleted) after it closed: a publisher
    with another log directory (another host) and the same store continues the log — the
    segment being written is taken from the store — and a reader elsewhere gets every epoch
    of both, whole, in order."""
    cat, store = tmp_path / "cat", weed.uri(f"move/{uuid.uuid4().hex[:8]}")
    for first, last, logs in ((0, 5, "host-a"), (5, 9, "host-b")):
        pub = peer("publish", cat, "moved", store, "--dir", tmp_path / logs, "--first", first,
                   "--last", last, "--pad", 1000, "--end", "close")
        out, err = pub.communicate(timeout=60)
        assert pub.returncode == 0 and "closed" in out, err
        shutil.rmtree(tmp_path / "host-a", ignore_errors=True)
    assert Path(Catalog(cat).history_state("moved", 0).dir).is_relative_to(tmp_path / "host-b")
    shutil.rmtree(tmp_path / "host-b")
    rc, got, text = read_in_process(cat, "moved")
    assert rc == 0, text
    assert got == whole(range(9)), text


def test_a_consumer_group_reads_sealed_epochs_from_the_store(tmp_path):
    """A consumer group leases and reads epochs of a closed topic whose log directory is gone:
    every epoch whole, from the store."""
    from epochstream import EpochGroup

    cat = Catalog(tmp_path / "cat")
    pub = Publisher("jobs", catalog=cat, retention=Retention(
        store=f"file://{tmp_path / 'shared'}", segment_bytes=4096))
    for t in range(5):
        pub.send(t, [{"t": t, "i": i, "pad": "x" * 1000} for i in range(3)])
        pub.advance_to(t + 1)
    pub.close(wait=True)
    shutil.rmtree(cat.history_state("jobs", 0).dir)
    group = EpochGroup("jobs", "workers", catalog=cat, worker="a")
    got = []
    for lease in group.leases(expires=0.5):
        got.append((lease.epoch.time, [r["i"] for r in lease.epoch.records]))
        lease.ack()
    assert got == [(t, [0, 1, 2]) for t in range(5)]


def test_a_reader_falls_back_while_the_store_is_down(tmp_path, caplog, monkeypatch):
    """The store is down when a reader is constructed: a partition whose publisher is live (or
    whose files are here) is read from there, with a WARNING, instead of failing (a store the
    reader cannot fall back from fails at construction: test_bad_store_fails_at_construction).
    About 6 s: pyarrow's S3 client retries the probe."""
    own = WeedS3(tmp_path / "weed")
    own.start()
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, own.env()[k])
    cat = Catalog(tmp_path / "cat")
    try:
        pub = Publisher("fb", catalog=cat, retention=Retention(store=own.uri("fallback"),
                                                               segment_bytes=4096))
        for t in range(4):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
        pub.flush()
        wait_until(lambda: pub._log.uploader.stats["uploaded"] == 4, what="uploads")
        own.stop()
        h = History("fb", catalog=cat, source="store")
        assert [e.time for e in h.epochs()] == [0, 1, 2, 3]
        assert "read from their files or live publishers instead" in caplog.text
        pub.abort("the test ends", linger=0)  # (close would wait for its tail's upload)
    finally:
        own.stop()
