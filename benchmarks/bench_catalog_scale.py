"""Case ``catalog_scale``: durable subscriptions and consumer groups 1 → 100,000 in the catalog,
on SQLite and PostgreSQL — what an ack and a lookup cost against how many there are (issue 28).

One catalog per store (a fresh SQLite file; a throwaway PostgreSQL 15 server from
:mod:`epochstream.testing.postgres`, ``fsync=off``, its default), both open at once and measured
alternately at each count (seconds apart, under the same load). The counts grow in place:
rows are added in bulk (one ``executemany`` in one write transaction, straight into the
``durables``, ``groups`` and ``group_epochs`` tables — creating 100,000 through the API, one
committed transaction each, would take most of an hour) until there are N durable subscriptions
and N groups on the topic, then every operation is timed at that N:

- ``durable_ack`` — ``Catalog.durable_ack(topic, name, holder, [e])`` on a random existing
  subscription held by ``holder`` (the consumer's hot path: a write transaction);
- ``durable_lookup`` — ``Catalog.durable(topic, name)``;
- ``durable_resume`` — ``Catalog.durable_claim`` of an existing subscription by its holder (what
  a restarted durable subscriber does);
- ``group_lookup`` — ``Catalog.group_info(topic, name)``;
- ``group_ack`` — ``Catalog.group_settle(topic, name, unit, token, outcome="ack")`` of a unit
  leased (in the bulk insert) to a worker, in a random group whose unit is not acked yet (one
  compare-and-set); once all are acked they are leased again (one ``UPDATE``, not timed).

After each growth the store is let settle as it would in steady state (PostgreSQL: ``ANALYZE``
of the three tables, as autovacuum does after many inserts; SQLite: a WAL checkpoint). Each
operation then runs for ``seconds`` in all (time-based, on random names), in ``ROUNDS`` rounds
interleaved with the other operations; reported: the median of the rounds' median latencies,
the p99, and the client process's CPU per call (on SQLite the store runs in the client, so a
scan shows there even when the disk's ``fsync`` latency — shared with other work on this
machine — hides it in the wall time). The growth stated is that of the median latency and of
the CPU per call against N; a linear scan would show as linear growth. On PostgreSQL also the
server's own execution time of the hot statements (``EXPLAIN ANALYZE``, median of 40 random
names) at each count, and at the largest count the plans of both stores (index or scan).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time

from . import curves

TOPIC = "scale"
HOLDER = "bench-holder"
ROUNDS = 3
OPS = ("durable_ack", "durable_lookup", "durable_resume", "group_lookup", "group_ack")


def plan(quick: bool) -> dict:
    if quick:
        return {"stores": ("sqlite",), "counts": (1, 100, 10_000), "seconds": 0.25}
    return {"stores": ("sqlite", "postgresql"), "counts": (1, 10, 100, 1000, 10_000, 100_000),
            "seconds": 1.0}


def _grow(cat, have: int, want: int, leased: list) -> None:
    """Bulk-add durables and groups ``have .. want-1``, each group with one unit (epoch 0)
    leased to a worker; the units go to ``leased`` as group numbers."""
    from epochstream.catalog.history_records import encode_time
    now = time.time()
    far = now + 86_400
    durs = [(TOPIC, f"d{i:06d}", None, "[]", "active", HOLDER, None, None, None, now)
            for i in range(have, want)]
    groups = [(TOPIC, f"g{i:06d}", "shared", 3600.0, 5, None, None, 2, "active", None, now)
              for i in range(have, want)]
    units = [(TOPIC, f"g{i:06d}", encode_time(0), -1, "leased", 1, 1, "w", far, 0.0, "[]")
             for i in range(have, want)]
    with cat._store.write() as conn:
        conn.executemany("INSERT INTO durables (topic, name, position, acked, state, holder, holder_pid, "
                         "holder_pid_start, holder_host, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", durs)
        conn.executemany("INSERT INTO groups (topic, name, mode, ack_wait, max_deliver, dead_letter, position, "
                         "next_token, state, reason, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", groups)
        conn.executemany("INSERT INTO group_epochs (topic, name, time, bucket, state, deliveries, token, worker, "
                         "deadline, not_before, history) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", units)
    leased += list(range(have, want))


def _relet(cat, n: int, leased: list) -> None:
    """Every unit acked: lease them all again (outside the timed calls)."""
    with cat._store.write() as conn:
        conn.execute("UPDATE group_epochs SET state = 'leased', deadline = ? WHERE topic = ?",
                     (time.time() + 86_400, TOPIC))
    leased[:] = range(n)


def _ops(cat, n: int, leased: list):
    rnd = random.Random(n)
    pick = rnd.randrange
    e = [0]

    def durable_ack():
        e[0] += 1
        cat.durable_ack(TOPIC, f"d{pick(n):06d}", HOLDER, [e[0]])

    def durable_lookup():
        cat.durable(TOPIC, f"d{pick(n):06d}")

    def durable_resume():
        cat.durable_claim(TOPIC, f"d{pick(n):06d}", HOLDER)

    def group_lookup():
        cat.group_info(TOPIC, f"g{pick(n):06d}")

    def group_ack():
        if not leased:
            return False  # _time_op lets _relet lease them again, untimed
        k = pick(len(leased))
        leased[k], leased[-1] = leased[-1], leased[k]
        cat.group_settle(TOPIC, f"g{leased.pop():06d}", (0, -1), 1, outcome="ack")
    return {"durable_ack": durable_ack, "durable_lookup": durable_lookup,
            "durable_resume": durable_resume, "group_lookup": group_lookup, "group_ack": group_ack}


def _time_op(fn, seconds: float, refill=None) -> dict:
    lat = []
    t_end = time.monotonic() + seconds
    cpu = 0.0
    while time.monotonic() < t_end:
        c, t = time.process_time(), time.perf_counter()
        if fn() is False:
            if refill is None:
                break
            refill()
            t_end += time.monotonic() - t  # the refill is not the operation's time
            continue
        lat.append(time.perf_counter() - t)
        cpu += time.process_time() - c
    lat.sort()
    if not lat:
        return {"calls": 0}
    return {"calls": len(lat), "median_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
            "client_cpu_us_per_call": cpu / len(lat) * 1e6}


def _merge(rounds: list) -> dict:
    """One operation's rounds: the median of their medians, p99 and CPU per call over all."""
    ok = [x for x in rounds if x.get("calls")]
    if not ok:
        return {"calls": 0}
    med = sorted(x["median_us"] for x in ok)
    calls = sum(x["calls"] for x in ok)
    return {"calls": calls, "median_us": med[len(med) // 2], "round_medians_us": [x["median_us"] for x in ok],
            "p99_us": max(x["p99_us"] for x in ok),
            "client_cpu_us_per_call": sum(x["client_cpu_us_per_call"] * x["calls"] for x in ok) / calls}


def _settle(cat, store: str) -> None:
    """After a bulk growth, what the store does on its own in steady state: PostgreSQL's
    autovacuum ``ANALYZE`` (fresh planner statistics), SQLite's WAL checkpoint."""
    with cat._store.write() as conn:
        if store == "postgresql":
            for table in ("durables", "groups", "group_epochs"):
                conn.execute(f"ANALYZE {table}")
    if store == "sqlite":
        import sqlite3
        c = sqlite3.connect(cat._store.where)
        try:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            c.close()


PLANNED = {
    "durable lookup": "SELECT position FROM durables WHERE topic = ? AND name = ?",
    "durable ack": "UPDATE durables SET position = '[]' WHERE topic = ? AND name = ? AND holder = 'x' AND state = 'active'",
    "group ack": "UPDATE group_epochs SET state = 'acked' WHERE topic = ? AND name = ? AND time = '0' AND bucket = -1 "
                 "AND state = 'leased' AND token = 1",
    "group units": "SELECT time, bucket, state FROM group_epochs WHERE topic = ? AND name = ? ORDER BY time, bucket",
}


def _server_times(cat, n: int, samples: int = 40) -> dict:
    """PostgreSQL only: the server's own execution time (``EXPLAIN ANALYZE``) of the hot
    statements on random names, median µs — the store's work without the client, the socket
    and the scheduling of this busy machine."""
    rnd = random.Random(n + 1)
    out = {}
    for what, sql in PLANNED.items():
        times = []
        with cat._store.write() as conn:  # rolled back below: the updates change nothing
            for _ in range(samples):
                name = ("d" if what.startswith("durable") else "g") + f"{rnd.randrange(n):06d}"
                plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, (TOPIC, name)).fetchone()[0]
                plan = plan[0] if isinstance(plan, list) else plan
                times.append(float(plan["Execution Time"]) * 1e3)
            conn.execute("ROLLBACK")
            conn.execute("BEGIN")
        times.sort()
        out[what] = times[len(times) // 2]
    return out


def _plans(cat, store: str, n: int) -> dict:
    """The query plans of the hot statements at the largest count (an index, or a scan), in a
    transaction that is rolled back."""
    out = {}
    explain = "EXPLAIN QUERY PLAN " if store == "sqlite" else "EXPLAIN "
    for what, sql in PLANNED.items():
        name = ("d" if what.startswith("durable") else "g") + f"{n // 2:06d}"
        try:
            with cat._store.read() as conn:
                rows = conn.execute(explain + sql, (TOPIC, name)).fetchall()
            out[what] = [" ".join(str(c) for c in r) for r in rows]
        except Exception as exc:
            out[what] = [f"{type(exc).__name__}: {exc}"]
    return out


class _Store:
    """One store's catalog, grown in place: ``measure(n)`` grows it to ``n`` and times every
    operation (a row)."""

    def __init__(self, store: str, tmp: str):
        from epochstream import Catalog
        self.store, self.pg = store, None
        if store == "sqlite":
            location = os.path.join(tmp, "catalog.db")
        else:
            from epochstream.testing.postgres import PostgresServer
            self.pg = PostgresServer()
            location = self.pg.create_database("catscale")
        self.cat = Catalog(location)
        self.cat.create_topic(TOPIC, order="total", codec="msgpack", partitions=1)
        self.have, self.leased = 0, []

    def measure(self, n: int, seconds: float) -> dict:
        cat, leased = self.cat, self.leased
        t0 = time.monotonic()
        _grow(cat, self.have, n, leased)
        grow_s = time.monotonic() - t0
        self.have = n
        _settle(cat, self.store)
        ops = _ops(cat, n, leased)
        row = {"store": self.store, "count": n, "grow_s": grow_s, "loadavg": curves.loadavg()}
        rounds = {op: [] for op in OPS}
        for _ in range(ROUNDS):  # the operations interleaved, so a burst of disk load hits all
            for op in OPS:
                rounds[op].append(_time_op(ops[op], seconds / ROUNDS, (lambda: _relet(cat, n, leased))
                                           if op == "group_ack" else None))
        for op in OPS:
            row[op] = _merge(rounds[op])
        if self.store == "postgresql":
            row["server_execution_us"] = _server_times(cat, n)
        return row

    def close(self) -> None:
        try:
            self.cat.close()
        finally:
            if self.pg is not None:
                self.pg.close()


def _rows(stores, counts, seconds: float, log, errors: dict) -> list[dict]:
    """Every store grown and measured count by count, the stores alternating at each count
    (seconds apart, under the same load)."""
    tmp = tempfile.mkdtemp(prefix="es-catscale-")
    opened, rows = {}, []
    try:
        for store in stores:
            try:
                opened[store] = _Store(store, tmp)
            except Exception as exc:
                errors[store] = f"{type(exc).__name__}: {exc}"[:1000]
                log(f"  catalog_scale {store}: FAILED {errors[store]}")
        for n in counts:
            for store, st in opened.items():
                if store in errors:
                    continue
                try:
                    row = st.measure(n, seconds)
                except Exception as exc:
                    errors[store] = f"{type(exc).__name__}: {exc}"[:1000]
                    log(f"  catalog_scale {store}: FAILED {errors[store]}")
                    continue
                rows.append(row)
                log(f"  catalog_scale {store:10s} N={n:6d}: " + ", ".join(
                    f"{op} {row[op].get('median_us', 0):.0f} µs" for op in OPS) + f" (grew in {row['grow_s']:.1f} s)")
        for store, st in opened.items():
            last = [r for r in rows if r["store"] == store]
            if last:
                last[-1]["plans"] = _plans(st.cat, store, st.have)
    finally:
        for st in opened.values():
            st.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def summarise(rows, stores) -> dict:
    summary = {}
    for store in stores:
        sel = [r for r in rows if r["store"] == store]
        for op in OPS:
            summary[f"{store}.{op}"] = curves.fit([r["count"] for r in sel],
                                                  [r[op].get("median_us") for r in sel])
            summary[f"{store}.{op}.cpu"] = curves.fit([r["count"] for r in sel],
                                                      [r[op].get("client_cpu_us_per_call") for r in sel])
    pg = [r for r in rows if r.get("server_execution_us")]
    for what in PLANNED:
        summary[f"postgresql.server.{what}"] = curves.fit([r["count"] for r in pg],
                                                          [r["server_execution_us"].get(what) for r in pg])
    return summary


def run(quick: bool = False, log=print, stores=None, counts=None, seconds=None) -> dict:
    p = plan(quick)
    if stores is not None:
        p["stores"] = tuple(stores)
    if counts is not None:
        p["counts"] = tuple(counts)
    if seconds is not None:
        p["seconds"] = float(seconds)
    t0 = time.monotonic()
    errors: dict = {}
    rows = _rows(p["stores"], p["counts"], p["seconds"], log, errors)
    summary = summarise(rows, p["stores"])
    return {"quick": quick, "plan": p, "rows": rows, "summary": summary, "errors": errors,
            "ok": not errors, "wall_s": round(time.monotonic() - t0, 1)}
