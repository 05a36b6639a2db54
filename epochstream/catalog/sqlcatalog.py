"""The catalog on SQL: :class:`SqlCatalog`, the :class:`~epochstream.catalog.api.Catalog` of a
SQLite file (the default, embedded) or a PostgreSQL database.

Every statement is written once and runs on either store (:mod:`epochstream.catalog.store`:
connections, transactions, the write lock); the tables are :mod:`epochstream.catalog.schema`;
the values a reader gets (:class:`TopicInfo`, :class:`PartitionInfo`) are
:mod:`epochstream.catalog.records`; whether a publisher process is still running is
:mod:`epochstream.catalog.liveness`. The history index and durable subscriptions are the
methods of :class:`~epochstream.catalog.history.HistoryCatalog`, consumer groups those of
:class:`~epochstream.catalog.groups.GroupCatalog`.

SQLite: by default the file lives at ``$EPOCHSTREAM_CATALOG`` if that environment variable is
set, else at ``./.epochstream/catalog.sqlite`` relative to the current working directory; missing
parent directories are created. Several processes may open the same file at once, including a
file that does not exist yet: every connection gets a busy timeout of 5 s before it runs anything
else, the database runs in WAL mode (switching a new file to WAL is retried with backoff for up to
the busy timeout, because two processes switching at once can fail immediately with
``database is locked`` whatever the timeout), the schema is created or migrated inside one
``BEGIN IMMEDIATE`` transaction, and every read-modify-write happens inside one write
transaction, so two publishers racing for one partition cannot both win.

PostgreSQL (``Catalog("postgresql://...")``): the same tables (schema version in the table
``epochstream_schema``), created by the first process that opens the database; every
read-modify-write holds the catalog's advisory write lock (:mod:`epochstream.catalog.store`).

Liveness
--------

The stored state is only ever ``live``, ``closed`` or ``aborted`` (:data:`STATES`). When reading,
a ``live`` row whose process is gone (no such pid, a zombie, or a pid reused by a different
process) is reported with state ``"dead"``: liveness is judged *now*, by the reader, from the pid
(:func:`pid_alive`). Processes on another host cannot be checked and are assumed alive.
``closed`` and ``aborted`` are final whatever the process does afterwards. The stored ``upper`` is
reported in every state (for a ``dead`` row: the last one its publisher recorded). A row
registered with a ``lease`` (seconds; what the network catalog's client does) is judged by its
lease instead: ``dead`` once ``updated_at + lease`` has passed without a :meth:`Catalog.heartbeat`
(or another write by its holder).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from ..errors import CatalogError, PartitionHeld, TopicNotFound
from ..order import by_name
from ..security import Grant, check_grant, check_server_key
from .api import (ENV_VAR, Catalog, CatalogURL, default_catalog_path,
                  implementation, location_kind, resolve_path)
from .groups import GroupCatalog
from .history import DurableInfo, HistoryCatalog
from .liveness import check_holder
from .records import ROW_COLUMNS, TopicInfo, encode_upper, partition_from_row
from .renewals import Renewals
from .runs import claim_run
from .schema import STATES, enable_wal, ensure_postgres_schema, ensure_schema, retry_busy
from .store import BUSY_TIMEOUT_S, RETRY_DEADLINE_S, PostgresStore, SQLiteStore, retried

__all__ = ["SqlCatalog", "topic_definition", "DEFAULT_LEASE_S"]

RENEW_S = 2.0
"""Seconds between two renewals of what a PostgreSQL catalog object holds (at most a third of
its lease)."""

DEFAULT_LEASE_S = 9.0
"""Seconds of the lease a partition registered in a PostgreSQL catalog holds (its publisher
renews it every 2 s, :mod:`epochstream.transport.lease_keeper`): Kafka KRaft's broker session
of 9 s. A SQLite catalog (one machine) judges liveness by pid instead."""


def topic_definition(topic: Any, order: Any, codec: Any, partitions: Any,
                     schema: Any, partition_key: Any = None
                     ) -> tuple[str, str, int, str | None, str | None]:
    """``create_topic``'s arguments checked: ``(order_name, codec, partitions, schema,
    partition_key)`` as stored (``order_name`` canonical, per ``order.by_name``). Raises
    :class:`CatalogError`."""
    if not isinstance(topic, str) or not topic:
        raise CatalogError(f"topic name must be a non-empty string, got {topic!r}")
    order_name = order if isinstance(order, str) else getattr(order, "name", None)
    if not isinstance(order_name, str):
        raise CatalogError(f"order must be an order object with .name or its name, got {order!r}")
    try:
        order_name = by_name(order_name).name
    except ValueError as e:
        raise CatalogError(f"topic {topic!r}: {e}") from None
    if not isinstance(codec, str) or not codec:
        raise CatalogError(f"topic {topic!r}: codec must be a non-empty string, got {codec!r}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise CatalogError(f"topic {topic!r}: partitions must be an int >= 1, got {partitions!r}")
    if schema is not None and not isinstance(schema, str):
        raise CatalogError(f"topic {topic!r}: schema must be a str or None, got "
                           f"{type(schema).__name__}")
    if partition_key is not None and (not isinstance(partition_key, str) or not partition_key):
        raise CatalogError(f"topic {topic!r}: partition_key must be a column name or None, got "
                           f"{partition_key!r}")
    return order_name, codec, partitions, schema, partition_key

def _clock(conn: Any) -> float:
    """The catalog's clock, seconds since 1970 (``epoch_now()``, schema.py): the database
    server's for PostgreSQL, this machine's for SQLite."""
    return float(conn.execute("SELECT epoch_now()").fetchone()[0])


def _open_sqlite(store: SQLiteStore) -> None:
    """Create ``store``'s directory and file, switch it to WAL, create or migrate its schema."""
    try:
        store.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CatalogError(f"cannot create catalog directory {store.path.parent}: {e}") from e
    with store.read() as conn:
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        retry_busy(enable_wal, conn, deadline=deadline, timeout=BUSY_TIMEOUT_S,
                   path=store.path, what="switch it to WAL mode")
        retry_busy(ensure_schema, conn, deadline=deadline, timeout=BUSY_TIMEOUT_S,
                   path=store.path, what="create or migrate its schema")


@implementation("sqlite", "postgresql")
class SqlCatalog(HistoryCatalog, GroupCatalog, Catalog):
    """The catalog in a SQLite file or a PostgreSQL database (module docstring).

    ``location``: for SQLite a directory (the file is ``<dir>/catalog.sqlite``), a file ending
    in ``.sqlite``/``.sqlite3``/``.db`` (or any existing file), or ``sqlite:///path``; for
    PostgreSQL a libpq URL ``postgresql://user:password@host:port/dbname?sslmode=...`` (libpq's
    environment variables such as ``PGPASSWORD`` fill in what it leaves out). ``None`` means
    ``$EPOCHSTREAM_CATALOG`` if set, else ``./.epochstream/catalog.sqlite`` in the current
    working directory.

    A new catalog is created with its schema (missing directories too); an older schema version
    is migrated (:func:`~epochstream.catalog.schema.ensure_schema`,
    :func:`~epochstream.catalog.schema.ensure_postgres_schema`). Raises :class:`CatalogError` if
    the catalog cannot be opened, created or migrated (a SQLite file locked by other processes
    for longer than the busy timeout of 5 s, a wrong password, a missing database, a catalog
    written by a newer version: one line naming the catalog and the reason), and
    :class:`~epochstream.errors.CatalogUnavailable` if a PostgreSQL server cannot be reached.

    ``lease`` (seconds): the lease every partition registration takes, renewed by its
    publisher and judged on the database's clock; default :data:`DEFAULT_LEASE_S` on PostgreSQL
    (processes on other machines: a pid means nothing there), ``None`` on SQLite (the holder's
    pid, on the one machine that opens the file).

    ``timeout`` (PostgreSQL; seconds, default :data:`~epochstream.catalog.store.RETRY_DEADLINE_S`):
    how long an operation keeps retrying a transient failure (the server restarting or failing
    over, a connection lost, a serialization failure) before it raises
    :class:`~epochstream.errors.CatalogUnavailable`. Every operation is safe to retry: one whose
    commit's answer was lost finds its own effect and does not apply it twice.

    Safe to use from several threads and processes at once, including several processes
    creating the same new catalog at the same moment."""

    def __init__(self, location: str | os.PathLike | None = None, *,
                 timeout: float = RETRY_DEADLINE_S, lease: float | None = None):
        location = os.environ.get(ENV_VAR) if location is None else location
        postgres = location_kind(location) == "postgresql"
        if lease is not None and (isinstance(lease, bool) or not isinstance(lease, (int, float))
                                  or not 0 < lease < 1e6):
            raise CatalogError(f"lease must be seconds > 0, got {lease!r}")
        self.lease: float | None = (float(lease) if lease is not None
                                    else DEFAULT_LEASE_S if postgres else None)
        if postgres:
            store: SQLiteStore | PostgresStore = PostgresStore(str(location), timeout)
            self.path: Any = CatalogURL(str(location))
            self._store = store
            self._ensure_postgres_schema()
        else:
            self.path = (default_catalog_path() if location is None
                         else resolve_path(location)).absolute()
            store = SQLiteStore(self.path)
            _open_sqlite(store)
        self._store = store
        # the durable subscriptions this object claims, renewed in the background (a
        # partition's lease is renewed by its publisher: transport/lease_keeper.py)
        self._leases = (None if self.lease is None
                        else Renewals(self, min(RENEW_S, self.lease / 3), store.where))
        self._connect = store.read
        self._snapshot = store.snapshot
        self._write = store.write
        self._hot_write = store.hot_write
        self._atomic = store.atomic
        self._hot = store.hot

    @retried
    def _ensure_postgres_schema(self) -> None:
        """Create or migrate the PostgreSQL schema (retried while the server is unreachable)."""
        store = self._store
        conn = store.connect()
        try:
            ensure_postgres_schema(conn, store.where)
        except CatalogError:
            raise
        except Exception as e:  # noqa: BLE001 - psycopg's errors, one line naming the catalog
            raise CatalogError(f"catalog {store.where}: cannot create or migrate its schema: "
                               f"{str(e).strip().splitlines()[0]}") from None
        finally:
            conn.close()

    @property
    def store(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._store.kind

    @property
    def where(self) -> str:
        return self._store.where

    def __repr__(self) -> str:
        return f"Catalog({self._store.where!r})"

    def close(self) -> None:
        if self._leases is not None:
            self._leases.close()
        self._store.close()

    def durable_claim(self, topic: str, name: str, holder: str, *, takeover: bool = False,
                      pid: int | None = None, pid_start: float | None = None,
                      host: str | None = None, lease: float | None = None) -> DurableInfo:
        info = super().durable_claim(topic, name, holder, takeover=takeover, pid=pid,
                                     pid_start=pid_start, host=host,
                                     lease=self.lease if lease is None else lease)
        if self._leases is not None and pid is None:  # this process holds it: renew it
            self._leases.hold(("d", topic, name), holder)
        return info

    def durable_release(self, topic: str, name: str, holder: str) -> None:
        if self._leases is not None:
            self._leases.drop(("d", topic, name), holder)
        super().durable_release(topic, name, holder)

    @staticmethod
    def _existing(conn: Any) -> list[str]:
        """The names of all topics, sorted."""
        return [r[0] for r in conn.execute("SELECT name FROM topics ORDER BY name")]

    def _read_topic(self, conn: Any, topic: str) -> TopicInfo | None:
        """``topic``'s :class:`TopicInfo` with its partitions sorted by index (liveness judged
        now), or ``None`` if there is no such topic."""
        row = conn.execute(
            "SELECT name, order_name, codec, partitions, schema, partition_key FROM topics "
            "WHERE name = ?", (topic,)).fetchone()
        if row is None:
            return None
        parts = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM partitions WHERE topic = ? ORDER BY idx",
            (topic,)).fetchall()
        now = _clock(conn)
        return TopicInfo(name=row[0], order_name=row[1], codec=row[2], partitions=row[3],
                         schema=row[4], partition_key=row[5],
                         partition_info=tuple(partition_from_row(p, now) for p in parts))

    # ---- topics

    @retried
    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        wanted = topic_definition(topic, order, codec, partitions, schema, partition_key)
        with self._write() as conn:
            row = conn.execute(
                "SELECT order_name, codec, partitions, schema, partition_key FROM topics "
                "WHERE name = ?", (topic,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO topics (name, order_name, codec, partitions, schema, "
                    "partition_key, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (topic, *wanted, time.time()))
                self._store.notify(conn, topic)
            elif tuple(row) != wanted:
                have = TopicInfo(topic, *row[:4], partition_info=(), partition_key=row[4])
                want = TopicInfo(topic, *wanted[:4], partition_info=(),
                                 partition_key=wanted[4])
                raise CatalogError(
                    f"topic {topic!r} already exists with a different definition: existing "
                    f"({have.describe()}) vs requested ({want.describe()}); drop it first "
                    f"(Catalog.drop_topic) or use another name")
            return self._read_topic(conn, topic)

    @retried
    def drop_topic(self, topic: str) -> None:
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                raise TopicNotFound(topic, self._existing(conn))
            self._store.notify(conn, topic)
            conn.execute("DELETE FROM partitions WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM topics WHERE name = ?", (topic,))

    @retried
    def topics(self) -> list[TopicInfo]:
        with self._snapshot() as conn:
            return [self._read_topic(conn, name) for name in self._existing(conn)]

    @retried
    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        deadline = time.monotonic() + max(0.0, float(wait))
        with self._store.waker(topic if wait > 0 else None) as waker:
            while True:
                with self._snapshot() as conn:
                    info = self._read_topic(conn, topic)
                    existing = self._existing(conn) if info is None else None
                ready = info is not None and info.complete and all(
                    p.state in STATES for p in info.partition_info)
                remaining = deadline - time.monotonic()
                if ready or remaining <= 0:
                    if info is None:
                        raise TopicNotFound(topic, existing)
                    return info
                waker.wait(remaining)

    # ---- partitions

    def register_partition(self, topic: str, partition: int, endpoint: str, *,
                           ingest: str | None = None, pid: int | None = None,
                           incarnation: str | None = None, upper: Any = (),
                           lease: float | None = None, host: str | None = None,
                           pid_start: float | None = None, server_key: str | None = None) -> str:
        # the incarnation is chosen once: a retry after a commit whose answer was lost must
        # find its own claim, not take it for another publisher's
        incarnation = uuid.uuid4().hex if incarnation is None else str(incarnation)
        lease = self.lease if lease is None else lease
        return self._register_partition(topic, partition, endpoint, ingest=ingest, pid=pid,
                                        incarnation=incarnation, upper=upper, lease=lease,
                                        host=host, pid_start=pid_start, server_key=server_key)

    @retried
    def _register_partition(self, topic: str, partition: int, endpoint: str, *,
                            ingest: str | None, pid: int | None, incarnation: str, upper: Any,
                            lease: float | None, host: str | None, pid_start: float | None,
                            server_key: str | None) -> str:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise CatalogError(f"partition index must be an int, got {partition!r}")
        if not isinstance(endpoint, str) or not endpoint:
            raise CatalogError(f"endpoint must be a non-empty string, got {endpoint!r}")
        upper_text = encode_upper(upper)
        try:
            server_key = check_server_key(server_key)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        pid = os.getpid() if pid is None else int(pid)
        pid, pid_start, host, lease = check_holder(pid, pid_start, host, lease)
        with self._write() as conn:
            generation, run = self._check_claim(conn, topic, partition, incarnation)
            conn.execute(
                "INSERT INTO partitions (topic, idx, endpoint, ingest, state, incarnation, pid, "
                "pid_start, host, upper, updated_at, lease, server_key, generation, run) "
                "VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?, ?, epoch_now(), ?, ?, ?, ?) "
                "ON CONFLICT (topic, idx) DO UPDATE SET endpoint = excluded.endpoint, "
                "ingest = excluded.ingest, state = excluded.state, "
                "incarnation = excluded.incarnation, pid = excluded.pid, "
                "pid_start = excluded.pid_start, host = excluded.host, upper = excluded.upper, "
                "updated_at = excluded.updated_at, lease = excluded.lease, "
                "server_key = excluded.server_key, generation = excluded.generation, "
                "run = excluded.run",
                (topic, partition, endpoint, ingest, incarnation, pid, pid_start, host,
                 upper_text, lease, server_key, generation, run))
            self._store.notify(conn, topic)
        return incarnation

    def _check_claim(self, conn: Any, topic: str, partition: int,
                     incarnation: str) -> tuple[int, int]:
        """Inside a write transaction: raise unless ``incarnation`` may claim ``partition`` of
        ``topic`` (:class:`TopicNotFound`, :class:`CatalogError` for an index out of range or a
        partition that closed while its run goes on, :class:`PartitionHeld` for a live holder
        with another incarnation); return the ``(generation, run)`` the claim takes
        (compare-and-set under the write lock: the stored generation plus one for a new
        incarnation, the same for a registration repeated; :func:`claim_run`)."""
        row = conn.execute("SELECT partitions FROM topics WHERE name = ?", (topic,)).fetchone()
        if row is None:
            raise TopicNotFound(topic, self._existing(conn))
        if not 0 <= partition < row[0]:
            raise CatalogError(
                f"topic {topic!r} has {row[0]} partition(s) (0..{row[0] - 1}); "
                f"cannot register partition {partition}")
        now = _clock(conn)
        infos = [partition_from_row(r, now) for r in conn.execute(
            f"SELECT {ROW_COLUMNS} FROM partitions WHERE topic = ?", (topic,)).fetchall()]
        current = next((p for p in infos if p.index == partition), None)
        if current is not None and current.incarnation == incarnation:
            return max(current.generation, 1), current.run
        if current is not None and current.state == "live":
            raise PartitionHeld(
                f"partition {partition} of topic {topic!r} is held by a live publisher "
                f"(pid {current.pid} on {current.host}, endpoint {current.endpoint}, "
                f"incarnation {current.incarnation}); stop it first")
        run = claim_run(topic, partition, current, infos)
        return (0 if current is None else current.generation) + 1, run

    @retried
    def close_partition(self, topic: str, partition: int, incarnation: str,
                        upper: Any = (), *, aborted: bool = False) -> bool:
        text = encode_upper(upper)
        state = "aborted" if aborted else "closed"
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE partitions SET state = ?, upper = ?, updated_at = epoch_now() "
                "WHERE topic = ? AND idx = ? AND incarnation = ?",
                (state, text, topic, partition, incarnation))
            if cur.rowcount:
                self._store.notify(conn, topic)
            return cur.rowcount > 0

    @retried
    def record_upper(self, topic: str, partition: int, incarnation: str, upper: Any) -> bool:
        text = encode_upper(upper)
        with self._hot() as conn:
            cur = conn.execute(
                "UPDATE partitions SET upper = ?, updated_at = epoch_now() WHERE topic = ? "
                "AND idx = ? AND incarnation = ? AND state = 'live'",
                (text, topic, partition, incarnation))
            return cur.rowcount > 0

    @retried
    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        with self._hot() as conn:  # one UPDATE: atomic by itself, no write lock
            cur = conn.execute(
                "UPDATE partitions SET updated_at = epoch_now() WHERE topic = ? AND idx = ? "
                "AND incarnation = ?", (topic, partition, incarnation))
            return cur.rowcount > 0

    # ---- grants (docs/security.md)

    @retried
    def grant(self, principal: str, topic_pattern: str, op: str) -> Grant:
        try:
            g = check_grant(principal, topic_pattern, op)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        with self._write() as conn:
            conn.execute("INSERT INTO grants (principal, pattern, op, created_at) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (g.principal, g.pattern, g.op, time.time()))
        return g

    @retried
    def revoke(self, principal: str, topic_pattern: str | None = None,
               op: str | None = None) -> int:
        try:
            check_grant(principal, "*" if topic_pattern is None else topic_pattern,
                        "admin" if op is None else op)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        sql, args = "DELETE FROM grants WHERE principal = ?", [principal]
        if topic_pattern is not None:
            sql, args = sql + " AND pattern = ?", args + [topic_pattern]
        if op is not None:
            sql, args = sql + " AND op = ?", args + [op]
        with self._write() as conn:
            return conn.execute(sql, args).rowcount

    @retried
    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        import fnmatch

        with self._connect() as conn:
            rows = conn.execute("SELECT principal, pattern, op FROM grants "
                                "ORDER BY principal, pattern, op").fetchall()
        return [Grant(*r) for r in rows
                if (topic is None or fnmatch.fnmatchcase(topic, r[1]))
                and (principal is None or r[0] == principal)]


def schema_version(location: str | os.PathLike | None = None) -> int | None:
    """The schema version of the catalog at ``location`` (as :class:`SqlCatalog` takes it),
    without creating or changing anything: ``None`` if there is no catalog there (no file; a
    database without epochstream's tables), ``0`` for a SQLite file from before versioning.
    Raises :class:`CatalogError` (:class:`~epochstream.errors.CatalogUnavailable`) if it cannot
    be read."""
    location = os.environ.get(ENV_VAR) if location is None else location
    if location_kind(location) == "postgresql":
        from .schema import postgres_version

        store = PostgresStore(str(location))
        conn = store.connect()
        try:
            return postgres_version(conn) or None
        finally:
            conn.close()
    path = (default_catalog_path() if location is None else resolve_path(location)).absolute()
    if not path.is_file():
        return None
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise CatalogError(f"cannot read catalog {path}: {e}") from None
