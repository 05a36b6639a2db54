"""A publisher with ``Retention(upload="frontier")`` stopped (SIGSTOP) in the middle of a commit
— its tail object uploaded and not indexed, or indexed and the epochs not committed, or
committed and not announced — comes back as a zombie after a successor took its partition
over (a PostgreSQL catalog: the partition's lease lapses, the successor registers with the
next generation, on another "host": another process and log directory, the same catalog and
store). The zombie must be refused (fenced) and change nothing a reader can see: the index is
the same after it woke, and a reader in a third process reads every epoch whole, once, in
order, from the store. Real processes (``store_peer.py --stop-at``: the peer SIGSTOPs itself at
that exact moment), a real S3 server (SeaweedFS) and a real PostgreSQL server; no mock.

Also the documented limit of docs/history.md ("Limits"): a publisher paused between an upload
and its index write for longer than the orphan grace, with no successor, indexes an object the
retention holder's sweep deleted meanwhile — readers of the store get ``HistoryCorrupt`` naming
it, never part of an epoch, and the epochs are still on the publisher's disk. (The sweep is
run by the test with ``grace=0``: the parameter :func:`sweep_orphans` has.)"""

from __future__ import annotations

import shutil
import signal
import uuid
from pathlib import Path

import pytest

from epochstream import Catalog
from epochstream.log.retainer import sweep_orphans
from epochstream.log.store import open_store, tail_pieces
from peer_processes import kill, read_until
from test_store import peer, read_in_process, wait_until, whole

LEASE = 1.5  # the PostgreSQL catalog's partition lease (seconds) of both publishers


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T`` in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


@pytest.mark.heavy  # (~60 s for the six: SIGSTOP past a lease, a successor, PostgreSQL and S3)
@pytest.mark.parametrize("point,segment,successor", [
    ("uploaded", 1 << 20, "live"), ("indexed", 1 << 20, "live"), ("committed", 1 << 20, "live"),
    ("uploaded", 16384, "live"), ("indexed", 1 << 20, "closed"), ("uploaded", 1 << 20, "killed")])
def test_a_stopped_frontier_publisher_wakes_fenced(weed, pg_url, tmp_path, point, segment,
                                                   successor):
    """Stopped at ``point`` of its 5th commit (epoch 4) past its lease; the successor resumes
    at the first epoch the index does not hold and publishes up to epoch 9 (``successor``: then
    holds, or goes on to epoch 15 and closes, or is killed -9); the zombie is continued and is
    refused (it exits ``Fenced``, or ``HistoryWriteError`` from the refused index write: its
    flush of epoch 4 never returns as done), the index is as the successor left it, a reader
    elsewhere then gets every epoch the successor committed whole, once, in order, from the
    store, and so after the successor closed (from the store alone). ``segment``: 1 MiB, the
    successor goes on writing the zombie's segment (both with a chain of tail objects); 16 KiB,
    it seals that segment and uploads it whole before the zombie's pending chain write."""
    topic = f"zo-{uuid.uuid4().hex[:6]}"
    store = weed.uri(f"zo/{uuid.uuid4().hex[:8]}")
    common = ("--upload", "frontier", "--segment-bytes", segment, "--pad", 1000, "--flush-each",
              "--lease", LEASE, "--last", 16)
    last = 16 if successor == "closed" else 10  # (the successor's epochs when the zombie wakes)
    cat = Catalog(pg_url, lease=LEASE)
    a = peer("publish", pg_url, topic, store, "--dir", tmp_path / "host-a", *common,
             "--stop-at", point, "--stop-after", 5)
    b = None
    try:
        assert read_until(a, "stopping")[1:] == [point]
        wait_until(lambda: stopped(a.pid), timeout=10, what="the publisher stopped")
        wait_until(lambda: cat.lookup(topic).partition_info[0].state == "expired",
                   timeout=10, what="its lease lapsed")
        logged = cat.history_state(topic, 0).lower[0]
        assert logged == (5 if point == "committed" else 4)
        # a retention holder whose grace is shorter than the pause deletes the zombie's
        # unindexed tail object (docs/history.md, Limits: "unless a successor fenced it")
        swept = sweep_orphans(open_store(store, write=True), cat, topic, 0, grace=0.0)
        assert swept == (1 if point == "uploaded" else 0)
        b = peer("publish", pg_url, topic, store, "--dir", tmp_path / "host-b", *common,
                 "--first", -1, "--hold-at", 9, "--end", "close")
        # (a stopped process may hold the catalog's write lock in an open transaction: the
        # server ends that session, so the successor's registration is not blocked forever)
        wait_until(lambda: cat.lookup(topic).partition_info[0].generation == 2, timeout=15,
                   what="the successor registered")
        assert read_until(b, "first")[1:] == [str(logged)]
        read_until(b, "holding")
        holder = cat.lookup(topic).partition_info[0]
        assert (holder.state, holder.generation) == ("live", 2)
        if successor == "closed":
            b.stdin.write("go\n")
            b.stdin.flush()
            out, err = b.communicate(timeout=60)
            assert b.returncode == 0 and "closed" in out, err
        elif successor == "killed":
            kill(b)
        before = cat.history_state(topic, 0)
        a.send_signal(signal.SIGCONT)  # the zombie wakes mid-commit, and goes on
        rc = a.wait(20)
        woke, err = a.stdout.read(), a.stderr.read()
        assert rc in (3, 4), (rc, woke, err)  # refused (Fenced, HistoryWriteError), never "closed"
        assert "fenced" in woke or "refused" in woke, (woke, err)
        assert "died" not in err, err  # its loop failed the log and told its subscribers
        if point != "committed":  # its flush() of epoch 4 raised: epoch 4 was not its to log
            assert not [w for w in woke.splitlines() if w.startswith("epoch ")], woke
        assert cat.history_state(topic, 0) == before  # the zombie changed nothing indexed
        info = cat.lookup(topic).partition_info[0]
        assert (info.state, info.incarnation) == (
            {"killed": "dead"}.get(successor, successor), holder.incarnation)
        rc, got, text = read_in_process(pg_url, topic, "--source", "store")
        assert rc == 0, text
        assert got == whole(range(last)), text
        if successor == "live":
            b.stdin.write("go\n")
            b.stdin.flush()
            out, err = b.communicate(timeout=60)
            assert b.returncode == 0 and "closed" in out, err
            last = 16
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
        kill(a)
        if b is not None:
            kill(b)
    shutil.rmtree(tmp_path / "host-a")
    shutil.rmtree(tmp_path / "host-b")
    rc, got, text = read_in_process(pg_url, topic, "--source", "store")
    assert rc == 0, text
    assert got == whole(range(last)), text
    # what the zombie left unindexed goes with the sweep; nothing indexed goes with it
    sweep_orphans(open_store(store, write=True), cat, topic, 0, grace=0.0)
    rc, got, text = read_in_process(pg_url, topic, "--source", "store")
    assert rc == 0 and got == whole(range(last)), text
    cat.close()


def test_paused_past_the_orphan_grace_with_no_successor_is_the_documented_limit(weed, tmp_path):
    """docs/history.md, Limits: stopped between a tail's upload and its index write for longer
    than the orphan grace (the sweep is run with ``grace=0``), with no successor (a SQLite
    catalog: its partition stays its own), a publisher indexes the object the sweep deleted
    when it runs again. A reader of the store gets ``HistoryCorrupt`` naming that object, never
    part of an epoch; the epochs are all on the publisher's disk, read whole from there."""
    topic, cat = f"og-{uuid.uuid4().hex[:6]}", tmp_path / "cat"
    store = weed.uri(f"og/{uuid.uuid4().hex[:8]}")
    a = peer("publish", cat, topic, store, "--dir", tmp_path / "host-a", "--upload", "frontier",
             "--segment-bytes", 1 << 20, "--pad", 1000, "--flush-each", "--last", 8,
             "--stop-at", "uploaded", "--stop-after", 5)
    try:
        read_until(a, "stopping")
        wait_until(lambda: stopped(a.pid), timeout=10, what="the publisher stopped")
        catalog = Catalog(cat)
        listed = {n for n, *_ in open_store(store, write=True).segment_objects(topic, 0)}
        assert sweep_orphans(open_store(store, write=True), catalog, topic, 0, grace=0.0) == 1
        gone = listed - {n for n, *_ in open_store(store, write=True).segment_objects(topic, 0)}
        assert len(gone) == 1 and "-12284-15355.estail" in next(iter(gone))  # epoch 4's tail
        a.send_signal(signal.SIGCONT)
        read_until(a, "hanging")  # it indexed the chain naming it, and went on to epoch 7
        entry = catalog.history_state(topic, 0).segments[0].object
        assert gone <= {name for _, _, name in tail_pieces(entry)}
        rc, got, text = read_in_process(cat, topic, "--source", "store")
        assert rc == 3 and "HistoryCorrupt" in text and "is missing" in text, text
        assert next(iter(gone)).rsplit("/", 1)[1] in text and got == [], text
        rc, got, text = read_in_process(cat, topic, "--source", "disk")
        assert rc == 0 and got == whole(range(8)), text
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
        kill(a)
