"""Who may connect and who may subscribe: CURVE encryption and authentication of the publisher's
ROUTER and the subscribers' DEALERs, and per-topic grants (docs/security.md).

Nothing here is home-made cryptography: the sockets use ZeroMQ's CURVE mechanism (CurveZMQ,
RFC 26 — https://rfc.zeromq.org/spec/26/ — carried by ZMTP-CURVE, RFC 25), and a connecting
client's public key is checked by pyzmq's ZAP handler (ZAP, RFC 27) running in
``zmq.auth.thread.ThreadAuthenticator``; keys are ZeroMQ certificates written by
``zmq.auth.create_certificates`` and read by ``zmq.auth.load_certificate(s)`` (pyzmq's
``zmq.auth`` package: https://pyzmq.readthedocs.io/en/latest/api/zmq.auth.html).

Configuration: :class:`Security`, a frozen value. ``Security.curve(server_secret=...,
allow=...)`` for a publisher (the CURVE server), ``Security.curve(client_secret=...,
server_public=...)`` for a subscriber (a CURVE client); ``None`` or ``Security.none()`` is plain
TCP, the default everywhere. Key sources (:func:`load_keypair`, :func:`load_public`):

- a path to a certificate file: ``NAME.key_secret`` (public and secret key) for
  ``server_secret``/``client_secret``, ``NAME.key`` (public key only; a ``.key_secret`` works
  too) for ``server_public``;
- a key pair ``(public, secret)`` of Z85 strings or bytes (``zmq.curve_keypair()``), or for
  ``server_public`` the 40-character Z85 text of the key;
- a bare name, looked up in the key directory ``$EPOCHSTREAM_KEYS`` (:data:`ENV_KEYS`):
  ``<dir>/<name>.key_secret`` for a secret, ``<dir>/<name>.key`` for a public key, and for
  ``allow`` the sub-directory ``<dir>/<name>/``.

``allow``: a directory of client certificates (``*.key`` files, one per client, as
``epochstream keys generate`` writes them; only their public key is read) — a client whose
public key is not there fails the handshake; ``None``: any client with a well-formed CURVE
handshake is let in (encrypted, and identified by its public key, which the grants then
check). The directory is read again whenever its modification time changes, so adding or
removing a certificate file takes effect at the next handshake.

One ZAP handler per ZeroMQ context (:func:`authenticator`, started once). Each distinct
``allow`` gets its own ZAP domain (``ZMQ_ZAP_DOMAIN`` on the publisher's socket) and a pyzmq
credentials provider (``configure_curve_callback``). Why not ``configure_curve(domain="*",
location=...)``: pyzmq's ``CURVE_ALLOW_ANY`` is one flag for the whole authenticator, so a
publisher with ``allow=None`` would open every other publisher of the process to any key (and
a later ``configure_curve`` with a directory would close the first one) — per-domain providers
keep each publisher's rule its own.

Identity. pyzmq's handler answers a successful CURVE handshake with the client's public key in
Z85 as the ZAP ``User-Id``; libzmq attaches it to every message of that connection (read with
``zmq.Frame.get("User-Id")``: :meth:`Authorizer.receive`). That text is the peer's *principal*;
with an ``allow`` directory the name of its certificate file there (``alice.key`` → ``alice``)
is a second principal of the same peer.

Grants (:class:`Grant`, stored by the catalog: ``Catalog.grant``/``revoke``/``grants``):
``(principal, topic pattern, operation)``; the pattern is an ``fnmatch`` pattern over topic
names (``fnmatchcase``: ``*``, ``?``, ``[seq]``; case-sensitive), the operation one of
:data:`OPERATIONS`, and ``admin`` implies the others; the principal ``"*"``
(:data:`ANYONE`) is every authenticated peer. :func:`grant_matches` is the one decision.

A publisher with ``security=`` and a catalog checks, before registering a subscriber (its
hello) or answering a history read, that the peer's principal holds a ``subscribe`` grant for
the topic; otherwise the peer gets ``X error`` with ``reason: "not_authorised"``
(:data:`NOT_AUTHORISED`) and the message ``not authorised for topic 'T' ...``, and nothing
else. Grants are re-read from the catalog every :data:`GRANTS_REFRESH_S` seconds by a thread of
the publisher's own (the loop never waits for the catalog); a registered subscriber whose
grant was revoked is dropped with the same notice within about that time. A publisher with
``security=`` and no catalog has no grants to read: the ``allow`` directory is the only check,
and every peer that completes the handshake may subscribe.

Errors: a bad configuration (a missing or unreadable key file, a key that is not 40 Z85
characters, a public key that does not match its secret, an ``allow`` directory without
certificates) raises ``ValueError`` naming what was tried.

``publish`` grants are checked in two places. A
:class:`~epochstream.spark.SparkPublisherHost` with ``security=`` makes its ingest ROUTERs CURVE
servers like its publishers (same key pair, same ``allow``, :func:`apply_server`) and serves a
Spark task's or the driver-side commit's DATA/FLUSH/COMMIT/ABORT only if the connection's
principal holds ``publish`` (or ``admin``) for the topic (:meth:`Authorizer.publish_refusal`);
otherwise the request gets the ingest protocol's ``ERR`` ("not authorised to publish to topic
'T' ...") and nothing of it is staged. And a secured network catalog service
(:class:`~epochstream.catalog.server.CatalogServer`) registers a publisher's partition
(``register_partition``) only for a key holding ``publish`` for the topic. The executors' side
(a CURVE client with the sink's ``clientKey``, the host's key from the catalog) is
:mod:`epochstream.spark.client`; docs/security.md.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import threading
import time as _time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["Security", "Grant", "OPERATIONS", "ANYONE", "ENV_KEYS", "NOT_AUTHORISED",
           "GRANTS_REFRESH_S", "grant_matches", "check_grant", "check_server_key", "is_z85_key",
           "key_dir", "load_keypair", "load_public", "load_allowed", "authenticator",
           "apply_server", "apply_client", "release_authenticator", "Authorizer"]

log = logging.getLogger("epochstream.security")

ENV_KEYS = "EPOCHSTREAM_KEYS"
"""The environment variable naming the default key directory (bare key names are looked up
there: ``<dir>/<name>.key_secret``, ``<dir>/<name>.key``, ``<dir>/<name>/``)."""

OPERATIONS = ("subscribe", "publish", "admin")
"""What a grant allows; ``admin`` implies the others."""

ANYONE = "*"
"""The principal of a grant that every authenticated peer holds."""

NOT_AUTHORISED = "not_authorised"
"""The ``reason`` field of the ``X error`` a refused peer gets (the subscriber raises
:class:`~epochstream.errors.NotAuthorized` for it)."""

GRANTS_REFRESH_S = 1.0
"""Seconds between two reads of the grants by a secured publisher with a catalog."""

_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 ".-:+=^!/*?&<>()[]{}@%$#")  # the Z85 alphabet (ZeroMQ RFC 32)
_MAX_TEXT = 256


# -- keys ---------------------------------------------------------------------------------------
def is_z85_key(value: Any) -> bool:
    """Whether ``value`` (str or bytes) is a 32-byte CURVE key in Z85: 40 characters of the Z85
    alphabet (ZeroMQ RFC 32)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return False
    return isinstance(value, str) and len(value) == 40 and set(value) <= _Z85


def check_server_key(key: Any) -> str | None:
    """``key`` as stored in the catalog: ``None`` or a Z85 public key (str; bytes are decoded).
    Raises ``ValueError`` for anything else."""
    if key is None:
        return None
    if not is_z85_key(key):
        raise ValueError(f"a server key must be a CURVE public key in Z85 (40 characters), "
                         f"got {str(key)[:60]!r}")
    return key.decode("ascii") if isinstance(key, (bytes, bytearray)) else key


def key_dir() -> Path | None:
    """The key directory ``$EPOCHSTREAM_KEYS`` (``None`` if unset or empty)."""
    d = os.environ.get(ENV_KEYS)
    return Path(d).expanduser() if d else None


def _candidates(source: Any, suffix: str) -> list[Path]:
    """Where a key given as ``source`` (a path or a bare name) may be, in order."""
    p = Path(source).expanduser()
    out = [p]
    d = key_dir()
    if d is not None and p.name == str(source) and os.sep not in str(source):
        out.append(d / f"{source}{suffix}")
    return out


def _find(source: Any, suffix: str, what: str) -> Path:
    tried = _candidates(source, suffix)
    for p in tried:
        if p.is_file():
            return p
    hint = "" if key_dir() is not None else f" (set ${ENV_KEYS} to look bare names up there)"
    raise ValueError(f"{what}: no certificate file at {', '.join(map(str, tried))}{hint}")


def _text(key: Any) -> str:
    return key.decode("ascii") if isinstance(key, (bytes, bytearray)) else str(key)


def load_keypair(source: Any, what: str = "key pair") -> tuple[str, str]:
    """``(public, secret)`` Z85 keys from ``source``: a ``.key_secret`` certificate's path, a
    bare name (``$EPOCHSTREAM_KEYS/<name>.key_secret``) or a ``(public, secret)`` pair of Z85
    str/bytes. Raises ``ValueError`` if there is none, it holds no secret key, or the public key
    does not belong to the secret one."""
    import zmq
    import zmq.auth

    if isinstance(source, (tuple, list)):
        if len(source) != 2 or not all(is_z85_key(k) for k in source):
            raise ValueError(f"{what}: a key pair is (public, secret), two 40-character Z85 "
                             f"keys")
        public, secret = _text(source[0]), _text(source[1])
        where = "the given key pair"
    else:
        path = _find(source, ".key_secret", what)
        try:
            pub, sec = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{what}: cannot read certificate {path}: {e}") from None
        if sec is None:
            raise ValueError(f"{what}: {path} holds no secret key (a .key file is the public "
                             f"half; use the .key_secret file)")
        if not (is_z85_key(pub) and is_z85_key(sec)):
            raise ValueError(f"{what}: {path} does not hold 40-character Z85 keys")
        public, secret = _text(pub), _text(sec)
        where = str(path)
    if zmq.curve_public(secret.encode("ascii")).decode("ascii") != public:
        raise ValueError(f"{what}: the public key in {where} does not belong to its secret key")
    return public, secret


def load_public(source: Any, what: str = "public key") -> str:
    """A Z85 public key from ``source``: its 40-character Z85 text (str or bytes), a certificate
    file's path (``.key`` or ``.key_secret``), or a bare name (``$EPOCHSTREAM_KEYS/<name>.key``).
    Raises ``ValueError``."""
    import zmq.auth

    if isinstance(source, (bytes, bytearray)) or (isinstance(source, str)
                                                  and not Path(source).expanduser().is_file()):
        if is_z85_key(source):
            return _text(source)
        if isinstance(source, (bytes, bytearray)):
            raise ValueError(f"{what}: not a 40-character Z85 key")
    path = _find(source, ".key", what)
    try:
        pub, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: cannot read certificate {path}: {e}") from None
    if not is_z85_key(pub):
        raise ValueError(f"{what}: {path} does not hold a 40-character Z85 key")
    return _text(pub)


def _allow_dir(source: Any) -> str:
    p = Path(source).expanduser()
    if not p.is_dir():
        d = key_dir()
        if d is not None and os.sep not in str(source) and (d / str(source)).is_dir():
            p = d / str(source)
        else:
            raise ValueError(f"allow: no directory {p} (a directory of client certificates, "
                             f"*.key files)")
    p = p.resolve()
    if not load_allowed(p):
        raise ValueError(f"allow: {p} holds no client certificate (*.key file): every client "
                         f"would be refused")
    return str(p)


def load_allowed(directory: Any) -> dict[str, str]:
    """``{public key (Z85): name}`` of the client certificates (``*.key`` files; the name is the
    file name without ``.key``) in ``directory``, read with ``zmq.auth.load_certificate``. A
    file that is not a certificate is skipped (logged). Raises ``OSError`` if the directory
    cannot be listed."""
    import zmq.auth

    out: dict[str, str] = {}
    for p in sorted(Path(directory).glob("*.key")):
        try:
            pub, _ = zmq.auth.load_certificate(p)
        except (OSError, ValueError) as e:
            log.warning("allow directory %s: skipping %s: %s", directory, p.name, e)
            continue
        if is_z85_key(pub):
            out[_text(pub)] = p.name[:-len(".key")]
    return out


# -- the configuration value ----------------------------------------------------------------------
@dataclass(frozen=True)
class Security:
    """How a socket is secured; build it with :meth:`curve` or :meth:`none`.

    - ``mechanism``: ``"curve"`` or ``"null"`` (plain TCP);
    - ``server_public``/``server_secret``: the publisher's own key pair (Z85 text), or, on a
      subscriber, ``server_public`` alone: the publisher's public key (``None``: the one the
      catalog recorded for each partition);
    - ``client_public``/``client_secret``: a subscriber's key pair;
    - ``allow``: the absolute path of the publisher's client-certificate directory, or ``None``
      (any client key).

    Secret keys are left out of ``repr``."""

    mechanism: str = "null"
    server_public: str | None = None
    server_secret: str | None = field(default=None, repr=False)
    client_public: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    allow: str | None = None

    @classmethod
    def none(cls) -> "Security":
        """Plain TCP (the same as passing ``security=None``)."""
        return cls()

    @classmethod
    def curve(cls, *, server_secret: Any = None, allow: Any = None, client_secret: Any = None,
              server_public: Any = None) -> "Security":
        """CURVE. A publisher gives ``server_secret`` (its key pair: a ``.key_secret`` path, a
        name in ``$EPOCHSTREAM_KEYS`` or a ``(public, secret)`` pair) and ``allow`` (a directory
        of client ``*.key`` certificates, a name of a sub-directory of ``$EPOCHSTREAM_KEYS``, or
        ``None``: any client key). A subscriber gives ``client_secret`` (as ``server_secret``)
        and ``server_public`` (the publisher's public key: Z85 text, a certificate path or a
        name; ``None``: the key the catalog recorded for each partition). One value is one
        side: a process that publishes and subscribes makes two. Files are read here, once (the
        ``allow`` directory again whenever it changes). Raises ``ValueError`` (module
        docstring)."""
        if (server_secret is None) == (client_secret is None):
            raise ValueError("Security.curve: give server_secret= (a publisher's key pair) or "
                             "client_secret= (a subscriber's key pair), one of them")
        if allow is not None and server_secret is None:
            raise ValueError("Security.curve: allow= is the publisher's side (needs "
                             "server_secret=)")
        spub = ssec = cpub = csec = None
        if server_secret is not None:
            spub, ssec = load_keypair(server_secret, "server_secret")
        if client_secret is not None:
            cpub, csec = load_keypair(client_secret, "client_secret")
        if server_public is not None:
            if client_secret is None:
                raise ValueError("Security.curve: server_public= is the subscriber's side "
                                 "(needs client_secret=)")
            spub = load_public(server_public, "server_public")
        return cls("curve", spub, ssec, cpub, csec,
                   None if allow is None else _allow_dir(allow))

    @property
    def enabled(self) -> bool:
        """True for CURVE, False for plain TCP."""
        return self.mechanism == "curve"

    @property
    def is_server(self) -> bool:
        """True if this value can secure a publisher (it holds a server key pair)."""
        return self.enabled and self.server_secret is not None

    @property
    def is_client(self) -> bool:
        """True if this value can secure a subscriber (it holds a client key pair)."""
        return self.enabled and self.client_secret is not None


def _enabled(sec: Security | None) -> bool:
    if sec is None:
        return False
    if not isinstance(sec, Security):
        raise TypeError(f"security must be a Security (Security.curve(...)) or None, got "
                        f"{type(sec).__name__}")
    return sec.enabled


# -- grants ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """One grant: ``principal`` (a client's public key in Z85, a certificate name of the
    publisher's ``allow`` directory, or ``"*"``: any authenticated peer) may do ``op``
    (:data:`OPERATIONS`) on the topics matching ``pattern`` (``fnmatch``)."""

    principal: str
    pattern: str
    op: str


def check_grant(principal: Any, pattern: Any, op: Any) -> Grant:
    """The :class:`Grant` for these arguments, checked: non-empty strings of at most 256
    characters without whitespace for ``principal``, a non-empty string of at most 256
    characters for ``pattern``, an op of :data:`OPERATIONS`. Raises ``ValueError``."""
    if not isinstance(principal, str) or not principal or len(principal) > _MAX_TEXT or \
            any(c.isspace() for c in principal):
        raise ValueError(f"a grant's principal is a public key (Z85), a certificate name or "
                         f"'*' (a non-empty string without spaces), got {principal!r:.80}")
    if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_TEXT:
        raise ValueError(f"a grant's topic pattern is a non-empty string (fnmatch: * ? [..]) "
                         f"of at most {_MAX_TEXT} characters, got {pattern!r:.80}")
    if op not in OPERATIONS:
        raise ValueError(f"a grant's operation is one of {', '.join(OPERATIONS)}, got {op!r:.40}")
    return Grant(principal, pattern, op)


def grant_matches(grants: Iterable[Grant], principal: str | Iterable[str], topic: str,
                  op: str) -> bool:
    """Whether ``grants`` let ``principal`` (one principal, or the several of one peer: its key
    and certificate name) do ``op`` on ``topic``: some grant names one of them (or ``"*"``),
    its pattern matches ``topic`` (``fnmatch.fnmatchcase``) and its op is ``op`` or
    ``admin``. Raises ``ValueError`` for an op not in :data:`OPERATIONS`."""
    if op not in OPERATIONS:
        raise ValueError(f"op must be one of {', '.join(OPERATIONS)}, got {op!r}")
    who = {principal} if isinstance(principal, str) else set(principal)
    who.discard(None)
    if not who:
        return False
    return any((g.principal in who or g.principal == ANYONE) and (g.op == op or g.op == "admin")
               and fnmatch.fnmatchcase(topic, g.pattern) for g in grants)


# -- ZAP: one authenticator per context -----------------------------------------------------------
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


# -- the publisher's side: who may subscribe ------------------------------------------------------
class Authorizer:
    """A secured publisher's access decisions for ``topic``: the authenticated principal of
    each message (:meth:`receive`), whether it may subscribe (:meth:`refusal`), and dropping
    registered peers whose grant was revoked (:meth:`enforce`). ``catalog``: where grants are
    read (``Catalog.grants(topic)``), or ``None`` (every authenticated peer may subscribe).

    The grants are read once here (raises what the catalog raises), then every ``refresh``
    seconds (default :data:`GRANTS_REFRESH_S`) by a daemon thread (:meth:`start`); a failed
    read keeps the last grants (logged). The loop thread only reads the current tuple."""

    def __init__(self, topic: str, sec: Security, catalog: Any = None, *,
                 refresh: float | None = None):
        self.topic = topic
        self.catalog = catalog
        self.refresh_s = float(GRANTS_REFRESH_S if refresh is None else refresh)
        self._allow = _allow_list(sec.allow)
        self.grants: tuple[Grant, ...] | None = (None if catalog is None
                                                 else tuple(catalog.grants(topic)))
        self.version = 0  # bumped when the grants change
        self._enforced = 0
        self._principals: dict[bytes, str | None] = {}  # registered ident -> User-Id
        self._checked: dict[bytes, str | None] = {}  # authorised hello, not registered yet
        self._thread: threading.Thread | None = None

    @staticmethod
    def user_of(frame: Any) -> str | None:
        """The ZAP ``User-Id`` of the connection a ``zmq.Frame`` (received with
        ``copy=False``) came over; ``None`` if it has none."""
        import zmq

        try:
            return frame.get("User-Id") or None
        except (zmq.ZMQError, UnicodeDecodeError):
            return None

    def principals(self, user_id: str | None) -> tuple[str, ...]:
        """The principals of a peer whose ``User-Id`` is ``user_id``: the key, and its
        certificate name in the ``allow`` directory."""
        if not user_id:
            return ()
        name = self._allow.keys().get(user_id)
        return (user_id,) if name is None else (user_id, name)

    def refusal(self, user_id: str | None, what: str = "subscribe") -> list[bytes] | None:
        """``None`` if the peer ``user_id`` may subscribe to the topic, else the ``X error``
        frames to answer it with."""
        if not user_id:
            why = "no authenticated identity"
        elif self.grants is None:
            return None
        elif grant_matches(self.grants, self.principals(user_id), self.topic, "subscribe"):
            return None
        else:
            why = f"principal {user_id} holds no subscribe grant"
        return self.notice(user_id, f"{why}; cannot {what}")

    def allows(self, user_id: str | None, op: str) -> bool:
        """Whether the peer authenticated as ``user_id`` may do ``op`` (:data:`OPERATIONS`) on
        the topic: it has an identity and, with a catalog, one of its principals (or ``*``) holds
        a grant for ``op`` or ``admin`` matching the topic; without a catalog any identity may."""
        if not user_id:
            return False
        if self.grants is None:
            return True
        return grant_matches(self.grants, self.principals(user_id), self.topic, op)

    def publish_refusal(self, user_id: str | None) -> str | None:
        """``None`` if the peer ``user_id`` may publish to the topic (:meth:`allows`), else
        the message to refuse it with: ``not authorised to publish to topic 'T' (...)``."""
        if self.allows(user_id, "publish"):
            return None
        why = ("no authenticated identity" if not user_id
               else f"principal {user_id} holds no publish grant")
        return f"not authorised to publish to topic {self.topic!r} ({why})"

    def notice(self, user_id: str | None, why: str) -> list[bytes]:
        """The ``X error`` frames refusing ``user_id``, naming the topic and ``why``."""
        from .. import wire

        return wire.encode_notice("error", f"not authorised for topic {self.topic!r} ({why})",
                                  reason=NOT_AUTHORISED, principal=user_id or "")

    def checked(self, ident: bytes, user_id: str | None) -> None:
        """The hello of ``ident`` (authenticated as ``user_id``) was authorised; its
        registration may come later (a relay's gated hello)."""
        if len(self._checked) >= 4096:  # hellos authorised but never registered: forget old ones
            for old in list(self._checked)[:1024]:
                del self._checked[old]
        self._checked[ident] = user_id

    def registered(self, ident: bytes) -> None:
        """The loop registered ``ident`` (with the identity its authorised hello had)."""
        self._principals[ident] = self._checked.pop(ident, None)

    def enforce(self, peers: dict[bytes, Any], leave: Callable[[bytes], None],
                transmit: Callable[[bytes, list[bytes]], Any]) -> int:
        """If the grants changed since the last call: drop (``leave``) and notify every peer of
        ``peers`` (the registered idents) no longer authorised. Returns how many."""
        if self._enforced == self.version:
            if len(self._principals) > len(peers) + 1024:  # forget peers that left
                for ident in [i for i in self._principals if i not in peers]:
                    del self._principals[ident]
            return 0
        self._enforced = self.version
        for ident in [i for i in self._principals if i not in peers]:
            del self._principals[ident]
        dropped = 0
        for ident, user in list(self._principals.items()):
            refusal = self.refusal(user, "go on (grant revoked)")
            if refusal is not None:
                log.warning("%s: dropping subscriber %r: %s", self.topic, ident,
                            "grant revoked")
                leave(ident)
                transmit(ident, refusal)
                del self._principals[ident]
                dropped += 1
        return dropped

    def reload(self) -> bool:
        """Read the grants again; True if they changed. A failure keeps the old ones (logged)."""
        if self.catalog is None:
            return False
        try:
            fresh = tuple(self.catalog.grants(self.topic))
        except Exception as e:  # noqa: BLE001 - the catalog may be away; keep serving
            log.warning("%s: could not read the grants (keeping the last ones): %s",
                        self.topic, e)
            return False
        if fresh != self.grants:
            self.grants = fresh
            self.version += 1
            return True
        return False

    def start(self, alive: Callable[[], bool]) -> None:
        """Re-read the grants every ``refresh`` seconds while ``alive()`` (the publisher's loop
        runs), on a daemon thread. Without a catalog: nothing to do."""
        if self.catalog is None or self._thread is not None:
            return

        def run() -> None:
            while True:
                _time.sleep(self.refresh_s)
                if not alive():
                    return
                self.reload()

        self._thread = threading.Thread(target=run, daemon=True,
                                        name=f"epochstream-grants-{self.topic}")
        self._thread.start()
