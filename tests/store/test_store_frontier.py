"""``Retention(upload="frontier")`` (issue 23): each frontier advance's data is in the store,
uploaded and indexed, before the epochs it completes are indexed and announced — so a publisher
killed with its machine (kill -9, its log directory deleted) is succeeded by a publisher on
another "host" (another process and log directory; the same catalog and store) that continues
the log, and a reader in a third process gets every epoch, whole, once, in order, every epoch a
live subscriber saw complete among them. Real processes, a real S3 server (SeaweedFS ``weed
mini``); the kill lands at an exact moment of a frontier upload (store_peer.py ``--crash-at``:
the peer SIGKILLs itself there). With ``upload="sealed"`` such a successor is refused
(``HistoryCorrupt``: the segment being written was only on the lost disk). The store going
down in frontier mode: announcements wait, the caller is held back (bounded memory), nothing
is announced that is not in the store; ``abort()`` stops the wait. An object a crash left
unindexed is deleted by the orphan sweep once older than its grace period, never before."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from epochstream import Catalog, Publisher, Retention, Subscriber
from epochstream.errors import HistoryCorrupt
from epochstream.log.retainer import sweep_orphans
from epochstream.log.store import open_store
from peer_processes import kill, read_until
from test_store import peer, read_in_process, wait_until, whole

POINTS = ["upload", "uploaded", "indexed", "committed"]
CASES = [(p, 5) for p in POINTS]
if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":  # more moments: each point at 1..12
    CASES += [(p, k) for p in POINTS for k in (1, 2, 3, 8, 12)]


def live_subscriber(cat, topic, timeout=10.0) -> tuple[Subscriber, list, threading.Thread]:
    """A live subscriber, joined (``wait_ready``) before anything is published, collecting
    ``(time, whole)`` of each epoch delivered complete until its publisher is lost (``lost``
    appended then)."""
    sub = Subscriber(topic, catalog=cat, start=0, timeout=timeout)
    assert sub.wait_ready(30)
    seen: list = []

    def run():
        try:
            for e in sub.epochs():
                seen.append((e.time, [r["i"] for r in e.records] == [0, 1, 2]))
        except Exception as e:  # PublisherLost once it is killed: what it saw is what counts
            seen.append(("lost", type(e).__name__))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return sub, seen, t


@pytest.mark.parametrize("point,after", CASES)
def test_successor_on_another_host_after_kill9(weed, tmp_path, point, after):
    """Killed -9 at ``point`` of its ``after``-th frontier upload, its log directory deleted:
    a successor elsewhere resumes after the last indexed epoch (every announced one is before
    it), and a third process reads every epoch whole, once, in order."""
    topic, cat = f"fr-{uuid.uuid4().hex[:6]}", tmp_path / "cat"
    store = weed.uri(f"fr/{uuid.uuid4().hex[:8]}")
    common = ("--upload", "frontier", "--segment-bytes", 16384, "--last", 16, "--pad", 1000,
              "--flush-each")
    a = peer("publish", cat, topic, store, "--dir", tmp_path / "host-a", *common, "--pause",
             "--crash-at", point, "--crash-after", after)
    try:
        read_until(a, "ready")
        sub, seen, reader = live_subscriber(cat, topic)
        a.stdin.write("go\n")
        a.stdin.flush()
        assert a.wait(60) == -signal.SIGKILL, a.stderr.read()
    finally:
        kill(a)
    time.sleep(0.5)  # (what it sent before it died is read by now; no need to wait until the
    sub.close()      # subscriber gives it up as lost)
    reader.join(30)
    shutil.rmtree(tmp_path / "host-a")
    seen[:] = [x for x in seen if x[0] != "lost"]
    announced = [t for t, _ in seen]
    assert all(ok for _, ok in seen) and announced == list(range(len(announced)))
    b = peer("publish", cat, topic, store, "--dir", tmp_path / "host-b", *common, "--first", -1,
             "--end", "close")
    out, err = b.communicate(timeout=60)
    assert b.returncode == 0 and "closed" in out, err
    first = int(next(line.split()[1] for line in out.splitlines() if line.startswith("first")))
    assert first >= len(announced)  # every announced epoch was indexed, in the store
    shutil.rmtree(tmp_path / "host-b")
    rc, got, text = read_in_process(cat, topic)
    assert rc == 0, text
    assert got == whole(range(16)), text
    if point in ("uploaded", "indexed"):  # an object no index entry names was left behind:
        store_, catalog = open_store(store, write=True), Catalog(cat)  # the lease holder's
        assert sweep_orphans(store_, catalog, topic, 0) == 0  # sweep keeps it while young,
        assert sweep_orphans(store_, catalog, topic, 0, grace=0.0) >= 1  # deletes it once old
        rc, got, text = read_in_process(cat, topic)
        assert rc == 0 and got == whole(range(16)), text  # (nothing indexed was deleted)


def test_sealed_mode_successor_is_refused(weed, tmp_path):
    """``upload="sealed"``: the segment being written lived only on the lost disk, so a
    successor elsewhere is refused with HistoryCorrupt (documented), not given a log with a
    hole."""
    topic, cat = f"sl-{uuid.uuid4().hex[:6]}", tmp_path / "cat"
    store = weed.uri(f"sl/{uuid.uuid4().hex[:8]}")
    a = peer("publish", cat, topic, store, "--dir", tmp_path / "host-a", "--segment-bytes",
             1 << 20, "--last", 4)
    try:
        read_until(a, "hanging")
    finally:
        kill(a)
    shutil.rmtree(tmp_path / "host-a")
    with pytest.raises(HistoryCorrupt, match="no object store holds them"):
        Publisher(topic, 0, catalog=Catalog(cat), retention=Retention(
            dir=tmp_path / "host-b", store=store, segment_bytes=1 << 20))


def test_store_down_frontier_advances_wait(weed, tmp_path):
    """The store stops answering (SIGSTOP): no epoch is announced, the caller is held back at
    ``queue_hwm`` (bounded memory); once it answers every epoch is delivered, each in the
    store before its announcement. Down again, ``abort()`` ends the wait at once."""
    fs = pafs.SubTreeFileSystem(f"{weed.bucket}/down-{uuid.uuid4().hex[:6]}", weed.filesystem(
        connect_timeout=0.5, request_timeout=1.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1)))
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("frdown", catalog=cat, queue_hwm=16, retention=Retention(
        store=fs, upload="frontier", segment_bytes=1 << 20))
    sub, seen, reader = live_subscriber(cat, "frdown", timeout=2.0)
    sent = [0]

    def epochs(first, last):
        for t in range(first, last):
            pub.send(t, [{"t": t, "i": i} for i in range(3)])
            pub.advance_to(t + 1)
            sent[0] = t + 1

    try:
        epochs(0, 3)
        wait_until(lambda: len(seen) == 3, what="epochs 0-2 delivered")
        os.killpg(weed.proc.pid, signal.SIGSTOP)
        caller = threading.Thread(target=epochs, args=(3, 200), daemon=True)
        caller.start()
        time.sleep(4.0)  # (longer than the subscriber's timeout: heartbeats go on meanwhile)
        assert len(seen) <= 4 and "lost" not in [x[0] for x in seen], seen
        held = sent[0]
        assert held < 60, held  # the caller is held back: queue_hwm, not memory, bounds it
        os.killpg(weed.proc.pid, signal.SIGCONT)
        caller.join(60)
        pub.flush()
        wait_until(lambda: len(seen) == 200, timeout=60, what="every epoch delivered")
        state = cat.history_state("frdown", 0)
        assert state.segments[-1].object_bytes >= state.committed  # the chain holds them all
        os.killpg(weed.proc.pid, signal.SIGSTOP)
        pub.send(200, [{"t": 200, "i": 0}])
        pub.advance_to(201)
        time.sleep(1.0)
        t0 = time.monotonic()
        pub.abort("test", linger=0.0, wait=True)
        assert time.monotonic() - t0 < 15
        reader.join(10)  # (it ends with PublisherAborted)
        assert [t for t, _ in seen if t != "lost"] == list(range(200))  # 200 never announced
    finally:
        os.killpg(weed.proc.pid, signal.SIGCONT)
        sub.close()


def test_local_files_of_segments_a_runner_trimmed_go_when_a_publisher_opens(weed, tmp_path):
    """``retention run`` trims the index and the store, not the publisher's disk; the next
    publisher opening the log deletes the local files of the trimmed segments."""
    from epochstream.log.retainer import Retainer

    cat, topic = Catalog(tmp_path / "cat"), f"tr-{uuid.uuid4().hex[:6]}"
    retention = Retention(dir=tmp_path / "logs", store=weed.uri(f"tr/{uuid.uuid4().hex[:8]}"),
                          segment_bytes=4096, max_bytes=None, max_age=None)
    pub = Publisher(topic, catalog=cat, retention=retention)
    for t in range(6):
        pub.send(t, [{"t": t, "pad": "x" * 5000}])
        pub.advance_to(t + 1)
        pub.flush()
    pub.close(wait=True)
    directory = Path(cat.history_state(topic, 0).dir)
    runner = Retainer(cat, topic, Retention(max_epochs=2, max_bytes=None, max_age=None))
    runner.acquire()
    try:
        assert runner.run_once()[0].segments >= 3
    finally:
        runner.release()
    first = cat.history_state(topic, 0).segments[0].seq
    assert any(int(p.stem) < first for p in directory.glob("*.eslog"))
    Publisher(topic, catalog=cat, retention=retention).close(wait=True)
    assert all(int(p.stem) >= first for p in directory.glob("*.eslog"))


def test_chain_entries_round_trip_and_stay_small():
    """The index entry of a chain names every object (a plain prefix, then tails of several
    incarnations) and costs a few bytes per frontier advance of one incarnation; a chain with
    a hole is refused."""
    from epochstream.log.store import object_name, tail_name, tail_pieces, tails_object

    names = [object_name("t/x", 0, 3, "a" * 32, 100)]
    names += [tail_name("t/x", 0, 3, "b" * 32, s, s + 10) for s in range(100, 1100, 10)]
    names += [tail_name("t/x", 0, 3, "c" * 32, 1100, 1200)]
    entry = tails_object(names)
    assert [n for _, _, n in tail_pieces(entry)] == names
    assert [(s, e) for s, e, _ in tail_pieces(entry)][:2] == [(0, 100), (100, 110)]
    assert len(entry) < 200 + 6 * 100  # (not ~60 bytes per tail)
    with pytest.raises(ValueError, match="not contiguous"):
        tail_pieces(tails_object([names[0], names[2]]))


def test_a_sealed_mode_successor_cuts_a_chain_beyond_the_committed_bytes(weed, tmp_path):
    """A frontier-mode publisher killed after indexing a tail but before its commit leaves a
    chain reaching beyond the committed bytes. A successor in sealed mode (its disk kept) cuts
    the chain there: the epochs it commits into that segment are never read from the
    predecessor's stale tail (which would fail its checksums) but from its own bytes."""
    topic, cat = f"mx-{uuid.uuid4().hex[:6]}", tmp_path / "cat"
    store = weed.uri(f"mx/{uuid.uuid4().hex[:8]}")
    common = ("--segment-bytes", 1 << 20, "--flush-each", "--dir", tmp_path / "host-a")
    a = peer("publish", cat, topic, store, "--upload", "frontier", "--last", 8, "--pad", 1000,
             "--crash-at", "indexed", "--crash-after", 4, *common)
    assert a.wait(60) == -signal.SIGKILL, a.stderr.read()
    state = Catalog(cat).history_state(topic, 0)
    assert state.segments[-1].object_bytes > state.committed  # the stale tail is indexed
    b = peer("publish", cat, topic, store, "--first", -1, "--last", 8, "--pad", 200, *common)
    # (fewer bytes than the predecessor's epochs: within its stale tail, which fails checks)
    try:
        read_until(b, "hanging")
    finally:
        kill(b)
    rc, got, text = read_in_process(cat, topic, "--source", "store")
    assert rc == 0, text
    assert got == whole(range(8)), text


def test_upload_mode_is_checked_at_construction():
    """``Retention(upload=...)``: "sealed" (default) or "frontier" (with a store); anything
    else, or "frontier" without a store, one clear ValueError when the Retention is built."""
    from epochstream.log.store import _delayed_open

    assert Retention().upload == "sealed"
    assert Retention(store="file:///tmp/x", upload="frontier").upload == "frontier"
    with pytest.raises(ValueError, match=r"upload must be one of \('sealed', 'frontier'\)"):
        Retention(store="file:///tmp/x", upload="always")
    with pytest.raises(ValueError, match="needs a store"):
        Retention(upload="frontier")
    assert _delayed_open("s3://b/p?scheme=http") == "s3://b/p?scheme=http&allow_delayed_open=true"
    assert _delayed_open("s3://b/p?allow_delayed_open=false").endswith("=false")
    assert _delayed_open("file:///x") == "file:///x"
