"""The oracle: a brute-force model of what a subscriber must deliver, independent of the
production code.

It uses only the order's ``le``/``lt`` and plain sets and counters (O(n²) minimal elements); it
never touches :mod:`epochstream.frontier` or :mod:`epochstream.protocol`, so a bug there cannot
hide in a matching bug here (``tests/test_testing_toolkit.py`` checks this). Events are the
toolkit's (see :mod:`epochstream.testing`): ``("progress", [(time, delta), ...])``,
``("data", time, records)``, ``("close",)``; every partition starts holding one capability at
``order.minimum``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["minimal", "maximal", "lower_after", "Expected", "oracle"]


def minimal(order, times: Iterable[Any]) -> frozenset:
    """The minimal elements of ``times`` by brute force (O(n²) ``lt`` calls)."""
    s = list(set(times))
    return frozenset(a for a in s if not any(order.lt(b, a) for b in s))


def maximal(order, times: Iterable[Any]) -> frozenset:
    """The maximal elements of ``times`` by brute force (O(n²) ``lt`` calls)."""
    s = list(set(times))
    return frozenset(a for a in s if not any(order.lt(a, b) for b in s))


def _counts_after(order, evs, j) -> dict:
    """``{time: count}`` of the capabilities partition events ``evs[:j]`` leave held (non-zero
    counts only; a ``close`` releases everything)."""
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
