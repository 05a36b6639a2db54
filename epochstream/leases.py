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
  generalised to partial orders). For a total order it is ``"ordered"``.

An epoch is *free* when it is neither acked, nor dead-lettered, nor under a live lease (a lease
is live until its deadline, and while its worker's process runs), and its ``not_before`` (set by
a ``nak(delay)``) has passed. An epoch that was delivered ``max_deliver`` times and is free again
is not leased: :func:`plan` reports it as *exhausted* (the group dead-letters it or stops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .frontier import Antichain

__all__ = ["MODES", "EpochState", "Plan", "plan", "group_position"]

MODES = ("shared", "ordered", "partial")


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
    """What to do now: ``lease`` (times to lease, in order), ``exhausted`` (free times that
    reached ``max_deliver``: dead-letter them or stop the group)."""

    lease: tuple
    exhausted: tuple


def plan(order, mode: str, candidates: Sequence[Any], states: dict, *, now: float,
         max_epochs: int, max_deliver: int) -> Plan:
    """The epochs to lease now among ``candidates`` (complete epochs at or beyond the group's
    position, in a linear extension of ``order``), given ``states`` (``{time: EpochState}``).

    >>> from epochstream.order import TOTAL
    >>> s = {0: EpochState("acked"), 1: EpochState("leased", 1, deadline=9.0)}
    >>> plan(TOTAL, "shared", [0, 1, 2, 3], s, now=5.0, max_epochs=2, max_deliver=5).lease
    (2, 3)
    >>> plan(TOTAL, "ordered", [0, 1, 2, 3], s, now=5.0, max_epochs=2, max_deliver=5).lease
    ()
    >>> plan(TOTAL, "ordered", [0, 1, 2, 3], s, now=10.0, max_epochs=2, max_deliver=5).lease
    (1,)

    Cost: O(n) for ``shared`` and ``ordered``; O(n²) comparisons for ``partial`` (``n``
    candidates)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    lease: list = []
    exhausted: list = []
    le = order.le
    not_done: list = []  # earlier candidates that are not acked (for ordered/partial)
    for t in candidates:
        st = states.get(t)
        if st is not None and st.done():
            continue
        blocked = False
        if mode == "ordered":
            blocked = bool(not_done)
        elif mode == "partial":
            blocked = any(le(u, t) for u in not_done)
        not_done.append(t)
        if blocked or len(lease) >= max_epochs:
            continue
        if st is not None and (st.live_lease(now) or st.not_before > now):
            continue
        if st is not None and st.deliveries >= max_deliver:
            exhausted.append(t)
            continue
        lease.append(t)
    return Plan(tuple(lease), tuple(exhausted))


def group_position(order, candidates: Sequence[Any], states: dict, lower: Sequence[Any]) -> tuple:
    """The group's acked frontier: the minimal antichain of the candidates not acked (nor
    dead-lettered) and ``lower`` (the logs' frontier: epochs at or beyond it are not complete
    yet). Every epoch not at or beyond it is acked, dead-lettered or had no data."""
    out = Antichain(order, lower)
    for t in candidates:
        st = states.get(t)
        if st is None or not st.done():
            out.insert(t)
    return out.elements
