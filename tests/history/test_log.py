"""The epoch log (:mod:`epochstream.log`) against a real catalog in ``tmp_path``, and the
pure retention policy (:mod:`epochstream.retention`).

- records round-trip exactly (payload bytes, order, several messages per epoch, interleaved
  open epochs, product orders), as examples and as a Hypothesis property over random streams;
- segments roll only at epoch boundaries (every epoch's extents lie in one existing file);
- retention deletes whole oldest segments only, moves ``since``, never the segment being
  written;
- recovery truncates an uncommitted tail and removes stray later segments;
- fsync policies; ``Retention`` refuses bad values;
- :func:`segments_to_delete` against a brute-force oracle.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from hypothesis_profiles import examples

from epochstream import wire
from epochstream.catalog import Catalog
from epochstream.log import LogWriter, partition_dir, read_epoch, segment_path
from epochstream.errors import HistoryCorrupt, HistoryError, HistoryWriteError
from epochstream.frontier import Antichain
from epochstream.order import TOTAL, dual, product
from epochstream.retention import (DEFAULT_SEGMENT_BYTES, Retention, SegmentStat,
                                   segments_to_delete)
from epochstream.testing.model import minimal

NO_LIMITS = dict(max_bytes=None, max_age=None, max_epochs=None)


class Log:
    """One partition's LogWriter over a real Catalog, plus a model of what was sent."""

    def __init__(self, root: Path, order=TOTAL, retention: Retention | None = None,
                 topic: str = "t", partition: int = 0, create: bool = True):
        self.root, self.order, self.topic, self.partition = Path(root), order, topic, partition
        self.retention = retention or Retention(segment_bytes=4096, **NO_LIMITS)
        self.cat = Catalog(self.root / "cat")
        if create:
            self.cat.create_topic(topic, order=order)
        self.dir = partition_dir(self.root / "history", topic, partition)
        self.sent: dict = {}  # time -> [(header, payload)] in send order
        self.completed: list = []  # times in completion order
        self.upper = Antichain(dual(order))
        self.lower: tuple = (order.minimum,)
        self.w = self.reopen()

    def reopen(self) -> LogWriter:
        self.w = LogWriter(self.cat, self.topic, self.partition, self.order, self.retention,
                           self.dir)
        state = self.w.open([self.order.minimum], list(self.upper.elements))
        self.lower = tuple(state.lower)
        return self.w

    def send(self, t, payload: bytes) -> None:
        h = wire.encode_time(t)
        self.w.data(t, h, payload)
        self.sent.setdefault(t, []).append((h, payload))
        self.upper.insert(t)

    def advance(self, lower) -> list:
        """Move the lower frontier to ``lower``; returns the times with data it completes."""
        new = Antichain(self.order, lower)
        done = [t for t in self.sent if t not in self.completed and not new.less_equal(t)]
        header = msgpack.packb([[list(t) if isinstance(t, tuple) else t, 1] for t in lower])
        self.w.frontier(tuple(lower), self.upper.elements, header)
        self.completed.extend(done)
        self.lower = tuple(lower)
        return done

    def state(self):
        return self.cat.history_state(self.topic, self.partition)

    def index(self) -> dict:
        return {r.time: r for r in self.cat.history_epochs(self.topic, self.partition)}

    def files(self) -> set[int]:
        return {int(p.stem) for p in self.dir.glob("*.eslog")}


def check_index_matches(log: Log, times=None) -> None:
    """Every indexed epoch reads back exactly what was sent, from one existing segment, its
    extents inside that file."""
    index = log.index()
    for t in (index if times is None else times):
        r = index[t]
        path = segment_path(log.dir, r.segment)
        assert path.exists(), (t, r)
        size = path.stat().st_size
        assert all(0 <= off and off + n <= size for off, n in r.extents), (t, r, size)
        assert read_epoch(log.dir, r) == log.sent[t], t
        assert r.messages == len(log.sent[t])
        assert r.nbytes == sum(len(p) for _, p in log.sent[t])


# ---- round trip --------------------------------------------------------------------------


def test_round_trip_total_interleaved_epochs(tmp_path):
    log = Log(tmp_path)
    log.send(0, b"a0")
    log.send(1, b"b0")
    log.send(0, b"")          # empty payload
    log.send(2, bytes(range(256)) * 3)
    log.send(1, b"b1")
    log.send(0, b"a2")
    assert log.advance([1]) == [0]
    assert set(log.index()) == {0}
    log.send(1, b"b2")        # epoch 1 keeps growing across the F record
    log.send(3, b"d0")
    assert sorted(log.advance([3])) == [1, 2]
    assert set(log.index()) == {0, 1, 2}
    check_index_matches(log)
    # the index is exact: time headers and payloads in send order, several extents for 1
    assert read_epoch(log.dir, log.index()[0]) == [
        (wire.encode_time(0), b"a0"), (wire.encode_time(0), b""), (wire.encode_time(0), b"a2")]
    assert len(log.index()[1].extents) >= 2
    log.advance([])           # closing completes the rest
    assert set(log.index()) == {0, 1, 2, 3}
    check_index_matches(log)
    st_ = log.state()
    assert st_.lower == () and st_.committed == segment_path(log.dir, st_.segment).stat().st_size


def test_round_trip_product_order(tmp_path):
    order = product(2)
    log = Log(tmp_path, order)
    log.send((0, 1), b"x")
    log.send((1, 0), b"y")
    log.send((1, 1), b"z")
    log.send((0, 1), b"x2")
    log.send((2, 0), b"w")
    # (1,1) and (2,0) stay open at [(1,1),(2,0)]; (0,1) and (1,0) complete
    assert sorted(log.advance([(1, 1), (2, 0)])) == [(0, 1), (1, 0)]
    assert set(log.index()) == {(0, 1), (1, 0)}
    log.send((1, 1), b"z2")
    assert sorted(log.advance([(2, 1)])) == [(1, 1), (2, 0)]
    assert set(log.index()) == {(0, 1), (1, 0), (1, 1), (2, 0)}
    check_index_matches(log)
    assert all(isinstance(t, tuple) for t in log.index())


def test_frontier_without_data_indexes_nothing(tmp_path):
    log = Log(tmp_path)
    for e in range(5):
        log.advance([e + 1])
    assert log.index() == {}
    assert log.state().lower == (5,)


_PAYLOAD = st.binary(min_size=0, max_size=300)


@st.composite
def log_runs(draw, order):
    """A random single-partition run: ("data", t, payload) at times at or beyond the current
    lower frontier, ("advance", antichain) moving it forward, ("crash",) (the writer is
    dropped without a frontier and a new one recovers the log), maybe a final close."""
    if order is TOTAL:
        grid = list(range(6))
    else:
        grid = [(a, b) for a in range(3) for b in range(3)]
    lower = [order.minimum]
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        open_ = [t for t in grid if any(order.le(l, t) for l in lower)]
        if not open_:
            break
        k = draw(st.integers(0, 9))
        if k == 0:
            ops.append(("crash",))
        elif k < 7:
            ops.append(("data", draw(st.sampled_from(open_)), draw(_PAYLOAD)))
        else:
            # the new frontier: minimal elements of a random non-empty subset of the up-set
            pick = draw(st.lists(st.sampled_from(open_), min_size=1, max_size=3))
            new = sorted(minimal(order, pick), key=repr)
            if draw(st.integers(0, 9)) == 0:
                new = []
            ops.append(("advance", new))
            lower = new
    if lower and draw(st.booleans()):
        ops.append(("advance", []))
    return ops


@settings(max_examples=examples(40))
@given(st.sampled_from([TOTAL, product(2)]).flatmap(lambda o: st.tuples(st.just(o), log_runs(o))),
       st.sampled_from([4096, 8192]))
def test_round_trip_random_runs(tmp_path_factory, run, segment_bytes):
    """Random streams with small segments: after every advance, exactly the completed epochs
    with data are indexed, each read back byte-exact from one segment; segments roll only
    between epochs (every segment but the last holds no part of an epoch still open)."""
    order, ops = run
    log = Log(tmp_path_factory.mktemp("log"), order,
              Retention(segment_bytes=segment_bytes, **NO_LIMITS))
    for op in ops:
        if op[0] == "data":
            log.send(op[1], op[2])
        elif op[0] == "crash":
            log.w._file.flush()
            log.w.close()
            lower = log.lower
            for t in [t for t in log.sent if t not in log.completed]:
                del log.sent[t]  # records of open epochs are truncated on recovery
            log.reopen()
            assert log.lower == lower
            st_ = log.state()
            assert segment_path(log.dir, st_.segment).stat().st_size == st_.committed
            assert set(log.index()) == set(log.completed)
        else:
            log.advance(op[1])
            index = log.index()
            assert set(index) == set(log.completed)
            check_index_matches(log)
            st_ = log.state()
            assert st_.segments[-1].seq == st_.segment
            assert segment_path(log.dir, st_.segment).exists()
            assert st_.committed == segment_path(log.dir, st_.segment).stat().st_size
            # a segment before the current one was closed at an epoch boundary: each
            # retained segment's epochs are exactly those indexed in it
            for s in st_.segments:
                assert s.epochs == sum(1 for r in index.values() if r.segment == s.seq)
            assert {r.segment for r in index.values()} <= {s.seq for s in st_.segments}
            assert log.files() == {s.seq for s in st_.segments}


# ---- segments roll at epoch boundaries ---------------------------------------------------


def test_segments_roll_only_at_epoch_boundaries(tmp_path):
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, **NO_LIMITS))
    for e in range(300):
        for i in range(3):
            log.send(e, f"{e}.{i}".encode() * 20)
        if e % 4 == 3:  # a few epochs stay open across several frontier advances
            log.advance([e - 1])
        else:
            log.advance([e + 1]) if e % 4 != 2 else None
    log.advance([300])
    index = log.index()
    assert set(index) == set(range(300))
    st_ = log.state()
    assert len(st_.segments) > 5, "segment_bytes=4096 must have rolled several times"
    assert log.files() == {s.seq for s in st_.segments}
    check_index_matches(log)
    # each closed segment is at least segment_bytes long (rolled only after reaching it)
    for s in st_.segments[:-1]:
        assert segment_path(log.dir, s.seq).stat().st_size >= 4096
    assert sum(s.epochs for s in st_.segments) == 300


def test_segment_never_rolls_while_an_epoch_is_open(tmp_path):
    """An epoch kept open across many frontier advances pins the segment: it grows past
    segment_bytes until the epoch completes."""
    order = product(2)
    log = Log(tmp_path, order, Retention(segment_bytes=4096, **NO_LIMITS))
    # (0, 100) stays open while the other coordinate's epochs complete
    for k in range(60):
        log.send((0, 100), b"x" * 50)
        log.send((k + 1, 0), b"y" * 100)
        log.advance([(0, 100), (k + 2, 0)])
    assert log.state().segment == 0
    assert segment_path(log.dir, 0).stat().st_size > 4096
    log.advance([(100, 100)])
    assert log.state().segment == 1
    check_index_matches(log)
    assert log.index()[(0, 100)].segment == 0


# ---- retention ---------------------------------------------------------------------------


def _fill(log: Log, epochs, size: int = 900, start: int = 0) -> None:
    for e in range(start, start + epochs):
        log.send(e, bytes([e % 256]) * size)
        log.advance([e + 1])


def _check_retained_suffix(log: Log, total: int) -> int:
    """The index holds a contiguous suffix first..total-1 of the epochs, since == (first,),
    the files are exactly the retained segments, the current segment is among them."""
    st_ = log.state()
    index = log.index()
    first = min(index)
    assert sorted(index) == list(range(first, total))
    assert st_.since == (first,)
    assert log.files() == {s.seq for s in st_.segments}
    assert st_.segments[-1].seq == st_.segment
    assert segment_path(log.dir, st_.segment).exists()
    check_index_matches(log)
    return first


def test_retention_max_epochs_deletes_whole_oldest_segments(tmp_path):
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_epochs=10, max_bytes=None,
                                            max_age=None))
    sinces = []
    for e in range(80):
        _fill(log, 1, start=e)
        sinces.append(_check_retained_suffix(log, e + 1))
        st_ = log.state()
        total = sum(s.epochs for s in st_.segments)
        # within the limit, or only the segment being written remains
        assert total <= 10 or len(st_.segments) == 1
        # nothing deleted before needed: the oldest retained segment is needed
        assert total - st_.segments[0].epochs < 10 or len(st_.segments) == 1 or total <= 10
    assert sinces == sorted(sinces) and sinces[-1] > 0


def test_retention_max_bytes(tmp_path):
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_bytes=3 * 4096 + 2000,
                                            max_age=None))
    for e in range(60):
        _fill(log, 1, start=e)
        _check_retained_suffix(log, e + 1)
        st_ = log.state()
        assert sum(s.nbytes for s in st_.segments) <= 3 * 4096 + 2000 or len(st_.segments) == 1
    assert log.state().since[0] > 0


def test_retention_tiny_limits_keep_the_segment_being_written(tmp_path):
    """max_bytes=1 and max_epochs=1: everything but the segment being written goes, and what
    it holds stays readable."""
    for limits in (dict(max_bytes=1, max_age=None), dict(max_epochs=1, max_bytes=None,
                                                          max_age=None)):
        root = tmp_path / str(len(os.listdir(tmp_path)))
        log = Log(root, retention=Retention(segment_bytes=4096, **limits))
        for e in range(40):
            _fill(log, 1, size=1500, start=e)
            st_ = log.state()
            assert len(st_.segments) == 1
            assert log.files() == {st_.segment}
            for t, r in log.index().items():
                assert r.segment == st_.segment
                assert read_epoch(log.dir, r) == log.sent[t]
        assert log.state().segment > 5


class FakeClock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def time(self) -> float:
        return self.now


def test_retention_max_age(tmp_path, monkeypatch):
    import epochstream.log.writer as epochlog

    clock = FakeClock()
    monkeypatch.setattr(epochlog, "_time", clock)
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_age=100.0, max_bytes=None))
    _fill(log, 20)                   # several segments, completed at t=0
    n_segments = len(log.state().segments)
    assert n_segments >= 4
    clock.now += 50
    _fill(log, 1, start=20)          # not old enough: nothing deleted
    assert log.state().since == (0,)
    clock.now += 60                  # the first 20 epochs are 110 s old, epoch 20 is 60 s old
    _fill(log, 1, start=21)
    first = _check_retained_suffix(log, 22)
    st_ = log.state()
    assert first > 0
    # what is left: no segment but the last holds an epoch older than max_age
    index = log.index()
    for s in st_.segments[:-1]:
        assert all(t >= 20 for t, r in index.items() if r.segment == s.seq)


def test_max_age_closes_a_slow_growing_segment_and_ages_it_out(tmp_path, monkeypatch):
    """A log that grows far slower than ``segment_bytes`` (one segment for ever before): the
    segment being written is closed at the first epoch boundary after its oldest epoch passed
    ``max_age``, then deleted once its newest did; an epoch lives at most ~2 x max_age."""
    import epochstream.log.writer as epochlog

    clock = FakeClock()
    monkeypatch.setattr(epochlog, "_time", clock)
    log = Log(tmp_path, retention=Retention(max_age=100.0, max_bytes=None))  # 64 MiB segments
    for e in range(30):  # an epoch every 10 s
        _fill(log, 1, start=e)
        clock.now += 10
        index = log.index()
        ages = [clock.now - r.completed_at for r in index.values()]
        assert max(ages) <= 2 * 100.0 + 2 * 10, (e, ages)  # (checked at commits 10 s apart)
    st_ = log.state()
    assert len(st_.segments) >= 2 and st_.since > (0,), st_
    _check_retained_suffix(log, 30)


def test_expire_ages_out_an_idle_log_without_a_commit(tmp_path, monkeypatch):
    """An idle publisher commits nothing: ``expire`` (the loop's periodic call) closes the aged
    segment being written at the epoch boundary and deletes it once its newest epoch aged; it
    never closes a segment while an epoch is open in it, nor at an empty lower frontier."""
    import epochstream.log.writer as epochlog

    clock = FakeClock()
    monkeypatch.setattr(epochlog, "_time", clock)
    log = Log(tmp_path, retention=Retention(max_age=100.0, max_bytes=None))
    _fill(log, 5)
    log.send(5, b"open epoch")  # epoch 5 is open in the segment: it must not close
    clock.now += 150
    log.w.expire(clock.now)
    assert len(log.state().segments) == 1 and log.files() == {0}
    log.advance([6])            # 5 completes now; the segment rolls at this commit (aged)
    assert [s.seq for s in log.state().segments] == [0, 1]
    clock.now += 50             # epochs 0-4 are 200 s old, epoch 5 50 s: segment 0 stays
    log.w.expire(clock.now)
    assert log.files() == {0, 1}
    clock.now += 60             # now every epoch of segment 0 is older than max_age
    log.w.expire(clock.now)
    assert log.files() == {1} and log.index() == {} and log.state().since == (6,)
    _fill(log, 2, start=6)      # the log goes on after an idle roll
    clock.now += 101
    log.w.expire(clock.now)     # idle: segment 1 aged, closed, still kept (its newest is 101 s)
    assert log.state().segment == 2
    clock.now += 100
    log.w.expire(clock.now)
    assert log.files() == {2} and log.index() == {} and log.state().since == (8,)
    _fill(log, 1, start=8)
    assert _check_retained_suffix(log, 9) == 8


def test_a_reopened_log_applies_its_limits_at_once(tmp_path, monkeypatch):
    """A publisher restarting on a log that aged while nobody wrote: the segments whose epochs
    are all older than max_age are deleted when the log is opened, not at the first commit."""
    import time

    import epochstream.catalog.history as catalog_history
    import epochstream.log.writer as epochlog

    real = time

    class Clock:  # the writer's and the catalog's time.time(); the rest of time as it is
        now = real.time()

        def time(self):
            return self.now

        def __getattr__(self, name):
            return getattr(real, name)

    clock = Clock()
    monkeypatch.setattr(epochlog, "_time", clock)
    monkeypatch.setattr(catalog_history, "time", clock)
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_age=100.0, max_bytes=None))
    _fill(log, 20)
    assert len(log.state().segments) >= 4
    log.w.close()
    clock.now += 1000
    log.reopen()
    st_ = log.state()
    assert len(st_.segments) == 1 and log.files() == {st_.segment}


def test_an_idle_live_publisher_ages_its_log_out(tmp_path):
    """A real publisher that stops publishing but stays up: its loop applies max_age without
    any commit, so its retained epochs are deleted ~max_age after they completed (before, an
    idle publisher kept them until its next commit, whatever their age), and a durable
    subscription positioned on them expires; the publisher then goes on logging."""
    import time

    from epochstream import History, Publisher, Subscriber
    from epochstream.errors import SubscriptionExpired

    cat = Catalog(tmp_path / "cat")
    retention = Retention(dir=tmp_path / "logs", max_age=1.0, max_bytes=None)
    with Publisher("idle", catalog=cat, retention=retention, heartbeat_interval=0.05) as pub:
        for t in range(10):
            pub.send(t, [{"t": t, "i": i} for i in range(20)])
            pub.advance_to(t + 1)
        assert pub.flush(5)
        with Subscriber("idle", cat, durable="slow", start="earliest") as sub:
            assert sub.wait_ready(5)
            assert sub.position == (0,)
        assert [e.time for e in History("idle", catalog=cat).epochs()] == list(range(10))
        deadline = time.monotonic() + 10
        while History("idle", catalog=cat).records() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert History("idle", catalog=cat).records() == []
        assert History("idle", catalog=cat).since == (10,)
        st_ = cat.history_state("idle", 0)
        assert [p.name for p in Path(st_.dir).glob("*.eslog")] == [f"{st_.segment:010d}.eslog"]
        with pytest.raises(SubscriptionExpired):
            Subscriber("idle", cat, durable="slow")
        pub.send(10, [{"t": 10, "i": 0}])
        pub.advance_to(11)
        assert pub.flush(5)
        assert [(e.time, e.records) for e in History("idle", catalog=cat).epochs()] == \
            [(10, [{"t": 10, "i": 0}])]


def test_retention_expires_durable_behind_since(tmp_path):
    """A durable subscription whose position retention passes is marked expired."""
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_epochs=4, max_bytes=None,
                                            max_age=None))
    log.cat.durable_claim("t", "slow", "holder-1")
    log.cat.durable_ack("t", "slow", "holder-1", [0], [])
    log.cat.durable_claim("t", "fast", "holder-2")
    log.cat.durable_ack("t", "fast", "holder-2", [1000], [])
    _fill(log, 40)
    assert log.state().since[0] > 0
    by_name = {d.name: d for d in log.cat.durables("t")}
    assert by_name["slow"].state == "expired" and by_name["slow"].reason
    assert by_name["fast"].state == "active"


# ---- recovery ----------------------------------------------------------------------------


def test_recovery_truncates_uncommitted_tail(tmp_path, caplog):
    log = Log(tmp_path)
    _fill(log, 3, size=100)
    committed = log.state().committed
    log.send(3, b"open-epoch-record" * 10)
    log.send(3, b"another")
    log.w._file.flush()  # written to the OS, as a killed process leaves it
    path = segment_path(log.dir, log.state().segment)
    assert path.stat().st_size > committed
    log.w.close()  # dropped without a frontier
    stray = segment_path(log.dir, log.state().segment + 3)
    stray.write_bytes(b"garbage")
    caplog.set_level("WARNING", logger="epochstream.history")
    log.sent.pop(3)
    log.reopen()
    assert path.stat().st_size == committed == log.state().committed
    assert not stray.exists()
    assert any("truncating" in r.getMessage() for r in caplog.records)
    assert set(log.index()) == {0, 1, 2}
    assert log.lower == (3,)
    check_index_matches(log)
    # the log goes on: epoch 3 now holds only what is sent after the restart
    log.send(3, b"after")
    log.advance([4])
    assert read_epoch(log.dir, log.index()[3]) == [(wire.encode_time(3), b"after")]
    check_index_matches(log)


def test_recovery_of_a_cut_record(tmp_path):
    """A record cut in the middle (kill -9 during a write) is truncated away too."""
    log = Log(tmp_path)
    _fill(log, 2, size=100)
    committed = log.state().committed
    log.w.close()
    path = segment_path(log.dir, 0)
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00\x00\x00")  # half a record header
    log.reopen()
    assert path.stat().st_size == committed
    _fill(log, 2, size=100, start=2)
    assert set(log.index()) == {0, 1, 2, 3}
    check_index_matches(log)


def test_recovery_refuses_a_segment_shorter_than_the_index(tmp_path):
    log = Log(tmp_path)
    _fill(log, 3, size=100)
    log.w.close()
    path = segment_path(log.dir, 0)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)
    with pytest.raises(HistoryError):
        log.reopen()


def test_read_epoch_detects_a_flipped_bit(tmp_path):
    log = Log(tmp_path)
    _fill(log, 3, size=100)
    r = log.index()[1]
    path = segment_path(log.dir, r.segment)
    data = bytearray(path.read_bytes())
    off = r.extents[0][0] + 20
    data[off] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryCorrupt) as e:
        read_epoch(log.dir, r)
    assert str(path) in str(e.value) or e.value.path == str(path)
    assert read_epoch(log.dir, log.index()[0]) == log.sent[0]  # others still fine


def test_read_epoch_missing_segment(tmp_path):
    log = Log(tmp_path)
    _fill(log, 1, size=10)
    r = log.index()[0]
    segment_path(log.dir, r.segment).unlink()
    with pytest.raises(HistoryCorrupt):
        read_epoch(log.dir, r)


def test_finished_log_continues_with_later_epochs(tmp_path):
    """A writer opened on a finished log (empty lower frontier) keeps the finished epochs and
    appends later ones (the publisher picks the start after the logged upper frontier)."""
    log = Log(tmp_path)
    _fill(log, 3, size=10)
    log.advance([])
    log.w.close()
    files = log.files()
    log.reopen()
    assert log.files() == files
    assert set(log.index()) == {0, 1, 2}
    log.send(3, b"later")
    log.advance([4])
    log.advance([])
    assert set(log.index()) == {0, 1, 2, 3}
    check_index_matches(log)


def test_writer_fails_for_good_after_a_write_error(tmp_path):
    log = Log(tmp_path)
    _fill(log, 1, size=10)
    log.w._file.close()  # every later write raises OSError (ValueError for a closed file)
    with pytest.raises((HistoryWriteError, ValueError)):
        log.send(1, b"x")


# ---- fsync policies ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["frontier", "none", "every"])
def test_fsync_policies(tmp_path, monkeypatch, policy):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    log = Log(tmp_path, retention=Retention(fsync=policy, segment_bytes=4096, **NO_LIMITS))
    n_data = 0
    for e in range(5):
        for i in range(3):
            log.send(e, b"p" * 10)
            n_data += 1
        log.advance([e + 1])
    if policy == "none":
        assert calls == []
    elif policy == "frontier":
        assert len(calls) == 5
    else:
        assert len(calls) == 5 + n_data
    check_index_matches(log)


# ---- Retention validation ----------------------------------------------------------------


def test_retention_defaults():
    r = Retention()
    assert r.fsync == "frontier" and r.segment_bytes == DEFAULT_SEGMENT_BYTES
    assert r.max_epochs is None and r.max_bytes == 1 << 30 and r.max_age == 7 * 24 * 3600.0
    assert r.dir is None
    assert Retention(fsync="none").fsync == "none"
    assert Retention(fsync="every").fsync == "every"
    assert Retention(max_age=0.5, max_bytes=None, max_epochs=1, segment_bytes=4096,
                     dir=Path("/tmp/x")).max_age == 0.5
    assert Retention().replace(max_epochs=3).max_epochs == 3


@pytest.mark.parametrize("kwargs", [
    dict(fsync="bad"), dict(fsync=None), dict(fsync="FRONTIER"),
    dict(max_bytes=0), dict(max_bytes=-1), dict(max_bytes=True), dict(max_bytes=1.5),
    dict(max_bytes=1024.0), dict(max_bytes="1"),
    dict(max_epochs=0), dict(max_epochs=-5), dict(max_epochs=False), dict(max_epochs=2.0),
    dict(max_age=0), dict(max_age=-1.0), dict(max_age=True), dict(max_age=float("nan")),
    dict(max_age=float("inf")), dict(max_age="7d"),
    dict(segment_bytes=4095), dict(segment_bytes=0), dict(segment_bytes=-4096),
    dict(segment_bytes=True), dict(segment_bytes=8192.0), dict(segment_bytes=None),
    dict(dir=123),
])
def test_retention_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        Retention(**kwargs)


def test_retention_replace_validates():
    with pytest.raises(ValueError):
        Retention().replace(fsync="sometimes")


def test_publisher_retention_needs_a_catalog_and_a_retention():
    from epochstream import Publisher

    with pytest.raises(ValueError):
        Publisher("t-nocat", retention=Retention())
    with pytest.raises(TypeError):
        Publisher("t-nocat", retention={"max_epochs": 3})


# ---- segments_to_delete ------------------------------------------------------------------


@st.composite
def segment_lists(draw, min_epochs=0):
    """Segments oldest first (``last_completed`` non-decreasing); ``min_epochs`` for every
    segment but the last (the one being written may be empty)."""
    n = draw(st.integers(0, 8))
    stamps = sorted(draw(st.lists(st.floats(0, 1000, allow_nan=False), min_size=n,
                                  max_size=n)))
    segs = []
    for i in range(n):
        epochs = draw(st.integers(min_epochs if i < n - 1 else 0, 6))
        last = stamps[i] if epochs else None
        segs.append(SegmentStat(i, draw(st.integers(0, 10_000)), epochs, last))
    return segs


retentions = st.builds(
    Retention,
    max_bytes=st.one_of(st.none(), st.integers(1, 40_000)),
    max_age=st.one_of(st.none(), st.floats(0.5, 1000)),
    max_epochs=st.one_of(st.none(), st.integers(1, 30)),
    segment_bytes=st.just(4096))


def _within(segs, r: Retention, now: float) -> bool:
    """The oracle's idea of "within the limits" for what remains (the last segment, being
    written, is exempt from the age limit)."""
    if r.max_bytes is not None and sum(s.nbytes for s in segs) > r.max_bytes:
        return False
    if r.max_epochs is not None and sum(s.epochs for s in segs) > r.max_epochs:
        return False
    if r.max_age is not None and any(s.last_completed is not None
                                     and now - s.last_completed > r.max_age
                                     for s in segs[:-1]):
        return False
    return True


@given(segment_lists(), retentions, st.floats(0, 2000))
def test_segments_to_delete_properties(segs, r, now):
    n = segments_to_delete(segs, r, now)
    assert 0 <= n <= max(0, len(segs) - 1), "never deletes the segment being written"
    rest = segs[n:]
    # within the limits after deleting, or only the segment being written remains
    bytes_ok = r.max_bytes is None or sum(s.nbytes for s in rest) <= r.max_bytes
    epochs_ok = r.max_epochs is None or sum(s.epochs for s in rest) <= r.max_epochs
    assert (bytes_ok and epochs_ok) or len(rest) <= 1
    # nothing deleted that no limit required: the last deleted one was over a limit
    if n:
        before = segs[n - 1:]
        s = segs[n - 1]
        assert ((r.max_bytes is not None and sum(x.nbytes for x in before) > r.max_bytes)
                or (r.max_epochs is not None and sum(x.epochs for x in before) > r.max_epochs)
                or (r.max_age is not None and s.last_completed is not None
                    and now - s.last_completed > r.max_age))
    # pure: same answer again, input untouched
    assert segments_to_delete(list(segs), r, now) == n


@given(segment_lists(), retentions, st.floats(0, 2000))
def test_segments_to_delete_without_age_is_the_smallest_prefix(segs, r, now):
    """Bytes and epochs limits only: exactly the shortest prefix whose removal brings the
    rest within the limits (capped so the last segment stays)."""
    r = r.replace(max_age=None)
    n = segments_to_delete(segs, r, now)
    want = next((k for k in range(len(segs)) if _within(segs[k:], r, now)),
                max(0, len(segs) - 1))
    assert n == min(want, max(0, len(segs) - 1))


@given(segment_lists(min_epochs=1), retentions, st.floats(0, 2000))
def test_segments_to_delete_is_the_smallest_prefix_within_limits(segs, r, now):
    """With every limit (every closed segment holding an epoch; see the repro below for one
    that holds none): after deleting, no retained epoch outside the segment being written is
    older than max_age, the totals are within the limits, and nothing more was deleted than
    needed."""
    n = segments_to_delete(segs, r, now)
    want = next((k for k in range(len(segs)) if _within(segs[k:], r, now)),
                max(0, len(segs) - 1))
    assert n == min(want, max(0, len(segs) - 1))


def test_epochless_segment_blocks_age_retention_repro():
    """Minimal reproduction (pure). Documented: a segment is deleted once its newest epoch is
    older than max_age; the epochs of segment 1 are 900 s old but stay, because segment 0
    holds no epoch (only F records) and deletion stops there."""
    r = Retention(max_age=10.0, max_bytes=None)
    segs = [SegmentStat(0, 5000, 0, None),      # only F records (frontier advances, no data)
            SegmentStat(1, 5000, 3, 100.0),     # epochs completed at t=100
            SegmentStat(2, 10, 0, None)]        # being written
    assert segments_to_delete(segs, r, now=1000.0) == 2


def test_epochless_segment_blocks_age_retention_in_the_log(tmp_path, monkeypatch):
    import epochstream.log.writer as epochlog

    clock = FakeClock()
    monkeypatch.setattr(epochlog, "_time", clock)
    log = Log(tmp_path, retention=Retention(segment_bytes=4096, max_age=100.0, max_bytes=None))
    e = 0
    while log.state().segment == 0:  # idle: frontier records only
        e += 1
        log.advance([e])
    assert log.state().segments[0].epochs == 0
    _fill(log, 10, start=e)           # data epochs in segment 1 and later
    assert len(log.state().segments) >= 3
    clock.now += 1000                 # every epoch is now 1000 s old
    _fill(log, 1, start=e + 10)
    index = log.index()
    current = log.state().segment
    assert [t for t in index if t < e + 10 and index[t].segment != current] == []
