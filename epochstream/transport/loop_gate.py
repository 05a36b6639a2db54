"""A relay's gate, in its downstream publisher's loop thread: subscriptions travel upstream
(docs/filters.md, "Relays"). A downstream hello or filter update whose filter the relay's
upstream subscription does not cover waits (held) until the relay widened it; the upstream
subscription is narrowed again to what the subscribers need.

:class:`RelayGate` is composed into the :class:`~epochstream.transport.loop.PublisherLoop` of a
relay's publisher (its own state: the pure :class:`~epochstream.transport.upstream.UpstreamCover`
policy, the relay it asks for changes, the time of the last narrowing). It serves no hello or
update itself: the loop's :class:`~epochstream.transport.loop_peers.PeerControl` takes the ones
that may go now from :meth:`RelayGate.next_ready`.
"""

from __future__ import annotations

from typing import Callable

from .. import wire
from ..filters import Filter
from .fanout import Transmit
from .upstream import UpstreamCover

__all__ = ["RelayGate"]


class RelayGate:
    """The gate of the relay ``relay`` (its ``request(cover)`` asks the relay's thread to change
    its upstream subscription; it answers with a ``UPSTREAM_CHANGED`` command) publishing ``topic`` of
    ``order``; narrowing at most once per ``heartbeat_interval``."""

    def __init__(self, relay, topic: str, order, heartbeat_interval: float,
                 transmit: Transmit, stats):
        self._relay, self.topic, self.heartbeat_interval = relay, topic, heartbeat_interval
        self._cover = UpstreamCover(order, relay.key)
        self._transmit, self._stats = transmit, stats
        self._last_narrow = float("-inf")

    @staticmethod
    def _needs(program) -> list:
        return [Filter()] if program is None else [f for _, f in program.entries]

    def admits(self, program) -> bool:
        """True if a subscriber with ``program`` (``None``: no filter) can be served now."""
        return self._cover.admit(self._needs(program))

    def hold(self, kind: str, ident: bytes, header: dict, program) -> bool:
        """Hold the hello or update (``kind`` ``HELLO``/``UPDATE``) of ``ident`` until the
        upstream subscription is wide enough; False if too many wait (it is refused as busy)."""
        if not self._cover.hold(kind, (ident, header), self._needs(program)):
            self._transmit(ident, wire.encode_notice(
                "error", f"relay {self.topic!r} is busy: too many subscribers wait for its "
                         f"upstream subscription to widen; try again"))
            return False
        self._stats["gated"] += 1
        return True

    def drop(self, ident: bytes) -> None:
        """Forget what ``ident`` has held (it left, or sent a newer hello or update)."""
        self._cover.drop(lambda item: item[0] == ident)

    def next_ready(self) -> tuple | None:
        """The next held hello or update that may go now: ``(kind, ident, header, floor)``;
        ``None`` if there is none."""
        ready = self._cover.ready
        if not ready:
            return None
        kind, (ident, header), b = ready.pop(0)
        return kind, ident, header, b

    def request(self, live: list) -> None:
        """Ask the relay for a wider upstream subscription if some are still held (``live``:
        the filters of the subscribers served)."""
        target = self._cover.request(live)
        if target is not None:
            self._relay.request(target)

    def narrow(self, now: float, live: Callable[[], list]) -> None:
        """Narrow the relay's upstream subscription to what its subscribers need (``live()``),
        at most once per heartbeat interval (the first subscriber's join narrows it at once)."""
        if now - self._last_narrow < self.heartbeat_interval:
            return
        target = self._cover.narrow(live())
        if target is not None:
            self._last_narrow = now
            self._relay.request(target)

    def done(self, target, b, error, lower: tuple) -> bool:
        """The relay's thread changed its upstream subscription to ``target`` from ``b`` on (or
        failed with ``error``, a str: every held one is refused); ``lower``: the loop's lower
        frontier. True if the change was made (held ones may go now)."""
        cover = self._cover
        if error is not None:
            for ident, _ in cover.failed():
                self._transmit(ident, wire.encode_notice(
                    "error", f"relay {self.topic!r} could not widen its upstream subscription "
                             f"for this filter: {error}"))
            return False
        cover.granted(target, b)
        cover.frontier(lower)
        return True

    def frontier(self, lower: tuple) -> None:
        """The lower frontier moved: upstream changes it reached become the cover."""
        self._cover.frontier(lower)
