"""Remote history, adversarially: a publisher with retention serves its partition's epoch log on
its own ROUTER (``r`` → ``R`` / ``X history``), read by ``RemoteLog``, ``History(source=...)``
and a Subscriber whose history fill goes through the publisher
(``EPOCHSTREAM_HISTORY_SOURCE=publisher``).

Publishers run in their own processes (``tests/history/history_peer.py publish``) and are
killed with SIGKILL; every socket is a real ZeroMQ socket on 127.0.0.1; raw DEALERs and
ROUTERs speak the wire format of ``epochstream.wire`` directly where a test needs a hostile or
broken peer. Every test compares exact epochs and records, or exact answers and counts, never
only "no exception". Tests named in a docstring starting "BUG" fail on the code they describe.
"""
from __future__ import annotations

import collections
import contextlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from history_peer import epoch_records, peer_times, records
from hypothesis_profiles import examples
from peer_processes import kill as _kill, read_until as _read_until
from peer_procs import EpochReader, PublishPeer
from epochstream import Catalog, History, Publisher, Retention, Subscriber, wire
from epochstream.catalog.holders import HOST
from epochstream.log import RECORD_HEADER, segment_path
from epochstream.errors import HistoryCorrupt, HistoryUnavailable
from epochstream.events import Gap
from epochstream.log import RemoteLog

CTX = zmq.Context.instance()
ENV = "EPOCHSTREAM_HISTORY_SOURCE"


# -- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def peers(*specs):
    """Start ``PublishPeer(*spec)`` for each spec; kill them all at the end."""
    started = []
    try:
        for spec in specs:
            started.append(PublishPeer(*spec))
        yield started
    finally:
        for p in started:
            p.close()


@contextlib.contextmanager
def history_source(value):
    """``EPOCHSTREAM_HISTORY_SOURCE=value`` for the block (Hypothesis examples cannot use the
    function-scoped monkeypatch fixture)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def endpoint(cat, topic, partition=0) -> str:
    info = Catalog(cat).lookup(topic)
    return next(p.endpoint for p in info.partition_info if p.index == partition)


def seen(epochs) -> list:
    """``[(time, [records as tuples])]``, times of product orders as tuples."""
    return [(e.time, [_tup(r) for r in e.records]) for e in epochs]


def _tup(v):
    return tuple(_tup(x) for x in v) if isinstance(v, (list, tuple)) else v


def expected(times, msgs, recs, pad=0, parts=(None,)):
    """``[(time, records)]`` of epochs as the peers send them (records of every partition in
    ``parts``, in partition order: how History and a Subscriber combine them)."""
    out = []
    for t in times:
        label = list(t) if isinstance(t, tuple) else t
        out.append((t, [_tup(r) for p in parts for r in epoch_records(label, msgs, recs, pad, p)]))
    return out


def dealer(ep, rcvhwm=None):
    s = CTX.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if rcvhwm is not None:
        s.setsockopt(zmq.RCVHWM, rcvhwm)
    s.connect(ep)
    return s


def read_frames(topic="t", partition=0, req=0, time_=0, received=0):
    """An ``r``; ``received``: the R answers the sending connection has received so far (the
    publisher counts the others against the connection's bound of 8)."""
    return wire.encode_control(wire.READ, topic=topic, partition=partition, req=req, time=time_,
                               received=received)


def answer(sock, timeout=5.0):
    """One decoded answer to an ``r`` (``("R", req, time, payloads)`` or the Notice), or None."""
    if not sock.poll(int(timeout * 1000)):
        return None
    got = wire.decode_history(sock.recv_multipart())
    return got if isinstance(got, wire.Notice) else ("R", *got)


def drain_answers(sock, quiet=0.5) -> list:
    """Every answer waiting on ``sock``, until it is quiet for ``quiet`` seconds."""
    out = []
    while (a := answer(sock, quiet)) is not None:
        out.append(a)
    return out


def collect_answers(sock, n, timeout=10.0) -> list:
    """``n`` answers from ``sock`` (fewer if they do not come within ``timeout``), then any
    that arrive within 50 ms more (there should be none)."""
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and (a := answer(sock, max(0.0, deadline - time.monotonic()))):
        out.append(a)
    return out + drain_answers(sock, 0.05)


class RawLive:
    """A live subscriber at the socket level: a DEALER that says hello and counts what arrives,
    frame by frame. ``data``: ``[(time, records)]`` of every ``D`` message (each checked to be
    exactly 3 frames), ``frames``: frames per kind, ``arrivals``: monotonic arrival times of
    ``D``s, ``bad``: anything malformed."""

    def __init__(self, ep, topic="t", partition=0):
        self.ep, self.topic, self.partition = ep, topic, partition
        self.data, self.frames, self.arrivals, self.bad = [], collections.Counter(), [], []
        self.snapshot = threading.Event()
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()
        assert self.snapshot.wait(10), "no snapshot"

    def _run(self):
        s = dealer(self.ep)
        s.send_multipart(wire.encode_control(wire.HELLO, topic=self.topic,
                                             partition=self.partition, id=uuid.uuid4().hex))
        try:
            while not self._stop.is_set():
                if not s.poll(20):
                    continue
                frames = s.recv_multipart()
                kind = frames[0]
                self.frames[bytes(kind[:1]).decode()] += len(frames)
                if kind == wire.SNAPSHOT:
                    self.snapshot.set()
                elif kind == wire.DATA:
                    if len(frames) != 3:
                        self.bad.append(frames)
                        continue
                    self.arrivals.append(time.monotonic())
                    self.data.append((_tup(msgpack.unpackb(frames[1])),
                                      [_tup(r) for r in msgpack.unpackb(frames[2])]))
                elif kind == wire.NOTICE:
                    self.bad.append(wire.decode(frames))
        finally:
            s.send_multipart(wire.encode_control(wire.BYE))
            s.close(0)

    def stop(self):
        self._stop.set()
        self._th.join(5)

    def epochs(self) -> list:
        """``[(time, records)]`` per time, in arrival order, messages concatenated."""
        by: dict = {}
        for t, recs in self.data:
            by.setdefault(t, []).extend(recs)
        return list(by.items())

    def max_gap(self) -> float:
        a = self.arrivals
        return max((b - x for x, b in zip(a, a[1:])), default=0.0)


# -- 1. the same epochs from the publisher as from the disk ---------------------------------------
SMALL = ["--msgs", 3, "--recs", 4, "--pad", 40]


def _same_from_both(cat, topic, want, positions):
    """History(source="publisher") == History(source="disk") == want, for every (since, until);
    returns how many epochs were read remotely."""
    read = 0
    with History(topic, Catalog(cat), source="disk") as disk, \
            History(topic, Catalog(cat), source="publisher", timeout=5) as remote:
        assert seen(disk.epochs()) == want
        got = list(remote.epochs())
        assert seen(got) == want
        read += len(got)
        for since, until in positions:
            d = [(e.time, e.records, e.messages, e.nbytes)
                 for e in disk.epochs(since=since, until=until)]
            r = [(e.time, e.records, e.messages, e.nbytes)
                 for e in remote.epochs(since=since, until=until)]
            assert r == d, (since, until)
            read += len(r)
        assert remote._remote, "nothing was read through a publisher"
    return read


def test_remote_history_equals_disk_total_order(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 8, *SMALL, "--pause-end", "--stats")) as (p,):
        p.until("paused end")
        before = p.stats().get("history_reads", 0)
        want = expected(range(8), 3, 4, 40)
        n = _same_from_both(cat, "t", want, [(3, None), (2, 5), ([0], [1]), (7, None), ([], None)])
        assert p.stats().get("history_reads", 0) - before == n  # each one was a remote read
        p.finish()


def test_remote_history_equals_disk_product_order(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "g", "--last", 4, "--order", "product(2)", "--inner", 3, *SMALL,
                "--pause-end", "--stats")) as (p,):
        p.until("paused end")
        times = [t for i in range(4) for t in peer_times("product(2)", i, 3)]
        want = expected(times, 3, 4, 40)
        n = _same_from_both(cat, "g", want, [([(1, 2), (3, 0)], None), ([(0, 1)], [(2, 2)]),
                                            ([(2, 0)], [(3, 1), (2, 2)])])
        assert p.stats()["history_reads"] == n
        # a raw read of an antichain element as a wire array
        with RemoteLog(endpoint(cat, "g"), "g", 0, timeout=5) as r:
            [(t, payloads)] = list(r.read([(2, 1)]))
        assert t == (2, 1)
        assert [msgpack.unpackb(pl) for pl in payloads] == [records([2, 1], m, 4, 40)
                                                            for m in range(3)]
        # times of the wrong shape for product(2): refused before any read
        s = dealer(endpoint(cat, "g"))
        try:
            for bad in (2, [1, 2, 3], [1], [], [True, 1]):
                s.send_multipart(read_frames("g", 0, 7, bad))
                a = answer(s)
                assert isinstance(a, wire.Notice) and a.code in ("history", "error"), (bad, a)
                if a.code == "history":
                    assert a.extra["reason"] == "error" and "wrong shape" in a.message, bad
            s.send_multipart(read_frames("g", 0, 8, [9, 0]))  # not complete yet
            a = answer(s)
            assert a.extra["reason"] == "unavailable" and "not completed" in a.message
        finally:
            s.close(0)
        p.finish()


def test_remote_history_equals_disk_three_partitions(tmp_path):
    """One publisher process per partition; partition 2 sends nothing before epoch 3 (its
    epochs 0..2 have no data there: no read of partition 2 is made for them)."""
    cat = tmp_path / "cat"
    common = ["--partitions", 3, "--tag-partition", "--last", 6, *SMALL, "--pause-end", "--stats"]
    with peers((cat, "m", "--partition", 0, *common), (cat, "m", "--partition", 1, *common),
               (cat, "m", "--partition", 2, "--first", 3, *common)) as ps:
        for p in ps:
            p.until("paused end")
        want = [(t, [_tup(r) for part in (0, 1, 2) if part != 2 or t >= 3
                     for r in epoch_records(t, 3, 4, 40, part)]) for t in range(6)]
        _same_from_both(cat, "m", want, [(2, 5), (4, None)])
        reads = [p.stats()["history_reads"] for p in ps]
        assert reads[0] == reads[1] == 6 + 3 + 2 and reads[2] == 3 + 2 + 2, reads
        # partition 2 answers a complete epoch it has no data for with an empty R
        with RemoteLog(endpoint(cat, "m", 2), "m", 2, timeout=5) as r:
            assert [(t, list(pl)) for t, pl in r.read([1])] == [(1, [])]
        for p in ps:
            p.finish()


def test_remote_to_arrow_equals_disk(tmp_path):
    pa = pytest.importorskip("pyarrow")
    cat = Catalog(tmp_path)
    with Publisher("f", catalog=cat, codec="arrow", retention=Retention()) as pub:
        for day in range(4):
            pub.send(day, pa.table({"carrier": ["AA", "UA"], "delay": [day, 2 * day]}))
            pub.send(day, pa.table({"carrier": ["DL"], "delay": [-day]}))
            pub.advance_to(day + 1)
        assert pub.flush()
        with History("f", cat, source="publisher", timeout=5) as h:
            remote = h.to_arrow(since=1)
        assert pub.stats["history_reads"] == 3
    assert remote.equals(History("f", cat, source="disk").to_arrow(since=1))
    assert remote.num_rows == 9


# -- 2. a subscriber filling its join from the publisher ------------------------------------------
LIVE = ["--msgs", 3, "--recs", 3, "--pad", 20]


def _subscribe(cat, until, **kw):
    """Epochs (and Gaps) of a Subscriber up to epoch ``until``; the subscriber too."""
    sub = Subscriber("t", Catalog(cat), timeout=10, **kw)
    out = []
    try:
        for e in sub.epochs(timeout=15):
            out.append(e)
            if getattr(e, "time", None) == until:
                break
    finally:
        sub.close()
    return out, sub


@settings(max_examples=examples(4))
@given(start=st.sampled_from(["earliest", 0, 2, 5]), join_after=st.integers(0, 6),
       jitter=st.sampled_from([0.0, 0.002, 0.007, 0.015]))
def test_subscriber_joining_a_live_publisher_fills_from_it(tmp_path_factory, start, join_after,
                                                           jitter):
    """The publisher keeps sending (a message every 4 ms) while the subscriber joins, so the
    join lands anywhere, mid-epoch too: every epoch at or beyond the position comes exactly
    once and whole, the ones history supplies all through the publisher."""
    cat = tmp_path_factory.mktemp("join") / "cat"
    last = 13
    with peers((cat, "t", "--last", last + 1, *LIVE, "--msg-interval", 0.004, "--pause-end",
                "--stats")) as (p,):
        p.until(f"epoch {join_after}")
        time.sleep(jitter)
        with history_source("publisher"):
            got, sub = _subscribe(cat, last, start=start)
        stats = p.stats()
        p.finish()
    first = 0 if start == "earliest" else start
    assert not [e for e in got if isinstance(e, Gap)]
    assert seen(got) == expected(range(first, last + 1), 3, 3, 20)
    # every epoch history supplied was one remote read: none came from the files
    assert stats.get("history_reads", 0) == sub.stats["history_epochs"]
    if sub.stats["history_epochs"]:
        assert sub._fill._history.source == "publisher"
    if first <= join_after:  # epochs complete before the join can only come from history
        assert sub.stats["history_epochs"] >= join_after - first + 1


def test_durable_subscriber_resumes_through_the_publisher(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 30, *LIVE, "--interval", 0.02, "--pause-end",
                "--stats")) as (p,):
        p.until("epoch 3")
        with history_source("publisher"):
            sub = Subscriber("t", Catalog(cat), durable="d", start=2, timeout=10)
            first = []
            for e in sub.epochs(timeout=10):
                first.append(e)
                if e.time == 8:
                    break  # received, never acked
                sub.ack(e)
            assert sub.position == (8,)
            sub.close()
            time.sleep(0.1)  # the publisher goes on: 8 and more are history on resume
            again, sub2 = _subscribe(cat, 29, durable="d")
        stats = p.stats()
        p.finish()
    assert seen(first) == expected(range(2, 9), 3, 3, 20)
    assert seen(again) == expected(range(8, 30), 3, 3, 20)  # 8 again, whole; nothing twice
    assert sub2.stats["history_epochs"] >= 1
    assert stats["history_reads"] == sub.stats["history_epochs"] + sub2.stats["history_epochs"]


def test_evicted_subscriber_recovers_through_the_publisher(tmp_path):
    """The publisher evicts a subscriber that reads nothing (the connection is cut, X lagged);
    with recover=True it re-joins and the epochs it missed come from the publisher's log: no
    Gap, every epoch once, whole."""
    cat = tmp_path / "cat"
    n = 30
    with peers((cat, "t", "--last", n, "--msgs", 5, "--recs", 1, "--pad", 30_000,
                "--sndhwm", 2, "--max-queue-messages", 5, "--pause-at", 0, "--pause-end",
                "--stats")) as (p,):
        p.until("paused 0")
        with history_source("publisher"):
            sub = Subscriber("t", Catalog(cat), recover=True, rcvhwm=2, timeout=10)
            try:
                assert sub.wait_ready(10)
                p.say()  # the subscriber reads nothing while the epochs go out
                p.until("paused end")
                got = []
                for e in sub.epochs(timeout=15):
                    got.append(e)
                    if isinstance(e, Gap) or e.time == n - 1:
                        break
            finally:
                sub.close()
        stats = p.stats()
        p.finish()
    assert stats.get("subscribers_evicted", 0) >= 1, stats
    assert not [g for g in got if isinstance(g, Gap)]
    assert seen(got) == expected(range(n), 5, 1, 30_000)
    assert sub.stats["rejoins_filled"] >= 1
    assert stats["history_reads"] == sub.stats["history_epochs"] >= 1


def test_answers_to_a_reader_whose_pipe_is_full_are_sent_later_not_dropped(tmp_path):
    """BUG (history_server.py, HistoryServer.drain): the result of sending an answer was
    ignored, so answers that found the reader's pipe full (a Publisher's ``sndhwm``, 2 here, or
    a reader that is slow to take ~1 MB answers) were dropped, and the reader waited for them
    until its timeout: HistoryUnavailable. A reader that pauses with 8 reads outstanding must
    get all 8 answers; a History read must complete."""
    cat = tmp_path / "cat"
    n = 12
    # heartbeat 5 s: the pausing DEALER below (its input stopped) is not dropped meanwhile
    with peers((cat, "t", "--last", n, *BIG, "--sndhwm", 2, "--heartbeat", 5, "--pause-end",
                "--stats")) as (p,):
        p.until("paused end")
        want = expected(range(n), 4, 40, 6000)
        s = dealer(endpoint(cat, "t"), rcvhwm=1)
        s.setsockopt(zmq.RCVBUF, 4096)
        try:
            for i in range(8):
                s.send_multipart(read_frames(req=i, time_=i))
            time.sleep(0.5)  # the reader is busy elsewhere
            got = collect_answers(s, 8, timeout=5)
        finally:
            s.close(0)
        assert [a[:3] for a in got] == [("R", i, i) for i in range(8)], \
            [a[:3] if isinstance(a, tuple) else a for a in got]
        assert [(a[2], [_tup(r) for pl in a[3] for r in msgpack.unpackb(pl)]) for a in got] \
            == want[:8]
        with History("t", Catalog(cat), source="publisher", timeout=3) as h:
            assert seen(h.epochs()) == want
        p.finish()


def test_recovery_after_a_publisher_restart_reads_through_the_new_publisher(tmp_path):
    """The subscriber's first fill reads through publisher 1; publisher 1 is killed mid-epoch
    and a successor resumes from the log on a new endpoint; the re-join's fill must read through
    the successor (the reader reconnects to the new endpoint): every epoch once, whole."""
    cat = tmp_path / "cat"
    with history_source("publisher"), peers(
            (cat, "t", "--last", 6, "--open-msgs", 2, "--pause-at", 3, *SMALL)) as (p1,):
        p1.until("paused 3")
        ep1 = endpoint(cat, "t")
        sub = Subscriber("t", Catalog(cat), start=0, recover=True, timeout=10, ping_interval=0.3)
        try:
            assert sub.wait_ready(10)
            live = EpochReader(sub, timeout=20)
            p1.say()
            p1.until("sent 2")  # epochs 0..5 complete, 2 messages of epoch 6 sent
            live.wait_for(5)
            first = {p: r.endpoint for p, r in sub._fill._history._remote.items()}
            p1.kill()
            with peers((cat, "t", "--resume", "--last", 9, "--pause-end", "--stats",
                        *SMALL)) as (p2,):
                p2.until("paused end")
                ep2 = endpoint(cat, "t")
                live.wait_for(8)
                second = {p: r.endpoint for p, r in sub._fill._history._remote.items()}
                stats2 = p2.stats()
                p2.finish()
            live.join(20)
        finally:
            sub.close()
    assert live.error is None, live.error
    assert first == {0: ep1} and second == {0: ep2} and ep1 != ep2
    assert not [i for i in live.items if isinstance(i, Gap)]
    assert seen(live.items) == expected(range(9), 3, 4, 40)
    assert sub.stats["rejoins_filled"] == 1 and stats2["history_reads"] >= 1


def test_a_subscriber_that_joined_before_the_publisher_closed_is_filled_through_it(tmp_path):
    """Regression: the subscriber joins mid-stream (its fill needs epochs 0..2 from history)
    but reads only after the publisher called close(). It used to say bye as soon as the
    partition finished, before reading its fill, so the publisher process exited and the reads
    failed (HistoryUnavailable); now a finished partition's connection stays open while a fill
    is unread, the publisher lingers for it and serves the reads."""
    cat = tmp_path / "cat"
    with history_source("publisher"), peers(
            (cat, "t", "--last", 3, "--msgs", 4, "--recs", 2, "--msg-interval", 0.05)) as (p,):
        p.until("epoch 1")
        time.sleep(0.07)  # in the middle of epoch 2
        with Subscriber("t", Catalog(cat), start="earliest", timeout=3) as sub:
            assert sub.wait_ready(10)
            time.sleep(1.0)  # busy elsewhere: the publisher finishes and closes meanwhile
            got = seen(sub.epochs(timeout=3))
        p.proc.wait(10)
    assert got == expected(range(3), 4, 2)


def test_a_durable_subscriber_whose_publisher_died_is_not_told_it_expired(tmp_path):
    """BUG (transport/resume.py, Resume._history_epochs): every HistoryUnavailable of a durable
    subscriber's history fill becomes SubscriptionExpired. Through the publisher that includes
    "the publisher is dead" (and "did not answer within timeout"): the subscriber is told its
    subscription expired (retained=()), whose documented remedy, ``durable reset``, skips
    epochs -- while nothing was deleted and the catalog still says "active". Expected: the
    publisher's failure (HistoryUnavailable without ``retained``, or PublisherLost)."""
    from epochstream.errors import PublisherLost, SubscriptionExpired
    cat = tmp_path / "cat"
    with history_source("publisher"), peers((cat, "t", "--last", 5, "--end", "hang")) as (p,):
        p.until("hanging")
        sub = Subscriber("t", Catalog(cat), durable="d", start=0, timeout=3)
        try:
            assert sub.wait_ready(5)
            time.sleep(0.3)  # the snapshot and the frontier updates are in its sockets
            p.kill()
            with pytest.raises((HistoryUnavailable, PublisherLost)) as info:
                list(sub.epochs(timeout=5))
        finally:
            sub.close()
    assert Catalog(cat).durable("t", "d").state == "active"
    assert not isinstance(info.value, SubscriptionExpired), info.value


# -- 3. garbage ---------------------------------------------------------------------------------
GOOD = {"topic": "t", "partition": 0, "req": 7, "time": 2, "received": 0}
_TRUE = "<the connection's true count of R answers received>"
_DROP = object()


def _hdr(**kw):
    h = dict(GOOD)
    for k, v in kw.items():
        if v is _DROP:
            h.pop(k)
        else:
            h[k] = v
    return h


P = msgpack.packb
GARBAGE = {  # name: (frames, expected code, expected reason or None)
    "no topic": ([wire.READ, P(_hdr(topic=_DROP))], "error", None),
    "no partition": ([wire.READ, P(_hdr(partition=_DROP))], "error", None),
    "no req": ([wire.READ, P(_hdr(req=_DROP))], "error", None),
    "no time": ([wire.READ, P(_hdr(time=_DROP))], "error", None),
    "topic bytes": ([wire.READ, P(_hdr(topic=b"t"))], "error", None),
    "topic int": ([wire.READ, P(_hdr(topic=3))], "error", None),
    "partition str": ([wire.READ, P(_hdr(partition="0"))], "error", None),
    "partition bool": ([wire.READ, P(_hdr(partition=False))], "error", None),
    "partition negative": ([wire.READ, P(_hdr(partition=-1))], "error", None),
    "req bool": ([wire.READ, P(_hdr(req=True))], "error", None),
    "req negative": ([wire.READ, P(_hdr(req=-1))], "error", None),
    "req > 2**31": ([wire.READ, P(_hdr(req=2 ** 31 + 1))], "error", None),
    "req float": ([wire.READ, P(_hdr(req=1.0))], "error", None),
    "time bool": ([wire.READ, P(_hdr(time=True))], "error", None),
    "time str": ([wire.READ, P(_hdr(time="2"))], "error", None),
    "time float": ([wire.READ, P(_hdr(time=2.0))], "error", None),
    "time nested": ([wire.READ, P(_hdr(time=[[1], [2]]))], "error", None),
    "time 65 ints": ([wire.READ, P(_hdr(time=list(range(65))))], "error", None),
    "time map": ([wire.READ, P(_hdr(time={"a": 1}))], "error", None),
    "time nil": ([wire.READ, P(_hdr(time=None))], "error", None),
    "time 64 ints (wrong shape)": ([wire.READ, P(_hdr(time=list(range(64))))], "history", "error"),
    "time [2] for a total order": ([wire.READ, P(_hdr(time=[2]))], "history", "error"),
    "time []": ([wire.READ, P(_hdr(time=[]))], "history", "error"),
    "time negative": ([wire.READ, P(_hdr(time=-5))], "history", "unavailable"),
    "time 2**64-1": ([wire.READ, P(_hdr(time=2 ** 64 - 1))], "history", "unavailable"),
    "time -2**63": ([wire.READ, P(_hdr(time=-2 ** 63))], "history", "unavailable"),
    "partition 2**40": ([wire.READ, P(_hdr(partition=2 ** 40))], "history", "unavailable"),
    "wrong topic": ([wire.READ, P(_hdr(topic="u"))], "history", "unavailable"),
    "wrong partition": ([wire.READ, P(_hdr(partition=1))], "history", "unavailable"),
    "header array": ([wire.READ, P([1, 2])], "error", None),
    "header str": ([wire.READ, P("x")], "error", None),
    "header not msgpack": ([wire.READ, b"\xc1"], "error", None),
    "extra frame": ([wire.READ, P(GOOD), b"x"], "error", None),
    "extra frames": ([wire.READ, P(GOOD), b"", P(GOOD)], "error", None),
    "one frame": ([wire.READ], "error", None),
    "version 2": ([b"r\x02", P(GOOD)], "error", None),
    "version 0": ([b"r\x00", P(GOOD)], "error", None),
    "kind without version": ([b"r", P(GOOD)], "error", None),
    "an R sent to the publisher": ([wire.HISTORY, P(GOOD)], "error", None),
}


def _check_notice(a, name, code, reason):
    assert isinstance(a, wire.Notice), (name, a)
    assert a.code == code, (name, a.code, a.message)
    if code == "history":
        assert a.extra.get("reason") == reason and a.extra.get("req") == 7, (name, a.extra)
    if reason == "error":  # refused as a bad time before any read, not a failed read
        assert "wrong shape" in a.message, (name, a.message)


def test_garbage_reads_are_refused_and_serving_goes_on(tmp_path):
    """Every malformed ``r`` gets exactly one X (error or history) notice; meanwhile a live
    subscriber (counted frame by frame) gets every data message, whole, and a well-formed
    reader on its own connection and on the garbage connection reads correct epochs."""
    cat = tmp_path / "cat"
    n = 60
    with peers((cat, "t", "--last", n, *SMALL, "--interval", 0.01, "--pause-at", 2,
                "--pause-end", "--stats")) as (p,):
        p.until("paused 2")
        ep = endpoint(cat, "t")
        live = RawLive(ep)
        bad = dealer(ep)
        reader = RemoteLog(ep, "t", 0, timeout=5)
        want = dict(expected(range(n), 3, 4, 40))
        try:
            p.say()  # publishing goes on while the garbage comes
            for i, (name, (frames, code, reason)) in enumerate(GARBAGE.items()):
                bad.send_multipart(frames)
                _check_notice(answer(bad), name, code, reason)
                t = i % 2
                [(got_t, payloads)] = list(reader.read([t]))  # a well-formed read in between
                assert got_t == t and [_tup(r) for pl in payloads for r in msgpack.unpackb(pl)] \
                    == want[t], name
            # the garbage connection itself still gets well-formed reads answered
            bad.send_multipart(read_frames(req=5, time_=1))
            a = answer(bad)
            assert a[:3] == ("R", 5, 1) and [_tup(r) for pl in a[3] for r in msgpack.unpackb(pl)] \
                == want[1]
            assert not drain_answers(bad, 0.2), "more than one answer to a message"
            p.until("paused end")
            time.sleep(0.3)
        finally:
            live.stop()
            reader.close()
            bad.close(0)
        stats = p.stats()
        p.finish()
    assert live.bad == []
    # at the socket level: every D is 3 frames, every data message arrived, once, in order
    assert live.frames["D"] == 3 * len(live.data) == 3 * 3 * (n - 2)
    assert live.epochs() == expected(range(2, n), 3, 4, 40)
    assert live.max_gap() < 2.0, live.max_gap()
    assert stats["bad_messages"] == sum(1 for f, c, r in GARBAGE.values() if c == "error")
    # no garbage got as far as the reader thread and failed there
    assert "Traceback" not in p.stderr() and "history read of" not in p.stderr()


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=3),
    max_leaves=12)
_field = st.sampled_from(["topic", "partition", "req", "time", "id", "x"])
_header = st.one_of(
    st.dictionaries(_field, _values, max_size=5),
    st.fixed_dictionaries({"topic": st.sampled_from(["t", "u", ""]),
                           "partition": st.integers(-1, 3) | st.booleans(),
                           "req": st.integers(-1, 2 ** 31 + 1),
                           "time": st.integers(-3, 12) | st.lists(st.integers(0, 5), max_size=3)
                           | _values,
                           "received": st.just(_TRUE) | _values}),
    _values)
_kind = st.sampled_from([wire.READ, wire.READ, wire.READ, b"r\x02", b"R\x01", b"r"])
_extra = st.lists(st.binary(max_size=4), max_size=2)


def test_fuzzed_reads_each_get_one_well_formed_answer(tmp_path):
    """Hypothesis-made ``r`` messages (any header, kind bytes, extra frames): each gets exactly
    one answer, an X notice or — only for a well-formed read of a complete epoch — the right R;
    a correct reader on the same connection is never disturbed."""
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 10, *SMALL, "--pause-end")) as (p,):
        p.until("paused end")
        ep = endpoint(cat, "t")
        want = dict(expected(range(10), 3, 4, 40))
        sock = dealer(ep)

        got_r = [0]  # R answers this connection received

        @settings(max_examples=examples(150), database=None)
        @given(kind=_kind, header=_header, extra=_extra)
        def one(kind, header, extra):
            if type(header) is dict and header.get("received") == _TRUE:
                header = dict(header, received=got_r[0])
            honest = type(header) is dict and header.get("received") == got_r[0]
            sock.send_multipart([kind, msgpack.packb(header), *extra])
            a = answer(sock)
            assert a is not None, "no answer"
            if not isinstance(a, wire.Notice):
                got_r[0] += 1
            well_formed = (kind == wire.READ and not extra and type(header) is dict
                           and type(header.get("received")) is int
                           and 0 <= header["received"] <= 2 ** 31
                           and header.get("topic") == "t"
                           and type(header.get("partition")) is int and header["partition"] == 0
                           and type(header.get("req")) is int and 0 <= header["req"] <= 2 ** 31
                           and type(header.get("time")) is int and 0 <= header["time"] < 10)
            if well_formed and not honest and isinstance(a, wire.Notice):
                assert a.code == "history" and a.extra.get("reason") == "busy", a  # it lied
            elif well_formed:
                assert a[:3] == ("R", header["req"], header["time"])
                assert [_tup(r) for pl in a[3] for r in msgpack.unpackb(pl)] \
                    == want[header["time"]]
            else:
                assert isinstance(a, wire.Notice) and a.code in ("error", "history"), a
            # a correct read on the same connection, right after
            sock.send_multipart(read_frames(req=99, time_=3, received=got_r[0]))
            b = answer(sock)
            assert b is not None and b[:3] == ("R", 99, 3)
            got_r[0] += 1
            assert answer(sock, 0.0) is None, "a second answer"

        try:
            one()
        finally:
            sock.close(0)
        assert p.alive()
        p.finish()


# -- 4. floods ---------------------------------------------------------------------------------
def _count(answers) -> collections.Counter:
    c = collections.Counter()
    for a in answers:
        c[a.extra.get("reason") if isinstance(a, wire.Notice) else "R"] += 1
    return c


@pytest.mark.slow
def test_flood_of_reads_is_refused_busy_bounded_and_live_goes_on(tmp_path):
    """One connection sends 1000 reads without reading an answer; then 20 connections send 20
    each. The server answers every read exactly once — R or busy — with at most 8 reads
    outstanding per connection and 32 in all (high-water marks sampled inside the publisher);
    a well-behaved RemoteLog reads everything meanwhile, and the live stream is not stalled."""
    cat = tmp_path / "cat"
    n = 50
    with peers((cat, "t", "--last", n, "--msgs", 2, "--recs", 2, "--pad", 3000,
                "--interval", 0.02, "--pause-at", 25, "--pause-end", "--stats")) as (p,):
        p.until("paused 25")
        ep = endpoint(cat, "t")
        live = RawLive(ep)
        want = dict(expected(range(n), 2, 2, 3000))
        before = p.stats()
        p.say()  # epochs 25..49 go out live during the floods
        flood = dealer(ep, rcvhwm=10_000)  # our pipe never stops: the bounds are the server's
        many = [dealer(ep) for _ in range(20)]
        try:
            for i in range(1000):
                flood.send_multipart(read_frames(req=i, time_=i % 25))
            for s in many:
                for i in range(20):
                    s.send_multipart(read_frames(req=i, time_=i % 25))
            t0 = time.monotonic()
            with RemoteLog(ep, "t", 0, timeout=5) as r:
                got = [(t, [_tup(x) for pl in pls for x in msgpack.unpackb(pl)])
                       for t, pls in r.read(range(25))]
            assert got == [(t, want[t]) for t in range(25)]
            assert time.monotonic() - t0 < 10
            flooded = collect_answers(flood, 1000)
            per_conn = [collect_answers(s, 20) for s in many]
        finally:
            flood.close(0)
            for s in many:
                s.close(0)
        p.until("paused end")
        time.sleep(0.2)
        live.stop()
        after = p.stats()
        p.finish()
    c1 = _count(flooded)
    assert sum(c1.values()) == len(flooded) == 1000, c1  # every read answered, once
    assert set(c1) <= {"R", "busy"}
    assert c1["R"] >= 8 and c1["busy"] > 0, c1
    for a in flooded:  # the reads that were served are right
        if not isinstance(a, wire.Notice):
            assert a[1] % 25 == a[2] and [_tup(x) for pl in a[3] for x in msgpack.unpackb(pl)] \
                == want[a[2]]
    cm = [_count(x) for x in per_conn]
    assert all(sum(c.values()) == 20 and set(c) <= {"R", "busy"} for c in cm), cm
    total = c1 + sum(cm, collections.Counter())
    assert total["busy"] > 0
    # (the well-behaved reader may have been told busy too, and asked again)
    assert after.get("history_refused", 0) - before.get("history_refused", 0) >= total["busy"]
    assert after["history_reads"] - before.get("history_reads", 0) == total["R"] + 25
    high = after["high"]
    assert high["per_peer"] <= 8 and high["outstanding"] <= 32, high
    assert high["replies"] <= 32 and high["queued"] <= 32, high
    assert high["outstanding"] >= 8, high  # the sampler saw the flood
    # the live subscriber got every message of the epochs sent during the flood, whole
    assert live.bad == []
    assert live.epochs() == expected(range(25, n), 2, 2, 3000)
    assert live.max_gap() < 2.0, live.max_gap()


# Clients whose own sockets may end in libzmq's ``!_io_error`` abort (a stopped input whose
# connection drops) run in a process of their own, never in the test process.
HOARDER = """
import sys, time, zmq
from epochstream import wire
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.RCVHWM, 1)
s.setsockopt(zmq.RCVBUF, 4096)
s.connect(sys.argv[1])
for n in range(int(sys.argv[2])):
    s.send_multipart(wire.encode_control(wire.READ, topic="t", partition=0, req=n, time=n % 20,
                                         received=0))  # honest: it reads nothing
    if n % 8 == 7:
        time.sleep(0.05)  # the allowed pace: 8 outstanding per connection
print("sent", flush=True)
sys.stdin.readline()
"""

FLOODER = """
import sys, time, zmq
from epochstream import wire
ep, conns, seconds, cycles = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
msg = wire.encode_control(wire.READ, topic="t", partition=0, req=1, time=1, received=0)
sent = 0
for _ in range(cycles):  # connect, send as fast as possible (never reading), go away
    socks = []
    for _ in range(conns):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.connect(ep)
        socks.append(s)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in socks:
            for _ in range(100):
                try:
                    s.send_multipart(msg, zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
    for s in socks:
        s.close(0)
    time.sleep(0.3)
print("flooded", sent, flush=True)
"""


def _client(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)


def _status(pid, field) -> float:
    """``field`` (VmRSS, VmHWM) of process ``pid``, MB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":")) / 1024


@pytest.mark.slow
def test_a_client_that_never_reads_its_answers_cannot_grow_the_publishers_memory(tmp_path):
    """BUG (history_server.py, HistoryServer.drain): a read counts as outstanding only until its
    answer is handed to the ROUTER, not until the client took it. A client that asks at the
    allowed pace (8 reads, pause, 8 more) and never reads makes the publisher keep every answer
    in that peer's ZeroMQ pipe -- up to SNDHWM (1000) epochs per connection. With ~1 MB epochs,
    320 reads grew the publisher by ~300 MB. Expected: about MAX_PENDING (32) epochs held for
    history at most, then busy."""
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 20, "--msgs", 4, "--recs", 50, "--pad", 5000,
                "--pause-end", "--stats")) as (p,):
        p.until("paused end")
        base = _status(p.proc.pid, "VmHWM")
        hoarder = _client(HOARDER, endpoint(cat, "t"), 320)
        try:
            _read_until(hoarder, "sent")
            time.sleep(0.3)
            grown = _status(p.proc.pid, "VmHWM") - base
            stats = p.stats()
        finally:
            _kill(hoarder)
        assert p.alive()
        p.finish()
    assert grown < 100, (f"the publisher grew by {grown:.0f} MB for one client's unread answers "
                         f"({stats.get('history_reads')} served, "
                         f"{stats.get('history_refused', 0)} refused busy)")


@pytest.mark.slow
def test_a_flooding_client_that_disconnects_does_not_crash_the_publisher(tmp_path):
    """Regression (issue 26): a client that sent faster than the loop took its messages filled
    the ROUTER's inbound pipe (RCVHWM 1000) and libzmq stopped reading that connection; when it
    went away, libzmq 4.3.5 aborted the *publisher's* process: ``Assertion failed: !_io_error
    (stream_engine_base.cpp:310)`` (zeromq/libzmq #4767). Here: 6 connections flooding ``r``
    for 1 s, four times. The publisher now never stops reading a connection and refuses a
    flooder by its quota (tests/sockets/test_flood.py tries every kind)."""
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 20, "--msgs", 2, "--recs", 2, "--pad", 20_000,
                "--pause-end", "--stats")) as (p,):
        p.until("paused end")
        ep = endpoint(cat, "t")
        flooder = _client(FLOODER, ep, 6, 1.0, 4)
        try:
            _read_until(flooder, "flooded", timeout=30)
            flooder.wait(10)
        finally:
            _kill(flooder)
        deadline = time.monotonic() + 3.0
        while p.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert p.alive(), (f"the publisher died: rc={p.proc.returncode}: "
                           f"{p.stderr()[-200:]!r}")
        with RemoteLog(ep, "t", 0, timeout=5) as r:
            assert [t for t, _ in r.read(range(20))] == list(range(20))
        p.finish()


# -- 5. no retention -------------------------------------------------------------------------------
def test_publisher_without_retention_answers_unavailable_at_once(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 4, *SMALL, "--no-retention", "--pause-end")) as (p,):
        p.until("paused end")
        ep = endpoint(cat, "t")
        s = dealer(ep)
        try:
            s.send_multipart(read_frames(req=3, time_=1))
            a = answer(s)
        finally:
            s.close(0)
        assert isinstance(a, wire.Notice) and a.code == "history"
        assert a.extra["reason"] == "unavailable" and a.extra["req"] == 3
        t0 = time.monotonic()
        with RemoteLog(ep, "t", 0, timeout=8) as r:
            with pytest.raises(HistoryUnavailable, match="no epoch log"):
                list(r.read([0, 1, 2]))
        assert time.monotonic() - t0 < 2, "it waited for a timeout instead of the answer"
        with pytest.raises(HistoryUnavailable, match="keep no epoch log"):
            list(History("t", Catalog(cat), source="publisher", timeout=8).epochs())
        with history_source("publisher"), pytest.raises(HistoryUnavailable):
            with Subscriber("t", Catalog(cat), start=0, timeout=5) as sub:
                list(sub.epochs(timeout=5))
        assert time.monotonic() - t0 < 6
        p.finish()


# -- 6. kill -9 while a remote read is in flight ------------------------------------------------
BIG = ["--msgs", 4, "--recs", 40, "--pad", 6000]  # ~1 MB epochs


@settings(max_examples=examples(3))
@given(k=st.integers(0, 6), pause=st.sampled_from([0.0, 0.02, 0.2]))
def test_kill9_during_a_remote_read_is_unavailable_within_the_timeout(tmp_path_factory, k,
                                                                      pause):
    """The reader takes ``k`` epochs, the publisher is killed, the reader goes on: what it
    gets is a prefix of the log, each epoch whole, then HistoryUnavailable within its timeout
    of the last answer — never a hang, never part of an epoch."""
    cat = tmp_path_factory.mktemp("kill") / "cat"
    n, timeout = 16, 1.0
    want = expected(range(n), 4, 40, 6000)
    with peers((cat, "t", "--last", n, *BIG, "--end", "hang")) as (p,):
        p.until("hanging")
        h = History("t", Catalog(cat), source="publisher", timeout=timeout)
        got, error = [], None
        it = h.epochs()
        try:
            for _ in range(k):
                got.append(next(it))
            time.sleep(pause)
            p.kill()
            killed = time.monotonic()
            for e in it:
                got.append(e)
        except HistoryUnavailable as e:
            error, raised = e, time.monotonic()
        finally:
            h.close()
    assert seen(got) == want[:len(got)], "a wrong or partial epoch"
    if error is None:
        assert len(got) == n  # everything had been answered before the kill
    else:
        assert len(got) >= k
        assert raised - killed < timeout + 8 * 0.3 + 1.5, raised - killed
        # k == 0: the read starts after the kill, and the catalog already says "dead"
        assert "did not answer" in str(error) or (k == 0 and "dead" in str(error)), error
    # after the kill the catalog says so: a new read fails at once, without waiting
    t0 = time.monotonic()
    with pytest.raises(HistoryUnavailable, match="dead"):
        list(History("t", Catalog(cat), source="publisher", timeout=30).epochs())
    assert time.monotonic() - t0 < 2


# -- 7. retention deletes what is being read remotely ------------------------------------------
TRIM = ["--msgs", 1, "--recs", 10, "--pad", 150, "--segment-bytes", 4096, "--max-epochs", 3]


def test_epochs_deleted_before_the_remote_read_are_unavailable_with_retained(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 40, *TRIM, "--pause-at", 4, "--pause-end")) as (p,):
        p.until("paused 4")
        h = History("t", Catalog(cat), source="publisher", timeout=5)
        planned = h.records()  # the index now: epochs 0..3 (retention may have begun)
        assert planned and planned[-1][0] == 3
        p.say()
        p.until("paused end")
        since = Catalog(cat).history_state("t", 0).since
        assert since[0] > 3  # all of them deleted by retention since the plan was made
        got = []
        with pytest.raises(HistoryUnavailable) as info:
            for item in h.read(planned):
                got.append(item)
        assert got == [] and info.value.retained == since
        with RemoteLog(endpoint(cat, "t"), "t", 0, timeout=5) as r:
            with pytest.raises(HistoryUnavailable) as info:
                list(r.read([0]))
        assert info.value.retained == since
        # what is retained is read whole
        assert seen(h.epochs()) == expected(range(since[0], 40), 1, 10, 150)
        h.close()
        p.finish()


def test_epochs_deleted_while_read_remotely_never_come_partial(tmp_path):
    """The publisher keeps trimming (3 epochs kept, 4 KiB segments) while readers plan from the
    index and read through it after a Hypothesis-chosen delay: each read yields whole, right
    epochs and may end with HistoryUnavailable (retained set, past the epoch it lacked) —
    never HistoryCorrupt, never part of an epoch."""
    cat = tmp_path / "cat"
    n = 1500
    outcomes = collections.Counter()
    with peers((cat, "t", "--last", n, *TRIM, "--interval", 0.002, "--pause-end")) as (p,):
        p.until("epoch 5")
        h = History("t", Catalog(cat), source="publisher", timeout=5)

        @settings(max_examples=examples(40), database=None)
        @given(delay=st.sampled_from([0.0, 0.0005, 0.002, 0.005, 0.01, 0.03])
               | st.floats(0.0, 0.03))
        def one(delay):
            planned = h.records()
            time.sleep(delay)
            got = []
            try:
                for t, recs, payloads in h.read(planned):
                    got.append((t, [_tup(r) for _, pl in payloads for r in msgpack.unpackb(pl)]))
            except HistoryUnavailable as e:
                outcomes["unavailable"] += 1
                assert e.retained is not None and len(got) < len(planned)
                missing = planned[len(got)][0]
                assert not e.retained[0] <= missing, (e.retained, missing)
            else:
                outcomes["whole"] += 1
                assert len(got) == len(planned)
            assert got == expected([t for t, _ in got], 1, 10, 150)

        try:
            one()
        finally:
            h.close()
        assert p.alive()
    assert outcomes["whole"] + outcomes["unavailable"] >= examples(40) // 2, outcomes


# -- 8. a damaged segment read remotely -------------------------------------------------------
def test_bit_flipped_segment_read_remotely_is_corrupt_never_data(tmp_path):
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 5, "--msgs", 2, "--recs", 4, "--pause-end")) as (p,):
        p.until("paused end")
        c = Catalog(cat)
        rec = next(r for r in c.history_epochs("t", 0) if r.time == 2)
        seg = segment_path(c.history_state("t", 0).dir, rec.segment)
        start, length = rec.extents[0]
        first_len = RECORD_HEADER.unpack_from(seg.read_bytes(), start)[0]
        clean = seg.read_bytes()
        want = expected(range(5), 2, 4)
        for pos in (start + RECORD_HEADER.size + first_len - 2, start + length - 1, start + 5):
            damaged = bytearray(clean)
            damaged[pos] ^= 0x04
            seg.write_bytes(bytes(damaged))
            got = []
            with History("t", c, source="publisher", timeout=5) as h:
                with pytest.raises(HistoryCorrupt) as info:
                    for e in h.epochs():
                        got.append(e)
                assert seen(got) == want[:2], pos  # never epoch 2, nor any after it
                assert str(seg) in str(info.value)
                assert seen(h.epochs(since=3)) == want[3:]
            with RemoteLog(endpoint(cat, "t"), "t", 0, timeout=5) as r:
                with pytest.raises(HistoryCorrupt):
                    list(r.read([2]))
            seg.write_bytes(clean)
        with History("t", c, source="publisher", timeout=5) as h:
            assert seen(h.epochs()) == want
        p.finish()


# -- 9. "auto": files here, or the publisher --------------------------------------------------
def _set_host(cat, topic, host):
    with sqlite3.connect(Catalog(cat).path) as conn:
        conn.execute("UPDATE partitions SET host = ? WHERE topic = ?", (host, topic))


def test_auto_reads_through_the_publisher_when_the_log_is_on_another_host(tmp_path):
    cat = Catalog(tmp_path)
    pub = Publisher("t", catalog=cat, retention=Retention())
    try:
        for t in range(6):
            pub.send(t, [[t, i] for i in range(3)])
            pub.advance_to(t + 1)
        assert pub.flush()
        want = [(t, [(t, i) for i in range(3)]) for t in range(6)]
        with History("t", cat, source="auto") as h:  # registered here: the files
            assert seen(h.epochs()) == want
        assert pub.stats["history_reads"] == 0
        _set_host(tmp_path, "t", "elsewhere")
        with History("t", cat, source="auto") as h:  # not here: the publisher
            assert seen(h.epochs()) == want
        assert pub.stats["history_reads"] == 6
        with History("t", cat, source="disk") as h:  # forced: the files, even so
            assert seen(h.epochs(since=4)) == want[4:]
        assert pub.stats["history_reads"] == 6
        with history_source("publisher"):  # the environment's default
            with History("t", cat) as h:
                assert seen(h.epochs(since=3)) == want[3:]
        assert pub.stats["history_reads"] == 9
        with history_source("auto"), Subscriber("t", cat, start=2, timeout=5) as sub:
            assert sub.wait_ready(5)
            it = sub.epochs(timeout=5)
            assert seen([next(it) for _ in range(4)]) == want[2:]
        assert pub.stats["history_reads"] == 13
    finally:
        pub.close()
    with pytest.raises(HistoryUnavailable, match="'elsewhere'"):
        list(History("t", cat, source="auto").epochs())
    with pytest.raises(HistoryUnavailable, match="'elsewhere'"):
        list(History("t", cat, source="publisher").epochs())
    _set_host(tmp_path, "t", HOST)  # and back: the files, with no publisher
    assert seen(History("t", cat, source="auto").epochs()) == want


def test_auto_with_a_killed_publisher_on_another_host_fails_within_the_timeout(tmp_path):
    """A killed publisher on another host still looks live in the catalog (its pid cannot be
    checked from here): the read goes to its endpoint and fails after ``timeout``."""
    cat = tmp_path / "cat"
    with peers((cat, "t", "--last", 4, *SMALL, "--end", "hang")) as (p,):
        p.until("hanging")
        _set_host(cat, "t", "elsewhere")
        p.kill()
    assert Catalog(cat).lookup("t").partition_info[0].state == "live"
    t0 = time.monotonic()
    with pytest.raises(HistoryUnavailable, match="did not answer"):
        list(History("t", Catalog(cat), source="auto", timeout=0.5).epochs())
    assert time.monotonic() - t0 < 3


# -- the client against broken or hostile publishers -------------------------------------------
class FakePublisher:
    """A raw ROUTER on 127.0.0.1 that answers each ``r`` with ``respond(req, time)`` — a list of
    messages (lists of frames) to send back — in a thread."""

    def __init__(self, respond, every=None):
        self.sock = CTX.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.respond, self.every = respond, every
        self.requests = 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _run(self):
        last_ident, last = None, time.monotonic()
        while not self._stop.is_set():
            if self.sock.poll(10):
                ident, *frames = self.sock.recv_multipart()
                _, h = wire.decode_control(frames)
                self.requests += 1
                last_ident = ident
                for msg in self.respond(h["req"], h["time"]):
                    self.sock.send_multipart([ident, *msg])
            if self.every and last_ident is not None and time.monotonic() - last > self.every[0]:
                last = time.monotonic()
                for msg in self.every[1]():
                    self.sock.send_multipart([last_ident, *msg])

    def close(self):
        self._stop.set()
        self._th.join(5)
        self.sock.close(0)


def _read_in_thread(log_, times, limit):
    """Run ``list(log_.read(times))`` in a thread; return (result or exception, seconds), or
    (None, None) if it is still running after ``limit`` seconds (a hang)."""
    out = {}

    def run():
        t0 = time.monotonic()
        try:
            out["r"] = list(log_.read(times))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["r"] = e
        out["s"] = time.monotonic() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    return out.get("r"), out.get("s")


@pytest.mark.parametrize("behaviour", ["busy forever", "stale answers"])
def test_a_publisher_that_never_serves_the_read_times_out(behaviour):
    """BUG (history_remote.py, RemoteLog._receive): the timeout restarted at every message, so a
    publisher that answers ``busy`` forever (overloaded for good), or keeps sending answers to
    other (abandoned) requests, made ``read`` wait forever. Now no progress on the read for
    ``timeout`` seconds raises HistoryUnavailable."""
    if behaviour == "busy forever":
        fake = FakePublisher(lambda req, t: [wire.encode_notice(
            "history", "busy", req=req, reason="busy")])
    else:
        fake = FakePublisher(lambda req, t: [], every=(0.05, lambda: [
            wire.encode_history(2 ** 30 + random.randrange(1000), 0, 0, [b"\x90"])]))
    r = RemoteLog(fake.endpoint, "t", 0, timeout=0.5)
    try:
        result, seconds = _read_in_thread(r, [0, 1], limit=5.0)
        assert result is not None, f"{behaviour}: still waiting after 5 s with timeout=0.5"
        assert isinstance(result, HistoryUnavailable), result
        assert seconds < 2.5
    finally:
        fake.close()
        r.close()


def test_a_publisher_serving_fewer_messages_than_the_index_is_corrupt(tmp_path):
    """A (buggy) publisher answers epoch 1 with one payload fewer than the index holds: History
    raises HistoryCorrupt and never hands out the short epoch."""
    cat = Catalog(tmp_path)
    with Publisher("t", catalog=cat, retention=Retention(), coalesce_bytes=0) as pub:
        for t in range(3):
            for m in range(3):
                pub.send(t, [[t, m]])
            pub.advance_to(t + 1)
    packed = {t: [msgpack.packb([[t, m]]) for m in range(3)] for t in range(3)}
    fake = FakePublisher(lambda req, t: [wire.encode_history(
        req, t, 0, packed[t][:2] if t == 1 else packed[t])])
    try:
        with sqlite3.connect(cat.path) as conn:  # the catalog now points at the fake, live
            conn.execute("UPDATE partitions SET endpoint = ?, state = 'live', pid = ?, "
                         "pid_start = NULL WHERE topic = 't'", (fake.endpoint, os.getpid()))
        got = []
        with History("t", cat, source="publisher", timeout=2) as h:
            with pytest.raises(HistoryCorrupt, match="served 2 messages of epoch 1"):
                for e in h.epochs():
                    got.append(e)
        assert seen(got) == [(0, [(0, 0), (0, 1), (0, 2)])]
    finally:
        fake.close()


def test_bad_answers_from_a_publisher_are_unavailable_not_a_crash():
    """Answers that are not R or X (a snapshot, garbage bytes, a non-map header) end the read
    with HistoryUnavailable naming the publisher."""
    for bad in ([wire.SNAPSHOT, msgpack.packb({"lower": [], "upper": []})], [b"??", b"x"],
                [wire.HISTORY, msgpack.packb([1, 2])], [wire.HISTORY, b"\xc1"]):
        fake = FakePublisher(lambda req, t, bad=bad: [bad])
        try:
            with RemoteLog(fake.endpoint, "t", 0, timeout=2) as r:
                with pytest.raises(HistoryUnavailable, match="bad answer"):
                    list(r.read([0]))
        finally:
            fake.close()


def test_interleaved_reads_of_one_history_through_the_publisher(tmp_path):
    """BUG (history_remote.py: answers matched per ``read`` call, on one shared connection): two
    iterations of one History over the same publisher (``zip(h.epochs(), h.epochs(since=10))``,
    or a nested loop) stole each other's answers — each dropped the other's as "abandoned" —
    and failed with HistoryUnavailable after the timeout. From the files the same code works."""
    cat = Catalog(tmp_path)
    pub = Publisher("t", catalog=cat, retention=Retention())
    try:
        for t in range(20):
            pub.send(t, [[t, i] for i in range(3)])
            pub.advance_to(t + 1)
        assert pub.flush()
        results = {}
        for source in ("disk", "publisher"):
            with History("t", cat, source=source, timeout=2) as h:
                pairs = [(a.time, b.time, a.records, b.records)
                         for a, b in zip(h.epochs(), h.epochs(since=10))]
                nested = [(a.time, [b.time for b in h.epochs(since=a.time, until=a.time + 3)])
                          for a in h.epochs(until=4)]
            results[source] = (pairs, nested)
        assert results["publisher"] == results["disk"]
        assert [p[:2] for p in results["disk"][0]] == [(t, t + 10) for t in range(10)]
    finally:
        pub.close()
