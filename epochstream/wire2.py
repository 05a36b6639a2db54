"""Version 2 of the data message ``D`` (docs/protocol.md §2.2): one ZeroMQ frame holding a
fixed-size header read with one ``struct.unpack_from``, then the payload — where version 1 sends
three frames (kind, a msgpack header holding the time, the payload).

Header (little-endian, ``4 + 8 * max(1, arity)`` bytes: 12 for a total order)::

    offset 0  b"D"       the kind
    offset 1  0x02       the version
    offset 2  arity      0: a total-order int (one component); 1..64: a product time of that many
    offset 3  flags      0: components are int64; 1: uint64 (used only when some component is
                         >= 2**63; a time mixing negative components and components >= 2**63 is
                         sent as a version-1 ``D`` instead: a v2 subscriber reads both)
    offset 4  components 8 bytes each
    then      payload    the codec's bytes (to the end of the frame)

A payload of :data:`SPLIT_BYTES` or more (or one already wrapped in a shared ``zmq.Frame``) goes
as a second frame behind a frame holding the header alone, so the publisher never copies a big
payload to join it (the subscriber reads either form). Bytes 2.. of the header are the time's
whole encoding: equal times have equal header bytes (a filter-verdict cache may key on them;
epochstream's keys on the decoded time, which it has after the one unpack anyway).

Errors: :class:`~epochstream.errors.WireError` naming what is wrong (short header, arity that is
not the topic's or above 64, unknown flags, truncated time, wrong frame count).
"""

from __future__ import annotations

import struct
from typing import Any, Callable

import msgpack

from .errors import WireError

__all__ = ["DATA2", "MAX_ARITY", "SPLIT_BYTES", "VIEW_BYTES", "header_size", "data_header2", "encode_data2",
           "decoder_for",
           "V2Renderer", "data_decoder", "decode_data2", "choose_wire", "WIRE_VERSIONS"]

DATA2 = b"D\x02"
#: the most components a product time may have on the wire (as in version 1's schemas)
MAX_ARITY = 64
#: payloads of at least this many bytes travel as a frame of their own (header frame + payload
#: frame) instead of being copied behind the header (benchmarks/results/optimizations.json)
SPLIT_BYTES = 16384
#: the data-message versions this side speaks, oldest first
WIRE_VERSIONS = (1, 2)
#: a frame of at most this many bytes hands its payload out as ``bytes`` (a copy: cheaper than
#: a memoryview for small payloads, and not tracked by the garbage collector), a bigger one as a
#: memoryview of the frame (no copy) — benchmarks/results/optimizations.json
VIEW_BYTES = 2048

_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_structs: dict[tuple[int, int], struct.Struct] = {}
_HEAD = struct.Struct("<2sBB")


def header_size(arity: int) -> int:
    """Bytes of a v2 header for a time of ``arity`` (0: total order) components."""
    return 4 + 8 * max(1, arity)


def _struct(arity: int, unsigned: int) -> struct.Struct:
    key = (arity, unsigned)
    s = _structs.get(key)
    if s is None:
        s = _structs[key] = struct.Struct(f"<2sBB{max(1, arity)}{'Q' if unsigned else 'q'}")
    return s


def data_header2(time) -> bytes | None:
    """The v2 header of a ``D`` message at ``time`` (an int, or a tuple of 1..64 ints), or
    ``None`` when the time has no v2 encoding (a tuple mixing components < 0 and >= 2**63, an
    empty or longer tuple, or not a time): such a message is sent as version 1."""
    if type(time) is int:
        comps: tuple = (time,)
        arity = 0
    else:
        if type(time) is not tuple or not 1 <= len(time) <= MAX_ARITY or \
                not all(type(c) is int for c in time):
            return None
        comps, arity = time, len(time)
    lo, hi = min(comps), max(comps)
    if lo >= _I64_MIN and hi <= _I64_MAX:
        unsigned = 0
    elif lo >= 0 and hi <= _U64_MAX:
        unsigned = 1
    else:
        return None
    return _struct(arity, unsigned).pack(DATA2, arity, unsigned, *comps)


def encode_data2(header: bytes, payload, split: int = SPLIT_BYTES) -> list:
    """Frames of a v2 ``D`` message: ``[header + payload]``, or ``[header, payload]`` for a
    payload of ``split`` bytes or more or one that is not bytes-like (a shared ``zmq.Frame``)."""
    if (type(payload) is bytes or type(payload) is memoryview) and len(payload) < split:
        return [header + payload]
    return [header, payload]


class V2Renderer:
    """``render(frames) -> frames``: a version-1 ``D`` message (``[DATA, msgpack time,
    payload]``) as version 2 (version 1 unchanged if its time has no v2 encoding). The header
    is computed once per run of messages sharing one header object (a publisher reuses it for
    consecutive data at one time)."""

    __slots__ = ("_raw", "_head", "split")

    def __init__(self, split: int = SPLIT_BYTES):
        self._raw = self._head = None
        self.split = split

    def __call__(self, frames: list) -> list:
        raw = frames[1]
        if raw is not self._raw:
            try:
                t = msgpack.unpackb(raw, use_list=False)
            except Exception:  # noqa: BLE001 - not ours to judge: send it as it is
                t = None
            self._head, self._raw = data_header2(t), raw
        head = self._head
        if head is None:
            return frames
        return encode_data2(head, frames[2], self.split)


def decode_data2(frames, arity: int | None = None) -> tuple[Any, Any]:
    """``(time, payload)`` of a v2 ``D`` message (``frames``: one frame, or a header frame and a
    payload frame), every field checked; ``arity``: the topic's (``None``: any). The payload is
    a ``memoryview`` of the frame (no copy) or the second frame. Raises :class:`WireError`."""
    if not frames or len(frames) > 2:
        raise WireError(f"v2 data message needs 1 or 2 frames, got {len(frames)}")
    f = frames[0]
    if len(f) < 4:
        raise WireError(f"v2 data header needs at least 4 bytes, got {len(f)}")
    kind, a, flags = _HEAD.unpack_from(f)
    if kind != DATA2:
        raise WireError(f"not a v2 data message: {bytes(kind)!r}")
    if a > MAX_ARITY:
        raise WireError(f"v2 data header: arity {a} is above {MAX_ARITY}")
    if arity is not None and a != arity:
        raise WireError(f"v2 data header: arity {a} does not fit the topic's order "
                        f"(arity {arity}: {'a total order' if arity == 0 else 'product'})")
    if flags > 1:
        raise WireError(f"v2 data header: unknown flags {flags} (0: int64, 1: uint64)")
    size = header_size(a)
    if len(f) < size:
        raise WireError(f"v2 data header: a time of arity {a} needs {size} bytes, the frame "
                        f"has {len(f)} (truncated time)")
    vals = _struct(a, flags).unpack_from(f)
    t = vals[3] if a == 0 else vals[3:]
    if len(frames) == 2:
        if len(f) != size:
            raise WireError(f"v2 data message in two frames: the header frame must be exactly "
                            f"{size} bytes, got {len(f)}")
        return t, frames[1]
    return t, f[size:] if len(f) <= VIEW_BYTES else memoryview(f)[size:]


def data_decoder(arity: int) -> Callable[[list], tuple[Any, Any]]:
    """A fast ``decode(frames) -> (time, payload)`` for the v2 ``D`` messages of a topic whose
    times have ``arity`` components (0: total order): one ``unpack_from`` and a slice (bytes for
    a frame of at most :data:`VIEW_BYTES`, else a memoryview: no copy);
    anything unusual goes to :func:`decode_data2`, which raises the precise
    :class:`WireError`."""
    s = _struct(arity, 0)
    size = header_size(arity)
    unpack = s.unpack_from
    error = struct.error
    view = VIEW_BYTES

    if arity == 0:
        def decode(frames):
            f = frames[0]
            try:
                _, a, flags, t = unpack(f)
            except error:
                return decode_data2(frames, 0)
            if a or flags or len(frames) != 1:
                return decode_data2(frames, 0)
            return t, f[size:] if len(f) <= view else memoryview(f)[size:]
        return decode

    def decode_product(frames):
        f = frames[0]
        try:
            vals = unpack(f)
        except error:
            return decode_data2(frames, arity)
        if vals[1] != arity or vals[2] or len(frames) != 1:
            return decode_data2(frames, arity)
        return vals[3:], f[size:] if len(f) <= view else memoryview(f)[size:]
    return decode_product


def decoder_for(order) -> Callable[[list], tuple[Any, Any]]:
    """The fast v2 data decoder (:func:`data_decoder`) for ``order``'s times (total: arity 0,
    ``product(n)``: n), or :func:`decode_data2` for any other order (the protocol checks the
    times either way)."""
    if getattr(order, "name", None) == "total":
        return data_decoder(0)
    width = getattr(order, "width", None)
    if type(width) is int and 1 <= width <= MAX_ARITY:
        return data_decoder(width)
    return decode_data2


def choose_wire(offered, speaks: int = 2) -> int | None:
    """The data-message version a publisher speaking versions 1..``speaks`` uses for a
    subscriber that offered ``offered`` (a hello's ``wire`` array; ``None``: an old subscriber,
    version 1): the highest in common, or ``None`` if none is."""
    if offered is None:
        return 1
    common = [v for v in offered if 1 <= v <= speaks and v in WIRE_VERSIONS]
    return max(common) if common else None
