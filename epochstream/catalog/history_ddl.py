"""The history tables' DDL (schema version 2, and the columns version 9 added): what
:class:`~epochstream.catalog.history.HistoryTables` reads and writes, described in
:mod:`epochstream.catalog.history` (importable from there too)."""

from __future__ import annotations

__all__ = ["HISTORY_DDL", "STORE_COLUMNS"]

HISTORY_DDL = (
    """CREATE TABLE IF NOT EXISTS history_partitions (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        idx INTEGER NOT NULL CHECK (idx >= 0),
        dir TEXT NOT NULL,
        since TEXT NOT NULL,
        lower TEXT NOT NULL,
        upper TEXT NOT NULL,
        segment INTEGER NOT NULL,
        committed INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (topic, idx))""",
    """CREATE TABLE IF NOT EXISTS history_segments (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        since TEXT NOT NULL,
        nbytes INTEGER NOT NULL DEFAULT 0,
        epochs INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        last_completed REAL,
        PRIMARY KEY (topic, idx, seq))""",
    """CREATE TABLE IF NOT EXISTS history_epochs (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        time TEXT NOT NULL,
        t0 INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        extents TEXT NOT NULL,
        nbytes INTEGER NOT NULL,
        messages INTEGER NOT NULL,
        crc INTEGER NOT NULL,
        completed_at REAL NOT NULL,
        PRIMARY KEY (topic, idx, time))""",
    "CREATE INDEX IF NOT EXISTS history_epochs_t0 ON history_epochs (topic, idx, t0)",
    """CREATE TABLE IF NOT EXISTS durables (
        topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
        name TEXT NOT NULL,
        position TEXT,
        acked TEXT NOT NULL DEFAULT '[]',
        state TEXT NOT NULL CHECK (state IN ('active', 'expired')),
        holder TEXT,
        holder_pid INTEGER,
        holder_pid_start REAL,
        holder_host TEXT,
        created_at REAL NOT NULL,
        acked_at REAL,
        reason TEXT,
        PRIMARY KEY (topic, name))""",
)


STORE_COLUMNS = (("history_partitions", "store", "TEXT"), ("history_segments", "object", "TEXT"),
                 ("history_segments", "object_bytes", "INTEGER"))
"""``(table, column, type)`` added by schema version 9: a log's objects (see
:mod:`epochstream.catalog.history`)."""
