"""The network catalog's server: :class:`CatalogServer`, what ``epochstream catalog serve --db
PATH --bind tcp://HOST:PORT`` runs.

One thread owns the embedded :class:`~epochstream.catalog.Catalog` (the SQLite file stays the
store) and one ZeroMQ ROUTER socket, and answers the requests one at a time, in arrival order: the
service serialises every read and write, and each write is still the embedded catalog's
``BEGIN IMMEDIATE`` transaction (other processes may keep opening the file directly). Messages:
:mod:`epochstream.catalog.rpc`; the client: :mod:`epochstream.catalog.client`.

Bad input never stops the service: a body that is not msgpack, not a map, names an operation
outside :data:`~epochstream.catalog.rpc.OPS` (a private method such as ``_connect`` or
``__class__`` included), carries arguments of the wrong types or too many of them gets an
``{"error": ...}`` reply (a :class:`~epochstream.errors.CatalogError` naming the problem, or
what the embedded catalog raised), and the next request is served as usual. A message larger
than :data:`~epochstream.catalog.rpc.MAX_REQUEST_BYTES` closes that client's connection (libzmq's
``MAXMSGSIZE``). Nothing received is ever unpickled or evaluated. A request never waits on the
server: ``lookup``'s ``wait`` is done by the client, polling.

Without ``security=`` there is no authentication: bind to an interface only trusted hosts
reach (the default is ``tcp://127.0.0.1:7420``). With ``security=`` (``catalog serve --key
--allow``, docs/security.md) the socket is a CURVE server: only keys in ``allow`` are answered
at all; ``grant``/``revoke`` need an ``admin`` grant of the requesting key matching the pattern
changed, and every operation that changes a topic's state needs the grant of
:data:`TOPIC_GRANTS` for that topic (as Kafka's ACLs map each request to an operation on a
resource): a publisher's (``create_topic``, ``register_partition``, its frontiers, liveness
and epoch log) ``publish``; a consumer's (durable subscriptions, consumer groups)
``subscribe``; deleting a topic, a durable subscription or a group ``admin``. An ``admin``
grant implies the others. Otherwise the client gets :class:`~epochstream.errors.NotAuthorized`
and nothing changes. Reads (:data:`READ_OPS`) stay open to every allowed key.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import zmq

from . import rpc
from .api import Catalog, is_catalog_url
from .retry import as_retry
from .holders import HOST
from .schema import SCHEMA_VERSION
from ..errors import CatalogError, NotAuthorized
from ..zmq_context import default_context
from ..security import Security, _allow_list, apply_server, grant_matches

__all__ = ["CatalogServer", "DEFAULT_BIND", "DEFAULT_PORT", "TOPIC_GRANTS", "READ_OPS"]

log = logging.getLogger("epochstream.catalog")

DEFAULT_PORT = 7420
DEFAULT_BIND = f"tcp://127.0.0.1:{DEFAULT_PORT}"
_POLL_MS = 100  # how often the loop looks at its stop flag


class CatalogServer:
    """Serves the catalog file ``db`` (a path as :class:`~epochstream.catalog.Catalog` takes
    it, or an embedded ``Catalog``; ``None``: the default catalog, which must then not be a
    URL) on ``bind`` (a ZeroMQ
    endpoint, ``"tcp://HOST:PORT"``, ``*`` for a free port).

    The socket is bound and the file opened (created, migrated) by the constructor, so errors
    surface there: :class:`~epochstream.errors.CatalogError` for the file, ``zmq.ZMQError`` for
    the address. :attr:`endpoint` is the bound address with the port resolved. :meth:`start`
    serves in a background thread, :meth:`serve_forever` in the calling one; :meth:`stop` (or
    leaving a ``with`` block) ends it and closes the socket. :attr:`stats`: ``requests``
    answered and ``errors`` among them."""

    def __init__(self, db: Any = None, bind: str = DEFAULT_BIND, *,
                 context: zmq.Context | None = None, security: Security | None = None):
        if is_catalog_url(os.environ.get("EPOCHSTREAM_CATALOG") if db is None else str(
                getattr(db, "path", db))):
            raise CatalogError("the catalog server needs a catalog file (--db PATH), not a "
                               "network catalog's URL")
        self.catalog = db if isinstance(db, Catalog) else Catalog(db)
        self._sock = (context or default_context()).socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, rpc.MAX_REQUEST_BYTES)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)
        self._sock.setsockopt(zmq.RCVHWM, 10_000)
        # CURVE (docs/security.md): only keys in ``allow`` connect at all, and changing grants
        # takes an ``admin`` grant of the requesting key (the first one is made on the file)
        self.security = security if security is not None and security.enabled else None
        try:
            apply_server(self._sock, self.security)
        except BaseException:
            self._sock.close(0)
            raise
        self._allowed = None if self.security is None else _allow_list(self.security.allow)
        try:
            self._sock.bind(bind)
        except zmq.ZMQError:
            self._sock.close(0)
            raise
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stats = {"requests": 0, "errors": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._info = {"db": self.catalog.where, "host": HOST, "pid": os.getpid(),
                      "schema": SCHEMA_VERSION, "version": _version()}

    def __repr__(self) -> str:
        return f"CatalogServer({self.catalog.where!r}, {self.endpoint!r})"

    # ---- running

    def start(self) -> "CatalogServer":
        """Serve in a daemon thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("the catalog server is already running")
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="epochstream-catalog-server")
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Answer requests until :meth:`stop`; then close the socket."""
        sock = self._sock
        try:
            while not self._stop.is_set():
                if not sock.poll(_POLL_MS):
                    continue
                for _ in range(1000):  # a batch, then a look at the stop flag
                    try:
                        if self.security is None:
                            frames, user = sock.recv_multipart(zmq.NOBLOCK), None
                        else:  # with the connection's authenticated key (ZAP User-Id)
                            msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                            frames = [f.bytes for f in msg]
                            try:
                                user = msg[-1].get("User-Id") or None
                            except (zmq.ZMQError, UnicodeDecodeError):
                                user = None
                    except zmq.Again:
                        break
                    reply = self.handle(frames, user)
                    if reply is None:
                        continue
                    try:
                        sock.send_multipart(reply, zmq.NOBLOCK)
                    except zmq.ZMQError as e:  # the client is gone or not reading
                        log.debug("catalog server: reply dropped: %s", e)
        finally:
            sock.close(0)

    def stop(self, timeout: float = 5.0) -> None:
        """End serving (within about 0.1 s) and close the socket."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "CatalogServer":
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- one request

    def handle(self, frames: list, user: str | None = None) -> list | None:
        """The reply frames to one received message ``[identity, *envelope, body]``
        (``None``: nothing to answer) from the client whose CURVE key is ``user`` (Z85;
        ``None`` without security). Never raises."""
        if len(frames) < 2:
            return None
        identity, envelope, body = frames[0], frames[1:-1], frames[-1]
        if len(envelope) > rpc.MAX_ENVELOPE_FRAMES or \
                any(len(f) > rpc.MAX_ENVELOPE_BYTES for f in envelope):
            envelope = []  # cannot be echoed safely; the error still goes to that client
            reply: dict = rpc.error_reply(CatalogError(
                f"a catalog request is [request id, body] (at most "
                f"{rpc.MAX_ENVELOPE_FRAMES} envelope frames of {rpc.MAX_ENVELOPE_BYTES} bytes)"))
        else:
            reply = self._answer(body, user)
        self.stats["requests"] += 1
        if "error" in reply:
            self.stats["errors"] += 1
        try:
            data = rpc.encode(reply)
        except Exception as e:  # noqa: BLE001 - a result that cannot be sent
            self.stats["errors"] += 1
            data = rpc.encode(rpc.error_reply(CatalogError(f"cannot send the result: {e}")))
        return [identity, *envelope, data]

    def _answer(self, body: bytes, user: str | None = None) -> dict:
        try:
            try:
                req = rpc.decode(body, strict=True)
            except Exception as e:  # noqa: BLE001 - not msgpack, a bad extension, ...
                raise CatalogError(f"a catalog request must be a msgpack map: {type(e).__name__}: "
                                   f"{e}"[:500]) from None
            op, args, kwargs = rpc.check_request(req)
            if self.security is not None and op in _ADMIN_OPS:
                self._authorise_admin(op, args, kwargs, user)
            if self.security is not None and op in TOPIC_GRANTS:
                self._authorise_topic(op, TOPIC_GRANTS[op], args, kwargs, user)
            attempt = req.get("retry", 0)
            if attempt:  # a resent request: the first may have been applied (client.py)
                with as_retry(attempt):
                    return {"ok": self._run(op, args, kwargs)}
            return {"ok": self._run(op, args, kwargs)}
        except Exception as e:  # noqa: BLE001 - every failure is the client's to hear about
            log.debug("catalog request failed: %r", e)
            return rpc.error_reply(e)

    def _authorise_admin(self, op: str, args: list, kwargs: dict, user: str | None) -> None:
        """Raise :class:`NotAuthorized` unless ``user`` holds an ``admin`` grant whose pattern
        matches the pattern the request changes (``*`` for a revoke of every pattern)."""
        pattern = (args[1] if len(args) > 1 else kwargs.get("topic_pattern")) or "*"
        names = self._principals(user)
        if not isinstance(pattern, str) or not names or not grant_matches(
                self.catalog.grants(), names, pattern, "admin"):
            raise NotAuthorized(f"{op} on the catalog service needs an admin grant for "
                                f"{pattern!r}; {user or 'this client'} holds none (make the "
                                f"first one on the catalog file: epochstream grant add ... "
                                f"--op admin --catalog PATH)", topic=str(pattern))

    def _authorise_topic(self, op: str, need: str, args: list, kwargs: dict,
                         user: str | None) -> None:
        """Raise :class:`NotAuthorized` unless ``user`` holds a ``need`` (or ``admin``) grant
        whose pattern matches the topic of the request (its first argument)."""
        topic = args[0] if args else kwargs.get("topic")
        if not isinstance(topic, str):
            raise CatalogError(f"{op} needs a topic name (a string), got {topic!r:.80}")
        names = self._principals(user)
        if not names or not grant_matches(self.catalog.grants(topic), names, topic, need):
            what = {"publish": "publish to", "subscribe": "subscribe to",
                    "admin": "administer"}[need]
            raise NotAuthorized(
                f"not authorised to {what} topic {topic!r}: {op} on the catalog service "
                f"needs a{'n' if need == 'admin' else ''} {need} grant for the topic; "
                f"{user or 'this client'} holds none (epochstream grant add KEY {topic!r} "
                f"--op {need})", topic=topic, principal=user or "")

    def _principals(self, user: str | None) -> tuple[str, ...]:
        """The requesting key and, with an ``allow`` directory, its certificate's name."""
        if not user or self._allowed is None:
            return ()
        name = self._allowed.keys().get(user)
        return (user,) if name is None else (user, name)

    def _run(self, op: str, args: list, kwargs: dict) -> Any:
        if op == "hello":
            return dict(self._info)
        if op == "lookup":  # never wait here: the client polls (module docstring)
            kwargs.pop("wait", None)
            if len(args) > 1:
                args = args[:1]
        method = getattr(self.catalog, op)  # op is one of rpc.OPS: a public Catalog method
        return method(*args, **kwargs)


_ADMIN_OPS = ("grant", "revoke")
"""Catalog operations that change who may do what: only for an ``admin`` key when secured."""

TOPIC_GRANTS = {
    **dict.fromkeys(("create_topic", "register_partition", "close_partition", "record_upper",
                     "heartbeat", "history_begin", "history_commit", "history_trim",
                     "history_uploaded", "retention_acquire", "retention_release",
                     "retention_record"), "publish"),
    **dict.fromkeys(("durable_claim", "durable_ack", "durable_release", "durable_renew",
                     "durable_reset", "group_open", "group_settle", "group_stop", "group_reset",
                     "group_claim_read", "group_claim_apply"), "subscribe"),
    **dict.fromkeys(("drop_topic", "durable_drop", "group_drop"), "admin"),
}
"""The grant (``publish``, ``subscribe`` or ``admin``) a key needs on a secured service for
each catalog operation that changes a topic's state, checked against the topic of the request
(its first argument); ``admin`` implies the others."""

READ_OPS = frozenset({"topics", "lookup", "history_state", "history_states", "history_epochs",
                      "history_epoch", "durables", "durable", "group_info", "groups", "retention_limits",
                      "group_epochs", "grants", "hello"})
"""Catalog operations that change nothing: open to every allowed key (as ``grants``)."""


def _version() -> str:
    from .. import __version__
    return __version__
