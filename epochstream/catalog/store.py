"""Where the catalog's tables live: one SQLite file (the default) or a PostgreSQL database.

:class:`~epochstream.catalog.sqlcatalog.SqlCatalog` writes every query once, in the SQL both
engines accept (``?`` placeholders, ``INSERT ... ON CONFLICT``), and runs it through one of the
two stores here. A store hands out connections in five ways, each a context manager:

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
a PostgreSQL server that cannot be reached becomes :class:`~epochstream.errors.CatalogUnavailable`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import random
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from ..errors import CatalogError, CatalogUnavailable

__all__ = ["SQLiteStore", "PostgresStore", "postgres_sql", "postgres_ddl", "redact", "retried",
           "retrying", "as_retry", "BUSY_TIMEOUT_S", "POSTGRES_SCHEMES", "RETRY_DEADLINE_S"]

BUSY_TIMEOUT_S = 5.0
"""Seconds a SQLite connection waits for another process's lock before failing (busy timeout);
also how long a PostgreSQL connection attempt may take (``connect_timeout``)."""

POSTGRES_SCHEMES = ("postgresql", "postgres")
"""URL schemes of a PostgreSQL catalog (libpq's connection URIs)."""

WRITE_LOCK_KEY = 0x6570_6F63_6873_7472  # "epochstr": the advisory lock of catalog writes
"""The key of the PostgreSQL advisory lock every catalog write transaction holds (bigint)."""

_BEGIN_LOCKED = (f"BEGIN ISOLATION LEVEL READ COMMITTED; "
                 f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")

CHANNEL = "epochstream_catalog"
"""The PostgreSQL ``NOTIFY`` channel: each write that changes a topic's definition or the state
of a partition notifies it with the topic's name, when it commits."""
POSTGRES_POLL_S = 1.0
"""Seconds a waiter on PostgreSQL looks again without a notification (the worst case: a
notification lost across a reconnection)."""
SQLITE_POLL_S = 0.05
"""Seconds between two looks of a waiter on SQLite (no notifications)."""

POOL_MAX = 8
"""Idle connections one PostgreSQL catalog object keeps at most, per process."""

RETRY_DEADLINE_S = 30.0
"""Seconds a catalog operation on PostgreSQL keeps retrying a transient failure (the server
restarting or failing over, a connection lost, a serialization failure or deadlock) before it
raises :class:`~epochstream.errors.CatalogUnavailable` (``Catalog(url, timeout=...)``)."""

# SQLSTATEs worth a retry: serialization_failure, deadlock_detected, admin_shutdown,
# crash_shutdown, cannot_connect_now, and the connection exceptions (class 08)
_TRANSIENT_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "08000", "08001",
                               "08003", "08004", "08006", "08007"})
# a connection refused for one of these reasons will not succeed by trying again
_PERMANENT = re.compile(r"password authentication failed|does not exist|no pg_hba\.conf entry|"
                        r"is not permitted to log in|permission denied|role .* does not exist|"
                        r"invalid (URI|connection option|sslmode)|SSL", re.IGNORECASE)

_RETRYING: contextvars.ContextVar[int] = contextvars.ContextVar("epochstream_catalog_retry",
                                                                default=-1)


class Transient(CatalogUnavailable):
    """A failure a catalog operation may retry (see :data:`RETRY_DEADLINE_S`): raised by a
    store, caught by :func:`retried`; it reaches a caller only as the last error when the
    deadline has passed."""


def retrying() -> bool:
    """Whether the running catalog operation is a retry: its earlier attempt failed in a way
    that leaves unknown whether it committed (a connection lost at COMMIT), so an operation
    that must not apply twice checks whether it already did."""
    return _RETRYING.get() > 0


@contextlib.contextmanager
def as_retry(attempt: int) -> Iterator[None]:
    """Run the catalog operations inside as attempt ``attempt`` (0: the first) of a request
    its sender retried (the network catalog's resends): with ``attempt > 0`` they check for
    their own effect (:func:`retrying`); either way they make no retry loop of their own."""
    token = _RETRYING.set(attempt)
    try:
        yield
    finally:
        _RETRYING.reset(token)


def retried(operation: Any) -> Any:
    """Decorator of a catalog operation (a method of an object with a ``_store``): run it again
    from the start, with jittered exponential backoff (10 ms doubling to 1 s), while it raises
    :class:`Transient`, until the store's ``retry_deadline`` (seconds) has passed; then raise
    the last error. An operation called by another runs within the caller's attempt."""
    @functools.wraps(operation)
    def attempt(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _RETRYING.get() >= 0:  # inside another operation: its loop retries
            return operation(self, *args, **kwargs)
        deadline = time.monotonic() + getattr(self._store, "retry_deadline", 0.0)
        delay, tries = 0.01, 0
        while True:
            token = _RETRYING.set(tries)
            try:
                return operation(self, *args, **kwargs)
            except Transient:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
            finally:
                _RETRYING.reset(token)
            tries += 1
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 1.0)
    return attempt


# Connections opened in a process that then forked: the child must neither use nor close them
# (SQLite and libpq both forbid carrying a connection across fork()), so they are kept here.
_INHERITED: list[Any] = []


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and ``repr``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}:***@{netloc[-1]}"))


@functools.lru_cache(maxsize=512)
def postgres_sql(sql: str) -> str:
    """``sql`` as psycopg takes it: each ``?`` placeholder becomes ``%s`` (and a literal ``%``
    becomes ``%%``). The catalog's SQL has no ``?`` inside string literals."""
    return sql.replace("%", "%%").replace("?", "%s")


_TYPES = re.compile(r"\b(INTEGER|REAL|TEXT)\b")
_PG_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "TEXT": 'TEXT COLLATE "C"'}
_PG_ARRAY = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text"}


def postgres_ddl(ddl: str) -> str:
    """SQLite DDL as PostgreSQL runs it with the same meaning: ``INTEGER`` → ``BIGINT`` (SQLite's
    integers are 64-bit), ``REAL`` → ``DOUBLE PRECISION`` (ditto), ``TEXT`` → ``TEXT COLLATE
    "C"`` (SQLite compares and sorts text bytewise; a database's default collation may not)."""
    return _TYPES.sub(lambda m: _PG_TYPES[m.group(1)], ddl)


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
            _INHERITED.append(conn)
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
            _INHERITED.append(conn)
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
    def waker(self, topic: str | None) -> Iterator["_Poll"]:
        """What a waiter for a change of ``topic`` sleeps on: here every
        :data:`SQLITE_POLL_S` seconds a new look."""
        yield _Poll(SQLITE_POLL_S)


class _Poll:
    """A waker that only sleeps (polling): ``wait(remaining)`` sleeps ``min(interval,
    remaining)`` seconds."""

    def __init__(self, interval: float):
        self.interval = interval

    def wait(self, remaining: float) -> None:
        time.sleep(max(0.0, min(self.interval, remaining)))


class _Listener:
    """A waker on PostgreSQL: a connection of its own that ``LISTEN``s on :data:`CHANNEL`;
    ``wait(remaining)`` returns when a notification for its topic arrives, or after at most
    :data:`POSTGRES_POLL_S` (the fallback: a notification is lost across a reconnection)."""

    def __init__(self, raw: Any, topic: str):
        self.raw, self.topic = raw, topic

    def wait(self, remaining: float) -> None:
        timeout = max(0.0, min(POSTGRES_POLL_S, remaining))
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for note in self.raw.notifies(timeout=left, stop_after=1):
                    if note.payload == self.topic:
                        return
        except Exception:  # noqa: BLE001 - the connection broke: fall back to the poll
            time.sleep(max(0.0, deadline - time.monotonic()))


class _PgConnection:
    """A psycopg connection that takes the catalog's ``?`` SQL (:func:`postgres_sql`)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any):
        self.raw = raw

    def execute(self, sql: str, args: Any = None) -> Any:
        return self.raw.execute(postgres_sql(sql), args if args else None)

    def executemany(self, sql: str, rows: Any) -> Any:
        """Run ``sql`` for each row; the cursor's ``rowcount`` is the sum of rows affected."""
        cur = self.raw.cursor()
        cur.executemany(postgres_sql(sql), rows)
        return cur


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


class PostgresStore:
    """The catalog's tables in the PostgreSQL database at ``url`` (a libpq connection URI,
    ``postgresql://user:password@host:port/dbname?sslmode=...``; libpq's environment variables
    ``PGPASSWORD``, ``PGHOST``, ... and ``~/.pgpass`` fill in what the URL leaves out).

    Each call borrows a connection: an idle one of this process (at most :data:`POOL_MAX` are
    kept), else a new one; a broken connection (a restarted server) is closed, not kept, and a
    forked child never touches its parent's. (Not :mod:`psycopg_pool`: its worker threads, and
    its ``__del__`` joining them from whichever thread drops the last reference, do not suit
    catalog objects that callers open per call and leave to the garbage collector.) Raises :class:`CatalogError` (one line: the
    server's reason, e.g. a wrong password or a missing database) if the first connection
    fails, :class:`CatalogUnavailable` if the server cannot be reached."""

    kind = "postgresql"

    def __init__(self, url: str, retry_deadline: float = RETRY_DEADLINE_S):
        self.retry_deadline = retry_deadline
        try:
            import psycopg  # noqa: F401 - a clear error below if the driver is missing
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise CatalogError(f"a PostgreSQL catalog needs psycopg 3 (pip install "
                               f"'psycopg[binary]'): {e}") from None
        self.url = url
        self.where = redact(url)
        self._idle: list[Any] = []
        self._pool_pid = os.getpid()
        self._pool_lock = threading.Lock()
        self._closed = False

    # ---- connections

    def connect(self) -> Any:
        """A new autocommit psycopg connection (not from the pool), for schema work and checks.
        Raises :class:`CatalogUnavailable` / :class:`CatalogError` (class docstring)."""
        import psycopg

        try:
            return psycopg.connect(self.url, autocommit=True,
                                   connect_timeout=max(1, int(BUSY_TIMEOUT_S)))
        except psycopg.OperationalError as e:
            raise self._connect_error(e) from None
        except (psycopg.Error, ValueError) as e:  # e.g. a malformed URI
            raise CatalogError(f"cannot open catalog {self.where}: {_first_line(e)}") from None

    def _connect_error(self, e: BaseException) -> CatalogError:
        """A failed connection as an error: :class:`CatalogError` (one line, the server's
        reason) when trying again cannot help (a wrong password, a missing database),
        :class:`Transient` otherwise (nothing listens, the server starts or stops)."""
        fatal = re.search(r"FATAL:\s*(.*)", str(e))
        reason = fatal.group(1).strip() if fatal else _first_line(e)
        if _PERMANENT.search(reason):
            return CatalogError(f"cannot open catalog {self.where}: {reason}")
        return Transient(f"cannot reach catalog {self.where}: {reason}", url=self.where,
                         timeout=BUSY_TIMEOUT_S)

    def _take(self) -> Any:
        """An idle connection of this process, else a new one."""
        with self._pool_lock:
            if self._closed:
                raise CatalogError(f"catalog {self.where} is closed")
            if self._pool_pid != os.getpid():  # a forked child: the parent's are not ours
                _INHERITED.extend(self._idle)
                self._idle, self._pool_pid = [], os.getpid()
            while self._idle:
                raw = self._idle.pop()
                if not raw.closed:
                    return raw
        return self.connect()

    def _give_back(self, raw: Any) -> None:
        """Keep ``raw`` for the next borrower if it is healthy, idle and ours, else close it."""
        from psycopg.pq import TransactionStatus

        if raw.closed or self._pool_pid != os.getpid():
            return
        if raw.info.transaction_status == TransactionStatus.IDLE:
            with self._pool_lock:
                if not self._closed and len(self._idle) < POOL_MAX:
                    self._idle.append(raw)
                    return
        with contextlib.suppress(Exception):
            raw.close()

    @contextlib.contextmanager
    def _borrow(self) -> Iterator[Any]:
        import psycopg

        raw = self._take()
        try:
            yield raw
        except psycopg.Error as e:
            if isinstance(e, psycopg.OperationalError) or e.sqlstate in _TRANSIENT_STATES \
                    or raw.closed:
                raise Transient(f"catalog {self.where}: {_first_line(e)}",
                                url=self.where) from e
            raise CatalogError(f"catalog {self.where}: {_first_line(e)}") from e
        finally:
            self._give_back(raw)

    @contextlib.contextmanager
    def read(self) -> Iterator[_PgConnection]:
        """An autocommit connection from the pool."""
        with self._borrow() as raw:
            yield _PgConnection(raw)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[_PgConnection]:
        """A ``REPEATABLE READ READ ONLY`` transaction: its statements see one state."""
        with self._borrow() as raw:
            raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield _PgConnection(raw)
            finally:
                raw.execute("COMMIT")

    @contextlib.contextmanager
    def write(self, synchronous: str | None = None) -> Iterator[_PgConnection]:
        """A READ COMMITTED transaction holding the catalog's write lock (module docstring),
        committed on success, rolled back on error. ``synchronous`` is ignored: every commit
        waits for PostgreSQL's WAL flush (``synchronous_commit`` as the server sets it), since a
        crash of the *server* must not lose an index commit or an ack it confirmed."""
        with self._borrow() as raw:
            raw.execute(_BEGIN_LOCKED)  # BEGIN and the lock in one round trip (simple query)
            try:
                yield _PgConnection(raw)
            except BaseException:
                with contextlib.suppress(Exception):  # (a broken connection is closed anyway)
                    raw.execute("ROLLBACK")
                raise
            raw.execute("COMMIT")

    hot_write = write

    @contextlib.contextmanager
    def atomic(self, synchronous: str) -> Iterator[_PgConnection]:
        """An autocommit connection for one atomic compare-and-set statement, **without** the
        write lock: an ``UPDATE … WHERE <expected state>`` of one row is atomic on its own
        under READ COMMITTED (a concurrent writer of that row waits for it and re-checks its
        own condition on the row's new version), so it need not queue behind every other
        catalog write (a consumer group's ack: ``group_settle``). ``synchronous`` is ignored
        (see :meth:`write`)."""
        with self.read() as conn:
            yield conn

    @contextlib.contextmanager
    def hot(self) -> Iterator[_PgConnection]:
        """An autocommit connection for one statement (a single ``UPDATE`` is atomic on its own;
        it needs no write lock)."""
        with self.read() as conn:
            yield conn

    def drop_hot(self) -> None:
        return None

    def notify(self, conn: Any, topic: str) -> None:
        """Inside a write transaction: wake the waiters on ``topic`` when it commits."""
        conn.execute("SELECT pg_notify(?, ?)", (CHANNEL, topic))

    def insert_new(self, conn: Any, table: str, columns: tuple[tuple[str, str], ...],
                   key: str, rows: list[tuple]) -> int:
        """As :meth:`SQLiteStore.insert_new`, in one statement: one array per column,
        ``unnest``-ed by the server (``executemany`` costs a round trip and the driver's
        per-statement work per row; a multi-row ``VALUES`` is parsed anew by the driver for
        each row count)."""
        names = ", ".join(c for c, _ in columns)
        arrays = ", ".join(f"?::{_PG_ARRAY[t]}[]" for _, t in columns)
        return conn.execute(f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) "
                            f"ON CONFLICT ({key}) DO NOTHING",
                            [list(col) for col in zip(*rows)]).rowcount

    @contextlib.contextmanager
    def waker(self, topic: str | None) -> Iterator[Any]:
        """What a waiter for a change of ``topic`` sleeps on (``None``: a waiter that will not
        wait, no connection): a :class:`_Listener` on a connection of its own."""
        if topic is None:
            yield _Poll(POSTGRES_POLL_S)
            return
        raw = self.connect()
        try:
            raw.execute(f"LISTEN {CHANNEL}")
            yield _Listener(raw, topic)
        finally:
            with contextlib.suppress(Exception):
                raw.close()

    def close(self) -> None:
        """Close this process's idle connections (idempotent); the store is unusable
        afterwards (borrowed connections close when given back)."""
        with self._pool_lock:
            idle, self._idle, self._closed = self._idle, [], True
        if self._pool_pid == os.getpid():
            for raw in idle:
                with contextlib.suppress(Exception):
                    raw.close()
