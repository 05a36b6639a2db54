"""How the network catalog's client reaches the service: where it is (:func:`parse_url` of
``tcp://HOST:PORT?...``), and :class:`Channel`, which sends one operation as one request
(:mod:`epochstream.catalog.rpc`) on a pool of ZeroMQ ``DEALER`` sockets and returns its answer.

- **Timeouts.** A request waits at most ``timeout`` seconds for its answer, then raises
  :class:`~epochstream.errors.CatalogUnavailable` -- never a hang; a request unanswered for
  :data:`RESEND_S` seconds is sent again on a fresh socket, marked as a retry (every operation
  is safe to apply twice, :func:`~epochstream.catalog.retry.retried`); the socket of a request
  that timed out is closed (``LINGER`` 0), so its late answer never reaches a later request.
- **Errors** the service raised are raised here with the same type, message and attributes
  (:func:`~epochstream.catalog.rpc.raise_error`).
- **Threads and processes.** A channel may be shared by threads (each request borrows a socket
  from the pool); a child process made by ``fork()`` opens its own sockets. Idle sockets are
  closed after :data:`IDLE_S` by one daemon thread per process.

What the operations mean, and the leases the client renews, are
:class:`~epochstream.catalog.client.RemoteCatalog`'s.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time
import weakref
from typing import Any
from urllib.parse import parse_qsl

import zmq

from ..errors import CatalogError, CatalogUnavailable
from ..zmq_context import default_context
from . import rpc

__all__ = ["Channel", "parse_url", "url_security", "check_seconds", "RESEND_S", "IDLE_S"]

log = logging.getLogger("epochstream.catalog")

RESEND_S = 1.0
"""Seconds a request waits for its answer before it is sent again (within ``timeout``)."""
_POOL = 8  # idle sockets kept per channel
IDLE_S = 1.0
"""Seconds an idle pooled socket stays open. A connected ZeroMQ socket reconnects forever when
its peer goes away; a pooled socket kept after the catalog service stopped would knock, with a
ZMTP greeting, on whatever process binds that port next (seen: a Spark driver's Python-worker
callback port, whose handshake then failed). So idle sockets are closed after ``IDLE_S`` by one
daemon thread per process (:func:`_reap_loop`), and a request after a pause opens a new one."""

_URL = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>[0-9]{1,5})"
                  r"/?(?:\?(?P<query>.*))?$", re.IGNORECASE)


def parse_url(url: str) -> tuple[str, int, dict[str, Any]]:
    """``(host, port, params)`` of ``tcp://HOST:PORT[?timeout=S&lease=S&client_key=K&server_key=K]``:
    ``params`` holds the ones given (``timeout``/``lease`` as seconds, the keys as text).
    Raises :class:`CatalogError` for anything else (another scheme, no port, a ``*`` port, an
    unknown or non-positive parameter, an empty key)."""
    m = _URL.match(url.strip()) if isinstance(url, str) else None
    if m is None or not 0 < int(m["port"]) < 65536:
        raise CatalogError(f"a network catalog is named tcp://HOST:PORT (optionally "
                           f"?timeout=SECONDS&lease=SECONDS), got {url!r}")
    params: dict[str, Any] = {}
    for k, v in parse_qsl(m["query"] or "", keep_blank_values=True, strict_parsing=False):
        if k in ("client_key", "server_key"):
            if not v.strip():
                raise CatalogError(f"catalog URL {url!r}: {k} is empty")
            params[k] = v.strip()
            continue
        if k not in ("timeout", "lease"):
            raise CatalogError(f"catalog URL {url!r}: unknown parameter {k!r} (timeout, lease, "
                               f"client_key, server_key)")
        try:
            params[k] = check_seconds(k, float(v))
        except ValueError:
            raise CatalogError(f"catalog URL {url!r}: {k} must be seconds > 0, got {v!r}") from None
    return m["host"].lower(), int(m["port"]), params


def url_security(url: str, params: dict) -> Any:
    """The CURVE client of a URL's ``client_key``/``server_key`` (both needed)."""
    from ..security import Security

    if "client_key" not in params or "server_key" not in params:
        raise CatalogError(f"catalog URL {url!r}: give client_key and server_key together")
    try:
        return Security.curve(client_secret=params["client_key"],
                              server_public=params["server_key"])
    except ValueError as e:
        raise CatalogError(f"catalog URL {url!r}: {e}") from None


def check_seconds(what: str, value: Any) -> float:
    """``value`` as seconds (a number, > 0 and < 1e6); raises ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ValueError(f"{what} must be seconds > 0, got {value!r}")
    return float(value)



class Channel:
    """Requests to the catalog service at ``url`` (``"tcp://host:port"``), each answered within
    ``timeout`` seconds, over CURVE if ``security`` (a client ``Security``) is given, else plain
    TCP (module docstring). :meth:`call` sends one; :meth:`close` closes the idle sockets
    (later calls open new ones)."""

    def __init__(self, url: str, timeout: float, security: Any = None):
        self.url, self.timeout, self.security = url, timeout, security
        self.closed = False
        self._lock = threading.Lock()
        self._reset_process()

    def _reset_process(self) -> None:
        """The sockets of this process (again after a ``fork()``: none of the parent's)."""
        self._pid = os.getpid()
        self._idle: list[tuple[zmq.Socket, float]] = []  # (socket, monotonic time returned)
        self._ids = itertools.count(1)

    def _socket(self) -> zmq.Socket:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._reset_process()
            if self._idle:
                return self._idle.pop()[0]
        sock = default_context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, int(self.timeout * 1000))
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self.security is not None:
            from ..security import apply_client
            apply_client(sock, self.security)
        sock.connect(self.url)
        return sock

    def _give_back(self, sock: zmq.Socket) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < _POOL and not self.closed:
                self._idle.append((sock, time.monotonic()))
                _reaper_watch(self)
                return
        sock.close(0)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Send ``op(*args, **kwargs)``; return the decoded result or raise its error.

        A request unanswered for :data:`RESEND_S` seconds (the service restarting, a connection
        lost) is sent again on a fresh socket, marked as a retry, until ``timeout`` seconds
        have passed; every operation is safe to apply twice (``retry.retried``)."""
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            try:
                body = rpc.encode({"op": op, "args": list(args), "kwargs": kwargs,
                                   **({"retry": attempt} if attempt else {})}, lenient=True)
            except (TypeError, ValueError, OverflowError) as e:
                raise CatalogError(f"{op}: cannot send these arguments to the catalog service "
                                   f"{self.url}: {e}") from None
            window = min(deadline - time.monotonic(), RESEND_S)
            try:
                frames = self._attempt(op, body, window)
            except CatalogUnavailable:
                if deadline - time.monotonic() <= 0.01:
                    raise
                attempt += 1
                continue
            break
        try:
            reply = rpc.decode(frames[1], strict=False)
        except Exception as e:  # noqa: BLE001
            raise CatalogError(f"the catalog service {self.url} sent a malformed reply to "
                               f"{op}: {e}") from None
        if isinstance(reply, dict) and "ok" in reply and len(reply) == 1:
            return reply["ok"]
        if isinstance(reply, dict) and "error" in reply:
            rpc.raise_error(reply["error"], self.url)
        raise CatalogError(f"the catalog service {self.url} sent a malformed reply to {op}: "
                           f"{reply!r:.200}")

    def _attempt(self, op: str, body: bytes, window: float) -> list:
        """One sending of a request on a pooled socket, waiting ``window`` seconds for its
        answer frames; raises :class:`CatalogUnavailable` if none comes (the socket is closed
        then, so a late answer never reaches a later request)."""
        sock = self._socket()
        rid = next(self._ids).to_bytes(8, "big")
        deadline = time.monotonic() + max(window, 0.001)
        try:
            sock.send_multipart([rid, body], copy=len(body) < 65536)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(max(1, int(left * 1000))):
                    hint = ("is `epochstream catalog serve` running there and reachable?"
                            if self.security is None else
                            "is `epochstream catalog serve` running there and reachable, is "
                            "this client's key in its allow directory, and is server_key its "
                            "public key? A CURVE service gives a refused key no answer")
                    raise CatalogUnavailable(
                        f"the catalog service {self.url} did not answer {op} within "
                        f"{self.timeout:g} s ({hint})", url=self.url, timeout=self.timeout,
                        op=op)
                frames = sock.recv_multipart()
                if len(frames) == 2 and frames[0] == rid:
                    break  # (anything else: an answer to an abandoned request; not possible on a
                    # pooled socket, which only ever carries finished requests, but harmless)
        except BaseException as e:
            sock.close(0)  # a request that timed out: its late answer must not reach the next
            if isinstance(e, zmq.Again):
                raise CatalogUnavailable(
                    f"the catalog service {self.url} took no request within {self.timeout:g} s",
                    url=self.url, timeout=self.timeout, op=op) from None
            if isinstance(e, zmq.ZMQError):
                raise CatalogUnavailable(f"the catalog service {self.url}: {e}", url=self.url,
                                         timeout=self.timeout, op=op) from None
            raise
        self._give_back(sock)
        return frames

    def close(self) -> None:
        """Close the idle sockets; a socket given back afterwards is closed too."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for s, _ in idle:
            s.close(0)

    def reap(self, now: float) -> bool:
        """Close the pooled sockets idle for ``IDLE_S`` or more; True while some stay pooled."""
        with self._lock:
            if self._pid != os.getpid():
                return False
            stale = [s for s, t in self._idle if now - t >= IDLE_S]
            self._idle = [(s, t) for s, t in self._idle if now - t < IDLE_S]
            left = bool(self._idle)
        for s in stale:
            s.close(0)
        return left


_reaper_lock = threading.Lock()
_reaper_pid = 0
_reaper_channels: "weakref.WeakSet[Channel]" = weakref.WeakSet()


def _reaper_watch(channel: Channel) -> None:
    """Have this process's reaper thread close ``channel``'s idle sockets (started on first use,
    again in a forked child)."""
    global _reaper_pid
    with _reaper_lock:
        _reaper_channels.add(channel)
        if _reaper_pid != os.getpid():
            _reaper_pid = os.getpid()
            threading.Thread(target=_reap_loop, daemon=True,
                             name="epochstream-catalog-idle-sockets").start()


def _reap_loop() -> None:
    """Every ``IDLE_S / 2`` seconds, close the pooled sockets idle for ``IDLE_S`` (a daemon)."""
    while True:
        time.sleep(IDLE_S / 2)
        now = time.monotonic()
        with _reaper_lock:
            channels = list(_reaper_channels)
        for channel in channels:
            try:
                if not channel.reap(now):
                    with _reaper_lock:
                        _reaper_channels.discard(channel)
            except Exception:  # noqa: BLE001 - a closed channel or a closed context: skip it
                log.debug("catalog idle-socket reaper: %s", channel.url, exc_info=True)
        del channels
