"""What a relay asks its upstream for: the pure policy behind subscriptions that travel up
through relays (docs/filters.md, "Relays"; ZeroMQ's PUB/SUB design: a subscription travels upstream through
every device, so a message nobody downstream wants does not cross the upstream link). No
sockets, no clock, no threads: the relay's publisher loop drives it.

The relay subscribes upstream with a *cover* (:func:`~epochstream.filters.cover`) of the filters
of every downstream subscriber. A downstream filter ``g`` is *served* only where the upstream
filter in force covers it (:func:`~epochstream.filters.covers`) for every epoch it will be sent:

- **admission** (:meth:`UpstreamCover.admit`): ``g`` is covered by the cover in force for every
  epoch that can still arrive, by each change already made upstream and by the change asked
  for — the subscriber is served at once;
- otherwise its hello or filter update is **held** (at most :data:`MAX_HELD`) and a wider
  cover is asked for (:meth:`UpstreamCover.request`: one change at a time). The relay makes the
  change upstream (``Subscriber.update_filter``), which returns its boundary ``b``: epochs at
  or beyond ``b`` arrive under the new cover (:meth:`UpstreamCover.granted`).
  Both kinds are then served with the *floor* ``b`` (:attr:`UpstreamCover.ready`):
  - a held **hello** gets its snapshot with ``floor`` ``b``: the subscriber drops every epoch
    not at or beyond it (as after a re-join), so each epoch it releases arrived under the new
    cover — it joins at ``b`` instead of at once;
  - a held **update** is answered with ``floor`` ``b`` beside its upper frontier: the
    subscriber's change takes effect at or beyond both (their join), so no epoch before ``b``
    is released under the new filter (docs/protocol.md, ``X filter``).
- the change becomes the cover once the relay's lower frontier is at or beyond ``b``
  (:meth:`UpstreamCover.frontier`); until then a subscriber is admitted only if both cover it.
- **narrowing** (:meth:`UpstreamCover.narrow`): when the subscribers' filters need less than
  the cover (one left, one narrowed), the cover is narrowed to what they need — only while
  nothing is held or asked for, and the narrowed cover binds admissions at once.

A subscriber with no filter needs everything: the cover becomes :class:`Filter` ``()``.
Cost: O(subscribers × filter size) per admission, request and narrowing.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..filters import Filter, cover, covers
from ..frontier import Antichain

__all__ = ["UpstreamCover", "MAX_HELD", "HELLO", "UPDATE"]

MAX_HELD = 64
"""At most this many hellos and updates wait for a wider cover; more are refused (busy)."""

HELLO, UPDATE = "hello", "update"


class UpstreamCover:
    """``UpstreamCover(order, key=None, initial=Filter())``: ``key`` is the topic's key column
    (a key function or ``None``: keys do not travel upstream, and projections neither when a
    filter has keys); ``initial``: the cover the relay subscribed with (everything)."""

    def __init__(self, order, key: Any = None, initial: Filter | None = None):
        self.order = order
        self.key = key
        self.cover = initial if initial is not None else Filter()
        self.transitions: list[tuple[Filter, tuple]] = []  # (cover, boundary), oldest first
        self.asked: Filter | None = None   # the change asked for and not yet granted
        self.held: list[tuple[str, Any, tuple]] = []  # (kind, item, filters)
        self.ready: list[tuple[str, Any, tuple]] = []  # to serve now: (kind, item, floor)

    # -- the filter a subscriber needs ---------------------------------------------------
    def _upstream(self, f: Filter) -> Filter:
        """``f`` as it can travel upstream: without keys (and projection) when the topic's key
        is not a column the upstream publishers know."""
        if f.keys is not None and not isinstance(self.key, str):
            return Filter(None, None, f.where)
        return f

    def _bound(self) -> list[Filter]:
        """Every cover a served epoch may still have come under."""
        out = [self.cover, *(c for c, _ in self.transitions)]
        if self.asked is not None:
            out.append(self.asked)
        return out

    # -- admission -------------------------------------------------------------------------
    def admit(self, filters: Iterable[Filter]) -> bool:
        """True if a subscriber needing ``filters`` (every filter of its program) can be served
        now."""
        key = self.key
        bound = self._bound()
        return all(covers(c, self._upstream(f), key) for f in filters for c in bound)

    def hold(self, kind: str, item: Any, filters: Iterable[Filter]) -> bool:
        """Hold a hello or update (``kind`` :data:`HELLO` / :data:`UPDATE`) until a wider cover
        is in force; False (nothing held) if :data:`MAX_HELD` already wait. If the newest
        change made upstream covers it, it goes to :attr:`ready` with that change's boundary
        as its floor."""
        if len(self.held) >= MAX_HELD:
            return False
        fs = tuple(filters)
        if self.transitions and self.asked is None:  # the newest change may cover it already
            target, b = self.transitions[-1]
            if all(covers(target, self._upstream(f), self.key) for f in fs):
                self.ready.append((kind, item, b))
                return True
        self.held.append((kind, item, fs))
        return True

    def drop(self, match) -> list:
        """Forget the held or ready items for which ``match(item)`` is true (a subscriber that
        left, or sent a newer hello or update); returns them."""
        gone = [i for _, i, _ in self.held + self.ready if match(i)]
        self.held = [h for h in self.held if not match(h[1])]
        self.ready = [r for r in self.ready if not match(r[1])]
        return gone

    def request(self, live: Iterable[Filter]) -> Filter | None:
        """The cover to ask upstream for, given the filters ``live`` of the subscribers served
        (with every held one); ``None`` if nothing is held or a change is already asked for."""
        if self.asked is not None or not self.held:
            return None
        need = [self._upstream(f) for f in live]
        need += [self._upstream(f) for _, _, fs in self.held for f in fs]
        self.asked = cover(need, self.key)
        return self.asked

    def granted(self, target: Filter, b: tuple) -> None:
        """The relay changed upstream to ``target`` from boundary ``b`` (a frontier) on. The
        held hellos and updates it covers go to :attr:`ready` with the floor ``b``."""
        self.asked = None
        b = tuple(b)
        self.transitions.append((target, b))
        key, keep = self.key, []
        for kind, item, fs in self.held:
            if all(covers(target, self._upstream(f), key) for f in fs):
                self.ready.append((kind, item, b))
            else:
                keep.append((kind, item, fs))
        self.held = keep

    def failed(self) -> list:
        """The change asked for could not be made: every held item, to refuse."""
        self.asked = None
        items = [item for _, item, _ in self.held]
        self.held = []
        return items

    def frontier(self, lower: Iterable) -> None:
        """The relay's lower frontier is now ``lower`` (times): each change whose boundary it
        reached becomes the cover (every epoch still to come arrives under it)."""
        lower = tuple(lower)
        while self.transitions and self._reached(self.transitions[0][1], lower):
            self.cover = self.transitions.pop(0)[0]

    def _reached(self, b: tuple, lower: tuple) -> bool:
        """Every time still to come (at or beyond ``lower``) is at or beyond ``b``."""
        ab = Antichain(self.order, b)
        return all(ab.less_equal(t) for t in lower)

    # -- narrowing -------------------------------------------------------------------------
    def narrow(self, live: Iterable[Filter]) -> Filter | None:
        """The narrower cover to ask for, if the subscribers served (``live``: their filters)
        need less than the newest cover; ``None`` otherwise, with no subscriber, or while
        anything is held, ready or asked for."""
        live = [self._upstream(f) for f in live]
        if not live or self.held or self.ready or self.asked is not None:
            return None
        newest = self.transitions[-1][0] if self.transitions else self.cover
        target = cover(live, self.key)
        if target == newest or not covers(newest, target, self.key):
            return None
        self.asked = target
        return target
