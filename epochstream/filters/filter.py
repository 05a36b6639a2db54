"""The record filter a subscriber asks for — keys, a projection, a row predicate — evaluated
the same way by the publisher (before sending) and by the subscriber (re-checking), on dict
records and on Arrow batches (docs/filters.md).

Pure: no sockets, no clock. pyarrow is imported only to filter Arrow batches.

**A filter** (:class:`Filter`): ``keys`` (a set of values of the topic's key), ``columns`` (a
projection) and ``where`` (a conjunction of ``(column, op, value)`` with ``op`` one of
:data:`OPS`; ``in`` takes a list of values). A record matches when its key is in ``keys`` (if
given) and every conjunct holds; matching records are projected on ``columns`` (if given).
Records are dicts (msgpack topics: a record lacking a column does not match a conjunct on it
and keeps only the columns it has) or Arrow rows (evaluated with ``pyarrow.compute``; a column
the batch lacks is a :class:`FilterError`). Values are msgpack scalars: ``None``, bool, int
(-2**63 .. 2**64-1), float, str, bytes. Nulls as in Arrow (and SQL), for dict records too: a
``None`` on either side of ``== != < <= > >=`` does not match; ``in`` (and ``keys``) matches
``None`` iff the list holds ``None``, and NaN iff it holds NaN.

:func:`union_records` and :func:`union_arrow` apply several filters at once: what a publisher
sends while a subscriber's filter changes (:mod:`epochstream.filters.schedule`).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable

import msgpack

from ..errors import FilterError

__all__ = ["Filter", "FilterError", "OPS", "MAX_CONJUNCTS", "MAX_KEYS", "union_records",
           "union_arrow"]

OPS = ("==", "!=", "<", "<=", ">", ">=", "in")
"""The comparison operators of a ``where`` conjunct."""
MAX_CONJUNCTS = 64
"""At most this many ``where`` conjuncts (and columns) in one filter."""
MAX_KEYS = 100_000
"""At most this many keys (and ``in`` values) in one filter."""
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what msgpack carries

_PY_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge}
_SCALARS = (type(None), bool, int, float, str, bytes)


def _scalar(v, what: str):
    if type(v) not in _SCALARS:
        raise FilterError(f"{what} must be None, a bool, int, float, str or bytes, got "
                          f"{type(v).__name__}")
    if type(v) is int and not _INT_MIN <= v <= _INT_MAX:
        raise FilterError(f"{what} {v} is out of range (-2**63 .. 2**64-1)")
    return v


def _values(values, what: str) -> tuple:
    """Scalars, deduplicated and sorted by their msgpack bytes (``1``, ``1.0`` and ``True``
    stay apart: they say different things on the wire and to Arrow)."""
    vs = [_scalar(v, what) for v in values]
    if len(vs) > MAX_KEYS:
        raise FilterError(f"at most {MAX_KEYS} {what}s, got {len(vs)}")
    packed = {_packb(v): v for v in vs}
    return tuple(packed[b] for b in sorted(packed))


class _Members:
    """Membership in a tuple of scalars by hash (a key set may hold 100,000 values, looked up
    for every record): ``None`` matches ``None``, NaN matches NaN (as Arrow's ``is_in``)."""

    __slots__ = ("set", "nan")

    def __init__(self, values: tuple):
        self.nan = any(type(v) is float and v != v for v in values)
        self.set = frozenset(v for v in values if not (type(v) is float and v != v))

    def __contains__(self, v) -> bool:
        try:
            if v in self.set:
                return True
        except TypeError:  # an unhashable record value
            return False
        return self.nan and isinstance(v, float) and v != v


class Filter:
    """``Filter(keys=None, columns=None, where=None)``: immutable, hashable, normalised (keys
    and ``in`` values sorted by their msgpack bytes, so equal filters compare equal and share
    one class at the publisher). Raises :class:`FilterError` for a malformed filter.

    >>> f = Filter(keys={"AA", "UA"}, columns=["carrier", "delay"], where=[("delay", ">", 10)])
    >>> f.match({"carrier": "AA", "delay": 12, "day": 1}, key="carrier")
    True
    >>> f.apply_records([{"carrier": "AA", "delay": 12, "day": 1},
    ...                  {"carrier": "AA", "delay": 3}], key="carrier")
    [{'carrier': 'AA', 'delay': 12}]
    """

    __slots__ = ("keys", "columns", "where", "_ident", "_hash", "_keyset", "_conj")

    def __init__(self, keys: Iterable | None = None, columns: Iterable[str] | None = None,
                 where: Iterable | None = None):
        if keys is not None:
            if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
                raise FilterError(f"keys must be a set or list of values, got "
                                  f"{type(keys).__name__}")
            keys = _values(keys, "key")
        if columns is not None:
            if isinstance(columns, (str, bytes)) or not isinstance(columns, Iterable):
                raise FilterError(f"columns must be a list of column names, got "
                                  f"{type(columns).__name__}")
            cs = list(columns)
            if not cs or len(cs) > MAX_CONJUNCTS or any(type(c) is not str for c in cs):
                raise FilterError(f"columns must be 1..{MAX_CONJUNCTS} str names, got {cs!r:.80}")
            columns = tuple(dict.fromkeys(cs))
        if where is not None and (isinstance(where, (str, bytes))
                                  or not isinstance(where, Iterable)):
            raise FilterError(f"where must be a list of (column, op, value), got "
                              f"{type(where).__name__}")
        conj = []
        for c in (where or ()):
            if not isinstance(c, (tuple, list)) or len(c) != 3:
                raise FilterError(f"a where conjunct must be (column, op, value), got {c!r:.80}")
            col, op, value = c
            if type(col) is not str:
                raise FilterError(f"a where column must be a str, got {col!r:.80}")
            if type(op) is not str or op not in OPS:
                raise FilterError(f"unknown where op {op!r:.20} (ops: {' '.join(OPS)})")
            if op == "in":
                if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                    raise FilterError(f"'in' takes a list of values, got {value!r:.80}")
                value = _values(value, "'in' value")
            else:
                value = _scalar(value, f"the value of {col} {op}")
            conj.append((col, op, value))
        if len(conj) > MAX_CONJUNCTS:
            raise FilterError(f"at most {MAX_CONJUNCTS} where conjuncts, got {len(conj)}")
        self.keys: tuple | None = keys
        self.columns: tuple | None = columns
        self.where: tuple = tuple(conj)
        # identity: the canonical wire form (so 1, 1.0 and True differ, and NaN equals NaN)
        self._ident = _packb(self.to_wire())
        self._hash = hash(self._ident)
        self._keyset = None if keys is None else _Members(keys)
        # (column, _Members for "in" or the comparison, is "in", value) for match()
        self._conj: tuple[tuple[str, Any, bool, Any], ...] = tuple(
            (col, _Members(v) if op == "in" else _PY_OPS[op], op == "in", v)
            for col, op, v in self.where)

    # -- identity --------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, Filter) and self._ident == other._ident

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        parts = [f"{n}={getattr(self, n)!r}" for n in ("keys", "columns")
                 if getattr(self, n) is not None]
        if self.where:
            parts.append(f"where={self.where!r}")
        return f"Filter({', '.join(parts)})"

    @property
    def everything(self) -> bool:
        """True for the filter that keeps every record whole (no keys, columns or where)."""
        return self.keys is None and self.columns is None and not self.where

    # -- wire ------------------------------------------------------------------------------
    def to_wire(self) -> dict:
        """A msgpack-able map: ``{"keys": [...], "columns": [...], "where": [[c, op, v]...]}``
        (absent parts left out)."""
        out: dict = {}
        if self.keys is not None:
            out["keys"] = list(self.keys)
        if self.columns is not None:
            out["columns"] = list(self.columns)
        if self.where:
            out["where"] = [[c, op, list(v) if op == "in" else v] for c, op, v in self.where]
        return out

    @classmethod
    def from_wire(cls, obj) -> "Filter":
        """The :class:`Filter` of a decoded :meth:`to_wire` map; :class:`FilterError` for
        anything else (other keys, wrong types)."""
        if type(obj) is not dict or not set(obj) <= {"keys", "columns", "where"}:
            raise FilterError(f"a filter must be a map with keys, columns, where; got "
                              f"{obj!r:.80}")
        for name in ("keys", "columns", "where"):
            if name in obj and not isinstance(obj[name], (list, tuple)):
                raise FilterError(f"filter.{name} must be an array, got {obj[name]!r:.80}")
        return cls(obj.get("keys"), obj.get("columns"), obj.get("where"))

    # -- evaluation: dict records ----------------------------------------------------------
    def match(self, record, key: str | Callable | None = None) -> bool:
        """Whether one record matches (``key``: the topic's key column or key function).
        A dict lacking a column fails the conjunct on it; a comparison Python refuses (e.g.
        ``str < int``) fails it too; nulls as in Arrow (module docstring)."""
        if self._keyset is not None:
            k = _key_of(record, key)
            if k is _MISSING or k not in self._keyset:
                return False
        if self._conj:
            if not isinstance(record, dict):
                raise FilterError(f"where= needs dict records (or an Arrow topic), got "
                                  f"{type(record).__name__}")
            for col, test, is_in, value in self._conj:
                v = record.get(col, _MISSING)
                if v is _MISSING:
                    return False
                if is_in:
                    if v not in test:
                        return False
                elif v is None or value is None:
                    return False
                else:
                    try:
                        if not test(v, value):
                            return False
                    except TypeError:
                        return False
        return True

    def project(self, record):
        """``record`` cut to :attr:`columns` (dicts only; others unchanged when no columns)."""
        if self.columns is None:
            return record
        if not isinstance(record, dict):
            raise FilterError(f"columns= needs dict records (or an Arrow topic), got "
                              f"{type(record).__name__}")
        return {c: record[c] for c in self.columns if c in record}

    def apply_records(self, records, key: str | Callable | None = None) -> list:
        """The matching records of a batch, projected."""
        if self.everything:
            return list(records)
        project = self.project
        return [project(r) for r in records if self.match(r, key)]

    # -- evaluation: Arrow -----------------------------------------------------------------
    def mask(self, batch, key: str | None = None):
        """The boolean ``pyarrow`` mask of the matching rows of a ``RecordBatch``/``Table``, or
        ``None`` if every row matches. :class:`FilterError` for a missing column or values
        that cannot be compared with it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = set(batch.schema.names)
        terms = []
        errors = (pa.ArrowException, TypeError, ValueError, OverflowError)  # never past here
        if self.keys is not None:
            if not isinstance(key, str):
                raise FilterError("keys= on an Arrow topic needs the topic's key column "
                                  "(Publisher(..., key='column'))")
            _has(names, key, "key")
            arr = batch.column(key)
            try:
                terms.append(pc.is_in(arr, value_set=_array(self.keys, arr)))
            except errors as e:
                raise FilterError(f"keys {self.keys!r:.40}: cannot compare with key column "
                                  f"{key!r} of type {arr.type}: {e}") from None
        for col, op, value in self.where:
            _has(names, col, "where")
            arr = batch.column(col)
            try:
                if op == "in":
                    terms.append(pc.is_in(arr, value_set=_array(value, arr)))
                else:
                    terms.append(getattr(pc, _PC_OPS[op])(arr, pa.scalar(value)))
            except errors as e:
                raise FilterError(f"where {col} {op} {value!r:.40}: cannot compare with column "
                                  f"of type {arr.type}: {e}") from None
        if not terms:
            return None
        m = terms[0]
        for t in terms[1:]:
            m = pc.and_kleene(m, t)
        return pc.fill_null(m, False)

    def apply_arrow(self, batch, key: str | None = None):
        """The matching rows of a ``RecordBatch``/``Table``, projected (same type back)."""
        m = self.mask(batch, key)
        if m is not None:
            batch = batch.filter(m)
        if self.columns is not None:
            names = set(batch.schema.names)
            for c in self.columns:
                _has(names, c, "columns")
            batch = batch.select(list(self.columns))
        return batch


_PC_OPS = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal",
           ">": "greater", ">=": "greater_equal"}
_MISSING = object()
_packb = msgpack.Packer(use_bin_type=True).pack


def _key_of(record, key):
    if key is None:
        raise FilterError("keys= needs a topic key: the publisher declares it "
                          "(Publisher(..., key='column' or a function))")
    if callable(key):
        return key(record)
    if isinstance(record, dict):
        return record.get(key, _MISSING)
    raise FilterError(f"key column {key!r} needs dict records, got {type(record).__name__}")


def _has(names: set, col: str, what: str) -> None:
    if col not in names:
        raise FilterError(f"{what} names column {col!r}, which the records lack (columns: "
                          f"{', '.join(sorted(names))})")


def _array(values: tuple, arr):
    """The value set of an ``in`` (or ``keys``) for column ``arr``: of the column's type when
    it holds only nulls (or nothing). Raises what pyarrow raises (mixed types, out of range)."""
    import pyarrow as pa
    vs = pa.array(list(values))
    if vs.type == pa.null():
        vs = pa.array(list(values), type=arr.type)
    return vs


# =============================================================================================
# the union of several filters (what a publisher sends during a filter change)

def union_records(filters: tuple, records, key=None) -> list:
    """Records matching any of ``filters``, each projected on the union of their columns
    (all columns if one of them keeps all)."""
    if len(filters) == 1:
        return filters[0].apply_records(records, key)
    cols = _union_columns(filters)
    out = []
    for r in records:
        if any(f.match(r, key) for f in filters):
            out.append(r if cols is None else {c: r[c] for c in cols if c in r})
    return out


def union_arrow(filters: tuple, batch, key=None):
    """Rows matching any of ``filters``, with the union of their columns (Arrow)."""
    import pyarrow.compute as pc

    if len(filters) == 1:
        return filters[0].apply_arrow(batch, key)
    masks = [f.mask(batch, key) for f in filters]
    if all(m is not None for m in masks):
        m = masks[0]
        for x in masks[1:]:
            m = pc.or_(m, x)
        batch = batch.filter(m)
    cols = _union_columns(filters)
    if cols is not None:
        names = set(batch.schema.names)
        for c in cols:
            _has(names, c, "columns")
        batch = batch.select(list(cols))
    return batch


def _union_columns(filters) -> tuple | None:
    if any(f.columns is None for f in filters):
        return None
    return tuple(dict.fromkeys(c for f in filters for c in f.columns))
