"""Where the catalog's tables live: a store, :class:`SQLiteStore` (one SQLite file, the default)
or :class:`~epochstream.catalog.store_postgres.PostgresStore` (a PostgreSQL database), and the one
model of connections, transactions and locking both follow.

:class:`~epochstream.catalog.sqlcatalog.SqlCatalog` writes every query once, in the SQL both
engines accept (``?`` placeholders, ``INSERT ... ON CONFLICT``), and runs it through one of the
two stores. A store hands out connections in five ways, each a context manager:

- ``read()``: an autocommit connection (each statement sees what was committed before it);
- ``snapshot()``: a read-only transaction (several statements see one state of the catalog);
- ``write()``: a read-modify-write transaction that holds the catalog's **write lock**, so two
  writers never interleave (two publishers racing for one partition cannot both win);
- ``hot()``: one statement on this thread's long-lived connection (a publisher's frontier);
- ``hot_write()``: like ``write()`` on that long-lived connection (index commits, acks).

The write lock is SQLite's ``BEGIN IMMEDIATE`` on SQLite and a transaction-scoped advisory lock
(``pg_advisory_xact_lock``) on PostgreSQL, taken first in each write transaction under READ
COMMITTED: after it is granted, every statement of the transaction sees every write committed
before. This is deliberately the same model on both engines (one writer at a time, readers never
blocked), so that every guarantee argued for the SQLite catalog holds on PostgreSQL unchanged.

Why no SQLAlchemy: the catalog's ~100 statements are plain SQL that both engines accept as
written; what differs is connections, transactions and locking, which an ORM or SQLAlchemy Core
would not decide for us, while costing ~100 ms of import time on every process. A thin layer
(:func:`postgres_sql`: ``?`` becomes ``%s``; :func:`postgres_ddl`: column types) is all it takes.

Errors of either driver become :class:`~epochstream.errors.CatalogError` naming the catalog;
a PostgreSQL server that cannot be reached becomes :class:`~epochstream.errors.CatalogUnavailable`,
and a failure worth trying again :class:`~epochstream.catalog.retry.Transient`, which
:func:`~epochstream.catalog.retry.retried` retries (both importable from here, as is everything of
:mod:`~epochstream.catalog.store_postgres`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from ..errors import CatalogError
from .retry import RETRY_DEADLINE_S, Transient, as_retry, retried, retrying
from .store_common import BUSY_TIMEOUT_S, INHERITED, Poll
from .store_postgres import (CHANNEL, POOL_MAX, POSTGRES_POLL_S, POSTGRES_SCHEMES, WRITE_LOCK_KEY,
                             PostgresStore, postgres_ddl, postgres_sql, redact)

# (the retry of operations is epochstream.catalog.retry, the PostgreSQL store
# epochstream.catalog.store_postgres: both importable from here too)
__all__ = ["SQLiteStore", "PostgresStore", "postgres_sql", "postgres_ddl", "redact", "retried",
           "retrying", "as_retry", "BUSY_TIMEOUT_S", "POSTGRES_SCHEMES", "RETRY_DEADLINE_S",
           "Transient", "CHANNEL", "POOL_MAX", "POSTGRES_POLL_S", "SQLITE_POLL_S",
           "WRITE_LOCK_KEY", "Store"]

SQLITE_POLL_S = 0.05
"""Seconds between two looks of a waiter on SQLite (no notifications)."""


class SQLiteStore:
    """The catalog's tables in one SQLite file at ``path`` (module docstring). Safe to share
    between threads; each process (after ``fork()``) opens its own connections."""

    kind = "sqlite"

    def __init__(self, path: Path):
        self.path = path
        self.where = str(path)
        self._lock = threading.Lock()  # serialises writers inside this process
        self._local = threading.local()  # the hot connection, one per thread

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.create_function("epoch_now", 0, time.time)  # the clock of leases (schema.py)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A fresh autocommit connection (busy timeout, foreign keys on), closed on exit; any
        :class:`sqlite3.Error` inside becomes a :class:`CatalogError` naming the file."""
        try:
            conn = self._open()
        except sqlite3.Error as e:
            raise CatalogError(f"cannot open catalog {self.path}: {e}") from e
        try:
            yield conn
        except sqlite3.Error as e:
            raise CatalogError(f"catalog {self.path}: {e}") from e
        finally:
            conn.close()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (``BEGIN`` ... ``COMMIT``): its statements see one state."""
        with self.read() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def write(self, synchronous: str | None = None) -> Iterator[sqlite3.Connection]:
        """A connection inside ``BEGIN IMMEDIATE`` (committed on success, rolled back on error).
        ``synchronous``: ``"NORMAL"`` commits without fsync (WAL mode: durable against a crash
        of the process, not power loss); default SQLite's ``FULL``."""
        with self._lock, self.read() as conn:
            if synchronous is not None:
                conn.execute(f"PRAGMA synchronous={'NORMAL' if synchronous == 'NORMAL' else 'FULL'}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def _hot(self) -> sqlite3.Connection:
        """This thread's long-lived connection (opened on first use).

        A fresh connection per call costs ~0.2 ms to open, and ~2 ms when it is the last one
        open on the file (closing it then checkpoints the WAL, with fsyncs). Keeping one open
        also spares the other (fresh) connections of this process that checkpoint-on-close."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if conn is not None:  # opened before a fork(): never touch it in the child
            INHERITED.append(conn)
            self._local.conn = None
        conn = self._open()
        try:
            # synchronous=NORMAL (on this connection only): in WAL mode a commit then appends to
            # the WAL without fsync (the WAL is fsynced at checkpoints). A commit is still durable
            # against a crash or kill of *this process* -- the failure record_upper exists for --
            # but the last ones may be lost on power loss / OS crash. With the default FULL, each
            # call costs one fsync (0.2-0.3 ms on this machine's SSD, several ms on slower disks)
            # on the publisher's hot path. Every other write (register, close, heartbeat) keeps
            # FULL, and its fsync also makes every earlier record_upper in the WAL durable.
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def drop_hot(self) -> None:
        """Forget this thread's hot connection (after an error), closing it if it was opened
        by this process."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is None:
            return
        if self._local.pid != os.getpid():
            INHERITED.append(conn)
            return
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    @contextlib.contextmanager
    def hot(self) -> Iterator[sqlite3.Connection]:
        """This thread's long-lived connection in autocommit mode, with ``synchronous=NORMAL``
        (one statement: :meth:`~epochstream.catalog.sqlcatalog.SqlCatalog.record_upper`)."""
        with self._lock:
            try:
                yield self._hot()
            except sqlite3.Error as e:
                self.drop_hot()
                raise CatalogError(f"catalog {self.path}: {e}") from e

    @contextlib.contextmanager
    def hot_write(self, synchronous: str) -> Iterator[sqlite3.Connection]:
        """Like :meth:`write` on this thread's long-lived connection (a publisher's commits to
        its epoch log index: no connect/close per commit). ``synchronous``: ``"FULL"`` (fsync at
        commit) or ``"NORMAL"``."""
        with self._lock:
            try:
                conn = self._hot()
                conn.execute(f"PRAGMA synchronous={'NORMAL' if synchronous == 'NORMAL' else 'FULL'}")
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                self.drop_hot()
                raise CatalogError(f"catalog {self.path}: {e}") from e
            try:
                yield conn
            except BaseException as e:
                try:
                    conn.execute("ROLLBACK")
                    conn.execute("PRAGMA synchronous=NORMAL")
                except sqlite3.Error:
                    self.drop_hot()
                if isinstance(e, sqlite3.Error):
                    raise CatalogError(f"catalog {self.path}: {e}") from e
                raise
            else:
                try:
                    conn.execute("COMMIT")
                    conn.execute("PRAGMA synchronous=NORMAL")  # what record_upper expects
                except sqlite3.Error as e:
                    self.drop_hot()
                    raise CatalogError(f"catalog {self.path}: {e}") from e

    def atomic(self, synchronous: str) -> Any:
        """A connection for one atomic compare-and-set statement: on SQLite
        :meth:`hot_write` (every write takes the file's lock anyway)."""
        return self.hot_write(synchronous)

    def close(self) -> None:
        """Close this thread's hot connection (others close when their thread's state goes)."""
        self.drop_hot()

    def notify(self, conn: Any, topic: str) -> None:
        """(PostgreSQL wakes waiters; on SQLite they poll.)"""

    def insert_new(self, conn: Any, table: str, columns: tuple[tuple[str, str], ...],
                   key: str, rows: list[tuple]) -> int:
        """Inside a write transaction: insert ``rows`` into ``table`` (``columns``: (name,
        type) pairs in the rows' order, types as in the DDL), skipping every row whose ``key``
        (the conflict target, e.g. ``"topic, idx, time"``) is there already. Returns the number
        of rows inserted. SQLite: ``executemany`` (a loop in C)."""
        names = ", ".join(c for c, _ in columns)
        marks = ", ".join("?" * len(columns))
        return conn.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks}) "
                                f"ON CONFLICT ({key}) DO NOTHING", rows).rowcount

    @contextlib.contextmanager
    def waker(self, topic: str | None) -> Iterator[Poll]:
        """What a waiter for a change of ``topic`` sleeps on: here every
        :data:`SQLITE_POLL_S` seconds a new look."""
        yield Poll(SQLITE_POLL_S)


Store = SQLiteStore | PostgresStore
"""A store: what the catalog's tables (:mod:`~epochstream.catalog.topics`,
:mod:`~epochstream.catalog.history`, :mod:`~epochstream.catalog.groups`) run their statements on."""
