"""A publisher's standing in the catalog: its partition registered under an incarnation (the
generation a successor fences it by: Kafka's producer epoch), its upper frontier recorded before
data beyond it leaves (:class:`~.upper.UpperRecorder`), its lease renewed where the catalog
leases partitions (:class:`~.lease_keeper.LeaseKeeper`), and the mark at its end.

:class:`Registration` is composed into the :class:`~epochstream.transport.publisher.Publisher`
(its own state); without a catalog it does nothing and never refuses.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..catalog import Catalog
from ..errors import CatalogError, CatalogUnavailable, Fenced
from .lease_keeper import RENEW_S, LeaseKeeper
from .upper import UpperRecorder

__all__ = ["Registration"]

log = logging.getLogger("epochstream.transport")


class Registration:
    """Partition ``partition`` of ``topic`` in ``catalog`` (or ``None``), held by
    ``incarnation``. :attr:`fenced`: a successor holds the partition (its catalog row is never
    touched again)."""

    def __init__(self, catalog: Catalog | None, topic: str, partition: int, incarnation: str):
        self.catalog, self.topic, self.partition = catalog, topic, partition
        self.incarnation = incarnation
        # the upper frontier goes to the catalog before data beyond it leaves (transport/upper.py)
        self.upper = None if catalog is None else UpperRecorder(catalog, topic, partition,
                                                                incarnation)
        self.keeper: LeaseKeeper | None = None
        self.fenced = False

    def register(self, create: Callable[[], None], endpoint: str, *, ingest: str | None,
                 upper: list, server_key: str | None) -> str:
        """Create the topic (``create()``) and register the partition at ``endpoint`` with its
        upper frontier ``upper``; returns the incarnation the catalog holds it under. Raises
        :class:`~epochstream.errors.PartitionHeld` (a live publisher holds it) and the
        catalog's errors."""
        if self.catalog is None:
            return self.incarnation
        create()
        self.incarnation = self.catalog.register_partition(
            self.topic, self.partition, endpoint, ingest=ingest, incarnation=self.incarnation,
            upper=upper, **({} if server_key is None else {"server_key": server_key}))
        return self.incarnation

    def keep_lease(self, on_fenced: Callable[[str], None]) -> None:
        """Renew the partition's lease from a thread of its own, where the catalog leases
        partitions (PostgreSQL, the network catalog); ``on_fenced(reason)`` once superseded."""
        lease = getattr(self.catalog, "lease", None)
        if lease is not None:
            self.keeper = LeaseKeeper(self.catalog, self.topic, self.partition,
                                      self.incarnation, min(RENEW_S, lease / 3),
                                      on_fenced).start()

    def lease_lapsed(self) -> str | None:
        """Why this publisher must stop now (its lease was not renewed in time: the process was
        stopped or starved, and a successor may hold the partition), or ``None``."""
        keeper = self.keeper
        if keeper is None or keeper.valid():
            return None
        return (f"fenced: its lease of {keeper.lease:g} s was not renewed in time (the process "
                f"was stopped or starved)")

    @property
    def refused(self) -> CatalogError | None:
        """The catalog's refusal of an upper frontier write (the loop then sent nothing more)."""
        return None if self.upper is None else self.upper.error

    def refusal(self, what: str, refused: CatalogError) -> CatalogError:
        """The error to raise for ``refused`` (``what``: the publisher): the same type, saying
        the publisher aborted."""
        if isinstance(refused, Fenced):
            return Fenced(f"{what} aborted: {refused}", topic=self.topic,
                          partition=self.partition, incarnation=self.incarnation)
        if isinstance(refused, CatalogUnavailable):
            return CatalogUnavailable(f"{what} aborted: {refused}", url=refused.url,
                                      timeout=refused.timeout, op=refused.op)
        return CatalogError(f"{what} aborted: {refused}")

    def mark_ended(self, upper: list, aborted: bool) -> None:
        """Stop renewing and mark the partition closed (or aborted) with its final upper
        frontier ``upper`` — unless fenced (the row is the successor's now). Best effort: the
        catalog may be gone; the stream itself ended correctly."""
        if self.keeper is not None:
            self.keeper.stop()
        if self.catalog is None or self.fenced:
            return
        try:
            if self.upper is not None and self.upper.error is None:
                self.upper.flush()  # the loop's last request (refused once the row is closed)
            self.catalog.close_partition(self.topic, self.partition, self.incarnation,
                                         upper=upper, aborted=aborted)
        except Exception:  # noqa: BLE001
            log.exception("could not mark %s/%s ended in the catalog", self.topic, self.partition)
