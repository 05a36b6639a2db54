"""Adversarial tests of the gapless join of history and the live stream (docs/history.md,
"Joining history and the live stream"; README "history").

The promise attacked: ``Subscriber(topic, catalog, start=A)`` delivers exactly the complete
epochs ``t`` with ``A <= t``, each whole, each once, in an order consistent with the partial
order — while publishers (real processes, real sockets on 127.0.0.1) keep publishing, with
several partitions at different paces, with ``product(2)`` times, across kill -9 and restarts
on the same retention directory, and with ``recover=True`` re-joins filled from history. When
retention deletes what a catch-up needs, the subscriber must raise ``HistoryUnavailable``
(a durable one ``SubscriptionExpired``): never skip an epoch, never deliver part of one.

Every check compares every record of every epoch (multisets over partitions; each record is
unique, so a duplicated or missing message is seen), never just counts.

Publishers run in ``join_peer.py`` (a command-driven host: the test decides what each partition
sends and when its frontier moves) or ``history_peer.py`` (a publishing loop that can be paused,
killed with SIGKILL, and restarted with ``--resume``).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import Phase, event, example, given, settings, strategies as st

from hypothesis_profiles import examples
from history_peer import epoch_records
from peer_processes import kill as _kill
from peer_procs import EpochReader as Reader, PublishPeer as LoopPeer

from epochstream import Catalog, History, Subscriber
from epochstream.errors import (HistoryUnavailable, PublisherAborted, PublisherLost,
                                SubscriptionExpired, SubscriptionHeld)
from epochstream.events import Gap
from epochstream.order import TOTAL, product

HERE = Path(__file__).parent
JOIN_PEER = str(HERE / "join_peer.py")
P2 = product(2)
# no shrinking: an example costs real processes and seconds; a failure is reported as found
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]


# ---- helpers -----------------------------------------------------------------------------------
def _enc(t):
    return list(t) if isinstance(t, tuple) else t


class CmdPeer:
    """A ``join_peer.py`` process: commands are JSON lines, answered one line each, in order.
    stdout is read by a thread (reads never block the test past a timeout); stderr goes to a
    file (a flood of WARNING lines never blocks the peer on a full pipe)."""

    def __init__(self, catalog, log_dir):
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.err_path = log_dir / f"join-peer-{uuid.uuid4().hex[:8]}.err"
        self._err = open(self.err_path, "w")
        self.proc = subprocess.Popen([sys.executable, JOIN_PEER, str(catalog)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def post(self, cmds) -> int:
        """Write ``cmds`` (lists) without waiting; returns how many answers to :meth:`answers`."""
        with self._lock:
            for c in cmds:
                self.proc.stdin.write(json.dumps(c) + "\n")
            self.proc.stdin.flush()
        return len(cmds)

    def answers(self, n: int, timeout: float = 20.0) -> list:
        out = []
        deadline = time.monotonic() + timeout
        for _ in range(n):
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"join_peer gave no answer in {timeout} s; stderr:\n"
                                     f"{self.stderr()[-3000:]}") from None
            if line is None:
                raise AssertionError(f"join_peer exited (rc={self.proc.poll()}); stderr:\n"
                                     f"{self.stderr()[-3000:]}")
            if not line.startswith("ok "):
                raise AssertionError(f"join_peer: {line}")
            out.append(json.loads(line[3:]))
        return out

    def call(self, *cmd, timeout: float = 20.0):
        return self.answers(self.post([list(cmd)]), timeout)[0]

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.err_path.read_text()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.post([["exit"]])
                self.proc.wait(5)
            except Exception:  # noqa: BLE001 - killed below
                pass
        _kill(self.proc)
        self._err.close()


@contextlib.contextmanager
def _history_source(value):
    """``EPOCHSTREAM_HISTORY_SOURCE=value`` (where subscribers read history) for the block."""
    old = os.environ.get("EPOCHSTREAM_HISTORY_SOURCE")
    os.environ["EPOCHSTREAM_HISTORY_SOURCE"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("EPOCHSTREAM_HISTORY_SOURCE", None)
        else:
            os.environ["EPOCHSTREAM_HISTORY_SOURCE"] = old


def _key(t):
    return t if isinstance(t, tuple) else (t,)


def _deep(x):
    return tuple(_deep(v) for v in x) if isinstance(x, (list, tuple)) else x


def _norm(records):
    """An epoch's records as a sorted list of tuples (records are unique: a multiset check)."""
    return sorted(_deep(r) for r in records)


def _check_stream(order, got, want: dict, context=""):
    """``got``: delivered epochs (and Gaps); ``want``: {time: sorted records}. Every wanted
    epoch exactly once, whole, nothing else, no Gap, in an order consistent with ``order``."""
    gaps = [g for g in got if isinstance(g, Gap)]
    assert not gaps, f"{context}: unexpected Gap(s) {gaps}"
    times = [e.time for e in got]
    extra = sorted(set(times) - set(want), key=_key)
    assert not extra, f"{context}: unexpected epochs {extra} (not wanted); delivered {times}"
    for i, e in enumerate(got):
        assert _norm(e.records) == want[e.time], (
            f"{context}: epoch {e.time!r} (item {i} of {times}) is not whole/exact: got "
            f"{len(e.records)} records {[r[:3] for r in _norm(e.records)][:8]}, want "
            f"{len(want[e.time])} {[r[:3] for r in want[e.time]][:8]}")
    dup = sorted({t for t in times if times.count(t) > 1}, key=_key)
    assert not dup, f"{context}: epoch(s) delivered twice: {dup}; order {times}"
    missing = sorted(set(want) - set(times), key=_key)
    assert not missing, f"{context}: missing epochs {missing}; delivered {times}"
    pos = {t: i for i, t in enumerate(times)}
    for a in times:
        for b in times:
            if a != b and order.le(a, b):
                assert pos[a] < pos[b], f"{context}: {a!r} <= {b!r} delivered after it: {times}"


def _loop_expected(times, msgs, recs, pad=0, parts=None, inner=2, order="total"):
    """{time: sorted records} of history_peer.py's epochs ``times`` (steps), over ``parts``."""
    out: dict = {}
    for t in times:
        for time_ in ([t] if order == "total" else [(t, j) for j in range(inner)]):
            label = list(time_) if isinstance(time_, tuple) else time_
            recs_ = []
            for p in (parts or [None]):
                recs_.extend(epoch_records(label, msgs, recs, pad, p))
            out[time_] = _norm(recs_)
    return out


# ================================================================================================
# 1. The join anywhere in a stream: product(2) or total, 1-3 partitions at different paces
# ================================================================================================
GRID = {"total": tuple(range(9)), "product(2)": tuple(itertools.product(range(4), range(3)))}
ORDERS = {"total": TOTAL, "product(2)": P2}


def _beyond(order, frontier, t) -> bool:
    return any(order.le(a, t) for a in frontier)


def _minimal(order, times):
    s = list(set(times))
    return sorted((a for a in s if not any(order.lt(b, a) for b in s)), key=_key)


@st.composite
def _partition_ops(draw, oname, pid):
    """One partition's run: ("send", t, records) and ("adv", new antichain) ops; data only at
    or beyond the current lower frontier."""
    order, grid = ORDERS[oname], GRID[oname]
    lower = [order.minimum]
    ops, seq = [], itertools.count()
    for _ in range(draw(st.integers(1, 22))):
        up = [t for t in grid if _beyond(order, lower, t)]
        if not up:
            break
        if draw(st.integers(0, 2)) < 2:
            t = draw(st.sampled_from(up))
            n = draw(st.integers(1, 3))
            pad = draw(st.sampled_from([0, 0, 40, 3000]))
            ops.append(("send", t, [[pid, next(seq), i, "x" * pad] for i in range(n)]))
        else:
            new = _minimal(order, draw(st.lists(st.sampled_from(up), min_size=1, max_size=3)))
            if new != sorted(lower, key=_key):
                ops.append(("adv", tuple(new), tuple(lower)))
                lower = new
    return ops


@st.composite
def _join_scenarios(draw):
    oname = draw(st.sampled_from(["total", "product(2)"]))
    n = draw(st.integers(1, 3))
    ops = [draw(_partition_ops(oname, p)) for p in range(n)]
    cuts = [draw(st.integers(0, len(o))) for o in ops]  # each partition at its own pace
    grid = GRID[oname]
    if draw(st.integers(0, 4)) == 0:
        start = "earliest"
    else:
        start = _minimal(ORDERS[oname], draw(st.lists(st.sampled_from(grid), min_size=1,
                                                       max_size=2)))
    race = draw(st.booleans())  # the after-join ops are sent while the subscriber joins
    lazy = draw(st.booleans())  # the subscriber reads only once the publishers closed
    # history from disk or through the publishers (one partition only: with several, a
    # partition that finishes before the fill does loses its publisher too early —
    # test_a_fill_read_through_the_publishers_outlives_the_first_partition_to_finish)
    source = draw(st.sampled_from(["auto", "publisher"])) if n == 1 else "auto"
    return oname, ops, cuts, start, race, lazy, source


def _cmd(name, op):
    if op[0] == "send":
        return ["send", name, _enc(op[1]), op[2]]
    _, new, old = op
    return ["progress", name, [[_enc(t), 1] for t in new] + [[_enc(t), -1] for t in old]]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Two long-lived join_peer processes sharing one catalog (each example: its own topic)."""
    root = tmp_path_factory.mktemp("hosts")
    cat = root / "cat"
    hosts = [CmdPeer(cat, root), CmdPeer(cat, root)]
    try:
        yield cat, hosts
    finally:
        for h in hosts:
            h.close()


_topics = itertools.count()


@settings(max_examples=examples(60), deadline=None, phases=NO_SHRINK, database=None)
@given(scenario=_join_scenarios())
def test_join_anywhere_gets_every_epoch_at_or_beyond_the_position_once_whole(two_hosts,
                                                                             scenario):
    """1-3 partitions (publishers in two processes) at different paces, total or product(2)
    times, data sent in and out of order across open epochs; the subscriber joins after each
    partition ran its own prefix of ops (mid-epoch, with several epochs open), at a random
    position (an antichain, or "earliest"), possibly while the rest is being sent, and reads
    either concurrently or only at the end: it gets exactly the epochs with data at or beyond
    its position, each once, whole, in an order consistent with the partial order."""
    cat, hosts = two_hosts
    oname, ops, cuts, start, race, lazy, source = scenario
    with _history_source(source):
        _join_anywhere(cat, hosts, oname, ops, cuts, start, race, lazy, source)


def _join_anywhere(cat, hosts, oname, ops, cuts, start, race, lazy, source):
    order = ORDERS[oname]
    topic = f"join{next(_topics)}"
    n = len(ops)
    names = [f"{topic}/{p}" for p in range(n)]
    host = [hosts[p % 2] for p in range(n)]
    for p in range(n):
        host[p].call("open", names[p], topic, p, n, oname, {}, None)
    pending = []
    for p in range(n):  # the part before the join, logged and sent
        cmds = [_cmd(names[p], op) for op in ops[p][:cuts[p]]] + [["flush", names[p]]]
        pending.append((host[p], host[p].post(cmds)))
    for h, k in pending:
        h.answers(k)

    def rest():
        out = []
        for p in range(n):
            cmds = [_cmd(names[p], op) for op in ops[p][cuts[p]:]] + [["flush", names[p]]]
            out.append((host[p], host[p].post(cmds)))
        return out

    position = start if start == "earliest" else list(start)
    after = None
    if race:
        after = rest()
    sub = Subscriber(topic, Catalog(cat), start=position, timeout=10)
    try:
        assert sub.wait_ready(10)
        if not race:
            after = rest()
        reader = None if lazy else Reader(sub)
        for h, k in after:
            h.answers(k)
        for p in range(n):
            host[p].call("close", names[p])
        if lazy:
            got = list(sub.epochs(timeout=15))
        else:
            reader.join()
            assert reader.error is None, repr(reader.error)
            got = reader.items
    finally:
        sub.close()
    # the model: every record sent, per time; the position's epochs
    records: dict = {}
    for p in range(n):
        for op in ops[p]:
            if op[0] == "send":
                records.setdefault(op[1], []).extend(tuple(r) for r in op[2])
    first = [order.minimum] if start == "earliest" else start
    want = {t: sorted(r) for t, r in records.items() if _beyond(order, first, t)}
    hist = sub.stats["history_epochs"]
    event(f"epochs from history: {'none' if not hist else 'all' if hist == len(want) else 'some'}")
    event(f"wanted epochs: {'none' if not want else '1-3' if len(want) < 4 else '4+'}")
    _check_stream(order, got, want, context=f"{oname} n={n} cuts={cuts} start={start} "
                                            f"race={race} lazy={lazy} source={source}")


def test_a_fill_read_through_the_publishers_outlives_the_first_partition_to_finish(tmp_path):
    """History read through the publishers (EPOCHSTREAM_HISTORY_SOURCE=publisher, as on a
    subscriber's own host). The subscriber joins at 0 while partition 0 has sent data at 0
    and 1 and partition 1 at 0: its fill owes epochs 0 and 1. Partition 0 then closes;
    partition 1 completes 0 (the fill serves it, reading partition 0's part from its lingering
    publisher) and later 1. Epoch 1's part of partition 0 must still be read: the docs
    promise the finished partition's connection stays open, so its publisher lingers, "until
    the fill is read" — not only until the first batch of it is."""
    cat = tmp_path / "cat"
    a, b = CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path)
    try:
        with _history_source("publisher"):
            a.call("open", "p", "t", 0, 2, "total", {}, None)
            b.call("open", "p", "t", 1, 2, "total", {}, None)
            a.answers(a.post([["send", "p", 0, [[0, "a"]]], ["send", "p", 1, [[0, "b"]]],
                              ["flush", "p"]]))
            b.answers(b.post([["send", "p", 0, [[1, "a"]]], ["flush", "p"]]))
            sub = Subscriber("t", Catalog(cat), start=0, timeout=3)
            try:
                assert sub.wait_ready(10)
                assert sub.filter == (1,)
                reader = Reader(sub, timeout=10)
                a.call("close", "p")  # partition 0 is done: its lower frontier is empty
                b.answers(b.post([["progress", "p", [[1, 1], [0, -1]]], ["flush", "p"]]))
                reader.wait_for(0)    # epoch 0 came from history, through both publishers
                time.sleep(0.3)
                b.answers(b.post([["send", "p", 1, [[1, "b"]]],
                                  ["progress", "p", [[2, 1], [1, -1]]], ["close", "p"]]))
                reader.join()
            finally:
                sub.close()
    finally:
        a.close()
        b.close()
    assert reader.error is None, (f"{reader.error!r} after "
                                  f"{[getattr(e, 'time', e) for e in reader.items]}")
    _check_stream(TOTAL, reader.items, {0: [(0, "a"), (1, "a")], 1: [(0, "b"), (1, "b")]},
                  context="fill through the publishers")


# ================================================================================================
# 2. Retention deleting what a catch-up still needs: an explicit error, never a skip or a part
# ================================================================================================
TINY = {"max_epochs": 4, "segment_bytes": 4096, "max_bytes": None, "max_age": None}
PAD = "x" * 2000  # one record ~2 KB: a 4 KiB segment rolls every other epoch


def _rec(p, t, m):
    return [p, t, m, PAD]


def _drain(sub, timeout=5.0):
    """Read ``sub`` to its end or first error: (epochs, exception or None)."""
    got = []
    try:
        for e in sub.epochs(timeout=timeout):
            got.append(e)
    except (HistoryUnavailable, SubscriptionExpired) as e:
        return got, e
    return got, None


def _assert_prefix_or_explicit(got, err, want_times, want, context):
    """What the subscriber delivered is a prefix of the wanted epochs, each whole; if not all
    of them, it raised HistoryUnavailable/SubscriptionExpired (never a silent skip)."""
    times = [e.time for e in got]
    assert times == want_times[:len(times)], (
        f"{context}: delivered {times}, not a prefix of the wanted {want_times} (an epoch was "
        f"skipped silently; error raised: {err!r})")
    for e in got:
        assert _norm(e.records) == want[e.time], (
            f"{context}: epoch {e.time!r} delivered partially: {len(e.records)} records "
            f"{[r[:3] for r in _norm(e.records)]}, want {[r[:3] for r in want[e.time]]}")
    if len(times) < len(want_times):
        assert err is not None, (f"{context}: the stream ended after {times} without an "
                                 f"error; wanted {want_times}")


def test_retention_deletes_a_wanted_epoch_before_it_completes_is_not_skipped(tmp_path):
    """The subscriber joins at 5 while epoch 5 is half sent (the live filter drops 5: history
    must supply it once complete). Then it reads nothing while the publisher completes 5 and
    publishes 6..19 with a tiny retention, which deletes epoch 5's segment. Reading then must
    give epoch 5 whole or raise HistoryUnavailable — not go on at 6 as if 5 never existed."""
    peer = CmdPeer(tmp_path / "cat", tmp_path)
    try:
        peer.call("open", "p", "r", 0, 1, "total", TINY, None)
        cmds = []
        for t in range(5):
            cmds += [["send", "p", t, [_rec(0, t, 0)]], ["progress", "p", [[t + 1, 1], [t, -1]]]]
        cmds += [["send", "p", 5, [_rec(0, 5, 0)]], ["flush", "p"]]
        peer.answers(peer.post(cmds))
        sub = Subscriber("r", Catalog(tmp_path / "cat"), start=5, timeout=10)
        try:
            assert sub.wait_ready(10)
            assert sub.filter == (5,)  # epoch 5 begun before the join: history's to supply
            cmds = [["send", "p", 5, [_rec(0, 5, 1)]], ["progress", "p", [[6, 1], [5, -1]]]]
            for t in range(6, 20):
                cmds += [["send", "p", t, [_rec(0, t, 0)]],
                         ["progress", "p", [[t + 1, 1], [t, -1]]]]
            peer.answers(peer.post(cmds + [["flush", "p"]]))
            since = Catalog(tmp_path / "cat").history_state("r", 0).since
            assert since[0] > 5, since  # epoch 5's segment is gone
            peer.call("close", "p")
            got, err = _drain(sub)
        finally:
            sub.close()
    finally:
        peer.close()
    want = {t: _norm([_rec(0, t, 0)] + ([_rec(0, 5, 1)] if t == 5 else [])) for t in range(5, 20)}
    _assert_prefix_or_explicit(got, err, list(range(5, 20)), want, "single partition")


def test_retention_of_one_partition_deletes_its_part_of_a_wanted_epoch_not_served_half(
        tmp_path):
    """Two partitions (two processes); partition 0 keeps a tiny log, partition 1 a large one.
    The subscriber joins at 5 while both have sent half of epoch 5, then stalls while both
    complete 5 and publish 6..19: partition 0's part of epoch 5 is deleted. Epoch 5 must come
    whole (both partitions' records) or not at all with HistoryUnavailable — never partition
    1's half alone."""
    cat = tmp_path / "cat"
    peers = [CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path)]
    rets = [TINY, {}]
    try:
        for p in (0, 1):
            peers[p].call("open", "p", "r", p, 2, "total", rets[p], None)
        pend = []
        for p in (0, 1):
            cmds = []
            for t in range(5):
                cmds += [["send", "p", t, [_rec(p, t, 0)]],
                         ["progress", "p", [[t + 1, 1], [t, -1]]]]
            cmds += [["send", "p", 5, [_rec(p, 5, 0)]], ["flush", "p"]]
            pend.append(peers[p].post(cmds))
        for p in (0, 1):
            peers[p].answers(pend[p])
        sub = Subscriber("r", Catalog(cat), start=5, timeout=10)
        try:
            assert sub.wait_ready(10)
            pend = []
            for p in (0, 1):
                cmds = [["send", "p", 5, [_rec(p, 5, 1)]], ["progress", "p", [[6, 1], [5, -1]]]]
                for t in range(6, 20):
                    cmds += [["send", "p", t, [_rec(p, t, 0)]],
                             ["progress", "p", [[t + 1, 1], [t, -1]]]]
                pend.append(peers[p].post(cmds + [["flush", "p"]]))
            for p in (0, 1):
                peers[p].answers(pend[p])
            states = Catalog(cat).history_states("r")
            assert states[0].since[0] > 5 and states[1].since == (0,), states
            for p in (0, 1):
                peers[p].call("close", "p")
            got, err = _drain(sub)
        finally:
            sub.close()
    finally:
        for p in peers:
            p.close()
    want = {t: _norm([_rec(p, t, 0) for p in (0, 1)]
                     + ([_rec(p, 5, 1) for p in (0, 1)] if t == 5 else []))
            for t in range(5, 20)}
    _assert_prefix_or_explicit(got, err, list(range(5, 20)), want, "two partitions")


@pytest.fixture(scope="module")
def retention_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("ret")
    cat = root / "cat"
    hosts = [CmdPeer(cat, root), CmdPeer(cat, root)]
    try:
        yield cat, hosts
    finally:
        for h in hosts:
            h.close()


@st.composite
def _retention_races(draw):
    n = draw(st.integers(1, 2))
    rets = [draw(st.sampled_from([
        {"max_epochs": 2, "segment_bytes": 4096, "max_bytes": None, "max_age": None},
        {"max_epochs": 4, "segment_bytes": 4096, "max_bytes": None, "max_age": None},
        {"max_epochs": 6, "segment_bytes": 8192, "max_bytes": None, "max_age": None},
        {}])) for _ in range(n)]
    k = draw(st.integers(1, 8))                       # the epoch open at the join
    half = [draw(st.booleans()) for _ in range(n)]    # who has sent part of epoch k
    start = draw(st.one_of(st.just("earliest"), st.integers(0, k)))
    more = draw(st.integers(0, 16))                   # epochs published while it stalls
    durable = draw(st.booleans())
    return n, rets, k, half, start, more, durable


@settings(max_examples=examples(10), deadline=None, phases=NO_SHRINK, database=None)
@example(race=(1, [TINY], 5, [True], 5, 14, False))
@example(race=(1, [TINY], 5, [True], 5, 14, True))
@example(race=(2, [TINY, {}], 5, [True, True], 5, 14, False))
@given(race=_retention_races())
def test_a_catch_up_racing_retention_never_skips_nor_splits_an_epoch(retention_host, race):
    """A subscriber (plain or durable) joins at a random position while epoch k is open
    (begun by some partitions), then stalls while the publishers publish more epochs under a
    tiny retention. Whatever it then delivers is a prefix of the wanted epochs, each whole,
    and if not all of them it raised HistoryUnavailable / SubscriptionExpired (its constructor
    too may refuse: the position is no longer retained)."""
    cat, hosts = retention_host
    n, rets, k, half, start, more, durable = race
    topic = f"race{next(_topics)}"
    names = [f"{topic}/{p}" for p in range(n)]
    for p in range(n):
        hosts[p].call("open", names[p], topic, p, n, "total", rets[p], None)
    sent: dict = {}

    def epoch_cmds(p, ts, partial_first=False):
        cmds = []
        for t in ts:
            if not (partial_first and t == ts[0] and half[p]):
                rec = _rec(p, t, 0)
                sent.setdefault(t, []).append(tuple(rec))
                cmds.append(["send", names[p], t, [rec]])
            rec = _rec(p, t, 1)
            sent.setdefault(t, []).append(tuple(rec))
            cmds += [["send", names[p], t, [rec]], ["progress", names[p], [[t + 1, 1], [t, -1]]]]
        return cmds

    pend = []
    for p in range(n):
        cmds = epoch_cmds(p, list(range(k)))
        if half[p]:
            rec = _rec(p, k, 0)
            sent.setdefault(k, []).append(tuple(rec))
            cmds.append(["send", names[p], k, [rec]])
        pend.append(hosts[p].post(cmds + [["flush", names[p]]]))
    for p in range(n):
        hosts[p].answers(pend[p])
    since_at_join = History(topic, Catalog(cat)).since[0]
    kw = {"durable": "d"} if durable else {}
    try:
        sub = Subscriber(topic, Catalog(cat), start=start, timeout=10, **kw)
    except (HistoryUnavailable, SubscriptionExpired):
        assert start != "earliest" and start < since_at_join
        for p in range(n):
            hosts[p].call("close", names[p])
        return
    err = None
    got = []
    try:
        try:
            ready = sub.wait_ready(10)
        except (HistoryUnavailable, SubscriptionExpired) as e:
            # refused at the join: only if the position was no longer retained then
            assert start != "earliest" and start < since_at_join, repr(e)
            ready, err = True, e
        assert ready
        pend = []
        for p in range(n):
            pend.append(hosts[p].post(epoch_cmds(p, list(range(k, k + more + 1)),
                                                 partial_first=True)
                                      + [["flush", names[p]]]))
        for p in range(n):
            hosts[p].answers(pend[p])
        for p in range(n):
            hosts[p].call("close", names[p])
        if err is None:
            try:
                for e in sub.epochs(timeout=5):
                    got.append(e)
                    if durable:
                        sub.ack(e)
            except (HistoryUnavailable, SubscriptionExpired, SubscriptionHeld) as e:
                err = e
    finally:
        sub.close()
    first = since_at_join if start == "earliest" else start
    want_times = list(range(first, k + more + 1))
    want = {t: sorted(sent[t]) for t in want_times}
    _assert_prefix_or_explicit(got, err, want_times, want,
                               f"n={n} rets={rets} k={k} half={half} start={start} "
                               f"more={more} durable={durable}")


# ================================================================================================
# 3. kill -9 of a publisher during a subscriber's catch-up; restarts on the same retention dir
# ================================================================================================
LOOP = dict(msgs=2, recs=5, pad=30)
LOOP_ARGS = ["--msgs", 2, "--recs", 5, "--pad", 30]


@settings(max_examples=examples(3), deadline=None, phases=NO_SHRINK, database=None)
@example(kill_after=12, start=0, delay=0.03, mid=True)
@given(kill_after=st.integers(10, 16), start=st.sampled_from([0, 4, "earliest"]),
       delay=st.sampled_from([0.0, 0.03]), mid=st.booleans())
def test_kill9_during_catch_up_and_restart_recover_fills_every_epoch_once(
        tmp_path_factory, kill_after, start, delay, mid):
    """The subscriber (recover=True) joins at a position in the past while the publisher
    process runs; it is still catching up (reading slowly) when the publisher is killed with
    SIGKILL — at an epoch boundary or mid-epoch — and restarted with --resume on the same
    catalog and retention directory. It must get every epoch from its position to the end
    exactly once, whole (the half-sent epoch of the killed publisher never half, never twice,
    never mixed with its re-sent copy), with no Gap."""
    root = tmp_path_factory.mktemp("kill")
    cat = root / "cat"
    last = 24
    pace = ["--msg-interval", 0.01] if mid else ["--interval", 0.02]
    p1 = LoopPeer(cat, "t", "--last", last, "--pause-at", 10, *LOOP_ARGS, *pace, log_dir=root)
    p2 = None
    try:
        p1.until("paused 10")
        sub = Subscriber("t", Catalog(cat), start=start, recover=True, timeout=10,
                         ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            reader = Reader(sub, delay=delay)
            p1.say()
            p1.until(f"epoch {kill_after}")
            p1.kill()
            p2 = LoopPeer(cat, "t", "--resume", "--last", last, *LOOP_ARGS, "--interval", 0.005,
                          log_dir=root)
            ready = p2.until("ready")
            assert json.loads(ready[2])[0] >= kill_after + 1
            p2.until("closed")
            reader.join()
        finally:
            sub.close()
        assert reader.error is None, repr(reader.error)
        first = 0 if start == "earliest" else start
        _check_stream(TOTAL, reader.items, _loop_expected(range(first, last), **LOOP),
                      context=f"kill after {kill_after}, start {start}, mid={mid}")
        assert sub.stats["history_epochs"] >= 10 - first
    finally:
        p1.close()
        if p2 is not None:
            p2.close()


def _lower_after(oname, ops):
    lower = (ORDERS[oname].minimum,)
    for op in ops:
        if op[0] == "adv":
            lower = op[1]
    return lower


@st.composite
def _restart_scenarios(draw):
    oname = draw(st.sampled_from(["total", "product(2)"]))
    order = ORDERS[oname]
    n = draw(st.integers(1, 2))
    ops = [draw(_partition_ops(oname, p)) for p in range(n)]
    victim = draw(st.integers(0, n - 1))
    cuts = [draw(st.integers(0, len(o))) for o in ops]
    kill_at = draw(st.integers(cuts[victim], len(ops[victim])))
    flushed = draw(st.booleans())  # the victim's last ops logged (flush) before the kill
    lazy = draw(st.booleans())
    # positions at or before every partition's lower frontier at the join (a position ahead
    # of a partition is test_rejoin_after_kill9_before_the_stream_reached_the_position's)
    lowers = [t for p in range(n) for t in _lower_after(oname, ops[p][:cuts[p]])]
    ok = [a for a in GRID[oname] if all(order.le(a, t) for t in lowers)]
    start = draw(st.sampled_from(["earliest", *ok]))
    return oname, ops, victim, cuts, kill_at, flushed, lazy, start


@settings(max_examples=examples(5), deadline=None, phases=NO_SHRINK, database=None)
@example(scenario=("total",
                   [[("send", 0, [[0, 0, 0, ""]]), ("send", 1, [[0, 1, 0, ""]]),
                     ("send", 4, [[0, 2, 0, ""]])],
                    [("adv", (1,), (0,)), ("send", 8, [[1, 0, 0, ""]]), ("adv", (8,), (1,))]],
                   0, [2, 0], 2, True, False, "earliest"))
@given(scenario=_restart_scenarios())
def test_kill9_and_restart_anywhere_rejoin_is_filled_from_history(tmp_path_factory, scenario):
    """Each partition's publisher in its own process, total or product(2) times, several
    epochs open at once; a subscriber (recover=True) joins mid-stream; one partition's process
    is killed with SIGKILL after a random op (its last ops logged or not) and a successor
    resumes on the same log (its lower frontier as recovered), re-sends what the log does not
    hold complete, and goes on. The subscriber re-joins and gets exactly the epochs with data
    at or beyond its position, once, whole, in an order consistent with the order."""
    oname, ops, victim, cuts, kill_at, flushed, lazy, start = scenario
    order = ORDERS[oname]
    root = tmp_path_factory.mktemp("restart")
    cat = root / "cat"
    n = len(ops)
    peers = [CmdPeer(cat, root) for _ in range(n)]
    successor = None
    try:
        for p in range(n):
            peers[p].call("open", "p", "t", p, n, oname, {}, None)
        pend = [peers[p].post([_cmd("p", op) for op in ops[p][:cuts[p]]] + [["flush", "p"]])
                for p in range(n)]
        for p in range(n):
            peers[p].answers(pend[p])
        position = start if start == "earliest" else [start]
        sub = Subscriber("t", Catalog(cat), start=position, recover=True, timeout=10,
                         ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            reader = None if lazy else Reader(sub)
            others = {p: peers[p].post([_cmd("p", op) for op in ops[p][cuts[p]:]]
                                       + [["flush", "p"]]) for p in range(n) if p != victim}
            v = peers[victim]
            v.answers(v.post([_cmd("p", op) for op in ops[victim][cuts[victim]:kill_at]]
                             + ([["flush", "p"]] if flushed else [])))
            _kill(v.proc)
            successor = CmdPeer(cat, root)
            logged, _ = successor.call("open", "p", "t", victim, n, oname, {}, None)
            logged = tuple(tuple(t) if isinstance(t, list) else t for t in logged)
            at_kill = _lower_after(oname, ops[victim][:kill_at])
            assert all(_beyond(order, logged, t) for t in at_kill), (logged, at_kill)
            # re-send what the log does not hold complete, then catch up with the frontier
            redo = [_cmd("p", op) for op in ops[victim][:kill_at]
                    if op[0] == "send" and _beyond(order, logged, op[1])]
            if sorted(logged, key=_key) != sorted(at_kill, key=_key):
                redo.append(_cmd("p", ("adv", at_kill, logged)))
            redo += [_cmd("p", op) for op in ops[victim][kill_at:]]
            successor.answers(successor.post(redo + [["flush", "p"], ["close", "p"]]))
            for p, k in others.items():
                peers[p].answers(k)
                peers[p].call("close", "p")
            if lazy:
                got = list(sub.epochs(timeout=15))
            else:
                reader.join()
                assert reader.error is None, repr(reader.error)
                got = reader.items
        finally:
            sub.close()
    finally:
        for peer in [*peers, successor]:
            if peer is not None:
                peer.close()
    records: dict = {}
    for p in range(n):
        for op in ops[p]:
            if op[0] == "send":
                records.setdefault(op[1], []).extend(tuple(r) for r in op[2])
    first = [order.minimum] if start == "earliest" else [start]
    want = {t: sorted(r) for t, r in records.items() if _beyond(order, first, t)}
    event(f"rejoins filled: {sub.stats['rejoins_filled']}")
    _check_stream(order, got, want, context=f"{oname} n={n} victim={victim} cuts={cuts} "
                                            f"kill_at={kill_at} flushed={flushed} lazy={lazy} "
                                            f"start={start}")


def test_rejoin_while_a_history_fill_is_pending_never_hands_out_an_epoch_twice_or_half(
        tmp_path):
    """Two partitions (processes). The subscriber (recover=True) joins at 0 while both have
    sent part of epoch 0: its history fill owes epoch 0. Partition 1 completes its part
    (indexed in its log); partition 0's process is killed with SIGKILL before completing it
    and a successor resumes on its log (re-sending epoch 0's data), but completes epoch 0 only
    after the subscriber has re-joined. Epoch 0 must be delivered once, whole — not first as
    partition 1's half (the old join's fill serving it while the new join is not ready) and
    then again."""
    cat = tmp_path / "cat"
    a, b = CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path)
    c = None
    try:
        a.call("open", "p", "t", 0, 2, "total", {}, None)
        b.call("open", "p", "t", 1, 2, "total", {}, None)
        a.answers(a.post([["send", "p", 0, [[0, "a"]]], ["flush", "p"]]))
        b.answers(b.post([["send", "p", 0, [[1, "a"]]], ["flush", "p"]]))
        sub = Subscriber("t", Catalog(cat), start=0, recover=True, timeout=10, ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            assert sub.filter == (0,)  # epoch 0 begun before the join: history's to supply
            reader = Reader(sub)
            b.answers(b.post([["progress", "p", [[1, 1], [0, -1]]], ["flush", "p"]]))
            _kill(a.proc)
            c = CmdPeer(cat, tmp_path)
            lower, _ = c.call("open", "p", "t", 0, 2, "total", {}, None)
            assert lower == [0]
            c.answers(c.post([["send", "p", 0, [[0, "a"]]], ["flush", "p"]]))
            deadline = time.monotonic() + 10
            while not (sub.stats["rejoins"] and sub.ready) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sub.stats["rejoins"] >= 1, dict(sub.stats)
            time.sleep(0.2)
            c.answers(c.post([["send", "p", 0, [[0, "b"]]], ["progress", "p", [[1, 1], [0, -1]]],
                              ["send", "p", 1, [[0, "c"]]], ["progress", "p", [[2, 1], [1, -1]]],
                              ["flush", "p"], ["close", "p"]]))
            b.answers(b.post([["send", "p", 1, [[1, "c"]]], ["progress", "p", [[2, 1], [1, -1]]],
                              ["flush", "p"], ["close", "p"]]))
            reader.join()
        finally:
            sub.close()
    finally:
        for peer in (a, b, c):
            if peer is not None:
                peer.close()
    assert reader.error is None, repr(reader.error)
    _check_stream(TOTAL, reader.items, {0: [(0, "a"), (0, "b"), (1, "a")], 1: [(0, "c"), (1, "c")]},
                  context="re-join with a fill pending")


def test_kill9_one_of_two_product_partitions_during_catch_up_and_restart(tmp_path):
    """product(2) times, two partitions in two processes at different paces (partition 1 is
    slow); the subscriber joins at [(2, 1), (4, 0)] while both run, catches up slowly, and
    partition 0 is killed mid-epoch and restarted with --resume. Every epoch at or beyond the
    position comes once, whole across both partitions, in an order consistent with the
    product order; (2, 0) and (3, 0) never."""
    cat = tmp_path / "cat"
    last = 9
    common = ["--order", "product(2)", "--partitions", 2, "--tag-partition", *LOOP_ARGS]
    p0 = LoopPeer(cat, "g", "--partition", 0, "--last", last, "--pause-at", 5, *common,
                  "--msg-interval", 0.01, log_dir=tmp_path)
    p1 = LoopPeer(cat, "g", "--partition", 1, "--last", last, "--pause-at", 3, *common,
                  "--interval", 0.15, log_dir=tmp_path)
    p0b = None
    position = [(2, 1), (4, 0)]
    try:
        p0.until("paused 5")
        p1.until("paused 3")
        sub = Subscriber("g", Catalog(cat), start=position, recover=True, timeout=10,
                         ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            reader = Reader(sub, delay=0.05)
            p0.say()
            p1.say()
            p0.until("epoch 6")
            time.sleep(0.03)  # mid-epoch 7
            p0.kill()
            p0b = LoopPeer(cat, "g", "--partition", 0, "--resume", "--last", last, *common,
                           log_dir=tmp_path)
            p0b.until("closed")
            p1.until("closed")
            reader.join()
        finally:
            sub.close()
        assert reader.error is None, repr(reader.error)
        full = _loop_expected(range(last), **LOOP, parts=[0, 1], order="product(2)")
        want = {t: r for t, r in full.items() if _beyond(P2, position, t)}
        assert (2, 0) not in want and (3, 0) not in want and (2, 1) in want
        _check_stream(P2, reader.items, want, context="product kill")
    finally:
        for p in (p0, p1, p0b):
            if p is not None:
                p.close()


def test_kill9_without_restart_delivers_every_complete_epoch_then_fails_explicitly(tmp_path):
    """The subscriber joins at 0 while the publisher is paused at 10 (epochs 0..9 complete,
    only in history for it), then the publisher is killed before the subscriber reads
    anything. It must deliver 0..9 whole — the log is on disk — and then raise (the publisher
    is gone), not end as if the stream were finished and not hand out less."""
    cat = tmp_path / "cat"
    p = LoopPeer(cat, "t", "--last", 20, "--pause-at", 10, *LOOP_ARGS, log_dir=tmp_path)
    try:
        p.until("paused 10")
        sub = Subscriber("t", Catalog(cat), start=0, timeout=1.5, ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            p.kill()
            got, err = [], None
            try:
                for e in sub.epochs(timeout=10):
                    got.append(e)
            except (PublisherLost, PublisherAborted) as e:
                err = e
        finally:
            sub.close()
        assert err is not None, f"the stream ended without an error after {[e.time for e in got]}"
        _check_stream(TOTAL, got, _loop_expected(range(10), **LOOP), context="no restart")
    finally:
        p.close()


def test_earliest_spans_a_closed_run_and_a_killed_and_resumed_one_on_the_same_retention_dir(
        tmp_path):
    """Run 1 publishes 0..7 and closes; run 2 (same catalog and retention directory) goes on
    at 8 and the subscriber joins it at "earliest" mid-run; run 2 is killed mid-epoch and run
    3 resumes from the log. The subscriber (recover=True) gets 0..19: run 1's epochs from the
    log, run 2's before and after the kill once each, run 3's — every one whole."""
    cat = tmp_path / "cat"
    r1 = LoopPeer(cat, "t", "--last", 8, *LOOP_ARGS, log_dir=tmp_path)
    r2 = r3 = None
    try:
        r1.until("closed")
        r1.wait()
        r2 = LoopPeer(cat, "t", "--first", 8, "--last", 20, *LOOP_ARGS, "--msg-interval", 0.01,
                      log_dir=tmp_path)
        ready = r2.until("ready")
        assert json.loads(ready[2]) == [8]
        r2.until("epoch 10")
        sub = Subscriber("t", Catalog(cat), start="earliest", recover=True, timeout=10,
                         ping_interval=0.2)
        try:
            reader = Reader(sub, delay=0.02)
            r2.until("epoch 13")
            time.sleep(0.025)
            r2.kill()
            r3 = LoopPeer(cat, "t", "--resume", "--last", 20, *LOOP_ARGS, log_dir=tmp_path)
            r3.until("closed")
            reader.join()
        finally:
            sub.close()
        assert reader.error is None, repr(reader.error)
        _check_stream(TOTAL, reader.items, _loop_expected(range(20), **LOOP),
                      context="three runs")
        assert [e.time for e in History("t", Catalog(cat)).epochs()] == list(range(20))
    finally:
        for r in (r1, r2, r3):
            if r is not None:
                r.close()


def test_rejoin_after_kill9_before_the_stream_reached_the_position_keeps_the_position(
        tmp_path):
    """The subscriber (recover=True) joins at 12 while the publisher is still at 3 (the
    position is in the future: nothing from history, a floor on the live stream). The
    publisher is killed at 5 and restarted with --resume: the re-join must still deliver
    exactly the epochs at or beyond 12 — not 5..11, which lie before the position."""
    cat = tmp_path / "cat"
    last = 16
    p1 = LoopPeer(cat, "t", "--last", last, "--pause-at", 3, *LOOP_ARGS, "--interval", 0.02,
                  log_dir=tmp_path)
    p2 = None
    try:
        p1.until("paused 3")
        sub = Subscriber("t", Catalog(cat), start=12, recover=True, timeout=10,
                         ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            reader = Reader(sub)
            p1.say()
            p1.until("epoch 5")
            p1.kill()
            p2 = LoopPeer(cat, "t", "--resume", "--last", last, *LOOP_ARGS, "--interval", 0.02,
                          log_dir=tmp_path)
            p2.until("closed")
            reader.join()
        finally:
            sub.close()
        assert reader.error is None, repr(reader.error)
        _check_stream(TOTAL, reader.items, _loop_expected(range(12, last), **LOOP),
                      context="start 12, re-joined at 6")
    finally:
        p1.close()
        if p2 is not None:
            p2.close()


def test_aborted_publisher_whose_successor_finished_before_a_slow_subscriber_noticed(
        tmp_path):
    """A subscriber (recover=True) joined at 0 reads nothing while its publisher aborts
    mid-epoch (an X aborted notice) and a successor process resumes from the log, publishes
    the rest and closes. When the subscriber then reads, the whole stream is in the log: it
    must re-join and deliver 0..7 once, whole (as it does when the predecessor was killed
    with SIGKILL: tests/history/test_history_faults.py), not raise PublisherAborted because
    the successor is no longer *live*."""
    cat = tmp_path / "cat"
    a, b = CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path)
    try:
        a.call("open", "p", "t", 0, 1, "total", {}, None)
        cmds = []
        for t in range(4):
            cmds += [["send", "p", t, [[t, 0]]], ["progress", "p", [[t + 1, 1], [t, -1]]]]
        a.answers(a.post(cmds + [["flush", "p"]]))
        sub = Subscriber("t", Catalog(cat), start=0, recover=True, timeout=3, ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            a.answers(a.post([["send", "p", 4, [[4, "lost half"]]], ["flush", "p"],
                              ["abort", "p"]]))
            lower, _ = b.call("open", "p", "t", 0, 1, "total", {}, None)
            assert lower == [4]
            cmds = []
            for t in range(4, 8):
                cmds += [["send", "p", t, [[t, 0]]], ["progress", "p", [[t + 1, 1], [t, -1]]]]
            b.answers(b.post(cmds + [["flush", "p"], ["close", "p"]]))
            got, err = [], None
            try:
                for e in sub.epochs(timeout=10):
                    got.append(e)
            except PublisherAborted as e:
                err = e
        finally:
            sub.close()
    finally:
        a.close()
        b.close()
    assert err is None, (f"{err!r} after {[e.time for e in got]}; the catalog says: "
                         f"{Catalog(cat).lookup('t').partition_info[0]}")
    _check_stream(TOTAL, got, {t: [(t, 0)] for t in range(8)}, context="abort, successor closed")


def test_a_closed_partition_restarted_on_its_log_while_another_runs_is_not_served_half(
        tmp_path):
    """Two partitions in two processes. Partition 0 publishes 0..4 and closes (its log is
    finished); partition 1 goes on. A subscriber (recover=True) joined at 0 follows. Then
    partition 0 is restarted in a third process on the same log while partition 1 still runs.
    This was the last documented way to see a partial epoch (the restarted partition's epochs
    released with partition 1's records only). A closed partition is final for its run
    (catalog/runs.py): the restart is refused with an error naming the choices, before its log
    is touched; partition 1 publishes 5..7 alone (partition 0 finished: those epochs are whole
    with partition 1's records), and once partition 1 closed too, partition 0 starts run 2."""
    cat = tmp_path / "cat"
    a, b, c = CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path), CmdPeer(cat, tmp_path)
    try:
        for peer, p in ((a, 0), (b, 1)):
            peer.call("open", "p", "t", p, 2, "total", {}, None)
        pend = []
        for peer, p in ((a, 0), (b, 1)):
            cmds = []
            for t in range(5):
                cmds += [["send", "p", t, [[p, t]]], ["progress", "p", [[t + 1, 1], [t, -1]]]]
            pend.append((peer, peer.post(cmds + [["flush", "p"]])))
        for peer, k in pend:
            peer.answers(k)
        a.call("close", "p")
        before = Catalog(cat).history_state("t", 0)
        sub = Subscriber("t", Catalog(cat), start=0, recover=True, timeout=5, ping_interval=0.2)
        try:
            assert sub.wait_ready(10)
            reader = Reader(sub, timeout=5)
            reader.wait_for(4)
            with pytest.raises(AssertionError, match=r"CatalogError partition 0 of topic 't' "
                                                     r"closed in run 1, which goes on"):
                c.call("open", "p", "t", 0, 2, "total", {}, None)
            assert Catalog(cat).history_state("t", 0) == before  # the log was not touched
            cmds = []
            for t in range(5, 8):
                cmds += [["send", "p", t, [[1, t]]], ["progress", "p", [[t + 1, 1], [t, -1]]]]
            b.answers(b.post(cmds + [["flush", "p"], ["close", "p"]]))
            reader.join()
        finally:
            sub.close()
        info = Catalog(cat).lookup("t").partition_info
        assert [(p.state, p.run) for p in info] == [("closed", 1), ("closed", 1)]
        lower, _ = c.call("open", "p", "t", 0, 2, "total", {}, None)  # run 1 ended: run 2
        assert lower == [5]
        assert Catalog(cat).lookup("t").partition_info[0].run == 2
    finally:
        for peer in (a, b, c):
            peer.close()
    assert reader.error is None, reader.error
    _check_stream(TOTAL, reader.items,
                  {t: [(0, t), (1, t)] if t < 5 else [(1, t)] for t in range(8)},
                  context="a closed partition's restart refused while its run goes on")


def test_a_subscriber_joining_while_a_new_run_registers_waits_for_all_of_it(tmp_path):
    """Run 1 of a two-partition topic ended; partition 0 began run 2, partition 1 has not
    registered for it yet. A subscriber joining now must not take partition 1's closed run-1
    row for its run-2 successor (its epochs would complete without partition 1's records): it
    waits (up to ``wait``) until partition 1 registered, then gets every epoch whole; with no
    successor in time it fails with PublisherLost naming the run change."""
    from epochstream import Publisher

    cat = Catalog(tmp_path / "cat")
    for p in (0, 1):
        with Publisher("t", catalog=cat, partition=p, partitions=2) as pub:
            pub.send(0, [f"run1-{p}"])
    p0 = Publisher("t", catalog=cat, partition=0, partitions=2, start=1)
    p1 = None
    try:
        with pytest.raises(PublisherLost, match=r"between runs: partition\(s\) \[1\] ended run 1"):
            Subscriber("t", catalog=cat, wait=0.3, timeout=5)
        joined: list = []
        th = threading.Thread(target=lambda: joined.append(
            Subscriber("t", catalog=cat, wait=10, timeout=5)), daemon=True)
        th.start()
        time.sleep(0.5)
        assert not joined, "the subscriber joined while partition 1 was still in run 1"
        p1 = Publisher("t", catalog=cat, partition=1, partitions=2, start=1)
        th.join(10)
        (sub,) = joined
        with sub:
            assert sub.wait_ready(5)
            assert [p.run for p in cat.lookup("t").partition_info] == [2, 2]
            for e in (1, 2):
                for p, pub in ((0, p0), (1, p1)):
                    pub.send(e, [f"run2-{p}-{e}"])
            for pub in (p0, p1):
                pub.advance_to(3)
            got = [(e.time, sorted(e.records)) for e in itertools.islice(sub.epochs(timeout=5), 2)]
        assert got == [(e, [f"run2-0-{e}", f"run2-1-{e}"]) for e in (1, 2)]
    finally:
        p0.close(linger=0)
        if p1 is not None:
            p1.close(linger=0)


# ================================================================================================
# 4. recover=True: an evicted subscriber of two product(2) partitions is filled from history
# ================================================================================================
def test_evicted_subscriber_of_two_product_partitions_is_filled_from_history(tmp_path):
    """Both partitions' publishers (processes) evict a subscriber that reads nothing while
    they send big messages at different paces; with recover=True it re-joins (maybe several
    times) and the epochs it missed come from the logs: no Gap, every epoch at or beyond its
    position once, whole across both partitions, in product order."""
    cat = tmp_path / "cat"
    last = 12
    big = ["--msgs", 3, "--recs", 1, "--pad", 30_000]
    common = ["--order", "product(2)", "--partitions", 2, "--tag-partition", *big,
              "--sndhwm", 2, "--max-queue-messages", 5, "--pause-at", 2, "--pause-end"]
    peers = [LoopPeer(cat, "e", "--partition", 0, "--last", last, *common, log_dir=tmp_path),
             LoopPeer(cat, "e", "--partition", 1, "--last", last, *common, "--interval", 0.01,
                      log_dir=tmp_path)]
    position = [(1, 1)]
    try:
        for p in peers:
            p.until("paused 2")
        sub = Subscriber("e", Catalog(cat), start=position, recover=True, rcvhwm=2,
                         timeout=10)
        try:
            assert sub.wait_ready(10)
            for p in peers:
                p.say()  # the subscriber reads nothing while the epochs go out
            for p in peers:
                p.until("paused end")
            got = []
            for e in sub.epochs(timeout=10):
                got.append(e)
                if isinstance(e, Gap) or e.time == (last - 1, 1):
                    break
        finally:
            sub.close()
        for p in peers:
            p.say()
            p.until("closed")
    finally:
        for p in peers:
            p.close()
    full = _loop_expected(range(last), 3, 1, 30_000, parts=[0, 1], order="product(2)")
    want = {t: r for t, r in full.items() if _beyond(P2, position, t)}
    _check_stream(P2, got, want, context="evicted product")
    assert sub.stats["rejoins_filled"] >= 1, dict(sub.stats)
