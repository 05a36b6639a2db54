"""A throwaway PostgreSQL server for tests, benchmarks and demos: :class:`PostgresServer`.

``initdb`` into a fresh temporary directory, a server on ``127.0.0.1`` at a free port (and a
unix socket in that directory), a password role owning one database; :meth:`~PostgresServer.kill`
(SIGKILL of the postmaster) and :meth:`~PostgresServer.start` again, for fault tests;
:meth:`~PostgresServer.close` stops it and removes everything. PostgreSQL's binaries come from
``pg_config --bindir`` (Debian's ``postgresql-15``). ``initdb`` and ``postgres`` refuse to run as
root, so under root the server runs as the unprivileged user ``nobody`` and owns its directory.

Example::

    with PostgresServer() as pg:
        cat = Catalog(pg.url)        # postgresql://epochstream:epochstream@127.0.0.1:PORT/epochstream
        ...
        pg.kill(); pg.start()        # a crash and a restart: committed data survives
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

__all__ = ["PostgresServer", "find_bindir"]


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``. Raises :class:`RuntimeError` naming the package if none."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    raise RuntimeError("PostgreSQL's server binaries (initdb, pg_ctl) were not found: install "
                       "Debian's postgresql-15 (apt-get install postgresql-15) or put pg_config "
                       "on PATH")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: a killed postmaster whose parent is gone may
    stay one when nothing reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _cleanup(datadir: Path, base: Path, pg_ctl: Path, runas: dict) -> None:
    """Stop a server left running and remove its directory (at exit or when collected)."""
    if (datadir / "postmaster.pid").exists():
        with contextlib.suppress(Exception):
            subprocess.run([str(pg_ctl), "stop", "-D", str(datadir), "-m", "immediate", "-w",
                            "-t", "10"], capture_output=True, timeout=20, **runas)
    shutil.rmtree(base, ignore_errors=True)


class PostgresServer:
    """A throwaway PostgreSQL server (module docstring).

    - ``url``: ``postgresql://USER:PASSWORD@127.0.0.1:PORT/DATABASE``, the password role
      (``scram-sha-256`` over TCP) owning ``database``;
    - ``admin_url``: the superuser over the unix socket (trust), for test set-up;
    - ``port``, ``datadir``, ``pid`` (the postmaster's, ``None`` when stopped).

    ``fsync=False`` (the default) turns off ``fsync`` and ``full_page_writes``: a test server
    need not survive power loss, and a SIGKILL of the server still loses nothing committed
    (each commit's WAL record is written to the OS, which keeps it, before the commit returns). Raises
    :class:`RuntimeError` (with the end of the server's log) if it cannot start."""

    def __init__(self, *, port: int | None = None, database: str = "epochstream",
                 user: str = "epochstream", password: str = "epochstream",
                 bindir: str | os.PathLike | None = None, start: bool = True,
                 fsync: bool = False):
        self.bindir = Path(bindir) if bindir is not None else find_bindir()
        self.database, self.user, self.password = database, user, password
        self.port = port if port is not None else _free_port()
        self._fixed_port = port is not None
        self.base = Path(tempfile.mkdtemp(prefix="epochstream-pg-"))
        self.datadir = self.base / "data"
        self.log = self.base / "server.log"
        if os.geteuid() == 0:
            who = pwd.getpwnam("nobody")
            self._runas: dict[str, Any] = {"user": who.pw_uid, "group": who.pw_gid,
                                           "extra_groups": []}
            self.os_user = "nobody"
            os.chown(self.base, who.pw_uid, who.pw_gid)
        else:
            self._runas = {}
            self.os_user = pwd.getpwuid(os.geteuid()).pw_name
        os.chmod(self.base, 0o755)
        self._finalizer = weakref.finalize(self, _cleanup, self.datadir, self.base,
                                           self.bindir / "pg_ctl", self._runas)
        atexit.register(self._finalizer)
        self._run("initdb", "-D", str(self.datadir), "-A", "trust", "--locale=C", "-E", "UTF8",
                  "-U", self.os_user, "--no-instructions")
        self._configure(fsync)
        self._created = False
        if start:
            self.start()

    # ---- processes

    def _run(self, program: str, *args: str, timeout: float = 60.0) -> str:
        proc = subprocess.run([str(self.bindir / program), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.base, **self._runas)
        if proc.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}{self._log_tail()}")
        return proc.stdout

    def _log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                return "\nserver log:\n" + "\n".join(text)
        return ""

    def _configure(self, fsync: bool) -> None:
        conf = [f"listen_addresses = '127.0.0.1'", f"port = {self.port}",
                f"unix_socket_directories = '{self.base}'", "max_connections = 200",
                "shared_buffers = 32MB", "log_min_messages = warning"]
        if not fsync:
            # not synchronous_commit = off: a commit would then return before its WAL record
            # is written at all, and a SIGKILL of the server loses it (seen)
            conf += ["fsync = off", "full_page_writes = off"]
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# epochstream.testing.postgres\n" + "\n".join(conf) + "\n")
        with open(self.datadir / "pg_hba.conf", "w") as f:
            f.write("local all all trust\n"
                    "host all all 127.0.0.1/32 scram-sha-256\n")

    def _set_port(self, port: int) -> None:
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"port = {port}\n")
        self.port = port

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs, else ``None``."""
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _running(pid) else None

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it accepts connections (a port taken meanwhile by
        another process: retried on a new one, up to 3 times, unless ``port`` was given)."""
        for attempt in range(3):
            try:
                self._run("pg_ctl", "start", "-D", str(self.datadir), "-l", str(self.log), "-w",
                          "-t", str(int(timeout)), timeout=timeout + 10)
                break
            except RuntimeError:
                if self._fixed_port or attempt == 2 or "already in use" not in self._log_tail(40):
                    raise
                self._set_port(_free_port())
        if not self._created:
            self._create_role()
            self._created = True

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """``pg_ctl stop -m MODE`` (``smart``, ``fast`` or ``immediate``: a crash-like stop)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be smart, fast or immediate, got {mode!r}")
        if self.pid is None:
            return
        self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", mode, "-w", "-t",
                  str(int(timeout)), timeout=timeout + 10)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the postmaster, then its backends (what a crash of the host's database
        process does); :meth:`start` recovers from the WAL."""
        pid = self.pid
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the backends notice the postmaster's death
            if not self._backends():
                break
            time.sleep(0.05)
        for child in self._backends():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        while time.monotonic() < deadline and (_running(pid) or self._backends()):
            time.sleep(0.02)
        # the postmaster may stay a zombie (nothing reaps it here), which PostgreSQL would take
        # for a running server: its lock files are stale once every process of it is gone
        for stale in (self.datadir / "postmaster.pid", self.base / f".s.PGSQL.{self.port}.lock"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def _backends(self) -> list[int]:
        """Pids of the processes still running in this server's data directory (a server
        process's working directory is its data directory)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "cwd") == str(self.datadir) and \
                            _running(int(entry.name)):
                        out.append(int(entry.name))
        return out

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    # ---- databases

    @property
    def admin_url(self) -> str:
        """The superuser, over the unix socket (trust)."""
        return f"postgresql://{self.os_user}@/postgres?host={self.base}&port={self.port}"

    def url_of(self, database: str) -> str:
        """The password role's URL of ``database``."""
        return (f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}")

    @property
    def url(self) -> str:
        return self.url_of(self.database)

    def admin(self, sql: str) -> None:
        """Run ``sql`` as the superuser (autocommit: ``CREATE DATABASE`` works)."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql)

    def _create_role(self) -> None:
        self.admin(f"CREATE ROLE {self.user} LOGIN CREATEDB PASSWORD '{self.password}'")
        self.create_database(self.database)

    def create_database(self, name: str) -> str:
        """Create the empty database ``name`` owned by the password role; return its URL."""
        self.admin(f'CREATE DATABASE "{name}" OWNER {self.user}')
        return self.url_of(name)

    # ---- life

    def close(self) -> None:
        """Stop the server (immediately) and remove its directory. Idempotent."""
        self._finalizer()

    def __enter__(self) -> "PostgresServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresServer(port={self.port}, datadir={str(self.datadir)!r})"
