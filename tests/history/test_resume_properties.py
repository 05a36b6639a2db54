"""The resume contract of durable subscriptions as a Hypothesis property over real sockets
(in-process, 127.0.0.1): random streams (``TOTAL`` and ``product(2)``, 1-2 partitions, each a
``Publisher(retention=...)``), random advance points, a random first position, and a random
sequence of durable sessions between publishing phases — each reads ``k`` epochs, acks a
random subset (sometimes out of order), then closes or is abandoned without ``close()``.

Asserted against a model of the complete epochs and their record multisets (over every
partition):

- the union of what the sessions deliver is exactly the epochs with data at or beyond the
  first position; every delivered epoch is whole; within a session, in an order consistent
  with the partial order and none twice;
- no epoch acked in an earlier session is delivered again; every unacked one is delivered
  again (a session that reads everything it can gets exactly the not-yet-acked complete
  epochs at or beyond the first position);
- the stored position is exact: every epoch with data not at or beyond it was acked;
- a plain (non-durable) ``Subscriber(start=B)`` at a random ``B`` between phases gets exactly
  the complete epochs at or beyond ``B`` so far.

Heavy per example (sockets, a catalog, several subscribers): ``examples(n)`` with a small
``n``; ``HYPOTHESIS_PROFILE=thorough`` runs five times as many.
"""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from hypothesis_profiles import examples

from epochstream import Catalog, Publisher, Retention, Subscriber
from epochstream.errors import SubscriptionHeld
from epochstream.order import TOTAL, product
from epochstream.testing.model import minimal

P2 = product(2)
GRID = {id(TOTAL): tuple(range(8)), id(P2): tuple(itertools.product(range(3), repeat=2))}
READ_TIMEOUT = 10.0   # seconds without an epoch before a session read fails
QUIET = 0.3           # seconds to wait for an epoch that must not come


def grid(order):
    return GRID[id(order)]


def beyond(order, frontier, t) -> bool:
    return any(order.le(a, t) for a in frontier)


# ---- generation --------------------------------------------------------------------------


@st.composite
def partition_ops(draw, order, pid):
    """One partition's run as ("send", t, records) and ("advance", antichain) ops; data only
    at times at or beyond the current lower frontier; ends open (closed by the test)."""
    g = grid(order)
    lower = [order.minimum]
    ops = []
    seq = itertools.count()
    for _ in range(draw(st.integers(1, 20))):
        up = [t for t in g if beyond(order, lower, t)]
        if not up:
            break
        if draw(st.integers(0, 2)) < 2:
            t = draw(st.sampled_from(up))
            n = draw(st.integers(1, 3))
            ops.append(("send", t, [f"p{pid}.{next(seq)}" + "x" * draw(st.integers(0, 300))
                                    for _ in range(n)]))
        else:
            pick = draw(st.lists(st.sampled_from(up), min_size=1, max_size=3))
            new = sorted(minimal(order, pick), key=repr)
            if new != sorted(lower, key=repr):
                ops.append(("advance", tuple(new)))
                lower = new
    return ops


@st.composite
def scenarios(draw):
    order = draw(st.sampled_from([TOTAL, P2]))
    n = draw(st.integers(1, 2))
    ops = [draw(partition_ops(order, p)) for p in range(n)]
    phases = draw(st.integers(1, 4))
    # each partition's ops split into `phases` consecutive chunks
    chunks = []
    for p in range(n):
        cuts = sorted(draw(st.lists(st.integers(0, len(ops[p])), min_size=phases - 1,
                                    max_size=phases - 1)))
        bounds = [0, *cuts, len(ops[p])]
        chunks.append([ops[p][a:b] for a, b in zip(bounds, bounds[1:])])
    g = grid(order)
    first = tuple(sorted(minimal(order, draw(st.lists(st.sampled_from(g), min_size=1,
                                                        max_size=2))), key=repr))
    segment_bytes = draw(st.sampled_from([4096, 1 << 20]))
    return order, n, chunks, first, segment_bytes


# ---- the model ---------------------------------------------------------------------------


class Model:
    """Records per time over every partition, and each partition's lower frontier."""

    def __init__(self, order, n):
        self.order = order
        self.records: dict = collections.defaultdict(list)
        self.lower = {p: (order.minimum,) for p in range(n)}

    def send(self, p, t, records):
        self.records[t].extend(records)

    def advance(self, p, lower):
        self.lower[p] = tuple(lower)

    def complete(self) -> set:
        """Times with data that no partition's lower frontier is <= (complete everywhere)."""
        return {t for t in self.records
                if not any(beyond(self.order, low, t) for low in self.lower.values())}

    def whole(self, t) -> list:
        return sorted(self.records[t])


def publish(pubs, model, chunk_ops):
    for p, ops in enumerate(chunk_ops):
        pub = pubs[p]
        for op in ops:
            if op[0] == "send":
                pub.send(op[1], op[2])
                model.send(p, op[1], op[2])
            else:
                old, new = model.lower[p], op[1]
                pub.progress([(t, 1) for t in new] + [(t, -1) for t in old])
                model.advance(p, new)
    for pub in pubs:
        assert pub.flush(10)


def check_epoch(order, model, epoch, seen_in_session):
    t = epoch.time
    assert t in model.records, f"epoch {t!r} has no data in the model"
    assert sorted(epoch.records) == model.whole(t), f"epoch {t!r} is not whole"
    assert t not in seen_in_session, f"epoch {t!r} twice in one session"
    # an order consistent with the partial order: nothing handed out before is > t
    assert not any(order.lt(t, u) for u in seen_in_session), (t, seen_in_session)
    seen_in_session.append(t)


def read(sub, order, model, k, seen):
    """Read exactly ``k`` epochs."""
    got = []
    if k == 0:
        return got
    for epoch in sub.epochs(timeout=READ_TIMEOUT):
        check_epoch(order, model, epoch, seen)
        got.append(epoch)
        if len(got) == k:
            break
    assert len(got) == k, f"the stream ended after {len(got)} of {k} epochs"
    return got


def assert_nothing_more(sub):
    """No further epoch arrives (within QUIET seconds)."""
    try:
        for epoch in sub.epochs(timeout=QUIET):
            pytest.fail(f"unexpected epoch {epoch.time!r} ({epoch.records!r})")
    except TimeoutError:
        pass


# ---- the property ------------------------------------------------------------------------


@settings(max_examples=examples(8), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(scenarios(), st.data())
def test_durable_sessions_deliver_every_epoch_beyond_the_position_once_acked(
        tmp_path_factory, scenario, data):
    run_scenario(tmp_path_factory.mktemp("resume"), scenario,
                 lambda strategy, label: data.draw(strategy, label=label), event)


def run_scenario(root, scenario, draw, event=lambda what: None):
    """The property's body; ``draw(strategy, label)`` draws the choices made while it runs,
    ``event`` notes what it covered (``hypothesis.event``)."""
    order, n, chunks, first, segment_bytes = scenario
    run = Run(root, order, n, first, segment_bytes, draw, event)
    try:
        phases = len(chunks[0])
        for phase in range(phases):
            run.publish([chunks[p][phase] for p in range(n)])
            run.plain_reader()
            run.session()
        run.close_publishers()  # every epoch completes
        run.plain_reader(ended=True)
        run.session()
        run.session(drain=True)
        # the union of what the sessions delivered is exactly the epochs with data at or
        # beyond the first position
        assert run.delivered == {t for t in run.model.records if beyond(order, first, t)}
    finally:
        run.cleanup()


class Run:
    """One scenario: the publishers, the model, and the durable sessions so far."""

    topic = "r"
    durable = "d"

    def __init__(self, root, order, n, first, segment_bytes, draw, event):
        self.order, self.first, self.draw, self.event = order, first, draw, event
        self.cat = Catalog(root / "cat")
        retention = Retention(segment_bytes=segment_bytes, max_bytes=None, max_age=None)
        self.model = Model(order, n)
        self.pubs: list = []
        for p in range(n):
            self.pubs.append(Publisher(self.topic, p, order=order, partitions=n, catalog=self.cat,
                                       retention=retention, heartbeat_interval=0.2))
        self.acked: set = set()       # acked in some session: never to be delivered again
        self.delivered: set = set()   # delivered in some session
        self.abandoned: Subscriber | None = None
        self.opened: list = []

    def publish(self, chunk_ops) -> None:
        publish(self.pubs, self.model, chunk_ops)

    def close_publishers(self) -> None:
        for pub in self.pubs:  # a short linger: an abandoned subscriber never reads on
            pub.close(linger=0.5)
        for p in range(len(self.pubs)):
            self.model.advance(p, ())
        for pub in self.pubs:
            assert pub.join(10)

    def plain_reader(self, ended: bool = False) -> None:
        """Sometimes: a non-durable reader at a random position gets exactly the complete
        epochs at or beyond it."""
        order, model = self.order, self.model
        if not self.draw(st.booleans(), "plain reader"):
            return
        b = tuple(sorted(minimal(order, self.draw(st.lists(
            st.sampled_from(grid(order)), min_size=1, max_size=2), "B")), key=repr))
        want = {t for t in model.complete() if beyond(order, b, t)}
        with Subscriber(self.topic, self.cat, start=list(b), timeout=10) as sub:
            seen: list = []
            read(sub, order, model, len(want), seen)
            assert set(seen) == want, (b, seen, want)
            if not ended:
                assert_nothing_more(sub)

    def session(self, drain: bool = False) -> None:
        """A durable session: read k of the due epochs, ack some (maybe out of order), then
        close or abandon (the next session must take over)."""
        order, model, draw, event = self.order, self.model, self.draw, self.event
        due = {t for t in model.complete() if beyond(order, self.first, t)} - self.acked
        kw = dict(durable=self.durable, start=list(self.first), timeout=10)
        if self.abandoned is not None:
            with pytest.raises(SubscriptionHeld):
                Subscriber(self.topic, self.cat, **kw)
            sub = Subscriber(self.topic, self.cat, takeover=True, **kw)
            self.abandoned.close()  # the old holder closing now must not free the new hold
            self.abandoned = None
        else:
            sub = Subscriber(self.topic, self.cat, **kw)
        self.opened.append(sub)
        how = "all" if drain else draw(st.sampled_from(["all", "some", "none"]), "read")
        k = {"all": len(due), "none": 0,
             "some": draw(st.integers(1, len(due) - 1), "k") if len(due) > 1 else len(due)}[how]
        seen: list = []
        acks: list = []
        for epoch in read(sub, order, model, k, seen):
            assert epoch.time not in self.acked, f"epoch {epoch.time!r} acked before, again"
            self.delivered.add(epoch.time)
            if not drain and draw(st.booleans(), "ack at once"):
                sub.ack(epoch)
                acks.append(epoch.time)
        if k == len(due):  # every unacked complete epoch came again, and nothing else
            assert set(seen) == due, (seen, due)
            assert_nothing_more(sub)
        late = [t for t in seen if t not in acks]
        if not drain:
            late = (late[::-1] if draw(st.booleans(), "late acks reversed")
                    else draw(st.permutations(late), "late acks"))
            late = late[:draw(st.integers(0, len(late)), "how many late acks")]
        for t in late:
            sub.ack(t)
            acks.append(t)
        self.acked.update(acks)
        # the acked position is exact: every epoch with data not at or beyond it was acked;
        # the catalog holds it or an earlier one (it is stored at acks: a frontier moving
        # over epochs without data may run ahead of it), exact too
        position = sub.position
        stored = tuple(self.cat.durable(self.topic, self.durable).position)
        assert all(beyond(order, stored, t) for t in position), (stored, position)
        for pos in (position, stored):
            for t in model.records:
                if beyond(order, self.first, t) and not beyond(order, pos, t):
                    assert t in self.acked, (t, pos, self.acked)
        event("durable session: history fill " +
              ("used" if sub.stats["history_epochs"] else "unused"))
        event("durable session reads " +
              ("all" if k == len(due) else "none" if k == 0 else "some") + " of the due epochs")
        if acks != sorted(acks, key=seen.index):
            event("acks out of order")
        if not drain and draw(st.booleans(), "abandon"):
            event("a session abandoned")
            self.abandoned = sub
        else:
            sub.close()

    def cleanup(self) -> None:
        for s in self.opened:
            s.close()
        for pub in self.pubs:
            pub.close(linger=0.5)
