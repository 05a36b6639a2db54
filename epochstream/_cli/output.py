"""How the command line talks to the user: data on stdout, everything else (headers, waiting
notices, summaries, ``error:``/``hint:`` messages) on stderr, and the exit statuses (also as
the help texts show them)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer

if TYPE_CHECKING:  # rich is imported when something is printed (--version never loads it)
    from rich.console import Console

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_UNKNOWN_TOPIC",
           "EXIT_CLOSED", "EXIT_STATUS_HELP", "out", "err", "fail", "until_signal", "announce",
           "escape"]

EXIT_OK = 0
EXIT_ERROR = 1          # lost / dead / aborted publisher, --timeout, any other runtime error
EXIT_USAGE = 2          # bad usage, no catalog at the path, unknown topic, closed topic
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_UNKNOWN_TOPIC = EXIT_CLOSED = EXIT_USAGE  # kept for callers of earlier versions

# "\b" keeps click from re-wrapping the table that follows it.
EXIT_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    the stream ended (every partition closed), or --max-epochs reached\n"
    "  1    a publisher was lost, dead or aborted; --timeout passed; the durable\n"
    "       subscription is held by a live subscriber; other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; topic closed;\n"
    "       --from older than the retained history; durable subscription expired\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Getting started: docs/index.md; durable history: docs/history.md."
)
"""The exit statuses in the help of ``epochstream`` and ``epochstream tail`` (the epilog)."""


def out() -> Console:
    """The console for a command's data (stdout). Not a terminal: no colours, and tables as
    wide as they need (up to 200 columns, unless ``$COLUMNS`` says otherwise)."""
    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=200 if wide else None)


def err() -> Console:
    """The console for everything that is not data (stderr)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def escape(markup: str) -> str:
    """rich's :func:`rich.markup.escape` (``markup`` printed as it is), rich imported here."""
    from rich.markup import escape as rich_escape

    return rich_escape(markup)


def fail(message: str, code: int = EXIT_ERROR, hint: Optional[str] = None) -> typer.Exit:
    """Print ``error: message`` (and ``hint: ...``) on stderr; return the Exit to raise."""
    console = err()
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    if hint:
        console.print(f"[dim]hint:[/dim] {escape(hint)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def until_signal() -> Iterator[threading.Event]:
    """For a command that serves in the foreground: an Event set by SIGINT or SIGTERM (the
    previous handlers are restored on exit)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def announce(line: str) -> None:
    """Print a serving command's one line on stdout, flushed: a pipe (a supervisor, a test)
    waits for it."""
    out().print(escape(line), soft_wrap=True)
    sys.stdout.flush()
