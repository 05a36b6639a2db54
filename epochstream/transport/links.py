"""A subscriber's links to its partitions' publishers: one DEALER per live partition, the hello
it sends, reading with one poller, pings, flow-control credit grants, and goodbyes.

:class:`PartitionLinks` is composed into the
:class:`~epochstream.transport.subscriber.Subscriber` and holds its own state; a re-join
replaces every link (:meth:`PartitionLinks.connect` after :meth:`PartitionLinks.retire` of each).
It knows nothing of the protocol: it moves frames (docs/protocol.md §3, §4).
"""

from __future__ import annotations

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
        self._poller = zmq.Poller()
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
        self._poller.register(s, zmq.POLLIN)
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
        self._poller.unregister(s)
        del self.partition_of[s]
        self.receivers.pop(s, None)
        s.close(100)
        return True

    def poll(self, timeout_ms: int | None) -> list:
        """``[(socket, event), ...]`` readable within ``timeout_ms`` (``None``: wait)."""
        return self._poller.poll(timeout_ms)

    def send_all(self, frames: list) -> None:
        """Send ``frames`` on every link without blocking (a link with no pipe — a refused
        handshake — does not take them: the liveness timeout tells)."""
        for s in list(self.by_partition.values()):
            send_nowait(s, frames)

    def ping(self, frames: list) -> None:
        """Send the ping ``frames`` on every link (best effort)."""
        for s in self.partition_of:
            try:
                s.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def spend_credit(self, partition: int) -> None:
        """One credited message (or epoch) of ``partition`` was read: grant credit back once
        half of it is used (``c``)."""
        n = self._unacked.get(partition, 0) + 1
        if n >= max(1, self._credit // 2):
            s = self.by_partition.get(partition)
            if s is not None and not send_nowait(s, wire.encode_control(wire.CREDIT, messages=n)):
                self._unacked[partition] = n  # no pipe (refused): the liveness timeout tells
                return
            n = 0
        self._unacked[partition] = n

    def __len__(self) -> int:
        return len(self.partition_of)

    def live(self) -> Any:
        """The partitions with a link (a view)."""
        return self.by_partition.keys()
