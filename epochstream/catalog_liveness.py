"""Process liveness for the catalog: is the publisher process that wrote a partition row still
running?

A catalog row stores ``pid`` (the publisher's process id), ``pid_start`` (that process' start
time, seconds since the epoch, from psutil) and ``host`` (``socket.gethostname()`` of its
machine). Readers judge liveness *now*, from those three, with :func:`pid_alive`: a process that
is gone, a zombie, or a pid reused by a process that started at another time is dead. Processes
on another host cannot be checked and are assumed alive.

Used by :mod:`epochstream.catalog_records` (a ``live`` row whose process is dead is reported as
``"dead"``) and :mod:`epochstream.catalog` (the values stamped at registration).
"""

from __future__ import annotations

import os
import socket

import psutil

__all__ = ["HOST", "pid_alive", "process_start"]

HOST = socket.gethostname()
"""This machine's host name, as stored in ``partitions.host`` by rows registered here."""


def process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (seconds since the epoch), or ``None`` if unknown."""
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
    if host is not None and host != HOST:
        return True
    if pid == os.getpid():
        return True
    if pid is None or pid <= 0:
        return False
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
