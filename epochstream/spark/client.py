"""The ingest client: a Spark worker process's connections to the hosts' ingest endpoints.

Executors' ``write()`` and the driver-side ``commit()``/``abort()`` run in Spark's Python worker
processes, which are forked and reused across tasks. This module keeps, per process, one zmq
context, one DEALER per ingest endpoint and one :class:`~epochstream.catalog.Catalog` per path
(all re-created after a fork), and implements request/reply over them with
:mod:`epochstream.spark.ingest` messages. :func:`send_commit` is the driver-side COMMIT of one
epoch on every partition of a topic.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Iterable
from typing import TypeVar, cast

import zmq

from ..catalog import Catalog
from ..errors import EpochstreamError
from .ingest import (Abort, AttemptRef, Commit, CommitAck, Flush, IngestError, IngestMessageError,
                     Refusal, Reply, Request, decode_reply, encode_request)

__all__ = ["DEFAULT_COMMIT_TIMEOUT", "IngestClient", "client", "drop_client", "ingest_endpoints",
           "require_host", "send_commit"]

DEFAULT_COMMIT_TIMEOUT = 120.0

_Answered = TypeVar("_Answered", Flush, Commit, Abort)

_ctx_pid: int | None = None
_ctx: zmq.Context | None = None
_clients: dict[str, IngestClient] = {}
_catalogs: dict[str, Catalog] = {}
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
    return _ctx


def _new_req() -> str:
    return f"{os.getpid()}-{next(_req_ids)}"


class IngestClient:
    """A DEALER connected to one ingest endpoint, cached per process (see :func:`client`).
    Timeouts are in seconds."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
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
        self.sock.connect(endpoint)

    def send(self, msg: Request, timeout: float) -> None:
        """Send ``msg`` without waiting for a reply; raises :class:`IngestError` if the socket
        accepts nothing for ``timeout`` seconds."""
        if not self.sock.poll(int(timeout * 1000), zmq.POLLOUT):
            raise IngestError(f"ingest endpoint {self.endpoint} accepts no data "
                              f"(send blocked for {timeout:.0f} s)")
        self.sock.send_multipart(encode_request(msg), copy=False)

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
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
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
                raise IngestError(f"ingest endpoint {self.endpoint} refused {what}: "
                                  f"{reply.error}")
            if reply.req == msg.req:
                return reply
            # a late reply to an earlier request that timed out: ignore it

    def close(self) -> None:
        self.sock.close(0)


def client(endpoint: str) -> IngestClient:
    """This process's client for ``endpoint`` (created on first use)."""
    with _client_lock:
        _context()
        c = _clients.get(endpoint)
        if c is None:
            c = _clients[endpoint] = IngestClient(endpoint)
        return c


def drop_client(endpoint: str) -> None:
    """Close and forget the client for ``endpoint`` (its queue may hold a half-sent attempt or a
    request that timed out: the next use starts clean)."""
    with _client_lock:
        c = _clients.pop(endpoint, None)
    if c is not None:
        c.close()


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
    info = _catalog(catalog).lookup(topic)
    parts = sorted(info.partition_info, key=lambda p: p.index)
    if len(parts) != info.partitions:
        raise IngestError(f"topic {topic!r}: only {len(parts)} of {info.partitions} partitions "
                          f"are registered in the catalog")
    missing = [p.index for p in parts if not p.ingest or p.state != "live"]
    if missing:
        raise IngestError(f"topic {topic!r}: partition(s) {missing} have no live ingest endpoint; "
                          f"start a SparkPublisherHost for the topic before the query")
    return [cast(str, p.ingest) for p in parts]


def require_host(catalog: str | None, topic: str) -> list[str]:
    """:func:`ingest_endpoints`, for the start of a query: raises :class:`IngestError` with a
    message that says to start a :class:`~epochstream.spark.SparkPublisherHost` when the topic is
    unknown, a partition is not live (closed, aborted, dead) or the catalog cannot be read. One
    catalog lookup."""
    try:
        return ingest_endpoints(catalog, topic)
    except EpochstreamError as e:
        try:
            where = str(_catalog(catalog).path)
        except Exception:  # noqa: BLE001 - only for the message
            where = str(catalog) if catalog else "the default catalog"
        raise IngestError(
            f"no running SparkPublisherHost serves topic {topic!r} in catalog {where} ({e}). "
            f"Start one in the driver program before starting the query and keep it open while "
            f"the query runs: `with SparkPublisherHost({topic!r}, catalog=...) as host:` around "
            f"`.start()` and `.awaitTermination()`, with the same catalog as the sink's "
            f"\"catalog\" option") from None


def _attempts_by_partition(messages: Iterable, n: int) -> list[list[AttemptRef]]:
    """The attempts in ``messages`` (commit messages or ``None``), grouped by topic partition
    (Spark partition ``i`` feeds ``i % n``), in Spark partition order."""
    attempts: list[list[AttemptRef]] = [[] for _ in range(n)]
    for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition):
        attempts[m.partition % n].append(AttemptRef(m.run_id, int(m.task_attempt_id), int(m.rows)))
    return attempts


def send_commit(catalog: str | None, topic: str, epoch: int, messages: Iterable, *,
                query_id: str | None = None,
                timeout: float = DEFAULT_COMMIT_TIMEOUT) -> list[CommitAck]:
    """COMMIT ``epoch`` on every partition of ``topic`` naming the attempts in ``messages``
    (``EpochstreamCommitMessage`` or ``None``); all partitions commit in parallel, within
    ``timeout`` seconds. Returns the acknowledgements, one per topic partition. Raises
    :class:`IngestError` (timeout, refusal, no endpoints)."""
    endpoints = ingest_endpoints(catalog, topic)
    attempts = _attempts_by_partition(messages, len(endpoints))
    sent: list[tuple[IngestClient, Commit]] = []
    for ep, named in zip(endpoints, attempts):  # send every COMMIT first, then collect
        c, msg = client(ep), Commit(_new_req(), int(epoch), tuple(named), query_id)
        try:
            c.send(msg, timeout)
        except IngestError:
            drop_client(ep)
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

