"""Positions in a stream, as pure state machines (no I/O): what a join at a position needs from
history, and the acked position of a durable subscription.

**A position is a frontier, never an offset**: an antichain ``A`` of the topic's order, one value
for all partitions. Resuming at ``A`` delivers exactly the complete epochs ``t`` with
``A.less_equal(t)`` (some element of ``A`` is ``<= t``), each whole. It is inclusive: resuming at
``[5]`` delivers epoch 5 (Materialize's ``AS OF`` is exclusive and its docs once got the resume
position wrong by one timestamp, MaterializeInc/materialize PR #34765; a frontier has no such
trap). The empty frontier ``[]`` is the end of the stream: nothing is at or beyond it.

:class:`HistoryJoin` — a subscriber joins the live stream (Strymon: snapshot, filter ``U`` = the
partitions' upper frontiers) *and* asks history for exactly the epochs the live filter drops:
``wanted(t)`` iff ``A <= t`` and ``t <= u`` for some ``u`` in ``U``. Every epoch at or beyond
``A`` then comes from exactly one source: the live stream drops ``t <= u`` (and, through the
floor ``A``, everything not at or beyond ``A``), history supplies those at or beyond ``A``.

:class:`AckTracker` — the acked position of a durable subscription: the minimal antichain such
that every epoch not at or beyond it was acked (or had no data, or lies before the start).
"""

from __future__ import annotations

from typing import Any, Iterable

from .frontier import Antichain, join

__all__ = ["HistoryJoin", "AckTracker", "resolve_position"]


def resolve_position(order, start) -> tuple | None:
    """``start`` as a position: ``None`` for ``"latest"``, the string ``"earliest"`` unchanged,
    a single time (an int, or a tuple for product orders) as a one-element frontier, a list of
    times as their antichain (a checked tuple of times). Raises ``ValueError`` for another
    string and :class:`~epochstream.errors.ProtocolError` for a time of the wrong shape."""
    if isinstance(start, str):
        if start == "latest":
            return None
        if start == "earliest":
            return "earliest"  # type: ignore[return-value]
        raise ValueError(f"start must be 'latest', 'earliest', a time or a list of times, "
                         f"got {start!r}")
    check = getattr(order, "check", None)
    if isinstance(start, list) or (isinstance(start, tuple) and getattr(order, "width", None)
                                   is None):
        times = [check(t) if check else t for t in start]
    else:
        times = [check(start) if check else start]
    return Antichain(order, times).elements


class HistoryJoin:
    """What a join at ``position`` (a frontier) needs from history, given the join's snapshots
    ``{partition: (lower, upper)}`` (each partition's lower and upper frontier elements).

    - :meth:`wanted` — the predicate above;
    - :meth:`needed_partitions` — partitions whose history is needed: ``p`` is needed iff some
      wanted epoch may hold data of ``p`` — sent before the join (``a <= u_p`` for some
      ``a`` in ``A``, ``u_p`` in ``p``'s upper) or after it (``join(a, l_p) <= u`` for some
      ``l_p`` in ``p``'s lower, ``u`` in ``U``: the live filter drops that data too);
    - :meth:`settled` — true once the merged lower frontier has passed every element of ``U``:
      every wanted epoch is complete, history has nothing more to give this join.

    Costs: ``wanted`` O(|A| + |U|) comparisons; ``needed_partitions`` O(P·|A|·(|U_p| + |L_p|·|U|)).
    """

    def __init__(self, order, position: Iterable[Any], snapshots: dict[int, tuple[tuple, tuple]]):
        self.order = order
        self.position = Antichain(order, position)
        self.snapshots = snapshots
        self.uppers: tuple = tuple({u for _, up in snapshots.values() for u in up})
        self._le = order.le

    def wanted(self, t) -> bool:
        """True iff epoch ``t`` must come from history."""
        if not self.position.less_equal(t):
            return False
        le = self._le
        return any(le(t, u) for u in self.uppers)

    def needed_partitions(self) -> dict[int, tuple]:
        """``{partition: elements of A for which it is needed}`` (only needed partitions)."""
        le = self._le
        out: dict[int, tuple] = {}
        for p, (lower, upper) in self.snapshots.items():
            need = []
            for a in self.position:
                if any(le(a, u) for u in upper) or any(
                        le(j, u) for j in join(self.order, [a], lower) for u in self.uppers):
                    need.append(a)
            if need:
                out[p] = tuple(need)
        return out

    def settled(self, lower: Iterable[Any]) -> bool:
        """True once no element of ``lower`` (the merged lower frontier) is ``<=`` an element
        of ``U``: every wanted epoch is complete."""
        low = Antichain(self.order, lower)
        return not any(low.less_equal(u) for u in self.uppers)


class AckTracker:
    """The acked position of a durable subscription.

    ``AckTracker(order, start)``: ``start`` is where this session began (a frontier). Feed it
    :meth:`handed_out` for every epoch given to the user and :meth:`frontier` with the merged
    lower frontier as epochs are released; :meth:`ack` an epoch's time; :attr:`position` is then
    the minimal antichain of the unacked handed-out epochs and ``join(start, frontier)`` (the
    epochs this session will still deliver); epochs acked out of order beyond it are kept in
    :attr:`acked` (NATS JetStream keeps an ack floor and the acks beyond it the same way), and a
    session resumed with them (``acked=``) skips them (:meth:`skips`). Every epoch not at or beyond it was acked, had no
    data, or lies before ``start``; an unacked epoch keeps the position at or before it, so a
    resume redelivers it whole (at-least-once with the epoch as the unit of idempotence).

    >>> from epochstream.order import TOTAL
    >>> a = AckTracker(TOTAL, [0])
    >>> a.frontier([3]); a.handed_out(0); a.handed_out(2)
    >>> a.ack(2)
    True
    >>> a.position
    (0,)
    >>> a.ack(0), a.position
    (True, (3,))
    """

    def __init__(self, order, start: Iterable[Any], acked: Iterable[Any] = ()):
        self.order = order
        self.start = tuple(start)
        self._frontier: tuple | None = None  # the merged lower frontier, once known
        self._released: dict = {}  # complete, not given to the user yet: not ackable
        self._unacked: dict = {}
        self._acked: dict = dict.fromkeys(acked, True)  # acked out of order, at/beyond position

    def released(self, t) -> None:
        """Epoch ``t`` is complete and about to be given to the user: it holds the position
        back (as an unacked one) but cannot be acked until :meth:`handed_out`."""
        self._released[t] = True

    def handed_out(self, t) -> None:
        """Epoch ``t`` was given to the user (unacked until :meth:`ack`)."""
        self._released.pop(t, None)
        self._unacked[t] = True

    def skip(self, t) -> None:
        """Epoch ``t`` needs no ack from the user (acked in an earlier session, or nothing of
        it is for this subscriber): counted as acked."""
        self._released.pop(t, None)
        self._unacked[t] = True
        self.ack(t)

    def snapshot(self) -> tuple:
        """The tracker's state, for :meth:`restore` (an ack the catalog refused)."""
        return (self._frontier, dict(self._released), dict(self._unacked), dict(self._acked))

    def restore(self, state: tuple) -> None:
        """Go back to ``state`` (from :meth:`snapshot`): nothing of what came after stays."""
        self._frontier, self._released, self._unacked, self._acked = (
            state[0], dict(state[1]), dict(state[2]), dict(state[3]))

    def frontier(self, lower: Iterable[Any]) -> None:
        """The merged lower frontier moved to ``lower`` (elements)."""
        self._frontier = tuple(lower)

    def ack(self, t) -> bool:
        """Acknowledge epoch ``t``; returns False if it is not an unacked handed-out epoch
        (acked already, or never handed out)."""
        if self._unacked.pop(t, None) is None:
            return False
        self._acked[t] = True
        position = Antichain(self.order, self.position)
        self._acked = {a: True for a in self._acked if position.less_equal(a)}
        return True

    def skips(self, t) -> bool:
        """True iff epoch ``t`` was acked in an earlier session (out of order, beyond the
        position it resumed at): it is not handed out again."""
        return t in self._acked

    @property
    def acked(self) -> tuple:
        """Epochs at or beyond :attr:`position` that were acked out of order (bounded by how
        far acks run ahead of the oldest unacked epoch)."""
        return tuple(self._acked)

    @property
    def unacked(self) -> tuple:
        """Handed-out epochs not acked yet."""
        return tuple(self._unacked)

    @property
    def floor(self) -> tuple:
        """``join(start, frontier)`` (``start`` until the frontier is known): the position
        once every handed-out epoch is acked."""
        return self.start if self._frontier is None else join(self.order, self.start,
                                                               self._frontier)

    @property
    def position(self) -> tuple:
        """The acked position (a tuple of times; ``start`` until the frontier is known)."""
        out = Antichain(self.order, self.floor)
        out.extend(self._unacked)
        out.extend(self._released)
        return out.elements
