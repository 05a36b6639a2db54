"""Property and stateful tests of the publisher/subscriber protocols against the brute-force
oracle in :mod:`epochstream.testing`, regressions for known historical bugs, and one
transport-level property over real ZeroMQ sockets."""

import hypothesis_profiles  # noqa: F401  (loads the Hypothesis profile)

import collections
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from epochstream.order import TOTAL, product
from epochstream.protocol import (DataMessage, EpochAssembler, LowerFrontierUpdate, PublisherProtocol, SubscriberProtocol)
from epochstream.testing import (AtomicityChecker, apply_event, assert_epoch_atomic,
                                 event_streams, oracle, replay)

from hypothesis_profiles import examples


from user_orders import Divides, LexPair  # noqa: E402


ORDERS = [TOTAL, product(2), product(3), product(4), LexPair(), Divides()]


def _id(o):
    return getattr(o, "name", repr(o))


schedules = st.lists(st.integers(0, 7), max_size=60)


# -- 1. replayed protocol vs oracle, every subscribe point, random interleaving ---------------
@pytest.mark.parametrize("order", ORDERS, ids=_id)
def test_subscriber_matches_oracle(order):
    @given(event_streams(order, partitions=st.integers(1, 8)), schedules)
    def check(stream, schedule):
        for joins in stream.joins:
            assert_epoch_atomic(stream, joins, schedule=schedule)
        # a subscriber exactly at each global point too (no per-partition skew)
        for g in stream.subscribe_at:
            assert_epoch_atomic(stream, stream.join_at(g), schedule=schedule)

    check()


@pytest.mark.parametrize("order", [TOTAL, product(2)], ids=_id)
def test_all_closed_streams_deliver_every_latent_epoch(order):
    """With every partition closed, everything latent at join is delivered and the final merged
    frontier is empty; a subscriber at the very start sees every epoch."""

    @given(event_streams(order, partitions=st.integers(1, 8), close=True), schedules)
    def check(stream, schedule):
        exp = assert_epoch_atomic(stream, (0,) * stream.partitions, schedule=schedule)
        assert exp.final_frontier == frozenset()
        assert exp.delivered == stream.records()
        for joins in stream.joins:
            e = assert_epoch_atomic(stream, joins, schedule=schedule)
            assert not e.incomplete
            assert set(e.delivered) | set(e.dropped) == set(stream.records())

    check()


def test_merged_lower_is_meet_of_publishers():
    """Merged lower frontier == minimal elements of the union of the publishers' own frontiers
    (as the production PublisherProtocol reports them), once everything is received."""

    @given(event_streams(product(2), partitions=st.integers(1, 8)), schedules)
    def check(stream, schedule):
        pubs = [PublisherProtocol(stream.order) for _ in stream.events]
        for pub, evs in zip(pubs, stream.events):
            for e in evs:
                if e[0] == "data":
                    pub.data(e[1], e[2])
                elif e[0] == "progress":
                    pub.progress(e[1])
                else:
                    pub.close()
        rep = replay(stream.order, stream.events, stream.joins[0], schedule)
        union = [t for p in pubs for t in p.lower]
        meet = {t for t in union if not any(product(2).lt(u, t) for u in union)}
        assert set(rep.subscriber.lower) == meet

    check()


# -- 2. stateful: live publishers, subscribers attaching and saying hello at any moment -------
class PubSubMachine(RuleBasedStateMachine):
    """Publishers advance one event at a time; up to three subscribers attach at any moment,
    each partition answering its hello (taking the snapshot) at its own moment; messages reach a
    subscriber per partition in FIFO order, partitions interleaved at random. Checked after every
    delivered message against the oracle; at teardown everything is drained and the delivered
    epochs must equal the oracle's."""

    order = TOTAL

    @initialize(stream=st.deferred(lambda: st.sampled_from([TOTAL, product(2), product(3)]).flatmap(
        lambda o: event_streams(o, partitions=st.integers(1, 6)))))
    def start(self, stream):
        self.stream = stream
        self.order = stream.order
        self.n = stream.partitions
        self.pubs = [PublisherProtocol(self.order) for _ in range(self.n)]
        self.pos = [0] * self.n
        self.subs = []

    # publishers ------------------------------------------------------------------------------
    @rule(p=st.integers(0, 7))
    def publish(self, p):
        p %= self.n
        evs = self.stream.events[p]
        if self.pos[p] >= len(evs):
            return
        e = evs[self.pos[p]]
        pub = self.pubs[p]
        m = apply_event(pub, e)
        self.pos[p] += 1
        if m is not None:
            for s in self.subs:
                if s["queues"][p] is not None:
                    s["queues"][p].append((m, self.pos[p]))

    # subscribers -----------------------------------------------------------------------------
    @precondition(lambda self: len(self.subs) < 3)
    @rule()
    def attach(self):
        self.subs.append({"sub": SubscriberProtocol(self.order, self.n), "asm": EpochAssembler(self.order),
                          "queues": [None] * self.n, "joins": [None] * self.n,
                          "state": [0] * self.n, "checker": None})

    @precondition(lambda self: self.subs)
    @rule(i=st.integers(0, 2), p=st.integers(0, 7))
    def hello(self, i, p):
        s = self.subs[i % len(self.subs)]
        p %= self.n
        if s["queues"][p] is not None:
            return
        s["queues"][p] = collections.deque([(self.pubs[p].snapshot(), self.pos[p])])
        s["joins"][p] = self.pos[p]
        if all(j is not None for j in s["joins"]):
            s["checker"] = AtomicityChecker(self.order, self.stream.events, s["joins"])

    @precondition(lambda self: self.subs)
    @rule(i=st.integers(0, 2), p=st.integers(0, 7))
    def deliver(self, i, p):
        s = self.subs[i % len(self.subs)]
        p %= self.n
        q = s["queues"][p]
        if not q:
            return
        msg, idx = q.popleft()
        s["state"][p] = idx
        outs = s["sub"].receive(p, msg)
        new = []
        for o in outs:
            if isinstance(o, DataMessage):
                s["asm"].data(o)
            else:
                new.extend(s["asm"].frontier_changed(o))
        if s["checker"] is None:
            # some partition has not even answered the hello: nothing may come out (#81/#84)
            assert outs == [] and not s["sub"].ready and s["sub"].lower == ()
        else:
            s["checker"].after(s["sub"], p, msg, outs, new, tuple(s["state"]))

    @invariant()
    def not_ready_without_all_snapshots(self):
        for s in getattr(self, "subs", []):
            if len(s["sub"].snapshots) < self.n:
                assert not s["sub"].ready and s["sub"].lower == () and s["sub"].filter == ()

    def teardown(self):
        if not hasattr(self, "stream"):
            return
        for p in range(self.n):
            while self.pos[p] < len(self.stream.events[p]):
                self.publish(p)
        for i, s in enumerate(self.subs):
            for p in range(self.n):
                self.hello(i, p)
            for p in range(self.n):
                while s["queues"][p]:
                    self.deliver(i, p)
            s["checker"].finish(s["sub"])


PubSubMachine.TestCase.settings = settings(settings.default, stateful_step_count=40)
TestPubSubMachine = PubSubMachine.TestCase


# -- 3. named join moments on a fixed stream ------------------------------------------------
FIXED = (
    # partition 0: epochs 0, 1 (mid-epoch split across batches), closes after epoch 2
    (("data", 0, ["a0"]), ("progress", [(1, 1), (0, -1)]), ("data", 1, ["a1"]),
     ("data", 1, ["a1'"]), ("progress", [(2, 1), (1, -1)]), ("data", 2, ["a2"]), ("close",)),
    # partition 1: data at 1 and 3, closes last
    (("data", 1, ["b1"]), ("progress", [(3, 1), (0, -1)]), ("data", 3, ["b3"]),
     ("progress", [(3, -1)])),
    # partition 2: closes at once
    (("close",),),
)


@pytest.mark.parametrize("joins,delivered", [
    ((0, 0, 0), {0, 1, 2, 3}),        # before the first event
    ((3, 0, 0), {2, 3}),              # mid-epoch 1 in partition 0: epoch 1 dropped whole
    ((2, 1, 0), {2, 3}),              # between epochs in 0, mid-epoch 1 in 1
    ((7, 1, 1), {3}),                 # after partitions 0 and 2 closed
    ((7, 4, 1), set()),               # after every partition closed
], ids=["before-first", "mid-epoch", "between-epochs", "some-closed", "all-closed"])
def test_named_join_moments(joins, delivered):
    @given(schedules)
    def check(schedule):
        exp = assert_epoch_atomic(TOTAL, FIXED, joins, schedule=schedule)
        assert set(exp.delivered) == delivered

    check()


# -- 4. regressions --------------------------------------------------------------------------
def _retire_le(filter_elements, lower, le):
    """Strymon before e3fadf1: retire f once some lower element is >= f (``f <= lower``)."""
    return [f for f in filter_elements if not any(le(f, e) for e in lower)]


@pytest.mark.parametrize("order,t", [(TOTAL, 3), (product(2), (1, 2))], ids=["total", "product2"])
def test_strymon_filter_removal_bug_e3fadf1(order, t):
    """The publisher holds a capability exactly at t and has already sent part of epoch t when
    the subscriber joins: snapshot lower == upper == {t}. Retiring the filter element because
    the lower frontier *reaches* it (``<=``) lets the rest of epoch t through: a partial epoch.
    Ours keeps the filter until no lower element is <= t, so epoch t is dropped whole."""
    pub = PublisherProtocol(order)
    pub.progress([(t, 1), (order.minimum, -1)])
    pub.data(t, ["head"])
    snap = pub.snapshot()
    assert snap.lower == (t,) and snap.upper == (t,)
    # the buggy rule would retire the filter right at subscription:
    assert _retire_le(snap.upper, snap.lower, order.le) == []
    sub, asm = SubscriberProtocol(order, 1), EpochAssembler(order)
    epochs = []
    for m in [snap, pub.data(t, ["tail"]), pub.close()]:
        for o in sub.receive(0, m):
            if isinstance(o, DataMessage):
                asm.data(o)
            else:
                epochs.extend(asm.frontier_changed(o))
    assert epochs == []                     # never the partial epoch [tail]
    assert sub.dropped == 1 and sub.filter == () and sub.finished
    # and the oracle agrees
    events = [[("progress", [(t, 1), (order.minimum, -1)]), ("data", t, ["head"]),
               ("data", t, ["tail"]), ("close",)]]
    assert assert_epoch_atomic(order, events, (2,)).delivered == {}


def test_premature_frontier_advance_when_merging_replayed_streams():
    """timely-dataflow #81/#84: merging several replayed streams, the merged frontier must not
    advance on the first stream's progress while another stream's snapshot is still missing."""
    order = TOTAL
    p0, p1 = PublisherProtocol(order), PublisherProtocol(order)
    p0.progress([(5, 1), (0, -1)])
    s0 = p0.snapshot()
    p1.data(2, ["x"])                       # partition 1 is still at epoch 2 ...
    p1.progress([(2, 1), (0, -1)])
    sub, asm = SubscriberProtocol(order, 2), EpochAssembler(order)
    released = []

    def feed(p, m):
        outs = sub.receive(p, m)
        for o in outs:
            if isinstance(o, DataMessage):
                asm.data(o)
            else:
                released.extend(asm.frontier_changed(o))
        return outs

    assert feed(0, s0) == []
    assert feed(0, p0.close()) == []        # partition 0 finished: still nothing merged
    assert sub.lower == () and not sub.ready and not sub.finished
    s1 = p1.snapshot()                      # ... and joins now
    outs = feed(1, s1)
    assert sub.ready and sub.lower == (2,)
    assert outs == [LowerFrontierUpdate(((2, 1),))]
    feed(1, p1.data(2, ["y"]))
    assert released == []                   # epoch 2 is not complete: partition 1 holds 2
    feed(1, p1.progress([(2, -1)]))
    assert sub.finished and [e.time for e in released] == []  # epoch 2 was active at join: dropped
    assert sub.dropped == 1


def test_buffered_messages_are_not_merged_before_last_snapshot():
    """Same bug, with data: a later-joining partition's epoch must not be announced complete by
    the frontier of partitions whose snapshots arrived first."""
    order = product(2)
    p0, p1 = PublisherProtocol(order), PublisherProtocol(order)
    s0 = p0.snapshot()
    sub, asm = SubscriberProtocol(order, 2), EpochAssembler(order)
    got = []
    for m in [s0, p0.data((0, 0), ["a"]), p0.close()]:
        assert sub.receive(0, m) == []
    for m in [p1.snapshot(), p1.data((0, 0), ["b"]), p1.progress([((1, 0), 1), ((0, 0), -1)])]:
        for o in sub.receive(1, m):
            if isinstance(o, DataMessage):
                asm.data(o)
            else:
                got.extend(asm.frontier_changed(o))
    assert [(e.time, sorted(e.records)) for e in got] == [((0, 0), ["a", "b"])]


# -- 5. transport: real zmq ------------------------------------------------------------------
def _drive(pub, e):
    if e[0] == "data":
        pub.send(e[1], e[2])
    elif e[0] == "progress":
        pub.progress(e[1])
    else:  # keep the publisher alive (a closed one cannot answer a late hello): release all
        counts = pub.capabilities
        if counts:
            pub.progress([(t, -c) for t, c in counts.items()])


@pytest.mark.parametrize("sub_wire", [1, 2])
@settings(max_examples=examples(8), deadline=None)
@given(st.sampled_from([TOTAL, product(2)]).flatmap(
    lambda o: event_streams(o, partitions=st.integers(1, 3), max_events=8, close=True)),
    st.data())
def test_transport_delivers_oracle_epochs(sub_wire, stream, data):
    """The differential test, against both data-message versions: the subscriber offers
    ``sub_wire``'s versions, each partition's publisher serves up to a drawn version (so
    partitions of one join may speak different versions)."""
    from epochstream.transport import Publisher, Subscriber

    g = data.draw(st.integers(0, len(stream.interleaving)), label="attach after global event")
    n = stream.partitions
    pub_wire = data.draw(st.lists(st.sampled_from([1, 2]), min_size=n, max_size=n),
                         label="each publisher's wire_version")
    topic = f"prop-{threading.get_ident()}-{id(stream)}"
    # strict=False: the generated streams carry timely's transient negative counts across
    # progress batches, which a strict (single-upstream) publisher would refuse.
    pubs = [Publisher(topic, i, partitions=n, order=stream.order, heartbeat_interval=0.2,
                      strict=False, wire_version=pub_wire[i]) for i in range(n)]
    sub = None
    try:
        seen = [0] * n
        for k, p in enumerate(stream.interleaving):
            if k == g:
                for pub in pubs:
                    pub.flush()
                sub = Subscriber(topic, endpoints=[pb.endpoint for pb in pubs], order=stream.order,
                                 timeout=5.0, wire_version=sub_wire)
                assert sub.wait_ready(5.0)
            _drive(pubs[p], stream.events[p][seen[p]])
            seen[p] += 1
        for pub in pubs:
            pub.flush()
        if sub is None:
            sub = Subscriber(topic, endpoints=[pb.endpoint for pb in pubs], order=stream.order,
                             timeout=5.0, wire_version=sub_wire)
            assert sub.wait_ready(5.0)
        for pub in pubs:
            pub.close(linger=1.0)
        epochs = list(sub.epochs(timeout=5.0))
        exp = oracle(stream.order, stream.events, stream.join_at(g))
        got = {e.time: sorted(e.records) for e in epochs}
        assert got == exp.delivered
        assert len(epochs) == len(got)
        # released in an order consistent with the partial order
        for i, a in enumerate(epochs):
            for b in epochs[i + 1:]:
                assert not stream.order.lt(b.time, a.time)
    finally:
        if sub is not None:
            sub.close()
        for pub in pubs:
            pub.close(linger=0.1)
