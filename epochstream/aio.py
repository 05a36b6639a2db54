"""asyncio twins of :class:`~epochstream.transport.subscriber.Subscriber` and
:class:`~epochstream.transport.publisher.Publisher` (README, "asyncio").

One implementation of the logic, two drivers: an ``aio.Subscriber`` *is* a threaded
``Subscriber`` (same protocol, policies, sockets, filters, history, durable acks) whose
waiting is done by the event loop instead of a blocking poll. Each step processes what has
already arrived without waiting (``Subscriber.fetch(no_wait=True)``: reading, liveness pings
and checks, re-joins); between steps the coroutine awaits readability of the subscriber's
sockets through ``zmq.asyncio`` (shadows of the same sockets, at most
:data:`WAIT_SLICE_S` at a time, so pings and liveness checks keep their pace).

**Cancellation never loses a message.** A coroutine is suspended only while waiting for
readability — never inside a receive (the trap of pyzmq #1925, where a cancelled
``await recv_multipart()`` can drop a message). Whatever was read is held by the subscriber
until a later call hands it out; a pull cancelled while waiting keeps the gaps it met for the
next one. Tested by cancelling pulls at random points under load (tests/test_aio.py).

**Cancellation points.** Inside :meth:`Subscriber.fetch`, :meth:`Subscriber.wait_ready` and
the ``__anext__`` of the iterators that :meth:`Subscriber.epochs` and :meth:`Subscriber.events`
return, the only awaits are :meth:`Subscriber._breathe` (``asyncio.sleep(0)``),
:meth:`Subscriber._readable` (a readability poll, or a sleep) and an iterator's lock (only
when another task's ``anext()`` of the same iterator is running). At each of them nothing is
half-done: what was taken from the threaded subscriber is either handed out already or held
by the ``aio.Subscriber`` (``_out``: epochs and gaps; ``_events``: events and history fills
read as handed out); between two of them the code runs without suspending, so a step is
applied whole or not at all.

**A cancelled ``anext()`` does not end an iterator** (issue 26). :meth:`Subscriber.epochs`
and :meth:`Subscriber.events` return a :class:`StreamIterator`, an object rather than an async
generator (a generator is closed by an exception thrown into it, cancellation included): after
``asyncio.wait_for(anext(it), ...)`` timed out, a ``TaskGroup`` sibling failed or an
``asyncio.timeout()`` block expired, the next ``anext(it)`` goes on with the stream, nothing
lost, nothing twice. Only the stream's end (every partition finished) raises
``StopAsyncIteration``. Tested with every one of those patterns, 60+ random cancellations of
one iterator under load (tests/test_aio_cancel.py).

**Other tasks keep running.** Handing out what has already arrived (a burst, or a history
fill read from the epoch log) never runs longer than :data:`YIELD_EVERY_S` without letting the
event loop run its other tasks, and a history fill is read and decoded as it is handed out
(``events()``: one message at a time; ``fetch``: ``max_epochs`` at a time; ``epochs()``: 64 at
a time, one with ``recover=True``), never all at once, so memory stays bounded.

The ``aio.Publisher``'s ``send`` awaits room in the publisher's queue (flow control holds the
queue back) instead of blocking the thread; ``flush``/``close`` run in a worker thread.

Both are for one task at a time (like their threaded twins, which are for one thread at a
time per subscriber); an iterator pulled by several tasks serves one ``anext()`` at a time.
Constructors look the topic up in the catalog and connect, as the threaded ones do (quick, but
a topic that does not exist yet is waited for up to ``wait`` seconds: :meth:`Subscriber.create`
does that in a worker thread).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable, Generic, TypeVar, Union

import zmq
import zmq.asyncio

from .errors import EpochstreamError
from .events import DataMessage, Epoch, FetchResult, Gap, LowerFrontierUpdate
from .transport.publisher import Publisher as _Publisher
from .transport.subscriber import Subscriber as _Subscriber, pop_event

__all__ = ["Subscriber", "Publisher", "StreamIterator", "WAIT_SLICE_S", "YIELD_EVERY_S"]

WAIT_SLICE_S = 0.05
"""Longest single wait for readability, seconds: liveness pings and checks run between."""

YIELD_EVERY_S = 0.01
"""Longest stretch, seconds, that the subscriber hands out what has already arrived (a burst,
a history fill) before it lets the event loop run other tasks (``await asyncio.sleep(0)``)."""


_BATCH = 64  # epochs an epochs() iterator takes from the threaded stream at a time
_T = TypeVar("_T")
_END = object()  # a step's answer: the stream ended (every partition finished)
_TIMEOUT = object()  # a step's answer: nothing before the deadline


class StreamIterator(Generic[_T]):
    """The async iterator :meth:`Subscriber.epochs` and :meth:`Subscriber.events` return:
    ``async for item in it``, ``await anext(it)``, ``await it.aclose()`` (and so
    ``contextlib.aclosing(it)``).

    Unlike an async generator, a cancelled ``anext(it)`` does not end it: whether the
    cancellation came from ``asyncio.wait_for``, ``asyncio.timeout()``, a failing ``TaskGroup``
    sibling or ``task.cancel()``, the next ``anext(it)`` goes on with the stream, nothing lost
    and nothing twice (what was read is held by the subscriber, never by a suspended call).

    - ``StopAsyncIteration``: only at the stream's real end (every partition finished, every
      item handed out), or after :meth:`aclose`; then on every later ``anext()``.
    - ``TimeoutError`` (iterators made with ``timeout=``): ``timeout`` seconds spent waiting
      in ``anext()`` calls without an item — the waiting of cancelled calls is summed, the time
      the caller spends elsewhere is not. The iterator does not end: the next ``anext()`` waits
      afresh.
    - Failures of the subscriber (``PublisherLost``, ``SubscriberLagged``, ...) are raised
      after every item that arrived before them, and again by every later ``anext()``.
    - Several tasks may pull one iterator: their ``anext()`` calls are served one at a time,
      in the order they began waiting; each item goes to one of them.
    """

    __slots__ = ("_step", "_timeout", "_message", "_waited", "_ended", "_lock")

    def __init__(self, step: Callable[[float | None], Awaitable[Any]], timeout: float | None,
                 message: str):
        self._step = step  # one item, _END or _TIMEOUT (deadline: monotonic seconds or None)
        self._timeout = timeout
        self._message = message  # of the TimeoutError
        self._waited = 0.0  # seconds spent in anext() since the last item handed out
        self._ended = False
        self._lock = asyncio.Lock()  # one anext() at a time

    def __aiter__(self) -> "StreamIterator[_T]":
        return self

    async def __anext__(self) -> _T:
        """The next item; see the class for ``StopAsyncIteration``, ``TimeoutError`` and the
        failures. Cancellable at any point without losing an item."""
        if self._ended:
            raise StopAsyncIteration
        async with self._lock:  # a cancellation point only while another anext() runs
            if self._ended:
                raise StopAsyncIteration
            t0 = time.monotonic()
            timeout = self._timeout
            deadline = None if timeout is None else t0 + max(0.0, timeout - self._waited)
            try:
                item = await self._step(deadline)
            except BaseException:  # cancelled, or a failure: its waiting counts on
                self._waited += time.monotonic() - t0
                raise
            if item is _TIMEOUT:
                self._waited = 0.0  # the next anext() waits afresh
                raise TimeoutError(self._message)
            self._waited = 0.0
            if item is _END:
                self._ended = True
                raise StopAsyncIteration
            return item

    async def aclose(self) -> None:
        """End this iterator: later ``anext()`` calls raise ``StopAsyncIteration``. What it
        has not handed out stays with the subscriber (a new ``epochs()``/``events()`` or a
        ``fetch()`` goes on with it); an ``anext()`` already running in another task may
        still hand out its item."""
        self._ended = True


def _check_pull(max_epochs: Any, max_bytes: Any) -> None:
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be an int >= 1, got {max_epochs!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise ValueError(f"max_bytes must be an int >= 1 (bytes) or None, got {max_bytes!r}")


class Subscriber:
    """``aio.Subscriber(topic, catalog=None, **options)``: the arguments of
    :class:`epochstream.Subscriber`. ``async for epoch in sub.epochs()``, ``await
    sub.fetch(...)``, ``await sub.ack(epoch)``, ``async with``. Raises what the threaded
    subscriber raises (``PublisherLost``, ``NotAuthorized``, ...), from the same calls."""

    def __init__(self, topic: str, catalog=None, **options: Any):
        self._sync = _Subscriber(topic, catalog, **options)
        self._init_state()

    def _init_state(self) -> None:
        self._shadows: dict[int, zmq.asyncio.Socket] = {}
        # taken from the threaded stream, not handed out yet: epochs and gaps, in order
        # (fetch() and every epochs() iterator draw from it first)
        self._out: collections.deque = collections.deque()
        self._error: BaseException | None = None  # met while _out held items: raised after
        # read, not yet handed out: events, and generators of a history fill's DataMessages
        self._events: collections.deque = collections.deque()
        self._awake = time.monotonic()  # when this subscriber last let other tasks run

    @classmethod
    async def create(cls, topic: str, catalog=None, **options: Any) -> "Subscriber":
        """The same, constructed in a worker thread (the catalog lookup may wait)."""
        sub = cls.__new__(cls)
        sub._sync = await asyncio.to_thread(_Subscriber, topic, catalog, **options)
        sub._init_state()
        return sub

    @property
    def threaded(self) -> _Subscriber:
        """The threaded subscriber doing the work (``stats``, ``lower``, ``position``, ...)."""
        return self._sync

    def __getattr__(self, name: str) -> Any:  # stats, lower, finished, topic, position, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sync, name)

    # -- waiting: the only places a pull is suspended (and so may be cancelled) -------------
    async def _readable(self, timeout: float) -> None:
        """Wait until some socket of the subscriber may have a message, at most ``timeout``
        seconds (and at most :data:`WAIT_SLICE_S`). A cancellation point: cancelling it loses
        nothing, no message is received here."""
        socks = self._sync.sockets
        live = {id(s) for s in socks}
        for k in [k for k in self._shadows if k not in live]:  # sockets of an earlier join
            del self._shadows[k]
        poller = zmq.asyncio.Poller()
        for s in socks:
            shadow = self._shadows.get(id(s))
            if shadow is None:
                shadow = self._shadows[id(s)] = zmq.asyncio.Socket.shadow(s.underlying)
            poller.register(shadow, zmq.POLLIN)
        wait = max(0.0, min(timeout, WAIT_SLICE_S))
        if not socks:
            await asyncio.sleep(wait)
        else:
            await poller.poll(int(wait * 1000))
        self._awake = time.monotonic()

    async def _breathe(self) -> None:
        """Let the event loop run other tasks if this subscriber has kept it for more than
        :data:`YIELD_EVERY_S`. A cancellation point: callers await it only before they take
        anything, so cancelling it loses nothing."""
        if time.monotonic() - self._awake > YIELD_EVERY_S:
            await asyncio.sleep(0)
            self._awake = time.monotonic()

    # -- pulling ---------------------------------------------------------------------------
    def _from_stream(self, max_epochs: int, max_bytes: int | None) -> FetchResult | None:
        """One step of the threaded stream that never waits; what it returns (gaps, then
        epochs) is appended to ``_out``. A failure met while ``_out`` holds items is kept in
        ``_error`` (``None`` is returned: hand those out first) and raised by the next step."""
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc
        try:
            r = self._sync.fetch(max_epochs, max_bytes, no_wait=True)
        except EpochstreamError as exc:
            if not self._out:
                raise
            self._error = exc
            return None
        self._out.extend(r.gaps)
        self._out.extend(r.epochs)
        return r

    def _holds_epoch(self) -> bool:
        return any(not isinstance(item, Gap) for item in self._out)

    def _take(self, max_epochs: int, max_bytes: int | None, r: FetchResult | None,
              timed_out: bool = False) -> FetchResult:
        """Hand out of ``_out`` what a fetch returns: its gaps, and epochs up to
        ``max_epochs``/``max_bytes`` (an epoch that does not fit stays for the next pull; one
        larger than ``max_bytes`` on its own comes alone, status ``"epoch_too_large"``)."""
        out = self._out
        epochs: list = []
        gaps: list = []
        nbytes = 0
        too_large = False
        while out:
            item = out[0]
            if isinstance(item, Gap):
                gaps.append(out.popleft())
                continue
            if len(epochs) >= max_epochs:
                break
            if max_bytes is not None and nbytes + item.nbytes > max_bytes:
                if not epochs:
                    epochs.append(out.popleft())
                    too_large = True
                break
            epochs.append(out.popleft())
            nbytes += item.nbytes
        status = ("epoch_too_large" if too_large else "ok" if epochs else
                  "timeout" if timed_out else "no_data")
        finished = r is not None and r.finished and not out
        superseded = r is not None and r.superseded
        return FetchResult(tuple(epochs), status, tuple(gaps), finished, superseded)

    async def fetch(self, max_epochs: int = 1, max_bytes: int | None = None,
                    expires: float | None = None) -> FetchResult:
        """As :meth:`epochstream.Subscriber.fetch` (up to ``max_epochs`` whole epochs whose
        ``nbytes`` sum to at most ``max_bytes`` bytes, a status, gaps, never an epoch split),
        awaiting instead of blocking: ``expires`` seconds at most (``None``: until at least one
        epoch is there); returns as soon as it holds an epoch. Draws from the stream
        :meth:`epochs` iterators draw from (the two may be mixed). Cancelling it loses nothing:
        the gaps it met go to the next pull. ``ValueError`` for invalid arguments; failures as
        the threaded ``fetch``."""
        _check_pull(max_epochs, max_bytes)
        deadline = None if expires is None else time.monotonic() + max(0.0, expires)
        while True:
            await self._breathe()  # cancellation point: nothing taken yet
            if self._holds_epoch():  # left by an epochs() iterator
                return self._take(max_epochs, max_bytes, None)
            r = self._from_stream(max_epochs, max_bytes)
            # None: a failure, kept for the next pull (the gaps held are handed out first)
            if r is None or r.finished or r.superseded or self._holds_epoch():
                return self._take(max_epochs, max_bytes, r)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return self._take(max_epochs, max_bytes, r, timed_out=True)
            await self._readable(WAIT_SLICE_S if left is None else left)  # cancellation point

    async def _next_epoch(self, deadline: float | None) -> Any:
        """One step of an :meth:`epochs` iterator: the next epoch or gap, ``_END`` or
        ``_TIMEOUT`` (``deadline``: monotonic seconds). The threaded stream is pulled into
        ``_out`` :data:`_BATCH` epochs at a time, one at a time with ``recover=True`` (a fetch
        returns its gaps apart from its epochs; one epoch per fetch keeps each gap in its
        place in the stream)."""
        out = self._out
        batch = 1 if self._sync.recover else _BATCH
        while True:
            await self._breathe()  # cancellation point: nothing taken yet
            if not out:
                r = self._from_stream(batch, None)  # out is empty: a failure is raised now
                if not out:
                    if r is not None and r.finished:
                        return _END
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        return _TIMEOUT
                    # cancellation point: what was taken is in out, nothing in hand
                    await self._readable(WAIT_SLICE_S if deadline is None else deadline - now)
                    continue
            return out.popleft()

    def epochs(self, timeout: float | None = None) -> "StreamIterator[Union[Epoch, Gap]]":
        """``async for epoch in sub.epochs()``: as :meth:`epochstream.Subscriber.epochs` —
        whole :class:`~epochstream.events.Epoch` objects in the stream's order (with
        ``recover=True`` a :class:`~epochstream.events.Gap` where it re-joined); ends
        (``StopAsyncIteration``) when every partition finished. ``timeout``: seconds spent
        waiting in ``anext()`` without a new epoch before ``TimeoutError`` (``None``: no
        limit). Returns a :class:`StreamIterator`: a cancelled ``anext()`` does not end it, the
        next one goes on. Draws from the stream :meth:`fetch` draws from: leaving an iterator
        (``break``, ``aclose()``) holds nothing back from the next ``epochs()`` or ``fetch``.
        Raises the threaded subscriber's failures (``PublisherLost``, ...)."""
        return StreamIterator(self._next_epoch, timeout,
                              f"topic {self._sync.topic!r}: no epoch within {timeout} s")

    async def _next_event(self, deadline: float | None) -> Any:
        """One step of an :meth:`events` iterator: the next event, ``_END`` or ``_TIMEOUT``
        (``deadline``: monotonic seconds)."""
        sync, pending = self._sync, self._events
        while True:
            await self._breathe()  # cancellation point: nothing taken yet
            item = pop_event(pending)  # (a history fill: read as handed out)
            if item is not None:
                return item
            got = sync.step_events(0)  # what has arrived, without waiting
            if got is None:
                return _END
            if got:
                pending.extend(got)
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return _TIMEOUT
            # cancellation point: what was read is in pending, nothing in hand
            await self._readable(WAIT_SLICE_S if deadline is None else deadline - now)

    def events(self, timeout: float | None = None
               ) -> "StreamIterator[Union[DataMessage, LowerFrontierUpdate, Gap]]":
        """``async for event in sub.events()``: as :meth:`epochstream.Subscriber.events` —
        :class:`~epochstream.events.DataMessage` (decoded), merged
        :class:`~epochstream.events.LowerFrontierUpdate`, and with ``recover=True``
        :class:`~epochstream.events.Gap`; ends (``StopAsyncIteration``) when every partition
        finished. ``timeout``: seconds spent waiting in ``anext()`` without an event before
        ``TimeoutError`` (``None``: no limit). Returns a :class:`StreamIterator`: a cancelled
        ``anext()`` does not end it, the next one goes on. Events read but not handed out yet
        stay with the subscriber: a new ``events()`` (after ``break`` or ``aclose()``) starts
        with them. Not to be mixed with :meth:`fetch`/:meth:`epochs`. History fills are read
        in the event loop's thread (from the files, or the publishers), one message as it is
        handed out, letting other tasks run at least every :data:`YIELD_EVERY_S`."""
        return StreamIterator(self._next_event, timeout,
                              f"no message for {timeout} s from topic {self._sync.topic!r}")

    async def wait_ready(self, timeout: float = 10.0) -> bool:
        """True once every partition's snapshot arrived (``timeout`` seconds at most)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._sync.wait_ready(0):  # read what has arrived, without waiting
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await self._readable(left)

    async def ack(self, epoch) -> None:
        """:meth:`epochstream.Subscriber.ack` (one catalog write)."""
        self._sync.ack(epoch)

    async def update_filter(self, keys=None, columns=None, where=None, *,
                            timeout: float = 10.0) -> tuple:
        """:meth:`epochstream.Subscriber.update_filter` (a round trip to every publisher; run
        in a worker thread, so this task must not pull meanwhile)."""
        return await asyncio.to_thread(self._sync.update_filter, keys, columns, where,
                                       timeout=timeout)

    def close(self) -> None:
        """Leave every partition (as the threaded ``close``)."""
        self._shadows.clear()
        self._sync.close()

    async def __aenter__(self) -> "Subscriber":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class Publisher:
    """``aio.Publisher(topic, ...)``: the arguments of :class:`epochstream.Publisher`.
    ``await pub.send(t, records)`` (waits for room in the queue instead of blocking),
    ``await pub.advance_to(t)``, ``await pub.flush()``, ``async with`` (an exception inside
    the block aborts, as with the threaded publisher)."""

    def __init__(self, topic: str, *args: Any, **options: Any):
        self._sync = _Publisher(topic, *args, **options)

    @property
    def threaded(self) -> _Publisher:
        """The threaded publisher doing the work."""
        return self._sync

    def __getattr__(self, name: str) -> Any:  # endpoint, lower, stats, subscribers, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sync, name)

    async def _room(self) -> None:
        """Wait (polling, 1 to 10 ms) until the loop's queue has room for one command: flow
        control holds it back while a subscriber's credit or backlog bound is exhausted."""
        pause = 0.001
        while self._sync.would_block:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)

    async def send(self, time_, records) -> None:
        """:meth:`epochstream.Publisher.send`, awaiting room instead of blocking."""
        await self._room()
        self._sync.send(time_, records)

    async def send_encoded(self, time_, payload) -> None:
        """:meth:`epochstream.Publisher.send_encoded`, awaiting room instead of blocking."""
        await self._room()
        self._sync.send_encoded(time_, payload)

    async def advance_to(self, time_):
        """:meth:`epochstream.Publisher.advance_to` (with retention: written, indexed at the
        next commit)."""
        await self._room()
        return self._sync.advance_to(time_)

    async def flush(self, timeout: float | None = 10.0) -> bool:
        """:meth:`epochstream.Publisher.flush`, in a worker thread."""
        return await asyncio.to_thread(self._sync.flush, timeout)

    async def close(self, linger: float = 10.0) -> None:
        """:meth:`epochstream.Publisher.close`, in a worker thread."""
        await asyncio.to_thread(self._sync.close, linger)

    async def abort(self, reason: str = "aborted") -> None:
        """:meth:`epochstream.Publisher.abort`, in a worker thread."""
        await asyncio.to_thread(self._sync.abort, reason)

    async def __aenter__(self) -> "Publisher":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self._sync.__exit__, *exc)
