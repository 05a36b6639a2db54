"""The catalog's part of retention by a lease holder: who may delete a partition's history (its
index rows and its objects in the store), and the retention limits a topic's publishers record.

A partition's **retention lease** (``retention_leases``, schema version 10) is held by one
holder at a time — normally the partition's running publisher (it takes the lease when it opens
its log and renews it as it commits), or ``epochstream retention run TOPIC`` for a topic with no
running publisher (:mod:`epochstream.log.retainer`). As a Kafka/KRaft lease: the holder stays the
holder while it renews within ``lease`` seconds, measured on the catalog's clock
(``epoch_now()``, :mod:`epochstream.catalog.store_common`); a holder on this machine whose
process is gone loses it at once (:func:`~epochstream.catalog.holders.holder_alive`). Another
holder takes it only once it lapsed. ``history_trim(..., holder=...)`` checks in its own
transaction that ``holder`` still holds the lease (:func:`check_lease`), so two would-be
deleters never both delete: the one without the lease is refused with
:class:`~epochstream.errors.Fenced` before anything is changed.

Tables (created by schema version 10, :mod:`epochstream.catalog.schema`)::

    retention_leases   -- one row per partition whose lease was ever taken
        topic, idx     -- the partition
        holder         -- opaque id of the holder (a publisher's incarnation, a runner's uuid)
        pid, pid_start, host -- the holder's process (the same-host fast path)
        lease          -- seconds the holder stays the holder without a renewal
        renewed_at     -- epoch_now() of the last take or renewal, seconds
    retention_limits   -- one row per topic whose publishers keep a log
        topic
        max_bytes, max_age, max_epochs -- the limits of Retention (NULL: no limit), as the
                       -- last publisher that opened a log of the topic configured them
        recorded_at    -- time.time() of that, seconds
"""

from __future__ import annotations

import time
from typing import Any

from .holders import check_holder, holder_alive
from .retry import retried
from .store import Store
from .store_common import clock
from ..errors import CatalogError, Fenced

__all__ = ["RETENTION_DDL", "RetentionTables", "check_lease", "describe_holder", "LIMIT_NAMES"]

RETENTION_DDL = (
    """CREATE TABLE IF NOT EXISTS retention_leases (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        idx INTEGER NOT NULL CHECK (idx >= 0),
        holder TEXT NOT NULL,
        pid INTEGER,
        pid_start REAL,
        host TEXT,
        lease REAL NOT NULL,
        renewed_at REAL NOT NULL,
        PRIMARY KEY (topic, idx))""",
    """CREATE TABLE IF NOT EXISTS retention_limits (
        topic TEXT PRIMARY KEY REFERENCES topics(name) ON DELETE CASCADE,
        max_bytes INTEGER,
        max_age REAL,
        max_epochs INTEGER,
        recorded_at REAL NOT NULL)""",
)

LIMIT_NAMES = ("max_bytes", "max_age", "max_epochs")
"""The limits of :class:`~epochstream.retention.Retention` the catalog records per topic."""

_LEASE_COLUMNS = "holder, pid, pid_start, host, lease, renewed_at"


def _alive(row, now: float) -> bool:
    holder, pid, pid_start, host, lease, renewed_at = row
    return holder_alive(pid, pid_start, host, lease, renewed_at, now)


def describe_holder(row, now: float) -> str:
    """One phrase naming the holder of a ``retention_leases`` row (its ``_LEASE_COLUMNS``)."""
    holder, pid, _, host, lease, renewed_at = row
    return (f"{holder} (pid {pid} on {host}; lease {lease:g} s, renewed "
            f"{max(0.0, now - renewed_at):.1f} s ago)")


def check_lease(conn, topic: str, partition: int, holder: str) -> None:
    """Inside a write transaction: raise :class:`~epochstream.errors.Fenced` unless ``holder``
    holds the retention lease of ``partition`` of ``topic`` now (taken and not lapsed)."""
    row = conn.execute(f"SELECT {_LEASE_COLUMNS} FROM retention_leases WHERE topic = ? AND "
                       f"idx = ?", (topic, partition)).fetchone()
    now = clock(conn)
    if row is None or row[0] != holder or not _alive(row, now):
        who = "nobody" if row is None else describe_holder(row, now)
        raise Fenced(f"{topic!r} partition {partition}: {holder} does not hold the retention "
                     f"lease (held by {who}); nothing deleted", topic=topic, partition=partition)


def _check_limits(limits: Any) -> dict:
    if not isinstance(limits, dict) or set(limits) - set(LIMIT_NAMES):
        raise CatalogError(f"retention limits must be a dict with keys among {LIMIT_NAMES}, "
                           f"got {limits!r}")
    for k, v in limits.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise CatalogError(f"retention limit {k} must be a number > 0 or None, got {v!r}")
    return {k: limits.get(k) for k in LIMIT_NAMES}


class RetentionTables:
    """The ``retention_leases`` and ``retention_limits`` tables on ``store``: the operations
    of :class:`~epochstream.catalog.api.Catalog` on them (``retention_acquire``,
    ``retention_release``, ``retention_record``, ``retention_limits``), each retried. Raises
    :class:`~epochstream.errors.CatalogError` when the store cannot be read or written."""

    def __init__(self, store: Store):
        self._store = store

    @retried
    def retention_acquire(self, topic: str, partition: int, holder: str, *, lease: float,
                          pid: int | None = None, pid_start: float | None = None,
                          host: str | None = None) -> tuple[bool, str]:
        if not isinstance(holder, str) or not holder or len(holder) > 200:
            raise CatalogError(f"a retention lease holder must be a non-empty str of at most "
                               f"200 characters, got {holder!r}")
        pid, pid_start, host, lease = check_holder(pid, pid_start, host, lease)
        if lease is None:
            raise CatalogError("a retention lease needs lease= seconds")
        with self._store.write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                return False, "nobody: the topic does not exist"
            row = conn.execute(f"SELECT {_LEASE_COLUMNS} FROM retention_leases WHERE "
                               f"topic = ? AND idx = ?", (topic, partition)).fetchone()
            now = clock(conn)
            if row is not None and row[0] != holder and _alive(row, now):
                return False, describe_holder(row, now)
            conn.execute(
                "INSERT INTO retention_leases (topic, idx, holder, pid, pid_start, host, lease, "
                "renewed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (topic, idx) DO UPDATE "
                "SET holder = excluded.holder, pid = excluded.pid, pid_start = "
                "excluded.pid_start, host = excluded.host, lease = excluded.lease, renewed_at = "
                "excluded.renewed_at", (topic, partition, holder, pid, pid_start, host, lease,
                                        now))
            return True, holder

    @retried
    def retention_release(self, topic: str, partition: int, holder: str) -> bool:
        with self._store.write() as conn:
            cur = conn.execute("DELETE FROM retention_leases WHERE topic = ? AND idx = ? AND "
                               "holder = ?", (topic, partition, holder))
            return cur.rowcount > 0

    @retried
    def retention_record(self, topic: str, limits: dict) -> None:
        limits = _check_limits(limits)
        with self._store.write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                return
            conn.execute(
                "INSERT INTO retention_limits (topic, max_bytes, max_age, max_epochs, "
                "recorded_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (topic) DO UPDATE SET "
                "max_bytes = excluded.max_bytes, max_age = excluded.max_age, max_epochs = "
                "excluded.max_epochs, recorded_at = excluded.recorded_at",
                (topic, *(limits[k] for k in LIMIT_NAMES), time.time()))

    @retried
    def retention_limits(self, topic: str) -> dict | None:
        with self._store.read() as conn:
            row = conn.execute("SELECT max_bytes, max_age, max_epochs FROM retention_limits "
                               "WHERE topic = ?", (topic,)).fetchone()
        return None if row is None else dict(zip(LIMIT_NAMES, row))
