"""The catalog's part of consumer groups: :class:`GroupTables`, their tables, and the atomic
claims, acks and releases of leases. Workers in several processes coordinate through these
``BEGIN IMMEDIATE`` transactions, with no server: the decisions are the pure
:func:`~epochstream.leases.plan`; this module reads and writes the rows, on the store it is given
(:mod:`epochstream.catalog.store`). The values it hands out are
:mod:`epochstream.catalog.group_records`.

Tables (schema version 3)::

    groups        -- one row per consumer group
        topic, name, mode, ack_wait (seconds), max_deliver, dead_letter (a topic name or NULL),
        position (JSON frontier: every epoch not at or beyond it is acked or dead-lettered),
        next_token (the next lease's fencing token), state ('active' | 'stopped'),
        reason (why it stopped), created_at
    group_epochs  -- one row per unit the group has handed out (at or beyond its position): a
                  -- whole epoch (bucket -1) or, in key_shared mode, one bucket of an epoch
        topic, name, time (JSON), bucket, state ('free' | 'leased' | 'acked' | 'dead'), deliveries,
        token (of the current or last lease), worker (id of the leasing worker), worker_pid,
        worker_pid_start, worker_host, deadline (seconds since the epoch on the catalog's clock,
        ``epoch_now()``: the database server's on PostgreSQL), not_before (seconds, same clock),
        history (JSON list of [worker, catalog clock] per delivery)
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable

from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
from .history_records import decode_time, encode_time, position_available
from .holders import check_holder, pid_alive
from .records import decode_upper, encode_upper
from .retry import retried, retrying
from .store import Store
from .topics import topic_names
from ..errors import CatalogError, GroupStopped, LeaseExpired, TopicNotFound
from ..leases import EpochState, Plan

__all__ = ["GROUPS_DDL", "GroupTables", "GroupInfo", "Claimed", "ClaimView", "GroupEpoch"]

GROUPS_DDL = (
    """CREATE TABLE IF NOT EXISTS groups (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        name TEXT NOT NULL,
        mode TEXT NOT NULL,
        ack_wait REAL NOT NULL,
        max_deliver INTEGER NOT NULL,
        dead_letter TEXT,
        position TEXT,
        next_token INTEGER NOT NULL DEFAULT 1,
        state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'stopped')),
        reason TEXT,
        created_at REAL NOT NULL,
        PRIMARY KEY (topic, name))""",
    """CREATE TABLE IF NOT EXISTS group_epochs (
        topic TEXT NOT NULL,
        name TEXT NOT NULL,
        time TEXT NOT NULL,
        bucket INTEGER NOT NULL DEFAULT -1,
        state TEXT NOT NULL CHECK (state IN ('free', 'leased', 'acked', 'dead')),
        deliveries INTEGER NOT NULL DEFAULT 0,
        token INTEGER NOT NULL DEFAULT 0,
        worker TEXT,
        worker_pid INTEGER,
        worker_pid_start REAL,
        worker_host TEXT,
        deadline REAL NOT NULL DEFAULT 0,
        not_before REAL NOT NULL DEFAULT 0,
        history TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (topic, name, time, bucket),
        FOREIGN KEY (topic, name) REFERENCES groups(topic, name) ON DELETE CASCADE)""",
)


def _fingerprint(states: dict, stored: str | None) -> str:
    """A digest of a group's epoch states and stored position (text as stored)."""
    text = repr((sorted(states.items(), key=lambda kv: repr(kv[0])), stored))
    return hashlib.sha256(text.encode()).hexdigest()


_GROUP_COLUMNS = ("mode, ack_wait, max_deliver, dead_letter, position, state, reason, "
                  "acked_total, dead_total, redelivered_total, settled_at, created_at")


def _unit_time(t: Any) -> Any:
    """A unit's time as stored and read back (an int, or a tuple of ints); raises
    ``TypeError`` for anything else."""
    if isinstance(t, list):
        t = tuple(t)
    parts = t if isinstance(t, tuple) else (t,)
    if not parts or any(isinstance(x, bool) or not isinstance(x, int) for x in parts):
        raise TypeError(f"not a time: {t!r}")
    return decode_time(encode_time(t))


class GroupTables:
    """Consumer-group state in ``store``: the operations of
    :class:`~epochstream.catalog.api.Catalog` on it, with its arguments, results and errors, each
    retried (:func:`~epochstream.catalog.retry.retried`); and :meth:`stop_behind`, for a trim of
    the epoch logs (:class:`~epochstream.catalog.history.HistoryTables`). Claims and settlements
    run on the calling thread's long-lived connection (a worker's hot path: no connect/close per
    fetch or ack), each in one ``BEGIN IMMEDIATE`` transaction. Raises
    :class:`~epochstream.errors.CatalogError` when the store cannot be read or written."""

    def __init__(self, store: Store):
        self._store = store

    @retried
    def group_open(self, topic: str, name: str, *, mode: str, ack_wait: float,
                   max_deliver: int, dead_letter: str | None) -> GroupInfo:
        wanted = (mode, float(ack_wait), int(max_deliver), dead_letter)
        with self._store.write() as conn:
            if conn.execute("SELECT 1 FROM topics WHERE name = ?", (topic,)).fetchone() is None:
                raise TopicNotFound(topic, topic_names(conn))
            row = conn.execute("SELECT mode, ack_wait, max_deliver, dead_letter FROM groups "
                               "WHERE topic = ? AND name = ?", (topic, name)).fetchone()
            if row is None:
                conn.execute("INSERT INTO groups (topic, name, mode, ack_wait, max_deliver, "
                             "dead_letter, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (topic, name, *wanted, time.time()))
            elif tuple(row) != wanted:
                raise CatalogError(
                    f"consumer group {name!r} of topic {topic!r} exists with mode={row[0]!r}, "
                    f"ack_wait={row[1]}, max_deliver={row[2]}, dead_letter={row[3]!r}; "
                    f"requested mode={mode!r}, ack_wait={ack_wait}, max_deliver={max_deliver}, "
                    f"dead_letter={dead_letter!r} (drop the group to change it)")
            return self._group_info(conn, topic, name)

    def _group_info(self, conn, topic: str, name: str) -> GroupInfo:
        row = conn.execute(f"SELECT {_GROUP_COLUMNS} FROM groups WHERE topic = ? AND name = ?",
                           (topic, name)).fetchone()
        if row is None:
            raise CatalogError(f"topic {topic!r} has no consumer group {name!r}")
        (mode, ack_wait, max_deliver, dead_letter, position, state, reason, acked_total,
         dead_total, redelivered_total, settled_at, created_at) = row
        by_state: dict[str, list] = {"leased": [], "acked": [], "dead": []}
        for t, b, st, settled in conn.execute(
                "SELECT time, bucket, state, settled_at FROM group_epochs WHERE topic = ? AND "
                "name = ? ORDER BY time, bucket", (topic, name)):
            if st in by_state:
                by_state[st].append((decode_time(t), b))
            if settled is not None and (settled_at is None or settled > settled_at):
                settled_at = settled
        return GroupInfo(topic, name, mode, ack_wait, max_deliver, dead_letter,
                         None if position is None else decode_upper(position), state, reason,
                         tuple(by_state["leased"]), tuple(by_state["acked"]),
                         tuple(by_state["dead"]), acked_total + len(by_state["acked"]),
                         dead_total + len(by_state["dead"]), redelivered_total, settled_at,
                         created_at)

    @retried
    def group_info(self, topic: str, name: str) -> GroupInfo:
        with self._store.read() as conn:
            return self._group_info(conn, topic, name)

    @retried
    def groups(self, topic: str | None = None) -> list[GroupInfo]:
        with self._store.read() as conn:
            rows = conn.execute("SELECT topic, name FROM groups" + (
                " WHERE topic = ?" if topic is not None else "") + " ORDER BY topic, name",
                (topic,) if topic is not None else ()).fetchall()
            return [self._group_info(conn, t, n) for t, n in rows]

    @retried
    def group_drop(self, topic: str, name: str) -> bool:
        with self._store.write() as conn:
            conn.execute("DELETE FROM group_epochs WHERE topic = ? AND name = ?", (topic, name))
            cur = conn.execute("DELETE FROM groups WHERE topic = ? AND name = ?", (topic, name))
            return cur.rowcount > 0

    @staticmethod
    def _states(conn, topic: str, name: str, rows: dict | None = None) -> dict:
        """``{unit: EpochState}`` of the group's units (``rows``, if given, receives
        ``{unit: (token, history JSON, settled_at)}``: what a claim's compare-and-set expects,
        and what compacting a settled unit folds into the group's totals)."""
        out = {}
        for t, b, st, deliveries, deadline, not_before, pid, pid_start, host, token, history, \
                settled_at in conn.execute(
                "SELECT time, bucket, state, deliveries, deadline, not_before, worker_pid, "
                "worker_pid_start, worker_host, token, history, settled_at FROM group_epochs "
                "WHERE topic = ? AND name = ?", (topic, name)):
            alive = st != "leased" or pid is None or pid_alive(pid, pid_start, host)
            unit = (decode_time(t), b)
            out[unit] = EpochState(st, deliveries, deadline, not_before, alive)
            if rows is not None:
                rows[unit] = (token, history, settled_at)
        return out

    @retried
    def group_epochs(self, topic: str, name: str) -> list[GroupEpoch]:
        out = []
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT time, bucket, state, deliveries, token, worker, worker_pid, "
                "worker_pid_start, worker_host, deadline, not_before FROM group_epochs "
                "WHERE topic = ? AND name = ?", (topic, name)).fetchall()
        for (t, b, state, deliveries, token, worker, pid, pid_start, host, deadline,
             not_before) in rows:
            alive = state != "leased" or pid is None or pid_alive(pid, pid_start, host)
            out.append(GroupEpoch(decode_time(t), b, state, deliveries, token, worker, pid, host,
                                  alive, deadline, not_before))
        return out

    @staticmethod
    def _claim_start(conn, topic: str, name: str) -> tuple:
        """Inside a claim's transaction: ``(ack_wait, next_token, stored position text, now,
        the topic's order name)``
        (``now``: the catalog's clock, ``epoch_now()``: lease deadlines are the database
        server's time on PostgreSQL, whatever the workers' clocks say); raises
        :class:`CatalogError` (no such group) or :class:`GroupStopped`."""
        row = conn.execute("SELECT g.ack_wait, g.next_token, g.state, g.reason, g.position, "
                           "epoch_now(), t.order_name FROM groups g JOIN topics t ON "
                           "t.name = g.topic WHERE g.topic = ? AND g.name = ?",
                           (topic, name)).fetchone()
        if row is None:
            raise CatalogError(f"topic {topic!r} has no consumer group {name!r}")
        ack_wait, token, state, reason, stored, now, order_name = row
        if state == "stopped":
            raise GroupStopped(f"consumer group {name!r} of topic {topic!r} stopped: {reason}")
        return ack_wait, token, stored, float(now), order_name

    def group_claim(self, topic: str, name: str, worker: str, decide: Callable[[dict, float], Any],
                    ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        return self._group_claim(topic, name, worker, decide, [])

    @retried
    def _group_claim(self, topic: str, name: str, worker: str, decide: Callable, seen: list,
                     ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        """:meth:`group_claim`; ``seen`` keeps the group's next token as the first attempt read
        it: a retry after a commit whose answer was lost finds that attempt's leases by it and
        returns them (claiming anew would leave them leased to this worker unknowingly until
        their deadline)."""
        pid, pid_start, host, _ = check_holder(None, None, None, None)
        with self._store.hot_write("FULL") as conn:
            ack_wait, token, stored, now, order_name = self._claim_start(conn, topic, name)
            if seen and retrying() and token > seen[0]:
                found = self._leased_since(conn, topic, name, worker, seen[0], ack_wait)
                if found is not None:
                    return (*found, None if stored is None else decode_upper(stored))
            if not seen:
                seen.append(token)
            rows: dict = {}
            states = self._states(conn, topic, name, rows)
            the_plan, position = decide(states, now,
                                        None if stored is None else decode_upper(stored))
            claimed, exhausted = self._claim_apply(conn, topic, name, worker, states, rows,
                                                   the_plan, position, ack_wait, token, now,
                                                   (pid, pid_start, host), order_name)
            return claimed, exhausted, position

    @retried
    def group_claim_read(self, topic: str, name: str) -> ClaimView:
        with self._store.snapshot() as conn:
            _, _, stored, now, _ = self._claim_start(conn, topic, name)
            states = self._states(conn, topic, name)
        return ClaimView(tuple(states.items()), now,
                         None if stored is None else decode_upper(stored),
                         _fingerprint(states, stored))

    @retried
    def group_claim_apply(self, topic: str, name: str, worker: str, lease: Any, exhausted: Any,
                          position: Any, fingerprint: str, *, pid: int | None = None,
                          pid_start: float | None = None, host: str | None = None
                          ) -> tuple[list[Claimed], list[Claimed], tuple | None] | None:
        holder = check_holder(pid, pid_start, host, None)[:3]
        try:
            the_plan = Plan(tuple((_unit_time(u[0]), int(u[1])) for u in lease),
                            tuple((_unit_time(u[0]), int(u[1])) for u in exhausted))
        except (TypeError, ValueError, IndexError):
            raise CatalogError(f"lease and exhausted must be lists of units (time, bucket), got "
                               f"{lease!r} and {exhausted!r}") from None
        if position is not None:
            position = decode_upper(encode_upper(position))
        with self._store.hot_write("FULL") as conn:
            ack_wait, token, stored, now, order_name = self._claim_start(conn, topic, name)
            rows: dict = {}
            states = self._states(conn, topic, name, rows)
            if _fingerprint(states, stored) != fingerprint:
                return None
            claimed, exhausted_ = self._claim_apply(conn, topic, name, worker, states, rows,
                                                    the_plan, position, ack_wait, token, now,
                                                    holder, order_name)
            return claimed, exhausted_, position

    @staticmethod
    def _leased_since(conn, topic: str, name: str, worker: str, token: int,
                      ack_wait: float) -> tuple[list[Claimed], list[Claimed]] | None:
        """Inside a claim's transaction: the units ``worker`` holds under tokens from ``token``
        on, as ``(claimed, exhausted)`` (an exhausted unit's delivery was not counted: its last
        history entry is not this lease's), or ``None`` if it holds none."""
        rows = conn.execute(
            "SELECT time, bucket, deliveries, token, deadline, history FROM group_epochs WHERE "
            "topic = ? AND name = ? AND worker = ? AND token >= ? AND state = 'leased' "
            "ORDER BY token", (topic, name, worker, token)).fetchall()
        if not rows:
            return None
        claimed: list[Claimed] = []
        exhausted: list[Claimed] = []
        for t, b, deliveries, tok, deadline, hist in rows:
            history = tuple(tuple(h) for h in json.loads(hist))
            fresh = bool(history) and history[-1][0] == worker and \
                abs(history[-1][1] + ack_wait - deadline) < 1e-6
            (claimed if fresh else exhausted).append(
                Claimed((decode_time(t), b), tok, deliveries, deadline, history))
        return claimed, exhausted

    def _claim_apply(self, conn, topic: str, name: str, worker: str, states: dict, rows: dict,
                     the_plan, position, ack_wait: float, token: int, now: float,
                     holder: tuple, order_name: str) -> tuple[list[Claimed], list[Claimed]]:
        """Inside a claim's transaction: lease ``the_plan``'s units to ``worker`` (process
        ``holder`` = ``(pid, pid_start, host)``), store ``position`` (unless ``None``).

        Each unit's row is set only if it is still as the claim read it (``rows``: its token;
        a compare-and-set): an ack (``group_settle``, which takes no write lock on PostgreSQL)
        that landed after the read keeps its epoch acked, and the unit is not leased."""
        pid, pid_start, host = holder
        claimed, exhausted = [], []
        redelivered = 0  # units delivered again (the group's redelivered_total)
        for unit in (*the_plan.lease, *the_plan.exhausted):
            st = states.get(unit)
            fresh = unit not in the_plan.exhausted  # exhausted: leased to dead-letter it
            deliveries = (st.deliveries if st is not None else 0) + (1 if fresh else 0)
            key, bucket = encode_time(unit[0]), unit[1]
            expected, hist, _ = rows.get(unit, (None, None, None))
            history = json.loads(hist) if hist else []
            if fresh:
                history.append([worker, now])
            cur = conn.execute(
                "INSERT INTO group_epochs (topic, name, time, bucket, state, deliveries, token, "
                "worker, worker_pid, worker_pid_start, worker_host, deadline, not_before, "
                "history) VALUES (?, ?, ?, ?, 'leased', ?, ?, ?, ?, ?, ?, ?, 0, ?) "
                "ON CONFLICT (topic, name, time, bucket) DO UPDATE SET state = excluded.state, "
                "deliveries = excluded.deliveries, token = excluded.token, "
                "worker = excluded.worker, worker_pid = excluded.worker_pid, "
                "worker_pid_start = excluded.worker_pid_start, "
                "worker_host = excluded.worker_host, deadline = excluded.deadline, "
                "not_before = excluded.not_before, history = excluded.history "
                "WHERE group_epochs.token = ? AND group_epochs.state = ?",
                (topic, name, key, bucket, deliveries, token, worker, pid, pid_start,
                 host, now + ack_wait, json.dumps(history), expected,
                 st.state if st is not None else None))
            if cur.rowcount == 0:  # settled since the read (or a new row raced in): skip it
                continue
            (claimed if fresh else exhausted).append(Claimed(
                unit, token, deliveries, now + ack_wait, tuple(tuple(h) for h in history)))
            token += 1
            if fresh and deliveries > 1:
                redelivered += 1
        if position is None:
            conn.execute("UPDATE groups SET next_token = ?, redelivered_total = redelivered_total "
                         "+ ? WHERE topic = ? AND name = ?", (token, redelivered, topic, name))
        else:  # one statement for both
            conn.execute("UPDATE groups SET next_token = ?, redelivered_total = redelivered_total "
                         "+ ?, position = ? WHERE topic = ? AND name = ?",
                         (token, redelivered, encode_upper(position), topic, name))
            self._forget_behind(conn, topic, name, order_name, position, states, rows)
        return claimed, exhausted

    @staticmethod
    def _forget_behind(conn, topic: str, name: str, order_name: str, position,
                       states: dict, rows: dict) -> None:
        """Delete the settled (acked or dead) units behind the group's new ``position``,
        folding them into the group's totals (``acked_total``, ``dead_total``, ``settled_at``:
        the same transaction, so a reader of the totals plus the rows never counts one twice
        or misses one)."""
        from ..frontier import Antichain
        from ..order import by_name

        if not position:  # () forgets nothing: a stream that continues the log comes later
            return
        done = [u for u, st in states.items() if st.done()]
        if not done:
            return
        pos = Antichain(by_name(order_name), position)
        acked = dead = 0
        last = None
        for t, b in done:
            if not pos.less_equal(t):
                conn.execute("DELETE FROM group_epochs WHERE topic = ? AND name = ? AND "
                             "time = ? AND bucket = ?", (topic, name, encode_time(t), b))
                if states[(t, b)].state == "acked":
                    acked += 1
                else:
                    dead += 1
                settled = rows.get((t, b), (None, None, None))[2]
                if settled is not None and (last is None or settled > last):
                    last = settled
        if acked or dead:
            conn.execute("UPDATE groups SET acked_total = acked_total + ?, dead_total = "
                         "dead_total + ?, settled_at = CASE WHEN settled_at IS NULL OR "
                         "settled_at < ? THEN ? ELSE settled_at END WHERE topic = ? AND name = ?",
                         (acked, dead, last, last, topic, name))

    @retried
    def group_settle(self, topic: str, name: str, unit: tuple, token: int, *, outcome: str,
                     delay: float = 0.0) -> float:
        t, bucket = unit
        key = encode_time(t)
        args = (topic, name, key, bucket, token)
        held = ("topic = ? AND name = ? AND time = ? AND bucket = ? AND state = 'leased' AND "
                "token = ? AND deadline >= epoch_now()")
        # one compare-and-set of the lease's row (no write lock on PostgreSQL: a claim that
        # re-leases an expired unit meanwhile sets it only if the row is still what it read)
        with self._store.atomic("FULL") as conn:
            if outcome == "extend":
                row = conn.execute(
                    f"UPDATE group_epochs SET deadline = epoch_now() + (SELECT g.ack_wait FROM "
                    f"groups g WHERE g.topic = group_epochs.topic AND g.name = "
                    f"group_epochs.name) WHERE {held} RETURNING deadline", args).fetchone()
            else:
                new_state = {"ack": "acked", "dead": "dead", "nak": "free"}[outcome]
                row = conn.execute(
                    f"UPDATE group_epochs SET state = ?, not_before = CASE WHEN ? THEN "
                    f"epoch_now() + ? ELSE 0 END, deadline = 0, settled_at = epoch_now() "
                    f"WHERE {held} RETURNING settled_at",
                    (new_state, outcome == "nak", float(delay), *args)).fetchone()
        if row is not None:
            return float(row[0])
        with self._store.read() as conn:  # refused (or this settlement applied already): why
            row = conn.execute(
                "SELECT state, token, deadline, worker, epoch_now() FROM group_epochs WHERE "
                "topic = ? AND name = ? AND time = ? AND bucket = ?", args[:4]).fetchone()
        settled = {"ack": "acked", "dead": "dead", "nak": "free"}.get(outcome)
        if retrying() and row is not None and row[1] == token and row[0] == settled:
            return float(row[4])  # this settlement, retried after its commit's answer was lost
        what = f"epoch {t!r}" if bucket < 0 else f"bucket {bucket} of epoch {t!r}"
        why = ("the group forgot it (acked and compacted, or the group was dropped)"
               if row is None else
               f"it is {row[0]} now" if row[0] != "leased" and row[1] == token else
               f"it was leased again (token {row[1]}, worker {row[3]})"
               if row[1] != token else
               f"its deadline passed {float(row[4]) - row[2]:.3f} s ago")
        raise LeaseExpired(f"consumer group {name!r} of {topic!r}: the lease of {what} "
                           f"(token {token}) is no longer held: {why}; the {outcome} "
                           f"is refused")

    @staticmethod
    def stop_behind(conn: Any, topic: str, order: Any, since: tuple, reason: str) -> list[str]:
        """Inside a write transaction (a trim of one of ``topic``'s logs, which now retains the
        epochs at or beyond ``since``): stop every active group of ``topic`` whose position
        is no longer retained, with ``reason``; return their names as ``"group:<name>"``."""
        stopped = []
        for name, position in conn.execute(
                "SELECT name, position FROM groups WHERE topic = ? AND state = 'active' "
                "AND position IS NOT NULL", (topic,)).fetchall():
            if not position_available(order, decode_upper(position), since):
                stopped.append(f"group:{name}")
                conn.execute("UPDATE groups SET state = 'stopped', reason = ? WHERE topic = ? "
                             "AND name = ?", (reason, topic, name))
        return stopped

    @retried
    def group_stop(self, topic: str, name: str, reason: str) -> None:
        with self._store.write() as conn:
            conn.execute("UPDATE groups SET state = 'stopped', reason = ? WHERE topic = ? AND "
                         "name = ?", (reason, topic, name))

    @retried
    def group_reset(self, topic: str, name: str) -> None:
        with self._store.write() as conn:
            conn.execute("UPDATE groups SET state = 'active', reason = NULL WHERE topic = ? AND "
                         "name = ?", (topic, name))
            conn.execute("UPDATE group_epochs SET deliveries = 0 WHERE topic = ? AND name = ? "
                         "AND state = 'free'", (topic, name))
