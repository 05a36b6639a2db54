"""Unit and property tests of the sans-I/O protocol (Strymon pubsub + timely frontiers)."""
import pytest
from hypothesis import given, settings, strategies as st

from epochstream.errors import ProtocolError
from epochstream.order import TOTAL, product
from epochstream.protocol import (DataMessage, EpochAssembler, InitialFrontierSnapshot,
                                  LowerFrontierUpdate, PublisherProtocol, SubscriberProtocol)


def test_publisher_rejects_data_behind_frontier():
    p = PublisherProtocol(TOTAL)
    p.data(0, ["x"])
    p.progress([(3, 1), (0, -1)])
    with pytest.raises(ProtocolError, match="behind the lower frontier"):
        p.data(2, ["y"])
    assert p.upper == (0,) and p.lower == (3,)  # unchanged by the rejected call
    assert p.data(4, ["z"]).time == 4 and p.upper == (4,)


def test_publisher_progress_none_when_frontier_unchanged():
    p = PublisherProtocol(TOTAL)
    assert p.progress([(5, 1)]) is None
    assert p.progress([(0, -1)]) == LowerFrontierUpdate(((0, -1), (5, 1)))
    with pytest.raises(ProtocolError, match="not a \\(time, delta\\) pair"):
        p.progress([5])
    with pytest.raises(ProtocolError, match="wrong shape"):
        p.progress([((1, 2), 1)])


def test_publisher_close_empties_frontier():
    p = PublisherProtocol(product(2))
    p.progress([((1, 0), 2), ((0, 1), 1)])
    upd = p.close()
    assert {t for t, d in upd.updates if d < 0} == {(0, 0)}
    assert p.lower == () and p.closed
    with pytest.raises(ProtocolError):
        p.data((5, 5), [])


def test_subscriber_buffers_until_all_snapshots_and_rejects_out_of_order():
    s = SubscriberProtocol(TOTAL, 2)
    with pytest.raises(ProtocolError, match="before its InitialFrontierSnapshot"):
        s.receive(0, DataMessage(0, []))
    assert s.receive(0, InitialFrontierSnapshot((0,), ())) == []
    assert s.receive(0, LowerFrontierUpdate(((0, -1), (1, 1)))) == []  # buffered, not applied
    assert s.lower == ()
    out = s.receive(1, InitialFrontierSnapshot((0,), ()))
    assert out[0] == LowerFrontierUpdate(((0, 1),))
    assert s.lower == (0,)  # partition 1 still holds 0
    with pytest.raises(ProtocolError, match="second InitialFrontierSnapshot"):
        s.receive(1, InitialFrontierSnapshot((0,), ()))
    with pytest.raises(ProtocolError, match="out of range"):
        s.receive(2, DataMessage(0, []))


def test_filter_retired_only_when_frontier_strictly_passes():
    """Strymon's filter-removal bug (fixed in e3fadf1): retiring on lower == upper lets the tail
    of the in-flight epoch through."""
    pub = PublisherProtocol(TOTAL)
    pub.progress([(5, 1), (0, -1)])
    pub.data(5, ["head"])
    sub = SubscriberProtocol(TOTAL)
    sub.receive(0, pub.snapshot())
    assert sub.filter == (5,)
    assert sub.receive(0, pub.data(5, ["tail"])) == []  # still filtered: lower frontier is 5
    sub.receive(0, pub.progress([(6, 1), (5, -1)]))
    assert sub.filter == ()  # retired once nothing <= 5 can arrive
    assert sub.receive(0, pub.data(6, ["next"])) == [DataMessage(6, ["next"])]


def test_assembler_releases_in_partial_order():
    P = product(2)
    asm = EpochAssembler(P)
    asm.frontier_changed(LowerFrontierUpdate((((0, 0), 1),)))
    for t in [(1, 0), (0, 1), (0, 0)]:
        asm.data(DataMessage(t, [t]))
    assert asm.frontier_changed(LowerFrontierUpdate((((0, 0), -1), ((1, 1), 1)))) != []
    done = asm.frontier_changed(LowerFrontierUpdate((((1, 1), -1),)))
    assert done == []  # everything already released in the previous step
    with pytest.raises(ProtocolError, match="not an element"):
        asm.frontier_changed(LowerFrontierUpdate((((9, 9), -1),)))


# -- property: random publishers, random interleaving, random subscribe points --------------
def _streams(order, draw_time, n_parts, draw):
    """Per-partition event lists of a timely-style input that advances through epochs."""
    events = []
    for _ in range(n_parts):
        evs = []
        cap = order.minimum
        for _ in range(draw(st.integers(0, 8))):
            if draw(st.booleans()):
                t = draw_time(cap)
                evs.append(("data", t, [draw(st.integers(0, 9))]))
            else:
                nxt = draw_time(cap)
                if nxt != cap:
                    evs.append(("progress", [(nxt, 1), (cap, -1)]))
                    cap = nxt
        evs.append(("close",))
        events.append(evs)
    return events


@st.composite
def scenarios(draw):
    order = draw(st.sampled_from([TOTAL, product(2)]))
    n = draw(st.integers(1, 3))
    if order is TOTAL:
        def draw_time(lo):
            return lo + draw(st.integers(0, 2))
    else:
        def draw_time(lo):
            return (lo[0] + draw(st.integers(0, 1)), lo[1] + draw(st.integers(0, 1)))
    streams = _streams(order, draw_time, n, draw)
    # global interleaving of all events, plus the subscriber's per-partition join points
    tags = [p for p, evs in enumerate(streams) for _ in evs]
    order_of_events = draw(st.permutations(tags))
    joins = [draw(st.integers(0, len(evs))) for evs in streams]
    delivery = draw(st.randoms(use_true_random=False))
    return order, streams, order_of_events, joins, delivery


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_epochs_whole_and_latent_epochs_delivered(scenario):
    order, streams, interleaving, joins, rnd = scenario
    n = len(streams)
    pubs = [PublisherProtocol(order) for _ in range(n)]
    queues = [[] for _ in range(n)]  # messages in flight to the subscriber per partition
    pos = [0] * n
    sent_before_join = [set() for _ in range(n)]
    all_data: dict = {}
    for p in interleaving:
        if pos[p] == joins[p]:
            queues[p].append(pubs[p].snapshot())
        ev = streams[p][pos[p]]
        pos[p] += 1
        if ev[0] == "data":
            msg = pubs[p].data(ev[1], ev[2])
            all_data.setdefault(ev[1], []).extend(ev[2])
            if pos[p] <= joins[p]:
                sent_before_join[p].add(ev[1])
            else:
                queues[p].append(msg)
        else:
            msg = pubs[p].progress(ev[1]) if ev[0] == "progress" else pubs[p].close()
            if msg is not None and pos[p] > joins[p]:
                queues[p].append(msg)
    for p in range(n):
        if joins[p] == len(streams[p]):
            queues[p].append(pubs[p].snapshot())
    # deliver: random interleaving across partitions, FIFO within each
    sub = SubscriberProtocol(order, n)
    asm = EpochAssembler(order)
    delivered = {}
    while any(queues):
        p = rnd.choice([i for i in range(n) if queues[i]])
        for out in sub.receive(p, queues[p].pop(0)):
            if isinstance(out, DataMessage):
                asm.data(out)
            else:
                for e in asm.frontier_changed(out):
                    assert e.time not in delivered
                    delivered[e.time] = sorted(e.records)
    assert sub.lower == () and sub.finished and sub.filter == ()
    # every delivered epoch is whole
    for t, recs in delivered.items():
        assert recs == sorted(all_data[t])
    # every epoch latent at the join (no partition had sent data at u >= t) is delivered
    for t in all_data:
        missed = any(order.le(t, u) for p in range(n) for u in sent_before_join[p])
        if not missed:
            assert t in delivered
        elif any(t == u for p in range(n) for u in sent_before_join[p]):
            assert t not in delivered  # never partially: some of it was sent before the join
