"""A throwaway PostgreSQL server for tests, benchmarks and demos: :class:`PostgresServer`.

``initdb`` into a fresh temporary directory, a server on ``127.0.0.1`` at a free port (and a
unix socket in that directory), a password role owning one database. :meth:`~PostgresServer.kill`
(SIGKILL of the postmaster) or :meth:`~PostgresServer.stop` ``("immediate")``, then
:meth:`~PostgresServer.start` again, for fault tests: every committed transaction survives.
:meth:`~PostgresServer.close` stops the server and removes its directory.

Example::

    with PostgresServer() as pg:
        cat = Catalog(pg.url)  # postgresql://epochstream:epochstream@127.0.0.1:PORT/epochstream
        ...
        pg.kill(); pg.start()        # a crash and a restart: committed data survives

Where things come from and go:

- **Binaries**: :func:`find_bindir` (``pg_config --bindir``, else the newest
  ``/usr/lib/postgresql/*/bin``: Debian's ``postgresql-15``). Linux only (it reads ``/proc``).
- **Root**: ``initdb``, ``pg_ctl`` and ``postgres`` refuse to run as root, so under root the
  server runs as the unprivileged user ``nobody``, which owns the temporary directory (created
  in ``/tmp`` when ``$TMPDIR`` is not reachable by ``nobody`` or too long for a unix socket).
- **Authentication**: ``local all all trust`` (the superuser, :attr:`~PostgresServer.admin_url`,
  connects over the unix socket without a password) and ``host all all 127.0.0.1/32
  scram-sha-256`` (:attr:`~PostgresServer.url`: the password role; a wrong password fails).
- **Speed**: ``fsync=False`` (the default) sets ``fsync = off`` and ``full_page_writes = off``:
  a test server need not survive the *machine* crashing. ``synchronous_commit`` stays ``on``:
  with it ``off`` a commit returns before its WAL record is written, and a SIGKILL of the
  server loses the last ~0.5 s of committed transactions (measured: all 50 of 50 rows, in 4 of
  5 tries), which would make :meth:`~PostgresServer.kill` lie about what a crash keeps.
- **Clean-up**: :meth:`~PostgresServer.close` (idempotent; also the context manager's exit, the
  object's garbage collection and the interpreter's exit, through :func:`weakref.finalize`).
  A run killed outright (SIGKILL, ``timeout``'s SIGTERM) runs no Python clean-up, so each
  server also has a watchdog process (this file, run as a script in its own session) that
  waits for its parent to go away and then shuts the server down and removes the directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

__all__ = ["PostgresServer", "find_bindir"]

#: where Debian's packages put each major version's binaries: ``<root>/<major>/bin``
_DEBIAN_ROOT = Path("/usr/lib/postgresql")
_PROGRAMS = ("initdb", "pg_ctl", "postgres")
_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_SOCKET_NAME = "/.s.PGSQL.65535"  # the longest name the server puts in its socket directory


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (``initdb``, ``pg_ctl``, ``postgres``):
    ``pg_config --bindir`` if it has them, else the newest ``/usr/lib/postgresql/<N>/bin``.

    Raises :class:`RuntimeError` naming the Debian package to install if neither has them."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if out and all((Path(out) / p).is_file() for p in _PROGRAMS):
            return Path(out)
    found = [p.parent for p in _DEBIAN_ROOT.glob("*/bin/initdb")
             if all((p.parent / q).is_file() for q in _PROGRAMS)]
    if found:
        return max(found, key=lambda d: [int(x) if x.isdigit() else -1
                                         for x in d.parent.name.split(".")])
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, pg_ctl, postgres) were not found: neither "
        f"`pg_config --bindir` nor {_DEBIAN_ROOT}/*/bin has them. Install Debian's "
        "postgresql-15 package (apt-get install postgresql-15), or pass bindir=")


# ---- processes (module-level: the finalizer and the watchdog use them without the object)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: a killed postmaster, orphaned when ``pg_ctl``
    exited, stays one when nothing reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _in(pid: int, datadir: Path) -> bool:
    """Whether ``pid`` is a running process of the server of ``datadir``: a ``postgres``
    whose working directory is ``datadir`` (every server process's is; neither a recycled pid
    nor a shell in that directory is taken for one)."""
    try:
        return (os.readlink(f"/proc/{pid}/cwd") == str(datadir)
                and os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("postgres")
                and _running(pid))
    except OSError:
        return False


def _server_processes(datadir: Path) -> list[int]:
    """The pids of the running processes of the server of ``datadir`` (the postmaster and the
    processes it started, which outlive it for a moment when it is killed)."""
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and _in(int(e.name), datadir)]


def _pidfile(datadir: Path) -> list[str]:
    """``postmaster.pid``'s lines (pid, data directory, start time, port, socket directory,
    listen address, "shm key  shm id", status), or ``[]``."""
    try:
        return (datadir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return []


def _postmaster(datadir: Path) -> int | None:
    lines = _pidfile(datadir)
    with contextlib.suppress(ValueError, IndexError):
        pid = int(lines[0])
        if _in(pid, datadir):
            return pid
    return None


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _crash(datadir: Path, socket_dir: Path, grace: float = 5.0) -> None:
    """SIGKILL the postmaster; give its processes ``grace`` seconds to notice and exit on their
    own (what they do when it crashes), then SIGKILL the rest. Leaves the data directory as a
    crash does, ready for a restart: the lock files are removed (a zombie postmaster would pass
    for a live one) and so is the System V shared-memory segment (else it leaks when the
    directory is removed without a restart)."""
    lines = _pidfile(datadir)
    pid = _postmaster(datadir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait(lambda: not _server_processes(datadir), grace)
    for child in _server_processes(datadir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    if not _wait(lambda: not _server_processes(datadir), 10.0):
        raise RuntimeError(f"the server processes of {datadir} survive SIGKILL: "
                           f"{_server_processes(datadir)}")
    with contextlib.suppress(ValueError, IndexError, OSError, AttributeError):
        shmid = int(lines[6].split()[1])  # nothing is attached any more
        ctypes.CDLL(None, use_errno=True).shmctl(shmid, 0, None)  # IPC_RMID
    for stale in [datadir / "postmaster.pid", *socket_dir.glob(".s.PGSQL.*.lock")]:
        with contextlib.suppress(OSError):
            stale.unlink()


def _shutdown(base: Path) -> None:
    """Stop the server of ``base`` (an immediate shutdown: SIGQUIT, as ``pg_ctl stop -m
    immediate`` sends; SIGKILL if it takes over 10 s) and remove ``base``."""
    datadir = base / "data"
    pid = _postmaster(datadir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
        _wait(lambda: not _server_processes(datadir), 10.0)
    if _server_processes(datadir):
        with contextlib.suppress(RuntimeError):
            _crash(datadir, base, grace=0.0)
    shutil.rmtree(base, ignore_errors=True)


def _cleanup(base: Path, watchdog: subprocess.Popen[bytes] | None, owner: int) -> None:
    """The finalizer: shut the server down, remove its directory, dismiss the watchdog (in the
    process that started the server only: not in a child ``os.fork`` made, at its exit)."""
    if os.getpid() != owner:
        return
    _shutdown(base)
    if watchdog is not None:
        with contextlib.suppress(Exception):
            if watchdog.stdin is not None:
                watchdog.stdin.close()
            watchdog.wait(5)
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()


def _watch(base: Path) -> None:
    """The watchdog (``python -I postgres.py --watchdog BASE``, in its own session): wait for
    the end of stdin — the parent closed it, or died — then shut the server down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    _shutdown(base)


def _start_watchdog(base: Path) -> subprocess.Popen[bytes] | None:
    if not sys.executable:
        return None
    try:
        return subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--watchdog",
                                 str(base)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None  # best effort: close() and the exit hook still clean up


def _base_parent(runas_uid: int | None) -> str | None:
    """Where to create the temporary directory: ``tempfile``'s choice, unless ``nobody``
    could not reach it or a socket path in it would be too long; then ``/tmp``."""
    parent = Path(tempfile.gettempdir()).resolve()
    if len(str(parent)) + len("/epochstream-pg-xxxxxxxx") + len(_SOCKET_NAME) > _SOCKET_PATH_MAX:
        return "/tmp"
    if runas_uid is not None:
        for d in (parent, *parent.parents):
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return "/tmp"
    return None


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


class PostgresServer:
    """A throwaway PostgreSQL server: ``initdb`` into a fresh temporary directory, listening on
    ``127.0.0.1:<free port>`` and on a unix socket in that directory; trust authentication for
    local (socket) connections, ``scram-sha-256`` over TCP for the password role ``user``
    (``LOGIN CREATEDB``), which owns ``database``. See the module's docstring.

    - :attr:`url`: ``postgresql://USER:PASSWORD@127.0.0.1:PORT/DATABASE``, the password role;
    - :attr:`admin_url`: the superuser (the OS user that ran ``initdb``: ``nobody`` under root)
      over the unix socket, trusted: for set-up;
    - :attr:`port`, :attr:`datadir`, :attr:`base` (the temporary directory: the data directory,
      the socket, the server's log :attr:`log`), :attr:`pid` (the postmaster's; ``None`` when
      stopped), :attr:`os_user`.

    ``port=None`` takes a free port (chosen again, up to 3 times, if another process binds it
    before the first start; never on a later start, which would strand the clients' URLs).
    ``start=False`` runs ``initdb`` only. Raises :class:`RuntimeError` (with the end of the
    server's log) if the server cannot start; nothing is left behind then.

    Keep a reference: the server is closed when the object is garbage-collected."""

    def __init__(self, *, port: int | None = None, database: str = "epochstream",
                 user: str = "epochstream", password: str = "epochstream",
                 bindir: str | os.PathLike[str] | None = None, start: bool = True,
                 fsync: bool = False):
        self.bindir = Path(bindir) if bindir is not None else find_bindir()
        self.database, self.user, self.password = database, user, password
        self._fixed_port = port is not None
        self.port = port if port is not None else _free_port()
        self._started_once = False
        self._runas: dict[str, Any] = {}
        if os.geteuid() == 0:  # initdb and postgres refuse root
            try:
                who = pwd.getpwnam("nobody")
            except KeyError:
                raise RuntimeError("running as root, the server needs the user nobody to run "
                                   "as, and there is none") from None
            self._runas = {"user": who.pw_uid, "group": who.pw_gid, "extra_groups": []}
            self.os_user = "nobody"
        else:
            try:
                self.os_user = pwd.getpwuid(os.geteuid()).pw_name
            except KeyError:  # a uid without a passwd entry (containers): any name will do
                self.os_user = "postgres"
        if user == self.os_user:
            raise ValueError(f"user must not be the superuser's name {self.os_user!r}")
        self.base = Path(tempfile.mkdtemp(prefix="epochstream-pg-",
                                          dir=_base_parent(self._runas.get("user")))).resolve()
        self.datadir = self.base / "data"
        self.log = self.base / "server.log"
        self._finalizer = weakref.finalize(self, _cleanup, self.base,  # also runs at exit
                                           _start_watchdog(self.base), os.getpid())
        try:
            os.chmod(self.base, 0o755)
            if self._runas:
                _chown_tree(self.base, self._runas["user"], self._runas["group"])
            self._run("initdb", "-D", str(self.datadir), "-A", "trust", "--locale=C",
                      "-E", "UTF8", "-U", self.os_user, "--no-instructions",
                      *(["--no-sync"] if not fsync else []))
            self._configure(fsync)
            if start:
                self.start()
        except BaseException:
            self.close()
            raise

    # ---- processes

    def _run(self, program: str, *args: str, timeout: float = 60.0) -> str:
        """Run one of the server's programs (as ``nobody`` under root); RuntimeError with its
        output and the end of the server's log if it fails."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        try:
            proc = subprocess.run([str(self.bindir / program), *args], capture_output=True,
                                  text=True, timeout=timeout, cwd=self.base, env=env, **self._runas)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{program} {' '.join(args)} did not finish in {timeout:.0f} s"
                               f"{self._log_tail()}") from e
        if proc.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}{self._log_tail()}")
        return str(proc.stdout)

    def _log_tail(self, lines: int = 20, since: int = 0) -> str:
        """The last ``lines`` lines the server logged after byte ``since``, as an error
        message's end."""
        with contextlib.suppress(OSError):
            with open(self.log, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace").strip().splitlines()[-lines:]
            if text:
                return f"\nserver log ({self.log}):\n" + "\n".join(text)
        return ""

    def _log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def _configure(self, fsync: bool) -> None:
        conf = ["listen_addresses = '127.0.0.1'", f"port = {self.port}",
                f"unix_socket_directories = '{self.base}'", "max_connections = 200",
                "shared_buffers = 32MB", "logging_collector = off"]
        if not fsync:
            # not synchronous_commit = off: see the module's docstring
            conf += ["fsync = off", "full_page_writes = off"]
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# epochstream.testing.postgres\n" + "\n".join(conf) + "\n")
        with open(self.datadir / "pg_hba.conf", "w") as f:
            f.write("# epochstream.testing.postgres: the superuser over the socket, the password "
                    "role over TCP\n"
                    "local all all trust\n"
                    "host  all all 127.0.0.1/32 scram-sha-256\n")

    def _set_port(self, port: int) -> None:
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"port = {port}\n")  # the last setting wins
        self.port = port

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from ``postmaster.pid``) while it runs, else ``None``."""
        return _postmaster(self.datadir)

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (``pg_ctl start -w``) and wait until it accepts connections; nothing
        if it runs. The first start creates the password role and its database."""
        if not self._finalizer.alive:
            raise RuntimeError("this PostgresServer is closed")
        if self.pid is not None:
            return
        for attempt in range(3):
            since = self._log_size()
            try:
                self._run("pg_ctl", "start", "-D", str(self.datadir), "-l", str(self.log), "-w",
                          "-t", str(max(1, math.ceil(timeout))), timeout=timeout + 10)
                break
            except RuntimeError:
                if self._fixed_port or self._started_once or attempt == 2 or \
                        "already in use" not in self._log_tail(since=since):
                    raise
                self._set_port(_free_port())  # taken since we chose it: another one
        if not self._started_once:
            self._create_role()
            self._started_once = True

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """``pg_ctl stop -m MODE``: ``smart`` (waits for the clients to disconnect), ``fast``
        (disconnects them, then a clean shutdown) or ``immediate`` (no shutdown checkpoint: a
        crash-like stop; the next start recovers from the WAL). Nothing if it is stopped."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be smart, fast or immediate, got {mode!r}")
        if self.pid is None:
            return
        self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", mode, "-w", "-t",
                  str(max(1, math.ceil(timeout))), timeout=timeout + 10)

    def kill(self, timeout: float = 5.0) -> None:
        """A crash: SIGKILL the postmaster; its processes notice and exit (their clients get
        "terminating connection due to unexpected postmaster exit"), those still there after
        ``timeout`` seconds are SIGKILLed too. :meth:`start` then recovers from the WAL, with
        every committed transaction. Nothing if it is stopped."""
        _crash(self.datadir, self.base, grace=timeout)

    def restart(self, mode: str = "fast") -> None:
        """:meth:`stop` (``mode``), then :meth:`start`."""
        self.stop(mode)
        self.start()

    # ---- databases

    @property
    def admin_url(self) -> str:
        """The superuser (:attr:`os_user`), over the unix socket (trust), database ``postgres``:
        ``postgresql://nobody@/postgres?host=/tmp/epochstream-pg-…&port=PORT``."""
        return (f"postgresql://{quote(self.os_user, safe='')}@/postgres"
                f"?host={quote(str(self.base), safe='/')}&port={self.port}")

    def url_of(self, database: str) -> str:
        """The password role's URL of ``database`` (over TCP)."""
        return (f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
                f"@127.0.0.1:{self.port}/{quote(database, safe='')}")

    @property
    def url(self) -> str:
        """The password role's URL of :attr:`database`, over TCP:
        ``postgresql://epochstream:epochstream@127.0.0.1:PORT/epochstream``."""
        return self.url_of(self.database)

    def admin(self, query: Any, params: Any = None) -> None:
        """Run ``query`` (a string or a :mod:`psycopg.sql` composition) as the superuser, in
        autocommit mode (``CREATE DATABASE`` works)."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(query, params)

    def _create_role(self) -> None:
        from psycopg import sql

        self.admin(sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
            sql.Identifier(self.user), sql.Literal(self.password)))
        self.create_database(self.database)

    def create_database(self, name: str) -> str:
        """Create the empty database ``name``, owned by the password role; return its URL."""
        from psycopg import sql

        self.admin(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name),
                                                                 sql.Identifier(self.user)))
        return self.url_of(name)

    # ---- life

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Stop the server if it runs (an immediate shutdown) and remove its directory.
        Idempotent."""
        self._finalizer()

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running" if self.pid else "stopped"
        return f"PostgresServer(port={self.port}, base={str(self.base)!r}, {state})"


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    _watch(Path(sys.argv[2]))
