"""A subscriber's links to its partitions' publishers: one DEALER per live partition, the hello
it sends, waiting for readable links with one ``epoll``, pings, flow-control credit grants, and
goodbyes.

Waiting costs what is ready, not the number of partitions (a ``zmq.Poller`` looks at every
socket on every pass: 0.6 µs per socket, measured in docs/benchmarks.md). ZeroMQ signals a
socket's ``zmq.FD`` only when its mailbox gets a command (``activate_read`` once a pipe that was
read empty gets a message), and any operation on the socket may consume that signal. So the
links keep the sockets that may hold a message without a signal, :attr:`PartitionLinks.unsettled`:
every socket handed out by :meth:`~PartitionLinks.poll` until its reader meets ``zmq.Again``
(:meth:`~PartitionLinks.settled`), every socket that ``EVENTS`` shows readable after a send on
it, every new socket — and every socket when
an outside wait may have consumed signals (:meth:`~PartitionLinks.unsettle_all`; a poll with a
zero timeout does it itself). This is what ``zmq.asyncio`` does (it checks ``EVENTS`` after each
operation); a failed ``recv`` processes the socket's commands, so it both settles the socket and
clears a stale signal.

:class:`PartitionLinks` is composed into the
:class:`~epochstream.transport.subscriber.Subscriber` and holds its own state; a re-join
replaces every link (:meth:`PartitionLinks.connect` after :meth:`PartitionLinks.retire` of each).
It knows nothing of the protocol: it moves frames (docs/protocol.md §3, §4).
"""

from __future__ import annotations

import os
import select
import threading
from typing import Any, Callable

import zmq

from .. import wire
from .sockets import connect_dealer, receive_from, send_nowait

__all__ = ["PartitionLinks"]


class PartitionLinks:
    """The links of one subscriber: ``ctx`` (its ``zmq.Context``), ``rcvhwm`` (messages),
    ``ping_interval`` (seconds), ``security`` (a CURVE client's
    :class:`~epochstream.security.Security` or ``None``), ``credit`` (messages or epochs per
    partition, ``None``: no flow control)."""

    def __init__(self, ctx: zmq.Context, *, rcvhwm: int, ping_interval: float, security,
                 credit: int | None):
        self._ctx, self._rcvhwm, self._ping_interval = ctx, int(rcvhwm), float(ping_interval)
        self._security, self._credit = security, credit
        #: socket -> partition, for every live link
        self.partition_of: dict[zmq.Socket, int] = {}
        #: partition -> socket
        self.by_partition: dict[int, zmq.Socket] = {}
        #: socket -> its non-blocking receive function (transport/sockets.py)
        self.receivers: dict[zmq.Socket, Callable[[], list]] = {}
        self._epoll = select.epoll()
        #: set (then :meth:`interrupt`) by a closing thread; held by the reading thread for a
        #: whole pass, by the closing one while it closes the sockets (a ZeroMQ socket is
        #: never used by two threads at once)
        self.closed, self.lock = False, threading.RLock()  # (re-entrant: never a self-deadlock)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # ends a wait: interrupt()
        self._epoll.register(self._wake, select.EPOLLIN)
        self._by_fd: dict[int, zmq.Socket] = {}
        #: the sockets that may hold a message their ``zmq.FD`` did not signal, in the order
        #: they became so (a dict used as an ordered set; see the module docstring)
        self.unsettled: dict[zmq.Socket, None] = {}
        self._unacked: dict[int, int] = {}  # partition -> credit consumed, not granted back yet

    def connect(self, partition: int, endpoint: str, hello: dict,
                server_key: str | None = None) -> None:
        """Open ``partition``'s link to ``endpoint`` and send ``hello`` (the ``h`` fields)."""
        s = connect_dealer(self._ctx, endpoint, rcvhwm=self._rcvhwm,
                           ping_interval=self._ping_interval, security=self._security,
                           server_key=server_key)
        send_nowait(s, wire.encode_control(wire.HELLO, **hello))  # a fresh pipe takes it
        self.partition_of[s] = partition
        self.receivers[s] = receive_from(s)
        self.by_partition[partition] = s
        fd = s.get(zmq.FD)
        self._by_fd[fd] = s
        self._epoll.register(fd, select.EPOLLIN)
        self.unsettled[s] = None  # the hello's send may have taken a signal
        self._unacked[partition] = 0

    def retire(self, partition: int) -> bool:
        """Say goodbye (``b``) to ``partition``'s publisher and close its link; False if it had
        none."""
        s = self.by_partition.pop(partition, None)
        if s is None:
            return False
        try:
            s.send_multipart(wire.encode_control(wire.BYE), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        fd = s.get(zmq.FD)
        self._epoll.unregister(fd)
        del self._by_fd[fd]
        self.unsettled.pop(s, None)
        del self.partition_of[s]
        self.receivers.pop(s, None)
        s.close(100)
        return True

    def poll(self, timeout_ms: int | None) -> list:
        """``[socket, ...]``: the links that may be readable, waiting up to
        ``timeout_ms`` milliseconds (``None``: until one may be) when none is unsettled. The
        reader calls :meth:`settled` for each socket it read until ``zmq.Again``; the others stay
        unsettled and are handed out again. ``timeout_ms == 0`` (a non-blocking step, between
        which an event loop may wait on the sockets itself) looks at every link. Costs what is
        ready, not the number of links."""
        unsettled = self.unsettled
        if timeout_ms == 0:
            self.unsettle_all()
        if unsettled:
            fired = self._epoll.poll(0)
        else:
            fired = self._epoll.poll(-1 if timeout_ms is None else timeout_ms / 1000)
        if fired:
            by_fd = self._by_fd
            for fd, _ in fired:
                s = by_fd.get(fd)
                if s is not None:
                    unsettled[s] = None
                elif fd == self._wake:
                    os.eventfd_read(fd)
        return list(unsettled)

    def settled(self, s: zmq.Socket) -> None:
        """``s`` was read until ``zmq.Again``: its ``zmq.FD`` signals the next message."""
        self.unsettled.pop(s, None)

    def unsettle_all(self) -> None:
        """Look at every link on the next :meth:`poll` (something outside these links — an
        event loop waiting on the sockets — may have consumed their signals)."""
        self.unsettled.update(dict.fromkeys(self.partition_of))

    def send_all(self, frames: list) -> None:
        """Send ``frames`` on every link without blocking (a link with no pipe — a refused
        handshake — does not take them: the liveness timeout tells)."""
        for s in list(self.by_partition.values()):
            send_nowait(s, frames)
            self._sent_on(s)

    def ping(self, frames: list) -> None:
        """Send the ping ``frames`` on every link (best effort)."""
        for s in self.partition_of:
            try:
                s.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self._sent_on(s)

    def _sent_on(self, s: zmq.Socket) -> None:
        """A send on ``s`` may have taken its signal: ask ``EVENTS`` (1 µs: cheaper than the
        extra read pass an unsettled link costs an idle subscriber, ~50 µs)."""
        if s.get(zmq.EVENTS) & zmq.POLLIN:
            self.unsettled[s] = None

    def spend_credit(self, partition: int) -> None:
        """One credited message (or epoch) of ``partition`` was read: grant credit back once
        half of it is used (``c``)."""
        n = self._unacked.get(partition, 0) + 1
        if n >= max(1, self._credit // 2):
            s = self.by_partition.get(partition)
            if s is not None:
                self.unsettled[s] = None  # (the send may take the socket's signal)
                if not send_nowait(s, wire.encode_control(wire.CREDIT, messages=n)):
                    self._unacked[partition] = n  # no pipe (refused): the liveness timeout tells
                    return
            n = 0
        self._unacked[partition] = n

    def interrupt(self) -> None:
        """End a :meth:`poll` waiting in another thread now (it returns what is ready)."""
        os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        """Close the ``epoll`` (after every link was retired; the links are not used again)."""
        self.closed = True
        self._epoll.close()
        os.close(self._wake)

    def __len__(self) -> int:
        return len(self.partition_of)

    def live(self) -> Any:
        """The partitions with a link (a view)."""
        return self.by_partition.keys()
