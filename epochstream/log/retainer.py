"""Retention by a lease holder (docs/history.md, "Retention by a lease holder"): who deletes a
partition's history — its index rows, then its objects in the store.

Deleting is done only by the holder of the partition's retention lease in the catalog
(:mod:`epochstream.catalog.retention_leases`): normally the partition's running publisher
(:class:`RetentionLease`, driven by its :class:`~epochstream.log.writer.LogWriter`), or, for a
topic with no running publisher, :class:`Retainer` (``epochstream retention run TOPIC``), which
takes the lease of every partition of the topic and applies the topic's limits to the index and
the store. The order is always: the index rows (``Catalog.history_trim``, refused with
:class:`~epochstream.errors.Fenced` unless the caller holds the lease), then the objects. A
holder killed between the two leaves objects no index row names (no reader can find them); the
next holder deletes every object of a segment number below the first one the index retains.

Objects of *retained* segments that no index entry names (a publisher killed mid-upload or
between an upload and its index entry; a replaced object whose deletion was cut short) are
deleted by :func:`sweep_orphans` once they are older than :data:`ORPHAN_GRACE`: an upload is
indexed within one catalog call after it completed, and every retry uploads the object again
(a new modification time), so an object that old is never one still to be indexed.
"""

from __future__ import annotations

import logging
import time as _time
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import CatalogError, Fenced, HistoryError, PartitionHeld
from ..retention import Retention, segments_to_delete

__all__ = ["RETENTION_LEASE", "RetentionLease", "Retainer", "PartitionRun", "sweep_orphans",
           "ORPHAN_GRACE", "ORPHAN_SWEEP"]

RETENTION_LEASE = 30.0
"""Seconds a retention lease holds without a renewal (renewed every third of it)."""

ORPHAN_GRACE = 900.0
"""Seconds an object no index entry names must have existed before it is deleted as an orphan
(far longer than an upload plus one catalog call; store and host clocks may differ a little)."""
ORPHAN_SWEEP = 300.0
"""Seconds between two orphan sweeps of a publisher holding the retention lease."""

log = logging.getLogger("epochstream.history")


def sweep_orphans(store: Any, catalog: Any, topic: str, partition: int, *,
                  grace: float = ORPHAN_GRACE, now: float | None = None) -> int:
    """Delete the objects of ``partition`` of ``topic`` in ``store`` (a
    :class:`~epochstream.log.store.LogStore`) that no index entry of the catalog names (a
    whole object, or a piece of a chain) and that are older than ``grace`` seconds at ``now``
    (``time.time()``); returns how many. Raises ``OSError``/:class:`CatalogError`."""
    from .store import is_tails, tail_pieces

    now = _time.time() if now is None else now
    listed = store.segment_objects(topic, partition, mtimes=True)  # (listed before reading the
    state = catalog.history_state(topic, partition)                # index: an upload indexed
    if state is None:                                              # meanwhile is named there)
        return 0
    named: set = set()
    for g in state.segments:
        if is_tails(g.object):
            named.update(name for _, _, name in tail_pieces(g.object))
        elif g.object:
            named.add(g.object)
    n = 0
    for name, _, _, mtime in listed:
        if name not in named and mtime is not None and now - mtime > grace:
            store.delete(name)
            n += 1
    return n


class RetentionLease:
    """The holder's side of one partition's retention lease: ``holder`` (an id; default a new
    uuid) holds it for ``lease`` seconds. :meth:`held` takes or renews it when a third of the
    lease has passed since the last renewal (one catalog write), and says whether this holder
    holds it; :meth:`release` gives it up. Not thread-safe (one thread drives it)."""

    def __init__(self, catalog: Any, topic: str, partition: int, *, holder: str | None = None,
                 lease: float = RETENTION_LEASE):
        self.catalog, self.topic, self.partition = catalog, topic, partition
        self.holder = holder or uuid.uuid4().hex
        self.lease = float(lease)
        self._renewed: float | None = None  # time.monotonic() of the last renewal
        self.other: str | None = None  # who held it at the last refusal
        self._refused: float | None = None  # time.monotonic() of that refusal

    def held(self, force: bool = False) -> bool:
        """Whether this holder holds the lease, renewing it if due (or ``force``). A catalog
        that fails counts as not held (logged; the next call tries again)."""
        now = _time.monotonic()
        if not force and self._renewed is not None and now - self._renewed < self.lease / 3:
            return True
        if not force and self._refused is not None and now - self._refused < self.lease / 3:
            return False  # (another holder: asked again only every third of a lease)
        try:
            ok, who = self.catalog.retention_acquire(self.topic, self.partition, self.holder,
                                                     lease=self.lease)
        except CatalogError as e:
            log.warning("epoch log %s/%s: could not renew the retention lease: %s", self.topic,
                        self.partition, e)
            self._renewed = None
            return False
        if not ok and who != self.other:
            log.info("epoch log %s/%s: the retention lease is held by %s; retention is left to "
                     "it", self.topic, self.partition, who)
        self._renewed, self.other = (now, None) if ok else (None, who)
        self._refused = None if ok else now
        return ok

    def release(self) -> None:
        """Give the lease up (if held; a failing catalog: it lapses)."""
        if self._renewed is None:
            return
        self._renewed = None
        try:
            self.catalog.retention_release(self.topic, self.partition, self.holder)
        except CatalogError as e:
            log.warning("epoch log %s/%s: could not release the retention lease: %s",
                        self.topic, self.partition, e)


@dataclass(frozen=True)
class PartitionRun:
    """What one :meth:`Retainer.run_once` did to one partition: ``segments`` trimmed from the
    index, ``objects`` of theirs deleted from the store, ``orphans`` (objects no index row named:
    below the retained segments, or older than the grace) deleted, ``since`` (the
    retained frontier after), ``expired`` (durable subscriptions and ``group:`` groups it
    expired), ``error`` (a store that could not be opened or written: what is left there)."""

    partition: int
    segments: int
    objects: int
    orphans: int
    since: tuple
    expired: tuple = ()
    error: str | None = None


class Retainer:
    """Applies ``limits`` (a :class:`~epochstream.retention.Retention`; only its ``max_bytes``,
    ``max_age``, ``max_epochs`` count) to every partition log of ``topic`` in ``catalog`` —
    the index and the objects of its store (a URI recorded in the catalog, opened here with
    credentials as pyarrow reads them) — while holding every partition's retention lease
    (``lease`` seconds, as ``holder``). :meth:`acquire` first (raises
    :class:`~epochstream.errors.PartitionHeld` naming the holder if a live publisher or another
    runner holds one, having taken none), then :meth:`run_once` as often as wanted, then
    :meth:`release`. Local segment files are left alone (their publisher deletes those of
    trimmed segments when it opens the log). Objects no index entry names are deleted once older
    than ``orphan_grace`` seconds (:func:`sweep_orphans`; counted in ``orphans``)."""

    def __init__(self, catalog: Any, topic: str, limits: Retention, *,
                 lease: float = RETENTION_LEASE, holder: str | None = None,
                 orphan_grace: float = ORPHAN_GRACE):
        self.catalog, self.topic, self.limits = catalog, topic, limits
        self.orphan_grace = orphan_grace
        self.holder = holder or f"retention-run:{uuid.uuid4().hex}"
        self.lease = lease
        self.leases: dict[int, RetentionLease] = {}
        self._stores: dict[str, Any] = {}

    def acquire(self) -> list[int]:
        """Take the lease of every partition that keeps a log; returns their indexes. All or
        nothing: refused for one, the ones taken are released and
        :class:`~epochstream.errors.PartitionHeld` raised."""
        self.catalog.lookup(self.topic)  # TopicNotFound
        taken: dict[int, RetentionLease] = {}
        for p in sorted(self.catalog.history_states(self.topic)):
            lease = RetentionLease(self.catalog, self.topic, p, holder=self.holder,
                                   lease=self.lease)
            if not lease.held(force=True):
                for t in taken.values():
                    t.release()
                raise PartitionHeld(f"topic {self.topic!r} partition {p}: the retention lease "
                                    f"is held by {lease.other or 'nobody (the catalog failed)'}"
                                    f"; nothing deleted (a running publisher applies retention "
                                    f"itself)")
            taken[p] = lease
        self.leases = taken
        return sorted(taken)

    def renew(self) -> None:
        """Renew every lease taken, if due (between runs: call at least every third of
        ``lease``); raises :class:`~epochstream.errors.PartitionHeld` for a lease lost."""
        for p, lease in sorted(self.leases.items()):
            if not lease.held():
                raise PartitionHeld(f"topic {self.topic!r} partition {p}: the retention lease "
                                    f"was lost to {lease.other or 'nobody (the catalog failed)'}")

    def release(self) -> None:
        """Give up every lease taken."""
        for lease in self.leases.values():
            lease.release()
        self.leases = {}

    def run_once(self, now: float | None = None) -> list[PartitionRun]:
        """Apply the limits at ``now`` (``time.time()``, seconds) to every partition whose lease
        is held; raises :class:`~epochstream.errors.PartitionHeld` if a lease was lost (taken
        by another holder after it lapsed)."""
        now = _time.time() if now is None else now
        out = []
        for p, lease in sorted(self.leases.items()):
            if not lease.held(force=True):
                raise PartitionHeld(f"topic {self.topic!r} partition {p}: the retention lease "
                                    f"was lost to {lease.other}")
            out.append(self._partition(p, now))
        return out

    def _partition(self, p: int, now: float) -> PartitionRun:
        state = self.catalog.history_state(self.topic, p)
        if state is None:  # (the topic was dropped)
            return PartitionRun(p, 0, 0, 0, ())
        segs = list(state.segments)
        n = segments_to_delete(segs, self.limits, now)
        objects = [g.object for g in segs[:n] if g.object]
        since, expired = tuple(state.since), []
        if n:
            try:
                since, expired = self.catalog.history_trim(self.topic, p, segs[n].seq,
                                                           self.holder)
            except Fenced as e:
                raise PartitionHeld(str(e)) from e
        first = segs[n].seq if n < len(segs) else state.segment
        orphans, error = 0, None
        if state.store is not None:
            try:
                store = self._store(state.store)
                for name in objects:  # the index rows are gone: now the objects
                    store.delete(name)
                named = {g.object for g in segs[n:]}
                for name, seq, _ in store.segment_objects(self.topic, p):
                    if 0 <= seq < first and name not in named and name not in objects:
                        store.delete(name)
                        orphans += 1
                orphans += sweep_orphans(store, self.catalog, self.topic, p,
                                         grace=self.orphan_grace)
            except (OSError, ValueError, CatalogError, HistoryError) as e:
                error = (f"store {state.store}: {' '.join(str(e).split())[:300]}; objects of "
                         f"trimmed segments are left there (deleted by the next run)")
        return PartitionRun(p, n, len(objects) if error is None else 0, orphans, tuple(since),
                            tuple(expired), error)

    def _store(self, uri: str) -> Any:
        if uri.startswith("fs:"):
            raise ValueError("a FileSystem object, not a URI: the catalog cannot say where")
        if uri not in self._stores:
            from .store import open_store  # pyarrow.fs
            self._stores[uri] = open_store(uri, write=True)
        return self._stores[uri]
