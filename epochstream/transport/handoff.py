"""The hand-off from a publisher's calling threads to its loop thread.

Commands go into a deque; the loop is woken once per batch of commands (not per command): by
one byte over an ``inproc`` pipe of its own, or, for a loop driven by the process's shared
:mod:`~epochstream.transport.reactor`, by the ``wake()`` function it hands in (one wake-up
for every loop the reactor drives: no pipe, no file descriptors, per publisher). A caller
blocks while ``hwm`` commands are waiting (back-pressure, never loss). The wake-up flag is cleared by the loop only after it consumed the wake-up bytes
and before it drains the deque, so a command appended in between always kicks again (no lost
wake-up). End-of-stream commands (:meth:`Handoff.put_final`) never wait for space, so ``close()``
and ``abort()`` are never stuck behind flow control.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

import zmq

from .sockets import inproc_pair

__all__ = ["Handoff"]


class Handoff:
    """``Handoff(ctx, hwm, loop_alive, wake=None)``: ``hwm`` commands may wait before
    :meth:`put` blocks; ``loop_alive()`` tells whether the consuming loop still runs.
    :attr:`socket` is what the loop polls for wake-ups (``None`` when ``wake`` is given:
    ``wake()`` is then called, from the caller's thread, once per batch instead of a byte sent
    over the pipe); :attr:`commands` the deque it drains."""

    def __init__(self, ctx: zmq.Context, hwm: int, loop_alive: Callable[[], bool],
                 wake: Callable[[], None] | None = None):
        if wake is None:
            self.socket, self._kick = inproc_pair(ctx)
            wake = self._kick_pipe
        else:
            self.socket = self._kick = None
        self._wake = wake
        self.commands: collections.deque = collections.deque()
        self.hwm = int(hwm)
        self._alive = loop_alive
        self._kicked = False
        self._space = threading.Condition(threading.Lock())
        self._waiting = 0
        # False once the loop ran ended(): the per-call check (Thread.is_alive takes a lock:
        # ~6 % of a send's CPU in a profile); loop_alive() is still asked where a caller waits
        self._open = True

    def put(self, command: tuple) -> bool:
        """Append ``command`` (blocking while ``hwm`` are waiting and the loop is alive).
        Returns False, appending nothing, if the loop has ended."""
        if len(self.commands) >= self.hwm:
            with self._space:
                self._waiting += 1
                try:
                    while len(self.commands) >= self.hwm and self._alive():
                        self._space.wait(0.5)
                finally:
                    self._waiting -= 1
            if not self._alive():
                return False
        if not self._open:
            return False
        self._append(command)
        return True

    def put_final(self, command: tuple) -> None:
        """Append an end-of-stream command without waiting for space (at most a few exist)."""
        self._append(command)

    def _append(self, command: tuple) -> None:
        self.commands.append(command)
        if not self._kicked and self._alive():
            self._kicked = True
            self._wake()

    def _kick_pipe(self) -> None:
        self._kick.send(b"K")

    # -- loop side -------------------------------------------------------------------------
    def woken(self) -> None:
        """Consume the wake-up bytes, then re-arm the wake-up (call before draining)."""
        while self.socket is not None:
            try:
                self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        self._kicked = False

    def made_space(self) -> None:
        """Wake callers blocked in :meth:`put` (after the loop drained commands)."""
        if self._waiting:
            with self._space:
                self._space.notify_all()

    def ended(self) -> list:
        """The loop ended: wake every blocked caller; return the commands left undone."""
        self._open = False
        left = list(self.commands)
        self.commands.clear()
        with self._space:
            self._space.notify_all()
        return left

    def close(self) -> None:
        """Close both ends of the wake-up pipe (if it has one)."""
        if self.socket is not None:
            self._kick.close(0)
            self.socket.close(0)
