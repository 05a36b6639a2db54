"""The network catalog's messages: which catalog methods cross the network (:data:`OPS`), how
their arguments, results and exceptions are encoded (msgpack, no pickle), and the limits a
request must keep. Shared by the client (:mod:`epochstream.catalog.client`) and the server
(:mod:`epochstream.catalog.server`); no I/O here.

Frames (ZeroMQ multipart). A client's DEALER sends ``[request id, body]``; the server's ROUTER
sees ``[identity, request id, body]`` and answers ``[identity, request id, reply]``: every frame
between the identity and the last one (the *envelope*: at most :data:`MAX_ENVELOPE_FRAMES`
frames of at most :data:`MAX_ENVELOPE_BYTES` bytes each) is echoed unchanged, so a REQ socket
(envelope ``[b""]``) works as well.

Body: a msgpack map ``{"op": name, "args": [...], "kwargs": {...}}`` (``args`` and ``kwargs``
optional; at most :data:`MAX_ARGS` of each); ``name`` must be in :data:`OPS`. Reply: a msgpack
map ``{"ok": result}`` or ``{"error": {"type": name, "args": [...], "attrs": {...}}}``, where
``name`` is an exception class of :mod:`epochstream.errors` (or one of a few builtins:
:data:`BUILTIN_ERRORS`) and ``attrs`` its attributes (e.g. :class:`TopicNotFound`'s
``existing``); :func:`raise_error` raises the same type with the same message and attributes.

Values: msgpack's own types, plus two markers so that results read back with the types the
embedded catalog returns. An array whose first element is the empty extension value
:data:`EXT_TUPLE` (``ext(1, b"")``) is a tuple of the other elements (times and frontiers are
tuples); one that starts with :data:`EXT_RECORD` (``ext(2, b"")``) is ``[marker, type name,
field values...]`` of one of the dataclasses in :data:`RECORD_TYPES` (``TopicInfo``,
``PartitionInfo``, ``EpochRecord``, ``HistoryState``, ``SegmentStat``, ``DurableInfo``,
``GroupInfo``, ``Claimed``, ``ClaimView``, ``GroupEpoch``, ``EpochState``, ``Grant``).
Decoding builds only those types (their ``__init__`` stores fields, nothing else runs); any
other extension, or a marker anywhere but at the head of an array, is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
from collections.abc import Mapping
from typing import Any

import msgpack

from .. import errors
from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
from .history_records import DurableInfo, EpochRecord, HistoryState
from .records import PartitionInfo, TopicInfo
from ..errors import CatalogError
from ..leases import EpochState
from ..retention import SegmentStat
from ..security import Grant

__all__ = ["OPS", "RECORD_TYPES", "BUILTIN_ERRORS", "EXT_TUPLE", "EXT_RECORD", "MAX_ARGS",
           "MAX_ENVELOPE_FRAMES", "MAX_ENVELOPE_BYTES", "MAX_REQUEST_BYTES", "encode",
           "decode", "check_request", "error_reply", "raise_error"]

OPS = frozenset({
    # topics and partitions (catalog.py)
    "create_topic", "drop_topic", "topics", "lookup", "register_partition", "close_partition",
    "record_upper", "heartbeat",
    # the epoch logs' index and durable subscriptions (catalog/history.py)
    "history_state", "history_states", "history_begin", "history_commit", "history_trim",
    "history_uploaded",
    # retention leases and limits (catalog/retention_leases.py)
    "retention_acquire", "retention_release", "retention_record", "retention_limits",
    "history_epochs", "history_epoch", "durables", "durable", "durable_claim", "durable_ack",
    "durable_release", "durable_renew", "durable_reset", "durable_drop",
    # consumer groups (catalog/groups.py): group_claim takes a callable, so the client runs it
    # as group_claim_read + its decide + group_claim_apply
    "group_open", "group_info", "groups", "group_drop", "group_settle", "group_stop",
    "group_reset", "group_claim_read", "group_claim_apply", "group_epochs",
    # grants (catalog.py, docs/security.md)
    "grant", "revoke", "grants",
    # the service itself
    "hello",
})
"""The requests a catalog server answers: public methods of
:class:`~epochstream.catalog.Catalog` by name, and ``hello`` (the server's description). Nothing
else is ever called, whatever a request names."""

RECORD_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    TopicInfo, PartitionInfo, EpochRecord, HistoryState, SegmentStat, DurableInfo, GroupInfo,
    Claimed, ClaimView, GroupEpoch, EpochState, Grant)}
"""The dataclasses a value may carry (:data:`EXT_RECORD`), by class name."""

BUILTIN_ERRORS: dict[str, type] = {cls.__name__: cls for cls in (
    TypeError, ValueError, KeyError, IndexError, LookupError, OverflowError, NotImplementedError)}
"""Builtin exceptions re-raised as themselves (others become :class:`CatalogError`)."""

_ERRORS: dict[str, type] = {**BUILTIN_ERRORS, **{name: getattr(errors, name)
                                                 for name in errors.__all__}}

EXT_TUPLE = 1
EXT_RECORD = 2
MAX_ARGS = 32
MAX_ENVELOPE_FRAMES = 4
MAX_ENVELOPE_BYTES = 64
MAX_REQUEST_BYTES = 64 << 20
"""Bytes of one request (ZeroMQ ``MAXMSGSIZE`` of the server's socket: a longer message closes
the connection, and the client's request times out)."""

_FIELDS = {name: tuple(f.name for f in dataclasses.fields(cls))
           for name, cls in RECORD_TYPES.items()}
_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}


class _Mark:
    """The decoded marker of a tuple or a record array (module docstring)."""

    __slots__ = ("code",)

    def __init__(self, code: int):
        self.code = code

    def __repr__(self) -> str:
        return f"<catalog_rpc marker {self.code}>"


_TUPLE, _RECORD = _Mark(EXT_TUPLE), _Mark(EXT_RECORD)
_TUPLE_EXT, _RECORD_EXT = msgpack.ExtType(EXT_TUPLE, b""), msgpack.ExtType(EXT_RECORD, b"")


def _default(obj: Any, lenient: bool) -> Any:
    if isinstance(obj, tuple):
        return [_TUPLE_EXT, *obj]
    name = _NAMES.get(type(obj))
    if name is not None:
        return [_RECORD_EXT, name, *[getattr(obj, f) for f in _FIELDS[name]]]
    for kind in (bool, int, float, str, bytes):  # subclasses (e.g. an IntEnum, a str URL)
        if isinstance(obj, kind):
            return kind(obj)  # type: ignore[arg-type]
    if lenient:  # what a caller may pass where the embedded catalog iterates or converts
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        if hasattr(obj, "__index__"):
            return operator.index(obj)
        if isinstance(obj, Mapping):
            return dict(obj)
        if isinstance(obj, (set, frozenset)) or hasattr(obj, "__iter__"):
            return list(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} to or from the catalog service")


_DEFAULTS = {lenient: functools.partial(_default, lenient=lenient) for lenient in (False, True)}


def encode(obj: Any, *, lenient: bool = False) -> bytes:
    """``obj`` as msgpack, tuples and records marked (module docstring). ``lenient`` (the
    client's arguments): paths become strings, ``__index__`` objects ints, mappings dicts, other
    iterables (an ``Antichain``, a set) lists. Raises ``TypeError`` (or ``ValueError``) for
    anything else that msgpack cannot carry."""
    return msgpack.packb(obj, default=_DEFAULTS[lenient], strict_types=True, use_bin_type=True)


def _ext_hook(code: int, data: bytes) -> Any:
    if data == b"" and code == EXT_TUPLE:
        return _TUPLE
    if data == b"" and code == EXT_RECORD:
        return _RECORD
    raise ValueError(f"unknown msgpack extension type {code} (or a marker with data)")


def _record(items: list) -> Any:
    name = items[1] if len(items) > 1 else None
    if not isinstance(name, str) or name not in RECORD_TYPES:
        raise ValueError(f"a record array is [marker, type name, fields...] with a type of "
                         f"{sorted(RECORD_TYPES)}")
    if len(items) - 2 != len(_FIELDS[name]):
        raise ValueError(f"a {name} has {len(_FIELDS[name])} fields, got {len(items) - 2}")
    return RECORD_TYPES[name](*items[2:])


def _list_hook(items: list) -> Any:
    """An array as decoded: a tuple, a record, or the list (a client trusting its server)."""
    if items and items[0].__class__ is _Mark:
        return tuple(items[1:]) if items[0] is _TUPLE else _record(items)
    return items


def _list_hook_strict(items: list) -> Any:
    """:func:`_list_hook`, refusing a marker anywhere but at the head (the server)."""
    if _TUPLE in items[1:] or _RECORD in items[1:]:
        raise ValueError("a tuple or record marker must be the first element of its array")
    return _list_hook(items)


def _map_hook(items: dict) -> dict:
    if any(isinstance(v, _Mark) for v in items.values()):
        raise ValueError("a tuple or record marker must be the first element of its array")
    return items


def decode(data: bytes, *, strict: bool = True) -> Any:
    """The value encoded in ``data``. ``strict`` (the server, reading requests): map keys must
    be strings and a marker can only head an array; without it (the client, reading its
    server's replies) maps may have other keys (``history_states``' partition numbers). Raises
    ``ValueError`` (or another ``Exception``) for malformed input."""
    if not strict:
        return msgpack.unpackb(data, ext_hook=_ext_hook, list_hook=_list_hook, raw=False,
                               strict_map_key=False, use_list=True)
    value = msgpack.unpackb(data, ext_hook=_ext_hook, list_hook=_list_hook_strict,
                            object_hook=_map_hook, raw=False, strict_map_key=True,
                            use_list=True)
    if isinstance(value, _Mark):
        raise ValueError("a bare tuple or record marker")
    return value


def check_request(req: Any) -> tuple[str, list, dict]:
    """``(op, args, kwargs)`` of a decoded request body (``retry``, the number of earlier
    attempts of the same request, is read by the server from the body itself). Raises :class:`CatalogError` naming
    what is wrong: not a map, unknown keys, an op not in :data:`OPS` (private names included),
    ``args`` not an array or ``kwargs`` not a map of strings, more than :data:`MAX_ARGS`."""
    if not isinstance(req, dict):
        raise CatalogError(f"a catalog request must be a map {{op, args, kwargs}}, got "
                           f"{type(req).__name__}")
    extra = set(req) - {"op", "args", "kwargs", "retry"}
    if extra:
        raise CatalogError(f"a catalog request has only op, args, kwargs, retry; got also "
                           f"{sorted(map(str, extra))}")
    if not isinstance(req.get("retry", 0), int) or isinstance(req.get("retry", 0), bool):
        raise CatalogError("a catalog request's retry is the number of earlier attempts, an int")
    op, args, kwargs = req.get("op"), req.get("args", []), req.get("kwargs", {})
    if not isinstance(op, str) or op not in OPS:
        shown = op if isinstance(op, str) and len(op) <= 80 else type(op).__name__
        raise CatalogError(f"unknown catalog operation {shown!r}; known: {', '.join(sorted(OPS))}")
    if isinstance(args, tuple):
        args = list(args)
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise CatalogError(f"{op}: args must be an array of at most {MAX_ARGS} values")
    if not isinstance(kwargs, dict) or len(kwargs) > MAX_ARGS or \
            not all(isinstance(k, str) and k.isidentifier() and not k.startswith("_")
                    for k in kwargs):
        raise CatalogError(f"{op}: kwargs must be a map of at most {MAX_ARGS} keyword names")
    return op, args, kwargs


def _plain_attrs(exc: BaseException) -> dict:
    out = {}
    for k, v in vars(exc).items():
        if k.startswith("_"):
            continue
        try:
            encode(v)
        except Exception:  # noqa: BLE001 - an attribute that cannot travel is left out
            continue
        out[k] = v
    return out


def error_reply(exc: BaseException) -> dict:
    """The reply for ``exc`` raised while serving a request: its type (an
    :mod:`epochstream.errors` class or one of :data:`BUILTIN_ERRORS`, else the nearest such base
    class, with the original type's name in front of the message), ``args`` and attributes."""
    cls = type(exc)
    name = cls.__name__
    if _ERRORS.get(name) is cls:
        args = list(exc.args)
    else:
        base = next((c for c in cls.__mro__ if _ERRORS.get(c.__name__) is c), CatalogError)
        name, args = base.__name__, [f"{cls.__name__}: {exc}"]
    try:
        encode(args)
    except Exception:  # noqa: BLE001
        args = [str(exc)]
    return {"error": {"type": name, "args": args, "attrs": _plain_attrs(exc)}}


def raise_error(error: Any, where: str = "") -> None:
    """Raise the exception an ``{"error": ...}`` reply describes: the same type, message
    (``args``) and attributes; an unknown type or a malformed description raises
    :class:`CatalogError` (``where`` names the service, for the message)."""
    if not isinstance(error, dict) or not isinstance(error.get("type"), str):
        raise CatalogError(f"catalog service {where}: malformed error reply {error!r}")
    cls = _ERRORS.get(error["type"])
    args = error.get("args")
    args = tuple(args) if isinstance(args, (list, tuple)) else (str(args),)
    if cls is None:
        raise CatalogError(f"catalog service {where}: {error['type']}: "
                           f"{' '.join(map(str, args))}")
    exc = cls.__new__(cls)
    exc.args = args
    attrs = error.get("attrs")
    if isinstance(attrs, dict):
        for k, v in attrs.items():
            if isinstance(k, str) and not k.startswith("_"):
                try:
                    setattr(exc, k, v)
                except Exception:  # noqa: BLE001 - a read-only attribute
                    pass
    raise exc

