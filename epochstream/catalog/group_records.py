"""The values of consumer groups as the catalog hands them out: :class:`GroupInfo` (a group),
:class:`Claimed` (a lease a claim took), :class:`ClaimView` (what the first half of a claim
decided elsewhere saw) and :class:`GroupEpoch` (one stored unit of a group).

Frozen values, no I/O: the tables that hold them and every read and write of them are
:mod:`epochstream.catalog.groups`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GroupInfo", "Claimed", "ClaimView", "GroupEpoch"]


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group as stored: definition, ``position`` (a tuple of times or ``None``
    before its first fetch), ``state`` (``"active"``/``"stopped"``) and ``reason``, plus
    ``leased``/``acked``/``dead`` (units ``(time, bucket)`` at or beyond the position in each
    state; bucket ``-1`` is a whole epoch); running totals since the group began:
    ``acked_total``, ``dead_total`` (units settled so), ``redelivered_total`` (deliveries after
    a unit's first), and ``settled_at`` (the catalog's clock at the last ack, nak or
    dead-lettering, seconds since the epoch, ``None`` before the first); ``created_at``
    (``time.time()`` when it was opened)."""

    topic: str
    name: str
    mode: str
    ack_wait: float
    max_deliver: int
    dead_letter: str | None
    position: tuple | None
    state: str
    reason: str | None
    leased: tuple
    acked: tuple
    dead: tuple
    acked_total: int = 0
    dead_total: int = 0
    redelivered_total: int = 0
    settled_at: float | None = None
    created_at: float | None = None


@dataclass(frozen=True)
class Claimed:
    """One lease taken by :meth:`~epochstream.catalog.api.Catalog.group_claim`: ``unit``
    ``(time, bucket)``, fencing ``token``, ``deliveries`` (this one included), ``deadline``
    (seconds since the epoch on the catalog's clock) and the delivery ``history``
    (``[[worker, catalog clock], ...]``)."""

    unit: tuple
    token: int
    deliveries: int
    deadline: float
    history: tuple


@dataclass(frozen=True)
class ClaimView:
    """What :meth:`~epochstream.catalog.api.Catalog.group_claim_read` saw of a group, for a
    claim decided elsewhere (the network catalog's client): ``states`` (``((unit, EpochState),
    ...)``), ``now`` (the catalog's clock at the read, seconds since the epoch), ``stored`` (the
    stored position, a tuple of times or ``None``) and ``fingerprint`` (of states and position:
    :meth:`~epochstream.catalog.api.Catalog.group_claim_apply` applies a decision only if they
    are unchanged)."""

    states: tuple
    now: float
    stored: tuple | None
    fingerprint: str


@dataclass(frozen=True)
class GroupEpoch:
    """One stored unit of a group (a ``group_epochs`` row): ``time``, ``bucket`` (``-1``: the
    whole epoch), ``state`` (``"free"``, ``"leased"``, ``"acked"``, ``"dead"``), ``deliveries``,
    the fencing ``token``, the leasing ``worker`` and its process (``pid``, ``host``, ``alive``:
    judged when read), ``deadline`` (the lease's end) and ``not_before`` (a nak's delay ends),
    both seconds since the epoch on the catalog's clock (``epoch_now()``: the database
    server's on PostgreSQL)."""

    time: Any
    bucket: int
    state: str
    deliveries: int
    token: int
    worker: str | None
    pid: int | None
    host: str | None
    alive: bool
    deadline: float
    not_before: float
