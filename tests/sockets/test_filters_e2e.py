"""Filters at the source (issue 14) over real sockets on 127.0.0.1: publishers per partition, a
catalog in a temporary directory, subscribers with ``keys``/``columns``/``where`` joining at
random points and changing their filter with ``update_filter``.

What is checked, against an oracle of this test's own (``filter_world.py``):

- every epoch a subscriber hands out is exactly the records of that epoch (across partitions)
  that match the filter in force for it — the old filter before the boundary ``update_filter``
  returned, the new one at or beyond it, never a mix — projected; and no epoch whose matching
  set is non-empty is missing (apart from those its join drops: ``t <=`` an upper frontier of
  its snapshots);
- filtering never touches progress: the frontier passes epochs nothing of which matches, and
  every merged frontier a subscriber sees is one the publishers' frontiers make;
- identical filters share one encoding; beyond ``max_filter_classes`` subscribers are served
  unfiltered and still get exactly their records; bad filters are refused clearly, at the one
  subscriber, while the others keep being served; hostile hellos and updates are answered with
  ``X error`` and change nothing else.
"""

from __future__ import annotations

import collections
import itertools
import time

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, event, given, settings, strategies as st
from hypothesis_profiles import examples

from epochstream import Catalog, Publisher, Retention, Subscriber, wire
from epochstream.errors import FilterError, ProtocolError
from epochstream.events import DataMessage, LowerFrontierUpdate
from epochstream.filters import Filter
from epochstream.frontier import apply_changes
from epochstream.order import TOTAL, product

from filter_world import (COLUMNS, KEYS, canon, collect_events, expected_epochs, in_force,
                          merged_states, to_arrow)

P2 = product(2)
HB = 0.2  # publishers' heartbeat interval, seconds
_topics = itertools.count()


def _topic(name: str) -> str:
    return f"{name}{next(_topics)}"


class World:
    """Publishers of one topic (one per partition) in a catalog, and the subscribers made on it;
    ``close()`` ends them all whatever happened."""

    def __init__(self, cat: Catalog, n: int = 1, *, order=TOTAL, codec: str = "msgpack",
                 key="k", **kw):
        self.cat, self.order, self.codec, self.key = cat, order, codec, key
        self.topic = _topic("f")
        self.pubs = [Publisher(self.topic, p, partitions=n, order=order, codec=codec, catalog=cat,
                               key=key, heartbeat_interval=HB, **kw) for p in range(n)]
        self.subs: list[Subscriber] = []
        self.published: dict = collections.defaultdict(list)
        self.lowers = [[tuple(p.lower)] for p in self.pubs]
        self._seq = itertools.count()

    def sub(self, **kw) -> Subscriber:
        kw.setdefault("timeout", 10)
        s = Subscriber(self.topic, self.cat, **kw)
        self.subs.append(s)
        return s

    def records(self, p: int, t, ks: str, v0: int = 0) -> list:
        return [{"k": k, "v": (v0 + j) % 10, "n": None if j % 3 == 0 else j % 4, "p": p,
                 "i": next(self._seq)} for j, k in enumerate(ks)]

    def send(self, p: int, t, recs: list, as_batch: bool = False) -> None:
        self.published[t].extend(recs)
        self.pubs[p].send(t, to_arrow(recs, as_batch) if self.codec == "arrow" else recs)

    def advance(self, p: int, t) -> None:
        self.pubs[p].advance_to(t)
        self.lowers[p].append(tuple(self.pubs[p].lower))

    def flush(self) -> None:
        for p in self.pubs:
            assert p.flush(5)

    def close_pubs(self) -> None:
        for p in self.pubs:
            p.close(linger=2.0)

    def close(self) -> None:
        for s in self.subs:
            s.close()
        for p in self.pubs:
            try:
                p.close(linger=0.5)
            except Exception:  # noqa: BLE001 - a dead loop: already reported by the test
                pass


@pytest.fixture
def cat(tmp_path):
    return Catalog(tmp_path / "cat")


@pytest.fixture
def world(cat):
    made = []

    def make(*a, **kw):
        w = World(cat, *a, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def epochs_of(sub, timeout: float = 10.0) -> dict:
    """``{t: multiset}`` of what ``sub.epochs()`` hands out (each epoch once)."""
    out = {}
    for e in sub.epochs(timeout=timeout):
        assert e.time not in out, f"epoch {e.time} handed out twice"
        out[e.time] = canon(e.records)
    return out


def join_uppers(sub) -> set:
    return {u for s in sub.snapshots.values() for u in s.upper}


# =============================================================================================
# the property: random streams, filters, joins and changes

FILTER_KEYS = st.none() | st.sets(st.sampled_from(KEYS), max_size=3)
FILTER_COLUMNS = st.none() | st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=3,
                                      unique=True)
CONJUNCT = st.one_of(
    st.tuples(st.just("v"), st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
              st.integers(0, 9)),
    st.tuples(st.just("v"), st.just("in"), st.lists(st.integers(0, 9), max_size=4)),
    st.tuples(st.just("k"), st.sampled_from(["==", "!=", ">="]), st.sampled_from(KEYS)),
    st.tuples(st.just("n"), st.sampled_from(["==", "!=", ">"]), st.none() | st.integers(0, 3)),
    st.tuples(st.just("n"), st.just("in"), st.lists(st.none() | st.integers(0, 3), max_size=3)))
FILTERS = st.builds(lambda k, c, w: Filter(k, c, w), FILTER_KEYS, FILTER_COLUMNS,
                    st.lists(CONJUNCT, max_size=2))


class Tracked:
    def __init__(self, sub, f: Filter, mode: str):
        self.sub, self.mode = sub, mode
        self.program = [(None, f)]
        self.uppers = join_uppers(sub)
        self.got: dict = {}  # epochs fetched mid-stream (mode "epochs")

    def fetch(self) -> None:
        res = self.sub.fetch(max_epochs=10_000, no_wait=True)
        for e in res:
            assert e.time not in self.got, f"epoch {e.time} handed out twice"
            self.got[e.time] = canon(e.records)


@settings(max_examples=examples(15), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_random_streams_filters_joins_and_changes(cat, data):
    n = data.draw(st.integers(1, 4), label="partitions")
    product_order = data.draw(st.booleans(), label="product order")
    codec = data.draw(st.sampled_from(["msgpack", "arrow"]), label="codec")
    n_epochs = data.draw(st.integers(2, 5), label="epochs")
    order = P2 if product_order else TOTAL
    w = World(cat, n, order=order, codec=codec)
    tracked: list[Tracked] = []

    def times(e):
        # product order: capabilities {(e, 0), (0, e)}, so frontiers and upper frontiers
        # have two incomparable elements
        return [(e, 0), (e, 2), (1, e), (0, e)] if product_order else [e]

    def advance(p, e):
        if not product_order:
            w.advance(p, e + 1)
            return
        old = {(e, 0), (0, e)}
        w.pubs[p].progress([((e + 1, 0), 1), ((0, e + 1), 1), *((t, -1) for t in old)])
        w.lowers[p].append(tuple(w.pubs[p].lower))

    def act(kind=None):
        kind = kind or data.draw(st.sampled_from(["-", "join", "update", "update", "fetch"]))
        if kind == "join" and len(tracked) < 3:
            f = data.draw(FILTERS, label="filter")
            mode = data.draw(st.sampled_from(["epochs", "events"]), label="mode")
            if data.draw(st.booleans(), label="flush before join"):
                w.flush()
            s = w.sub(keys=f.keys, columns=f.columns, where=f.where or None)
            assert s.wait_ready(10)
            tracked.append(Tracked(s, f, mode))
        elif kind == "update" and tracked:
            tr = data.draw(st.sampled_from(tracked), label="who updates")
            f = data.draw(FILTERS, label="new filter")
            before = tr.sub.record_filter
            try:
                b = tr.sub.update_filter(keys=f.keys, columns=f.columns, where=f.where or None)
            except FilterError as e:  # changes faster than the frontier is handed out: the
                assert "at most" in str(e)  # program's bound (MAX_ENTRIES), nothing changed
                assert tr.sub.record_filter == before
                event("update refused: program full")
                return
            assert isinstance(b, tuple) and b
            tr.program.append((b, f))
        elif kind == "fetch":
            for tr in tracked:
                if tr.mode == "epochs":
                    tr.fetch()

    try:
        act("join")  # one subscriber from the start; the others join at random points
        for e in range(n_epochs):
            sends = [(p, t) for p in range(n) for t in times(e)
                     for _ in range(data.draw(st.integers(0, 3), label="sends"))]
            for p, t in data.draw(st.permutations(sends), label="order of sends"):
                ks = data.draw(st.text(KEYS, min_size=1, max_size=6), label="keys of records")
                w.send(p, t, w.records(p, t, ks, v0=data.draw(st.integers(0, 9))),
                       as_batch=data.draw(st.booleans()))
                act()  # joins and changes happen mid-epoch too
            for p in range(n):
                advance(p, e)
            act()
        w.close_pubs()
        possible = merged_states(order, [ls + [()] for ls in w.lowers])
        for tr in tracked:
            expect = expected_epochs(order, w.published, tr.uppers, tr.program)
            if tr.mode == "epochs":
                got = dict(tr.got)
                for t, c in epochs_of(tr.sub).items():
                    assert t not in got, f"epoch {t} handed out twice"
                    got[t] = c
            else:
                got, states = collect_events(tr.sub, order)
                for s in states:
                    assert s in possible, f"merged frontier {set(s)} is none the publishers make"
            assert got == expect, (tr.program, sorted(tr.uppers), sorted(got), sorted(expect))
            event(f"changes per subscriber: {len(tr.program) - 1}")
            event(f"epochs checked per subscriber: {min(len(expect), 5)}+")
        event(f"subscribers: {len(tracked)}")
    finally:
        w.close()


# =============================================================================================
# filters and boundaries, deterministic cases

def test_update_filter_in_the_middle_of_an_epoch_keeps_it_whole(world):
    """Epoch 1 is in flight when the filter changes: it stays under the old filter entirely
    (including what is sent after the switch, filtered by the union); epochs at or beyond the
    boundary are under the new one."""
    w = world(2)
    s = w.sub(keys={"A"}, columns=["k", "i"])
    assert s.wait_ready(5)
    for p in range(2):
        w.send(p, 0, w.records(p, 0, "ABC"))
        w.advance(p, 1)
    w.send(0, 1, w.records(0, 1, "ABC"))
    w.flush()
    b = s.update_filter(keys={"B"}, where=[("v", ">=", 1)])
    assert b == (2,)
    for p in range(2):
        w.send(p, 1, w.records(p, 1, "ABCAB", v0=1))
        w.advance(p, 2)
        w.send(p, 2, w.records(p, 2, "ABCB"))
        w.send(p, 5, w.records(p, 5, "CCC"))
    w.close_pubs()
    got = epochs_of(s)
    program = [(None, Filter(keys={"A"}, columns=["k", "i"])),
               ((2,), Filter(keys={"B"}, where=[("v", ">=", 1)]))]
    assert got == expected_epochs(TOTAL, w.published, set(), program)
    assert set(got) == {0, 1, 2}


def test_update_filter_product_order(world):
    w = world(2, order=P2)
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    for p in range(2):
        w.send(p, (0, 3), w.records(p, (0, 3), "AB"))
        w.send(p, (1, 1), w.records(p, (1, 1), "AB"))
    w.flush()
    b = s.update_filter(keys={"B"})
    assert sorted(b) == [(0, 4), (1, 2), (2, 0)]
    for p in range(2):
        for t in ((0, 3), (1, 1), (0, 4), (1, 2), (2, 0), (3, 3)):
            w.send(p, t, w.records(p, t, "AB"))
    w.close_pubs()
    program = [(None, Filter(keys={"A"})), (b, Filter(keys={"B"}))]
    got = epochs_of(s)
    assert got == expected_epochs(P2, w.published, set(), program)
    assert {t for t in got if in_force(P2, program, t).keys == ("A",)} == {(0, 3), (1, 1)}


def test_many_changes_in_a_row(world):
    """More changes than a program has entries (16): each is pruned once the frontier handed
    out passed it."""
    w = world(1)
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    program = [(None, Filter(keys={"A"}))]
    ev = s.events(timeout=5)
    got: dict = {}
    frontier: dict = {}

    def take():
        e = next(ev)
        if isinstance(e, DataMessage):
            got.setdefault(e.time, collections.Counter()).update(canon(e.data))
        elif isinstance(e, LowerFrontierUpdate):
            apply_changes(frontier, e.updates)

    for t in range(40):
        w.send(0, t, w.records(0, t, "ABCD"))
        if t % 2:
            w.advance(0, t + 1)
            while list(frontier) != [t + 1]:  # hand out what arrived: the program is pruned
                take()
        f = Filter(keys={KEYS[t % 4]})
        program.append((s.update_filter(keys=f.keys), f))
    w.close_pubs()
    while True:
        try:
            take()
        except StopIteration:
            break
    assert got == expected_epochs(TOTAL, w.published, set(), program)


def test_changing_back_to_everything_and_from_nothing(world):
    w = world(1)
    s = w.sub()  # no filter at first
    assert s.wait_ready(5)
    w.send(0, 0, w.records(0, 0, "ABCD"))
    w.flush()
    b1 = s.update_filter(keys={"C"}, columns=["k"])
    w.send(0, 0, w.records(0, 0, "ABCD"))
    w.advance(0, 1)
    w.send(0, 1, w.records(0, 1, "ABCD"))
    w.flush()
    b2 = s.update_filter()  # everything again
    assert s.record_filter == Filter()
    w.send(0, 2, w.records(0, 2, "ABCD"))
    w.close_pubs()
    program = [(None, Filter()), (b1, Filter(keys={"C"}, columns=["k"])), (b2, Filter())]
    assert (b1, b2) == ((1,), (2,))
    assert epochs_of(s) == expected_epochs(TOTAL, w.published, set(), program)


def test_update_filter_after_starting_unfiltered_product_order(world):
    """A subscriber that started without a filter changes it on a product-order topic whose
    frontier has two elements. Epoch (6, 0) had data before the change, so it is before the
    boundary and must be handed out whole under the old filter (everything)."""
    w = world(1, order=P2)
    s = w.sub()
    assert s.wait_ready(5)
    w.pubs[0].progress([((0, 5), 1), ((5, 0), 1), ((0, 0), -1)])
    ev = s.events(timeout=5)
    while set(s.lower) != {(0, 5), (5, 0)}:
        next(ev)
    w.send(0, (6, 0), w.records(0, (6, 0), "AB"))
    w.flush()
    b = s.update_filter(keys={"B"})
    assert not any(P2.le(x, (6, 0)) for x in b)
    w.pubs[0].progress([((0, 5), -1), ((1, 5), 1)])
    w.flush()
    time.sleep(0.2)
    w.send(0, (6, 0), w.records(0, (6, 0), "AB"))
    w.close_pubs()
    got = {}
    for e in ev:
        if isinstance(e, DataMessage):
            got.setdefault(e.time, collections.Counter()).update(canon(e.data))
    program = [(None, Filter()), (b, Filter(keys={"B"}))]
    assert got == expected_epochs(P2, w.published, set(), program)


def test_update_filter_after_a_partition_finished(world):
    """Partition 0 sent its data for epoch 5 and finished before the change; partition 1 sends
    its part of epoch 5 after it. Epoch 5 had data before the change: it must stay under the
    old filter (or be handed out whole under the new one) — not partition 0's records filtered
    by the old filter and then re-checked by the new one."""
    w = world(2)
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    w.send(0, 5, w.records(0, 5, "AB"))
    w.pubs[0].close()
    ev = s.events(timeout=5)
    deadline = time.monotonic() + 5
    while len(s.sockets) > 1 and time.monotonic() < deadline:  # partition 0 retired
        s._join.pump(0.05)
    b = s.update_filter(keys={"B"})
    w.send(1, 5, w.records(1, 5, "AB"))
    w.close_pubs()
    got = {}
    for e in ev:
        if isinstance(e, DataMessage):
            got.setdefault(e.time, collections.Counter()).update(canon(e.data))
    program = [(None, Filter(keys={"A"})), (b, Filter(keys={"B"}))]
    assert got == expected_epochs(TOTAL, w.published, set(), program)


@pytest.mark.parametrize("unit", ["messages", "epochs"])
def test_filters_with_flow_control(world, unit):
    """Under flow control (credit in messages or epochs) filtered-out messages are not sent and
    spend no credit on either side: no stall, every epoch exact, changes included."""
    w = world(2, coalesce_bytes=0)
    s = w.sub(keys={"A"}, where=[("v", "<", 8)], credit=2 if unit == "messages" else 1,
              credit_unit=unit)
    assert s.wait_ready(5)
    program = [(None, Filter(keys={"A"}, where=[("v", "<", 8)]))]
    got = {}
    for t in range(30):
        for p in range(2):
            for m in range(3):
                w.send(p, t, w.records(p, t, "ABCD", v0=t + m))
            w.advance(p, t + 1)
        if t % 10 == 5:
            got.update(epochs_of_fetch(s))
            f = Filter(keys={"B", "A"} if t < 10 else {"C"}, columns=["k", "v"])
            program.append((s.update_filter(keys=f.keys, columns=f.columns), f))
    w.close_pubs()
    for t, c in epochs_of(s).items():
        assert t not in got
        got[t] = c
    assert got == expected_epochs(TOTAL, w.published, set(), program)


def epochs_of_fetch(sub) -> dict:
    return {e.time: canon(e.records) for e in sub.fetch(max_epochs=1000, expires=0.3)}


@pytest.mark.parametrize("codec", ["msgpack", "arrow"])
def test_history_is_filtered_like_the_live_stream(world, codec):
    """A subscriber joining at a past position reads the (unfiltered) epoch log and gets the
    same epochs under its filter as a live one."""
    w = world(1, codec=codec, retention=Retention())
    live = w.sub(keys={"B"}, columns=["k", "i"], where=[("n", "in", [None, 1])])
    assert live.wait_ready(5)
    for t in range(6):
        w.send(0, t, w.records(0, t, "ABCB"))
        w.advance(0, t + 1)
    w.flush()
    late = w.sub(keys={"B"}, columns=["k", "i"], where=[("n", "in", [None, 1])], start=2)
    assert late.wait_ready(5)
    w.send(0, 6, w.records(0, 6, "BBB"))
    w.close_pubs()
    f = Filter(keys={"B"}, columns=["k", "i"], where=[("n", "in", [None, 1])])
    expect = expected_epochs(TOTAL, w.published, set(), [(None, f)])
    assert epochs_of(live) == expect
    assert epochs_of(late) == {t: c for t, c in expect.items() if t >= 2}


# =============================================================================================
# key functions

def test_key_function_filters_any_record_shape(world):
    w = world(1, key=lambda r: r[0])
    s = w.sub(keys={"A", "C"})
    plain = w.sub()
    bad = w.sub(where=[("v", ">", 1)])  # tuples are not dict records
    for x in (s, plain, bad):
        assert x.wait_ready(5)
    sent = {t: [(k, t, i) for i, k in enumerate("ABCAD")] for t in range(3)}
    for t, recs in sent.items():
        w.pubs[0].send(t, recs)
        w.advance(0, t + 1)
    w.close_pubs()
    got = {e.time: list(e.records) for e in s.epochs(timeout=5)}
    assert got == {t: [r for r in recs if r[0] in "AC"] for t, recs in sent.items()}
    assert {e.time: list(e.records) for e in plain.epochs(timeout=5)} == sent
    with pytest.raises(ProtocolError, match="dict records"):
        list(bad.epochs(timeout=5))


def test_a_key_function_that_raises_never_stops_the_publisher(world):
    """The publisher's key function fails on some record: the subscriber that needs it is
    refused (or the record does not match); the publisher goes on serving everyone else."""
    w = world(1, key=lambda r: r["sym"])
    keyed = w.sub(keys={"A"})
    plain = w.sub()
    assert keyed.wait_ready(5) and plain.wait_ready(5)
    sent = {0: [{"sym": "A"}, {"sym": "B"}], 1: [{"sym": "A"}, {"other": 1}], 2: [{"sym": "A"}]}
    for t, recs in sent.items():
        w.pubs[0].send(t, recs)
        w.advance(0, t + 1)
    w.close_pubs()
    assert {e.time: list(e.records) for e in plain.epochs(timeout=5)} == sent
    try:
        got = {e.time: list(e.records) for e in keyed.epochs(timeout=5)}
    except ProtocolError as e:
        assert "KeyError" in str(e) or "sym" in str(e)
    else:
        assert got == {0: [{"sym": "A"}], 1: [{"sym": "A"}], 2: [{"sym": "A"}]}


def test_key_function_update_filter_never_mixes_keys(world):
    """With a key function the subscriber cannot re-check keys: a change of ``keys`` must either
    be refused (FilterError, nothing changes) or still hand every epoch out whole under one
    filter. Epoch 0 is in flight across the change."""
    w = world(1, key=lambda r: r["k"])
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    w.send(0, 0, w.records(0, 0, "AB"))
    w.flush()
    program = [(None, Filter(keys={"A"}))]
    try:
        b = s.update_filter(keys={"B"})
    except FilterError:
        pass
    else:
        program.append((b, Filter(keys={"B"})))
    w.send(0, 0, w.records(0, 0, "AB"))
    w.advance(0, 1)
    w.send(0, 1, w.records(0, 1, "AB"))
    w.close_pubs()
    got = epochs_of(s)
    assert got == expected_epochs(TOTAL, w.published, set(), program, key=lambda r: r["k"])


# =============================================================================================
# encodings shared, the bound on distinct filters, bytes on the wire, skipping

@pytest.mark.parametrize("codec", ["msgpack", "arrow"])
def test_identical_filters_share_one_encoding(world, codec):
    w = world(1, codec=codec)
    same1 = w.sub(keys={"A", "B"}, where=[("v", ">", 2), ("n", "in", [1, 2])])
    same2 = w.sub(keys=["B", "A", "B"], where=[["v", ">", 2], ("n", "in", (2, 1, 2))])
    other = w.sub(keys={"C"})
    plain = w.sub()
    for x in w.subs:
        assert x.wait_ready(5)
    stats = w.pubs[0].stats
    assert stats["filter_encodings"] == 0
    m = 6
    for t in range(m):
        w.send(0, t, w.records(0, t, "ABCDABCD", v0=t))
        w.flush()  # one message per send (no coalescing)
    assert stats["filter_encodings"] == 2 * m  # two distinct filters, each once per message
    w.close_pubs()
    f = Filter(keys={"A", "B"}, where=[("v", ">", 2), ("n", "in", [1, 2])])
    expect = expected_epochs(TOTAL, w.published, set(), [(None, f)])
    assert epochs_of(same1) == expect == epochs_of(same2)
    assert epochs_of(other) == expected_epochs(TOTAL, w.published, set(),
                                               [(None, Filter(keys={"C"}))])
    assert epochs_of(plain) == expected_epochs(TOTAL, w.published, set(), [(None, Filter())])
    assert same1.stats["bytes"] == same2.stats["bytes"] < plain.stats["bytes"]


def test_beyond_max_filter_classes_subscribers_are_served_unfiltered_and_exact(world):
    w = world(1, max_filter_classes=2)
    fs = [Filter(keys={k}, where=[("v", "<", 5)]) for k in "ABCD"]
    subs = []
    for f in fs:  # one after the other: the first two make the two classes
        subs.append(w.sub(keys=f.keys, where=f.where))
        assert subs[-1].wait_ready(5)
    again = w.sub(keys={"A"}, where=[("v", "<", 5)])  # the first class again: not over the bound
    plain = w.sub()
    assert again.wait_ready(5) and plain.wait_ready(5)
    stats = w.pubs[0].stats
    for t in range(8):
        w.send(0, t, w.records(0, t, "ABCD" * 5, v0=t))
        w.flush()
    assert stats["filter_encodings"] == 2 * 8
    w.close_pubs()
    for x, f in zip(subs, fs):
        assert epochs_of(x) == expected_epochs(TOTAL, w.published, set(), [(None, f)])
    assert epochs_of(again) == expected_epochs(TOTAL, w.published, set(), [(None, fs[0])])
    epochs_of(plain)
    full = plain.stats["bytes"]
    assert subs[0].stats["bytes"] < full / 4 and again.stats["bytes"] < full / 4
    assert subs[2].stats["bytes"] == subs[3].stats["bytes"] == full  # sent everything


def test_a_ten_percent_filter_cuts_the_bytes_on_the_wire(world):
    w = world(1)
    keys = "ABCDEFGHIJ"
    narrow = w.sub(keys={"C"})
    plain = w.sub()
    assert narrow.wait_ready(5) and plain.wait_ready(5)
    for t in range(20):
        w.send(0, t, w.records(0, t, keys * 10))
    w.close_pubs()
    assert epochs_of(narrow) == expected_epochs(TOTAL, w.published, set(),
                                                [(None, Filter(keys={"C"}))])
    assert len(epochs_of(plain)) == 20
    assert narrow.stats["bytes"] * 5 < plain.stats["bytes"], (narrow.stats, plain.stats)


@pytest.mark.parametrize("with_filter", [False, True])
def test_the_publisher_does_not_send_what_the_join_drops(world, with_filter):
    """A subscriber joining in the middle of epoch 1 drops epoch 1: its publisher does not even
    send it the rest of that epoch."""
    w = world(1)
    w.send(0, 0, w.records(0, 0, "AB"))
    w.advance(0, 1)
    w.send(0, 1, w.records(0, 1, "AB"))
    w.flush()
    late = w.sub(**({"keys": {"A", "B"}} if with_filter else {}))
    assert late.wait_ready(5) and join_uppers(late) == {1}
    for _ in range(5):
        w.send(0, 1, w.records(0, 1, "AB"))
    w.advance(0, 2)
    w.send(0, 2, w.records(0, 2, "AB"))
    w.close_pubs()
    got = epochs_of(late)
    assert set(got) == {2}
    assert late.stats["dropped"] == 0 and late.stats["delivered"] == 1


def test_the_frontier_is_the_same_with_and_without_a_filter(world):
    w = world(2, order=P2)
    f = w.sub(keys={"Z"})  # matches nothing
    g = w.sub(keys={"A"}, columns=["v"])
    plain = w.sub()
    for x in w.subs:
        assert x.wait_ready(5)
    for e in range(4):
        for p in range(2):
            w.send(p, (e, p), w.records(p, (e, p), "AB"))
            w.advance(p, (e + 1, 0))
    w.close_pubs()
    fronts = []
    for x in (f, g, plain):
        fronts.append([e.updates for e in x.events(timeout=5)
                       if isinstance(e, LowerFrontierUpdate)])
    assert fronts[0] == fronts[1] == fronts[2] and fronts[0]


def test_a_filter_matching_nothing_completes_epochs_without_hanging(world):
    w = world(2)
    nothing = w.sub(where=[("v", ">", 100)])
    also = w.sub(keys=[])
    for x in w.subs:
        assert x.wait_ready(5)
    for t in range(5):
        for p in range(2):
            w.send(p, t, w.records(p, t, "ABCD"))
            w.advance(p, t + 1)
    w.flush()
    ev = nothing.events(timeout=5)
    seen = []
    while nothing.lower != (5,):  # the frontier passes every epoch while the topic is live
        e = next(ev)
        assert not isinstance(e, DataMessage)
        seen.append(e)
    assert also.fetch(max_epochs=10, expires=0.5).status == "timeout"  # nothing, no hang
    assert also.lower == (5,)
    w.close_pubs()
    assert not any(isinstance(e, DataMessage) for e in ev)
    t0 = time.monotonic()
    assert list(also.epochs(timeout=5)) == []
    assert time.monotonic() - t0 < 4
    assert nothing.stats["bytes"] == 0 and also.stats["bytes"] == 0


# =============================================================================================
# bad filters: refused clearly, at the one subscriber

def test_arrow_filter_naming_an_unknown_column_is_refused_others_served(world):
    w = world(2, codec="arrow")
    bad_where = w.sub(where=[("nope", ">", 1)])
    bad_cols = w.sub(columns=["k", "nope"])
    good = w.sub(keys={"A"}, columns=["v", "k"], where=[("n", "!=", 0)])
    plain = w.sub()
    for x in w.subs:
        assert x.wait_ready(5)
    for t in range(4):
        for p in range(2):
            w.send(p, t, w.records(p, t, "ABCA"), as_batch=bool(t % 2))
            w.advance(p, t + 1)
    w.close_pubs()
    for x in (bad_where, bad_cols):
        with pytest.raises(ProtocolError, match="'nope'"):
            list(x.epochs(timeout=5))
    f = Filter(keys={"A"}, columns=["v", "k"], where=[("n", "!=", 0)])
    got = {}
    for e in good.epochs(timeout=5):
        assert e.records.schema.names == ["v", "k"]
        got[e.time] = canon(e.records)
    assert got == expected_epochs(TOTAL, w.published, set(), [(None, f)])
    assert len(epochs_of(plain)) == 4


@pytest.mark.parametrize("kwargs", [
    {"keys": [1, 2]},                      # ints against a string key column
    {"keys": [None]},
    {"where": [("v", "==", 2**64 - 1)]},   # outside int64
    {"where": [("v", "in", [1, 2**64 - 1])]},
    {"where": [("k", "in", ["A", 1])]},
])
def test_arrow_filters_that_do_not_fit_never_stop_the_publisher(world, kwargs):
    """A filter Arrow cannot evaluate against the data refuses that subscriber (or matches
    nothing): the publisher's loop goes on serving everyone else."""
    w = world(1, codec="arrow")
    odd = w.sub(**kwargs)
    plain = w.sub()
    assert odd.wait_ready(5) and plain.wait_ready(5)
    for t in range(3):
        w.send(0, t, w.records(0, t, "AB"))
        w.advance(0, t + 1)
    w.flush()
    w.close_pubs()
    assert len(epochs_of(plain)) == 3
    try:
        got = epochs_of(odd)
    except ProtocolError as e:
        assert "filter" in str(e)
    else:
        f = Filter(**kwargs)
        assert got == expected_epochs(TOTAL, w.published, set(), [(None, f)])


def test_keys_on_a_topic_without_a_key_are_refused_clearly(world):
    w = world(1, key=None)
    plain = w.sub()
    assert plain.wait_ready(5)
    with pytest.raises(ProtocolError, match="key"):
        s = w.sub(keys={"A"})
        s.wait_ready(5)
    w.send(0, 0, w.records(0, 0, "AB"))
    w.advance(0, 1)
    w.flush()
    # a change to keys= is refused too, and the subscription goes on under its filter
    with pytest.raises((FilterError, ProtocolError), match="key"):
        plain.update_filter(keys={"A"})
    w.send(0, 1, w.records(0, 1, "AB"))
    w.close_pubs()
    assert epochs_of(plain) == expected_epochs(TOTAL, w.published, set(), [(None, Filter())])


def test_malformed_filters_are_refused_at_the_subscriber(world):
    w = world(1)
    for kwargs in ({"where": [("v", "~", 1)]}, {"where": [("v", "==", [1])]}, {"keys": "AB"},
                   {"columns": []}, {"where": 5}):
        with pytest.raises(FilterError):
            Subscriber(w.topic, w.cat, **kwargs)
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    with pytest.raises(FilterError):
        s.update_filter(where=[("v", "like", 1)])
    assert s.record_filter == Filter(keys={"A"})


def test_a_filter_too_big_for_a_hello_is_refused_at_the_subscriber(world):
    """A hello travels in at most 64 KiB (the publisher's MAXMSGSIZE): a filter too big for it
    must be refused with a FilterError up front — not sent, dropped by ZeroMQ, and reported as a
    lost publisher."""
    w = world(1)
    keys = [f"key{i:06d}" for i in range(10_000)]  # about 100 KB
    with pytest.raises(FilterError):
        s = w.sub(keys=keys)
        s.wait_ready(5)
    s = w.sub(keys={"A"})
    assert s.wait_ready(5)
    with pytest.raises(FilterError):
        s.update_filter(keys=keys)
    assert s.record_filter == Filter(keys={"A"})
    w.send(0, 0, w.records(0, 0, "AB"))
    w.close_pubs()
    assert epochs_of(s) == expected_epochs(TOTAL, w.published, set(),
                                           [(None, Filter(keys={"A"}))])


# =============================================================================================
# hostile hellos and updates from a raw DEALER

SENTINEL = [b"!sentinel"]  # an unknown kind: always answered with X error naming it


class Raw:
    """A raw DEALER on a publisher."""

    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, kind: bytes, header) -> None:
        self.sock.send_multipart([kind, msgpack.packb(header, use_bin_type=True)])

    def exchange(self, kind: bytes, header, timeout: float = 3.0):
        """Send one message then the sentinel: the notices the publisher sent in between (X
        error, X filter; snapshots and data skipped), or None if it stopped answering."""
        self.send(kind, header)
        self.sock.send_multipart(SENTINEL)
        notes = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(max(1, int(left * 1000))):
                return None
            msg = wire.decode(self.sock.recv_multipart())
            if isinstance(msg, wire.Notice):
                if msg.code == "error" and "!sentinel" in msg.message:
                    return notes
                notes.append(msg)

    def close(self) -> None:
        self.sock.close(0)


def _hello(topic, **extra):
    return {"topic": topic, "partition": 0, "id": "raw", **extra}


BAD_PROGRAMS = [
    # every field of the wrong type
    None, True, 1, 1.5, "x", b"x", {}, [], {"keys": ["A"]},
    [None], [[None]], [[None, {}, 1]], [[[1], {}]], [[None, None]], [[None, 1]], [[None, "x"]],
    [[None, {"keys": "A"}]], [[None, {"keys": 1}]], [[None, {"keys": {"A": 1}}]],
    [[None, {"keys": [["A"]]}]], [[None, {"keys": [{"A": 1}]}]],
    [[None, {"columns": "k"}]], [[None, {"columns": []}]], [[None, {"columns": [1]}]],
    [[None, {"columns": [None]}]], [[None, {"columns": ["c"] * 65}]],
    [[None, {"where": "v"}]], [[None, {"where": [1]}]], [[None, {"where": [["v", ">"]]}]],
    [[None, {"where": [[1, ">", 1]]}]], [[None, {"where": [["v", 1, 1]]}]],
    [[None, {"where": [["v", ">", [1]]]}]], [[None, {"where": [["v", ">", {"a": 1}]]}]],
    [[None, {"where": [["v", "in", 1]]}]], [[None, {"where": [["v", "in", "ab"]]}]],
    [[None, {"where": [["v", "in", [[1]]]]}]], [[None, {"where": [["v", ">", 1]] * 65}]],
    [[None, {"other": 1}]],
    # an unknown op
    [[None, {"where": [["v", "~=", 1]]}]], [[None, {"where": [["v", "IN", [1]]]}]],
    [[None, {"where": [["v", "", 1]]}]],
    # 17 entries
    [[None, {}]] + [[[i], {}] for i in range(1, 17)],
    # boundary garbage
    [[None, {}], [1, {}]], [[None, {}], ["x", {}]], [[None, {}], [{"a": 1}, {}]],
    [[None, {}], [["x"], {}]], [[None, {}], [[True], {}]], [[None, {}], [[1.5], {}]],
    [[None, {}], [[[1, 2]], {}]], [[None, {}], [[None], {}]], [[None, {}], [list(range(1025)), {}]],
    [[[], {}]],
]


def test_hostile_hellos_and_updates_are_refused_and_change_nothing(world):
    w = world(1)
    topic = w.topic
    watcher = w.sub(keys={"A"}, where=[("v", ">", 0)])
    assert watcher.wait_ready(5)
    stranger = Raw(w.pubs[0].endpoint)
    member = Raw(w.pubs[0].endpoint)
    try:
        # a valid hello registers `member`; a valid update is answered with X filter
        notes = member.exchange(wire.HELLO, _hello(topic, filter=[[None, {"keys": ["A"]}]]))
        assert notes == []
        notes = member.exchange(wire.UPDATE, {"id": 7, "filter": [[None, {"keys": ["B"]}]]})
        assert [(n.code, n.extra.get("id")) for n in notes] == [("filter", 7)]
        for prog in BAD_PROGRAMS:
            for who, kind, header in (
                    (stranger, wire.HELLO, _hello(topic, filter=prog)),
                    (member, wire.UPDATE, {"id": 1, "filter": prog}),
                    (stranger, wire.UPDATE, {"id": 1, "filter": prog})):
                notes = who.exchange(kind, header)
                assert notes is not None, f"publisher stopped answering after {kind} {prog!r:.80}"
                assert [n.code for n in notes] == ["error"], (kind, prog, notes)
        # a well-formed update from a connection the publisher does not know
        notes = stranger.exchange(wire.UPDATE, {"id": 2, "filter": [[None, {"keys": ["A"]}]]})
        assert [n.code for n in notes] == ["error"] and "not a registered" in notes[0].message
        # malformed update headers
        for header in ({}, {"id": 1}, {"filter": [[None, {}]]}, {"id": -1, "filter": [[None, {}]]},
                       {"id": "1", "filter": [[None, {}]]}, {"id": 1, "filter": [[None, {}]] * 17},
                       [1, 2], None):
            notes = member.exchange(wire.UPDATE, header)
            assert notes is not None and [n.code for n in notes] == ["error"], (header, notes)
        # keys on a partition, big but within a hello's 64 KiB: accepted
        many = [i for i in range(20_000)]
        notes = member.exchange(wire.UPDATE, {"id": 3, "filter": [[None, {"keys": many}]]})
        assert [n.code for n in notes] == ["filter"]
        # beyond 64 KiB ZeroMQ drops the connection: no answer, and nothing else changes
        huge = Raw(w.pubs[0].endpoint)
        try:
            assert huge.exchange(wire.HELLO, _hello(topic, filter=[[None, {
                "keys": [f"key{i:06d}" for i in range(10_000)]}]]), timeout=1.0) in (None, [])
        finally:
            huge.close()
        # the member's program is whatever its last accepted update said; the publisher serves
        for t in range(3):
            w.send(0, t, w.records(0, t, "ABCD" * 10, v0=t))
            w.advance(0, t + 1)
        w.close_pubs()
        assert epochs_of(watcher) == expected_epochs(
            TOTAL, w.published, set(), [(None, Filter(keys={"A"}, where=[("v", ">", 0)]))])
        assert w.pubs[0]._loop.error is None
    finally:
        stranger.close()
        member.close()


wire_leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                        st.floats(), st.text(max_size=4), st.binary(max_size=3))
wire_values = st.recursive(
    wire_leaves, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10)
programs_garbage = st.lists(st.one_of(
    wire_values,
    st.tuples(st.none() | wire_values, st.fixed_dictionaries({}, optional={
        "keys": wire_values, "columns": wire_values,
        "where": st.lists(st.tuples(st.sampled_from(["v", "k", "n"]) | wire_values,
                                    st.sampled_from([">", "in", "=="]) | wire_values,
                                    wire_values), max_size=3)}))),
    min_size=1, max_size=4)


@pytest.mark.parametrize("codec", ["msgpack", "arrow"])
@settings(max_examples=examples(5), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(progs=st.lists(programs_garbage, min_size=5, max_size=20))
def test_fuzzed_filter_programs_never_stop_the_publisher(cat, codec, progs):
    """Random programs in hellos and updates, with data sent through those accepted: each is
    answered (with at most an X error for it, and one for a filter the data does not fit) and
    the publisher then still serves a well-formed subscriber."""
    w = World(cat, 1, codec=codec)
    raws = [Raw(w.pubs[0].endpoint) for _ in range(2)]
    try:
        stranger, member = raws
        assert member.exchange(wire.HELLO, _hello(w.topic)) == []
        for i, prog in enumerate(progs):
            for who, kind, header in ((stranger, wire.HELLO, _hello(w.topic, filter=prog)),
                                      (member, wire.UPDATE, {"id": i, "filter": prog})):
                notes = who.exchange(kind, header)
                assert notes is not None, f"publisher stopped answering after {prog!r:.100}"
                assert len([n for n in notes if n.code == "error"]) <= 2
            w.send(0, i, w.records(0, i, "ABC"))  # data goes through the filters it accepted
            w.advance(0, i + 1)
        w.flush()  # the subscriber joins after everything above
        s = w.sub(keys={"B"})
        assert s.wait_ready(5)
        w.send(0, len(progs), w.records(0, len(progs), "ABC"))
        w.close_pubs()
        got = epochs_of(s)
        assert got == {len(progs): canon([r for r in w.published[len(progs)] if r["k"] == "B"])}
        assert w.pubs[0]._loop.error is None
    finally:
        for r in raws:
            r.close()
        w.close()
