"""A publisher's lease on its partition, kept alive: :class:`LeaseKeeper`.

A partition registered with a lease (a PostgreSQL catalog, or the network catalog) is live
while its holder renews it (``Catalog.heartbeat``) within the lease's seconds, measured on the
catalog's clock; once it expires another publisher may register the partition with the next
generation. The keeper renews every ``interval`` seconds from a daemon thread of its own (never
the publisher's loop: a catalog that is restarting makes a renewal wait up to its retry
deadline). A renewal the catalog refuses — another incarnation holds the partition now — means
this publisher was fenced: the keeper calls ``on_fenced`` once and stops. A renewal that fails
(the catalog unreachable) is logged and tried again; if the outage outlasts the lease, the
partition may be taken over meanwhile, and the next renewal that reaches the catalog finds it.
Defaults as Kafka's KRaft brokers: renew every 2 s, a lease of 9 s.

A holder that cannot prove its lease stops acting (:meth:`LeaseKeeper.valid`): a lease renewed by
a request sent at local time ``t`` holds on the catalog's clock until at least ``t + lease``, so
once ``t + lease * SAFETY`` has passed on this machine's monotonic clock without a newer
renewal, the publisher completes nothing more — a process stopped (SIGSTOP, a VM paused, a
long GC) past its lease wakes up fenced before it can complete an epoch its successor may also
be publishing. ``SAFETY`` allows for clock-rate drift between the two machines.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..errors import CatalogError

__all__ = ["LeaseKeeper", "RENEW_S", "SAFETY"]

log = logging.getLogger("epochstream.publisher")

RENEW_S = 2.0
"""Seconds between two renewals (at most a third of the lease)."""
SAFETY = 0.8
"""The part of a lease a holder counts on (the rest covers clock-rate drift)."""


class LeaseKeeper:
    """Renews the lease of ``incarnation`` on ``partition`` of ``topic`` in ``catalog`` every
    ``interval`` seconds until :meth:`stop`; ``on_fenced(reason)`` is called once (from the
    keeper's thread) when the catalog no longer lists ``incarnation`` as the partition's
    holder."""

    def __init__(self, catalog: Any, topic: str, partition: int, incarnation: str,
                 interval: float, on_fenced: Callable[[str], None]):
        self.catalog, self.topic, self.partition = catalog, topic, partition
        self.incarnation, self.interval = incarnation, float(interval)
        self._on_fenced = on_fenced
        self._stop = threading.Event()
        self.lease = float(getattr(catalog, "lease", None) or interval * 3)
        # registered just now: the registration was a renewal sent no earlier than this
        self._valid_until = time.monotonic() + self.lease * SAFETY
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"epochstream-lease-{topic}-{partition}")

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def valid(self) -> bool:
        """Whether the lease still holds by this machine's clock (module docstring)."""
        return time.monotonic() < self._valid_until

    def stop(self) -> None:
        """Stop renewing (the lease then expires unless the partition is closed)."""
        self._stop.set()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval):
            sent = time.monotonic()
            try:
                held = self.catalog.heartbeat(self.topic, self.partition, self.incarnation)
            except CatalogError as e:
                if not failing:
                    log.warning("publisher %s/%s: could not renew its lease: %s", self.topic,
                                self.partition, e)
                failing = True
                continue
            if held:
                self._valid_until = sent + self.lease * SAFETY
            if failing:
                log.warning("publisher %s/%s: lease renewals work again", self.topic,
                            self.partition)
            failing = False
            if not held and not self._stop.is_set():
                self._stop.set()
                self._on_fenced(f"the catalog no longer lists incarnation {self.incarnation} as "
                                f"the holder of {self.topic}/{self.partition}: a newer "
                                f"generation took it over (this one's lease expired)")
