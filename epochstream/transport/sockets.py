"""Every ZeroMQ socket the transport opens, with its options (see docs/protocol.md §3).

- :func:`bind_router` — a publisher's ROUTER: ``ROUTER_MANDATORY`` (a send to a vanished peer
  fails with ``EHOSTUNREACH`` instead of being dropped), a send high-water mark, **no receive
  high-water mark**, a small ``MAXMSGSIZE`` (subscribers only send small control messages),
  **no ZMTP heartbeats**, TCP keepalive.
- :func:`connect_dealer` — a subscriber's DEALER for one partition: a receive high-water mark,
  **no ZMTP heartbeats**, TCP keepalive.

  Why (docs/reliability.md, "Flooding clients"): libzmq 4.3.5 aborts the process (``Assertion
  failed: !_io_error (stream_engine_base.cpp:310)``, zeromq/libzmq #4767, #4364, #3937) when a
  connection whose input it stopped — its pipe at the receive high-water mark — breaks and
  the engine then has something to send on it: its own ZMTP PING (the heartbeat timer) or the
  PONG to a peer's PING still in its input buffer. A flooding client could so abort a
  publisher, and a publisher killed while a subscriber stalled could abort the subscriber.
  With no receive high-water mark the publisher's libzmq never stops reading a connection (the
  loop bounds what one connection may send instead: :mod:`~epochstream.transport.quota`), and
  with ZMTP heartbeats off on both sides no PING is ever sent or awaited; liveness is the
  application's (``H`` heartbeats, pings, probes) and the kernel's (TCP keepalive finds a
  vanished host).
- :func:`connection_of` / :func:`cut` — the TCP connection a ROUTER message came over, and
  cutting it (a ROUTER cannot close one peer's connection; the loop shuts its socket down).
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
import socket
from typing import Any, Callable

import zmq

from ..security import apply_client, apply_server
from ..wire2 import DATA2

__all__ = ["SENT", "FULL", "GONE", "bind_router", "connect_dealer", "transmit_to", "receive_from",
           "inproc_pair", "connection_of", "cut", "KEEPALIVE_INTERVAL_S", "KEEPALIVE_PROBES"]

#: outcomes of a non-blocking send (see :func:`transmit_to`)
SENT, FULL, GONE = 0, 1, 2

#: TCP keepalive: seconds between probes once a connection was idle for its idle time
KEEPALIVE_INTERVAL_S = 1
#: TCP keepalive: unanswered probes before the kernel drops the connection
KEEPALIVE_PROBES = 3

_ids = itertools.count()


def bind_router(ctx: zmq.Context, endpoint: str, *, sndhwm: int,
                heartbeat_interval: float, security=None) -> zmq.Socket:
    """A publisher's ROUTER bound to ``endpoint`` (``"tcp://127.0.0.1:*"`` picks a free port;
    read ``LAST_ENDPOINT`` for the address). ``sndhwm``: per-peer pipe, messages;
    ``heartbeat_interval``: seconds (the TCP keepalive idle time, at least 1 s); ``security``: a CURVE server's
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
    router.setsockopt(zmq.RCVHWM, 0)  # never stop reading a connection (module docstring)
    router.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
    router.setsockopt(zmq.LINGER, 2000)
    _keepalive(router, heartbeat_interval)
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
    ``rcvhwm``: messages; ``ping_interval``: seconds between the subscriber's pings (the TCP
    keepalive idle time, at least 1 s); ``security``: a CURVE client's
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
    _keepalive(s, ping_interval)
    s.connect(endpoint)
    return s


def _keepalive(sock: zmq.Socket, idle: float) -> None:
    """TCP keepalive on ``sock``'s connections: after ``idle`` seconds without traffic (at
    least 1 s, whole seconds), a probe every :data:`KEEPALIVE_INTERVAL_S`; the kernel drops a
    connection after :data:`KEEPALIVE_PROBES` unanswered ones (a vanished host)."""
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, round(float(idle))))
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)


def connection_of(frame: zmq.Frame) -> tuple[int, Any] | None:
    """``(fd, peer address)`` of the TCP (or IPC) connection a ROUTER received ``frame`` over
    (a ``zmq.Frame``: receive with ``copy=False``), or ``None`` if libzmq does not say or the
    connection is gone already. The pair is what :func:`cut` needs: libzmq reuses file
    descriptors, the address tells a reused one apart."""
    try:
        fd = int(frame.get("__fd"))  # libzmq's per-connection metadata (ZMQ_SRCFD's successor)
        with socket.socket(fileno=os.dup(fd)) as s:
            return fd, s.getpeername()
    except (zmq.ZMQError, OSError, ValueError, TypeError):
        return None


def cut(connection: tuple[int, Any]) -> bool:
    """Shut down the connection ``(fd, peer address)`` from :func:`connection_of`, if that
    descriptor still holds it: libzmq sees the connection end and frees it (a peer's
    DEALER then reconnects as a new peer). True if it was shut down."""
    fd, peer = connection
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            if s.getpeername() != peer:
                return False  # closed meanwhile, the descriptor reused by another connection
            s.shutdown(socket.SHUT_RDWR)
            return True
    except OSError:
        return False


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


#: frames bigger than this are handed out as a memoryview of the ``zmq.Frame`` (no copy); smaller
#: ones as ``bytes`` (one small copy, cheaper than a memoryview: wire2.VIEW_BYTES)
VIEW_FRAME_BYTES = 2048


def receive_from(sock: zmq.Socket) -> Callable[[], list]:
    """A function ``receive() -> frames`` that reads one multipart message from ``sock``
    without blocking (the first frame ``bytes``; each later one ``bytes``, or a ``memoryview``
    of the received frame when it is bigger than :data:`VIEW_FRAME_BYTES`: no copy);
    ``zmq.Again`` when none is waiting.

    The first frame is received as ``bytes`` (0.13 µs, against 0.41 µs for a ``zmq.Frame``
    object, measured): a data message of wire version 2 longer than its header is complete in
    that frame by the wire's definition (docs/protocol.md §2.2), so nothing more is asked. Any
    other first frame asks for ``RCVMORE`` and reads the rest as frames, their ``more`` flag
    read from them (pyzmq's ``recv_multipart`` turns flags into enum objects on every frame;
    ``get(RCVMORE)`` costs 0.6 µs). A publisher that breaks that definition (frames after a
    complete v2 data frame) has each extra frame read as a message of its own: refused as
    such (:class:`~epochstream.errors.WireError`)."""
    base = super(zmq.Socket, sock)
    recv, get = base.recv, base.get
    noblock, view, rcvmore = int(zmq.NOBLOCK), VIEW_FRAME_BYTES, int(zmq.RCVMORE)
    kind, version = DATA2  # b"D\x02" as two ints: the first frame's bytes 0 and 1

    def receive() -> list:
        first = recv(noblock, True)
        n = len(first)
        if n > 12 and first[0] == kind and first[1] == version and n > 4 + 8 * (first[2] or 1):
            return [first]  # b"D\x02", arity, flags, time, payload: one whole v2 data message
        frames = [first]
        if get(rcvmore):
            f = recv(noblock, False)
            frames.append(f.bytes if len(f) <= view else f.buffer)
            while f.more:
                f = recv(noblock, False)
                frames.append(f.bytes if len(f) <= view else f.buffer)
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


def advertised_endpoint(bound: str, advertise: str | None = None) -> str:
    """The endpoint to register in the catalog for a ROUTER bound at ``bound`` (its
    ``LAST_ENDPOINT``): ``advertise`` if it is a whole endpoint (``"tcp://host:port"``; a
    missing or ``*`` port is the bound one), ``bound`` with its host replaced by ``advertise``
    (a host name or IP), or, without ``advertise``, ``bound`` itself — with
    ``socket.gethostname()`` for a wildcard host (``0.0.0.0``, ``*``, ``::``)."""
    scheme, _, rest = bound.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" and (advertise is None or "://" not in advertise):
        return bound
    if advertise is None:
        if host.strip("[]") not in ("0.0.0.0", "*", "::", ""):
            return bound
        advertise = socket.gethostname()
    if "://" in advertise:
        a_scheme, _, a_rest = advertise.partition("://")
        a_host, sep, a_port = a_rest.rpartition(":")
        if not sep or not a_port.isdigit() and a_port != "*" or "]" in a_port:
            a_host, a_port = a_rest, "*"
        return f"{a_scheme}://{a_host}:{port if a_port == '*' else a_port}"
    if ":" in advertise and not advertise.startswith("["):  # a bare IPv6 address
        advertise = f"[{advertise}]"
    return f"{scheme}://{advertise}:{port}"
