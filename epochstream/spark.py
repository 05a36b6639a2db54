"""Spark Structured Streaming → epochstream: one Spark micro-batch is one epoch.

Three parts:

- :class:`EpochstreamDataSource` — a Python Data Source named ``epochstream`` (PySpark >= 4).
  Register it with ``spark.dataSource.register(EpochstreamDataSource)`` (done by
  :func:`register`/:func:`start_query`) and write with
  ``df.writeStream.format("epochstream").option("topic", ...).option("catalog", ...)``.
  Options: ``topic`` (required), ``catalog`` (catalog path; default as :class:`Catalog`),
  ``ackTimeout`` (seconds a task waits for its flush acknowledgement, default 60),
  ``commitTimeout`` (seconds the driver-side commit waits per partition, default 120).
- :class:`SparkPublisherHost` — runs in the user's driver program: creates the topic (order
  ``total``, codec ``arrow``), and for each topic partition a :class:`~epochstream.transport.
  Publisher` plus an *ingest* ROUTER (served by one background thread per partition) whose
  endpoint is registered in the catalog next to the publisher's.
- :func:`start_query` — ``df.writeStream.format("epochstream")...start()`` with a checkpoint.

Exactly-once epochs (Spark's two-phase sink protocol)
-----------------------------------------------------
``write()`` runs once per task attempt on an executor. Spark partition ``i`` goes to topic
partition ``i % partitions``. Each Arrow ``RecordBatch`` is sent to that partition's ingest
socket as Arrow IPC stream bytes, tagged (run id, epoch = batch id, Spark partition, task attempt
id); the host *stages* it under (epoch, run id, task attempt id) without publishing. The task then
sends FLUSH and waits for the acknowledgement that every batch reached the host (ZeroMQ keeps
per-connection order), and only then returns its :class:`EpochstreamCommitMessage`.

``commit(messages, batchId)`` runs on the driver side (a separate Python worker). It sends, to
every topic partition, COMMIT(epoch, the attempts Spark kept for that partition — possibly none).
The host publishes exactly those attempts' staged batches (in Spark partition order), discards
every other attempt's staged data for the epoch (failed or speculative attempts), then advances
that partition's publisher to ``epoch + 1`` — which completes the epoch for subscribers. COMMIT
is idempotent: if the partition is already past ``epoch`` nothing is published again. COMMIT
carries each attempt's reported row count, and the host refuses (``ERR``) a COMMIT whose
attempts staged other counts (e.g. their rows were dropped by a late ABORT of a stopped run):
an epoch is never completed with rows missing; Spark's commit fails and the batch re-runs on
restart.
``abort()`` discards the epoch's staged data. Staged data of epochs at or below a committed
epoch is dropped, and the total staged bytes are bounded (``max_staged_bytes``).

Ingest wire format (DEALER → ROUTER, msgpack headers)
-----------------------------------------------------
``[b"DATA", [run, epoch, spark_partition, attempt, rows], ipc_bytes]`` (no reply unless
malformed), ``[b"FLUSH", {req, run, epoch, attempt, batches, rows}]``,
``[b"COMMIT", {req, epoch, attempts: [[run, attempt, rows], ...], query}]`` (``rows``: what the
task reported; optional — a COMMIT whose named attempts staged other row counts is refused),
``[b"ABORT", {req, epoch, attempts}]``. Replies: ``[b"OK" | b"ERR", {req, ...}]``. A malformed
message gets an ``ERR`` reply (``req`` is ``None`` when it could not be read) and a log line; the
serving loop keeps going.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from .errors import EpochstreamError

__all__ = ["EpochstreamDataSource", "EpochstreamStreamWriter", "EpochstreamCommitMessage",
           "SparkPublisherHost", "Pause", "IngestError", "register", "start_query",
           "local_session", "send_commit", "SOURCE_NAME"]

log = logging.getLogger("epochstream.spark")

SOURCE_NAME = "epochstream"
DEFAULT_ACK_TIMEOUT = 60.0
DEFAULT_COMMIT_TIMEOUT = 120.0
DEFAULT_MAX_STAGED_BYTES = 1 << 30


class IngestError(EpochstreamError):
    """The Spark ingest path failed: no acknowledgement in time, an ``ERR`` reply from the host,
    or a topic without ingest endpoints (no :class:`SparkPublisherHost` serving it)."""


# ============================================================================================
# client side (executors and the driver-side commit worker)

_ctx_pid: int | None = None
_ctx: zmq.Context | None = None
_clients: dict[str, "_IngestClient"] = {}
_catalogs: dict[str, Any] = {}
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


class _IngestClient:
    """A DEALER connected to one ingest endpoint, cached per process (workers are reused)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.sock = _context().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.connect(endpoint)

    def send_data(self, frames: list, timeout: float) -> None:
        if not self.sock.poll(int(timeout * 1000), zmq.POLLOUT):
            raise IngestError(f"ingest endpoint {self.endpoint} accepts no data "
                              f"(send blocked for {timeout:.0f} s)")
        self.sock.send_multipart(frames, copy=False)

    def request(self, kind: bytes, header: dict, timeout: float) -> dict:
        req = f"{os.getpid()}-{next(_req_ids)}"
        header = dict(header, req=req)
        self.send_data([kind, msgpack.packb(header)], timeout)
        return self.await_reply(req, kind.decode(), header.get("epoch"),
                                time.monotonic() + timeout, timeout)

    def await_reply(self, req: str, kind: str, epoch, deadline: float, timeout: float) -> dict:
        """Wait (until ``deadline``, a ``time.monotonic()`` value) for the reply to ``req``;
        late replies to earlier requests are skipped. Raises :class:`IngestError` on timeout, an
        ``ERR`` reply or a garbled one."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
                raise IngestError(
                    f"no acknowledgement of {kind} (epoch {epoch}) from ingest endpoint "
                    f"{self.endpoint} within {timeout:.0f} s: is the SparkPublisherHost running?")
            frames = self.sock.recv_multipart()
            try:
                status, body = frames[0], msgpack.unpackb(frames[1])
            except Exception:  # noqa: BLE001 - a garbled reply is reported, not fatal
                raise IngestError(f"malformed reply from {self.endpoint}: {frames!r}") from None
            if status == b"ERR" and body.get("req") in (req, None):
                raise IngestError(f"ingest endpoint {self.endpoint} refused {kind} (epoch {epoch}): "
                                  f"{body.get('error')}")
            if body.get("req") == req:
                return body
            # a late reply to an earlier request that timed out: ignore it

    def close(self) -> None:
        self.sock.close(0)


def _client(endpoint: str) -> _IngestClient:
    with _client_lock:
        _context()
        c = _clients.get(endpoint)
        if c is None:
            c = _clients[endpoint] = _IngestClient(endpoint)
        return c


def _drop_client(endpoint: str) -> None:
    with _client_lock:
        c = _clients.pop(endpoint, None)
    if c is not None:
        c.close()


def _catalog(path: str | None):
    from .catalog import Catalog

    _context()
    key = path or ""
    cat = _catalogs.get(key)
    if cat is None:
        cat = _catalogs[key] = Catalog(path or None)
    return cat


def _ingest_endpoints(catalog: str | None, topic: str) -> list[str]:
    info = _catalog(catalog).lookup(topic)
    parts = sorted(info.partition_info, key=lambda p: p.index)
    if len(parts) != info.partitions:
        raise IngestError(f"topic {topic!r}: only {len(parts)} of {info.partitions} partitions "
                          f"are registered in the catalog")
    missing = [p.index for p in parts if not p.ingest or p.state != "live"]
    if missing:
        raise IngestError(f"topic {topic!r}: partition(s) {missing} have no live ingest endpoint; "
                          f"start a SparkPublisherHost for the topic before the query")
    return [p.ingest for p in parts]


@dataclass
class EpochstreamCommitMessage(WriterCommitMessage):
    """What one successful task attempt reports to ``commit``: enough to name its staged data
    (``run_id``, ``task_attempt_id``) without a TaskContext on the driver."""

    query_id: str | None
    run_id: str
    epoch: int
    partition: int            # Spark partition id
    topic_partition: int
    task_attempt_id: int
    attempt_number: int
    rows: int
    batches: int


def _ipc_bytes(batch) -> Any:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue()


def send_commit(catalog: str | None, topic: str, epoch: int, messages, *,
                query_id: str | None = None, timeout: float = DEFAULT_COMMIT_TIMEOUT) -> list[dict]:
    """COMMIT ``epoch`` on every partition of ``topic`` naming the attempts in ``messages``
    (``EpochstreamCommitMessage`` or ``None``); wait for every acknowledgement. Returns the
    replies, one per topic partition (``published_batches``, ``rows``, ``duplicate``)."""
    endpoints = _ingest_endpoints(catalog, topic)
    n = len(endpoints)
    attempts: list[list] = [[] for _ in range(n)]
    for m in sorted((m for m in messages if m is not None), key=lambda m: m.partition):
        attempts[m.partition % n].append([m.run_id, int(m.task_attempt_id), int(m.rows)])
    # send all COMMITs first, then collect: the partitions commit in parallel
    clients, reqs = [], []
    for p, ep in enumerate(endpoints):
        c = _client(ep)
        req = f"{os.getpid()}-{next(_req_ids)}"
        header = {"req": req, "epoch": int(epoch), "attempts": attempts[p], "query": query_id}
        try:
            c.send_data([b"COMMIT", msgpack.packb(header)], timeout)
        except IngestError:
            _drop_client(ep)
            raise
        clients.append(c)
        reqs.append(req)
    replies = []
    deadline = time.monotonic() + timeout
    for p, (c, req) in enumerate(zip(clients, reqs)):
        try:
            replies.append(c.await_reply(req, "COMMIT", epoch, deadline, timeout))
        except IngestError:
            _drop_client(c.endpoint)
            raise
    return replies


class EpochstreamStreamWriter(DataSourceStreamArrowWriter):
    """The streaming writer (see the module docstring). Holds only the options: Spark builds a
    fresh writer for every batch and for every commit."""

    def __init__(self, options: dict, schema=None):
        self.topic = options.get("topic")
        if not self.topic:
            raise IngestError('the epochstream sink needs a topic: .option("topic", "<name>")')
        self.catalog = options.get("catalog") or None
        self.ack_timeout = float(options.get("ackTimeout", DEFAULT_ACK_TIMEOUT))
        self.commit_timeout = float(options.get("commitTimeout", DEFAULT_COMMIT_TIMEOUT))

    def write(self, iterator: Iterator) -> EpochstreamCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        epoch = int(ctx.getLocalProperty("streaming.sql.batchId"))
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        run_id = ctx.getLocalProperty("spark.jobGroup.id") or query_id or "run"
        part, attempt = ctx.partitionId(), ctx.taskAttemptId()
        endpoints = _ingest_endpoints(self.catalog, self.topic)
        tp = part % len(endpoints)
        ep = endpoints[tp]
        client = _client(ep)
        rows = batches = 0
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                header = msgpack.packb([run_id, epoch, part, attempt, batch.num_rows])
                client.send_data([b"DATA", header, _ipc_bytes(batch)], self.ack_timeout)
                rows += batch.num_rows
                batches += 1
            if batches:
                reply = client.request(b"FLUSH", {"run": run_id, "epoch": epoch,
                                                  "attempt": attempt, "batches": batches,
                                                  "rows": rows}, self.ack_timeout)
                if reply.get("batches") != batches and not reply.get("stale"):
                    raise IngestError(f"ingest endpoint {ep} staged {reply.get('batches')} of "
                                      f"{batches} batches of epoch {epoch}")
        except BaseException:
            _drop_client(ep)  # its queue may hold a half-sent attempt: start clean next time
            raise
        return EpochstreamCommitMessage(
            query_id=query_id, run_id=run_id, epoch=epoch, partition=part, topic_partition=tp,
            task_attempt_id=attempt, attempt_number=ctx.attemptNumber(), rows=rows,
            batches=batches)

    def commit(self, messages, batchId) -> None:
        query = next((m.query_id for m in messages if m is not None), None)
        send_commit(self.catalog, self.topic, int(batchId), messages, query_id=query,
                    timeout=self.commit_timeout)

    def abort(self, messages, batchId) -> None:
        try:
            endpoints = _ingest_endpoints(self.catalog, self.topic)
        except Exception as e:  # noqa: BLE001 - abort is best effort
            log.warning("abort of epoch %s: cannot look up topic %r: %s", batchId, self.topic, e)
            return
        for ep in endpoints:
            try:
                _client(ep).request(b"ABORT", {"epoch": int(batchId)}, min(10.0, self.ack_timeout))
            except Exception as e:  # noqa: BLE001
                _drop_client(ep)
                log.warning("abort of epoch %s at %s failed: %s", batchId, ep, e)


class EpochstreamDataSource(DataSource):
    """Python Data Source ``epochstream`` (streaming sink only)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def streamWriter(self, schema, overwrite: bool) -> EpochstreamStreamWriter:
        return EpochstreamStreamWriter(self.options, schema)


# ============================================================================================
# host side (the user's driver program)


class Pause:
    """A pause point: the serving thread of ``partition`` stops at ``stage`` of COMMIT(``epoch``)
    until :meth:`resume`. Stages: ``"data"`` — the epoch's data has been published, the
    partition has not advanced yet (the epoch is *active*, in flight); ``"advanced"`` — the
    partition has advanced past the epoch, the COMMIT is not yet acknowledged (so Spark cannot
    start the next batch). ``reached`` is set when the thread stops there."""

    def __init__(self, partition: int, epoch: int, stage: str):
        if stage not in ("data", "advanced"):
            raise ValueError(f"stage must be 'data' or 'advanced', got {stage!r}")
        self.partition, self.epoch, self.stage = partition, epoch, stage
        self.reached = threading.Event()
        self._resume = threading.Event()

    def resume(self) -> None:
        self._resume.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the pause point is reached; returns whether it was."""
        return self.reached.wait(timeout)


@dataclass
class PartitionStats:
    epochs: int = 0           # epochs committed (advanced past)
    rows: int = 0             # rows published
    batches: int = 0          # data messages published
    duplicates: int = 0       # repeated COMMITs of an already committed epoch
    discarded_batches: int = 0  # staged batches of attempts that were not committed
    aborts: int = 0           # ABORT requests received (Spark's abort() of a batch)
    staged_batches: int = 0   # data messages received (staged), published or not
    errors: int = 0           # malformed / refused ingest messages
    next_epoch: int = 0       # the partition's frontier: every epoch below it is complete
    data_upper: int = -1      # largest epoch with published data


class _PartitionServer:
    """Serves one topic partition: its ingest ROUTER and its Publisher, on one thread."""

    def __init__(self, host: "SparkPublisherHost", index: int):
        self.host = host
        self.index = index
        self.stats = PartitionStats()
        # staged[epoch][(run, attempt)] = [payload, ...]
        self.staged: dict[int, dict[tuple, list]] = {}
        self.staged_bytes = 0
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.endpoint: str | None = None
        self.ingest: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"epochstream-ingest-{index}",
                                       daemon=True)

    # ---- lifecycle

    def _run(self) -> None:
        from .order import TOTAL
        from .transport import Publisher

        h = self.host
        try:
            self.sock = h._zctx.socket(zmq.ROUTER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.RCVHWM, 100_000)
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
            self.sock.bind(f"tcp://{h.bind_host}:*")
            self.ingest = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.pub = Publisher(h.topic, self.index, order=TOTAL, codec="arrow",
                                 endpoint=f"tcp://{h.bind_host}:*", catalog=h.catalog,
                                 partitions=h.partitions, schema=h.schema, ingest=self.ingest,
                                 **h.publisher_kwargs)
            self.endpoint = self.pub.endpoint
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        try:
            while not h._stop.is_set():
                if self.sock.poll(50, zmq.POLLIN):
                    frames = self.sock.recv_multipart(copy=False)
                    self._handle(frames)
        except BaseException as e:  # noqa: BLE001
            self.error = e
            log.exception("partition %d ingest loop died", self.index)
        finally:
            reason = h._abort_reason or (repr(self.error) if self.error is not None else None)
            try:
                if reason is None:
                    self.pub.close()
                else:  # open epochs must never complete: subscribers get PublisherAborted
                    self.pub.abort(reason)
            except Exception:  # noqa: BLE001
                log.exception("ending the publisher of partition %d failed", self.index)
            self.sock.close(0)

    # ---- messages

    def _reply(self, ident, status: bytes, body: dict) -> None:
        try:
            self.sock.send_multipart([ident, status, msgpack.packb(body)])
        except zmq.ZMQError as e:
            log.warning("partition %d: cannot reply to ingest peer: %s", self.index, e)

    def _refuse(self, ident, req, error: str) -> None:
        self.stats.errors += 1
        log.warning("partition %d: refused ingest message: %s", self.index, error)
        self._reply(ident, b"ERR", {"req": req, "error": error})

    def _handle(self, frames) -> None:
        ident = frames[0].bytes
        if len(frames) < 3:
            return self._refuse(ident, None, f"expected [kind, header, ...], got {len(frames) - 1} "
                                             f"frame(s)")
        kind = frames[1].bytes
        try:
            header = msgpack.unpackb(frames[2].bytes)
        except Exception as e:  # noqa: BLE001
            return self._refuse(ident, None, f"{kind[:16]!r}: header is not msgpack ({e})")
        req = header.get("req") if isinstance(header, dict) else None
        try:
            if kind == b"DATA":
                if len(frames) != 4:
                    raise ValueError(f"DATA needs [header, payload], got {len(frames) - 2} frames")
                self._data(header, frames[3])
            elif kind == b"FLUSH":
                self._reply(ident, b"OK", self._flush(header))
            elif kind == b"COMMIT":
                self._reply(ident, b"OK", self._commit(header))
            elif kind == b"ABORT":
                self._reply(ident, b"OK", self._abort(header))
            else:
                raise ValueError(f"unknown message kind {kind[:16]!r}")
        except (ValueError, TypeError, KeyError, IndexError, EpochstreamError) as e:
            self._refuse(ident, req, f"{kind[:16].decode(errors='replace')}: {e}")

    def _data(self, header, payload) -> None:
        if not (isinstance(header, list) and len(header) == 5):
            raise ValueError(f"DATA header must be [run, epoch, partition, attempt, rows], "
                             f"got {header!r}")
        run, epoch, _part, attempt, rows = header
        epoch, attempt, rows = _int(epoch, "epoch"), _int(attempt, "attempt"), _int(rows, "rows")
        if epoch < self.stats.next_epoch:
            return  # a straggler of a committed epoch: never published
        nbytes = len(payload)
        if self.staged_bytes + nbytes > self.host.max_staged_bytes:
            self._gc(self.stats.next_epoch)
            if self.staged_bytes + nbytes > self.host.max_staged_bytes:
                raise ValueError(f"staging full ({self.staged_bytes} bytes): epoch {epoch} "
                                 f"not committed in time")
        slot = self.staged.setdefault(epoch, {}).setdefault((str(run), attempt), [0, []])
        slot[0] += rows
        slot[1].append(payload)
        self.staged_bytes += nbytes
        self.stats.staged_batches += 1

    def _flush(self, header) -> dict:
        epoch, attempt = _int(header["epoch"], "epoch"), _int(header["attempt"], "attempt")
        run = str(header["run"])
        if epoch < self.stats.next_epoch:
            return {"req": header.get("req"), "stale": True, "batches": 0, "rows": 0}
        slot = self.staged.get(epoch, {}).get((run, attempt))
        batches, rows = (len(slot[1]), slot[0]) if slot else (0, 0)
        if batches != header.get("batches") or rows != header.get("rows"):
            raise ValueError(f"epoch {epoch} attempt {attempt}: staged {batches} batches / "
                             f"{rows} rows, the task sent {header.get('batches')} / "
                             f"{header.get('rows')}")
        return {"req": header.get("req"), "batches": batches, "rows": rows}

    def _commit(self, header) -> dict:
        epoch = _int(header["epoch"], "epoch")
        names, expected = [], {}
        for entry in header.get("attempts") or ():
            if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
                raise ValueError(f"COMMIT attempts must be [run, attempt(, rows)], got {entry!r}")
            name = (str(entry[0]), _int(entry[1], "attempt"))
            names.append(name)
            if len(entry) == 3:
                expected[name] = _int(entry[2], "rows")
        st = self.stats
        if epoch < st.next_epoch:  # already committed: idempotent
            st.duplicates += 1
            self._gc(st.next_epoch)
            return {"req": header.get("req"), "duplicate": True, "published_batches": 0,
                    "rows": 0, "next_epoch": st.next_epoch}
        # Never complete an epoch with rows missing: every named attempt must have staged what
        # its task reported (its staged rows may be gone after a late ABORT of the epoch, e.g.
        # from a stopped run). Refusing fails Spark's commit; the batch re-runs on restart.
        have = self.staged.get(epoch, {})
        short = [(n, (have[n][0] if n in have else 0), rows) for n, rows in expected.items()
                 if (have[n][0] if n in have else 0) != rows]
        if short:
            raise ValueError(f"epoch {epoch}: staged rows differ from what the tasks reported "
                             f"(attempt, staged, reported): {short}; epoch not committed")
        epoch_staged = self.staged.pop(epoch, {})
        missing = [n for n in names if n not in epoch_staged]
        # an attempt that sent no rows stages nothing: only complain about none here
        rows = batches = 0
        for name in names:
            slot = epoch_staged.pop(name, None)
            if slot is None:
                continue
            for payload in slot[1]:
                self.pub.send_encoded(epoch, payload)
                self.staged_bytes -= len(payload)
                batches += 1
            rows += slot[0]
        for slot in epoch_staged.values():  # failed / superseded attempts
            st.discarded_batches += len(slot[1])
            self.staged_bytes -= sum(len(p) for p in slot[1])
        if batches:
            st.data_upper = max(st.data_upper, epoch)
        self._pause_point(epoch, "data")
        self.pub.advance_to(epoch + 1)
        st.next_epoch = epoch + 1
        st.epochs += 1
        st.rows += rows
        st.batches += batches
        self._gc(st.next_epoch)
        self._pause_point(epoch, "advanced")
        cb = self.host.on_published
        if cb is not None:
            try:
                cb(self.index, epoch, rows)
            except Exception:  # noqa: BLE001 - a callback must not kill the loop
                log.exception("on_published callback failed")
        return {"req": header.get("req"), "duplicate": False, "published_batches": batches,
                "rows": rows, "next_epoch": st.next_epoch, "empty_attempts": len(missing)}

    def _abort(self, header) -> dict:
        epoch = _int(header["epoch"], "epoch")
        self.stats.aborts += 1
        dropped = self.staged.pop(epoch, {})
        for slot in dropped.values():
            self.stats.discarded_batches += len(slot[1])
            self.staged_bytes -= sum(len(p) for p in slot[1])
        return {"req": header.get("req"), "discarded": sum(len(s[1]) for s in dropped.values())}

    def _gc(self, next_epoch: int) -> None:
        for e in [e for e in self.staged if e < next_epoch]:
            for slot in self.staged.pop(e).values():
                self.stats.discarded_batches += len(slot[1])
                self.staged_bytes -= sum(len(p) for p in slot[1])

    def _pause_point(self, epoch: int, stage: str) -> None:
        for p in list(self.host._pauses):
            if p.partition == self.index and p.epoch == epoch and p.stage == stage:
                # the publisher's loop must have handled our calls before a subscriber's HELLO
                # is taken at this point: its snapshot then reflects exactly this state
                self.pub.flush(10.0)
                p.reached.set()
                while not p._resume.wait(0.05):
                    if self.host._stop.is_set():
                        return
                self.host._pauses.remove(p)


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be an int, got {v!r}")
    return v


class SparkPublisherHost:
    """Hosts the publishers of a Spark-fed topic in the driver program (context manager).

    - ``topic``; ``partitions``: topic partitions (Spark partition ``i`` feeds ``i % partitions``);
    - ``catalog``: a :class:`~epochstream.catalog.Catalog`, a path, or ``None`` (the default
      catalog); :attr:`catalog_path` is what to pass to the query's ``catalog`` option;
    - ``host``: interface the publisher and ingest sockets bind to (ports are chosen freely);
    - ``schema``: schema text stored in the catalog (e.g. a Spark DDL string);
    - ``on_published(partition, epoch, rows)``: called on a serving thread after a partition
      completed an epoch (keep it quick);
    - ``publisher_kwargs``: extra keyword arguments for each ``Publisher``.

    :meth:`pause` installs a pause point (see :class:`Pause`) so that a subscriber can attach at
    a precise moment; :meth:`wait_epoch` waits until every partition completed an epoch."""

    def __init__(self, topic: str, *, partitions: int = 2, catalog=None, host: str = "127.0.0.1",
                 schema: str | None = None,
                 on_published: Callable[[int, int, int], None] | None = None,
                 max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES,
                 publisher_kwargs: dict | None = None):
        from .catalog import Catalog

        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.topic = topic
        self.partitions = partitions
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.catalog_path = str(self.catalog.path)
        self.bind_host = host
        self.schema = schema
        self.on_published = on_published
        self.max_staged_bytes = max_staged_bytes
        self.publisher_kwargs = dict(publisher_kwargs or {})
        self._zctx = zmq.Context()
        self._stop = threading.Event()
        self._pauses: list[Pause] = []
        self._servers = [_PartitionServer(self, i) for i in range(partitions)]
        self._started = self._closed = False
        self._abort_reason: str | None = None

    def start(self) -> "SparkPublisherHost":
        if self._started:
            return self
        self._started = True
        self.catalog.create_topic(self.topic, order="total", codec="arrow",
                                  partitions=self.partitions, schema=self.schema)
        for s in self._servers:
            s.thread.start()
        for s in self._servers:
            s.ready.wait(30)
            if s.error is not None or not s.ready.is_set():
                self.close()
                raise IngestError(f"partition {s.index} of topic {self.topic!r} failed to start: "
                                  f"{s.error!r}") from s.error
        return self

    def __enter__(self) -> "SparkPublisherHost":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        """Normal exit: :meth:`close`; an exception (``KeyboardInterrupt`` too): :meth:`abort`."""
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")

    def abort(self, reason: str = "aborted") -> None:
        """Stop serving and abort every publisher (see
        :meth:`~epochstream.transport.Publisher.abort`): epochs not completed yet never
        complete, subscribers raise :class:`~epochstream.errors.PublisherAborted`, the catalog
        marks the partitions ``aborted``. Idempotent; after :meth:`close` it does nothing."""
        if not self._closed:
            self._abort_reason = str(reason)
        self.close()

    def close(self) -> None:
        """Stop serving, close every publisher (every epoch published so far completes and
        subscribers see the stream end). A partition whose ingest loop failed is aborted
        instead."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for p in self._pauses:
            p.resume()
        for s in self._servers:
            if s.thread.is_alive():
                s.thread.join(30)
        self._zctx.term()

    # ---- introspection

    @property
    def endpoints(self) -> list[str | None]:
        return [s.endpoint for s in self._servers]

    @property
    def ingest_endpoints(self) -> list[str | None]:
        return [s.ingest for s in self._servers]

    def stats(self, partition: int | None = None):
        """:class:`PartitionStats` of one partition, or a list for all."""
        if partition is not None:
            return dataclasses.replace(self._servers[partition].stats)
        return [dataclasses.replace(s.stats) for s in self._servers]

    def next_epoch(self) -> int:
        """The smallest partition frontier: every epoch below it is complete everywhere."""
        return min(s.stats.next_epoch for s in self._servers)

    def data_upper(self) -> int:
        """The largest epoch any partition has published data of (``-1``: none)."""
        return max(s.stats.data_upper for s in self._servers)

    def staged_bytes(self, partition: int | None = None) -> int:
        """Bytes staged (received from tasks, neither published nor discarded yet) on one
        partition, or summed over all: what a batch in flight, or the last batch of a killed
        driver, holds in this process (bounded by ``max_staged_bytes`` per partition)."""
        if partition is not None:
            return self._servers[partition].staged_bytes
        return sum(s.staged_bytes for s in self._servers)

    def errors(self) -> list[BaseException]:
        return [s.error for s in self._servers if s.error is not None]

    def pause(self, partition: int, epoch: int, stage: str = "data") -> Pause:
        """Install a pause point (see :class:`Pause`); resume it with ``Pause.resume()``."""
        p = Pause(partition, epoch, stage)
        self._pauses.append(p)
        return p

    def wait_epoch(self, epoch: int, timeout: float | None = None) -> bool:
        """Wait until every partition has completed ``epoch``; returns whether it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.next_epoch() <= epoch:
            if self._stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.01)
        return True


# ============================================================================================
# Spark helpers


def local_session(app_name: str = "epochstream", master: str = "local[2]", conf: dict | None = None):
    """A local SparkSession tuned for small, fast micro-batches (workers run this interpreter)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        "spark.sql.streaming.stopTimeout": "10s",
        "spark.python.worker.reuse": "true",
    }
    settings.update(conf or {})
    b = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def register(spark) -> None:
    """Register the ``epochstream`` data source with ``spark`` (idempotent)."""
    spark.dataSource.register(EpochstreamDataSource)


def start_query(spark, df, topic: str, *, checkpoint: str | os.PathLike,
                catalog: str | os.PathLike | Any = None, trigger: dict | None = None,
                query_name: str | None = None, options: dict | None = None):
    """Start ``df.writeStream.format("epochstream")`` into ``topic``; returns the StreamingQuery.

    ``checkpoint``: a fresh directory per query (a reused one resumes old batch ids = epochs);
    ``catalog``: a Catalog or path (made absolute: workers may run elsewhere); ``trigger``:
    keyword arguments for ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``)."""
    register(spark)
    cat_path = getattr(catalog, "path", catalog)
    w = (df.writeStream.format(SOURCE_NAME).option("topic", topic)
         .option("checkpointLocation", str(Path(checkpoint).absolute())))
    if cat_path is not None:
        w = w.option("catalog", str(Path(cat_path).absolute()))
    for k, v in (options or {}).items():
        w = w.option(k, str(v))
    if trigger:
        w = w.trigger(**trigger)
    if query_name:
        w = w.queryName(query_name)
    return w.start()
