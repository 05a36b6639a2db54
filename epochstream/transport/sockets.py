"""Every ZeroMQ socket the transport opens, with its options (see docs/protocol.md §3).

- :func:`bind_router` — a publisher's ROUTER: ``ROUTER_MANDATORY`` (a send to a vanished peer
  fails with ``EHOSTUNREACH`` instead of being dropped), explicit high-water marks, a small
  ``MAXMSGSIZE`` (subscribers only send small control messages), ZMTP heartbeats with a timeout
  of three intervals but at least :data:`PUBLISHER_MIN_ZMTP_TIMEOUT_MS` (libzmq
  ``zmq_setsockopt(3)``: ``ZMQ_HEARTBEAT_IVL``/``_TIMEOUT``).
- :func:`connect_dealer` — a subscriber's DEALER for one partition: ZMTP pings every
  ``ping_interval`` but at least every :data:`SUBSCRIBER_ZMTP_PING_S`, and a one-hour ZMTP
  timeout, in effect none. Left unset, libzmq uses the interval as the timeout, and a stalled
  reader never sees the publisher's PONGs (they queue behind unread data), so it would drop its
  own connection (libzmq 4.3.5 then aborts the process). A dead publisher is detected by the
  application heartbeat instead.

  The pings are what keeps a stalled subscriber's connection alive at the publisher: a
  connection the publisher drops while the subscriber's input is stopped (its pipe full) makes
  libzmq 4.3.5 abort the *subscriber's* process at its next read (``Assertion failed:
  !_io_error (stream_engine_base.cpp:310)``, zeromq/libzmq #4767, #4364, #3937). So the ZMTP
  ping interval does not follow a long ``ping_interval``: 0.1 s pings stay well inside the
  publisher's ZMTP timeout (three heartbeat intervals, at least 0.5 s) whatever both sides set.
- :func:`transmit_to` — a non-blocking send that reports :data:`SENT`, :data:`FULL` (the peer's
  pipe is at its high-water mark) or :data:`GONE` (the peer disconnected), the three outcomes
  the pure :mod:`~epochstream.transport.fanout` policy acts on.
- :func:`receive_from` — a non-blocking read of one multipart message (the subscriber's hot path).
- :func:`inproc_pair` — the wake-up pipe between caller threads and a publisher's loop.

Both socket makers take ``security=`` (:class:`~epochstream.security.Security` or ``None``):
CURVE is set on the socket before it binds or connects (:func:`~epochstream.security.apply_server`,
:func:`~epochstream.security.apply_client`); ``None`` leaves it plain TCP.
"""

from __future__ import annotations

import itertools
import os
from typing import Callable

import zmq

from ..security import apply_client, apply_server

__all__ = ["SENT", "FULL", "GONE", "bind_router", "connect_dealer", "transmit_to", "receive_from",
           "inproc_pair",
           "SUBSCRIBER_ZMTP_TIMEOUT_MS", "SUBSCRIBER_ZMTP_PING_S", "PUBLISHER_MIN_ZMTP_TIMEOUT_MS"]

#: outcomes of a non-blocking send (see :func:`transmit_to`)
SENT, FULL, GONE = 0, 1, 2

#: the subscriber's ZMTP heartbeat timeout: one hour, in effect none (see the module docstring)
SUBSCRIBER_ZMTP_TIMEOUT_MS = 3_600_000
#: the subscriber's longest ZMTP ping interval, seconds (see the module docstring)
SUBSCRIBER_ZMTP_PING_S = 0.1
#: the publisher's shortest ZMTP heartbeat timeout, ms: five of the subscriber's ZMTP pings
PUBLISHER_MIN_ZMTP_TIMEOUT_MS = 500

_ids = itertools.count()


def bind_router(ctx: zmq.Context, endpoint: str, *, sndhwm: int,
                heartbeat_interval: float, security=None) -> zmq.Socket:
    """A publisher's ROUTER bound to ``endpoint`` (``"tcp://127.0.0.1:*"`` picks a free port;
    read ``LAST_ENDPOINT`` for the address). ``sndhwm``: per-peer pipe, messages;
    ``heartbeat_interval``: seconds; ``security``: a CURVE server's
    :class:`~epochstream.security.Security`, or ``None``. Raises ``zmq.ZMQError`` if it cannot
    bind (the socket is closed then)."""
    router = ctx.socket(zmq.ROUTER)
    try:
        apply_server(router, security)
    except BaseException:
        router.close(0)
        raise
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, int(sndhwm))
    router.setsockopt(zmq.RCVHWM, 1000)
    router.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
    router.setsockopt(zmq.LINGER, 2000)
    hb_ms = max(1, int(heartbeat_interval * 1000))
    router.setsockopt(zmq.HEARTBEAT_IVL, hb_ms)
    router.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(3 * hb_ms, PUBLISHER_MIN_ZMTP_TIMEOUT_MS))
    try:
        router.bind(endpoint)
    except zmq.ZMQError:
        router.close(0)
        raise
    return router


def connect_dealer(ctx: zmq.Context, endpoint: str, *, rcvhwm: int,
                   ping_interval: float, security=None,
                   server_key: str | None = None) -> zmq.Socket:
    """A subscriber's DEALER connected to one partition's publisher at ``endpoint``.
    ``rcvhwm``: messages; ``ping_interval``: seconds between the subscriber's pings (ZMTP
    pings go at least every :data:`SUBSCRIBER_ZMTP_PING_S`); ``security``: a CURVE client's
    :class:`~epochstream.security.Security` (``server_key``: the publisher's public key, Z85,
    default the one it holds), or ``None``."""
    s = ctx.socket(zmq.DEALER)
    try:
        apply_client(s, security, server_key)
    except BaseException:
        s.close(0)
        raise
    s.setsockopt(zmq.RCVHWM, int(rcvhwm))
    s.setsockopt(zmq.LINGER, 0)
    zmtp_ping = min(float(ping_interval), SUBSCRIBER_ZMTP_PING_S)
    s.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(zmtp_ping * 1000)))
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, SUBSCRIBER_ZMTP_TIMEOUT_MS)
    s.connect(endpoint)
    return s


def send_nowait(sock: zmq.Socket, frames: list) -> bool:
    """Send ``frames`` on a subscriber's DEALER without blocking; False if ZeroMQ would block
    (nothing sent). A DEALER with no pipe blocks a plain send forever, and libzmq removes the
    pipe of a connecting socket whose handshake failed for good — a CURVE key the publisher's
    ZAP handler refuses, a plain client against a CURVE publisher — so every send of a
    subscriber goes through here and a refused connection is reported by the timeouts, never
    by a hang."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def transmit_to(router: zmq.Socket) -> Callable[[bytes, list], int]:
    """A function ``transmit(ident, frames) -> SENT | FULL | GONE`` that sends ``frames`` to the
    peer ``ident`` of ``router`` without blocking. Other ZeroMQ errors propagate."""
    # The compiled send, frame by frame, with plain int flags: pyzmq's send_multipart adds a
    # Python layer per frame, and its ``SNDMORE | flags`` builds an enum.Flag each time (a third
    # of the loop's CPU in a profile of a 4-subscriber fan-out).
    send = super(zmq.Socket, router).send
    more, last = int(zmq.SNDMORE) | int(zmq.NOBLOCK), int(zmq.NOBLOCK)
    frame_type = zmq.Frame

    def transmit(ident: bytes, frames: list) -> int:
        for f in frames:  # refuse a non-buffer before any part is sent, as send_multipart did
            if type(f) is not bytes and not isinstance(f, frame_type):
                memoryview(f)
        try:
            send(ident, more)  # a ROUTER refuses (or takes) a message at its first part
        except zmq.Again:
            return FULL
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return GONE
            raise
        n = len(frames) - 1
        for i in range(n):
            send(frames[i], more)
        send(frames[n], last)
        return SENT

    return transmit


def receive_from(sock: zmq.Socket) -> Callable[[], list]:
    """A function ``receive() -> frames`` that reads one multipart message (a list of bytes)
    from ``sock`` without blocking; ``zmq.Again`` when none is waiting. The compiled
    ``recv``/``get`` with plain int flags: pyzmq's ``recv_multipart`` turns flags and the
    ``RCVMORE`` option into enum objects on every frame."""
    recv = super(zmq.Socket, sock).recv
    get = super(zmq.Socket, sock).get
    noblock, rcvmore = int(zmq.NOBLOCK), int(zmq.RCVMORE)

    def receive() -> list:
        frames = [recv(noblock)]
        while get(rcvmore):
            frames.append(recv(noblock))
        return frames

    return receive


def inproc_pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """``(receiving end, sending end)`` of a fresh ``inproc`` PAIR pipe."""
    addr = f"inproc://epochstream-pub-{os.getpid()}-{next(_ids)}"
    receiving = ctx.socket(zmq.PAIR)
    receiving.bind(addr)
    sending = ctx.socket(zmq.PAIR)
    sending.connect(addr)
    return receiving, sending
