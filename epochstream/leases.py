"""Which epochs a consumer group may lease now, as a pure policy (no I/O): the lease rules of
:class:`~epochstream.group.EpochGroup` (docs/consumers.md).

The unit of work is the epoch (RavenDB's concurrent subscriptions hand out batches of
documents; NATS JetStream's pull consumers hand out messages; a group here hands out whole
epochs). A group's state per epoch is an :class:`EpochState`; an epoch without one is fresh.

Modes (``mode=``):

- ``"shared"`` — any free epoch to any worker;
- ``"ordered"`` — an epoch is leased only once every epoch before it in the linear extension of
  the order is acked (one epoch in flight at a time, in order);
- ``"partial"`` — an epoch ``t`` is leased once every epoch ``u < t`` *in the partial order* is
  acked, so incomparable epochs (e.g. ``(day, iteration)`` times of different days) are processed
  in parallel while comparable ones stay serial (RavenDB's "process related items serially",
  generalised to partial orders). For a total order it is ``"ordered"``;
- ``"key_shared"`` — the records of each epoch are split by a key into buckets; the unit of work
  is an epoch's bucket ``(t, b)``, leased once every earlier epoch's unit of the same bucket is
  acked. A bucket therefore belongs to one worker at a time and moves between workers only at
  an epoch boundary, so per-key order holds without a draining window (Pulsar's Key_Shared
  broke ordering while moving keys between consumers: apache/pulsar #6554, PIP-379).

The unit of work is ``(time, bucket)``; every mode but ``key_shared`` uses the bucket
:data:`WHOLE` (the whole epoch).

An epoch is *free* when it is neither acked, nor dead-lettered, nor under a live lease (a lease
is live until its deadline, and while its worker's process runs), and its ``not_before`` (set by
a ``nak(delay)``) has passed. An epoch that was delivered ``max_deliver`` times and is free again
is not leased: :func:`plan` reports it as *exhausted* (the group dead-letters it or stops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .frontier import Antichain

__all__ = ["MODES", "WHOLE", "EpochState", "Plan", "plan", "group_position"]

MODES = ("shared", "ordered", "partial", "key_shared")
WHOLE = -1
"""The bucket of a unit that is a whole epoch (every mode but ``key_shared``)."""


@dataclass(frozen=True)
class EpochState:
    """A group's record of one epoch: ``state`` (``"free"``, ``"leased"``, ``"acked"`` or
    ``"dead"``), ``deliveries`` (times handed out), ``deadline`` (``time.time()`` seconds when
    the lease ends), ``not_before`` (seconds; a nak's delay), ``worker_alive`` (whether the
    leasing worker's process runs)."""

    state: str
    deliveries: int = 0
    deadline: float = 0.0
    not_before: float = 0.0
    worker_alive: bool = True

    def live_lease(self, now: float) -> bool:
        """True iff the epoch is under a lease that still holds at ``now``."""
        return self.state == "leased" and self.deadline >= now and self.worker_alive

    def done(self) -> bool:
        """Acked or dead-lettered: never leased again."""
        return self.state in ("acked", "dead")


@dataclass(frozen=True)
class Plan:
    """What to do now: ``lease`` (units ``(time, bucket)`` to lease, in order), ``exhausted``
    (free units that reached ``max_deliver``: dead-letter them or stop the group)."""

    lease: tuple
    exhausted: tuple


def plan(order, mode: str, candidates: Sequence[Any], states: dict, *, now: float,
         max_epochs: int, max_deliver: int) -> Plan:
    """The units to lease now among ``candidates`` (units ``(time, bucket)`` of complete epochs
    at or beyond the group's position, in a linear extension of ``order`` by time), given
    ``states`` (``{unit: EpochState}``). ``max_epochs`` bounds the units leased.

    >>> from epochstream.order import TOTAL
    >>> u = [(t, WHOLE) for t in range(4)]
    >>> s = {(0, WHOLE): EpochState("acked"), (1, WHOLE): EpochState("leased", 1, deadline=9.0)}
    >>> [t for t, _ in plan(TOTAL, "shared", u, s, now=5.0, max_epochs=2, max_deliver=5).lease]
    [2, 3]
    >>> plan(TOTAL, "ordered", u, s, now=5.0, max_epochs=2, max_deliver=5).lease
    ()
    >>> [t for t, _ in plan(TOTAL, "ordered", u, s, now=10.0, max_epochs=2, max_deliver=5).lease]
    [1]

    Cost: O(n) for ``shared``, ``ordered`` and ``key_shared``; O(n²) comparisons for
    ``partial`` (``n`` candidates)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    lease: list = []
    exhausted: list = []
    le = order.le
    not_done: list = []  # earlier units that are not settled (ordered, partial)
    busy_buckets: set = set()  # buckets with an earlier unit not settled (key_shared)
    for unit in candidates:
        t, b = unit
        st = states.get(unit)
        if st is not None and st.done():
            continue
        if mode == "ordered":
            blocked = bool(not_done)
        elif mode == "partial":
            blocked = any(u != t and le(u, t) for u in not_done)
        elif mode == "key_shared":
            blocked = b in busy_buckets
            busy_buckets.add(b)
        else:
            blocked = False
        not_done.append(t)
        if blocked or len(lease) >= max_epochs:
            continue
        if st is not None and (st.live_lease(now) or st.not_before > now):
            continue
        if st is not None and st.deliveries >= max_deliver:
            exhausted.append(unit)
            continue
        lease.append(unit)
    return Plan(tuple(lease), tuple(exhausted))


def group_position(order, candidates: Sequence[Any], states: dict, lower: Sequence[Any]) -> tuple:
    """The group's acked frontier: the minimal antichain of the times of the candidate units
    not acked (nor dead-lettered) and ``lower`` (the logs' frontier: epochs at or beyond it are
    not complete yet). Every epoch not at or beyond it is settled or had no data."""
    out = Antichain(order, lower)
    for unit in candidates:
        st = states.get(unit)
        if st is None or not st.done():
            out.insert(unit[0])
    return out.elements
