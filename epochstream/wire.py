"""The multipart wire format: message kinds, frame encoding and decoding, and the control
headers' schemas — specified in docs/protocol.md (§2 frames: every kind and each control
schema); the payload codecs are in :mod:`epochstream.codecs` (:func:`codec`, :data:`CODECS`,
:class:`MsgpackCodec` and :class:`ArrowCodec` are re-exported here).

Every message is a ZeroMQ multipart message (Strymon: "time and data in separate multi-part
slots ... drop filtered messages without decoding the data part"): frame 0 the kind and
version (2 bytes, e.g. ``b"D\\x01"``), frame 1 a msgpack header, frame 2 the payload (data
only). Publisher → subscriber: ``S`` snapshot, ``D`` data (header: the time alone, so a
subscriber can cache its filter verdict per raw header bytes), ``F`` lower frontier update,
``H`` heartbeat, ``X`` notice, ``R`` history epoch. Subscriber → publisher: ``h`` hello, ``c``
credit, ``p`` ping, ``b`` bye, ``u`` update filter, ``r`` read history.

Control headers are type-checked where they are decoded (:func:`decode_control`, one schema per
kind in :data:`CONTROL_SCHEMAS`), so a publisher only ever sees well-typed headers; keys not in
the schema are ignored (forward compatibility). Times are msgpack ints, or arrays of ints for
product orders (decoded as tuples). Every decoding failure raises
:class:`~epochstream.errors.WireError` naming kind and field, e.g. ``hello.partition must be an
int >= 0, got 'x'``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import msgpack

from .codecs import CODECS, ArrowCodec, MsgpackCodec, codec
from .errors import WireError
from .events import DataMessage, InitialFrontierSnapshot, LowerFrontierUpdate
from .wire2 import (DATA2, MAX_ARITY, WIRE_VERSIONS, V2Renderer, choose_wire, data_decoder,  # noqa: F401
                    data_header2, decode_data2, decoder_for, encode_data2)

__all__ = ["as_payload", "VERSION", "SNAPSHOT", "DATA", "FRONTIER", "HEARTBEAT", "NOTICE", "HELLO", "PING", "BYE",
           "CREDIT", "READ", "HISTORY", "UPDATE", "encode_history", "decode_history",
           "Heartbeat", "Notice", "encode_snapshot", "encode_data", "encode_frontier",
           "encode_heartbeat", "encode_notice", "encode_control", "decode", "decode_control",
           "decode_time", "codec", "CODECS", "MsgpackCodec", "ArrowCodec", "CONTROL_SCHEMAS",
           "ControlField", "encode_time", "decode_snapshot_meta", "MAX_ID_CHARS", "MAX_COUNT",
           "DATA2", "WIRE_VERSIONS", "data_header2", "encode_data2", "V2Renderer", "data_decoder",
           "decoder_for", "decode_data2", "choose_wire", "MAX_ARITY"]

VERSION = 1
_V = bytes([VERSION])
SNAPSHOT = b"S" + _V
DATA = b"D" + _V
FRONTIER = b"F" + _V
HEARTBEAT = b"H" + _V
NOTICE = b"X" + _V
HELLO = b"h" + _V
PING = b"p" + _V
BYE = b"b" + _V
CREDIT = b"c" + _V
READ = b"r" + _V
HISTORY = b"R" + _V
UPDATE = b"u" + _V

_PUB_KINDS = {SNAPSHOT, DATA, DATA2, FRONTIER, HEARTBEAT, NOTICE}
_SUB_KINDS = {HELLO, PING, BYE, CREDIT, READ, UPDATE}

_packb = msgpack.Packer(use_bin_type=True).pack


def as_payload(payload):
    """An already-encoded payload as the loop takes it: ``payload`` itself if it is ``bytes``
    or a contiguous ``memoryview`` (as bytes: no copy — what a relay forwards; its buffer must
    not change afterwards), else a ``bytes`` copy of any other bytes-like object
    (``bytearray``, ``zmq.Frame``, a NumPy array...: a caller may change a mutable buffer once
    the call returned, and the loop merges payloads by their bytes). ``TypeError`` for anything
    else, so that ``Publisher.send_encoded`` refuses it at the call, not in the loop."""
    if type(payload) is bytes:
        return payload
    if type(payload) is memoryview and payload.c_contiguous:
        return payload if payload.format == "B" and payload.ndim == 1 else payload.cast("B")
    try:
        return bytes(memoryview(payload))
    except TypeError:
        raise TypeError(f"an encoded payload must be bytes-like (bytes, bytearray, memoryview), "
                        f"got {type(payload).__name__}") from None


def _unpack(raw) -> Any:
    return msgpack.unpackb(raw, use_list=False, raw=False, strict_map_key=False)


# -- control message schemas (subscriber -> publisher) -----------------------------------------
MAX_ID_CHARS = 128
MAX_COUNT = 1 << 31


class ControlField(NamedTuple):
    """One field of a control header: ``check(value)`` is True for a well-typed value;
    ``expected`` describes it for error messages."""

    name: str
    required: bool
    check: Callable[[Any], bool]
    expected: str


# ``type(v) is int`` (not isinstance): msgpack decodes integers as plain ints, and bool -- a
# subclass of int -- is refused on purpose.
def _is_str(v) -> bool:
    return type(v) is str


def _is_id(v) -> bool:
    return type(v) is str and len(v) <= MAX_ID_CHARS


def _is_index(v) -> bool:
    return type(v) is int and v >= 0


def _is_count(v) -> bool:
    return type(v) is int and 1 <= v <= MAX_COUNT


def _is_req(v) -> bool:
    return type(v) is int and 0 <= v <= MAX_COUNT


def _is_program(v) -> bool:
    """A filter program's outer shape: an array of 1..16 entries (each entry is checked by
    :meth:`epochstream.filters.FilterSchedule.from_wire` on the publisher, which knows the
    order)."""
    return type(v) is tuple and 1 <= len(v) <= 16


def _is_time(v) -> bool:
    """A time on the wire: an int, or an array of at most 64 ints (product orders). Whether it
    fits the topic's order is checked by the receiver."""
    if type(v) is int:
        return True
    return type(v) is tuple and len(v) <= 64 and all(type(x) is int for x in v)


def _is_versions(v) -> bool:
    """The ``wire`` field of a hello: an array of 1..8 ints (the data-message versions the
    subscriber speaks)."""
    return type(v) is tuple and 1 <= len(v) <= 8 and all(type(x) is int for x in v)


_ID = f"a str of at most {MAX_ID_CHARS} characters"
_COUNT = "an int >= 1 (at most 2**31)"

def _is_credit_unit(v: Any) -> bool:
    return v in ("messages", "epochs")


#: kind -> (name, fields): the schema of every subscriber -> publisher message (docs/protocol.md
#: §2). Keys a header holds beyond these are ignored.
CONTROL_SCHEMAS: dict[bytes, tuple[str, tuple[ControlField, ...]]] = {
    HELLO: ("hello", (ControlField("topic", True, _is_str, "a str"),
                      ControlField("partition", True, _is_index, "an int >= 0"),
                      ControlField("id", True, _is_id, _ID),
                      ControlField("credit", False, _is_count, _COUNT),
                      ControlField("credit_unit", False, _is_credit_unit,
                                   '"messages" or "epochs"'),
                      ControlField("filter", False, _is_program,
                                   "a filter program: an array of 1..16 [boundary, filter]"),
                      ControlField("wire", False, _is_versions,
                                   "an array of 1..8 ints (data-message versions)"))),
    PING: ("ping", (ControlField("id", True, _is_id, _ID),)),
    CREDIT: ("credit", (ControlField("messages", True, _is_count, _COUNT),)),
    BYE: ("bye", ()),
    UPDATE: ("update", (ControlField("id", True, _is_req, "an int, 0 <= id <= 2**31"),
                        ControlField("filter", True, _is_program,
                                     "a filter program: an array of 1..16 [boundary, filter]"))),
    READ: ("read", (ControlField("topic", True, _is_str, "a str"),
                    ControlField("partition", True, _is_index, "an int >= 0"),
                    ControlField("req", True, _is_req, "an int, 0 <= req <= 2**31"),
                    ControlField("time", True, _is_time,
                                 "an int or an array of at most 64 ints"),
                    ControlField("received", True, _is_req, "an int, 0 <= received <= 2**31"))),
}


def _show(value, limit: int = 80) -> str:
    """``repr(value)``, shortened for an error message (a header may be up to 64 KiB)."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


class Heartbeat:
    """Decoded ``H`` message: ``lower`` is the partition's current lower frontier (tuple)."""

    __slots__ = ("lower",)

    def __init__(self, lower: tuple):
        self.lower = lower

    def __repr__(self):
        return f"Heartbeat(lower={self.lower!r})"


class Notice:
    """Decoded ``X`` message: ``code`` (``"lagged"``, ``"error"``, ``"rejoin"``), ``message`` and
    ``extra`` (the whole header map, ``code`` and ``message`` included)."""

    __slots__ = ("code", "message", "extra")

    def __init__(self, code: str, message: str, extra: dict):
        self.code = code
        self.message = message
        self.extra = extra

    def __repr__(self):
        return f"Notice({self.code!r}, {self.message!r})"


# -- encoding ---------------------------------------------------------------------------------
def encode_snapshot(snapshot: InitialFrontierSnapshot, **meta) -> list[bytes]:
    """Frames of an ``S`` message; ``meta``: topic, partition, order, codec, incarnation, ..."""
    header = dict(meta)
    header["lower"] = list(snapshot.lower)
    header["upper"] = list(snapshot.upper)
    return [SNAPSHOT, _packb(header)]


def encode_time(time) -> bytes:
    """The ``D`` header for ``time`` (msgpack int or array)."""
    return _packb(time)


def encode_data(time, payload) -> list:
    """Frames of a ``D`` message: kind, packed time, payload (bytes-like, already encoded)."""
    return [DATA, _packb(time), payload]


def encode_frontier(update: LowerFrontierUpdate) -> list[bytes]:
    """Frames of an ``F`` message."""
    return [FRONTIER, _packb([[t, d] for t, d in update.updates])]


def encode_heartbeat(lower) -> list[bytes]:
    """Frames of an ``H`` message carrying the current lower frontier."""
    return [HEARTBEAT, _packb({"lower": list(lower)})]


def encode_notice(code: str, message: str, **extra) -> list[bytes]:
    """Frames of an ``X`` notice."""
    header = dict(extra)
    header["code"] = code
    header["message"] = message
    return [NOTICE, _packb(header)]


def encode_history(req: int, time, partition: int, payloads: list) -> list:
    """Frames of an ``R`` message: one epoch of one partition read from the log, its payloads
    (bytes-like, still encoded) one frame each."""
    return [HISTORY, _packb({"req": req, "time": time, "partition": partition}), *payloads]


def decode_history(frames) -> tuple[int, Any, list] | Notice:
    """Decode an answer to an ``r`` read: ``(req, time, payload frames)`` for ``R``, or the
    :class:`Notice` for ``X`` (``code`` ``"history"`` for a failed read). Raises
    :class:`WireError` for anything else."""
    kind = _check_kind(frames, {HISTORY, NOTICE})
    if kind == NOTICE:
        note = decode(frames)
        assert isinstance(note, Notice)
        return note
    if len(frames) < 2:
        raise WireError(f"history message needs at least 2 frames, got {len(frames)}")
    try:
        h = _unpack(frames[1])
    except Exception as exc:
        raise WireError(f"history header does not decode as msgpack: {exc}") from None
    if type(h) is not dict or not _is_req(h.get("req")) or "time" not in h:
        raise WireError(f"history header must be a map with an int 'req' and a 'time', got "
                        f"{_show(h)}")
    return h["req"], h["time"], list(frames[2:])


def encode_control(kind: bytes, **fields) -> list[bytes]:
    """Frames of a subscriber → publisher message (``HELLO``, ``PING``, ``BYE``)."""
    return [kind, _packb(fields)]


# -- decoding ---------------------------------------------------------------------------------
def _header(frames, expected: int):
    if len(frames) != expected:
        kind = bytes(frames[0][:1]) if frames else b"?"
        raise WireError(f"message kind {kind!r} needs {expected} frames, got {len(frames)}")
    try:
        return _unpack(frames[1])
    except Exception as exc:
        raise WireError(f"header does not decode as msgpack: {exc}") from None


def _check_kind(frames, kinds) -> bytes:
    if not frames:
        raise WireError("empty multipart message")
    f0 = frames[0]
    kind = bytes(f0[:2])
    if kind == DATA2 and DATA2 in kinds:  # version 2: the header and payload follow in frame 0
        return kind
    if kind in kinds and len(f0) == 2:
        return kind
    if len(f0) == 2 and kind[1] != VERSION:
        raise WireError(f"unsupported protocol version {kind[1]} of kind {kind[:1]!r} (this "
                        f"side speaks {VERSION}, and versions {list(WIRE_VERSIONS)} of data)")
    if DATA2 in kinds and len(f0) > 2 and kind[:1] == b"D" and kind[1] not in WIRE_VERSIONS:
        raise WireError(f"unsupported data message version {kind[1]} (this side speaks "
                        f"{list(WIRE_VERSIONS)})")
    raise WireError(f"unknown message kind {_show(bytes(f0[:16]))}")


def _times(value, what: str) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise WireError(f"{what} must be an array of times, got {_show(value)}")
    return tuple(value)


def decode_time(raw) -> Any:
    """Decode a ``D`` header (the time). Raises :class:`WireError`."""
    try:
        return _unpack(raw)
    except Exception as exc:
        raise WireError(f"data header does not decode as msgpack: {exc}") from None


def decode(frames) -> Any:
    """Decode a publisher → subscriber message.

    Returns an :class:`InitialFrontierSnapshot` (with ``.meta`` dict available via
    :func:`decode_snapshot_meta`), :class:`LowerFrontierUpdate`, :class:`DataMessage` (``data`` is
    the *still-encoded* payload frame), :class:`Heartbeat` or :class:`Notice`. Times are not
    shape-checked here; the protocol checks them against the topic's order. Raises
    :class:`WireError`."""
    kind = _check_kind(frames, _PUB_KINDS)
    if kind == DATA2:
        t, payload = decode_data2(frames)
        return DataMessage(t, payload, len(payload))
    if kind == DATA:
        if len(frames) != 3:
            raise WireError(f"data message needs 3 frames, got {len(frames)}")
        return DataMessage(decode_time(frames[1]), frames[2])
    if kind == FRONTIER:
        h = _header(frames, 2)
        if isinstance(h, (tuple, list)):
            updates = []
            for pair in h:
                if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                        or type(pair[1]) is not int):
                    break
                updates.append((pair[0], pair[1]))
            else:
                return LowerFrontierUpdate(tuple(updates))
        raise WireError(f"frontier update header must be [[time, delta], ...] with int deltas, "
                        f"got {_show(h)}")
    if kind == SNAPSHOT:
        h = _header(frames, 2)
        if not isinstance(h, dict) or "lower" not in h or "upper" not in h:
            raise WireError(f"snapshot header must be a map with 'lower' and 'upper', got {_show(h)}")
        return InitialFrontierSnapshot(_times(h["lower"], "lower"), _times(h["upper"], "upper"))
    if kind == HEARTBEAT:
        h = _header(frames, 2)
        if not isinstance(h, dict) or "lower" not in h:
            raise WireError(f"heartbeat header must be a map with 'lower', got {_show(h)}")
        return Heartbeat(_times(h["lower"], "lower"))
    h = _header(frames, 2)
    if not isinstance(h, dict) or not isinstance(h.get("code"), str):
        raise WireError(f"notice header must be a map with a str 'code', got {_show(h)}")
    return Notice(h["code"], str(h.get("message", "")), h)


def decode_snapshot_meta(frames) -> dict:
    """The full header map of an ``S`` message (topic, partition, incarnation, ...)."""
    _check_kind(frames, {SNAPSHOT})
    return _header(frames, 2)


def decode_control(frames) -> tuple[bytes, dict]:
    """Decode a subscriber → publisher message: ``(kind, header)``, where ``header`` is a dict
    holding exactly the fields of the kind's schema (:data:`CONTROL_SCHEMAS`) that were present,
    each checked; unknown keys are dropped. Raises :class:`WireError` for a wrong frame count,
    an unknown kind or version, a header that is not a msgpack map, a missing required field or
    a field of the wrong type or range (the message names kind and field)."""
    kind = _check_kind(frames, _SUB_KINDS)
    name, fields = CONTROL_SCHEMAS[kind]
    if len(frames) != 2:
        raise WireError(f"{name} message needs 2 frames, got {len(frames)}")
    try:
        h = _unpack(frames[1])
    except Exception as exc:
        raise WireError(f"{name} header does not decode as msgpack: {exc}") from None
    if type(h) is not dict:
        raise WireError(f"{name} header must be a map, got {_show(h)}")
    header = {}
    for f in fields:
        if f.name in h:
            value = h[f.name]
            if not f.check(value):
                raise WireError(f"{name}.{f.name} must be {f.expected}, got {_show(value)}")
            header[f.name] = value
        elif f.required:
            raise WireError(f"{name}.{f.name} is required ({f.expected}); header was {_show(h)}")
    return kind, header
