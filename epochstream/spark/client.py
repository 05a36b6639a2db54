"""The ingest client: a Spark worker process's connections to the hosts' ingest endpoints.

Executors' ``write()`` and the driver-side ``commit()``/``abort()`` run in Spark's Python worker
processes, which are forked and reused across tasks. This module keeps, per process, one zmq
context, one DEALER per ingest endpoint and one :class:`~epochstream.catalog.Catalog` per path
(all re-created after a fork), and implements request/reply over them with
:mod:`epochstream.spark.ingest` messages. :func:`send_commit` is the driver-side COMMIT of one
epoch on every partition of a topic.

Security (docs/security.md). A host started with ``security=`` records its CURVE public key with
each partition in the catalog (``PartitionInfo.server_key``: the same key pair serves the
partition's publisher and its ingest endpoint), so the catalog lookup that finds the ingest
endpoints (:func:`ingest_targets`) gives the key to connect with; :func:`client_for` then makes
the DEALER a CURVE client with the sink's ``clientKey`` (a ``.key_secret`` path, or a name in
``$EPOCHSTREAM_KEYS``: :func:`client_security`), optionally pinned to a ``serverKey``. A
secured host and a client without a key, or a plain host and a client with one, is an
:class:`IngestError` before connecting. A failed handshake (the wrong server key, a key outside
the host's ``allow`` directory, no CURVE on one side) is seen on the socket's monitor (libzmq's
``HANDSHAKE_FAILED_*`` events) and raised as an :class:`IngestError` that says which at the
client's next send or wait, not after a timeout; a key without a ``publish`` grant gets the
host's ``ERR`` (:class:`IngestNotAuthorized`). Nothing of a refused client is staged.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple, TypeVar, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..catalog import Catalog
from ..errors import CatalogUnavailable, EpochstreamError
from ..security import Security, apply_client
from .ingest import (Abort, AttemptRef, Commit, CommitAck, EventTimes, Flush, IngestError,
                     IngestMessageError, IngestNotAuthorized, Refusal, Reply, Request,
                     decode_reply, encode_request)

__all__ = ["DEFAULT_COMMIT_TIMEOUT", "IngestClient", "IngestTarget", "client", "client_for",
           "client_security", "drop_client", "ingest_endpoints", "ingest_targets", "require_host",
           "send_commit"]

DEFAULT_COMMIT_TIMEOUT = 120.0

_Answered = TypeVar("_Answered", Flush, Commit, Abort)

_ctx_pid: int | None = None
_ctx: zmq.Context | None = None
_clients: dict[tuple[str, str | None, str | None], IngestClient] = {}
_catalogs: dict[str, Catalog] = {}
_securities: dict[tuple[str, str | None], Security] = {}
_req_ids = itertools.count()
_client_lock = threading.Lock()


def _context() -> zmq.Context:
    """A zmq context owned by this process (Spark workers are forked: never inherit one)."""
    global _ctx, _ctx_pid
    pid = os.getpid()
    if _ctx is None or _ctx_pid != pid:
        _ctx = zmq.Context()
        _ctx_pid = pid
        _clients.clear()
        _catalogs.clear()
        _securities.clear()
    return _ctx


def _new_req() -> str:
    return f"{os.getpid()}-{next(_req_ids)}"


_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class IngestClient:
    """A DEALER connected to one ingest endpoint, cached per process (see :func:`client`).
    Timeouts are in seconds. ``security``: ``None`` (plain TCP) or a CURVE client's
    :class:`~epochstream.security.Security` (``Security.curve(client_secret=...)``), with
    ``server_key`` the host's public key (Z85; default ``security.server_public``). A failed
    handshake is raised as :class:`IngestError` by the next :meth:`send` or wait (module
    docstring)."""

    def __init__(self, endpoint: str, security: Security | None = None,
                 server_key: str | None = None):
        self.endpoint = endpoint
        self.security = security if security is not None and security.enabled else None
        self.server_key = (None if self.security is None
                           else server_key or self.security.server_public)
        #: why the handshake failed (then every later call raises it), else None
        self.failure: str | None = None
        self.sock = _context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        # No reconnection: clients are cached in reused worker processes, and a socket that
        # reconnects forever to a host that is gone greets (in ZMTP) whatever binds that port
        # next — e.g. a Spark driver's Python-worker callback port, failing its handshake. A
        # lost host instead fails the request (IngestError after the timeout); the task's
        # retry drops this client (drop_client) and connects afresh.
        self.sock.setsockopt(zmq.RECONNECT_IVL, -1)
        try:
            apply_client(self.sock, self.security, self.server_key)  # no-op for plain TCP
            # the handshake's outcome (no reconnection: a failure is final)
            self._monitor = self.sock.get_monitor_socket(_HANDSHAKE_FAILED)
        except BaseException:
            self.sock.close(0)
            raise
        self._poller = zmq.Poller()
        self._poller.register(self._monitor, zmq.POLLIN)
        self.sock.connect(endpoint)

    def _handshake_failed(self, event: int, value: int) -> str:
        """The message for the monitor's ``event`` (``value``: its detail)."""
        ep = self.endpoint
        if self.security is None:  # the host closes first, or says the mechanisms differ
            return (f"the handshake with ingest endpoint {ep} failed (monitor event {event}, "
                    f"{value}): the host serves CURVE and this client has no key: give the sink "
                    f"a client key, .option(\"clientKey\", \"/path/NAME.key_secret\") "
                    f"(docs/security.md)")
        who = f"this client's key {self.security.client_public}"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"ingest endpoint {ep} refused {who} (ZAP status {value}): it is not in the "
                    f"SparkPublisherHost's allow directory; add its .key certificate there "
                    f"(docs/security.md)")
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
                value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return (f"ingest endpoint {ep} does not serve CURVE (plain TCP) but this client "
                    f"connects with a key")
        return (f"the CURVE handshake with ingest endpoint {ep} failed: its public key is not "
                f"{self.server_key} (the key the catalog records for the partition, or the "
                f"sink's serverKey option), or it closed the connection (monitor event "
                f"{event}, {value})")

    def _check(self) -> None:
        """Raise :class:`IngestError` if the handshake failed (read from the monitor)."""
        while self.failure is None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            assert isinstance(event, dict)
            if event["event"] & _HANDSHAKE_FAILED:
                self.failure = self._handshake_failed(int(event["event"]), int(event["value"]))
        raise IngestError(self.failure)

    def _wait(self, flag: int, deadline: float) -> bool:
        """Wait until the socket is ready for ``flag`` (``zmq.POLLIN``/``POLLOUT``) before
        ``deadline`` (``time.monotonic()``); False on timeout. Raises :class:`IngestError` as
        soon as the handshake fails."""
        if self.failure is not None:
            raise IngestError(self.failure)
        self._poller.register(self.sock, flag)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready = dict(self._poller.poll(int(remaining * 1000) + 1))
                if self._monitor in ready:
                    self._check()
                if ready.get(self.sock, 0) & flag:
                    return True
        finally:
            self._poller.unregister(self.sock)

    def send(self, msg: Request, timeout: float) -> None:
        """Send ``msg`` without waiting for a reply; raises :class:`IngestError` if the socket
        accepts nothing for ``timeout`` seconds or the handshake failed."""
        if not self._wait(zmq.POLLOUT, time.monotonic() + timeout):
            raise IngestError(f"ingest endpoint {self.endpoint} accepts no data "
                              f"(send blocked for {timeout:.0f} s)")
        try:  # never a blocking send: a refused handshake drops the pipe (a DEALER then blocks
            self.sock.send_multipart(encode_request(msg), zmq.NOBLOCK, copy=False)  # forever)
        except zmq.Again:
            self._check()  # a failed handshake says why
            raise IngestError(f"ingest endpoint {self.endpoint} accepts no data "
                              f"(no connection)") from None

    def request(self, msg: _Answered, timeout: float) -> Reply:
        """Send ``msg`` (FLUSH, COMMIT or ABORT) under a fresh request id and wait for its
        acknowledgement (raises as :meth:`await_reply`)."""
        msg = dataclasses.replace(msg, req=_new_req())
        self.send(msg, timeout)
        return self.await_reply(msg, time.monotonic() + timeout, timeout)

    def await_reply(self, msg: Request, deadline: float, timeout: float) -> Reply:
        """Wait (until ``deadline``, a ``time.monotonic()`` value) for the acknowledgement of
        ``msg``; late replies to earlier requests are skipped. Raises :class:`IngestError` on
        timeout, an ``ERR`` reply or a garbled one."""
        what = f"{msg.KIND.decode()} (epoch {msg.epoch})"
        while True:
            if not self._wait(zmq.POLLIN, deadline):
                raise IngestError(
                    f"no acknowledgement of {what} from ingest endpoint {self.endpoint} within "
                    f"{timeout:.0f} s: is the SparkPublisherHost running?")
            frames = self.sock.recv_multipart()
            try:
                reply = decode_reply(frames, msg.KIND)
            except IngestMessageError as e:
                if e.req is not None and e.req != msg.req:
                    continue  # a late reply of another shape, to an earlier request
                raise IngestError(f"malformed reply from {self.endpoint}: {frames!r}") from None
            if isinstance(reply, Refusal) and reply.req in (msg.req, None):
                error = IngestNotAuthorized if reply.not_authorised else IngestError
                raise error(f"ingest endpoint {self.endpoint} refused {what}: {reply.error}")
            if reply.req == msg.req:
                return reply
            # a late reply to an earlier request that timed out: ignore it

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
        self.sock.close(0)


def client(endpoint: str, security: Security | None = None,
           server_key: str | None = None) -> IngestClient:
    """This process's client for ``endpoint`` (with this ``security`` and ``server_key``, see
    :class:`IngestClient`; created on first use)."""
    sec = security if security is not None and security.enabled else None
    key = (endpoint, None if sec is None else sec.client_public,
           None if sec is None else server_key or sec.server_public)
    with _client_lock:
        _context()
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = IngestClient(endpoint, sec, server_key)
        return c


def drop_client(endpoint: str) -> None:
    """Close and forget the clients for ``endpoint`` (a queue may hold a half-sent attempt or a
    request that timed out: the next use starts clean)."""
    with _client_lock:
        gone = [_clients.pop(k) for k in [k for k in _clients if k[0] == endpoint]]
    for c in gone:
        c.close()


class IngestTarget(NamedTuple):
    """One topic partition's ingest endpoint as the catalog records it: ``server_key`` is the
    host's CURVE public key (Z85), ``None`` for a plain host."""

    partition: int
    endpoint: str
    server_key: str | None


def client_security(client_key: str | None, server_key: str | None = None) -> Security | None:
    """The CURVE client :class:`~epochstream.security.Security` of the sink's options:
    ``client_key`` (``clientKey``: a ``.key_secret`` path, or a name looked up in this
    process's ``$EPOCHSTREAM_KEYS``) and ``server_key`` (``serverKey``: a pinned host key, Z85
    text, a ``.key`` path or a name; ``None``: the catalog's). ``None`` without ``client_key``.
    Read once per process. Raises :class:`IngestError` naming the option for a missing or bad
    key."""
    if not client_key:
        if server_key:
            raise IngestError("the sink's serverKey option needs a clientKey too (the task's "
                              "own key pair, docs/security.md)")
        return None
    cache = (client_key, server_key or None)
    with _client_lock:
        _context()
        sec = _securities.get(cache)
    if sec is None:
        try:
            sec = Security.curve(client_secret=client_key, server_public=server_key or None)
        except ValueError as e:
            raise IngestError(f"the sink's clientKey/serverKey options: {e}") from None
        with _client_lock:
            _securities[cache] = sec
    return sec


def client_for(target: IngestTarget, topic: str, client_key: str | None = None,
               server_key: str | None = None) -> IngestClient:
    """This process's client for ``target``, secured as the catalog says the host is: plain
    when it records no key, else a CURVE client with :func:`client_security`'s key pair towards
    the recorded key (or the pinned ``server_key``). Raises :class:`IngestError` when the
    options and the host do not match (a secured host and no ``client_key``, a plain host and
    a ``client_key``) or a key cannot be read."""
    sec = client_security(client_key, server_key)
    where = f"topic {topic!r} partition {target.partition} (ingest endpoint {target.endpoint})"
    if target.server_key is None:
        if sec is not None:
            raise IngestError(f"{where} is served in plain TCP (the catalog records no CURVE key "
                              f"for it) but the sink has a clientKey: refusing to send in clear "
                              f"text. Start the SparkPublisherHost with security=Security.curve("
                              f"server_secret=...), or drop the clientKey option")
        return client(target.endpoint)
    if sec is None:
        raise IngestError(f"{where} is served over CURVE (the catalog records the host's key "
                          f"{target.server_key}) and the sink has no client key: give it "
                          f".option(\"clientKey\", \"/path/NAME.key_secret\") (or a name in "
                          f"$EPOCHSTREAM_KEYS), a key the host's allow directory holds and that "
                          f"has a publish grant for the topic (docs/security.md)")
    return client(target.endpoint, sec, sec.server_public or target.server_key)


def _catalog(path: str | None) -> Catalog:
    _context()
    key = path or ""
    cat = _catalogs.get(key)
    if cat is None:
        cat = _catalogs[key] = Catalog(path or None)
    return cat


def ingest_endpoints(catalog: str | None, topic: str) -> list[str]:
    """The ingest endpoint of every partition of ``topic``, by partition index, from the catalog
    at path ``catalog`` (``None``: the default). Raises :class:`IngestError` unless every
    partition is registered live with an ingest endpoint."""
    return [t.endpoint for t in ingest_targets(catalog, topic)]


def ingest_targets(catalog: str | None, topic: str) -> list[IngestTarget]:
    """:func:`ingest_endpoints` with each partition's recorded CURVE key
    (:class:`IngestTarget`). One catalog lookup."""
    info = _catalog(catalog).lookup(topic)
    parts = sorted(info.partition_info, key=lambda p: p.index)
    if len(parts) != info.partitions:
        raise IngestError(f"topic {topic!r}: only {len(parts)} of {info.partitions} partitions "
                          f"are registered in the catalog")
    missing = [p.index for p in parts if not p.ingest or p.state != "live"]
    if missing:
        raise IngestError(f"topic {topic!r}: partition(s) {missing} have no live ingest endpoint; "
                          f"start a SparkPublisherHost for the topic before the query")
    return [IngestTarget(p.index, cast(str, p.ingest), p.server_key) for p in parts]


def require_host(catalog: str | None, topic: str, *, check_keys: bool = False,
                 client_key: str | None = None, server_key: str | None = None) -> list[str]:
    """:func:`ingest_endpoints`, for the start of a query: raises :class:`IngestError` with a
    message that says to start a :class:`~epochstream.spark.SparkPublisherHost` when the topic is
    unknown, a partition is not live (closed, aborted, dead) or the catalog cannot be read. With
    ``check_keys`` (the sink's options ``client_key``/``server_key``), also the error of
    :func:`client_for` when the host is secured and ``client_key`` is missing (or the reverse)
    or a key cannot be read here. One catalog lookup; connects to nothing."""
    try:
        targets = ingest_targets(catalog, topic)
    except EpochstreamError as e:
        try:
            where = str(_catalog(catalog).path)
        except Exception:  # noqa: BLE001 - only for the message
            where = str(catalog) if catalog else "the default catalog"
        if isinstance(e, CatalogUnavailable):  # not "no host": the catalog could not be asked
            raise IngestError(f"cannot read catalog {where} to find the SparkPublisherHost of "
                              f"topic {topic!r}: {e}") from None
        raise IngestError(
            f"no running SparkPublisherHost serves topic {topic!r} in catalog {where} ({e}). "
            f"Start one in the driver program before starting the query and keep it open while "
            f"the query runs: `with SparkPublisherHost({topic!r}, catalog=...) as host:` around "
            f"`.start()` and `.awaitTermination()`, with the same catalog as the sink's "
            f"\"catalog\" option") from None
    if not check_keys:
        return [t.endpoint for t in targets]
    sec = client_security(client_key, server_key)
    for t in targets:  # the same checks as client_for, without connecting
        if (t.server_key is None) != (sec is None):
            client_for(t, topic, client_key, server_key)  # raises the mismatch's message
    return [t.endpoint for t in targets]


def _attempts_by_partition(messages: Iterable, n: int) -> list[list[AttemptRef]]:
    """The attempts in ``messages`` (commit messages or ``None``), grouped by topic partition
    (Spark partition ``i`` feeds ``i % n``), in Spark partition order."""
    attempts: list[list[AttemptRef]] = [[] for _ in range(n)]
    for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition):
        attempts[m.partition % n].append(AttemptRef(m.run_id, int(m.task_attempt_id), int(m.rows)))
    return attempts


def send_commit(catalog: str | None, topic: str, epoch: int, messages: Iterable, *,
                query_id: str | None = None, timeout: float = DEFAULT_COMMIT_TIMEOUT,
                client_key: str | None = None, server_key: str | None = None,
                event: EventTimes | None = None) -> list[CommitAck]:
    """COMMIT ``epoch`` on every partition of ``topic`` naming the attempts in ``messages``
    (``EpochstreamCommitMessage`` or ``None``); all partitions commit in parallel, within
    ``timeout`` seconds. Returns the acknowledgements, one per topic partition. ``client_key``,
    ``server_key``: the sink's options for a secured host (:func:`client_for`); ``event``: the
    batch's epochs when its rows carry their own (every partition gets the same). Raises
    :class:`IngestError` (timeout, refusal, no endpoints, a failed handshake,
    :class:`IngestNotAuthorized`)."""
    targets = ingest_targets(catalog, topic)
    attempts = _attempts_by_partition(messages, len(targets))
    sent: list[tuple[IngestClient, Commit]] = []
    for t, named in zip(targets, attempts):  # send every COMMIT first, then collect
        c = client_for(t, topic, client_key, server_key)
        msg = Commit(_new_req(), int(epoch), tuple(named), query_id, event)
        try:
            c.send(msg, timeout)
        except IngestError:
            drop_client(t.endpoint)
            raise
        sent.append((c, msg))
    deadline = time.monotonic() + timeout
    replies = []
    for c, msg in sent:
        try:
            replies.append(cast(CommitAck, c.await_reply(msg, deadline, timeout)))
        except IngestError:
            drop_client(c.endpoint)
            raise
    return replies

