"""Whether the holder of a catalog row still runs: is the publisher process that wrote a
partition row (or a durable subscription's, a group worker's) still running?

A catalog row stores ``pid`` (the publisher's process id), ``pid_start`` (that process' start
time, seconds since the epoch, from psutil) and ``host`` (``socket.gethostname()`` of its
machine). Readers judge liveness *now*, from those three, with :func:`pid_alive`: a process that
is gone, a zombie, or a pid reused by a process that started at another time is dead. Processes
on another host cannot be checked and are assumed alive.

A row registered through the network catalog (:mod:`epochstream.catalog.client`) carries a
**lease** instead: ``lease`` seconds, renewed by its holder's heartbeats (``updated_at``, stamped
by the catalog server's clock). Such a row is alive while ``updated_at + lease >= now``
(:func:`lease_alive`), wherever its process runs; its pid is not checked. :func:`holder_alive`
chooses between the two rules.

Used by :mod:`epochstream.catalog.records` (a ``live`` row whose process is dead is reported as
``"dead"``) and :mod:`epochstream.catalog` (the values stamped at registration).
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..errors import CatalogError

__all__ = ["HOST", "pid_alive", "process_start", "lease_alive", "holder_alive", "check_holder"]

HOST: str
"""This machine's host name, as stored in ``partitions.host`` by rows registered here (read on
first use, :func:`_host`: the ``socket`` module is not loaded by ``import epochstream``)."""
_HOST: list[str] = []


def _host() -> str:
    if not _HOST:
        import socket

        _HOST.append(socket.gethostname())
    return _HOST[0]


def __getattr__(name: str) -> Any:
    if name == "HOST":
        return _host()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch), or ``None`` if unknown."""
    import psutil  # here, not at import: ~8 ms a process that never registers does not pay

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError, ValueError):
        return None


def pid_alive(pid: int, pid_start: float | None = None, host: str | None = None) -> bool:
    """Whether process ``pid`` is running now (on this host).

    ``os.getpid()`` is always alive. A zombie (exited, not yet reaped) counts as dead. If
    ``pid_start`` (the process start time recorded at registration) is given and the running
    process ``pid`` started at a different time, the pid was reused: dead. A ``host`` other than
    this machine's cannot be checked and is reported alive."""
    if host is not None and host != _host():
        return True
    if pid == os.getpid():
        return True
    if pid is None or pid <= 0:
        return False
    import psutil  # here, not at import (see process_start)

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if pid_start is not None and abs(proc.create_time() - pid_start) > 1.0:
            return False
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # exists, owned by someone else
        return True


def lease_alive(renewed_at: float | None, lease: float, now: float | None = None) -> bool:
    """Whether a lease of ``lease`` seconds last renewed at ``renewed_at`` (``time.time()``
    seconds) still holds at ``now`` (default: ``time.time()``). A lease never renewed is dead."""
    if renewed_at is None:
        return False
    return (time.time() if now is None else now) <= renewed_at + lease


def holder_alive(pid: int | None, pid_start: float | None, host: str | None,
                 lease: float | None = None, renewed_at: float | None = None,
                 now: float | None = None) -> bool:
    """Liveness of a row's holder: by its lease (:func:`lease_alive`) if ``lease`` is set (a row
    written through the network catalog or into a PostgreSQL catalog), else by its process
    (:func:`pid_alive`). A leased holder on this machine whose process is gone is dead at once
    (the same-host fast path: its lease need not run out); a stopped or hung one keeps its
    lease until the lease runs out."""
    if lease is not None:
        if host == _host() and pid is not None and not pid_alive(pid, pid_start, host):
            return False
        return lease_alive(renewed_at, lease, now)
    return pid is not None and pid_alive(pid, pid_start, host)


def check_holder(pid: Any, pid_start: Any, host: Any, lease: Any) -> tuple:
    """A holder's ``(pid, pid_start, host, lease)`` checked, defaults filled in: this process
    and no lease. Raises :class:`~epochstream.errors.CatalogError` for a value of the wrong type."""
    if pid is None:
        pid = os.getpid()
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise CatalogError(f"pid must be an int, got {pid!r}")
    if host is None:
        host = _host()
    if not isinstance(host, str):
        raise CatalogError(f"host must be a str, got {host!r}")
    if pid_start is None and host == _host():
        pid_start = process_start(pid)
    if pid_start is not None and (isinstance(pid_start, bool)
                                  or not isinstance(pid_start, (int, float))):
        raise CatalogError(f"pid_start must be seconds or None, got {pid_start!r}")
    if lease is not None and (isinstance(lease, bool) or not isinstance(lease, (int, float))
                              or not 0 < lease < 1e9):
        raise CatalogError(f"lease must be seconds > 0 or None, got {lease!r}")
    return pid, pid_start, host, None if lease is None else float(lease)
