"""The ingest wire: the one codec for what Spark tasks and the driver-side commit send to a
:class:`~epochstream.spark.host.SparkPublisherHost`, and what it answers.

Used by the client (:mod:`epochstream.spark.client`), the host and the tests; nothing else
builds or parses these frames. Pure: no sockets, no Spark.

Requests (DEALER → the host's ingest ROUTER; msgpack headers; the ROUTER's identity frame is
not part of a message here):

- ``[b"DATA", [run, epoch, spark_partition, attempt, rows(, time)], payload]`` — one Arrow
  record batch (``payload``: Arrow IPC stream bytes, the topic codec's payload); no reply unless
  refused. ``time`` (event time, :mod:`epochstream.spark.event_time`): the epoch its rows
  belong to, read from the query's epoch column (an int, or a list of ints for a product
  order's ``epochColumns``); without it the rows' epoch is the batch's;
- ``[b"FLUSH", {req, run, epoch, attempt, batches, rows(, event)}]`` — "I sent this much, did it
  arrive" (``event: true``: the batch's rows carry their own epochs);
- ``[b"COMMIT", {req, epoch, attempts: [[run, attempt(, rows)], ...], query(, policy, times,
  event_max, length, delay)}]`` — publish these attempts of ``epoch`` (``rows``: what the task
  reported; optional). With event time (:mod:`epochstream.spark.event_time`): ``policy``
  (``"batch"`` or ``"watermark"``), ``times`` ``[lo, hi]``, the least and greatest epoch with
  rows in the whole batch (``nil``: no rows), and for ``"watermark"`` ``event_max`` (the
  batch's greatest event time, microseconds since 1970, or ``nil``), ``length`` (the epoch
  length) and ``delay`` (Spark's watermark delay), microseconds; for a product order
  (``epochColumns``) ``times`` is ``nil`` and ``minima``/``maxima`` list the minimal and
  maximal epochs of the batch (lists of ints);
- ``[b"ABORT", {req, epoch(, attempts)}]`` — drop the epoch's staged data (``attempts`` is
  accepted and ignored).

Replies (ROUTER → DEALER): ``[b"OK" | b"ERR", {req, ...}]``:

- to FLUSH: ``{req, batches, rows}``, or ``{req, stale: true, batches: 0, rows: 0}`` when the
  epoch was already committed;
- to COMMIT: ``{req, duplicate, published_batches, rows, next_epoch}`` plus ``empty_attempts``
  when not a duplicate;
- to ABORT: ``{req, discarded}`` (staged batches dropped);
- ``ERR``: ``{req, error}`` — ``req`` is ``None`` when it could not be read (and for DATA);
  plus ``reason: "not_authorised"`` when a secured host refused the request because the
  connection's principal holds no ``publish`` grant for the topic (docs/security.md; the
  client raises :class:`IngestNotAuthorized`).

``run`` is the Spark run id (a string), ``epoch`` the batch id (the micro-batch: the unit of
staging and of Spark's commit, also with event time), ``attempt`` the task attempt id,
``req`` a request id chosen by the client (a string); every count is an int ``>= 0``. Unknown
header keys are ignored; every known one is type-checked, and a message that fails raises
:class:`IngestMessageError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Union

import msgpack

from ..errors import EpochstreamError, NotAuthorized
from ..security import NOT_AUTHORISED

__all__ = ["DATA", "FLUSH", "COMMIT", "ABORT", "OK", "ERR", "IngestError", "IngestNotAuthorized",
           "IngestMessageError", "AttemptRef", "EventTimes", "Data", "Flush", "Commit", "Abort", "FlushAck",
           "CommitAck", "AbortAck", "Refusal", "Request", "Reply", "encode_request",
           "decode_request", "encode_reply", "decode_reply"]

DATA, FLUSH, COMMIT, ABORT = b"DATA", b"FLUSH", b"COMMIT", b"ABORT"
OK, ERR = b"OK", b"ERR"


class IngestError(EpochstreamError):
    """The Spark ingest path failed: no acknowledgement in time, an ``ERR`` reply from the host,
    or a topic without ingest endpoints (no :class:`SparkPublisherHost` serving it)."""


class IngestNotAuthorized(IngestError, NotAuthorized):
    """A secured :class:`SparkPublisherHost` refused a request (``ERR`` with reason
    ``not_authorised``): the client's key holds no ``publish`` grant for the topic (or the
    connection has no identity); nothing of it was staged. Both an :class:`IngestError` and a
    :class:`~epochstream.errors.NotAuthorized`."""


class IngestMessageError(ValueError):
    """A frame list is not a valid ingest message. ``req`` is the request id when one could be
    read (the host echoes it in its ``ERR`` reply), else ``None``."""

    def __init__(self, message: str, req: str | None = None):
        super().__init__(message)
        self.req = req


# ---- messages ------------------------------------------------------------------------------


class AttemptRef(NamedTuple):
    """An attempt named by COMMIT: ``(run, attempt, rows)``; ``rows`` (the row count its task
    reported) is ``None`` when not given."""

    run: str
    attempt: int
    rows: int | None = None


@dataclass(frozen=True)
class Data:
    """DATA: one record batch of ``rows`` rows of a task attempt; ``payload`` is bytes-like."""

    run: str
    epoch: int
    partition: int  # the Spark partition id
    attempt: int
    rows: int
    payload: Any
    time: Any = None  # the rows' own epoch (event time: an int or a tuple), or None
    KIND: ClassVar[bytes] = DATA
    req: ClassVar[None] = None  # DATA is never answered (unless refused)

    def header(self) -> list:
        h: list = [self.run, self.epoch, self.partition, self.attempt, self.rows]
        if self.time is not None:
            h.append(list(self.time) if isinstance(self.time, tuple) else self.time)
        return h


@dataclass(frozen=True)
class Flush:
    """FLUSH: the attempt sent ``batches`` DATA messages holding ``rows`` rows of ``epoch``."""

    req: str | None
    run: str
    epoch: int
    attempt: int
    batches: int
    rows: int
    event: bool = False  # the batches carried their own epochs (DATA ``time``)
    KIND: ClassVar[bytes] = FLUSH

    def header(self) -> dict:
        h = {"req": self.req, "run": self.run, "epoch": self.epoch, "attempt": self.attempt,
             "batches": self.batches, "rows": self.rows}
        if self.event:
            h["event"] = True
        return h


@dataclass(frozen=True)
class EventTimes:
    """What a COMMIT of an event-time batch says about its epochs: ``policy`` — ``"batch"`` or
    ``"watermark"``; ``times`` — ``(lo, hi)``, the least and greatest epoch with rows in the
    whole batch, or ``None`` (no rows); ``event_max`` — the batch's greatest event time
    (microseconds since 1970; ``None``: none, or ``"batch"``); ``length`` and ``delay`` — the
    epoch length and Spark's watermark delay, microseconds (0 for ``"batch"``)
    (:mod:`epochstream.spark.event_time`)."""

    policy: str
    times: tuple[int, int] | None
    event_max: int | None = None
    length: int = 0
    delay: int = 0
    minima: tuple = ()  # a product order's: the batch's minimal and maximal epochs (tuples)
    maxima: tuple = ()


@dataclass(frozen=True)
class Commit:
    """COMMIT: publish exactly ``attempts`` (in this order) of batch ``epoch``; ``query``: the
    streaming query id, for logs; ``event``: the batch's :class:`EventTimes` when its rows
    carry their own epochs (else ``None``: the batch is the epoch)."""

    req: str | None
    epoch: int
    attempts: tuple[AttemptRef, ...] = ()
    query: str | None = None
    event: EventTimes | None = None
    KIND: ClassVar[bytes] = COMMIT

    def header(self) -> dict:
        h = {"req": self.req, "epoch": self.epoch, "attempts": _attempt_lists(self.attempts),
             "query": self.query}
        if self.event is not None:
            e = self.event
            h.update(policy=e.policy, times=None if e.times is None else list(e.times),
                     event_max=e.event_max, length=e.length, delay=e.delay)
            if e.minima or e.maxima:
                h.update(minima=[list(t) for t in e.minima], maxima=[list(t) for t in e.maxima])
        return h


@dataclass(frozen=True)
class Abort:
    """ABORT: drop every staged batch of ``epoch`` (``attempts`` is carried, not used)."""

    req: str | None
    epoch: int
    attempts: tuple[AttemptRef, ...] = ()
    KIND: ClassVar[bytes] = ABORT

    def header(self) -> dict:
        h: dict = {"req": self.req, "epoch": self.epoch}
        if self.attempts:
            h["attempts"] = _attempt_lists(self.attempts)
        return h


@dataclass(frozen=True)
class FlushAck:
    """OK to FLUSH: what the host holds staged for the attempt; ``stale``: the epoch was
    already committed (nothing staged, nothing needed)."""

    req: str | None
    batches: int
    rows: int
    stale: bool = False

    def body(self) -> dict:
        b: dict = {"req": self.req, "batches": self.batches, "rows": self.rows}
        if self.stale:
            b["stale"] = True
        return b


@dataclass(frozen=True)
class CommitAck:
    """OK to COMMIT: ``duplicate`` — the epoch was already committed, nothing published;
    otherwise ``published_batches`` batches holding ``rows`` rows were published and
    ``empty_attempts`` named attempts had staged nothing. ``next_epoch``: the partition's
    frontier after the commit."""

    req: str | None
    duplicate: bool
    published_batches: int
    rows: int
    next_epoch: int
    empty_attempts: int = 0

    def body(self) -> dict:
        b: dict = {"req": self.req, "duplicate": self.duplicate,
                   "published_batches": self.published_batches, "rows": self.rows,
                   "next_epoch": self.next_epoch}
        if not self.duplicate:
            b["empty_attempts"] = self.empty_attempts
        return b


@dataclass(frozen=True)
class AbortAck:
    """OK to ABORT: ``discarded`` staged batches were dropped."""

    req: str | None
    discarded: int

    def body(self) -> dict:
        return {"req": self.req, "discarded": self.discarded}


@dataclass(frozen=True)
class Refusal:
    """ERR: the request ``req`` (``None``: unknown) was refused because of ``error``;
    ``reason``: ``"not_authorised"`` for a principal without a ``publish`` grant, else ``None``."""

    req: str | None
    error: str
    reason: str | None = None

    def body(self) -> dict:
        b: dict = {"req": self.req, "error": self.error}
        if self.reason is not None:
            b["reason"] = self.reason
        return b

    @property
    def not_authorised(self) -> bool:
        return self.reason == NOT_AUTHORISED


Request = Union[Data, Flush, Commit, Abort]
Reply = Union[FlushAck, CommitAck, AbortAck, Refusal]


def _attempt_lists(attempts: Sequence[AttemptRef]) -> list:
    return [[a.run, a.attempt] if a.rows is None else [a.run, a.attempt, a.rows]
            for a in attempts]


# ---- encoding ------------------------------------------------------------------------------


def encode_request(msg: Request) -> list:
    """The frames of ``msg`` (the payload of a DATA message is passed through, not copied)."""
    frames: list = [msg.KIND, msgpack.packb(msg.header())]
    if isinstance(msg, Data):
        frames.append(msg.payload)
    return frames


def encode_reply(reply: Reply) -> list[bytes]:
    """``[b"OK" | b"ERR", msgpack body]``."""
    return [ERR if isinstance(reply, Refusal) else OK, msgpack.packb(reply.body())]


# ---- decoding ------------------------------------------------------------------------------


def _raw(frame) -> bytes:
    return frame if isinstance(frame, bytes) else bytes(frame)


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _unpack(frame, what: str) -> Any:
    try:
        return msgpack.unpackb(frame)
    except Exception as e:  # noqa: BLE001 - any msgpack failure means "not a header"
        raise IngestMessageError(f"{what}: header is not msgpack ({e})") from None


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class _Fields:
    """Reads the fields of one msgpack map header, raising :class:`IngestMessageError` (with
    the request id, once readable) for a missing or mistyped one."""

    _MISSING = object()

    def __init__(self, header: Any, what: str):
        if not isinstance(header, dict):
            raise IngestMessageError(f"{what}: header must be a map, got {_show(header)}")
        self.h, self.what = header, what
        req = header.get("req")
        self.seen_req = req if isinstance(req, str) else None

    def _get(self, name: str, ok: Callable[[Any], bool], kind: str, default: Any) -> Any:
        v = self.h.get(name, self._MISSING)
        if v is self._MISSING:
            if default is self._MISSING:
                raise IngestMessageError(f"{self.what}: missing field {name!r}", self.seen_req)
            return default
        if not ok(v):
            raise IngestMessageError(f"{self.what}: {name} must be {kind}, got {_show(v)}",
                                     self.seen_req)
        return v

    def req(self) -> str | None:
        return self._get("req", lambda v: v is None or isinstance(v, str), "a string or nil", None)

    def count(self, name: str, default: Any = _MISSING) -> int:
        return self._get(name, _is_count, "an int >= 0", default)

    def text(self, name: str) -> str:
        return self._get(name, lambda v: isinstance(v, str), "a string", self._MISSING)

    def opt_text(self, name: str) -> str | None:
        return self._get(name, lambda v: v is None or isinstance(v, str), "a string or nil", None)

    def flag(self, name: str, default: Any = _MISSING) -> bool:
        return self._get(name, lambda v: isinstance(v, bool), "a bool", default)

    def event_times(self) -> EventTimes | None:
        """A COMMIT's ``times``/``policy``/``watermark``, or ``None`` when it has no
        ``policy`` (the batch is the epoch)."""
        policy = self._get("policy", lambda v: v in (None, "batch", "watermark"),
                           "'batch', 'watermark' or nil", None)
        if policy is None:
            return None
        times = self._get("times", lambda v: v is None or (
            isinstance(v, list) and len(v) == 2 and all(_is_count(x) for x in v)
            and v[0] <= v[1]), "nil or [lo, hi] (ints >= 0, lo <= hi)", None)
        event_max = self._get("event_max", lambda v: v is None or _is_count(v),
                              "nil or an int >= 0", None)
        length, delay = self.count("length", 0), self.count("delay", 0)
        if policy == "watermark" and length <= 0:
            raise IngestMessageError("COMMIT: a watermark commit needs length > 0",
                                     self.seen_req)
        return EventTimes(policy, None if times is None else (times[0], times[1]), event_max,
                          length, delay, self.times_list("minima"), self.times_list("maxima"))

    def times_list(self, name: str) -> tuple:
        """A list of product-order times (lists of ints >= 0, all of one width), as tuples."""
        v = self._get(name, lambda v: isinstance(v, list) and all(
            isinstance(t, list) and t and all(_is_count(x) for x in t) for t in v)
            and len({len(t) for t in v}) <= 1, "a list of times (lists of ints >= 0, one "
            "width)", [])
        return tuple(tuple(t) for t in v)

    def attempts(self) -> tuple[AttemptRef, ...]:
        v = self._get("attempts", lambda v: v is None or isinstance(v, list), "a list", None)
        return tuple(self._attempt(e) for e in v or ())

    def _attempt(self, entry: Any) -> AttemptRef:
        if (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)
                and all(_is_count(x) for x in entry[1:])):
            return AttemptRef(*entry)
        raise IngestMessageError(f"{self.what}: attempts must be [run, attempt(, rows)] (a "
                                 f"string and ints >= 0), got {_show(entry)}", self.seen_req)


def _no_payload(kind: str, rest: Sequence, f: _Fields) -> None:
    if rest:
        raise IngestMessageError(f"{kind} takes no payload frame, got {len(rest)}", f.seen_req)


def _is_time(v: Any) -> bool:
    """An event-time epoch: an int >= 0, or a non-empty list of them (a product order)."""
    return _is_count(v) or (isinstance(v, list) and bool(v) and all(_is_count(x) for x in v))


def _decode_data(header: Any, rest: Sequence) -> Data:
    if not (isinstance(header, list) and len(header) in (5, 6) and isinstance(header[0], str)
            and all(_is_count(x) for x in header[1:5])
            and (len(header) == 5 or _is_time(header[5]))):
        raise IngestMessageError(f"DATA header must be [run, epoch, partition, attempt, rows"
                                 f"(, time)] (a string and ints >= 0; time an int or a list of "
                                 f"ints >= 0), got {_show(header)}")
    if len(rest) != 1:
        raise IngestMessageError(f"DATA needs [header, payload], got {len(rest) + 1} frames")
    time_ = header[5] if len(header) == 6 else None
    return Data(*header[:5], rest[0], tuple(time_) if isinstance(time_, list) else time_)


def _decode_flush(header: Any, rest: Sequence) -> Flush:
    f = _Fields(header, "FLUSH")
    _no_payload("FLUSH", rest, f)
    return Flush(f.req(), f.text("run"), f.count("epoch"), f.count("attempt"),
                 f.count("batches"), f.count("rows"), f.flag("event", False))


def _decode_commit(header: Any, rest: Sequence) -> Commit:
    f = _Fields(header, "COMMIT")
    _no_payload("COMMIT", rest, f)
    return Commit(f.req(), f.count("epoch"), f.attempts(), f.opt_text("query"), f.event_times())


def _decode_abort(header: Any, rest: Sequence) -> Abort:
    f = _Fields(header, "ABORT")
    _no_payload("ABORT", rest, f)
    return Abort(f.req(), f.count("epoch"), f.attempts())


_REQUESTS: dict[bytes, Callable[[Any, Sequence], Request]] = {
    DATA: _decode_data, FLUSH: _decode_flush, COMMIT: _decode_commit, ABORT: _decode_abort}


def decode_request(frames: Sequence) -> Request:
    """Parse ``[kind, header, ...]`` (bytes or ``zmq.Frame``; a DATA payload is kept as given).
    Raises :class:`IngestMessageError` for a missing frame, a header that is not msgpack, an
    unknown kind or any field of the wrong type."""
    if len(frames) < 2:
        raise IngestMessageError(f"expected [kind, header, ...], got {len(frames)} frame(s)")
    kind = _raw(frames[0])
    header = _unpack(frames[1], repr(kind[:16]))
    decode = _REQUESTS.get(kind)
    if decode is None:
        req = header.get("req") if isinstance(header, dict) else None
        raise IngestMessageError(f"unknown message kind {kind[:16]!r}",
                                 req if isinstance(req, str) else None)
    return decode(header, frames[2:])


def _ack_flush(f: _Fields) -> FlushAck:
    return FlushAck(f.req(), f.count("batches"), f.count("rows"), f.flag("stale", False))


def _ack_commit(f: _Fields) -> CommitAck:
    return CommitAck(f.req(), f.flag("duplicate"), f.count("published_batches"), f.count("rows"),
                     f.count("next_epoch"), f.count("empty_attempts", 0))


def _ack_abort(f: _Fields) -> AbortAck:
    return AbortAck(f.req(), f.count("discarded"))


_ACKS: dict[bytes, Callable[[_Fields], Reply]] = {
    FLUSH: _ack_flush, COMMIT: _ack_commit, ABORT: _ack_abort}


def decode_reply(frames: Sequence, kind: bytes) -> Reply:
    """Parse the host's reply to a request of ``kind`` (``FLUSH``, ``COMMIT`` or ``ABORT``): a
    :class:`Refusal` for ``ERR``, else that kind's acknowledgement. Raises
    :class:`IngestMessageError` (with ``req`` when readable: a late reply to another request
    may have another shape) for anything else."""
    if len(frames) != 2:
        raise IngestMessageError(f"a reply is [status, body], got {len(frames)} frame(s)")
    status = _raw(frames[0])
    f = _Fields(_unpack(frames[1], repr(status[:16])), f"{status[:16]!r} reply")
    if status == ERR:
        return Refusal(f.req(), f.text("error"), f.opt_text("reason"))
    if status != OK:
        raise IngestMessageError(f"unknown reply status {status[:16]!r}", f.seen_req)
    return _ACKS[kind](f)
