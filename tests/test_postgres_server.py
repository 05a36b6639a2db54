"""The throwaway PostgreSQL server the suite starts (epochstream.testing.postgres): it starts,
takes its password, survives a SIGKILL and an immediate stop with every committed row, and
leaves nothing behind. Never skipped: PostgreSQL 15 is installed on every machine of the
project."""

from __future__ import annotations

import psycopg
import pytest

from epochstream.testing.postgres import PostgresServer, find_bindir


def test_bindir_has_the_server():
    assert (find_bindir() / "initdb").exists()


def test_start_kill_restart_close():
    pg = PostgresServer()
    try:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE x (a int)")
            conn.execute("INSERT INTO x VALUES (1)")
        with psycopg.connect(pg.admin_url) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == pg.os_user
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg.url.replace(":epochstream@", ":wrong@"))
        pid = pg.pid
        assert pid is not None
        pg.kill()
        assert pg.pid is None and not pg._backends()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.url, connect_timeout=2)
        pg.start()
        assert pg.pid not in (None, pid)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            assert conn.execute("SELECT a FROM x").fetchall() == [(1,)]  # committed: kept
            conn.execute("INSERT INTO x VALUES (2)")
        pg.stop("immediate")
        pg.start()
        with psycopg.connect(pg.create_database("other")) as conn:
            assert conn.execute("SELECT current_database()").fetchone()[0] == "other"
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT count(*) FROM x").fetchone()[0] == 2
    finally:
        base = pg.base
        pg.close()
        pg.close()  # idempotent
    assert not base.exists()
