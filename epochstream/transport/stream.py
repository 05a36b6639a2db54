"""The one stream of released epochs of a subscriber, behind both
:meth:`~epochstream.transport.subscriber.Subscriber.epochs` and
:meth:`~epochstream.transport.subscriber.Subscriber.fetch` (docs/consumers.md, "Pull").

:class:`EpochStream` is composed into the Subscriber and holds its own state: the single
instance of the release generator (epoch assembly, the history fill, durable hand-out
accounting, all the subscriber's), a one-slot buffer of an epoch a fetch took but could not
return (it would overflow ``max_bytes``), a failure to raise on the next call, and the tickets
by which a newer fetch supersedes a waiting one. Each epoch is handed out once, by one of the
two, in the stream's order.

Waiting is done in short poll slices (:data:`SLICE`) under a lock, so that a newer fetch from
another thread supersedes a waiting one within about a slice (no orphaned pulls), ``expires`` is
kept to about a slice, and, between slices, the subscriber checks its publishers' heartbeats.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time as _time
import weakref
from typing import Callable, Iterator

from ..events import FetchResult, Gap

__all__ = ["EpochStream", "SLICE", "BUDGET", "END", "check_fetch", "pop_event"]

_GENERATOR = type(x for x in ())

#: seconds: the longest a waiting fetch waits on its sockets before it looks at supersession,
#: its ``expires`` and the heartbeats again
SLICE = 0.05
#: seconds of processing a fetch that need not wait (``no_wait=True``, or one that already holds
#: an epoch and has no ``expires``) spends on messages that have already arrived before it returns
#: (the rest stays queued for the next call)
BUDGET = 0.1
#: seconds each poll of ``epochs()`` may wait
EPOCHS_SLICE = 0.1
#: seconds a poll of ``epochs()`` may wait once the last poll found nothing (at most half the
#: ping interval, at most what is left of its ``timeout``): an idle subscriber woke 10 times a
#: second, 0.16-0.21 % of a core; 2-3 times a second, ~0.06 % (issue 28, the idle cost)
EPOCHS_IDLE_SLICE = 0.5

END = object()  # the stream ended (every partition finished)


class EpochStream:
    """The shared stream of one subscriber of ``topic``. It drives its ``owner`` (the
    subscriber, held by a weak proxy: the subscriber holds the stream, and a cycle would leave
    a dropped subscriber to the garbage collector, whose ``__del__`` then runs at any moment)
    through four methods:

    - ``_step(slice_s)``: one poll of at most ``slice_s`` seconds: ``None`` once the stream
      ended, else ``(events, read_at, idle)``: the events to hand out (data still encoded),
      the monotonic time the sockets were read (``None`` if they were not: events were
      waiting), and whether nothing at all arrived;
    - ``hand_out(event)``: an event as handed out (data decoded and re-checked; ``None``:
      nothing of it);
    - ``_released(events)``: the generator of released epochs and gaps over an iterator of
      handed-out events, yielding ``None`` for each ``None`` tick of its input;
    - ``_check_heartbeats(read_at)``: after a poll that read the sockets, let the subscriber decide
      whether a silent partition is lost (it keeps the failure; the next step raises it).
    """

    def __init__(self, topic: str, owner):
        self.topic = topic
        self._owner = weakref.proxy(owner)
        self.lock = threading.Lock()  # held around every step of the stream
        self._tickets = itertools.count(1)
        self._current = 0  # the ticket of the newest fetch
        self._source: Iterator | None = None  # the release generator (None: not started, ended)
        self._held: collections.deque = collections.deque()  # taken, not handed out
        self._error: BaseException | None = None  # raised by the next call (after a batch)
        self._read_at: float | None = None  # monotonic time of the last poll that read
        self._slice = EPOCHS_SLICE  # seconds the current poll may wait
        self.idle = False  # the last poll read no message and released nothing

    # -- the stream --------------------------------------------------------------------------
    def _ticks(self) -> Iterator:
        """The release generator's input: handed-out events, and a ``None`` tick after each
        poll (busy or idle: :attr:`idle` tells), so that a caller regains control after every
        poll even while data keeps arriving; ends with the stream."""
        owner = self._owner
        hand_out = owner.hand_out
        while True:
            got = owner._step(self._slice)
            if got is None:
                return
            events, read_at, idle = got
            if read_at is not None:
                self._read_at = read_at
            for i, m in enumerate(events):
                events[i] = None  # a handed-out event holds its decoded records: not kept here
                m = hand_out(m)
                if m is not None:
                    yield m
            self.idle = idle
            yield None

    def next(self, slice_s: float):
        """The next item (an Epoch, a Gap, ``None`` after a poll, or :data:`END`), waiting at
        most ``slice_s`` seconds per poll. Call with :attr:`lock` held. A failure propagates
        (the subscriber keeps it: a new source raises it again)."""
        if self._held:
            return self._held.popleft()
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc
        if self._source is None:
            self._source = self._owner._released(self._ticks())
        self._slice = slice_s
        try:
            return next(self._source)
        except StopIteration:
            self._source = None
            return END
        except BaseException:
            self._source = None
            raise

    def epochs(self, timeout: float | None) -> Iterator:
        """``epochs()``: the stream without its ticks; ``TimeoutError`` after ``timeout``
        seconds of idle polls without an epoch (or gap)."""
        last = _time.monotonic()
        while True:
            with self.lock:
                item = self.next(self._epochs_slice(timeout, last))
            if item is END:
                return
            if item is None:
                if timeout is not None and self.idle and _time.monotonic() - last > timeout:
                    raise TimeoutError(f"no complete epoch for {timeout} s from topic "
                                       f"{self.topic!r}")
                continue
            last = _time.monotonic()
            yield item

    def _epochs_slice(self, timeout: float | None, last: float) -> float:
        """How long the next poll of ``epochs()`` may wait: :data:`EPOCHS_SLICE`, or while the
        stream is idle :data:`EPOCHS_IDLE_SLICE` (bounded by half the ping interval and by
        what is left of ``timeout``). A message wakes the poll at once either way."""
        if not self.idle:
            return EPOCHS_SLICE
        s = min(EPOCHS_IDLE_SLICE, getattr(self._owner, "ping_interval", 1.0) / 2)
        if timeout is not None:
            s = min(s, max(EPOCHS_SLICE, last + timeout - _time.monotonic()))
        return max(EPOCHS_SLICE, s)

    # -- pulling -----------------------------------------------------------------------------
    def fetch(self, max_epochs: int, max_bytes: int | None, expires: float | None,
              no_wait: bool, failure: Callable[[], BaseException | None]) -> FetchResult:
        """One pull (arguments checked by the caller; ``failure()``: the subscriber's pending
        failure, raised again by a new source): see
        :meth:`~epochstream.transport.subscriber.Subscriber.fetch`."""
        me = next(self._tickets)
        self._current = me  # supersedes a waiting fetch: it sees this between two slices
        deadline = None if no_wait or expires is None else _time.monotonic() + expires
        pull = _Pull(max_epochs, max_bytes, _time.monotonic() + BUDGET if no_wait else None)
        item = None
        while True:
            with self.lock:
                if self._current != me:
                    pull.superseded = True
                    break
                item, stop = self._one(pull, deadline, failure)
            if stop:
                break
            now = _time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if item is None and pull.hurry is not None and (self.idle or now >= pull.hurry):
                break
        return pull.result(deadline)

    def _one(self, pull: "_Pull", deadline: float | None, failure) -> tuple:
        """One item into ``pull`` (with :attr:`lock` held): ``(item, stop)``."""
        if deadline is not None:
            slice_s = max(0.0, min(SLICE, deadline - _time.monotonic()))
        else:
            slice_s = 0.0 if pull.hurry is not None else SLICE
        try:
            item = self.next(slice_s)
        except Exception as exc:
            if not pull.epochs and not pull.gaps:
                raise
            if exc is not failure():  # not raised again by a new source: keep it
                self._error = exc
            return None, True
        if item is None:
            read_at, self._read_at = self._read_at, None
            if read_at is not None:
                self._owner._check_heartbeats(read_at)
            return None, False
        if item is END:
            pull.finished = not self._held
            return item, True
        if type(item) is Gap:
            pull.gaps.append(item)
            return item, False
        if pull.max_bytes is not None and pull.nbytes + item.nbytes > pull.max_bytes:
            if pull.epochs:
                self._held.appendleft(item)  # next call's first epoch
            else:
                pull.epochs.append(item)
                pull.status = "epoch_too_large"
            return item, True
        pull.epochs.append(item)
        pull.nbytes += item.nbytes
        if len(pull.epochs) >= pull.max_epochs:
            return item, True
        if deadline is None and pull.hurry is None:
            pull.hurry = _time.monotonic() + BUDGET  # holds one: take what arrived
        return item, False


class _Pull:
    """What one fetch gathered so far."""

    def __init__(self, max_epochs: int, max_bytes: int | None, hurry: float | None):
        self.max_epochs, self.max_bytes, self.hurry = max_epochs, max_bytes, hurry
        self.epochs: list = []
        self.gaps: list = []
        self.nbytes = 0
        self.status: str | None = None
        self.finished = self.superseded = False

    def result(self, deadline: float | None) -> FetchResult:
        status = self.status
        if status is None:
            status = ("ok" if self.epochs else
                      "timeout" if (deadline is not None and not self.superseded
                                    and not self.finished and _time.monotonic() >= deadline)
                      else "no_data")
        return FetchResult(tuple(self.epochs), status, tuple(self.gaps), self.finished,
                           self.superseded)


def check_fetch(max_epochs, max_bytes, expires) -> None:
    """``ValueError`` for an invalid argument of :meth:`~epochstream.transport.subscriber.Subscriber.fetch`."""
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be an int >= 1, got {max_epochs!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise ValueError(f"max_bytes must be an int >= 1 (bytes) or None, got {max_bytes!r}")
    if expires is not None:
        if isinstance(expires, bool) or not isinstance(expires, (int, float)) or \
                math.isnan(expires) or expires < 0:
            raise ValueError(f"expires must be seconds >= 0 or None, got {expires!r}")


def pop_event(pending: collections.deque):
    """The next event of ``pending`` — a deque of what :meth:`~epochstream.transport.subscriber.Subscriber.step_events`
    returned: events, and iterators of a history fill's ``DataMessage``\\ s, read as they are
    handed out — or ``None`` when it is empty."""
    while pending:
        item = pending[0]
        if type(item) is not _GENERATOR:
            return pending.popleft()
        item = next(item, None)  # a history fill, read as it is handed out
        if item is not None:
            return item
        pending.popleft()
    return None
