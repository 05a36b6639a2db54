"""The relay cover: one filter that keeps every record any of several filters keeps, and the
check that a filter covers another — what a relay asks its upstream for so that it can serve
all its subscribers (docs/filters.md, "Relays"; :mod:`epochstream.transport.upstream`).

Pure: no sockets, no clock.
"""

from __future__ import annotations

from typing import Iterable

from .filter import MAX_CONJUNCTS, MAX_KEYS, Filter, _packb
from .schedule import MAX_WIRE_BYTES

__all__ = ["cover", "covers"]


def _read_columns(f: Filter, key) -> tuple | None:
    """The columns a record must keep for ``f`` to be applied to it again downstream: its
    projection plus every column its conjuncts and keys read (``None``: all columns)."""
    if f.columns is None:
        return None
    extra = [c for c, _, _ in f.where]
    if f.keys is not None and isinstance(key, str):
        extra.append(key)
    return tuple(dict.fromkeys((*f.columns, *extra)))


def _value_set(op: str, value) -> dict | None:
    """``{msgpack bytes: value}`` of the values an ``==``/``in`` conjunct admits (``None`` for
    other ops). Bytes keep ``1``, ``1.0`` and ``True`` apart, as the filter's identity does."""
    if op == "in":
        return {_packb(v): v for v in value}
    if op == "==":
        return {_packb(value): value}
    return None


def _keys_as_where(f: Filter, key: str) -> Filter:
    """``f`` with its keys as the conjunct ``(key, "in", keys)`` (the same records)."""
    if f.keys is None:
        return f
    return Filter(None, f.columns, (*f.where, (key, "in", f.keys)))


def cover(filters: Iterable[Filter], key=None) -> Filter:
    """A filter that keeps every record any of ``filters`` keeps, with every column each of
    them reads — what a relay asks its upstream for so that it can serve all of them
    (docs/filters.md, "Relays"). Not the exact union (a filter is a conjunction; the union of
    two is not one) but a cover built part by part:

    - ``keys``: the union of the key sets if every filter has one, else none;
    - ``columns``: the union of each filter's columns plus the columns its conjuncts and keys
      read, if every filter projects, else all columns;
    - ``where``: the conjuncts every filter has, plus, for each column that every filter
      restricts with ``==`` or ``in``, ``(column, "in", union of their values)``.

    ``key``: the topic's key column (a key function: keys still unite, no column is added).
    Bounds: a key or value set beyond :data:`MAX_KEYS` is dropped (the cover only grows), and so
    are keys, then ``where``, if the result would not fit :data:`MAX_WIRE_BYTES` on the wire.
    No filters: :class:`Filter` () (everything). :func:`covers` ``(cover(fs), f)`` holds for
    every ``f`` in ``fs``.

    >>> a = Filter(where=[("carrier", "==", "AA"), ("delay", ">", 10)])
    >>> b = Filter(where=[("carrier", "in", ["UA", "DL"]), ("delay", ">", 10)])
    >>> cover([a, b])
    Filter(where=(('delay', '>', 10), ('carrier', 'in', ('AA', 'DL', 'UA'))))
    """
    fs = list(dict.fromkeys(filters))
    if not fs:
        return Filter()
    if len(fs) == 1:
        f = fs[0]
        return f if f.columns is None else Filter(f.keys, _read_columns(f, key), f.where)
    if isinstance(key, str) and not all(f.keys is not None for f in fs):
        fs = _keys_as_conjuncts(fs, key)
    return _fitting(_united_keys(fs), _united_columns(fs, key), _shared_where(fs))


def _keys_as_conjuncts(fs: list[Filter], key: str) -> list[Filter]:
    """``fs`` with each filter's keys as a conjunct on the key column ``key``, to unite with the
    others' ``in``s (keys on a key column are a conjunct on it), and, if every filter projects,
    each projection widened to the columns the filter reads (:func:`_read_columns`)."""
    cols = [_read_columns(f, key) for f in fs]
    fs = [_keys_as_where(f, key) for f in fs]
    if all(c is not None for c in cols):
        fs = [Filter(f.keys, c, f.where) for f, c in zip(fs, cols)]
    return fs


def _united_keys(fs: list[Filter]) -> list | None:
    """The union of the key sets (deduplicated by msgpack bytes) if every filter has one and it
    holds at most :data:`~epochstream.filters.filter.MAX_KEYS` keys, else ``None`` (no keys)."""
    if not all(f.keys is not None for f in fs):
        return None
    ks: dict = {}
    for f in fs:
        ks.update((_packb(k), k) for k in f.keys)
    return list(ks.values()) if len(ks) <= MAX_KEYS else None


def _united_columns(fs: list[Filter], key) -> list | None:
    """The union of the columns each filter reads (:func:`_read_columns`) if every filter
    projects and there are at most :data:`~epochstream.filters.filter.MAX_CONJUNCTS`, else
    ``None`` (all columns)."""
    if not all(f.columns is not None for f in fs):
        return None
    columns = list(dict.fromkeys(c for f in fs for c in _read_columns(f, key)))
    return columns if len(columns) <= MAX_CONJUNCTS else None


def _shared_where(fs: list[Filter]) -> list:
    """The conjuncts every filter of ``fs`` (at least one) has, then for each column every filter
    restricts with ``==`` or ``in`` the conjunct :func:`_united_values`; at most
    :data:`~epochstream.filters.filter.MAX_CONJUNCTS` of them."""
    first, rest = fs[0], fs[1:]
    common = [c for c in first.where if all(c in f.where for f in rest)]
    united = []
    for col in dict.fromkeys(c for c, _, _ in first.where):
        conj = _united_values(fs, col)
        if conj is not None and conj not in common:
            united.append(conj)
    return (common + united)[:MAX_CONJUNCTS]


def _united_values(fs: list[Filter], col: str) -> tuple | None:
    """``(col, "in", union of the values)`` if every filter of ``fs`` restricts ``col`` with an
    ``==`` or ``in`` (its first such conjunct counts) and the union holds at most
    :data:`~epochstream.filters.filter.MAX_KEYS` values; else ``None``."""
    merged: dict = {}
    for f in fs:
        vs = next((_value_set(op, v) for c, op, v in f.where
                   if c == col and op in ("==", "in")), None)
        if vs is None:
            return None
        merged.update(vs)
    if len(merged) > MAX_KEYS:
        return None
    return (col, "in", tuple(merged.values()))


def _fitting(keys: list | None, columns: list | None, where: list) -> Filter:
    """The filter of ``keys``, ``columns`` and ``where`` if its msgpack form fits half of
    :data:`~epochstream.filters.schedule.MAX_WIRE_BYTES` (the cover travels in a schedule),
    else without keys, else without keys and ``where``: the cover only grows."""
    for attempt in ((keys, columns, where), (None, columns, where), (None, columns, None)):
        out = Filter(*attempt)
        if len(_packb(out.to_wire())) <= MAX_WIRE_BYTES // 2:
            return out
    return Filter(None, columns, None)

def covers(wide: Filter, narrow: Filter, key=None) -> bool:
    """True if every record ``narrow`` keeps passes ``wide`` with every column ``narrow``
    reads (so ``narrow`` can be applied again to what ``wide`` let through). Sound, not
    complete: ``False`` may be answered for a pair that is covered in fact, never ``True`` for
    one that is not. Per part: ``wide.keys`` contains ``narrow.keys``; ``wide.columns``
    contains the columns ``narrow`` reads; each conjunct of ``wide`` is one of ``narrow``'s,
    or an ``in`` (or ``==``) whose values contain those of an ``==``/``in`` of ``narrow`` on
    the same column.

    >>> covers(Filter(keys=["AA", "UA"]), Filter(keys=["AA"], where=[("delay", ">", 0)]))
    True
    >>> covers(Filter(keys=["AA"]), Filter())
    False
    """
    if wide.everything or (wide == narrow and wide.columns is None):
        return True
    if isinstance(key, str) and (wide.keys is None) != (narrow.keys is None):
        need = _read_columns(narrow, key)
        wide, narrow = _keys_as_where(wide, key), _keys_as_where(narrow, key)
        if need is not None:
            narrow = Filter(None, need, narrow.where)
    if wide.keys is not None:
        if narrow.keys is None:
            return False
        have = {_packb(k) for k in wide.keys}
        if any(_packb(k) not in have for k in narrow.keys):
            return False
    if wide.columns is not None:
        need = _read_columns(narrow, key)
        if need is None or not set(need) <= set(wide.columns):
            return False
    for conj in wide.where:
        if conj in narrow.where:
            continue
        col, op, value = conj
        if op != "in":
            return False
        have = _value_set(op, value)
        if not any(c == col and o in ("==", "in") and set(_value_set(o, v)) <= set(have)
                   for c, o, v in narrow.where):
            return False
    return True
