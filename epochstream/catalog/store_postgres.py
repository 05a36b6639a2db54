"""The catalog's tables in a PostgreSQL database: :class:`PostgresStore` (psycopg 3), and how
the catalog's SQL becomes PostgreSQL's (:func:`postgres_sql`: ``?`` placeholders become ``%s``;
:func:`postgres_ddl`: column types).

A store hands out connections as :mod:`epochstream.catalog.store` describes; here the write
lock is a transaction-scoped advisory lock (``pg_advisory_xact_lock``, :data:`WRITE_LOCK_KEY`)
taken first in each write transaction under READ COMMITTED, a waiter sleeps on ``LISTEN`` /
``NOTIFY`` (:data:`CHANNEL`), and a failure that trying again may cure (the server restarting or
failing over, a connection lost, a serialization failure) is raised as
:class:`~epochstream.catalog.retry.Transient` for :func:`~epochstream.catalog.retry.retried` to
retry. Other errors become :class:`~epochstream.errors.CatalogError` naming the catalog (its URL
without a password, :func:`redact`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from ..errors import CatalogError
from .retry import RETRY_DEADLINE_S, Transient
from .store_common import BUSY_TIMEOUT_S, INHERITED, Poll

__all__ = ["PostgresStore", "postgres_sql", "postgres_ddl", "redact", "POSTGRES_SCHEMES",
           "WRITE_LOCK_KEY", "CHANNEL", "POSTGRES_POLL_S", "POOL_MAX"]

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

POOL_MAX = 8
"""Idle connections one PostgreSQL catalog object keeps at most, per process."""

IDLE_IN_TRANSACTION_S = 5.0
"""Seconds the server lets a session of the catalog sit idle inside a transaction before it
ends the session (``idle_in_transaction_session_timeout``, set on each connection unless the
server, database or role set one already). The catalog's transactions send their statements
back to back, so a session idle that long belongs to a process that is stopped (SIGSTOP, a
paused VM) or cut off while it held the catalog's write lock: ending it frees the lock for
every other writer (a successor registering, once the stopped publisher's lease ran out); the
stopped one's write fails and is retried when it runs again (then refused if fenced)."""
_IDLE_LIMIT = ("SELECT set_config('idle_in_transaction_session_timeout', ?, false) "
               "WHERE current_setting('idle_in_transaction_session_timeout') IN ('0', '0ms')")

# SQLSTATEs worth a retry: serialization_failure, deadlock_detected, admin_shutdown,
# crash_shutdown, cannot_connect_now, and the connection exceptions (class 08)
_TRANSIENT_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "08000", "08001",
                               "08003", "08004", "08006", "08007"})
# a connection refused for one of these reasons will not succeed by trying again
_PERMANENT = re.compile(r"password authentication failed|does not exist|no pg_hba\.conf entry|"
                        r"is not permitted to log in|permission denied|role .* does not exist|"
                        r"invalid (URI|connection option|sslmode)|SSL", re.IGNORECASE)


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
            raw = psycopg.connect(self.url, autocommit=True,
                                  connect_timeout=max(1, int(BUSY_TIMEOUT_S)))
            raw.execute(postgres_sql(_IDLE_LIMIT), (f"{int(IDLE_IN_TRANSACTION_S * 1000)}ms",))
            return raw
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
                INHERITED.extend(self._idle)
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
        """As :meth:`epochstream.catalog.store.SQLiteStore.insert_new`, in one statement: one
        array per column, ``unnest``-ed by the server (``executemany`` costs a round trip and
        the driver's per-statement work per row; a multi-row ``VALUES`` is parsed anew by the
        driver for each row count)."""
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
            yield Poll(POSTGRES_POLL_S)
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
