"""Who drives a publisher's loop: a thread of its own, or the process's one shared reactor.

A :class:`~epochstream.transport.loop.PublisherLoop` is a step (:meth:`~PublisherLoop.wants`,
:meth:`~PublisherLoop.step`) that a driver calls. :class:`OwnThread` runs it in a thread of
its own (:meth:`PublisherLoop.run`). :class:`Reactor` is one daemon thread per process that
steps every publisher attached to it, so N publishers cost one thread, not N:

- **Waiting** is one ``select.epoll`` over each attached ROUTER's ``zmq.FD`` and one
  ``eventfd`` that every publisher's :class:`~epochstream.transport.handoff.Handoff` wakes
  (no wake-up pipe per publisher). ZeroMQ's FD only says the socket's state may have changed:
  a publisher whose FD fired is stepped, its ``zmq.EVENTS`` read, and after every step the
  ROUTER's ``zmq.EVENTS`` is read again (a send or receive in the step may have taken the
  signal): one still readable is stepped again without waiting, as zmq.asyncio does.
- **Timers** (heartbeats, the 1 ms retries of a backlog, a close's linger) are one heap of
  deadlines: an idle publisher costs nothing until its own deadline; a pass costs
  O(publishers with something to do), not O(publishers).
- **Fairness**: a pass steps each runnable publisher once, in the order they became runnable
  (round-robin), and a step is bounded (4096 commands, a pass of subscriber messages).
- **Isolation**: a step that raises ends that publisher only (:meth:`PublisherLoop.fail`: its
  ``error`` kept and raised to its callers; :meth:`PublisherLoop.finish`: its blocked callers
  and flush waiters released); the reactor and the other publishers go on.
- **Lifetime**: started with the first publisher attached, the thread ends when the last one
  leaves (a later publisher starts a new one). After a ``fork`` the child gets its own.

Which loops may share (:func:`loop_mode`): only loops that never block. A publisher with an
epoch log (``retention``) fsyncs, commits catalog transactions and may wait for an object store
in its loop: it always has a thread of its own. A publisher with a catalog writes its upper
frontier there from its loop, once per burst of new epochs (transport/upper.py): by default
it has a thread of its own too (a slow or unreachable catalog would stall every topic of the
process); ``loop="shared"`` asks for the reactor anyway.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time as _time

import zmq

__all__ = ["Reactor", "OwnThread", "SharedLoop", "loop_mode", "driver", "shared_reactor"]

log = logging.getLogger("epochstream.transport")

#: the values of ``Publisher(loop=...)``
LOOP_MODES = ("shared", "own")


def loop_mode(requested: str | None, *, log_kept: bool, catalog: bool) -> str:
    """The driver of a publisher's loop: ``requested`` (``"shared"``, ``"own"`` or ``None``:
    ``"shared"`` unless the publisher keeps an epoch log or has a catalog, or the platform
    has no ``select.epoll``). ``ValueError`` for another value, or ``"shared"`` with an epoch
    log (its loop blocks on fsyncs and uploads) or without ``select.epoll``."""
    if requested is not None and requested not in LOOP_MODES:
        raise ValueError(f"loop must be one of {LOOP_MODES} or None, got {requested!r}")
    shareable = hasattr(select, "epoll") and hasattr(os, "eventfd")
    if requested == "shared" and log_kept:
        raise ValueError('loop="shared" is not for a publisher with retention: its loop '
                         "blocks on fsyncs, catalog commits and uploads (it needs its own)")
    if requested == "shared" and not shareable:
        raise ValueError('loop="shared" needs select.epoll and os.eventfd (Linux)')
    if requested is None:
        return "shared" if shareable and not log_kept and not catalog else "own"
    return requested


def driver(mode: str, name: str):
    """A driver for ``mode`` (:func:`loop_mode`): an :class:`OwnThread` named ``name``, or a
    :class:`SharedLoop` of the process's :func:`shared_reactor`."""
    return OwnThread(name) if mode == "own" else SharedLoop(shared_reactor(), name)


class OwnThread:
    """Drives one loop in a daemon thread of its own: ``bind(loop, router)``, then
    ``start()``; ``is_alive()``, ``join(timeout)`` as a thread's. :attr:`wake` is ``None``:
    the loop's hand-off has its own wake-up pipe."""

    wake = None

    def __init__(self, name: str):
        self.name, self._thread = name, None

    def bind(self, loop, router: zmq.Socket) -> None:
        """The loop to run (``router`` is not used: the loop polls it)."""
        self._thread = threading.Thread(target=loop.run, daemon=True, name=self.name)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None and self._thread.ident is not None:
            self._thread.join(timeout)

    native_id = property(lambda self: self._thread.native_id, doc="The thread's native id.")


class SharedLoop:
    """One loop's membership in a :class:`Reactor`: ``bind(loop, router)``, then ``start()``
    (attaches it; the reactor steps it from then on); ``is_alive()`` until the loop ended (and
    was detached), ``join(timeout)`` (seconds) waits for that. :meth:`wake` is the loop's
    hand-off's wake-up (any thread)."""

    def __init__(self, reactor: "Reactor", name: str):
        self.name, self._reactor = name, reactor
        self.loop = self.router = None
        self.fd = -1
        self.woken = False  # notified by a caller; the reactor re-arms the hand-off
        self.deadline: float | None = None  # of its newest timer in the heap
        self.steps = 0  # steps the reactor made of this loop (for tests and benchmarks)
        self._started = False
        self._ended = threading.Event()

    def bind(self, loop, router: zmq.Socket) -> None:
        self.loop, self.router = loop, router

    def start(self) -> None:
        self._started = True
        self._reactor.attach(self)

    def is_alive(self) -> bool:
        return self._started and not self._ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        if self._started:
            self._ended.wait(timeout)

    def wake(self) -> None:
        self._reactor.notify(self)

    native_id = property(lambda self: self._reactor.native_id,
                         doc="The reactor thread's native id (None while it is not running).")


class Reactor:
    """One thread stepping every attached loop (see the module docstring). Thread-safe:
    :meth:`attach` and :meth:`notify` from any thread; everything else runs in its thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._efd, select.EPOLLIN)
        self._signalled = False  # the eventfd was written and the lists not taken since
        self._woken: list[SharedLoop] = []
        self._joining: list[SharedLoop] = []
        self._count = 0  # attached and not yet ended (under the lock)
        self._thread: threading.Thread | None = None
        self._members: dict[int, SharedLoop] = {}  # by ROUTER fd (reactor thread only)
        self._runnable: dict[SharedLoop, None] = {}  # an ordered set: round-robin
        self._timers: list = []  # heap of (deadline, seq, member)
        self._seq = itertools.count()
        self.passes = 0  # passes of the reactor's loop (a counter for tests and benchmarks)
        self.broken: BaseException | None = None  # what killed the reactor itself (a bug)

    native_id = property(lambda self: None if self._thread is None else self._thread.native_id)

    @property
    def members(self) -> int:
        """Loops attached and not ended (approximate: read from another thread)."""
        return self._count

    def attach(self, member: SharedLoop) -> None:
        """Drive ``member`` (bound) from now on; starts the thread if it is not running."""
        with self._lock:
            broken = self.broken
            if broken is None:
                self._joining.append(member)
                self._count += 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="epochstream-reactor")
                    self._thread.start()
        if broken is not None:  # (shared_reactor() hands out a new reactor from now on)
            member.loop.fail(broken)
            member.loop.finish()
            member._ended.set()
            return
        self._signal()

    def notify(self, member: SharedLoop) -> None:
        """``member``'s hand-off has new commands (any thread; once per batch)."""
        with self._lock:
            self._woken.append(member)
            if self._signalled:
                return
            self._signalled = True
        os.eventfd_write(self._efd, 1)

    def _signal(self) -> None:
        with self._lock:
            if self._signalled:
                return
            self._signalled = True
        os.eventfd_write(self._efd, 1)

    # -- the reactor thread ------------------------------------------------------------------
    def _run(self) -> None:
        """The thread's body; a bug of the reactor itself (not of a loop: :meth:`_step`
        contains those) ends every member with it, as their own threads would have."""
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - no member may wait for a dead thread
            log.exception("the publisher reactor died")
            with self._lock:
                self.broken = exc
                joining, self._joining = self._joining, []
            for member in joining:
                member.loop.fail(exc)
                self._leave(member, registered=False)
            for member in list(self._members.values()):
                member.loop.fail(exc)
                self._leave(member)

    def _serve(self) -> None:
        while True:
            runnable = self._runnable
            timeout = 0 if runnable else self._wait_s()
            for fd, _ in self._epoll.poll(timeout):
                if fd == self._efd:
                    self._take()
                else:
                    member = self._members.get(fd)
                    if member is not None:
                        runnable[member] = None
            now = _time.monotonic()
            timers = self._timers
            while timers and timers[0][0] <= now:
                deadline, _, member = heapq.heappop(timers)
                if member.deadline == deadline:
                    member.deadline = None
                    runnable[member] = None
            batch = list(runnable)
            runnable.clear()
            for member in batch:
                self._step(member)
            self.passes += 1
            if not self._members and self._ended_last():
                return

    def _wait_s(self) -> float:
        """Seconds until the earliest timer (-1: none, wait for a wake-up)."""
        timers = self._timers
        while timers and timers[0][2].deadline != timers[0][0]:
            heapq.heappop(timers)  # a timer replaced by an earlier one, or of a loop gone
        if not timers:
            return -1
        return max(0.0, timers[0][0] - _time.monotonic())

    def _ended_last(self) -> bool:
        """No loop is attached any more: the thread ends (True), unless one is joining."""
        with self._lock:
            if self._count or self._joining:
                return False
            self._thread = None
            return True

    def _take(self) -> None:
        """The eventfd fired: consume it, then take the wake-ups and the new members (in
        that order: a wake-up after the take writes the eventfd again)."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            woken, self._woken = self._woken, []
            joining, self._joining = self._joining, []
            self._signalled = False
        for member in joining:
            self._join(member)
        for member in woken:
            if self._members.get(member.fd) is member:
                member.woken = True
                self._runnable[member] = None

    def _join(self, member: SharedLoop) -> None:
        try:
            member.loop.start()
            member.fd = member.router.get(zmq.FD)
            self._epoll.register(member.fd, select.EPOLLIN)
        except BaseException as exc:  # noqa: BLE001 - that loop ends, the reactor goes on
            member.loop.fail(exc)
            self._leave(member, registered=False)
            return
        self._members[member.fd] = member
        member.woken = True
        self._runnable[member] = None

    def _step(self, member: SharedLoop) -> None:
        """One bounded step of ``member``'s loop; then it is runnable again or has a timer."""
        loop, router = member.loop, member.router
        member.steps += 1
        try:
            woken, member.woken = member.woken, False
            loop.step((router,) if router.get(zmq.EVENTS) & zmq.POLLIN else (), woken)
            if loop.done:
                self._leave(member)
                return
            _, timeout = loop.wants()
            if timeout == 0 or router.get(zmq.EVENTS) & zmq.POLLIN:
                self._runnable[member] = None
                return
        except BaseException as exc:  # noqa: BLE001 - that loop ends, the reactor goes on
            loop.fail(exc)
            self._leave(member)
            return
        deadline = _time.monotonic() + timeout / 1000.0
        if member.deadline is None or deadline < member.deadline:
            member.deadline = deadline
            heapq.heappush(self._timers, (deadline, next(self._seq), member))

    def _leave(self, member: SharedLoop, registered: bool = True) -> None:
        """``member``'s loop ended: stop watching its ROUTER, release its callers, count it
        out; :meth:`SharedLoop.join` returns from now on."""
        if registered and self._members.get(member.fd) is member:  # (its fd not reused yet)
            del self._members[member.fd]
            try:
                self._epoll.unregister(member.fd)
            except (OSError, ValueError):
                pass
        member.deadline = None
        self._runnable.pop(member, None)
        try:
            member.loop.finish()
        except BaseException:  # noqa: BLE001 - logged; the others go on
            log.exception("publisher loop %s: its end failed", member.name)
        finally:
            with self._lock:
                self._count -= 1
            member._ended.set()


_reactor: tuple[int, Reactor] | None = None
_reactor_lock = threading.Lock()


def _forget_in_child() -> None:
    """After a ``fork``: the parent's reactor thread does not exist in the child (and its lock
    may have been held by another thread): the child starts afresh."""
    global _reactor, _reactor_lock
    _reactor, _reactor_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def shared_reactor() -> Reactor:
    """The process's :class:`Reactor` (created on first use; a new one in a forked child)."""
    global _reactor
    with _reactor_lock:
        if _reactor is None or _reactor[0] != os.getpid() or _reactor[1].broken is not None:
            _reactor = (os.getpid(), Reactor())
        return _reactor[1]
