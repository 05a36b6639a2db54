"""Liveness policy of a subscriber: when to ping, which partitions are suspect, when to look at
the catalog, when a partition is lost, and how long to wait for the successor of an aborted
publisher. Pure: no sockets, no clock — the subscriber hands in ``now`` (seconds, monotonic)
and acts on the answers (docs/protocol.md §4, "Liveness").

- Every message from a partition counts as a sign of life (:meth:`Liveness.heard`).
- A partition silent for ``min(timeout, 3 * ping_interval)`` seconds is *suspect*: the catalog
  is consulted (at most once per ping interval) — a publisher that closed or aborted before
  answering, or restarted with a new incarnation, is settled from there.
- Silent for more than ``timeout`` seconds: lost (:class:`~epochstream.errors.PublisherLost`).
- A partition whose publisher aborted may be awaited for ``timeout`` seconds (``recover=True``);
  the catalog is consulted every ``ping_interval / 4`` for a new live incarnation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Liveness"]


class Liveness:
    """``Liveness(timeout, ping_interval)``, both in seconds. Call :meth:`join` for every
    (re-)join; all other methods take the current monotonic time ``now``."""

    def __init__(self, timeout: float, ping_interval: float):
        self.timeout = float(timeout)
        self.ping_interval = float(ping_interval)
        self.join((), 0.0)

    def join(self, partitions, now: float) -> None:
        """Start watching ``partitions`` (an iterable of indices), all heard ``now``."""
        self.last_heard: dict[int, float] = {p: now for p in partitions}
        self.awaiting: dict[int, tuple[Any, float, str]] = {}  # p -> (incarnation, deadline, why)
        self._last_ping = now
        self._last_lookup = self._last_await = float("-inf")

    def heard(self, partition: int, now: float) -> None:
        """A message arrived from ``partition``."""
        self.last_heard[partition] = now

    def forget(self, partition: int) -> None:
        """Stop watching ``partition`` (it finished, or its socket was retired)."""
        self.last_heard.pop(partition, None)

    def ping_due(self, now: float) -> bool:
        """True (once per ``ping_interval``) when the subscriber should ping every partition."""
        if now - self._last_ping >= self.ping_interval:
            self._last_ping = now
            return True
        return False

    def suspects(self, now: float) -> list[tuple[int, float]]:
        """``[(partition, seconds silent), ...]`` to look up in the catalog now: the suspect
        partitions, when a lookup is due (once per ping interval) or one is past ``timeout``;
        else ``[]``."""
        after = min(self.timeout, 3 * self.ping_interval)
        out = [(p, now - h) for p, h in self.last_heard.items() if now - h > after]
        if not out:
            return []
        if now - self._last_lookup < self.ping_interval and all(s <= self.timeout for _, s in out):
            return []
        self._last_lookup = now
        return out

    def lost(self, silent: float) -> bool:
        """True when a partition silent for ``silent`` seconds is to be reported lost."""
        return silent > self.timeout

    def await_successor(self, partition: int, incarnation: Any, now: float, reason: str) -> None:
        """Wait up to ``timeout`` seconds for a new incarnation of an aborted ``partition``."""
        self.forget(partition)
        self.awaiting[partition] = (incarnation, now + self.timeout, reason)

    def successor_check_due(self, now: float) -> bool:
        """True when the catalog should be consulted for awaited successors (every
        ``ping_interval / 4``)."""
        if self.awaiting and now - self._last_await >= self.ping_interval / 4:
            self._last_await = now
            return True
        return False

    def missed_heartbeats(self, read_at: float, heartbeats: dict, grace: float):
        """After a poll that read the sockets at ``read_at``: ``(partition, seconds silent,
        its heartbeat interval)`` of a partition silent for more than two of its publisher's
        heartbeat intervals (``heartbeats``: ``{partition: seconds}``) plus ``grace`` seconds,
        or ``None``."""
        for partition, heard in self.last_heard.items():
            hb = heartbeats.get(partition)
            silent = read_at - heard
            if hb and silent > 2 * hb + grace:
                return partition, silent, hb
        return None
