"""Property-testing toolkit for epochstream and for your own timestamps (needs ``hypothesis``:
``pip install 'epochstream[test]'``). See ``docs/testing.md``.

Strategies
    :func:`times`, :func:`antichains`, :func:`orders` and :func:`event_streams` — the last one
    generates valid timely-style publisher event sequences for several partitions plus random
    subscribe points (:class:`EventStream`).

Oracle
    :func:`oracle` — a brute-force model (plain sets, O(n²) minimal elements; it never touches
    :mod:`epochstream.frontier` or :mod:`epochstream.protocol`) of what a subscriber that joined
    each partition at a given event index must deliver: the epochs it delivers whole, those it
    must never deliver, the filter and the final merged frontier (:class:`Expected`).

Checks
    :func:`check_order` — validates a user-defined order object (``le``/``lt``/``minimum`` and an
    optional ``key``) on a list of times; :func:`assert_epoch_atomic` — drives the production
    protocol (:class:`~epochstream.protocol.PublisherProtocol`,
    :class:`~epochstream.protocol.SubscriberProtocol`,
    :class:`~epochstream.protocol.EpochAssembler`) through an event stream, checking against the
    oracle after *every* message the subscriber receives.

Events (one list per partition, in that partition's order):

- ``("progress", [(time, delta), ...])`` — one batch of timely capability-count updates;
- ``("data", time, records)`` — a batch of records (a list) at ``time``;
- ``("close",)`` — the partition releases every capability (``PublisherProtocol.close``).

Every partition starts holding one capability at ``order.minimum`` (count 1).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from hypothesis import strategies as st

from .order import TOTAL, ProductOrder, TotalOrder, product

__all__ = ["OrderViolation", "check_order", "apply_event", "universe", "orders", "times", "antichains",
           "EventStream", "event_streams", "Expected", "oracle", "minimal", "maximal",
           "lower_after", "Replay", "replay", "AtomicityChecker", "assert_epoch_atomic"]


# ------------------------------------------------------------------------------------------
# brute-force helpers (used by the oracle; no frontier.py / protocol.py)
# ------------------------------------------------------------------------------------------
def minimal(order, times: Iterable[Any]) -> frozenset:
    """The minimal elements of ``times`` by brute force (O(n²) ``lt`` calls)."""
    s = list(set(times))
    return frozenset(a for a in s if not any(order.lt(b, a) for b in s))


def maximal(order, times: Iterable[Any]) -> frozenset:
    """The maximal elements of ``times`` by brute force (O(n²) ``lt`` calls)."""
    s = list(set(times))
    return frozenset(a for a in s if not any(order.lt(a, b) for b in s))


def _sorted(order, times) -> list:
    """``times`` in a linear extension (``key`` if present, else repeated minimal elements)."""
    key = getattr(order, "key", None)
    if key is not None:
        return sorted(times, key=key)
    rest = list(times)
    out = []
    while rest:
        m = [t for t in rest if not any(order.lt(u, t) for u in rest)]
        m.sort(key=repr)
        out.extend(m)
        rest = [t for t in rest if t not in m]
    return out


# ------------------------------------------------------------------------------------------
# check_order
# ------------------------------------------------------------------------------------------
class OrderViolation(AssertionError, ValueError):
    """An order object violates a partial-order law (both an ``AssertionError`` and a
    ``ValueError``). ``law`` names the law, ``witness`` the violating times."""

    def __init__(self, law: str, witness: tuple, message: str):
        super().__init__(message)
        self.law = law
        self.witness = witness


def check_order(order, times: Iterable[Any]) -> None:
    """Check that ``order`` is a partial order on ``times`` (plus ``order.minimum``).

    Checks, naming the first violating pair/triple in an :class:`OrderViolation`:

    - ``le`` returns a ``bool``; reflexivity ``le(a, a)``;
    - antisymmetry ``le(a, b) and le(b, a)`` ⇒ ``a == b``;
    - transitivity ``le(a, b) and le(b, c)`` ⇒ ``le(a, c)`` (O(n³) — keep ``times`` under ~40);
    - ``lt(a, b) == (le(a, b) and a != b)``;
    - ``le(minimum, a)`` for every ``a``;
    - if the order has ``key``: ``le(a, b)`` ⇒ ``key(a) <= key(b)`` and ``lt(a, b)`` ⇒
      ``key(a) < key(b)`` (sorting by ``key`` lists times in a linear extension).
    """
    le, lt = order.le, order.lt
    name = getattr(order, "name", repr(order))
    minimum = getattr(order, "minimum", None)
    ts = list(dict.fromkeys(times))
    if minimum is None:
        raise OrderViolation("minimum", (), f"order {name}: has no minimum")
    if minimum not in ts:
        ts.insert(0, minimum)
    for a in ts:
        r = le(a, a)
        if not isinstance(r, bool):
            raise OrderViolation("bool", (a,), f"order {name}: le({a!r}, {a!r}) returned {r!r}, not a bool")
        if not r:
            raise OrderViolation("reflexivity", (a,), f"order {name}: not reflexive: le({a!r}, {a!r}) is False")
        if not le(minimum, a):
            raise OrderViolation("minimum", (minimum, a),
                                 f"order {name}: minimum {minimum!r} is not <= {a!r}")
    rel = {(a, b): le(a, b) for a in ts for b in ts} if _hashable(ts) else None

    def LE(a, b):
        return rel[(a, b)] if rel is not None else le(a, b)

    for a, b in itertools.product(ts, ts):
        ab = LE(a, b)
        if ab and LE(b, a) and a != b:
            raise OrderViolation("antisymmetry", (a, b),
                                 f"order {name}: not antisymmetric: {a!r} <= {b!r} and {b!r} <= {a!r} "
                                 "but they differ")
        strict = lt(a, b)
        if strict != (ab and a != b):
            raise OrderViolation("lt", (a, b),
                                 f"order {name}: lt({a!r}, {b!r}) is {strict!r} but le is {ab!r} "
                                 f"and the times are {'equal' if a == b else 'different'}")
    for a, b in itertools.product(ts, ts):
        if not LE(a, b):
            continue
        for c in ts:
            if LE(b, c) and not LE(a, c):
                raise OrderViolation("transitivity", (a, b, c),
                                     f"order {name}: not transitive: {a!r} <= {b!r} and {b!r} <= "
                                     f"{c!r} but not {a!r} <= {c!r}")
    key = getattr(order, "key", None)
    if key is not None:
        for a, b in itertools.product(ts, ts):
            if LE(a, b) and a != b and not key(a) < key(b):
                raise OrderViolation("key", (a, b),
                                     f"order {name}: key is not a linear extension: {a!r} < {b!r} "
                                     f"but key({a!r}) = {key(a)!r} is not < key({b!r}) = {key(b)!r}")


def _hashable(ts) -> bool:
    try:
        for t in ts:
            hash(t)
        return True
    except TypeError:
        return False


# ------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------
_PRODUCT_BOUND = {1: 5, 2: 3, 3: 2, 4: 2}


def universe(order, size: int | None = None) -> tuple:
    """The finite set of small times the strategies draw from (small, so that epochs collide
    across partitions).

    - :data:`~epochstream.order.TOTAL`: ``0..size-1`` (default 5 values);
    - ``product(n)``: the grid ``{0..b-1}^n`` with ``b = size`` or 5, 3, 2, 2 for n = 1..4 (and 2
      beyond);
    - any other order: its ``universe`` attribute (an iterable of times containing
      ``order.minimum``); otherwise ``TypeError`` — pass ``universe=`` to the strategies.
    """
    u = getattr(order, "universe", None)
    if u is not None:
        u = tuple(u)
        if order.minimum not in u:
            raise ValueError(f"the universe of {order!r} must contain its minimum {order.minimum!r}")
        return u
    if isinstance(order, TotalOrder):
        return tuple(range(size or 5))
    if isinstance(order, ProductOrder):
        b = size or _PRODUCT_BOUND.get(order.width, 2)
        return tuple(itertools.product(range(b), repeat=order.width))
    raise TypeError(f"no default universe for order {order!r}: give it a `universe` attribute "
                    "or pass universe=[...] (a finite list of times including the minimum)")


def _universe(order, u) -> tuple:
    if u is None:
        return universe(order)
    u = tuple(u)
    if order.minimum not in u:
        u = (order.minimum,) + u
    return u


def orders() -> st.SearchStrategy:
    """The shipped orders: ``TOTAL`` and ``product(n)`` for n = 1..4."""
    return st.sampled_from([TOTAL, product(1), product(2), product(3), product(4)])


def times(order, universe: Sequence[Any] | None = None) -> st.SearchStrategy:
    """Times of ``order`` from its small :func:`universe` (or the given one)."""
    return st.sampled_from(_universe(order, universe))


def antichains(order, universe: Sequence[Any] | None = None, *, min_size: int = 0,
               max_size: int | None = None) -> st.SearchStrategy:
    """Antichains (tuples of mutually incomparable times, in a linear extension) of ``order``,
    built as the minimal elements of a random set of times."""
    u = _universe(order, universe)

    def build(ts):
        return tuple(_sorted(order, minimal(order, ts)))

    s = st.lists(st.sampled_from(u), min_size=min_size, max_size=max_size or 8, unique=True).map(build)
    if min_size:
        s = s.filter(lambda a: len(a) >= min_size)
    if max_size is not None:
        s = s.filter(lambda a: len(a) <= max_size)
    return s


@dataclass(frozen=True)
class EventStream:
    """A generated multi-partition publisher run.

    - ``order``; ``events[p]``: partition ``p``'s events (see the module docs);
    - ``interleaving``: the global order of all events as partition ids — the ``k``-th
      occurrence of ``p`` is ``events[p][k]``;
    - ``subscribe_at``: global indices (into ``interleaving``) where subscribers attach;
    - ``joins``: for each subscribe point, the per-partition join indices (``joins[i][p]``: the
      subscriber's snapshot of ``p`` is taken before ``events[p][joins[i][p]]``). Each partition
      snapshots when its hello arrives, so these may differ by a few events from the global
      point (``join_at``).
    """

    order: Any
    events: tuple
    interleaving: tuple
    subscribe_at: tuple
    joins: tuple

    @property
    def partitions(self) -> int:
        return len(self.events)

    def join_at(self, g: int) -> tuple:
        """Per-partition join indices for a subscriber attaching after the first ``g`` events of
        the global interleaving."""
        c = collections.Counter(self.interleaving[:g])
        return tuple(c[p] for p in range(self.partitions))

    def closed(self) -> "EventStream":
        """A copy where every partition that is not closed gets a final ``("close",)``."""
        events = list(self.events)
        inter = list(self.interleaving)
        for p, evs in enumerate(events):
            if not _is_closed(self.order, evs):
                events[p] = tuple(evs) + (("close",),)
                inter.append(p)
        return replace(self, events=tuple(events), interleaving=tuple(inter))

    def records(self) -> dict:
        """``{time: sorted records}`` over every partition."""
        out: dict = collections.defaultdict(list)
        for evs in self.events:
            for e in evs:
                if e[0] == "data":
                    out[e[1]].extend(e[2])
        return {t: sorted(r, key=repr) for t, r in out.items()}


def _is_closed(order, evs) -> bool:
    return not lower_after(order, evs, len(evs))


@st.composite
def _partition_events(draw, order, u, pid, max_events, close):
    le = order.le
    real = collections.Counter({order.minimum: 1})  # capabilities really held
    pins = collections.Counter()  # parents that cover a pending transient negative
    pending: list = []  # (t, parent): (t, -1) already sent, (t, +1) still to come
    events: list = []
    seq = itertools.count()
    n = draw(st.integers(0, max_events))
    for _ in range(n):
        held = [t for t in u if real[t] > 0]
        if not held:
            break  # every capability released: the partition is finished
        if draw(st.integers(0, 2)) < 2:
            allowed = [t for t in u if any(le(c, t) for c in held)]
            t = draw(st.sampled_from(allowed))
            k = draw(st.integers(1, 3))
            events.append(("data", t, [f"p{pid}.{next(seq)}" for _ in range(k)]))
            continue
        batch = []
        if pending and draw(st.booleans()):
            i = draw(st.integers(0, len(pending) - 1))
            t, parent = pending.pop(i)
            batch.append((t, 1))
            pins[parent] -= 1
        for _ in range(draw(st.integers(1, 3))):
            held = [t for t in u if real[t] > 0]
            if not held:
                break
            op = draw(st.sampled_from(["downgrade", "mint", "release", "transient", "zero"]))
            c = draw(st.sampled_from(held))
            free = real[c] > pins[c]
            above = [t for t in u if le(c, t)]
            if op == "mint":
                t = draw(st.sampled_from(above))
                real[t] += 1
                batch.append((t, 1))
            elif op == "downgrade" and free:
                t = draw(st.sampled_from(above))
                real[t] += 1
                real[c] -= 1
                batch.extend([(t, 1), (c, -1)])
            elif op == "release" and free:
                real[c] -= 1
                batch.append((c, -1))
            elif op == "transient":
                strict = [t for t in above if t != c]
                if strict:
                    t = draw(st.sampled_from(strict))
                    pins[c] += 1
                    pending.append((t, c))
                    batch.append((t, -1))
            elif op == "zero":
                batch.append((c, 0))
        if batch:
            events.append(("progress", list(draw(st.permutations(batch)))))
    closing = close if close is not None else draw(st.integers(0, 3)) > 0
    if closing and (any(real.values()) or pending):
        if draw(st.booleans()):
            events.append(("close",))
        else:
            batch = [(t, 1) for t, _ in pending] + [(t, -c) for t, c in real.items() if c]
            events.append(("progress", list(draw(st.permutations(batch)))))
    return tuple(events)


@st.composite
def event_streams(draw, order, partitions=None, *, universe: Sequence[Any] | None = None,
                  max_events: int = 12, subscribers: int = 3, close: bool | None = None):
    """Generate an :class:`EventStream` for ``order``.

    ``partitions``: an int or a strategy of ints (default 1..4); ``universe``: the finite set of
    times to use (default :func:`universe`); ``max_events``: per partition; ``subscribers``: at
    most this many subscribe points; ``close``: ``True`` — every partition ends by releasing all
    capabilities, ``False`` — none does, ``None`` — random per partition (3 in 4 close).

    Per partition (starting with one capability at ``order.minimum``), it draws a sequence of

    - data batches at a time ``t`` with some held capability ``c <= t``;
    - progress batches made of 1–3 operations, the batch's updates shuffled (transient negatives
      *within* a batch): *mint* ``(t, +1)`` for ``t >= c`` held (so counts > 1 occur);
      *downgrade* ``(t, +1), (c, -1)``; *release* ``(c, -1)``; a zero delta ``(c, 0)``; and the
      *transient negative across batches* timely allows when another worker drops a capability
      before the ``+1`` of its minting arrives: ``(t, -1)`` for some ``t > c`` held, with the
      matching ``(t, +1)`` in a later batch, and ``c`` not released meanwhile (so the frontier
      still covers ``t`` and never moves backwards);
    - optionally, at the end, ``("close",)`` or a progress batch releasing everything.

    A capability is never released while data still needs it: data is drawn only at times
    covered by a held capability at that moment. Subscribe points are biased to the start and
    the end (including after every partition closed).
    """
    u = _universe(order, universe)
    if partitions is None:
        partitions = st.integers(1, 4)
    n = draw(partitions) if isinstance(partitions, st.SearchStrategy) else int(partitions)
    events = tuple(draw(_partition_events(order, u, p, max_events, close)) for p in range(n))
    inter = tuple(draw(st.permutations([p for p in range(n) for _ in events[p]])))
    total = len(inter)
    points = draw(st.lists(st.one_of(st.just(0), st.just(total), st.integers(0, total)),
                           min_size=1, max_size=max(1, subscribers)))
    points = tuple(sorted(points))
    stream = EventStream(order, events, inter, points, ())
    joins = []
    for g in points:
        base = stream.join_at(g)
        skew = draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n))
        joins.append(tuple(min(len(events[p]), max(0, base[p] + skew[p])) for p in range(n)))
    return replace(stream, joins=tuple(joins))


# ------------------------------------------------------------------------------------------
# the oracle
# ------------------------------------------------------------------------------------------
def _counts_after(order, evs, j) -> dict:
    counts = collections.Counter({order.minimum: 1})
    for e in evs[:j]:
        if e[0] == "progress":
            for t, d in e[1]:
                counts[t] += d
        elif e[0] == "close":
            counts.clear()
    return {t: c for t, c in counts.items() if c}


def lower_after(order, evs: Sequence, j: int) -> frozenset:
    """Brute force: a partition's lower frontier after its first ``j`` events (minimal times
    with positive accumulated count)."""
    return minimal(order, [t for t, c in _counts_after(order, evs, j).items() if c > 0])


@dataclass(frozen=True)
class Expected:
    """What the oracle says a subscriber that joined at ``joins`` must see.

    - ``filter``: maximal elements of the data times sent (in any partition) before the join;
    - ``lower_at_join``: minimal elements of the union of the partitions' lower frontiers at join;
    - ``final_frontier``: minimal elements of the union of the final lower frontiers;
    - ``delivered``: ``{t: sorted records}`` — epochs that must be delivered whole (latent in
      every partition at join, i.e. ``t <= f`` for no ``f`` in ``filter``, and complete at the
      end: no ``final_frontier`` element ``<= t``); records are the union over partitions;
    - ``incomplete``: ``{t: records}`` — latent at join but not complete at the end (must not
      be released);
    - ``dropped``: times with data that are ``<=`` some ``filter`` element (must never be
      delivered);
    - ``records``: ``{t: sorted records}`` for every time with data.
    """

    order: Any
    joins: tuple
    filter: frozenset
    lower_at_join: frozenset
    final_frontier: frozenset
    delivered: dict
    incomplete: dict
    dropped: frozenset
    records: dict

    def latent(self, t) -> bool:
        """True iff ``t`` was latent at join in every partition (passes the filter)."""
        return not any(self.order.le(t, f) for f in self.filter)


def oracle(order, events: Sequence[Sequence], joins: Sequence[int]) -> Expected:
    """Brute-force model of a subscriber joining partition ``p`` before ``events[p][joins[p]]``.

    Epoch ``t`` must be delivered whole iff ``t`` has data in some partition, no partition sent
    data at any ``u >= t`` before its join point, and the final merged frontier has passed
    ``t``. Uses only ``order.le``/``order.lt`` and plain sets."""
    le = order.le
    if len(joins) != len(events):
        raise ValueError(f"{len(joins)} join points for {len(events)} partitions")
    before: list = []
    records: dict = collections.defaultdict(list)
    lowers, finals = [], []
    for evs, j in zip(events, joins):
        if not 0 <= j <= len(evs):
            raise ValueError(f"join index {j} outside 0..{len(evs)}")
        for i, e in enumerate(evs):
            if e[0] == "data":
                records[e[1]].extend(e[2])
                if i < j:
                    before.append(e[1])
        lowers.extend(lower_after(order, evs, j))
        finals.extend(lower_after(order, evs, len(evs)))
    filt = maximal(order, before)
    final = minimal(order, finals)
    records = {t: sorted(r, key=repr) for t, r in records.items()}
    delivered, incomplete, dropped = {}, {}, set()
    for t, r in records.items():
        if any(le(t, f) for f in filt):
            dropped.add(t)
        elif any(le(f, t) for f in final):
            incomplete[t] = r
        else:
            delivered[t] = r
    return Expected(order, tuple(joins), filt, minimal(order, lowers), final, delivered,
                    incomplete, frozenset(dropped), records)


# ------------------------------------------------------------------------------------------
# driving the production protocol
# ------------------------------------------------------------------------------------------
@dataclass
class Replay:
    """Result of :func:`replay`: ``epochs`` released (in order), the subscriber and the
    per-partition messages it received (``sent[p]``: ``(message, state_index)`` pairs —
    the partition's event count after which the message was produced)."""

    epochs: list
    subscriber: Any
    sent: list
    received: list = field(default_factory=list)


def apply_event(pub, event):
    """Apply one generated event (``("data", t, records)``, ``("progress", updates)`` or
    ``("close",)``) to a :class:`~epochstream.protocol.PublisherProtocol`; return the message it
    produces (or ``None``)."""
    if event[0] == "data":
        return pub.data(event[1], list(event[2]))
    if event[0] == "progress":
        return pub.progress(event[1])
    return pub.close()


def _publish(order, evs, j):
    # Imported here, not at the top: the module's top level (and so the oracle) stays provably
    # independent of the production frontier/protocol code (see test_testing_toolkit).
    from .protocol import PublisherProtocol

    pub = PublisherProtocol(order)
    msgs = []
    snapshot = None
    for i, e in enumerate(evs):
        if i == j:
            snapshot = pub.snapshot()
        m = apply_event(pub, e)
        if m is not None and i >= j:
            msgs.append((m, i + 1))
    if snapshot is None:
        snapshot = pub.snapshot()
    return [(snapshot, j)] + msgs


def replay(order, events: Sequence[Sequence], joins: Sequence[int],
           schedule: Sequence[int] = (), on_receive: Callable | None = None) -> Replay:
    """Run :class:`~epochstream.protocol.PublisherProtocol` per partition over ``events``,
    attach one :class:`~epochstream.protocol.SubscriberProtocol` (snapshot of partition ``p``
    taken before ``events[p][joins[p]]``) and feed it every message after the snapshot, the
    partitions interleaved by ``schedule`` (step ``k`` takes the next message of the
    ``schedule[k] % len(non-empty queues)``-th partition that has one; then round-robin).
    Released epochs are assembled with :class:`~epochstream.protocol.EpochAssembler`.

    ``on_receive(subscriber, partition, message, outputs, released, state)`` is called after
    every message (``state[p]``: partition ``p``'s event count reflected in what the subscriber
    has; ``released``: the epochs this message completed)."""
    from .protocol import DataMessage, EpochAssembler, SubscriberProtocol

    n = len(events)
    queues = [collections.deque(_publish(order, evs, j)) for evs, j in zip(events, joins)]
    sent = [list(q) for q in queues]
    sub = SubscriberProtocol(order, n)
    asm = EpochAssembler(order)
    epochs: list = []
    state = [None] * n
    received = []
    steps = iter(schedule)
    while True:
        live = [p for p in range(n) if queues[p]]
        if not live:
            break
        s = next(steps, None)
        p = live[(s if s is not None else len(received)) % len(live)]
        msg, idx = queues[p].popleft()
        state[p] = idx
        outs = sub.receive(p, msg)
        released = []
        for o in outs:
            if isinstance(o, DataMessage):
                asm.data(o)
            else:
                released.extend(asm.frontier_changed(o))
        epochs.extend(released)
        received.append((p, msg))
        if on_receive is not None:
            on_receive(sub, p, msg, outs, released, tuple(state))
    return Replay(epochs, sub, sent, received)


class AtomicityChecker:
    """Checks one subscriber's outputs against the :func:`oracle`, message by message.

    ``AtomicityChecker(order, events, joins)``; call :meth:`after` after every message the
    subscriber receives (same arguments as :func:`replay`'s ``on_receive``) and :meth:`finish`
    once everything was received. See :func:`assert_epoch_atomic` for what is checked."""

    def __init__(self, order, events, joins):
        self.order = order
        self.events = events
        self.joins = tuple(joins)
        self.expected = oracle(order, events, joins)
        self._lowers = [[lower_after(order, e, i) for i in range(len(e) + 1)] for e in events]
        self.released: dict = {}
        self.messages = 0

    def merged_lower(self, state) -> frozenset:
        """Brute force: minimal elements of the union of partition ``p``'s lower frontier after
        ``state[p]`` events, over all partitions."""
        return minimal(self.order, [t for q, i in enumerate(state) for t in self._lowers[q][i]])

    def after(self, sub, p, msg, outs, new, state) -> None:
        le = self.order.le
        exp = self.expected
        released = self.released
        self.messages += 1
        ctx = f"after partition {p} sent {msg!r} (state {state}, joins {self.joins})"
        if not sub.ready:
            assert outs == [] and sub.lower == (), f"output before every snapshot is in {ctx}: {outs!r}"
            assert not new, f"epochs released before every snapshot is in {ctx}"
            return
        merged = self.merged_lower(state)
        assert set(sub.lower) == set(merged), \
            f"merged lower {sub.lower!r} != {sorted(merged, key=repr)!r} {ctx}"
        want_filter = {f for f in exp.filter if any(le(e, f) for e in merged)}
        assert set(sub.filter) == want_filter, \
            f"filter {sub.filter!r} != {sorted(want_filter, key=repr)!r} {ctx}"
        for ep in new:
            assert ep.time not in released, f"epoch {ep.time!r} released twice {ctx}"
            assert ep.time in exp.delivered, (
                f"epoch {ep.time!r} released but the oracle says it is "
                f"{'dropped (not latent at join)' if ep.time in exp.dropped else 'incomplete'} {ctx}")
            got = sorted(ep.records, key=repr)
            assert got == exp.delivered[ep.time], \
                f"partial epoch {ep.time!r}: got {got!r}, want {exp.delivered[ep.time]!r} {ctx}"
            released[ep.time] = got
        due = {t for t in exp.delivered if not any(le(e, t) for e in merged)}
        assert set(released) == due, (
            f"released {sorted(released, key=repr)!r} but the frontier {sorted(merged, key=repr)!r} "
            f"has passed {sorted(due, key=repr)!r} {ctx}")

    def finish(self, sub) -> "Expected":
        exp = self.expected
        assert sub.ready, "subscriber never became ready"
        assert set(self.released) == set(exp.delivered), (
            f"delivered {sorted(self.released, key=repr)!r}, oracle wants "
            f"{sorted(exp.delivered, key=repr)!r}")
        assert set(sub.lower) == set(exp.final_frontier), \
            f"final merged frontier {sub.lower!r} != {sorted(exp.final_frontier, key=repr)!r}"
        return exp


def assert_epoch_atomic(stream_or_order, events=None, joins=None, schedule: Sequence[int] = ()):
    """Check the production protocol against the :func:`oracle` after every message.

    Call as ``assert_epoch_atomic(stream, joins)`` (an :class:`EventStream`) or
    ``assert_epoch_atomic(order, events, joins)``; ``schedule`` interleaves the partitions at the
    subscriber (see :func:`replay`). After each message the subscriber receives:

    - before every snapshot is in, nothing is passed on and the merged lower frontier is empty
      (timely-dataflow #81/#84);
    - the merged lower frontier equals the minimal elements of the union of the partitions'
      lower frontiers as of the messages received (brute force);
    - the filter holds exactly the snapshot-upper maxima that some merged lower element is
      still ``<=`` (retired no earlier than safe, and as soon as it is);
    - every released epoch is whole (records equal the union over partitions of all data at its
      time) and latent at join; an epoch is released exactly when the merged frontier passes it.

    At the end: released epochs == ``oracle(...).delivered``, final merged frontier ==
    ``final_frontier``. Returns the :class:`Expected`. Raises ``AssertionError``."""
    if isinstance(stream_or_order, EventStream):
        order, evs = stream_or_order.order, stream_or_order.events
        joins = events if joins is None else joins
    else:
        order, evs = stream_or_order, events
    checker = AtomicityChecker(order, evs, joins)
    rep = replay(order, evs, joins, schedule, checker.after)
    return checker.finish(rep.subscriber)
