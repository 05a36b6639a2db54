"""What the two stores of the catalog's tables share (:mod:`epochstream.catalog.store`,
:mod:`epochstream.catalog.store_postgres`): the busy timeout, the connections a forked child must
leave alone, the waker that polls, and the catalog's clock.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["BUSY_TIMEOUT_S", "INHERITED", "Poll", "clock"]

BUSY_TIMEOUT_S = 5.0
"""Seconds a SQLite connection waits for another process's lock before failing (busy timeout);
also how long a PostgreSQL connection attempt may take (``connect_timeout``)."""

# Connections opened in a process that then forked: the child must neither use nor close them
# (SQLite and libpq both forbid carrying a connection across fork()), so they are kept here.
INHERITED: list[Any] = []


class Poll:
    """A waker that only sleeps (polling): ``wait(remaining)`` sleeps ``min(interval,
    remaining)`` seconds."""

    def __init__(self, interval: float):
        self.interval = interval

    def wait(self, remaining: float) -> None:
        time.sleep(max(0.0, min(self.interval, remaining)))


def clock(conn: Any) -> float:
    """The catalog's clock, seconds since 1970 (``epoch_now()``,
    :mod:`epochstream.catalog.schema`): the database server's for PostgreSQL, this machine's
    for SQLite."""
    return float(conn.execute("SELECT epoch_now()").fetchone()[0])
