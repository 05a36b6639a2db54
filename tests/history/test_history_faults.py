"""Issue 11, "Bad input and faults": durable history under kill -9, damaged segments, a log
directory that cannot be written, dying and competing durable subscribers, retention.

Real processes (``tests/history/history_peer.py``: a publisher with retention, a durable
subscriber) are killed with SIGKILL; real sockets on 127.0.0.1. Every test compares the exact
epochs and their records (``history_peer.epoch_records``), never just "no exception".
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from history_peer import digest, epoch_records
from peer_processes import kill as _kill, read_until as _read_until
from peer_procs import EpochReader, say as _say
from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.log import RECORD_HEADER, segment_path
from epochstream.errors import (HistoryCorrupt, HistoryUnavailable, PublisherAborted,
                                SubscriptionExpired, SubscriptionHeld)
from epochstream.events import Gap

PEER = str(Path(__file__).with_name("history_peer.py"))


def _spawn(*args, stdin=False):
    return subprocess.Popen([sys.executable, PEER, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin else None,
                            text=True, bufsize=1)


def _finish(proc, timeout=15):
    """Wait for ``proc`` to exit; return (rc, rest of stdout, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _exact(epochs, msgs, recs, pad=0):
    """[(time, records as tuples)] of ``epochs`` as a subscriber gets them."""
    return [(t, [tuple(r) for r in epoch_records(t, msgs, recs, pad)]) for t in epochs]


def _seen(items):
    return [(e.time, [tuple(r) for r in e.records]) for e in items]


def _history(cat, **kw):
    return _seen(History("t", cat).epochs(**kw))


def _earliest(cat, timeout=5):
    with Subscriber("t", cat, start="earliest", timeout=timeout) as sub:
        return _seen(sub.epochs(timeout=timeout))


def _segment(cat):
    st = Catalog(cat).history_state("t", 0)
    return st, segment_path(st.dir, st.segment)


# -- 1. kill -9 of the publisher in the middle of writing --------------------------------------
# big messages (~11 KB: past Python's 8 KiB file buffer and the 4 KiB coalescing limit), so the
# open epoch's records are in the segment file, uncommitted, when the publisher is killed
BIG = dict(msgs=2, recs=100, pad=100)
BIG_ARGS = ["--msgs", 2, "--recs", 100, "--pad", 100]


def test_kill9_mid_epoch_restart_resumes_from_the_log_no_partial_no_duplicate(tmp_path):
    cat = tmp_path / "cat"
    p1 = _spawn("publish", cat, "t", "--last", 4, "--open-msgs", 2, "--pause-at", 0, *BIG_ARGS,
                stdin=True)
    p2 = None
    try:
        _read_until(p1, "ready")
        sub = Subscriber("t", Catalog(cat), recover=True, timeout=10, ping_interval=0.3)
        assert sub.wait_ready(10)
        live = EpochReader(sub, timeout=20)
        _read_until(p1, "paused 0")
        _say(p1)
        _read_until(p1, "sent 2")  # epochs 0..3 complete, 2 messages of epoch 4 sent
        deadline = time.monotonic() + 10
        while sub.stats["delivered"] < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sub.stats["delivered"] == 10  # the live subscriber holds a partial epoch 4
        st, seg = _segment(cat)
        assert st.lower == (4,)
        uncommitted = seg.stat().st_size - st.committed
        assert uncommitted > 0  # the segment holds epoch 4's records, not indexed
        live.wait_for(3)
        _kill(p1)
        assert live.times() == [0, 1, 2, 3]

        p2 = _spawn("publish", cat, "t", "--resume", "--last", 7, "--pause-end", *BIG_ARGS,
                    stdin=True)
        ready = _read_until(p2, "ready")
        assert json.loads(ready[2]) == [4]  # pub.lower: the first incomplete epoch
        assert json.loads(ready[3]) == [4]  # pub.upper recovered: epoch 4 had begun
        _read_until(p2, "paused end")  # epochs 4 (re-sent whole), 5, 6 complete
        live.wait_for(6)
        _say(p2)
        _read_until(p2, "closed")
        rc, _, err = _finish(p2)
        assert rc == 0, err
        live.join(20)
        sub.close()
        # the restarted publisher truncated exactly the uncommitted tail, and said so
        assert f"WARNING epochstream.history epoch log t/0: truncating {uncommitted} bytes" in err
        want = _exact(range(7), **BIG)
        assert live.error is None, live.error
        assert not [i for i in live.items if isinstance(i, Gap)]  # filled from history
        assert _seen(live.items) == want  # every epoch once, whole, in order
        assert sub.stats["rejoins_filled"] == 1
        assert _earliest(cat) == want
        assert _history(cat) == want
        assert Catalog(cat).lookup("t").partition_info[0].state == "closed"
    finally:
        _kill(p1)
        if p2 is not None:
            _kill(p2)


def test_restarted_publisher_that_closed_before_the_subscriber_noticed(tmp_path):
    cat = tmp_path / "cat"
    p1 = _spawn("publish", cat, "t", "--last", 4, "--open-msgs", 2, "--pause-at", 0, *BIG_ARGS,
                stdin=True)
    try:
        _read_until(p1, "ready")
        sub = Subscriber("t", Catalog(cat), recover=True, timeout=2, ping_interval=0.3)
        assert sub.wait_ready(10)
        _read_until(p1, "paused 0")
        _say(p1)
        _read_until(p1, "sent 2")
        time.sleep(0.3)  # (the subscriber's sockets receive it; it is not read yet)
        _kill(p1)
        rc, _, err = _finish(_spawn("publish", cat, "t", "--resume", "--last", 7, *BIG_ARGS))
        assert rc == 0, err
        # only now does the subscriber read: its publisher is dead, the successor closed
        got = _seen(e for e in sub.epochs(timeout=10) if not isinstance(e, Gap))
        sub.close()
        assert got == _exact(range(7), **BIG)
    finally:
        _kill(p1)


# -- 2. a bit-flipped or truncated segment --------------------------------------------------
SMALL = dict(msgs=2, recs=4)
SMALL_ARGS = ["--msgs", 2, "--recs", 4]


def _publish_closed(cat, last=5):
    rc, out, err = _finish(_spawn("publish", cat, "t", "--last", last, *SMALL_ARGS))
    assert rc == 0 and "closed" in out, err


def _raises_corrupt(read, prefix_ok):
    """``read(out)`` appends epochs to ``out`` and must raise HistoryCorrupt; returns what it
    delivered before (checked to be a prefix of ``prefix_ok``)."""
    out = []
    with pytest.raises(HistoryCorrupt) as info:
        read(out)
    assert out == prefix_ok[:len(out)], "a corrupt epoch was delivered as data"
    return out, info.value


def _read_history(cat, **kw):
    def read(out):
        for e in History("t", cat).epochs(**kw):
            out.append((e.time, [tuple(r) for r in e.records]))
    return read


def _read_earliest(cat):
    def read(out):
        with Subscriber("t", cat, start="earliest", timeout=5) as sub:
            for e in sub.epochs(timeout=5):
                out.append((e.time, [tuple(r) for r in e.records]))
    return read


def test_bit_flipped_segment_is_detected_and_never_delivered(tmp_path):
    cat = tmp_path / "cat"
    _publish_closed(cat)
    want = _exact(range(5), **SMALL)
    assert _history(cat) == want
    c = Catalog(cat)
    rec = next(r for r in c.history_epochs("t", 0) if r.time == 2)
    assert rec.messages == 2 and len(rec.extents) == 1
    seg = segment_path(c.history_state("t", 0).dir, rec.segment)
    start, length = rec.extents[0]
    h = RECORD_HEADER.size
    first_len = RECORD_HEADER.unpack_from(seg.read_bytes(), start)[0]
    second = start + h + first_len
    places = {"length": start, "crc": start + 5, "kind": start + 8, "time header": start + h + 3,
              "payload": start + h + first_len - 2, "2nd record payload": start + length - 1,
              "2nd record crc": second + 4}
    clean = seg.read_bytes()
    for where, pos in places.items():
        damaged = bytearray(clean)
        damaged[pos] ^= 0x04
        seg.write_bytes(bytes(damaged))
        for read in (_read_history(cat), _read_earliest(cat)):
            got, exc = _raises_corrupt(read, want)
            assert [t for t, _ in got] in ([], [0], [0, 1]), where  # never epoch 2 or later
            assert exc.path == str(seg), where
        # epochs after the damaged one are still readable on their own
        assert _history(cat, since=3) == want[3:], where
        seg.write_bytes(clean)
    assert _history(cat) == want  # undamaged again: it was the flip that was detected


def test_truncated_segment_is_detected_and_never_delivered(tmp_path):
    cat = tmp_path / "cat"
    _publish_closed(cat)
    want = _exact(range(5), **SMALL)
    c = Catalog(cat)
    rec = next(r for r in c.history_epochs("t", 0) if r.time == 3)
    seg = segment_path(c.history_state("t", 0).dir, rec.segment)
    start, length = rec.extents[0]
    os.truncate(seg, start + length // 2)  # cut in the middle of epoch 3
    for read in (_read_history(cat), _read_earliest(cat)):
        got, exc = _raises_corrupt(read, want)
        assert [t for t, _ in got] in ([], [0], [0, 1], [0, 1, 2])
        assert exc.path == str(seg)
    assert _history(cat, until=3) == want[:3]  # what is before the cut is intact
    seg.unlink()  # the whole segment gone
    with pytest.raises(HistoryCorrupt, match="missing"):
        _history(cat)


def test_restart_on_a_log_shorter_than_its_index_refuses(tmp_path):
    """A killed publisher's segment that lost committed bytes: the restarted publisher must not
    resume on it (nor truncate the index to fit): HistoryCorrupt, before it registers."""
    cat = tmp_path / "cat"
    p1 = _spawn("publish", cat, "t", "--last", 4, "--end", "hang", *SMALL_ARGS)
    try:
        _read_until(p1, "hanging")
        _kill(p1)
    finally:
        _kill(p1)
    st, seg = _segment(cat)
    assert st.lower == (4,) and seg.stat().st_size == st.committed
    os.truncate(seg, st.committed - 5)
    rc, out, err = _finish(_spawn("publish", cat, "t", "--resume", "--last", 6, *SMALL_ARGS))
    assert rc != 0 and "ready" not in out
    assert "HistoryCorrupt" in err and str(seg) in err
    assert Catalog(cat).history_state("t", 0).committed == st.committed  # index untouched


# -- 3. the log cannot be written --------------------------------------------------------------
@pytest.mark.parametrize("fails_in", ["send", "advance_to"])
def test_full_disk_rlimit_fsize_aborts_and_never_completes_the_unlogged_epoch(tmp_path, fails_in):
    """RLIMIT_FSIZE just above the segment's size before epoch 3 (SIGXFSZ ignored: EFBIG).
    ``send``: epoch 3 is one 100 KB message, its write fails at once. ``advance_to``: epoch 3 is
    small (buffered, sent to subscribers), the frontier record's write fails: epoch 3 must not
    complete anywhere. Epochs 0..2 are big so the segment, not the catalog, hits the limit."""
    cat = tmp_path / "cat"
    pad2 = 5000 if fails_in == "send" else 10
    args = ["--msgs", 1, "--recs", 20, "--pad", 5000, "--pad-from", 3, "--pad2", pad2]
    p1 = _spawn("publish", cat, "t", "--last", 6, "--pause-at", 0, "--fsize-at", 3,
                "--fsize-slack", 200, *args, stdin=True)
    try:
        _read_until(p1, "ready")
        sub = Subscriber("t", Catalog(cat), timeout=10)
        assert sub.wait_ready(10)
        live = EpochReader(sub, timeout=20)
        _read_until(p1, "paused 0")
        _say(p1)
        _read_until(p1, "limited")
        # the loop logs asynchronously: the failing write is epoch 3's, the call that reports
        # it is the next one (a send, advance_to or close at epoch 3 or later)
        words = _read_until(p1, "HistoryWriteError")
        assert words[1] in ("send", "advance_to", "close") and int(words[2]) >= 3, words
        rc, _, err = _finish(p1)
        assert rc == 3
        assert "File too large" in err and "aborted: the epoch log failed" in err
        live.join(20)
        sub.close()
    finally:
        _kill(p1)
    before = [(t, [tuple(r) for r in epoch_records(t, 1, 20, 5000)]) for t in range(3)]
    assert isinstance(live.error, PublisherAborted), live.error
    assert _seen(live.items) == before  # never epoch 3
    assert Catalog(cat).lookup("t").partition_info[0].state == "aborted"
    assert _history(cat) == before
    # the disk has room again: a restarted publisher resumes at epoch 3, nothing is lost
    p2 = _spawn("publish", cat, "t", "--resume", "--last", 6, *args)
    ready = _read_until(p2, "ready")
    rc, _, err = _finish(p2)
    assert rc == 0, err
    assert json.loads(ready[2]) == [3]
    want = before + [(t, [tuple(r) for r in epoch_records(t, 1, 20, pad2)]) for t in (3, 4, 5)]
    assert _history(cat) == want
    assert _earliest(cat) == want


def _make_unwritable(path: Path):
    """chmod 0o500; as root (which ignores permissions) ``chattr +i`` instead, or skip.
    Returns the undo function."""
    if os.geteuid() != 0:
        os.chmod(path, 0o500)
        return lambda: os.chmod(path, 0o700)
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"running as root and chattr +i is unavailable ({r.stderr.strip()}): "
                    f"root ignores directory permissions")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_unwritable_log_directory_aborts_and_loses_nothing(tmp_path):
    """The partition's log directory becomes unwritable mid-stream: the next segment cannot be
    created (segment_bytes=4096, epochs of ~1.6 KB), so the publisher aborts with
    HistoryWriteError; no epoch it did not log completes; a restart resumes after the last
    logged one."""
    cat = tmp_path / "cat"
    args = ["--msgs", 1, "--recs", 10, "--pad", 150, "--segment-bytes", 4096]
    p1 = _spawn("publish", cat, "t", "--last", 8, "--pause-at", 0, "--pause-at", 2, *args,
                stdin=True)
    undo = None
    try:
        _read_until(p1, "ready")
        sub = Subscriber("t", Catalog(cat), timeout=10)
        assert sub.wait_ready(10)
        live = EpochReader(sub, timeout=20)
        _read_until(p1, "paused 0")
        _say(p1)
        _read_until(p1, "paused 2")
        undo = _make_unwritable(Path(Catalog(cat).history_state("t", 0).dir))
        _say(p1)
        words = _read_until(p1, "HistoryWriteError")
        rc, _, err = _finish(p1)
        assert rc == 3 and "could not start segment" in err, err
        live.join(20)
        sub.close()
    finally:
        _kill(p1)
        if undo is not None:
            undo()
    failed = int(words[2])
    logged = [t for t, _ in _history(cat)]
    assert logged == list(range(len(logged))) and 2 <= len(logged) <= failed + 1
    assert isinstance(live.error, PublisherAborted), live.error
    assert _seen(live.items) == _exact(logged, 1, 10, 150)  # exactly the logged epochs
    assert Catalog(cat).lookup("t").partition_info[0].state == "aborted"
    p2 = _spawn("publish", cat, "t", "--resume", "--last", 8, *args)
    ready = _read_until(p2, "ready")
    rc, _, err = _finish(p2)
    assert rc == 0, err
    assert json.loads(ready[2]) == [len(logged)]
    assert _history(cat) == _exact(range(8), 1, 10, 150)


# -- 4. a durable subscriber killed between receiving and acking ---------------------------------
def _live_publisher(cat):
    pub = Publisher("t", catalog=Catalog(cat), retention=Retention(), heartbeat_interval=0.2)

    def epoch(t):
        for m in range(SMALL["msgs"]):
            pub.send(t, [list(r) for r in epoch_records(t, 1, SMALL["recs"])])
        pub.advance_to(t + 1)
    return pub, epoch


def _got(words, t):
    """Check a durable peer's "got T N DIGEST" line against the expected epoch T."""
    recs = epoch_records(t, 1, SMALL["recs"]) * SMALL["msgs"]
    assert words == ["got", str(t), str(len(recs)), str(digest(recs))], words


def test_durable_subscriber_killed_before_ack_gets_the_epoch_again_whole(tmp_path):
    cat = tmp_path / "cat"
    pub, epoch = _live_publisher(cat)
    try:
        for t in range(4):
            epoch(t)
        # acks 0, 1, 2 and 4 (not 3); killed after receiving 5, before acking it
        peer = _spawn("durable", cat, "t", "d1", "--start", 0, "--ack", "0,1,2,4", "--stop-at", 5)
        try:
            assert _read_until(peer, "held") == ["held", "[0]"]
            for t in range(4, 6):
                epoch(t)
            for t in range(6):
                _got(_read_until(peer, "got"), t)
                if t in (0, 1, 2, 4):
                    assert _read_until(peer, "acked") == ["acked", str(t)]
            _read_until(peer, "stopped 5")
            _kill(peer)
        finally:
            _kill(peer)
        info = Catalog(cat).durable("t", "d1")
        assert (info.position, info.acked, info.holder_alive) == ((3,), (4,), False)
        for t in (6, 7):
            epoch(t)
        pub.close(wait=True)
        # the holder is dead: claimed without takeover
        with Subscriber("t", Catalog(cat), durable="d1", timeout=5) as sub:
            assert sub.position == (3,)
            got = []
            for e in sub.epochs(timeout=5):
                got.append(e)
                sub.ack(e)
            assert sub.position == (8,)  # all acked, the stream finished: a next run goes on at 8
        recs = lambda t: [tuple(r) for r in epoch_records(t, 1, SMALL["recs"]) * SMALL["msgs"]]
        # 3 and 5 again, whole; 0, 1, 2 and 4 (acked) never again
        assert _seen(got) == [(t, recs(t)) for t in (3, 5, 6, 7)]
    finally:
        pub.close()


# -- 5. two processes, one durable name -------------------------------------------------------
def test_same_durable_name_held_taken_over_fenced_and_freed_by_death(tmp_path):
    cat = tmp_path / "cat"
    pub, epoch = _live_publisher(cat)
    a = c = None
    try:
        epoch(0)
        epoch(1)
        a = _spawn("durable", cat, "t", "x", "--start", 0, "--interactive", stdin=True)
        assert _read_until(a, "held") == ["held", "[0]"]
        _got(_read_until(a, "got"), 0)
        _say(a, "ack")
        assert _read_until(a, "acked") == ["acked", "0"]
        _got(_read_until(a, "got"), 1)  # received, not acked yet
        with pytest.raises(SubscriptionHeld, match="takeover=True"):
            Subscriber("t", Catalog(cat), durable="x", timeout=5)
        b = Subscriber("t", Catalog(cat), durable="x", takeover=True, timeout=5)
        try:
            assert b.position == (1,)
            it = b.epochs(timeout=5)
            e = next(it)
            assert _seen([e]) == [(1, [tuple(r) for r in epoch_records(1, 1, 4) * 2])]
            b.ack(e)
            _say(a, "ack")  # the first holder's late ack of epoch 1 is refused
            assert _read_until(a, "fenced") == ["fenced", "1"]
            info = Catalog(cat).durable("t", "x")
            assert (info.position, info.holder, info.holder_pid) == ((2,), b.id, os.getpid())
            epoch(2)
            e = next(it)
            assert e.time == 2
            b.ack(e)
            _kill(a)
            assert Catalog(cat).durable("t", "x").position == (3,)
        finally:
            b.close()
        # a holder killed with SIGKILL (no release) does not block the name
        c = _spawn("durable", cat, "t", "y", "--start", 0, "--stop-at", 0)
        _read_until(c, "stopped 0")
        with pytest.raises(SubscriptionHeld):
            Subscriber("t", Catalog(cat), durable="y", timeout=5)
        _kill(c)
        with Subscriber("t", Catalog(cat), durable="y", timeout=5) as d:
            assert d.position == (0,)  # nothing was acked: epoch 0 comes again
            assert next(d.epochs(timeout=5)).time == 0
            assert Catalog(cat).durable("t", "y").holder == d.id
    finally:
        for p in (a, c):
            if p is not None:
                _kill(p)
        pub.close()


# -- 6. start older than the retained history --------------------------------------------------
def test_start_older_than_retained_history_and_expired_durable(tmp_path):
    cat = tmp_path / "cat"
    args = ["--msgs", 1, "--recs", 10, "--pad", 150, "--segment-bytes", 4096, "--max-epochs", 3]
    p = _spawn("publish", cat, "t", "--last", 20, "--pause-at", 3, *args, stdin=True)
    try:
        _read_until(p, "paused 3")
        # a durable subscription that acks epoch 0 only, then goes away
        with Subscriber("t", Catalog(cat), durable="slow", start=0, timeout=5) as sub:
            e = next(sub.epochs(timeout=5))
            assert e.time == 0
            sub.ack(e)
            assert sub.position == (1,)
        _say(p)
        rc, out, err = _finish(p)
        assert rc == 0 and "closed" in out, err
    finally:
        _kill(p)
    assert "durable subscription 'slow' of 't' expired" in err
    c = Catalog(cat)
    st = c.history_state("t", 0)
    retained = History("t", c).since
    assert retained == st.since and 1 <= 20 - retained[0] <= 3  # max_epochs=3: old segments gone
    assert sorted(os.listdir(st.dir)) == [segment_path(st.dir, s.seq).name for s in st.segments]
    want = _exact(range(retained[0], 20), 1, 10, 150)
    assert _history(c) == want
    with pytest.raises(HistoryUnavailable) as info:
        _history(c, since=0)
    assert info.value.retained == retained
    for start in (0, retained[0] - 1):
        with pytest.raises(HistoryUnavailable) as info:
            with Subscriber("t", c, start=start, timeout=5) as sub:
                list(sub.epochs(timeout=5))
        assert info.value.retained == retained
    with Subscriber("t", c, start=retained[0], timeout=5) as sub:  # exactly what is retained
        assert _seen(sub.epochs(timeout=5)) == want
    assert c.durable("t", "slow").state == "expired"
    with pytest.raises(SubscriptionExpired) as info:
        Subscriber("t", c, durable="slow", timeout=5)
    assert (info.value.name, info.value.acked) == ("slow", (1,))


def test_subscription_expired_says_what_is_retained(tmp_path):
    c = Catalog(tmp_path)
    ret = Retention(segment_bytes=4096, max_epochs=3, max_bytes=None, max_age=None)
    with Publisher("t", catalog=c, retention=ret) as pub:
        pub.send(0, [[0, "x" * 1500]])
        pub.advance_to(1)
        with Subscriber("t", c, durable="slow", start=0, timeout=5) as sub:
            sub.ack(next(sub.epochs(timeout=5)))
        for t in range(1, 20):
            pub.send(t, [[t, "x" * 1500]])
            pub.advance_to(t + 1)
    assert c.durable("t", "slow").state == "expired"
    with pytest.raises(SubscriptionExpired) as info:
        Subscriber("t", c, durable="slow", timeout=5)
    assert info.value.retained == History("t", c).since
