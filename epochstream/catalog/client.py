"""The network catalog's client: :class:`RemoteCatalog`, what ``Catalog("tcp://host:port")``
returns — the same methods as the embedded :class:`~epochstream.catalog.Catalog`, each one
request to ``epochstream catalog serve`` (:mod:`epochstream.catalog.server`), which runs it on
the SQLite file it owns. Messages: :mod:`epochstream.catalog.rpc`.

URL: ``tcp://HOST:PORT``, optionally with ``?timeout=SECONDS&lease=SECONDS`` and, for a service
started with ``--key``, ``client_key=KEY&server_key=KEY`` (so that a URL in
``$EPOCHSTREAM_CATALOG``, ``--catalog`` or a Spark option can carry them; each ``KEY`` a key
file's path or a name in ``$EPOCHSTREAM_KEYS``, never the key itself: the client's secret
``NAME.key_secret`` and the service's public ``NAME.key``). Keyword arguments of
``Catalog(url, timeout=..., lease=..., security=...)`` win over the URL's.

- **Timeouts.** Every request waits at most ``timeout`` seconds (default
  :data:`DEFAULT_TIMEOUT`) for its answer, then raises
  :class:`~epochstream.errors.CatalogUnavailable` — never a hang; the socket of a request that
  timed out is closed (``LINGER`` 0) and the next request uses a fresh one. Opening the client
  asks the server to describe itself (``hello``), so an unreachable catalog is reported by
  ``Catalog(url)`` itself.
- **Errors** raised by the embedded catalog on the server are raised here with the same type,
  message and attributes (:func:`~epochstream.catalog.rpc.raise_error`).
- **Leases.** Liveness of a process on another machine cannot be checked from its pid, so a
  partition registered through this client (:meth:`RemoteCatalog.register_partition`) and a
  durable subscription claimed through it (:meth:`RemoteCatalog.durable_claim`) carry a lease of
  ``lease`` seconds (default :data:`DEFAULT_LEASE`): a background thread of this client renews
  every lease it holds every ``lease / 3`` seconds (also :meth:`RemoteCatalog.renew`), until the
  partition is closed (:meth:`~RemoteCatalog.close_partition`), the subscription released, the
  client closed (:meth:`RemoteCatalog.close`) or the process ends. A partition whose lease was
  not renewed for ``lease`` seconds reads as ``"dead"`` (the server's clock) and another
  publisher may take it over.
- **Threads and processes.** A client may be shared by threads (each request borrows a socket
  from a small pool); a child process made by ``fork()`` opens its own sockets and renews
  nothing of its parent's.
- **The local directory.** :attr:`RemoteCatalog.path` is the URL (a ``str``); its ``parent``
  is a local directory standing for "the catalog's directory": ``$EPOCHSTREAM_HOME/<host>_<port>``
  (default ``~/.epochstream/<host>_<port>``). ``Retention(dir=None)`` puts a publisher's epoch
  logs under it (``history/<topic>/<partition>``).
- **Consumer groups.** :meth:`RemoteCatalog.group_claim` cannot send its ``decide`` callable:
  it reads the group's states (``group_claim_read``), decides here, and applies the decision in
  one server transaction (``group_claim_apply``) only if the states did not change meanwhile;
  otherwise it reads and decides again.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import re
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode

import zmq

from ..errors import CatalogError, CatalogUnavailable, TopicNotFound
from ..security import Grant
from . import rpc
from .api import (ENV_VAR, POLL_INTERVAL_S, Catalog, CatalogURL, implementation, is_catalog_url,
                  local_home)
from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
from .history_records import DurableInfo, EpochRecord, HistoryState
from .liveness import HOST, process_start
from .records import TopicInfo
from .renewals import Renewals
from .schema import STATES
from .sqlcatalog import topic_definition

__all__ = ["RemoteCatalog", "CatalogURL", "parse_url", "local_home", "DEFAULT_TIMEOUT",
           "DEFAULT_LEASE", "CLAIM_ATTEMPTS", "RESEND_S"]

log = logging.getLogger("epochstream.catalog")

DEFAULT_TIMEOUT = 5.0
"""Seconds a request waits for the catalog server's answer."""
DEFAULT_LEASE = 10.0
"""Seconds a partition (or durable subscription) registered through the network catalog stays
alive without a renewal; renewed every third of it."""
RESEND_S = 1.0
"""Seconds a request waits for its answer before it is sent again (within ``timeout``)."""
CLAIM_ATTEMPTS = 100
"""Reads-and-decides a :meth:`RemoteCatalog.group_claim` tries before giving up (each failure
means another worker changed the group meanwhile)."""
_POOL = 8  # idle sockets kept per client
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
            params[k] = _seconds(k, float(v))
        except ValueError:
            raise CatalogError(f"catalog URL {url!r}: {k} must be seconds > 0, got {v!r}") from None
    return m["host"].lower(), int(m["port"]), params


def _url_security(url: str, params: dict) -> Any:
    """The CURVE client of a URL's ``client_key``/``server_key`` (both needed)."""
    from ..security import Security

    if "client_key" not in params or "server_key" not in params:
        raise CatalogError(f"catalog URL {url!r}: give client_key and server_key together")
    try:
        return Security.curve(client_secret=params["client_key"],
                              server_public=params["server_key"])
    except ValueError as e:
        raise CatalogError(f"catalog URL {url!r}: {e}") from None


def _seconds(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ValueError(f"{what} must be seconds > 0, got {value!r}")
    return float(value)


@implementation("tcp")
class RemoteCatalog(Catalog):
    """The network catalog at ``url`` (``"tcp://host:port"``; ``None``: ``$EPOCHSTREAM_CATALOG``)
    with the methods of :class:`~epochstream.catalog.Catalog` (module docstring).

    ``timeout``: seconds each request may wait for its answer (default :data:`DEFAULT_TIMEOUT`,
    or the URL's ``?timeout=``); ``lease``: seconds of the leases this client takes (default
    :data:`DEFAULT_LEASE`, or ``?lease=``); ``security``: ``None`` (plain TCP) or
    ``Security.curve(client_secret=..., server_public=<the service's key>)`` for a service
    started with ``--key``/``--allow`` (docs/security.md).

    Raises :class:`CatalogError` for a malformed URL or argument and
    :class:`~epochstream.errors.CatalogUnavailable` if the server does not answer within
    ``timeout``; every method raises ``CatalogUnavailable`` likewise, and otherwise what the
    embedded method raises."""

    def __init__(self, url: str | None = None, *, timeout: float | None = None,
                 lease: float | None = None, security: Any = None):
        url = os.environ.get(ENV_VAR) if url is None else url
        if not is_catalog_url(url):
            raise CatalogError(f"a network catalog is named tcp://HOST:PORT, got {url!r}")
        host, port, params = parse_url(str(url))
        try:
            self.timeout = _seconds("timeout", params.get("timeout", DEFAULT_TIMEOUT)
                                    if timeout is None else timeout)
            self.lease = _seconds("lease", params.get("lease", DEFAULT_LEASE)
                                  if lease is None else lease)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        self.url = f"tcp://{host}:{port}"
        # CURVE towards a secured service (docs/security.md): Security.curve(client_secret=...,
        # server_public=<the service's key>), or the URL's client_key/server_key; None: plain
        if security is None and ("client_key" in params or "server_key" in params):
            security = _url_security(url, params)
        self.security = security if security is not None and security.enabled else None
        if self.security is not None and (not self.security.is_client
                                          or self.security.server_public is None):
            raise CatalogError("a secured catalog service needs Security.curve(client_secret=..., "
                               "server_public=<the service's public key>)")
        keys = {k: params[k] for k in ("client_key", "server_key") if k in params}
        # passed on (e.g. to Spark executors), the URL keeps the key names (never the keys)
        self.path = CatalogURL(  # type: ignore[assignment]
            self.url + (f"?{urlencode(keys)}" if keys else ""))
        self._pool_lock = threading.Lock()
        self._reset_process()
        self._closed = False
        self.server: dict = self._call("hello")
        """The server's description: ``db`` (its SQLite file), ``host``, ``pid``, ``schema``,
        ``version``."""

    def _reset_process(self) -> None:
        """State of this process (again after a ``fork()``: nothing of the parent's is used)."""
        self._pid = os.getpid()
        self._idle: list[tuple[zmq.Socket, float]] = []  # (socket, monotonic time returned)
        self._ids = itertools.count(1)
        self._leases = Renewals(self, self.lease / 3, self.url)
        self._identity: tuple | None = None

    def __repr__(self) -> str:
        return f"RemoteCatalog({self.url!r})"

    # ---- requests

    def _socket(self) -> zmq.Socket:
        with self._pool_lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._reset_process()
            if self._idle:
                return self._idle.pop()[0]
        sock = zmq.Context.instance().socket(zmq.DEALER)
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
        with self._pool_lock:
            if self._pid == os.getpid() and len(self._idle) < _POOL and not self._closed:
                self._idle.append((sock, time.monotonic()))
                _reaper_watch(self)
                return
        sock.close(0)

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Send ``op(*args, **kwargs)``; return the decoded result or raise its error.

        A request unanswered for :data:`RESEND_S` seconds (the service restarting, a connection
        lost) is sent again on a fresh socket, marked as a retry, until ``timeout`` seconds
        have passed; every operation is safe to apply twice (``store.retried``)."""
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
        """Stop renewing leases (partitions registered through this client read as ``dead``
        once their lease passes) and close the idle sockets. Later calls open new sockets."""
        self._leases.close()
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s, _ in idle:
            s.close(0)

    def _reap(self, now: float) -> bool:
        """Close the pooled sockets idle for ``IDLE_S`` or more; True while some stay pooled."""
        with self._pool_lock:
            if self._pid != os.getpid():
                return False
            stale = [s for s, t in self._idle if now - t >= IDLE_S]
            self._idle = [(s, t) for s, t in self._idle if now - t < IDLE_S]
            left = bool(self._idle)
        for s in stale:
            s.close(0)
        return left

    def __enter__(self) -> "RemoteCatalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- leases

    def _holder(self, pid: Any, pid_start: Any, host: Any) -> dict:
        """The holder a request names: ``pid``, ``pid_start``, ``host`` as given, else this
        process (the server cannot know the caller's process)."""
        if self._identity is None or self._identity[0] != os.getpid():
            me = os.getpid()
            self._identity = (me, process_start(me), HOST)
        if pid is None or pid == self._identity[0]:
            pid, start = self._identity[0], self._identity[1]
        else:  # another process of this machine (unless host says otherwise)
            start = None
        return {"pid": pid, "pid_start": start if pid_start is None else pid_start,
                "host": self._identity[2] if host is None else host}

    def _hold(self, key: tuple, ident: str) -> None:
        with self._pool_lock:
            if self._pid != os.getpid():
                self._reset_process()
        self._leases.hold(key, ident)

    def _drop(self, key: tuple, ident: str | None = None) -> None:
        self._leases.drop(key, ident)

    def renew(self) -> int:
        """Renew now every lease this client holds (the background thread does so every
        ``lease / 3`` seconds); returns how many are still held. A lease the catalog no longer
        grants (the partition was taken over or dropped, the subscription reset) is forgotten.
        Raises :class:`~epochstream.errors.CatalogUnavailable` if the server does not answer."""
        return self._leases.renew()

    @property
    def held(self) -> list[tuple]:
        """The leases this client renews: ``("partition", topic, index)`` and
        ``("durable", topic, name)``."""
        return self._leases.held

    # ---- the methods that do more than forward

    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        order_name, codec, partitions, schema, partition_key = topic_definition(
            topic, order, codec, partitions, schema, partition_key)
        extra = {} if partition_key is None else {"partition_key": partition_key}
        return self._call("create_topic", topic, order=order_name, codec=codec,
                          partitions=partitions, schema=schema, **extra)

    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        deadline = time.monotonic() + max(0.0, float(wait))
        while True:
            missing: TopicNotFound | None = None
            try:
                info = self._call("lookup", topic)
            except TopicNotFound as e:
                info, missing = None, e
            ready = info is not None and info.complete and all(
                p.state in STATES for p in info.partition_info)
            remaining = deadline - time.monotonic()
            if ready or remaining <= 0:
                if info is None:
                    assert missing is not None
                    raise missing
                return info
            time.sleep(min(POLL_INTERVAL_S, remaining))

    def register_partition(self, topic: str, partition: int, endpoint: str, *,
                           ingest: str | None = None, pid: int | None = None,
                           incarnation: str | None = None, upper: Any = (),
                           lease: float | None = None, host: str | None = None,
                           pid_start: float | None = None, server_key: str | None = None) -> str:
        me = self._holder(pid, pid_start, host)
        # chosen here, once: a resent registration must find its own claim (store.retried)
        incarnation = uuid.uuid4().hex if incarnation is None else incarnation
        inc = self._call("register_partition", topic, partition, endpoint, ingest=ingest,
                         incarnation=incarnation, upper=upper,
                         lease=self.lease if lease is None else lease, server_key=server_key,
                         **me)
        self._hold(("p", topic, partition), inc)
        return inc

    def close_partition(self, topic: str, partition: int, incarnation: str, upper: Any = (),
                        *, aborted: bool = False) -> bool:
        self._drop(("p", topic, partition), incarnation)
        return self._call("close_partition", topic, partition, incarnation, upper,
                          aborted=aborted)

    def history_begin(self, topic: str, partition: int, directory: str, lower: Any,
                      upper: Any) -> Any:
        return self._call("history_begin", topic, partition, os.path.abspath(directory), lower,
                          upper)

    def durable_claim(self, topic: str, name: str, holder: str, *, takeover: bool = False,
                      pid: int | None = None, pid_start: float | None = None,
                      host: str | None = None, lease: float | None = None) -> Any:
        me = self._holder(pid, pid_start, host)
        info = self._call("durable_claim", topic, name, holder, takeover=takeover,
                          lease=self.lease if lease is None else lease, **me)
        self._hold(("d", topic, name), holder)
        return info

    def durable_release(self, topic: str, name: str, holder: str) -> None:
        self._drop(("d", topic, name), holder)
        return self._call("durable_release", topic, name, holder)

    def group_claim(self, topic: str, name: str, worker: str, decide: Callable[..., Any],
                    ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        for attempt in range(CLAIM_ATTEMPTS):
            view = self._call("group_claim_read", topic, name)
            the_plan, position = decide(dict(view.states), view.now, view.stored)
            got = self.group_claim_apply(topic, name, worker, list(the_plan.lease),
                                         list(the_plan.exhausted), position, view.fingerprint)
            if got is not None:
                return got
            time.sleep(random.uniform(0, 0.001 * min(attempt + 1, 20)))
        raise CatalogError(f"consumer group {name!r} of topic {topic!r}: no claim after "
                           f"{CLAIM_ATTEMPTS} attempts, the group kept changing meanwhile")

    def group_claim_apply(self, topic: str, name: str, worker: str, lease: Any, exhausted: Any,
                          position: Any, fingerprint: str, *, pid: int | None = None,
                          pid_start: float | None = None, host: str | None = None) -> Any:
        me = self._holder(pid, pid_start, host)
        return self._call("group_claim_apply", topic, name, worker, lease, exhausted, position,
                          fingerprint, **me)

    def grant(self, principal: str, topic_pattern: str, op: str) -> Any:
        # positional: a keyword ``op`` would collide with _call's own first parameter
        return self._call("grant", principal, topic_pattern, op)

    def revoke(self, principal: str, topic_pattern: str | None = None,
               op: str | None = None) -> int:
        return self._call("revoke", principal, topic_pattern, op)

    # ---- the methods that forward: one request each (rpc.OPS)

    def drop_topic(self, topic: str) -> None:
        return self._call("drop_topic", topic)

    def topics(self) -> list[TopicInfo]:
        return self._call("topics")

    def record_upper(self, topic: str, partition: int, incarnation: str, upper: Any) -> bool:
        return self._call("record_upper", topic, partition, incarnation, upper)

    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        return self._call("heartbeat", topic, partition, incarnation)

    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        return self._call("grants", topic, principal)

    def history_state(self, topic: str, partition: int) -> HistoryState | None:
        return self._call("history_state", topic, partition)

    def history_states(self, topic: str) -> dict[int, HistoryState]:
        return self._call("history_states", topic)

    def history_commit(self, topic: str, partition: int, *, epochs: list[EpochRecord],
                       lower: Any, upper: Any, segment: int, committed: int,
                       roll_to: int | None = None, durable: bool = True,
                       incarnation: str | None = None) -> None:
        return self._call("history_commit", topic, partition, epochs=epochs, lower=lower,
                          upper=upper, segment=segment, committed=committed, roll_to=roll_to,
                          durable=durable, incarnation=incarnation)

    def history_trim(self, topic: str, partition: int, keep_from: int) -> tuple[tuple, list[str]]:
        return self._call("history_trim", topic, partition, keep_from)

    def history_epochs(self, topic: str, partition: int, *, min_t0: int | None = None,
                       segment_from: int | None = None) -> list[EpochRecord]:
        return self._call("history_epochs", topic, partition, min_t0=min_t0, segment_from=segment_from)

    def history_epoch(self, topic: str, partition: int, time: Any) -> EpochRecord | None:
        return self._call("history_epoch", topic, partition, time)

    def durables(self, topic: str | None = None) -> list[DurableInfo]:
        return self._call("durables", topic)

    def durable(self, topic: str, name: str) -> DurableInfo | None:
        return self._call("durable", topic, name)

    def durable_ack(self, topic: str, name: str, holder: str, position: Any,
                    acked: Any = ()) -> bool:
        return self._call("durable_ack", topic, name, holder, position, acked)

    def durable_renew(self, topic: str, name: str, holder: str) -> bool:
        return self._call("durable_renew", topic, name, holder)

    def durable_reset(self, topic: str, name: str, position: Any | None) -> DurableInfo:
        return self._call("durable_reset", topic, name, position)

    def durable_drop(self, topic: str, name: str) -> bool:
        return self._call("durable_drop", topic, name)

    def group_open(self, topic: str, name: str, *, mode: str, ack_wait: float,
                   max_deliver: int, dead_letter: str | None) -> GroupInfo:
        return self._call("group_open", topic, name, mode=mode, ack_wait=ack_wait, max_deliver=max_deliver, dead_letter=dead_letter)

    def group_info(self, topic: str, name: str) -> GroupInfo:
        return self._call("group_info", topic, name)

    def groups(self, topic: str | None = None) -> list[GroupInfo]:
        return self._call("groups", topic)

    def group_drop(self, topic: str, name: str) -> bool:
        return self._call("group_drop", topic, name)

    def group_epochs(self, topic: str, name: str) -> list[GroupEpoch]:
        return self._call("group_epochs", topic, name)

    def group_claim_read(self, topic: str, name: str) -> ClaimView:
        return self._call("group_claim_read", topic, name)

    def group_settle(self, topic: str, name: str, unit: tuple, token: int, *, outcome: str,
                     delay: float = 0.0) -> float:
        return self._call("group_settle", topic, name, unit, token, outcome=outcome, delay=delay)

    def group_stop(self, topic: str, name: str, reason: str) -> None:
        return self._call("group_stop", topic, name, reason)

    def group_reset(self, topic: str, name: str) -> None:
        return self._call("group_reset", topic, name)


_reaper_lock = threading.Lock()
_reaper_pid = 0
_reaper_clients: "weakref.WeakSet[RemoteCatalog]" = weakref.WeakSet()


def _reaper_watch(cat: "RemoteCatalog") -> None:
    """Have this process's reaper thread close ``cat``'s idle sockets (started on first use,
    again in a forked child)."""
    global _reaper_pid
    with _reaper_lock:
        _reaper_clients.add(cat)
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
            clients = list(_reaper_clients)
        for cat in clients:
            try:
                if not cat._reap(now):
                    with _reaper_lock:
                        _reaper_clients.discard(cat)
            except Exception:  # noqa: BLE001 - a closed client or a closed context: skip it
                log.debug("catalog idle-socket reaper: %s", cat, exc_info=True)
        del clients
