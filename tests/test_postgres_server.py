"""The throwaway PostgreSQL server the suite starts (epochstream.testing.postgres): it starts,
takes its password (and refuses a wrong one), survives a SIGKILL and an immediate stop with every
committed row, and leaves nothing behind — not even when the process that started it is killed.
Never skipped: PostgreSQL 15 is installed on every machine of the project, and a missing one is
a failure here."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from epochstream.testing import postgres as pgmod
from epochstream.testing.postgres import PostgresServer, find_bindir


def _gone(pid: int, base: Path, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pgmod._running(pid) and not base.exists():
            return True
        time.sleep(0.05)
    return False


def test_find_bindir_has_the_server():
    bindir = find_bindir()
    for program in ("initdb", "pg_ctl", "postgres", "pg_isready", "psql"):
        assert (bindir / program).is_file(), program


def test_find_bindir_names_the_package_when_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config
    monkeypatch.setattr(pgmod, "_DEBIAN_ROOT", tmp_path / "postgresql")
    with pytest.raises(RuntimeError, match="postgresql-15"):
        find_bindir()


@pytest.fixture(scope="module")
def pg():
    server = PostgresServer()
    yield server
    server.close()


def test_url_is_the_password_role_admin_url_the_superuser(pg):
    assert pg.url == f"postgresql://epochstream:epochstream@127.0.0.1:{pg.port}/epochstream"
    with psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_user, current_database()").fetchone() == \
            ("epochstream", "epochstream")
    with psycopg.connect(pg.admin_url) as conn:
        assert conn.execute("SELECT current_user, rolsuper FROM pg_roles "
                            "WHERE rolname = current_user").fetchone() == (pg.os_user, True)
        assert conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database "
                            "WHERE datname = 'epochstream'").fetchone() == ("epochstream",)
        assert conn.execute("SHOW server_version_num").fetchone()[0].startswith("15")
    if os.geteuid() == 0:  # the server runs as nobody, never as root
        assert pg.os_user == "nobody"
        assert os.stat(f"/proc/{pg.pid}").st_uid == pwd.getpwnam("nobody").pw_uid


def test_a_wrong_or_missing_password_fails_over_tcp(pg):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg.url.replace(":epochstream@", ":wrong@"), connect_timeout=5)
    with pytest.raises(psycopg.OperationalError):  # trust is for the unix socket only
        psycopg.connect(f"postgresql://{pg.os_user}@127.0.0.1:{pg.port}/postgres",
                        connect_timeout=5)


def test_create_database(pg):
    url = pg.create_database("other db")  # quoted, in SQL and in the URL
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database(), current_user").fetchone() == \
            ("other db", "epochstream")
        conn.execute("CREATE TABLE t (a int)")  # the role owns it
    with pytest.raises(psycopg.errors.DuplicateDatabase):
        pg.create_database("other db")


def test_kill_then_start_keeps_what_was_committed(pg):
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE killed (a int)")
        conn.execute("INSERT INTO killed VALUES (1)")
    idle = psycopg.connect(pg.url, autocommit=True)
    url, pid = pg.url, pg.pid
    assert pid is not None
    pg.kill()
    assert pg.pid is None and not pgmod._server_processes(pg.datadir)
    with pytest.raises(psycopg.OperationalError):  # its clients lost the server
        idle.execute("SELECT 1")
    idle.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg.url, connect_timeout=2)
    pg.kill()  # nothing when it is stopped
    pg.start()
    assert pg.pid not in (None, pid) and pg.url == url
    with psycopg.connect(pg.url, autocommit=True) as conn:
        assert conn.execute("SELECT a FROM killed").fetchall() == [(1,)]
        conn.execute("INSERT INTO killed VALUES (2)")
    pg.kill()  # twice in a row: the data directory stays restartable
    pg.start()
    with psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT a FROM killed ORDER BY a").fetchall() == [(1,), (2,)]


def test_immediate_stop_and_restart(pg):
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE stopped (a int)")
        conn.execute("INSERT INTO stopped VALUES (1)")
    pg.stop("immediate")
    assert pg.pid is None
    pg.stop()  # nothing when it is stopped
    pg.start()
    pg.start()  # nothing when it runs
    pid = pg.pid
    pg.restart()
    assert pg.pid not in (None, pid)
    with psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT a FROM stopped").fetchall() == [(1,)]
    with pytest.raises(ValueError):
        pg.stop("now")


def test_close_stops_the_server_and_removes_everything_once():
    pg = PostgresServer()
    pid, base = pg.pid, pg.base
    assert pid is not None and (base / "data" / "PG_VERSION").exists()
    pg.close()
    assert pg.closed and not base.exists() and not pgmod._running(pid)
    pg.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pg.start()


def test_a_start_failure_shows_the_log_and_leaves_nothing(monkeypatch):
    made = []
    real_mkdtemp = pgmod.tempfile.mkdtemp
    monkeypatch.setattr(pgmod.tempfile, "mkdtemp",
                        lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match="(?s)server log.*already in use"):
            PostgresServer(port=port)  # a port given is never changed
        assert made and not Path(made[0]).exists()
        # a port chosen for us and taken before the first start: another one is chosen
        ports = iter([port])
        real_free_port = pgmod._free_port
        monkeypatch.setattr(pgmod, "_free_port", lambda: next(ports, None) or real_free_port())
        with PostgresServer() as pg:
            assert pg.port != port
            with psycopg.connect(pg.url) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_killed_test_run_leaves_no_server_behind():
    """The process that started the server is SIGKILLed (no atexit, no finalizer): its
    watchdog stops the server and removes the directory."""
    code = ("import time\n"
            "from epochstream.testing.postgres import PostgresServer\n"
            "pg = PostgresServer()\n"
            "print(pg.base, pg.pid, flush=True)\n"
            "time.sleep(120)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    try:
        line = child.stdout.readline().split()
        assert len(line) == 2, "the child did not start its server"
        base, pid = Path(line[0]), int(line[1])
        assert base.exists() and pgmod._running(pid)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert _gone(pid, base), f"server {pid} or {base} left behind"
