"""A durable subscription's cursor: its acked position, held in the catalog (docs/history.md,
"Durable subscriptions").

:class:`DurableCursor` is composed into the :class:`~epochstream.transport.subscriber.Subscriber`
(its own state): it claims the name (fencing a previous holder with ``takeover``), keeps the pure
:class:`~epochstream.position.AckTracker` of what was released, handed out and acked, writes the
position on every ack (a refusal undoes the ack), and releases the hold on close. Its position
is a frontier (Kafka's committed offset, per frontier; NATS JetStream's ack floor plus the acks
beyond it).
"""

from __future__ import annotations

import logging

from ..catalog import Catalog
from ..errors import ProtocolError, SubscriptionHeld
from ..frontier import Antichain, beyond
from ..order import dual
from ..position import AckTracker

__all__ = ["DurableCursor"]

log = logging.getLogger("epochstream.transport")


class DurableCursor:
    """The cursor of durable subscription ``name`` of ``topic`` held by subscriber ``holder`` (its
    id) in ``catalog``; times are of ``order``.

    Life: :meth:`claim` (the constructor's start), :meth:`resolve_latest` once a ``"latest"``
    start's join is ready, then :meth:`released` / :meth:`handed_out` / :meth:`frontier` as epochs
    are released, :meth:`ack` by the user, :meth:`release` on close. Raises
    :class:`~epochstream.errors.SubscriptionHeld` (claim: a live holder; ack: the hold was lost).
    """

    def __init__(self, topic: str, name: str, catalog: Catalog, order, holder: str):
        self.topic, self.name, self.order, self.holder = topic, name, order, holder
        self._catalog = catalog
        self.acks: AckTracker | None = None
        self.resolve_at_ready = False  # "latest": the position is known once the join is ready
        self.created = False  # created by this subscriber, its start not served yet
        self.refused = False  # ... and refused: close() drops it again

    # -- start -----------------------------------------------------------------------------
    def claim(self, position, takeover: bool):
        """Claim the name; return where the join starts: the stored position if the
        subscription exists, else ``position`` (as :func:`~epochstream.position.resolve_position`
        gives it: ``None`` for latest, ``"earliest"``, or a frontier)."""
        info = self._catalog.durable_claim(self.topic, self.name, self.holder, takeover=takeover)
        if info.position is not None:
            stored = tuple(info.position)
            self.acks = AckTracker(self.order, stored, info.acked)
            log.info("durable subscription %r of %r resumes at %s", self.name, self.topic,
                     list(stored))
            return stored
        if position is None:
            self.resolve_at_ready = True
        else:
            self.created = True
        return position

    def start(self, position: tuple) -> None:
        """A new subscription starts at ``position`` (a frontier): store it, unless the
        subscription already had one."""
        if self.acks is None:
            self.acks = AckTracker(self.order, position)
            self.store()

    def resolve_latest(self, lower: tuple) -> tuple:
        """A ``"latest"`` start, once the join is ready (``lower``: its merged lower frontier):
        start there, or for a finished topic where its next run continues. Returns the position."""
        self.resolve_at_ready = False
        position = tuple(lower) or self.after_end() or ()
        self.acks = AckTracker(self.order, position)
        self.store()
        return position

    # -- the position ----------------------------------------------------------------------
    @property
    def position(self) -> tuple | None:
        """The acked position (a tuple of times), ``None`` before a ``"latest"`` start is
        resolved."""
        return None if self.acks is None else self.acks.position

    def skips(self, t) -> bool:
        """True iff epoch ``t`` was acked in an earlier session (it is not handed out again)."""
        return self.acks is not None and self.acks.skips(t)

    def store(self) -> None:
        """Write the position to the catalog (one write); :class:`SubscriptionHeld` if the hold
        was lost."""
        if self.acks is None:
            return
        if not self._catalog.durable_ack(self.topic, self.name, self.holder,
                                         list(self.acks.position), list(self.acks.acked)):
            self._lost_hold()

    def _lost_hold(self):
        info = self._catalog.durable(self.topic, self.name)
        why = ("it was dropped" if info is None else
               f"it expired ({info.reason})" if info.state == "expired" else
               "another subscriber took it over" if info.holder not in (None, self.holder) else
               "another subscriber took it over and has closed since, or it was reset")
        raise SubscriptionHeld(f"durable subscription {self.name!r} of topic {self.topic!r}: "
                               f"this subscriber no longer holds it ({why}); its acks are "
                               f"refused")

    def ack(self, t) -> None:
        """Acknowledge the handed-out epoch at time ``t`` and store the new position. Raises
        ``ValueError`` for a time of the wrong shape or an epoch that is not an unacked
        handed-out one, :class:`SubscriptionHeld` if the catalog refused (fencing); nothing of a
        refused ack stays."""
        check = getattr(self.order, "check", None)
        try:
            t = check(t) if check else t
        except ProtocolError as e:
            raise ValueError(str(e)) from None
        acks = self.acks
        if acks is None:
            raise ValueError(f"durable subscription {self.name!r}: nothing handed out yet")
        saved = acks.snapshot()
        if not acks.ack(t):
            raise ValueError(f"epoch {t!r} is not an unacked epoch handed out by this subscriber "
                             f"(acked already, or never handed out)")
        try:
            self.store()
        except BaseException:  # refused (fenced) or failed: nothing of this ack stays
            acks.restore(saved)
            raise

    def frontier(self, lower) -> None:
        """Tell the tracker the merged lower frontier (at the end of the stream, where it stands
        after it: :meth:`after_end`; for an order without one, the last frontier stays, and the
        epochs acked beyond it are kept as out-of-order acks)."""
        lower = tuple(lower) or self.after_end()
        if lower is not None and self.acks is not None:
            self.acks.frontier(lower)

    def after_end(self) -> tuple | None:
        """Where the subscription of a finished stream stands once everything is acked: the
        times not at or below any time the stream had data at (every partition's upper
        frontier in the catalog), where a new run of the topic continues — never the empty
        frontier, at which nothing would ever be delivered again. ``None`` for an order
        :func:`~epochstream.frontier.beyond` cannot compute this for."""
        uppers = Antichain(dual(self.order))
        for p in self._catalog.lookup(self.topic).partition_info:
            uppers.extend(p.upper)
        for s in self._catalog.history_states(self.topic).values():
            uppers.extend(s.upper)
        return beyond(self.order, uppers.elements)

    # -- the end ---------------------------------------------------------------------------
    def release(self) -> None:
        """Give the hold up (best effort: closing must not fail on the catalog); a subscription
        this subscriber created and whose start was refused is dropped again."""
        try:
            self._catalog.durable_release(self.topic, self.name, self.holder)
        except Exception:  # noqa: BLE001
            log.debug("could not release durable %r", self.name, exc_info=True)
        if self.refused:
            self._forget_unused()

    def _forget_unused(self) -> None:
        """Drop the subscription again if it is still as this subscriber left it (free, at the
        start it stored), so a refused start leaves nothing behind. Best effort: a catalog that
        refuses (a secured one needs an admin grant to drop) leaves a free name at that
        start."""
        if self.acks is None:
            return
        try:
            info = self._catalog.durable(self.topic, self.name)
            if info is not None and info.holder is None and \
                    tuple(info.position or ()) == tuple(self.acks.start):
                self._catalog.durable_drop(self.topic, self.name)
        except Exception:  # noqa: BLE001 - the refusal being raised matters more
            log.debug("could not drop the unused durable %r", self.name, exc_info=True)
