"""The demo and the terminals around it: the ``epochstream`` command line to paste into another
terminal of this machine, and sending the JVM's console output to a file instead of this one."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Iterator

from ..catalog import DEFAULT_DIR, DEFAULT_FILE, ENV_VAR
from . import TOPIC

__all__ = ["cli_command", "tail_command", "fd2_to"]


def cli_command() -> str:
    """How to run ``epochstream`` from another terminal of this machine: ``epochstream`` if that
    is this very program on the PATH, else the script next to this interpreter (e.g.
    ``.venv/bin/epochstream``: ``make demo`` does not activate the virtualenv)."""
    script = Path(sys.executable).parent / "epochstream"
    on_path = shutil.which("epochstream")
    if on_path and script.exists() and Path(on_path).resolve() == script.resolve():
        return "epochstream"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m epochstream"
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))


def tail_command(catalog_path: str | os.PathLike[str], topic: str = TOPIC) -> str:
    """A ready-to-paste ``epochstream tail`` line for ``topic`` in the catalog at
    ``catalog_path``; ``--catalog`` is added unless it is the default of the current directory
    (a terminal elsewhere, or without ``$EPOCHSTREAM_CATALOG``, would not find it otherwise)."""
    default = (Path.cwd() / DEFAULT_DIR / DEFAULT_FILE).absolute()
    cmd = f"{cli_command()} tail {shlex.quote(topic)}"
    if os.environ.get(ENV_VAR) or Path(catalog_path).absolute() != default:
        cmd += f" --catalog {shlex.quote(str(catalog_path))}"
    return cmd


@contextlib.contextmanager
def fd2_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` meanwhile. The JVM that pyspark starts (and the Python
    workers it starts later) inherit it, so their log lines go to the file instead of
    interleaving with the live display; Python's own stderr is back to normal afterwards."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # pragma: no cover - no fd 2
        yield
        return
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 2)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log_fd)
