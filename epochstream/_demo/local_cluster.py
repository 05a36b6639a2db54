"""A standalone Spark cluster on this machine, and a catalog service beside it, each daemon a
process group of its own: what ``make demo-cluster`` runs the demo on (with a PostgreSQL
catalog, :mod:`epochstream._demo.cluster`), and what the cluster tests use (with a network
catalog).

- :class:`LocalCluster` starts a master and ``workers`` workers, each its own JVM started with
  PySpark's ``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``
  (the pip package has no ``sbin/start-*.sh``), in a process group of its own, bound to
  ``127.0.0.1`` with free ports. Each worker has ``cores`` cores, ``memory`` of memory and its
  own work directory: Spark runs every application's executors there (``app-*/<n>``), as
  separate JVMs with their own Python workers. :meth:`LocalCluster.stop` ends every process
  group it started (``SIGTERM``, then ``SIGKILL``), also after a failed start.
- :class:`CatalogService` runs ``epochstream catalog serve --db PATH --bind
  tcp://127.0.0.1:*`` as a process (its own group) and gives its URL.
- :func:`stop_group`, :func:`stop_groups` end process groups.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Sequence

__all__ = ["LocalCluster", "CatalogService", "ClusterError", "spark_home", "stop_group",
           "stop_groups"]

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
_FAST_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # ~15-20 % faster JVM start-up
_MASTER_AT = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI = re.compile(r"MasterWebUI: Bound MasterWebUI to \S+, and started at (http://\S+)")
_SERVING = re.compile(r"catalog service on (tcp://\S+) \(database (.+)\)")


class ClusterError(RuntimeError):
    """The cluster (or the catalog service) did not start; the message has its log's tail."""


def spark_home() -> Path:
    """The Spark installation of the ``pyspark`` package (``$SPARK_HOME`` if set): it holds
    ``bin/spark-class`` and ``jars/``."""
    env = os.environ.get("SPARK_HOME")
    if env and (Path(env) / "bin" / "spark-class").exists():
        return Path(env)
    import pyspark

    return Path(pyspark.__file__).parent


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def stop_group(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """End the process group led by ``proc`` (started with ``start_new_session=True``):
    ``SIGTERM`` (a Spark daemon stops its executors on it), then ``SIGKILL`` to every process
    of the group still there after ``timeout`` seconds."""
    stop_groups([proc], timeout)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_groups(procs: Sequence[subprocess.Popen[Any]], timeout: float = 10.0) -> None:
    """:func:`stop_group` for several groups at once: ``SIGTERM`` to all, then wait (reaping
    the leaders) until every group is empty, ``SIGKILL`` to what is left after ``timeout``."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            p.poll()  # reap the leader, or its group never empties
        alive = [p for p in procs if _group_alive(p.pid)]
        if not alive:
            break
        if time.monotonic() > deadline:
            for p in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout)


def _parent_death_signal() -> None:  # pragma: no cover - runs in the child, before exec
    """Linux: the child gets SIGTERM if the process that started it dies (even by SIGKILL), so
    that a killed test run or demo leaves no daemon behind. Best effort elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawn(argv: Sequence[str], log: Path, env: dict[str, str], cwd: Path,
           detached: bool = False) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new session (its own process group), output to ``log``; unless
    ``detached``, it ends with this process (:func:`_parent_death_signal`)."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True,
                                preexec_fn=None if detached else _parent_death_signal)


class LocalCluster:
    """A standalone Spark cluster on this machine (module docstring); a context manager.

    - ``root``: directory of the logs (``master.log``, ``worker-<i>.log``) and of the workers'
      work directories (``worker-<i>/``, executors in ``worker-<i>/app-*/<n>``); ``None``: a
      temporary directory, removed by :meth:`stop`;
    - ``workers``, ``cores`` (per worker), ``memory`` (per worker, e.g. ``"1g"``: an
      application's ``spark.executor.memory`` must fit in it);
    - ``python``: the Python of the executors' Python workers (``PYSPARK_PYTHON`` in the
      daemons' environment; default: this interpreter). An application's own
      ``PYSPARK_PYTHON`` (:func:`epochstream.spark.local_session` sets it) wins;
    - ``env``: variables to add to (a value ``None``: remove from) the daemons' environment,
      which their executors inherit. ``EPOCHSTREAM_CATALOG`` is always removed: executors get
      the catalog from the query's options only;
    - ``detached``: the daemons outlive this process (else, on Linux, they get ``SIGTERM``
      when the thread that started them ends: start the cluster from the main thread).

    :attr:`master_url` (``spark://127.0.0.1:<port>``) and :attr:`web_url` are set by
    :meth:`start`, which returns once every worker has registered with the master (raises
    :class:`ClusterError`, after stopping what it started, if that takes longer than
    ``timeout`` seconds or a daemon exits)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, workers: int = 2,
                 cores: int = 1, memory: str = "1g", host: str = "127.0.0.1",
                 python: str | None = None, env: dict[str, str | None] | None = None,
                 detached: bool = False) -> None:
        if workers < 1 or cores < 1:
            raise ValueError(f"need workers >= 1 and cores >= 1, got {workers}, {cores}")
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="epochstream-cluster-") if root is None
                         else root).absolute()
        self.workers, self.cores, self.memory, self.host = workers, cores, memory, host
        self.python = python or sys.executable
        self.extra_env = dict(env or {})
        self.detached = detached
        self.master_url: str | None = None
        self.web_url: str | None = None
        self.procs: list[subprocess.Popen[Any]] = []  # master first, then the workers
        self.started_s = 0.0  # seconds from start() until every worker was registered
        self._t0 = self._deadline = 0.0

    # ---- environment and paths

    def worker_dir(self, i: int) -> Path:
        return self.root / f"worker-{i}"

    def env(self) -> dict[str, str]:
        """The daemons' environment (see the class docstring)."""
        env = dict(os.environ)
        env.pop("EPOCHSTREAM_CATALOG", None)
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": self.host,
                    "PYSPARK_PYTHON": self.python, "SPARK_DAEMON_MEMORY": "256m",
                    "SPARK_DAEMON_JAVA_OPTS": _FAST_JVM,
                    # no REST submission server: it would take the fixed port 6066
                    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
        for k, v in self.extra_env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def executor_dirs(self) -> list[Path]:
        """The executors' working directories so far (``worker-<i>/app-*/<n>``)."""
        return sorted(p for i in range(self.workers)
                      for p in self.worker_dir(i).glob("app-*/*") if p.is_dir())

    # ---- lifecycle

    def start(self, timeout: float = 120.0, *, wait: bool = True) -> LocalCluster:
        """Start the master, then the workers; wait until all workers are registered (with
        ``wait=False`` return once the master is up and the workers are started: an application
        may register meanwhile, it gets its executors as the workers come; see
        :meth:`wait_workers`)."""
        t0 = time.monotonic()
        self._deadline = deadline = t0 + timeout
        self.root.mkdir(parents=True, exist_ok=True)
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self.env()
        try:
            log = self.root / "master.log"
            self.procs.append(_spawn([spark_class, MASTER, "--host", self.host, "--port", "0",
                                      "--webui-port", "0"], log, env, self.root,
                                     self.detached))
            found = self._wait_log(self.procs[0], log, (_MASTER_AT, _MASTER_UI), deadline)
            self.master_url, self.web_url = found
            for i in range(self.workers):
                d = self.worker_dir(i)
                (d / "local").mkdir(parents=True, exist_ok=True)
                wenv = {**env, "SPARK_WORKER_DIR": str(d), "SPARK_LOCAL_DIRS": str(d / "local")}
                self.procs.append(_spawn(
                    [spark_class, WORKER, "--host", self.host, "--cores", str(self.cores),
                     "--memory", self.memory, "--webui-port", "0", "--work-dir", str(d),
                     self.master_url], self.root / f"worker-{i}.log", wenv, self.root,
                    self.detached))
        except BaseException:
            self.stop(remove=False)
            raise
        self._t0 = t0
        if wait:
            self.wait_workers()
        return self

    def wait_workers(self) -> None:
        """Wait until every worker is registered with the master (within the ``timeout`` of
        :meth:`start`; raises :class:`ClusterError` after stopping the cluster)."""
        try:
            while self.alive_workers() < self.workers:
                self._check_running(self._deadline, "the workers to register with the master")
                time.sleep(0.2)
        except BaseException:
            self.stop(remove=False)
            raise
        if not self.started_s:
            self.started_s = time.monotonic() - self._t0

    def _check_running(self, deadline: float, what: str) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise ClusterError(f"a Spark daemon exited (status {p.returncode}) while "
                                   f"waiting for {what}; logs in {self.root}:\n{self.logs()}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out waiting for {what}; logs in {self.root}:\n"
                               f"{self.logs()}")

    def _wait_log(self, proc: subprocess.Popen[Any], log: Path,
                  patterns: Sequence[re.Pattern[str]], deadline: float) -> list[str]:
        while True:
            text = _tail(log, 1 << 20)
            found = [m.group(1) for m in (p.search(text) for p in patterns) if m]
            if len(found) == len(patterns):
                return found
            self._check_running(deadline, "the Spark master to start")
            time.sleep(0.1)

    def state(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``): workers, applications."""
        assert self.web_url is not None, "the cluster is not started"
        with urllib.request.urlopen(self.web_url.rstrip("/") + "/json/", timeout=5) as r:
            data: dict[str, Any] = json.load(r)
        return data

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def logs(self, n: int = 1500) -> str:
        """The tail of each daemon's log."""
        parts = []
        for log in [self.root / "master.log"] + [self.root / f"worker-{i}.log"
                                                  for i in range(self.workers)]:
            if log.exists():
                parts.append(f"--- {log.name}\n{_tail(log, n)}")
        return "\n".join(parts)

    def pids(self) -> list[int]:
        """The process (and process group) ids of the daemons started."""
        return [p.pid for p in self.procs]

    def stop(self, timeout: float = 10.0, *, remove: bool | None = None) -> None:
        """End every process group started (``SIGTERM`` to all: a worker stops its executors on
        it; ``SIGKILL`` after ``timeout`` seconds), then remove :attr:`root` if it is a
        temporary directory of ours (``remove`` overrides). Idempotent."""
        stop_groups(self.procs, timeout)
        self.procs.clear()
        if remove if remove is not None else self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class CatalogService:
    """``epochstream catalog serve --db DB --bind tcp://HOST:*`` as a process of its own group;
    a context manager. :attr:`url` is its ``tcp://`` URL once :meth:`start` returned (it raises
    :class:`ClusterError` if the service does not say it serves within ``timeout`` seconds)."""

    def __init__(self, db: str | os.PathLike[str], *, host: str = "127.0.0.1",
                 log: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.db = Path(db).absolute()
        self.host = host
        self.log = Path(log) if log is not None else self.db.parent / "catalog-serve.log"
        self.env = env
        self.url: str | None = None
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> CatalogService:
        self.db.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.pop("EPOCHSTREAM_CATALOG", None)
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "epochstream", "catalog", "serve", "--db", str(self.db),
                 "--bind", f"tcp://{self.host}:*"], stdout=subprocess.PIPE, stderr=err,
                stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True,
                preexec_fn=_parent_death_signal)
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, timeout)
        m = _SERVING.search(line or "")
        if m is None:
            self.stop()
            raise ClusterError(f"epochstream catalog serve did not start (first line "
                               f"{line!r}):\n{_tail(self.log)}")
        self.url = m.group(1)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 5.0)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self) -> CatalogService:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _readline(stream: IO[str], timeout: float) -> str | None:
    """One line of ``stream`` (a pipe), or ``None`` after ``timeout`` seconds or at its end."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return None
        return stream.readline() or None
    finally:
        sel.close()
