"""ZAP on sockets: CURVE set on a publisher's or a subscriber's socket, and the one pyzmq ZAP
handler per ZeroMQ context that checks a connecting client's key (docs/security.md, "What
happens on the wire").

Nothing here is home-made cryptography: the sockets use ZeroMQ's CURVE mechanism (CurveZMQ,
RFC 26 — https://rfc.zeromq.org/spec/26/ — carried by ZMTP-CURVE, RFC 25), and a connecting
client's public key is checked by pyzmq's ZAP handler (ZAP, RFC 27) running in
``zmq.auth.thread.ThreadAuthenticator``.

One ZAP handler per ZeroMQ context (:func:`authenticator`, started once). Each distinct
``allow`` gets its own ZAP domain (``ZMQ_ZAP_DOMAIN`` on the publisher's socket) and a pyzmq
credentials provider (``configure_curve_callback``). Why not ``configure_curve(domain="*",
location=...)``: pyzmq's ``CURVE_ALLOW_ANY`` is one flag for the whole authenticator, so a
publisher with ``allow=None`` would open every other publisher of the process to any key (and
a later ``configure_curve`` with a directory would close the first one) — per-domain providers
keep each publisher's rule its own.

Identity. pyzmq's handler answers a successful CURVE handshake with the client's public key in
Z85 as the ZAP ``User-Id``; libzmq attaches it to every message of that connection (read by
:meth:`epochstream.security.authorizer.Authorizer.user_of`). That text is the peer's
*principal*; with an ``allow`` directory the name of its certificate file there
(``alice.key`` → ``alice``, :meth:`_AllowList.keys`) is a second principal of the same peer.
"""

from __future__ import annotations

import logging
import os
import threading
import time as _time
import weakref
from typing import Any

from .config import Security, _enabled
from .keys import _text, is_z85_key, load_allowed

__all__ = ["authenticator", "release_authenticator", "apply_server", "apply_client"]

log = logging.getLogger("epochstream.security")


class _AllowList:
    """The client keys of one ``allow`` directory (``None``: any key), read again when the
    directory's modification time changes; also pyzmq's credentials provider (``callback``)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self._lock = threading.Lock()
        self._stamp: int | None = None
        self._keys: dict[str, str] = {}
        self._warned: dict[str, float] = {}  # refused key -> when last logged

    def keys(self) -> dict[str, str]:
        """``{public key: certificate name}`` now (``{}`` if the directory is gone)."""
        if self.directory is None:
            return {}
        try:
            stamp = os.stat(self.directory).st_mtime_ns
        except OSError:
            return {}
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        self._keys = load_allowed(self.directory)
                    except OSError as e:
                        log.error("allow directory %s: %s", self.directory, e)
                        self._keys = {}
                    self._stamp = stamp
        return self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook (``configure_curve_callback``): ``key`` is the
        client's public key in Z85 (bytes)."""
        if self.directory is None:
            return True
        ok = _text(key) in self.keys()
        if not ok:  # logged once a minute per key: a refused client reconnects every 100 ms
            now = _time.monotonic()
            if now - self._warned.get(_text(key), -1e9) >= 60.0:
                if len(self._warned) > 1000:
                    self._warned.clear()
                self._warned[_text(key)] = now
                log.warning("ZAP %s: refused client key %s (not in %s)", domain, _text(key),
                            self.directory)
        return ok


_auth_lock = threading.Lock()
_authenticators: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_allow_lists: dict[str | None, _AllowList] = {}


def _allow_list(directory: str | None) -> _AllowList:
    with _auth_lock:
        got = _allow_lists.get(directory)
        if got is None:
            got = _allow_lists[directory] = _AllowList(directory)
        return got


def _domain(sec: Security) -> str:
    """The ZAP domain of a publisher secured by ``sec``: one per ``allow`` directory."""
    if sec.allow is None:
        return "epochstream-any"
    import hashlib  # here, not at import: OpenSSL's ~2 ms only for a secured publisher

    return "epochstream-" + hashlib.sha256(sec.allow.encode()).hexdigest()[:24]


def authenticator(ctx: Any) -> Any:
    """The ``zmq.auth.thread.ThreadAuthenticator`` of context ``ctx`` (started on first use,
    then shared by every secured publisher of that context). Raises ``RuntimeError`` if another
    ZAP handler is bound in ``ctx`` already (``inproc://zeromq.zap.01``)."""
    import zmq
    from zmq.auth.thread import ThreadAuthenticator

    with _auth_lock:
        auth = _authenticators.get(ctx)
        if auth is None:
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("epochstream.security.zap"))
            try:
                auth.start()
            except zmq.ZMQError as e:
                raise RuntimeError(f"cannot start epochstream's ZAP handler: {e} (another ZAP "
                                   f"handler runs in this ZeroMQ context)") from None
            _authenticators[ctx] = auth
        return auth


def release_authenticator(ctx: Any) -> None:
    """Stop and forget the ZAP handler of context ``ctx`` (if :func:`authenticator` started
    one), so that ``ctx.term()`` can return: the handler's sockets live in ``ctx``. For an owner
    of a private context (a :class:`~epochstream.spark.SparkPublisherHost`), after every secured
    socket of ``ctx`` is closed; a later :func:`authenticator` call starts a new one."""
    with _auth_lock:
        auth = _authenticators.pop(ctx, None)
    if auth is not None:
        auth.stop()


def apply_server(sock: Any, sec: Security | None) -> None:
    """Make ``sock`` (a publisher's ROUTER, before ``bind``) a CURVE server with ``sec``'s key
    pair, authenticated by the context's ZAP handler for ``sec.allow`` (module docstring). A
    no-op for ``None``/plain. Raises ``ValueError`` for a value without a server key pair."""
    if not _enabled(sec):
        return
    assert sec is not None
    if not sec.is_server:
        raise ValueError("this Security has no server key pair: a publisher needs "
                         "Security.curve(server_secret=...)")
    domain = _domain(sec)
    auth = authenticator(sock.context)
    auth.configure_curve_callback(domain, credentials_provider=_allow_list(sec.allow))
    assert sec.server_public is not None and sec.server_secret is not None
    sock.curve_server = True
    sock.curve_publickey = sec.server_public.encode("ascii")
    sock.curve_secretkey = sec.server_secret.encode("ascii")
    sock.zap_domain = domain.encode("ascii")


def apply_client(sock: Any, sec: Security | None, server_public: str | None = None) -> None:
    """Make ``sock`` (a subscriber's DEALER, before ``connect``) a CURVE client with ``sec``'s
    key pair towards the server key ``server_public`` (default ``sec.server_public``). A no-op
    for ``None``/plain. Raises ``ValueError`` without a client key pair or a server key."""
    if not _enabled(sec):
        return
    assert sec is not None
    if not sec.is_client:
        raise ValueError("this Security has no client key pair: a subscriber needs "
                         "Security.curve(client_secret=...)")
    key = server_public or sec.server_public
    if not is_z85_key(key):
        raise ValueError("CURVE needs the publisher's public key: pass server_public= (or let "
                         "the catalog provide it)")
    assert sec.client_public is not None and sec.client_secret is not None
    sock.curve_publickey = sec.client_public.encode("ascii")
    sock.curve_secretkey = sec.client_secret.encode("ascii")
    sock.curve_serverkey = _text(key).encode("ascii")
