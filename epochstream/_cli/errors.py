"""How a command ends on an error: the library's errors (and bad option values, Ctrl-C, a closed
pipe) turned into an ``error:`` message on stderr and an exit status, in one place.

Every command wraps the calls that may fail in one of these context managers instead of its own
``try``/``except`` blocks:

- :func:`exit_on_errors` — an unknown topic (status 2, naming the topics the catalog has), a bad
  value (status 2), any other :class:`~epochstream.errors.EpochstreamError` (status 1, or the
  one given);
- :func:`bad_value` — a value of an option that cannot be read (status 2);
- :func:`interruptible` — Ctrl-C prints ``interrupted`` (status 130);
- :func:`stream_errors` — around the loop of ``tail`` and ``history`` that writes epochs: a
  closed pipe ends quietly (status 0), Ctrl-C and errors say after how many epochs.

:func:`unknown_topic` and :func:`cannot_bind` are the messages the commands share.
"""

from __future__ import annotations

from types import TracebackType
from typing import Callable, Optional

import typer

from ..catalog import ENV_VAR, Catalog
from ..errors import EpochstreamError, TopicNotFound
from .output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, err, fail
from .tail_output import stdout_to_devnull

__all__ = ["exit_on_errors", "bad_value", "interruptible", "stream_errors", "unknown_topic", "cannot_bind"]

Errors = tuple[type[BaseException], ...]
"""Exception classes, as an ``except`` clause takes them."""

Ending = Callable[[BaseException], Optional[typer.Exit]]
"""What ends the command for an exception raised in a block: prints the message and returns the
:class:`typer.Exit` to raise instead, or ``None`` to let the exception through."""


class _EndOn:
    """The context manager of the functions below: runs ``end`` on what the block raises (a
    ``typer.Exit`` raised in the block always goes through)."""

    def __init__(self, end: Ending) -> None:
        self.end = end

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[type[BaseException]], e: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if e is None or isinstance(e, typer.Exit):
            return
        ending = self.end(e)
        if ending is None:
            return
        try:
            raise ending from None
        finally:
            # no reference cycle (the Exit's traceback holds this frame): the error, and what
            # its traceback holds, is freed with the Exit, at once, as after an ``except``
            # block. A Subscriber whose creation failed closes its sockets only when it is
            # freed; left to a later garbage collection, they keep the process from exiting.
            del ending, e, tb


def exit_on_errors(cat: Optional[Catalog] = None, *, status: int = EXIT_ERROR,
                   usage: Errors = (), others: Errors = (),
                   hint: Optional[str] = None) -> _EndOn:
    """End the command on the errors raised in the block (the first that applies):

    - an exception of ``usage`` (e.g. ``ValueError`` for a bad argument): its message, status
      2;
    - :class:`~epochstream.errors.TopicNotFound` when ``cat`` is given: :func:`unknown_topic`
      (status 2);
    - any other :class:`~epochstream.errors.EpochstreamError`, or an exception of ``others``:
      its message (and ``hint``), with ``status`` (default 1).

    Anything else (``KeyboardInterrupt`` included) goes through."""
    def end(e: BaseException) -> Optional[typer.Exit]:
        if isinstance(e, usage):
            return fail(str(e), EXIT_USAGE)
        if isinstance(e, TopicNotFound) and cat is not None:
            return unknown_topic(cat, e, can_wait=False)
        if isinstance(e, (EpochstreamError, *others)):
            return fail(str(e), status, hint=hint)
        return None
    return _EndOn(end)


def bad_value(what: str) -> _EndOn:
    """End the command on a ``ValueError`` in the block (an option's value that cannot be
    read): ``error: bad {what}: {message}``, status 2."""
    def end(e: BaseException) -> Optional[typer.Exit]:
        return fail(f"bad {what}: {e}", EXIT_USAGE) if isinstance(e, ValueError) else None
    return _EndOn(end)


def interruptible() -> _EndOn:
    """End the command on Ctrl-C in the block: ``interrupted`` on stderr, status 130."""
    def end(e: BaseException) -> Optional[typer.Exit]:
        if isinstance(e, KeyboardInterrupt):
            err().print("interrupted")
            return typer.Exit(EXIT_INTERRUPTED)
        return None
    return _EndOn(end)


def stream_errors(cat: Catalog, written: Callable[[], int], *, can_wait: bool = True,
                  others: Errors = (TimeoutError,),
                  explain: Optional[Callable[[EpochstreamError], Optional[typer.Exit]]] = None
                  ) -> _EndOn:
    """End ``tail`` or ``history`` on what its loop writing epochs raises (``written()``: the
    epochs written so far), the first that applies:

    - a closed stdout pipe (``| head``): quietly, status 0;
    - Ctrl-C: ``interrupted after N epoch(s)``, status 130;
    - :class:`~epochstream.errors.TopicNotFound` (the topic was dropped meanwhile):
      :func:`unknown_topic` (``can_wait``: the command has ``--wait``);
    - another :class:`~epochstream.errors.EpochstreamError`: what ``explain`` makes of it, or
      else (also for an exception of ``others``) ``NAME: message (after N epoch(s))``,
      status 1."""
    def end(e: BaseException) -> Optional[typer.Exit]:
        if isinstance(e, BrokenPipeError):
            stdout_to_devnull()  # the reader went away (| head): a normal end, quietly
            return typer.Exit(EXIT_OK)
        if isinstance(e, KeyboardInterrupt):
            err().print(f"interrupted after {written()} epoch(s)")
            return typer.Exit(EXIT_INTERRUPTED)
        if isinstance(e, TopicNotFound):
            return unknown_topic(cat, e, can_wait=can_wait)
        explained = explain(e) if explain is not None and isinstance(e, EpochstreamError) else None
        if explained is not None:
            return explained
        if isinstance(e, (EpochstreamError, *others)):
            return fail(f"{type(e).__name__}: {e} (after {written()} epoch(s))")
        return None
    return _EndOn(end)


def unknown_topic(cat: Catalog, e: TopicNotFound, waited: float = 0.0,
                  can_wait: bool = True) -> typer.Exit:
    """Report a topic missing from ``cat`` (after ``waited`` seconds of ``--wait``), with the
    topics it has; return the Exit (status 2) to raise. ``can_wait``: the command has
    ``--wait`` (then the hint mentions it)."""
    known = ", ".join(e.existing) if e.existing else "none"
    after = f"; waited {waited:g} s" if waited > 0 else ""
    hint = (f"if its publisher uses another catalog, pass --catalog PATH (or set ${ENV_VAR})"
            + ("" if waited > 0 or not can_wait
               else "; to wait for the topic to appear, pass --wait SECONDS"))
    return fail(f"unknown topic {e.topic!r} in catalog {cat.where} (existing topics: {known})"
                f"{after}", EXIT_USAGE, hint=hint)


def cannot_bind(what: str, bind: str, e: BaseException) -> typer.Exit:
    """Report that ``what`` (``the relay``) cannot bind to ``bind``; return the Exit (status
    1) to raise."""
    return fail(f"cannot bind {what} to {bind}: {e}",
                hint="pass --bind tcp://HOST:PORT with a free port, or PORT * for any")
