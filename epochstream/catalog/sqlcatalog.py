"""The catalog on SQL: :class:`SqlCatalog`, the :class:`~epochstream.catalog.api.Catalog` of a
SQLite file (the default, embedded) or a PostgreSQL database.

A :class:`SqlCatalog` opens its store (:mod:`epochstream.catalog.store`: connections,
transactions, the write lock; the schema created or migrated, :mod:`epochstream.catalog.schema`)
and holds three objects, each constructed with that store and owning its statements, to which
every operation of the interface is one call: :class:`~epochstream.catalog.topics.TopicTables`
(topics, partitions, grants), :class:`~epochstream.catalog.history.HistoryTables` (the epoch
logs' index, durable subscriptions; given the groups' tables, whose groups a trim stops) and
:class:`~epochstream.catalog.groups.GroupTables` (consumer groups). What it adds itself: the
defaults of a registration and a claim (its ``lease``, a fresh incarnation), and, on
PostgreSQL, the renewal of the durable subscriptions it holds (:mod:`epochstream.catalog.renewals`).
Every statement is written once and runs on either store; the values a reader gets
(:class:`TopicInfo`, :class:`PartitionInfo`) are :mod:`epochstream.catalog.records`; whether a
publisher process is still running is :mod:`epochstream.catalog.holders`.

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
read-modify-write holds the catalog's advisory write lock
(:mod:`epochstream.catalog.store_postgres`).

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
from typing import Any, Callable

from ..errors import CatalogError
from ..security import Grant
from .api import Catalog, implementation
from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
from .groups import GroupTables
from .history import HistoryTables
from .history_records import DurableInfo, EpochRecord, HistoryState
from .locations import ENV_VAR, CatalogURL, default_catalog_path, location_kind, resolve_path
from .records import TopicInfo
from .renewals import Renewals
from .retention_leases import RetentionTables
from .schema import enable_wal, ensure_postgres_schema, ensure_schema, retry_busy
from .store import BUSY_TIMEOUT_S, RETRY_DEADLINE_S, PostgresStore, SQLiteStore, retried
from .topics import TopicTables, topic_definition

__all__ = ["SqlCatalog", "topic_definition", "DEFAULT_LEASE_S"]

RENEW_S = 2.0
"""Seconds between two renewals of what a PostgreSQL catalog object holds (at most a third of
its lease)."""

DEFAULT_LEASE_S = 9.0
"""Seconds of the lease a partition registered in a PostgreSQL catalog holds (its publisher
renews it every 2 s, :mod:`epochstream.transport.lease_keeper`): Kafka KRaft's broker session
of 9 s. A SQLite catalog (one machine) judges liveness by pid instead."""


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
class SqlCatalog(Catalog):
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

    ``timeout`` (PostgreSQL; seconds, default :data:`~epochstream.catalog.retry.RETRY_DEADLINE_S`):
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
        self._topics = TopicTables(store)
        self._groups = GroupTables(store)
        self._history = HistoryTables(store, self._groups)  # a trim stops the groups behind it
        self._retention = RetentionTables(store)

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

    # ---- topics and partitions, grants (topics.py)

    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        return self._topics.create_topic(topic, order=order, codec=codec, partitions=partitions,
                                         schema=schema, partition_key=partition_key)

    def drop_topic(self, topic: str) -> None:
        return self._topics.drop_topic(topic)

    def topics(self) -> list[TopicInfo]:
        return self._topics.topics()

    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        return self._topics.lookup(topic, wait)

    def register_partition(self, topic: str, partition: int, endpoint: str, *,
                           ingest: str | None = None, pid: int | None = None,
                           incarnation: str | None = None, upper: Any = (),
                           lease: float | None = None, host: str | None = None,
                           pid_start: float | None = None, server_key: str | None = None) -> str:
        # the incarnation is chosen once: a retry after a commit whose answer was lost must
        # find its own claim, not take it for another publisher's
        incarnation = uuid.uuid4().hex if incarnation is None else str(incarnation)
        lease = self.lease if lease is None else lease
        return self._topics.register_partition(
            topic, partition, endpoint, ingest=ingest, pid=pid, incarnation=incarnation,
            upper=upper, lease=lease, host=host, pid_start=pid_start, server_key=server_key)

    def close_partition(self, topic: str, partition: int, incarnation: str,
                        upper: Any = (), *, aborted: bool = False) -> bool:
        return self._topics.close_partition(topic, partition, incarnation, upper, aborted=aborted)

    def record_upper(self, topic: str, partition: int, incarnation: str, upper: Any) -> bool:
        return self._topics.record_upper(topic, partition, incarnation, upper)

    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        return self._topics.heartbeat(topic, partition, incarnation)

    def grant(self, principal: str, topic_pattern: str, op: str) -> Grant:
        return self._topics.grant(principal, topic_pattern, op)

    def revoke(self, principal: str, topic_pattern: str | None = None,
               op: str | None = None) -> int:
        return self._topics.revoke(principal, topic_pattern, op)

    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        return self._topics.grants(topic, principal)

    # ---- the epoch logs' index and durable subscriptions (history.py)

    def history_state(self, topic: str, partition: int) -> HistoryState | None:
        return self._history.history_state(topic, partition)

    def history_states(self, topic: str) -> dict[int, HistoryState]:
        return self._history.history_states(topic)

    def history_begin(self, topic: str, partition: int, directory: str, lower: Any,
                      upper: Any, store: str | None = None) -> HistoryState:
        return self._history.history_begin(topic, partition, directory, lower, upper, store)

    def history_uploaded(self, topic: str, partition: int, segment: int, name: str,
                         nbytes: int, incarnation: str | None = None) -> tuple[bool, str | None]:
        return self._history.history_uploaded(topic, partition, segment, name, nbytes,
                                              incarnation)

    def history_commit(self, topic: str, partition: int, *, epochs: list[EpochRecord],
                       lower: Any, upper: Any, segment: int, committed: int,
                       roll_to: int | None = None, durable: bool = True,
                       incarnation: str | None = None) -> None:
        return self._history.history_commit(
            topic, partition, epochs=epochs, lower=lower, upper=upper, segment=segment,
            committed=committed, roll_to=roll_to, durable=durable, incarnation=incarnation)

    def history_trim(self, topic: str, partition: int, keep_from: int,
                     holder: str | None = None) -> tuple[tuple, list[str]]:
        return self._history.history_trim(topic, partition, keep_from, holder)

    def retention_acquire(self, topic: str, partition: int, holder: str, *, lease: float,
                          pid: int | None = None, pid_start: float | None = None,
                          host: str | None = None) -> tuple[bool, str]:
        return self._retention.retention_acquire(topic, partition, holder, lease=lease, pid=pid,
                                                 pid_start=pid_start, host=host)

    def retention_release(self, topic: str, partition: int, holder: str) -> bool:
        return self._retention.retention_release(topic, partition, holder)

    def retention_record(self, topic: str, limits: dict) -> None:
        return self._retention.retention_record(topic, limits)

    def retention_limits(self, topic: str) -> dict | None:
        return self._retention.retention_limits(topic)

    def history_epochs(self, topic: str, partition: int, *, min_t0: int | None = None,
                       segment_from: int | None = None, after: Any = None,
                       limit: int | None = None) -> list[EpochRecord]:
        return self._history.history_epochs(topic, partition, min_t0=min_t0,
                                            segment_from=segment_from, after=after, limit=limit)

    def history_epoch(self, topic: str, partition: int, time: Any) -> EpochRecord | None:
        return self._history.history_epoch(topic, partition, time)

    def durables(self, topic: str | None = None) -> list[DurableInfo]:
        return self._history.durables(topic)

    def durable(self, topic: str, name: str) -> DurableInfo | None:
        return self._history.durable(topic, name)

    def durable_claim(self, topic: str, name: str, holder: str, *, takeover: bool = False,
                      pid: int | None = None, pid_start: float | None = None,
                      host: str | None = None, lease: float | None = None) -> DurableInfo:
        info = self._history.durable_claim(topic, name, holder, takeover=takeover, pid=pid,
                                           pid_start=pid_start, host=host,
                                           lease=self.lease if lease is None else lease)
        if self._leases is not None and pid is None:  # this process holds it: renew it
            self._leases.hold(("d", topic, name), holder)
        return info

    def durable_ack(self, topic: str, name: str, holder: str, position: Any,
                    acked: Any = ()) -> bool:
        return self._history.durable_ack(topic, name, holder, position, acked)

    def durable_release(self, topic: str, name: str, holder: str) -> None:
        if self._leases is not None:
            self._leases.drop(("d", topic, name), holder)
        self._history.durable_release(topic, name, holder)

    def durable_renew(self, topic: str, name: str, holder: str) -> bool:
        return self._history.durable_renew(topic, name, holder)

    def durable_reset(self, topic: str, name: str, position: Any | None) -> DurableInfo:
        return self._history.durable_reset(topic, name, position)

    def durable_drop(self, topic: str, name: str) -> bool:
        return self._history.durable_drop(topic, name)

    # ---- consumer groups (groups.py)

    def group_open(self, topic: str, name: str, *, mode: str, ack_wait: float,
                   max_deliver: int, dead_letter: str | None) -> GroupInfo:
        return self._groups.group_open(topic, name, mode=mode, ack_wait=ack_wait,
                                       max_deliver=max_deliver, dead_letter=dead_letter)

    def group_info(self, topic: str, name: str) -> GroupInfo:
        return self._groups.group_info(topic, name)

    def groups(self, topic: str | None = None) -> list[GroupInfo]:
        return self._groups.groups(topic)

    def group_drop(self, topic: str, name: str) -> bool:
        return self._groups.group_drop(topic, name)

    def group_epochs(self, topic: str, name: str) -> list[GroupEpoch]:
        return self._groups.group_epochs(topic, name)

    def group_claim(self, topic: str, name: str, worker: str, decide: Callable[[dict, float], Any],
                    ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        return self._groups.group_claim(topic, name, worker, decide)

    def group_claim_read(self, topic: str, name: str) -> ClaimView:
        return self._groups.group_claim_read(topic, name)

    def group_claim_apply(self, topic: str, name: str, worker: str, lease: Any, exhausted: Any,
                          position: Any, fingerprint: str, *, pid: int | None = None,
                          pid_start: float | None = None, host: str | None = None
                          ) -> tuple[list[Claimed], list[Claimed], tuple | None] | None:
        return self._groups.group_claim_apply(topic, name, worker, lease, exhausted, position,
                                              fingerprint, pid=pid, pid_start=pid_start,
                                              host=host)

    def group_settle(self, topic: str, name: str, unit: tuple, token: int, *, outcome: str,
                     delay: float = 0.0) -> float:
        return self._groups.group_settle(topic, name, unit, token, outcome=outcome, delay=delay)

    def group_stop(self, topic: str, name: str, reason: str) -> None:
        return self._groups.group_stop(topic, name, reason)

    def group_reset(self, topic: str, name: str) -> None:
        return self._groups.group_reset(topic, name)


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
