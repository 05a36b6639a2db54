"""The catalog's SQLite file format: its tables, schema version and migration, WAL mode, and the
retry that creating a file needs when several processes open it at once.

``PRAGMA user_version`` holds :data:`SCHEMA_VERSION`. ``0`` is a file written before versioning
(its ``partitions.state`` only allowed ``live``/``closed``); :func:`ensure_schema` rebuilds the
``partitions`` table of such a file in place, keeping every row, and sets the version. A file with
a newer version than this code knows is refused with :class:`~epochstream.errors.CatalogError`.

Schema
------

``topics`` — one row per topic::

    name        TEXT PRIMARY KEY   -- the topic name
    order_name  TEXT NOT NULL      -- the order's name: "total" or "product(n)" (order.by_name)
    codec       TEXT NOT NULL      -- payload codec, e.g. "msgpack" or "arrow"
    partitions  INTEGER NOT NULL   -- number of partitions, >= 1
    schema      TEXT               -- optional payload schema (e.g. an Arrow schema as text/JSON)
    partition_key TEXT             -- (version 5) the key column of a key-partitioned topic, or
                                   -- NULL (epochstream.partitioning)
    created_at  REAL NOT NULL      -- time.time() of creation, seconds since the epoch

``partitions`` — one row per *registered* partition of a topic (a partition that no publisher
has registered yet has no row)::

    topic       TEXT NOT NULL      -- topics.name (rows are deleted with their topic)
    idx         INTEGER NOT NULL   -- partition index, 0 <= idx < topics.partitions
    endpoint    TEXT NOT NULL      -- ZeroMQ endpoint subscribers connect to ("tcp://host:port")
    ingest      TEXT               -- optional second endpoint (e.g. where producers push input)
    state       TEXT NOT NULL      -- "live" (publisher running), "closed" (finished cleanly) or
                                   -- "aborted" (stopped on an error: epochs it left incomplete
                                   -- never complete)
    incarnation TEXT NOT NULL      -- opaque id of this run of the publisher (uuid4 hex)
    pid         INTEGER NOT NULL   -- OS process id of the publisher
    pid_start   REAL               -- the process' start time (psutil), guards against pid reuse
    host        TEXT               -- socket.gethostname() of the publisher's machine
    upper       TEXT NOT NULL      -- JSON list of times (ints, or lists of ints for product
                                   -- orders): the partition's upper frontier, i.e. a bound on the
                                   -- times of data it may have sent. Set by register_partition
                                   -- (default []), moved by record_upper while live, final once
                                   -- closed or aborted (close_partition)
    updated_at  REAL NOT NULL      -- time.time() of the last register/heartbeat/record_upper/close,
                                   -- seconds
    lease       REAL               -- seconds (version 4), or NULL: a row registered through the
                                   -- network catalog is live while updated_at + lease >= now
                                   -- (renewed by heartbeats); NULL rows are judged by their pid
    server_key  TEXT               -- (version 5) the publisher's CURVE public key, Z85, or NULL
                                   -- (plain TCP): what a secured subscriber connects with
    PRIMARY KEY (topic, idx)

``grants`` (version 5) — who may do what on which topics (:mod:`epochstream.security`)::

    principal   TEXT NOT NULL      -- a client's CURVE public key (Z85), a certificate name, or '*'
    pattern     TEXT NOT NULL      -- fnmatch pattern over topic names
    op          TEXT NOT NULL      -- 'subscribe', 'publish' or 'admin' (admin implies the others)
    created_at  REAL NOT NULL      -- time.time() of the grant
    PRIMARY KEY (principal, pattern, op)

``history_partitions``, ``history_segments``, ``history_epochs`` (the index of each partition's
epoch log) and ``durables`` (durable subscriptions): see :mod:`epochstream.catalog.history`,
which owns their DDL and every read and write of them; ``groups`` and ``group_epochs``
(consumer groups): :mod:`epochstream.catalog.groups`. Version 4 adds the lease columns
(:data:`LEASE_COLUMNS`): ``partitions.lease`` and ``durables.holder_lease`` (seconds) and
``durables.holder_seen`` (``time.time()`` of the holder's last renewal), all ``NULL`` for rows
written by the embedded catalog. Version 5 adds ``partitions.server_key`` and the ``grants``
table (:data:`SECURITY_COLUMNS`, :data:`GRANTS_DDL`); a version-4 file gains both, keeping
every row (``server_key`` ``NULL``: plain TCP).

The stored state is only ever one of :data:`STATES`; readers also report ``"dead"``
(:mod:`epochstream.catalog.holders`).

Concurrency at creation: the file runs in WAL mode (:func:`enable_wal`), and the schema is
created or migrated inside one ``BEGIN IMMEDIATE`` transaction (:func:`ensure_schema`). Switching
a new file to WAL can fail at once with ``database is locked`` when two processes do it together,
whatever the busy timeout, so both steps run under :func:`retry_busy`.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from typing import Callable

from .groups import GROUPS_DDL
from .history import HISTORY_DDL, STORE_COLUMNS
from .records import STATES
from .retention_leases import RETENTION_DDL
from ..errors import CatalogError

__all__ = ["SCHEMA_VERSION", "LEASE_COLUMNS", "SECURITY_COLUMNS", "GENERATION_COLUMNS",
           "POSTGRES_NOW_DDL", "RUN_COLUMNS", "GROUP_TOTAL_COLUMNS", "GRANTS_DDL", "STATES",
           "ensure_schema", "enable_wal", "check_version",
           "retry_busy", "is_busy"]

SCHEMA_VERSION = 10
"""``PRAGMA user_version`` of a catalog file with this schema (0: before versioning, migrated;
1: before durable history — version 2 adds the ``history_*`` and ``durables`` tables; version 3
the consumer groups' ``groups`` and ``group_epochs``; version 4 the lease columns of the network
catalog, :data:`LEASE_COLUMNS`; version 5 the CURVE server key of each partition,
:data:`SECURITY_COLUMNS`, and the ``grants`` table, :data:`GRANTS_DDL`; version 6 the
partitions' generation, :data:`GENERATION_COLUMNS`, and on PostgreSQL the function
``epoch_now()``, :data:`POSTGRES_NOW_DDL`; version 7 each partition's run,
:data:`RUN_COLUMNS`; version 8 the consumer groups' running totals and settle times,
:data:`GROUP_TOTAL_COLUMNS`; version 9 where sealed segments are in an object store,
:data:`~epochstream.catalog.history.STORE_COLUMNS`; version 10 the retention leases and the
topics' recorded retention limits, :data:`~epochstream.catalog.retention_leases.RETENTION_DDL`)."""

LEASE_COLUMNS = (("partitions", "lease", "REAL"), ("durables", "holder_lease", "REAL"),
                 ("durables", "holder_seen", "REAL"))
"""``(table, column, type)`` added by schema version 4 (``ALTER TABLE ... ADD COLUMN``, to new
files too, so every file has the same columns in the same order)."""

SECURITY_COLUMNS = (("partitions", "server_key", "TEXT"), ("topics", "partition_key", "TEXT"))
"""``(table, column, type)`` added by schema version 5 (after :data:`LEASE_COLUMNS`): the
CURVE server key of each partition and the key column of a key-partitioned topic."""

GENERATION_COLUMNS = (("partitions", "generation", "INTEGER NOT NULL DEFAULT 0"),)
"""``(table, column, type)`` added by schema version 6: each partition's generation, raised by
every registration of a new incarnation (Kafka's producer epoch; 0 in rows of older files until
their partition is registered again)."""

RUN_COLUMNS = (("partitions", "run", "INTEGER NOT NULL DEFAULT 1"),)
"""``(table, column, type)`` added by schema version 7: the run of the topic each partition's
registration belongs to (``sqlcatalog.claim_run``)."""

GROUP_TOTAL_COLUMNS = (("groups", "acked_total", "INTEGER NOT NULL DEFAULT 0"),
                       ("groups", "dead_total", "INTEGER NOT NULL DEFAULT 0"),
                       ("groups", "redelivered_total", "INTEGER NOT NULL DEFAULT 0"),
                       ("groups", "settled_at", "REAL"),
                       ("group_epochs", "settled_at", "REAL"))
"""``(table, column, type)`` added by schema version 8, for a group's metrics
(:mod:`epochstream.report`): units acked and dead-lettered that a claim compacted away (their
rows are deleted once behind the position), deliveries beyond the first, and the catalog-clock
time of the last settlement (``group_epochs.settled_at`` per unit until compacted)."""

POSTGRES_NOW_DDL = """
CREATE OR REPLACE FUNCTION epoch_now() RETURNS double precision
    LANGUAGE sql VOLATILE AS $$ SELECT extract(epoch FROM clock_timestamp())::float8 $$
"""
"""The database's clock in seconds since 1970 as SQL both engines run, ``epoch_now()``: this
function on PostgreSQL, a function each SQLite connection registers (``time.time`` of the one
machine that opens the file). Leases are stamped and judged by it."""

GRANTS_DDL = """
CREATE TABLE IF NOT EXISTS grants (
    principal   TEXT NOT NULL,
    pattern     TEXT NOT NULL,
    op          TEXT NOT NULL CHECK (op IN ('subscribe', 'publish', 'admin')),
    created_at  REAL NOT NULL,
    PRIMARY KEY (principal, pattern, op)
)
"""
"""The ``grants`` table of schema version 5 (module docstring)."""

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6

_TOPICS_DDL = """
CREATE TABLE IF NOT EXISTS topics (
    name        TEXT PRIMARY KEY,
    order_name  TEXT NOT NULL,
    codec       TEXT NOT NULL,
    partitions  INTEGER NOT NULL CHECK (partitions >= 1),
    schema      TEXT,
    created_at  REAL NOT NULL
)
"""

# ``{name}``: "partitions", or the temporary name used while migrating an old file.
_PARTITIONS_DDL = """
CREATE TABLE IF NOT EXISTS {name} (
    topic       TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
    idx         INTEGER NOT NULL CHECK (idx >= 0),
    endpoint    TEXT NOT NULL,
    ingest      TEXT,
    state       TEXT NOT NULL CHECK (state IN ('live', 'closed', 'aborted')),
    incarnation TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    pid_start   REAL,
    host        TEXT,
    upper       TEXT NOT NULL DEFAULT '[]',
    updated_at  REAL NOT NULL,
    PRIMARY KEY (topic, idx)
)
"""

_PARTITION_COLUMNS = ("topic, idx, endpoint, ingest, state, incarnation, pid, pid_start, host, "
                      "upper, updated_at")


def is_busy(e: sqlite3.OperationalError) -> bool:
    """Whether ``e`` is SQLITE_BUSY or SQLITE_LOCKED (any extended code), i.e. worth a retry."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - sqlite3 without error codes
        return "locked" in str(e) or "busy" in str(e)
    return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def retry_busy(step: Callable[[sqlite3.Connection, Path], None], conn: sqlite3.Connection, *,
               deadline: float, timeout: float, path: Path, what: str) -> None:
    """Run ``step(conn, path)`` (e.g. :func:`enable_wal`, :func:`ensure_schema`), retrying with jittered exponential backoff (1 ms doubling up to
    50 ms) while SQLite reports BUSY/LOCKED, until ``deadline`` (``time.monotonic()``, seconds).

    Needed at creation: switching a new file to WAL takes an exclusive lock from within a
    read transaction, and SQLite then returns ``database is locked`` at once, without calling
    the busy handler, if another connection holds a lock (it would otherwise deadlock).

    Raises :class:`CatalogError` ("catalog <path>: could not <what> within <timeout> s") once the
    deadline has passed; any other :class:`sqlite3.OperationalError` is re-raised at once."""
    delay = 0.001
    while True:
        try:
            step(conn, path)
            return
        except sqlite3.OperationalError as e:
            if not is_busy(e):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CatalogError(f"catalog {path}: could not {what} within "
                                   f"{timeout:g} s: {e}") from e
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 0.05)


def enable_wal(conn: sqlite3.Connection, path: Path) -> None:
    """Put the file behind ``conn`` (at ``path``, for messages) in WAL mode (persistent; a no-op
    if it already is). Raises :class:`CatalogError` if SQLite keeps another journal mode."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() != "wal":
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":  # pragma: no cover - e.g. a filesystem without mmap
        raise CatalogError(f"catalog {path}: cannot switch to WAL mode (got {mode!r})")


def check_version(version: int, path: Path) -> None:
    """Raise :class:`CatalogError` if schema ``version`` (of the file at ``path``) is newer than
    :data:`SCHEMA_VERSION`."""
    if version > SCHEMA_VERSION:
        raise CatalogError(
            f"catalog {path} has schema version {version}, newer than this epochstream "
            f"understands ({SCHEMA_VERSION}); upgrade epochstream or use another catalog")


def ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables in a new file or migrate an old one to :data:`SCHEMA_VERSION`, in
    one ``BEGIN IMMEDIATE`` transaction; the version is read again once the write lock is
    held, so of several processes doing this at once only the first one changes anything.

    ``conn`` must be in autocommit mode (``isolation_level=None``); foreign keys are on again
    when this returns. Raises :class:`CatalogError` for a newer file (:func:`check_version`)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    check_version(version, path)
    if version == SCHEMA_VERSION:
        return
    # Rebuilding a table is done with foreign keys off (SQLite's documented procedure); the
    # pragma has no effect inside a transaction, so it is set before BEGIN.
    conn.execute("PRAGMA foreign_keys=OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            check_version(version, path)
            if version < SCHEMA_VERSION:
                _create_or_migrate(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("PRAGMA foreign_keys=ON")


def _create_or_migrate(conn: sqlite3.Connection) -> None:
    """Inside ``ensure_schema``'s transaction: create the tables of a new file, or migrate an
    older one keeping every row (version 0: rebuild ``partitions``, whose state CHECK lacks
    ``'aborted'``; versions 0 and 1: add the history tables; versions 0 to 3: add the lease
    columns; versions 0 to 4: the server key column and the grants table); then set the
    version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    old = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                       "AND name = 'partitions'").fetchone() is not None
    conn.execute(_TOPICS_DDL)
    if old and version == 0:
        conn.execute(_PARTITIONS_DDL.format(name="partitions_v1"))
        conn.execute(f"INSERT INTO partitions_v1 ({_PARTITION_COLUMNS}) "
                     f"SELECT {_PARTITION_COLUMNS} FROM partitions")
        conn.execute("DROP TABLE partitions")
        conn.execute("ALTER TABLE partitions_v1 RENAME TO partitions")
    elif not old:
        conn.execute(_PARTITIONS_DDL.format(name="partitions"))
    for ddl in (*HISTORY_DDL, *GROUPS_DDL, GRANTS_DDL, *RETENTION_DDL):  # new tables only
        conn.execute(ddl)
    for table, column, kind in (*LEASE_COLUMNS, *SECURITY_COLUMNS, *GENERATION_COLUMNS, *RUN_COLUMNS,
                                *GROUP_TOTAL_COLUMNS, *STORE_COLUMNS):
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


POSTGRES_VERSION_DDL = """
CREATE TABLE IF NOT EXISTS epochstream_schema (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    version     INTEGER NOT NULL
)
"""
"""PostgreSQL has no ``user_version``: the schema version is the one row of this table."""


def postgres_version(conn) -> int:
    """The schema version of the PostgreSQL catalog behind ``conn`` (a psycopg connection):
    ``0`` if it has no epochstream tables yet."""
    row = conn.execute("SELECT to_regclass('epochstream_schema') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    row = conn.execute("SELECT version FROM epochstream_schema WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def ensure_postgres_schema(conn, where: str) -> int:
    """Create the tables of a new PostgreSQL catalog (or migrate an older one) to
    :data:`SCHEMA_VERSION` in one transaction holding the catalog's write lock, so of several
    processes doing this at once only the first one changes anything; ``conn`` is an
    autocommit psycopg connection, ``where`` names the catalog in messages. Returns the version
    found before (0: a new catalog). The same DDL as SQLite's, with the column types of
    :func:`~epochstream.catalog.store_postgres.postgres_ddl`. Raises :class:`CatalogError` for a
    newer catalog (:func:`check_version`)."""
    from .store_postgres import WRITE_LOCK_KEY, postgres_ddl

    found = postgres_version(conn)
    check_version(found, where)
    if found == SCHEMA_VERSION:
        return found
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        found = postgres_version(conn)
        check_version(found, where)
        if found == SCHEMA_VERSION:
            return found
        conn.execute(postgres_ddl(POSTGRES_VERSION_DDL))
        for ddl in (_TOPICS_DDL, _PARTITIONS_DDL.format(name="partitions"),
                    *HISTORY_DDL, *GROUPS_DDL, GRANTS_DDL, *RETENTION_DDL):
            conn.execute(postgres_ddl(ddl))
        conn.execute(POSTGRES_NOW_DDL)
        for table, column, kind in (*LEASE_COLUMNS, *SECURITY_COLUMNS, *GENERATION_COLUMNS, *RUN_COLUMNS,
                                *GROUP_TOTAL_COLUMNS, *STORE_COLUMNS):
            conn.execute(postgres_ddl(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "
                                      f"{column} {kind}"))
        conn.execute("INSERT INTO epochstream_schema (id, version) VALUES (1, %s) "
                     "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                     (SCHEMA_VERSION,))
    return found
