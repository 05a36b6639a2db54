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

**Other tasks keep running.** Handing out what has already arrived (a burst, or a history
fill read from the epoch log) never runs longer than :data:`YIELD_EVERY_S` without letting the
event loop run its other tasks, and a history fill is read and decoded as it is handed out
(``events()``: one message at a time; ``fetch``/``epochs()``: ``max_epochs`` at a time), never
all at once, so memory stays bounded by what the caller holds.

The ``aio.Publisher``'s ``send`` awaits room in the publisher's queue (flow control holds the
queue back) instead of blocking the thread; ``flush``/``close`` run in a worker thread.

Both are for one task at a time (like their threaded twins, which are for one thread at a
time per subscriber). Constructors look the topic up in the catalog and connect, as the
threaded ones do (quick, but a topic that does not exist yet is waited for up to ``wait``
seconds: :meth:`Subscriber.create` does that in a worker thread).
"""

from __future__ import annotations

import asyncio
import collections
import time
import types
from typing import Any, AsyncIterator

import zmq
import zmq.asyncio

from .events import Epoch, FetchResult, Gap
from .transport.resume import HistoryBatch, Rejoined
from .transport.publisher import Publisher as _Publisher
from .transport.subscriber import Subscriber as _Subscriber

__all__ = ["Subscriber", "Publisher", "WAIT_SLICE_S", "YIELD_EVERY_S"]

WAIT_SLICE_S = 0.05
"""Longest single wait for readability, seconds: liveness pings and checks run between."""

YIELD_EVERY_S = 0.01
"""Longest stretch, seconds, that the subscriber hands out what has already arrived (a burst,
a history fill) before it lets the event loop run other tasks (``await asyncio.sleep(0)``)."""


class Subscriber:
    """``aio.Subscriber(topic, catalog=None, **options)``: the arguments of
    :class:`epochstream.Subscriber`. ``async for epoch in sub.epochs()``, ``await
    sub.fetch(...)``, ``await sub.ack(epoch)``, ``async with``. Raises what the threaded
    subscriber raises (``PublisherLost``, ``NotAuthorized``, ...), from the same calls."""

    def __init__(self, topic: str, catalog=None, **options: Any):
        self._sync = _Subscriber(topic, catalog, **options)
        self._shadows: dict[int, zmq.asyncio.Socket] = {}
        self._gaps: list[Gap] = []  # met by a pull that was cancelled while waiting
        # read, not yet handed out: events, and generators of a history fill's DataMessages
        self._events: collections.deque = collections.deque()
        self._awake = time.monotonic()  # when this subscriber last let other tasks run

    @classmethod
    async def create(cls, topic: str, catalog=None, **options: Any) -> "Subscriber":
        """The same, constructed in a worker thread (the catalog lookup may wait)."""
        sub = cls.__new__(cls)
        sub._sync = await asyncio.to_thread(_Subscriber, topic, catalog, **options)
        sub._shadows, sub._gaps, sub._events = {}, [], collections.deque()
        sub._awake = time.monotonic()
        return sub

    @property
    def threaded(self) -> _Subscriber:
        """The threaded subscriber doing the work (``stats``, ``lower``, ``position``, ...)."""
        return self._sync

    def __getattr__(self, name: str) -> Any:  # stats, lower, finished, topic, position, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sync, name)

    # -- waiting ---------------------------------------------------------------------------
    async def _readable(self, timeout: float) -> None:
        """Wait until some socket of the subscriber may have a message, at most ``timeout``
        seconds (and at most :data:`WAIT_SLICE_S`). Cancelling it loses nothing: no message
        is received here."""
        socks = list(self._sync._sockets)
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
        :data:`YIELD_EVERY_S` (cancelling it here loses nothing: nothing is in hand)."""
        if time.monotonic() - self._awake > YIELD_EVERY_S:
            await asyncio.sleep(0)
            self._awake = time.monotonic()

    # -- pulling ---------------------------------------------------------------------------
    async def fetch(self, max_epochs: int = 1, max_bytes: int | None = None,
                    expires: float | None = None) -> FetchResult:
        """As :meth:`epochstream.Subscriber.fetch` (whole epochs, a status, gaps, never an
        epoch split), awaiting instead of blocking: ``expires`` seconds at most (``None``:
        until at least one epoch is there)."""
        deadline = None if expires is None else time.monotonic() + max(0.0, expires)
        while True:
            await self._breathe()
            r = self._sync.fetch(max_epochs, max_bytes, no_wait=True)
            if r.gaps:
                self._gaps.extend(r.gaps)
            if r.epochs or r.finished or r.superseded:
                return self._with_gaps(r, r.status)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return self._with_gaps(r, "timeout")
            await self._readable(WAIT_SLICE_S if left is None else left)

    def _with_gaps(self, r: FetchResult, status: str) -> FetchResult:
        gaps, self._gaps = tuple(self._gaps), []
        return FetchResult(r.epochs, status, gaps, r.finished, r.superseded)

    async def epochs(self, timeout: float | None = None) -> AsyncIterator[Epoch | Gap]:
        """``async for epoch in sub.epochs()``: as :meth:`epochstream.Subscriber.epochs`
        (with ``recover=True`` a :class:`~epochstream.events.Gap` where it re-joined; ends
        when every partition finished; ``timeout``: seconds without a new epoch before
        ``TimeoutError``)."""
        while True:
            r = await self.fetch(max_epochs=64, expires=timeout)
            for gap in r.gaps:
                yield gap
            for epoch in r.epochs:
                yield epoch
            if r.finished:
                return
            if r.status == "timeout":
                raise TimeoutError(f"topic {self._sync.topic!r}: no epoch within {timeout} s")

    async def events(self, timeout: float | None = None) -> AsyncIterator:
        """``async for event in sub.events()``: as :meth:`epochstream.Subscriber.events` —
        :class:`~epochstream.events.DataMessage` (decoded), merged
        :class:`~epochstream.events.LowerFrontierUpdate`, and with ``recover=True``
        :class:`~epochstream.events.Gap`; ends when every partition finished; ``timeout``:
        seconds without an event before ``TimeoutError``. Events read but not handed out yet
        stay with the subscriber: a generator closed by a cancellation loses none, the next
        ``events()`` starts with them. Not to be mixed with :meth:`fetch`/:meth:`epochs`.
        History fills are read in the event loop's thread (from the files, or the
        publishers), one message as it is handed out, letting other tasks run at least every
        :data:`YIELD_EVERY_S`."""
        sync, pending = self._sync, self._events
        last = time.monotonic()
        while True:
            while pending:
                await self._breathe()
                item = pending[0]
                if type(item) is types.GeneratorType:  # a history fill, read as handed out
                    item = next(item, None)
                    if item is None:
                        pending.popleft()
                        continue
                else:
                    pending.popleft()
                last = time.monotonic()
                yield item
            got = sync._poll(0)  # what has arrived, without waiting
            if got:
                self._queue_events(got)
                continue
            if sync._protocol.finished and not sync._parked:
                return
            if timeout is not None and time.monotonic() - last > timeout:
                raise TimeoutError(f"no message for {timeout} s from topic {sync.topic!r}")
            await self._readable(WAIT_SLICE_S if timeout is None
                                 else max(0.0, last + timeout - time.monotonic()))

    def _queue_events(self, got: list) -> None:
        """Hand out ``got`` (the threaded subscriber's outputs) into the pending events."""
        sync, pending = self._sync, self._events
        for m in got:
            m = sync._hand_out(m)
            kind = type(m)
            if m is None:
                continue
            if kind is HistoryBatch:
                pending.append(sync._history_messages(m))  # read as handed out
            elif kind is Rejoined:
                if m.withdraw is not None:
                    pending.append(m.withdraw)
            else:
                pending.append(m)

    async def wait_ready(self, timeout: float = 10.0) -> bool:
        """True once every partition's snapshot arrived (``timeout`` seconds at most)."""
        deadline = time.monotonic() + timeout
        while True:
            self._sync._pump(0)  # read what has arrived, without waiting
            if self._sync._protocol.ready:
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
        handoff = self._sync._handoff
        pause = 0.001
        while len(handoff.commands) >= handoff.hwm and self._sync._thread.is_alive():
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
