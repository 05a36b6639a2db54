"""The catalog's topics on SQL: :class:`TopicTables`, every read and write of the tables
``topics`` (definitions), ``partitions`` (which publisher holds each partition: registration with
its generation by compare-and-set, frontiers, liveness, close) and ``grants`` (who may do what on
which topics, docs/security.md), and :func:`topic_definition` (``create_topic``'s arguments
checked, also by the network catalog's client before it sends them).

The tables are :mod:`epochstream.catalog.schema`; the values a reader gets (:class:`TopicInfo`,
:class:`PartitionInfo`) are :mod:`epochstream.catalog.records`; the store that runs the
statements (connections, transactions, the write lock) is :mod:`epochstream.catalog.store`.
"""

from __future__ import annotations

import fnmatch
import os
import time
from typing import Any

from ..errors import CatalogError, PartitionHeld, TopicNotFound
from ..order import by_name
from ..security import Grant, check_grant, check_server_key
from .holders import check_holder
from .records import ROW_COLUMNS, STATES, TopicInfo, encode_upper, partition_from_row
from .retry import retried
from .runs import claim_run
from .store import Store
from .store_common import clock

__all__ = ["TopicTables", "topic_definition", "topic_names"]


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


def topic_names(conn: Any) -> list[str]:
    """The names of all topics, sorted (what :class:`TopicNotFound` lists)."""
    return [r[0] for r in conn.execute("SELECT name FROM topics ORDER BY name")]


class TopicTables:
    """Topics, their partitions and the grants in ``store`` (a
    :class:`~epochstream.catalog.store.SQLiteStore` or a
    :class:`~epochstream.catalog.store_postgres.PostgresStore`): the operations of
    :class:`~epochstream.catalog.api.Catalog` on them, with its arguments, results and errors
    (``register_partition`` takes every argument explicitly: the defaults are the catalog's),
    each retried (:func:`~epochstream.catalog.retry.retried`)."""

    def __init__(self, store: Store):
        self._store = store

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
        now = clock(conn)
        return TopicInfo(name=row[0], order_name=row[1], codec=row[2], partitions=row[3],
                         schema=row[4], partition_key=row[5],
                         partition_info=tuple(partition_from_row(p, now) for p in parts))

    # ---- topics

    @retried
    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        wanted = topic_definition(topic, order, codec, partitions, schema, partition_key)
        with self._store.write() as conn:
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
        with self._store.write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                raise TopicNotFound(topic, topic_names(conn))
            self._store.notify(conn, topic)
            conn.execute("DELETE FROM partitions WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM topics WHERE name = ?", (topic,))

    @retried
    def topics(self) -> list[TopicInfo]:
        with self._store.snapshot() as conn:
            return [self._read_topic(conn, name) for name in topic_names(conn)]

    @retried
    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        deadline = time.monotonic() + max(0.0, float(wait))
        with self._store.waker(topic if wait > 0 else None) as waker:
            while True:
                with self._store.snapshot() as conn:
                    info = self._read_topic(conn, topic)
                    existing = topic_names(conn) if info is None else None
                ready = info is not None and info.complete and all(
                    p.state in STATES for p in info.partition_info)
                remaining = deadline - time.monotonic()
                if ready or remaining <= 0:
                    if info is None:
                        raise TopicNotFound(topic, existing)
                    return info
                waker.wait(remaining)


    # ---- partitions

    @retried
    def register_partition(self, topic: str, partition: int, endpoint: str, *,
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
        with self._store.write() as conn:
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
            raise TopicNotFound(topic, topic_names(conn))
        if not 0 <= partition < row[0]:
            raise CatalogError(
                f"topic {topic!r} has {row[0]} partition(s) (0..{row[0] - 1}); "
                f"cannot register partition {partition}")
        now = clock(conn)
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
        with self._store.write() as conn:
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
        with self._store.hot() as conn:
            cur = conn.execute(
                "UPDATE partitions SET upper = ?, updated_at = epoch_now() WHERE topic = ? "
                "AND idx = ? AND incarnation = ? AND state = 'live'",
                (text, topic, partition, incarnation))
            return cur.rowcount > 0

    @retried
    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        with self._store.hot() as conn:  # one UPDATE: atomic by itself, no write lock
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
        with self._store.write() as conn:
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
        with self._store.write() as conn:
            return conn.execute(sql, args).rowcount

    @retried
    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        with self._store.read() as conn:
            rows = conn.execute("SELECT principal, pattern, op FROM grants "
                                "ORDER BY principal, pattern, op").fetchall()
        return [Grant(*r) for r in rows
                if (topic is None or fnmatch.fnmatchcase(topic, r[1]))
                and (principal is None or r[0] == principal)]
