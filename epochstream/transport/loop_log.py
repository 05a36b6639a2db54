"""Driving one partition's epoch log from the publisher's loop thread (retention): what is
logged, what is written and not yet sent, the group commit, the log's failure, expiry while
idle, and the :class:`~epochstream.transport.log_server.LogServer` that serves the log
to remote readers.

:class:`LogDriver` is composed into the :class:`~epochstream.transport.loop.PublisherLoop` (its
own state: the :class:`~epochstream.log.writer.LogWriter`, the lower frontier as logged, the
frontier changes awaiting the commit, :attr:`LogDriver.error`, whether the log was closed, the
time of the last age check). It sends nothing: :meth:`LogDriver.commit` returns the frontier
changes the commit made durable, and the loop sends them, in order.
"""

from __future__ import annotations

import logging
import time as _time
from typing import Callable

import zmq

from ..errors import Fenced, HistoryWriteError
from ..frontier import apply_changes
from ..retention import check_interval
from .log_server import LogServer

__all__ = ["LogDriver"]

log = logging.getLogger("epochstream.transport")


class LogDriver:
    """The epoch log of partition ``partition`` of ``topic`` (``log``: its open
    :class:`~epochstream.log.writer.LogWriter`), its lower frontier at start ``lower``;
    ``failed(error)`` is called once the log failed (the loop then aborts its peers); ``stats``:
    the publisher's counter. Data is logged as it is sent; a frontier change is written at once
    but sent only after the group commit that makes it durable."""

    def __init__(self, log_writer, ctx: zmq.Context, topic: str, partition: int, order,
                 lower: dict, stats, failed: Callable[[HistoryWriteError], None]):
        self._log = log_writer
        self._ctx, self.topic, self.partition, self.order = ctx, topic, partition, order
        self._stats, self._failed = stats, failed
        self._lower: dict = dict(lower)  # the lower frontier as logged
        self._unsent: list = []  # (update, frames) of frontier changes awaiting the commit
        self.error: HistoryWriteError | None = None  # set once the log failed
        self._closed = False
        # the age limit also applies while nothing is committed (an idle publisher)
        self._expire_every = check_interval(log_writer.retention)
        self._last_expire = _time.monotonic()
        #: remote history reads (``r``) are served by a reader thread, from :meth:`start` on
        self.history: LogServer | None = None

    def start(self) -> None:
        """Start the history server (in the loop thread: a publisher that fails to start has
        none)."""
        log_writer = self._log
        self.history = LogServer(self._ctx, self.topic, self.partition, self.order,
                                     log_writer.catalog, str(log_writer.dir), stats=self._stats)

    def close(self) -> None:
        """The loop ends: close the log and stop the history server."""
        self._log.close()
        if self.history is not None:
            self.history.close()

    def close_log(self) -> None:
        """Flush and close the segment file (uncommitted records stay, for recovery to
        truncate); later data and frontier commands are not logged and not sent."""
        if not self._closed:
            self._log.close()
            self._closed = True

    def data(self, t, frames: list) -> bool:
        """Append a data message to the log; False (send nothing) once the log failed or was
        closed."""
        if self.error is not None or self._closed:
            return False
        try:
            self._log.data(t, frames[1], frames[2])
        except HistoryWriteError as e:
            self._fail(e)
            return False
        return True

    def frontier(self, update, frames: list, upper: tuple) -> bool:
        """Write a frontier change's ``F`` record (``upper``: the loop's upper frontier); it is
        sent after the next commit. True if the commit should be made now (the segment may
        roll at this epoch boundary)."""
        if self.error is not None or self._closed:
            return False
        apply_changes(self._lower, update.updates)
        try:
            self._log.frontier_write(tuple(self._lower), upper, frames[1])
        except HistoryWriteError as e:
            self._fail(e)
            return False
        self._unsent.append((update, frames))
        return self._log.full

    def commit(self) -> list:
        """Group commit: make the frontier changes written so far durable (one fsync, one
        catalog transaction); returns them, ``(update, frames)`` in order, for the loop to send
        (none if nothing was written, or the commit failed)."""
        if not self._unsent:
            return []
        try:
            self._log.commit()
        except HistoryWriteError as e:
            self._fail(e)
            return []
        except Fenced as e:  # a newer generation holds the partition: this one is a zombie
            self._fenced(e)
            return []
        unsent, self._unsent = self._unsent, []
        self._stats["log_commits"] += 1
        return unsent

    def discard(self) -> None:
        """Forget the frontier changes awaiting the commit: they are never sent (the loop
        halted)."""
        self._unsent.clear()

    def expire(self, now: float) -> None:
        """Apply the age limit to an idle log, at most once per check interval (``now``:
        monotonic seconds)."""
        every = self._expire_every
        if every is not None and now - self._last_expire >= every and not self._unsent \
                and self.error is None and not self._closed:
            self._last_expire = now
            try:
                self._log.expire(_time.time())
            except HistoryWriteError as e:  # an idle roll refused (Fenced): as in commit()
                self._fail(e)
            except Fenced as e:
                self._fenced(e)

    def _fenced(self, e: Fenced) -> None:
        """The catalog refused the log's index write (:class:`~epochstream.errors.Fenced`):
        the log fails as for any other write it could not make (never the loop)."""
        failed = HistoryWriteError(f"the index write of the epoch log of {self.topic!r} "
                                   f"partition {self.partition} was refused: {e}")
        failed.__cause__ = e
        self._fail(failed)

    def _fail(self, e: HistoryWriteError) -> None:
        """The log failed: nothing more is logged or sent (no epoch it could not log
        completes); the loop is told."""
        log.error("publisher %s/%s: %s", self.topic, self.partition, e)
        self.error = e
        self._unsent.clear()
        self._failed(e)
