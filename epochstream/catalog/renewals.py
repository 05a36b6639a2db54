"""The leases one catalog object holds, renewed in the background: :class:`Renewals`.

A partition registered with a lease, and a durable subscription claimed with one, stay alive
while their holder renews them (``Catalog.heartbeat``, ``Catalog.durable_renew``). The network
catalog's client (:class:`~epochstream.catalog.client.RemoteCatalog`) and a PostgreSQL
:class:`~epochstream.catalog.sqlcatalog.SqlCatalog` each hold one :class:`Renewals`: what the
object registered or claimed is renewed every ``interval`` seconds by one daemon thread, until
it is closed or released, the catalog object is closed or collected, or the process ends. A
lease the catalog no longer grants (taken over, dropped, reset) is forgotten. After ``fork()``
the child renews nothing of its parent's.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

__all__ = ["Renewals"]

log = logging.getLogger("epochstream.catalog")


class Renewals:
    """The leases ``owner`` (a catalog object: ``heartbeat``, ``durable_renew``) holds; keys are
    ``("p", topic, partition)`` with the incarnation and ``("d", topic, name)`` with the
    holder. ``name`` names the thread and the log lines."""

    def __init__(self, owner: Any, interval: float, name: str):
        self._owner = weakref.ref(owner)
        self.interval, self.name = float(interval), name
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._held: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, key: tuple, ident: str) -> None:
        """Renew ``key`` (held by ``ident``) from now on (starting the thread if needed)."""
        with self._lock:
            if self._pid != os.getpid():
                self._reset_locked()
            self._held[key] = ident
            if self._thread is None or self._stop.is_set():
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=_loop, args=(weakref.ref(self), self._stop, self.interval),
                    daemon=True, name=f"epochstream-catalog-leases-{self.name}")
                self._thread.start()

    def _reset_locked(self) -> None:
        self._pid, self._held, self._thread = os.getpid(), {}, None
        self._stop = threading.Event()

    def drop(self, key: tuple, ident: str | None = None) -> None:
        """Stop renewing ``key`` (only if ``ident`` holds it, when given)."""
        with self._lock:
            if ident is None or self._held.get(key) == ident:
                self._held.pop(key, None)

    def renew(self) -> int:
        """Renew every held lease now; return how many are still held (one the catalog no
        longer grants is forgotten). Raises what the catalog raises (e.g. unreachable)."""
        owner = self._owner()
        if owner is None:
            return 0
        with self._lock:
            if self._pid != os.getpid():
                self._reset_locked()
            held = list(self._held.items())
        kept = 0
        for key, ident in held:
            kind, topic, what = key
            renew = owner.heartbeat if kind == "p" else owner.durable_renew
            if renew(topic, what, ident):
                kept += 1
            else:
                self.drop(key, ident)
        return kept

    @property
    def held(self) -> list[tuple]:
        """``("partition", topic, index)`` and ``("durable", topic, name)`` being renewed."""
        with self._lock:
            if self._pid != os.getpid():
                return []
            return [("partition" if k[0] == "p" else "durable", k[1], k[2]) for k in self._held]

    def close(self) -> None:
        """Stop renewing everything (the leases then run out)."""
        with self._lock:
            self._stop.set()
            self._held.clear()


def _loop(ref: "weakref.ref[Renewals]", stop: threading.Event, interval: float) -> None:
    """One object's renewer (a daemon thread): ``renew()`` every ``interval`` seconds until
    ``stop`` is set, the object is gone or it holds nothing any more."""
    failing = False
    while not stop.wait(interval):
        renewals = ref()
        if renewals is None:
            return
        try:
            with renewals._lock:
                if not renewals._held or stop.is_set():  # hold() starts a new thread if needed
                    if renewals._thread is threading.current_thread():
                        renewals._thread = None
                    return
            renewals.renew()
            if failing:
                log.warning("catalog %s: lease renewals work again", renewals.name)
            failing = False
        except Exception as e:  # noqa: BLE001 - keep trying: the catalog may come back
            if not failing:
                log.warning("catalog %s: could not renew leases: %s", renewals.name, e)
            failing = True
        finally:
            del renewals
