"""Inbound quota of a publisher: how much one connection may send while the publisher's loop
is behind, and what happens to a connection that floods. Pure: no sockets, no clock
(docs/reliability.md, "Flooding clients").

Why a backlog quota and not a rate: the publisher's ROUTER has no receive high-water mark
(libzmq would otherwise stop reading a flooding connection, the state in which libzmq 4.3.5
aborts the process: :mod:`~epochstream.transport.sockets`), so what a connection sends faster
than the loop reads waits in memory. The loop reads at most :data:`PASS_MESSAGES` messages a
pass; a pass that ends with nothing left waiting means the loop kept up and nothing piles up,
whoever sent what. Only while it is **behind** (every pass reads a full batch) does a
connection's input pile up; then each connection is charged for the messages the loop read from
it, and one charged :data:`DEFAULT_BURST` messages before the loop caught up is **refused**: its
further messages are discarded unread, it gets an ``X error`` notice (``reason: "quota"``) and,
``cut_after`` seconds later, its TCP connection is cut. A ROUTER reads its connections fairly
(round-robin), so a flood is charged to the flooder, not to the subscribers beside it; a
subscriber sends a handful of messages per second (hello, pings, credit grants once per
``credit / 2`` data messages, filter updates, history reads at most
:data:`~epochstream.transport.log_server.MAX_PENDING` ahead of their answers) and never comes
near the quota. The idea is Kafka's per-client request quota, measured against the broker's
backlog instead of wall-clock time (a ZeroMQ peer cannot be throttled, only refused).

Memory is bounded: charges are cleared each time the loop catches up, at most
:data:`MAX_REFUSED` refused connections are remembered (ROUTER routing ids are never reused),
and a pending cut is dropped with its connection.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["Quota", "DEFAULT_BURST", "PASS_MESSAGES", "MAX_REFUSED", "CUT_AFTER_S"]

#: messages one connection may have read from it while the loop is behind
DEFAULT_BURST = 10_000
#: messages the loop reads per pass before it serves the stream again
PASS_MESSAGES = 256
#: refused connections remembered (the oldest is forgotten first)
MAX_REFUSED = 4096
#: seconds between refusing a connection and cutting it (its notice goes out first)
CUT_AFTER_S = 0.05


class Quota:
    """``Quota(burst)``: ``burst`` messages per connection while the loop is behind (>= 1;
    ``ValueError`` otherwise). Connections are the ROUTER's routing ids (``bytes``); times are
    seconds (monotonic), handed in by the caller."""

    def __init__(self, burst: int = DEFAULT_BURST, *, cut_after: float = CUT_AFTER_S,
                 max_refused: int = MAX_REFUSED):
        if type(burst) is not int or burst < 1:
            raise ValueError(f"a quota's burst must be an int >= 1, not {burst!r}")
        self.burst, self.cut_after = burst, float(cut_after)
        self._charged: dict[bytes, int] = {}  # ident -> messages read while behind
        #: refused connections, oldest first (ident -> True)
        self.refused: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._cuts: collections.deque = collections.deque()  # (due, ident, context), by due
        self._max_refused = int(max_refused)
        self.refusals = 0  # connections refused so far
        self.discarded = 0  # messages discarded from refused connections

    def admits(self, ident: bytes) -> bool:
        """False for a refused connection (drop its message unanswered; it is counted)."""
        if ident in self.refused:
            self.discarded += 1
            return False
        return True

    def charge(self, read: dict[bytes, int], caught_up: bool) -> list[bytes]:
        """One pass of the loop read ``read[ident]`` messages from each connection;
        ``caught_up``: nothing was left waiting at its end. Returns the connections now over
        their quota, to :meth:`refuse` (each once)."""
        charged = self._charged
        if caught_up:
            charged.clear()
            return []
        over = []
        burst = self.burst
        for ident, n in read.items():
            total = charged.get(ident, 0) + n
            if total >= burst:
                over.append(ident)
                charged.pop(ident, None)
            else:
                charged[ident] = total
        return over

    def refuse(self, ident: bytes, now: float, context: Any = None) -> None:
        """Refuse ``ident`` from ``now`` on; its cut is due ``cut_after`` seconds later
        (:meth:`cuts_due`). ``context``: whatever the driver needs to cut it (kept as is)."""
        self._charged.pop(ident, None)
        self.refused[ident] = True
        self._cuts.append((now + self.cut_after, ident, context))
        self.refusals += 1
        while len(self.refused) > self._max_refused:
            self.refused.popitem(last=False)

    def cuts_due(self, now: float) -> list[tuple[bytes, Any]]:
        """``[(ident, context), ...]`` of refused connections whose cut is due ``now``; each is
        returned once."""
        cuts, out = self._cuts, []
        while cuts and cuts[0][0] <= now:
            _, ident, context = cuts.popleft()
            out.append((ident, context))
        return out

    def forget(self, ident: bytes) -> None:
        """``ident`` said goodbye or is gone: drop its charge (a refusal is kept)."""
        self._charged.pop(ident, None)

    def charged(self, ident: bytes) -> int:
        """Messages charged to ``ident`` since the loop last caught up."""
        return self._charged.get(ident, 0)
