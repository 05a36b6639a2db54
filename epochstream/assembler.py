"""Assembling whole epochs (Strymon "Subscriber Logic": an epoch is complete once the merged
lower frontier passes it), pure: :class:`EpochAssembler` collects the data the
:class:`~epochstream.protocol.SubscriberProtocol` delivers per time and releases complete
:class:`~epochstream.events.Epoch` objects as the merged frontier moves, in an order consistent
with the partial order."""

from __future__ import annotations

from typing import Any, Callable

from .events import DataMessage, Epoch, LowerFrontierUpdate
from .frontier import apply_changes
from .order import linear_extension

__all__ = ["EpochAssembler"]


def _concat(chunks: list) -> list:
    if len(chunks) == 1:
        return list(chunks[0])
    out: list = []
    for c in chunks:
        out.extend(c)
    return out


class EpochAssembler:
    """Collects delivered data per time and releases complete :class:`Epoch` objects.

    Feed it what :meth:`SubscriberProtocol.receive` returns: :meth:`data` for each
    :class:`DataMessage`, :meth:`frontier` for each :class:`LowerFrontierUpdate` (the merged
    frontier's changes). An epoch ``t`` is released once no merged lower-frontier element is
    ``<= t``; epochs released together come in an order consistent with the partial order (the
    order's linear-extension key). Times that saw no data are not released (skipped epochs).

    ``combine(chunks: list) -> records`` builds an epoch's records from its data payloads in
    arrival order; the default concatenates sequences into one list.
    """

    def __init__(self, order, combine: Callable[[list], Any] | None = None):
        self.order = order
        self._combine = combine or _concat
        self._frontier: dict = {}
        self._pending: dict = {}  # time -> [chunks, nbytes, first_seen]
        self._le = order.le

    @property
    def frontier(self) -> tuple:
        """The merged lower frontier as seen through the updates fed so far."""
        return tuple(self._frontier)

    @property
    def pending(self) -> tuple:
        """Times with data not yet complete."""
        return tuple(self._pending)

    def data(self, message: DataMessage, *, nbytes: int = 0, now: float | None = None) -> None:
        """Add a delivered data batch (``nbytes``: its payload size; ``now``: a clock reading)."""
        entry = self._pending.get(message.time)
        if entry is None:
            self._pending[message.time] = [[message.data], nbytes, now]
        else:
            entry[0].append(message.data)
            entry[1] += nbytes

    def frontier_changed(self, update: LowerFrontierUpdate, *, now: float | None = None) -> list[Epoch]:
        """Apply merged frontier changes; return the epochs this completes, in a linear extension
        of the order. Raises :class:`ProtocolError` for a change that removes an element that is
        not in the frontier or adds one twice."""
        apply_changes(self._frontier, update.updates, strict=True)
        return self._release(now)

    def _release(self, now) -> list[Epoch]:
        if not self._pending:
            return []
        le = self._le
        frontier = tuple(self._frontier)
        done = []
        for t in self._pending:
            for f in frontier:
                if le(f, t):
                    break
            else:
                done.append(t)
        if not done:
            return []
        out = []
        for t in linear_extension(self.order, done):
            chunks, nbytes, first = self._pending.pop(t)
            out.append(Epoch(t, self._combine(chunks), len(chunks), nbytes, first, now))
        return out
