"""The catalog's part of durable history: the index of every partition's epoch log and the
durable subscriptions (their tables, records, and every read and write of them).

:class:`HistoryTables` runs its statements on the store it is given (connections, transactions,
the write lock: :mod:`epochstream.catalog.store`) and is given the consumer groups' tables
(:class:`~epochstream.catalog.groups.GroupTables`) too: a trim stops the groups it leaves behind,
in its own transaction. The values it hands out are :mod:`epochstream.catalog.history_records`;
the log files themselves are :mod:`epochstream.log`.

Tables (created by schema version 2, :mod:`epochstream.catalog.schema`); times and frontiers are
JSON like ``partitions.upper`` (:func:`~epochstream.catalog.records.encode_upper`)::

    history_partitions  -- one row per partition that keeps a log
        topic, idx      -- the partition
        dir             -- absolute directory of its segment files
        since           -- JSON frontier: every complete epoch t with since <= t is retained
        lower, upper    -- JSON frontiers as of the last commit (a restart resumes there)
        segment         -- number of the segment being written
        committed       -- bytes of that segment covered by the index (beyond: an unfinished
                        -- tail, truncated on recovery)
        updated_at      -- time.time() of the last commit, seconds
        store           -- (version 9) the object store's URI without credentials
                        -- (epochstream.log.store), "fs:<type>" for a FileSystem object, or NULL
    history_segments    -- one row per segment file
        topic, idx, seq, since (the lower frontier when it was started), nbytes (committed),
        epochs (indexed in it), created_at, last_completed (time.time() of its newest epoch),
        object, object_bytes (version 9: the name, under the store's root, of the object
        holding the first object_bytes bytes of the segment, set only once it is whole in the
        store; NULL: not in the store; "tails:..." a chain of objects, upload="frontier")
    history_epochs      -- one row per complete epoch with data in a partition
        topic, idx, time (JSON), t0 (the time, or its first component: a coarse range key),
        seq (segment), extents (JSON [[offset, length], ...] of its D records in the segment),
        nbytes (payload bytes), messages (D records), crc (CRC-32 chained over its records'
        CRC-32s, in order), completed_at (time.time())
    durables            -- durable subscriptions
        topic, name, position (JSON frontier: every epoch not at or beyond it was acked; NULL
        until the first join resolves ``start``), acked (JSON times at or beyond the position
        acked out of order), state ('active' | 'expired'), holder (the
        holding Subscriber's id, NULL when free), holder_pid, holder_pid_start, holder_host,
        created_at, acked_at, reason (why it expired), holder_lease (seconds, or NULL: the
        holder took it through the network catalog and renews it), holder_seen (time.time() of
        the holder's last claim, ack or renewal) -- the last two since schema version 4

Every write runs in one ``BEGIN IMMEDIATE`` transaction, like the rest of the catalog.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .groups import GroupTables
from .history_ddl import HISTORY_DDL, STORE_COLUMNS
from .history_records import (DurableInfo, EpochRecord, HistoryState, decode_time, encode_time,
                              position_available)
from .holders import check_holder, holder_alive
from .retention_leases import check_lease
from .records import ROW_COLUMNS, decode_upper, encode_upper, partition_from_row
from .retry import retried
from .store import Store
from .store_common import clock
from .topics import topic_names
from ..errors import CatalogError, Fenced, SubscriptionExpired, SubscriptionHeld, TopicNotFound
from ..order import by_name
from ..retention import SegmentStat

__all__ = ["HISTORY_DDL", "STORE_COLUMNS", "HistoryTables", "EpochRecord", "HistoryState",
           "DurableInfo", "encode_time", "decode_time", "position_available"]

_SEGMENT_COLUMNS = "seq, nbytes, epochs, last_completed, object, object_bytes"
_EPOCH_SELECT = ("SELECT e.time, e.seq, e.extents, e.nbytes, e.messages, e.crc, e.completed_at, "
                 "s.object, s.object_bytes FROM history_epochs e LEFT JOIN history_segments s "
                 "ON s.topic = e.topic AND s.idx = e.idx AND s.seq = e.seq")


def _epoch(partition: int, r) -> EpochRecord:
    """The :class:`EpochRecord` of one row of :data:`_EPOCH_SELECT`: its ``object`` only if
    the object holds every extent of the epoch."""
    extents = tuple(tuple(x) for x in json.loads(r[2]))
    end = max((o + n for o, n in extents), default=0)
    obj = r[7] if r[7] is not None and r[8] is not None and end <= r[8] else None
    return EpochRecord(partition, decode_time(r[0]), r[1], extents, r[3], r[4], r[5], r[6], obj)


def _t0(t: Any) -> int:
    return t[0] if isinstance(t, tuple) else t


_EPOCH_COLUMNS = (("topic", "TEXT"), ("idx", "INTEGER"), ("time", "TEXT"), ("t0", "INTEGER"),
                  ("seq", "INTEGER"), ("extents", "TEXT"), ("nbytes", "INTEGER"),
                  ("messages", "INTEGER"), ("crc", "INTEGER"), ("completed_at", "REAL"))
"""The columns of an ``history_epochs`` row as :meth:`HistoryTables.history_commit` inserts
it, with their types in :data:`HISTORY_DDL`."""

_DURABLE_COLUMNS = ("topic, name, position, acked, state, holder, holder_pid, holder_pid_start, "
                    "holder_host, created_at, acked_at, reason, holder_lease, holder_seen")


def _durable(row, now: float | None = None) -> DurableInfo:
    """The :class:`DurableInfo` of one row; its holder's lease judged at ``now`` (catalog's clock)."""
    (topic, name, position, acked, state, holder, pid, pid_start, host, created, acked_at,
     reason, lease, seen) = row
    alive = holder is not None and holder_alive(pid, pid_start, host, lease, seen, now)
    return DurableInfo(topic, name, None if position is None else decode_upper(position),
                       decode_upper(acked), state, holder, alive, pid, host, created, acked_at,
                       reason)


def _check_writer(conn, topic: str, partition: int, incarnation: str, strict=False) -> None:
    """In a write transaction: Fenced if another incarnation holds it live (``strict``: at all)."""
    row = conn.execute(f"SELECT {ROW_COLUMNS}, epoch_now() FROM partitions WHERE topic = ? "
                       f"AND idx = ?", (topic, partition)).fetchone()
    if row is None or row[4] == incarnation:  # (column 4: incarnation) the writer holds it
        return
    holder = partition_from_row(row[:-1], float(row[-1]))
    if holder.state == "live" or strict:
        raise Fenced(f"partition {partition} of topic {topic!r} is held by incarnation "
                     f"{holder.incarnation} (generation {holder.generation}, pid {holder.pid} on "
                     f"{holder.host}) now: the epoch log index commit of incarnation "
                     f"{incarnation} is refused", topic=topic, partition=partition,
                     incarnation=incarnation)


class HistoryTables:
    """Index of the epoch logs and durable subscriptions in ``store`` (see the module docstring
    for the tables): the operations of :class:`~epochstream.catalog.api.Catalog` on them, with
    its arguments, results and errors, each retried (:func:`~epochstream.catalog.retry.retried`).
    ``groups`` (:class:`~epochstream.catalog.groups.GroupTables`): whose groups
    :meth:`history_trim` stops. Raises :class:`~epochstream.errors.CatalogError` when the store
    cannot be read or written."""

    def __init__(self, store: Store, groups: GroupTables):
        self._store = store
        self._groups = groups

    # ---- the log index

    def _history_state(self, conn, topic: str, partition: int) -> HistoryState | None:
        row = conn.execute(
            "SELECT dir, since, lower, upper, segment, committed, updated_at, store "
            "FROM history_partitions WHERE topic = ? AND idx = ?", (topic, partition)).fetchone()
        if row is None:
            return None
        segs = conn.execute(
            f"SELECT {_SEGMENT_COLUMNS} FROM history_segments "
            f"WHERE topic = ? AND idx = ? ORDER BY seq", (topic, partition)).fetchall()
        return HistoryState(partition, row[0], decode_upper(row[1]), decode_upper(row[2]),
                            decode_upper(row[3]), row[4], row[5],
                            tuple(SegmentStat(*s) for s in segs), row[6], row[7])

    @retried
    def history_state(self, topic: str, partition: int) -> HistoryState | None:
        with self._store.read() as conn:
            return self._history_state(conn, topic, partition)

    @retried
    def history_states(self, topic: str) -> dict[int, HistoryState]:
        with self._store.snapshot() as conn:  # two statements, whatever the partitions
            rows = conn.execute(
                "SELECT idx, dir, since, lower, upper, segment, committed, updated_at, store "
                "FROM history_partitions WHERE topic = ? ORDER BY idx", (topic,)).fetchall()
            segs: dict[int, list] = {}
            for r in conn.execute(f"SELECT idx, {_SEGMENT_COLUMNS} FROM history_segments "
                                  f"WHERE topic = ? ORDER BY idx, seq", (topic,)).fetchall():
                segs.setdefault(r[0], []).append(SegmentStat(*r[1:]))
        return {r[0]: HistoryState(r[0], r[1], decode_upper(r[2]), decode_upper(r[3]),
                                   decode_upper(r[4]), r[5], r[6], tuple(segs.get(r[0], ())),
                                   r[7], r[8]) for r in rows}

    @retried
    def history_begin(self, topic: str, partition: int, directory: str, lower: Any,
                      upper: Any, store: str | None = None) -> HistoryState:
        directory = os.path.abspath(directory)
        with self._store.write() as conn:
            state = self._history_state(conn, topic, partition)
            if state is None:
                now = time.time()
                low = encode_upper(lower)
                conn.execute(
                    "INSERT INTO history_partitions (topic, idx, dir, since, lower, upper, "
                    "segment, committed, updated_at, store) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?)",
                    (topic, partition, directory, low, low, encode_upper(upper), now, store))
                conn.execute("INSERT INTO history_segments (topic, idx, seq, since, created_at) "
                             "VALUES (?, ?, 0, ?, ?)", (topic, partition, low, now))
                state = self._history_state(conn, topic, partition)
            elif os.path.abspath(state.dir) != directory and (store is None
                                                              or store != state.store):
                raise CatalogError(
                    f"partition {partition} of topic {topic!r} keeps its log in {state.dir}, "
                    f"not {directory}; use the same Retention(dir=...) (or drop the topic)")
            elif os.path.abspath(state.dir) != directory:  # the same store: the log moves
                conn.execute("UPDATE history_partitions SET dir = ? WHERE topic = ? AND idx = ?",
                             (directory, topic, partition))
                state = self._history_state(conn, topic, partition)
            elif store is not None and state.store != store:
                if state.store is not None and any(g.object for g in state.segments):
                    raise CatalogError(
                        f"partition {partition} of topic {topic!r} keeps its sealed segments in "
                        f"the store {state.store}, not {store}; use the same "
                        f"Retention(store=...) (or drop the topic)")
                conn.execute("UPDATE history_partitions SET store = ? WHERE topic = ? AND "
                             "idx = ?", (store, topic, partition))
                state = self._history_state(conn, topic, partition)
            return state

    @retried
    def history_uploaded(self, topic: str, partition: int, segment: int, name: str,
                         nbytes: int, incarnation: str | None = None) -> tuple[bool, str | None]:
        with self._store.write() as conn:
            if incarnation is not None:  # (a chain: only a registered writer's commit has one)
                _check_writer(conn, topic, partition, incarnation, name.startswith("tails:"))
            row = conn.execute("SELECT object, object_bytes, nbytes FROM history_segments "
                               "WHERE topic = ? AND idx = ? AND seq = ?",
                               (topic, partition, segment)).fetchone()
            if row is None:
                return False, None  # trimmed
            chain, plain = name.startswith("tails:"), row[0] and row[0][:6] != "tails:"
            # a chain replaces a chain (a successor drops the tails beyond the committed
            # bytes); a whole object replaces a chain holding as many bytes
            held = row[1] is not None and (row[1] >= nbytes if plain else
                                           not chain and row[1] > nbytes)
            if (nbytes > row[2] and not chain) or held:
                return False, row[0]  # fewer bytes committed, or one as long is in
            conn.execute("UPDATE history_segments SET object = ?, object_bytes = ? WHERE "
                         "topic = ? AND idx = ? AND seq = ?",
                         (name, nbytes, topic, partition, segment))
            return True, row[0]

    @retried
    def history_commit(self, topic: str, partition: int, *, epochs: list[EpochRecord],
                       lower: Any, upper: Any, segment: int, committed: int,
                       roll_to: int | None = None, durable: bool = True,
                       incarnation: str | None = None) -> None:
        now = time.time()
        rows = [(topic, partition, encode_time(e.time), _t0(e.time), e.segment,
                 json.dumps(e.extents), e.nbytes, e.messages, e.crc, e.completed_at)
                for e in epochs]
        low = encode_upper(lower)
        with self._store.hot_write("FULL" if durable else "NORMAL") as conn:
            if incarnation is not None:
                _check_writer(conn, topic, partition, incarnation, strict=True)
            if rows:
                # an epoch indexed already is this commit retried after its answer was lost
                # (an epoch is logged once): it is neither written nor counted again
                added = self._store.insert_new(conn, "history_epochs", _EPOCH_COLUMNS,
                                               "topic, idx, time", rows)
            else:
                added = 0
            conn.execute(
                "UPDATE history_segments SET nbytes = ?, epochs = epochs + ?, last_completed = "
                "CASE WHEN ? > 0 THEN ? ELSE last_completed END "
                "WHERE topic = ? AND idx = ? AND seq = ?",
                (committed, added, added, now, topic, partition, segment))
            if roll_to is not None:
                conn.execute("INSERT INTO history_segments (topic, idx, seq, since, created_at) "
                             "VALUES (?, ?, ?, ?, ?) ON CONFLICT (topic, idx, seq) DO UPDATE "
                             "SET since = excluded.since, created_at = excluded.created_at, "
                             "nbytes = 0, epochs = 0, last_completed = NULL",
                             (topic, partition, roll_to, low, now))
            cur = conn.execute(
                "UPDATE history_partitions SET lower = ?, upper = ?, segment = ?, committed = ?, "
                "updated_at = ? WHERE topic = ? AND idx = ?",
                (low, encode_upper(upper), segment if roll_to is None else roll_to,
                 committed if roll_to is None else 0, now, topic, partition))
            if cur.rowcount == 0:  # (rolled back: nothing of this commit stays)
                raise CatalogError(f"{topic!r} partition {partition}: the catalog no longer "
                                   f"has its epoch log (the topic was dropped)")

    @retried
    def history_trim(self, topic: str, partition: int, keep_from: int,
                     holder: str | None = None) -> tuple[tuple, list[str]]:
        with self._store.write() as conn:
            if holder is not None:  # (Fenced: nothing deleted)
                check_lease(conn, topic, partition, holder)
            row = conn.execute("SELECT since FROM history_segments WHERE topic = ? AND idx = ? "
                               "AND seq = ?", (topic, partition, keep_from)).fetchone()
            if row is None:
                raise CatalogError(f"{topic!r} partition {partition}: no segment {keep_from}")
            conn.execute("DELETE FROM history_epochs WHERE topic = ? AND idx = ? AND seq < ?",
                         (topic, partition, keep_from))
            conn.execute("DELETE FROM history_segments WHERE topic = ? AND idx = ? AND seq < ?",
                         (topic, partition, keep_from))
            conn.execute("UPDATE history_partitions SET since = ? WHERE topic = ? AND idx = ?",
                         (row[0], topic, partition))
            since = decode_upper(row[0])
            order = by_name(conn.execute("SELECT order_name FROM topics WHERE name = ?",
                                         (topic,)).fetchone()[0])
            reason = (f"retention of partition {partition} deleted epochs at or beyond its "
                      f"position (retained since {list(since)})")
            expired = []
            for name, position in conn.execute(
                    "SELECT name, position FROM durables WHERE topic = ? AND state = 'active' "
                    "AND position IS NOT NULL", (topic,)).fetchall():
                if not position_available(order, decode_upper(position), since):
                    expired.append(name)
                    conn.execute("UPDATE durables SET state = 'expired', reason = ? WHERE "
                                 "topic = ? AND name = ?", (reason, topic, name))
            expired += self._groups.stop_behind(conn, topic, order, since, reason)
            return since, expired

    @retried
    def history_epochs(self, topic: str, partition: int, *, min_t0: int | None = None,
                       segment_from: int | None = None, after: Any = None,
                       limit: int | None = None) -> list[EpochRecord]:
        sql = _EPOCH_SELECT + " WHERE e.topic = ? AND e.idx = ?"
        args: list = [topic, partition]
        if after is not None:  # the rows after it in the order below (t0, then the stored text)
            after = tuple(after) if isinstance(after, list) else after
            if not all(type(x) is int for x in (after if isinstance(after, tuple) and after
                                                else (after,))):
                raise CatalogError(f"history_epochs: after must be a time, got {after!r}")
            sql += " AND (e.t0 > ? OR e.time > ?)"
            args += [_t0(after), encode_time(after)]
            min_t0 = _t0(after) if min_t0 is None else max(min_t0, _t0(after))
        if min_t0 is not None:  # (one lower bound: the index's range starts there)
            sql += " AND e.t0 >= ?"
            args.append(min_t0)
        if segment_from is not None:
            sql += " AND e.seq >= ?"
            args.append(segment_from)
        sql += " ORDER BY e.t0, e.time"
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise CatalogError(f"history_epochs: limit must be a positive int, got {limit!r}")
            sql += f" LIMIT {limit}"
        with self._store.read() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [_epoch(partition, r) for r in rows]

    @retried
    def history_epoch(self, topic: str, partition: int, time: Any) -> EpochRecord | None:
        with self._store.read() as conn:
            r = conn.execute(_EPOCH_SELECT + " WHERE e.topic = ? AND e.idx = ? AND e.time = ?",
                             (topic, partition, encode_time(time))).fetchone()
        return None if r is None else _epoch(partition, r)

    # ---- durable subscriptions

    @retried
    def durables(self, topic: str | None = None) -> list[DurableInfo]:
        with self._store.read() as conn:
            if topic is None:
                rows = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables "
                                    f"ORDER BY topic, name").fetchall()
            else:
                rows = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables WHERE topic = ? "
                                    f"ORDER BY name", (topic,)).fetchall()
            now = clock(conn)
        return [_durable(r, now) for r in rows]

    @retried
    def durable(self, topic: str, name: str) -> DurableInfo | None:
        with self._store.read() as conn:
            row = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables WHERE topic = ? AND "
                               f"name = ?", (topic, name)).fetchone()
            now = clock(conn)
        return None if row is None else _durable(row, now)

    @retried
    def durable_claim(self, topic: str, name: str, holder: str, *,
                      takeover: bool = False, pid: int | None = None,
                      pid_start: float | None = None, host: str | None = None,
                      lease: float | None = None) -> DurableInfo:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise CatalogError(f"a durable subscription name must be a non-empty str of at "
                               f"most 200 characters, got {name!r}")
        pid, pid_start, host, lease = check_holder(pid, pid_start, host, lease)
        with self._store.write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                raise TopicNotFound(topic, topic_names(conn))
            row = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables WHERE topic = ? AND "
                               f"name = ?", (topic, name)).fetchone()
            now = clock(conn)  # leases are stamped and judged on the catalog's clock
            if row is None:
                conn.execute(
                    "INSERT INTO durables (topic, name, position, state, holder, holder_pid, "
                    "holder_pid_start, holder_host, created_at, holder_lease, holder_seen) "
                    "VALUES (?, ?, NULL, 'active', ?, ?, ?, ?, ?, ?, ?)",
                    (topic, name, holder, pid, pid_start, host, now, lease, now))
            else:
                info = _durable(row, now)
                if info.state == "expired":
                    retained = self._retained_since(conn, topic)
                    raise SubscriptionExpired(
                        f"durable subscription {name!r} of topic {topic!r} expired: "
                        f"{info.reason}; retained now: epochs from {list(retained)} on; reset it "
                        f"(epochstream durable reset {topic} {name}) to go on from what is "
                        f"retained", name=name, acked=info.position or (), retained=retained)
                if (info.holder not in (None, holder) and info.holder_alive and not takeover):
                    raise SubscriptionHeld(
                        f"durable subscription {name!r} of topic {topic!r} is held by a live "
                        f"subscriber (pid {info.holder_pid} on {info.holder_host}); pass "
                        f"takeover=True to take it over")
                conn.execute(
                    "UPDATE durables SET holder = ?, holder_pid = ?, holder_pid_start = ?, "
                    "holder_host = ?, holder_lease = ?, holder_seen = ? WHERE topic = ? AND "
                    "name = ?", (holder, pid, pid_start, host, lease, now, topic, name))
            row = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables WHERE topic = ? AND "
                               f"name = ?", (topic, name)).fetchone()
            return _durable(row, now)

    @staticmethod
    def _retained_since(conn, topic: str) -> tuple:
        """The earliest position all of ``topic``'s logs retain: the join of their ``since``."""
        from ..frontier import join
        row = conn.execute("SELECT order_name FROM topics WHERE name = ?", (topic,)).fetchone()
        order = by_name(row[0])
        out: tuple = (order.minimum,)
        for (since,) in conn.execute("SELECT since FROM history_partitions WHERE topic = ?",
                                     (topic,)):
            out = join(order, out, decode_upper(since))
        return out

    @retried
    def durable_ack(self, topic: str, name: str, holder: str, position: Any,
                    acked: Any = ()) -> bool:
        text = encode_upper(position)
        now = time.time()
        with self._store.hot_write("FULL") as conn:  # an ack: the consumer's hot path
            cur = conn.execute(
                "UPDATE durables SET position = ?, acked = ?, acked_at = ?, "
                "holder_seen = epoch_now() WHERE topic = ? AND name = ? AND holder = ? "
                "AND state = 'active'", (text, encode_upper(acked), now, topic, name, holder))
            return cur.rowcount > 0

    @retried
    def durable_release(self, topic: str, name: str, holder: str) -> None:
        with self._store.write() as conn:
            conn.execute("UPDATE durables SET holder = NULL, holder_pid = NULL, holder_lease = "
                         "NULL WHERE topic = ? AND name = ? AND holder = ?", (topic, name, holder))

    @retried
    def durable_renew(self, topic: str, name: str, holder: str) -> bool:
        with self._store.write("NORMAL") as conn:
            cur = conn.execute("UPDATE durables SET holder_seen = epoch_now() WHERE topic = ? "
                               "AND name = ? AND holder = ?", (topic, name, holder))
            return cur.rowcount > 0

    @retried
    def durable_reset(self, topic: str, name: str, position: Any | None) -> DurableInfo:
        text = None if position is None else encode_upper(position)
        with self._store.write() as conn:
            cur = conn.execute(
                "UPDATE durables SET position = ?, acked = '[]', state = 'active', reason = NULL, "
                "holder = NULL, holder_pid = NULL, acked_at = NULL WHERE topic = ? AND name = ?",
                (text, topic, name))
            if cur.rowcount == 0:
                raise CatalogError(f"topic {topic!r} has no durable subscription {name!r}")
            row = conn.execute(f"SELECT {_DURABLE_COLUMNS} FROM durables WHERE topic = ? AND "
                               f"name = ?", (topic, name)).fetchone()
            return _durable(row)

    @retried
    def durable_drop(self, topic: str, name: str) -> bool:
        with self._store.write() as conn:
            cur = conn.execute("DELETE FROM durables WHERE topic = ? AND name = ?", (topic, name))
            return cur.rowcount > 0
