"""Hypothesis strategies: small universes of times, orders, antichains, and generated
multi-partition publisher runs (:class:`EventStream`) with random subscribe points.

Events (one list per partition, in that partition's order):

- ``("progress", [(time, delta), ...])`` — one batch of timely capability-count updates;
- ``("data", time, records)`` — a batch of records (a list) at ``time``;
- ``("close",)`` — the partition releases every capability (``PublisherProtocol.close``).

Every partition starts holding one capability at ``order.minimum`` (count 1). Like the oracle,
the strategies never touch :mod:`epochstream.frontier` or :mod:`epochstream.protocol`.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from hypothesis import strategies as st

from ..order import TOTAL, ProductOrder, TotalOrder, product
from .model import lower_after, minimal

__all__ = ["universe", "orders", "times", "antichains", "EventStream", "event_streams"]


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


@dataclass
class _Capabilities:
    """One partition's capabilities while its events are drawn.

    ``real``: how many capabilities are really held, per time; ``pins``: per held time, how many
    pending transient negatives it covers (it is not released meanwhile); ``pending``:
    ``(t, parent)`` pairs whose ``(t, -1)`` was already sent and whose ``(t, +1)`` is still to
    come."""

    order: Any
    u: tuple
    real: collections.Counter
    pins: collections.Counter = field(default_factory=collections.Counter)
    pending: list = field(default_factory=list)

    def held(self) -> list:
        """The times of the universe at which a capability is held, in universe order."""
        return [t for t in self.u if self.real[t] > 0]


@st.composite
def _partition_events(draw, order, u, pid, max_events, close):
    """One partition's events (see :func:`event_streams`); records are ``"p<pid>.<seq>"``."""
    caps = _Capabilities(order, u, collections.Counter({order.minimum: 1}))
    events: list = []
    seq = itertools.count()
    n = draw(st.integers(0, max_events))
    for _ in range(n):
        held = caps.held()
        if not held:
            break  # every capability released: the partition is finished
        if draw(st.integers(0, 2)) < 2:
            events.append(_draw_data(draw, caps, held, pid, seq))
            continue
        batch = _draw_progress(draw, caps)
        if batch:
            events.append(("progress", list(draw(st.permutations(batch)))))
    events.extend(_draw_ending(draw, caps, close))
    return tuple(events)


def _draw_data(draw, caps: _Capabilities, held: list, pid: int, seq) -> tuple:
    """A ``("data", t, records)`` event: 1-3 records at a time ``t`` some held capability
    covers."""
    le = caps.order.le
    allowed = [t for t in caps.u if any(le(c, t) for c in held)]
    t = draw(st.sampled_from(allowed))
    k = draw(st.integers(1, 3))
    return ("data", t, [f"p{pid}.{next(seq)}" for _ in range(k)])


def _draw_progress(draw, caps: _Capabilities) -> list:
    """The updates of one progress batch (unshuffled; maybe empty): perhaps the ``+1`` of a
    pending transient negative, then 1-3 operations on held capabilities."""
    batch: list = []
    if caps.pending and draw(st.booleans()):
        i = draw(st.integers(0, len(caps.pending) - 1))
        t, parent = caps.pending.pop(i)
        batch.append((t, 1))
        caps.pins[parent] -= 1
    for _ in range(draw(st.integers(1, 3))):
        held = caps.held()
        if not held:
            break
        _draw_operation(draw, caps, held, batch)
    return batch


def _draw_operation(draw, caps: _Capabilities, held: list, batch: list) -> None:
    """Draw one operation on a held capability ``c`` and append its updates to ``batch``: mint,
    downgrade, release (the last two only if ``c`` is not pinned), a transient negative above
    ``c``, or a zero delta."""
    real, le = caps.real, caps.order.le
    op = draw(st.sampled_from(["downgrade", "mint", "release", "transient", "zero"]))
    c = draw(st.sampled_from(held))
    free = real[c] > caps.pins[c]
    above = [t for t in caps.u if le(c, t)]
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
            caps.pins[c] += 1
            caps.pending.append((t, c))
            batch.append((t, -1))
    elif op == "zero":
        batch.append((c, 0))


def _draw_ending(draw, caps: _Capabilities, close) -> list:
    """The partition's last event, if it closes (``close``: always, never, or ``None``: 3 in 4)
    and still holds something: ``("close",)`` or a progress batch releasing everything."""
    closing = close if close is not None else draw(st.integers(0, 3)) > 0
    if not (closing and (any(caps.real.values()) or caps.pending)):
        return []
    if draw(st.booleans()):
        return [("close",)]
    batch = [(t, 1) for t, _ in caps.pending] + [(t, -c) for t, c in caps.real.items() if c]
    return [("progress", list(draw(st.permutations(batch))))]


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
