"""Helpers of tests/sockets/test_filters_e2e.py: records, an independent oracle of what a filter
selects (this file's reading of docs/filters.md, not epochstream's evaluator), and collectors of
what a subscriber hands out."""

from __future__ import annotations

import collections
import itertools
import operator

import pyarrow as pa

from epochstream.events import DataMessage, LowerFrontierUpdate
from epochstream.frontier import apply_changes

KEYS = "ABCD"
#: the columns of every record (Arrow topics send them with exactly this schema)
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("n", pa.int64()),
                    ("p", pa.int64()), ("i", pa.int64())])
COLUMNS = tuple(SCHEMA.names)

_MISSING = object()
_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b


def oracle_match(rec, f, key) -> bool:
    """``rec`` matches ``f`` (``key``: the topic's key column or key function): its key is in
    ``keys`` and every conjunct holds; a null fails every comparison, ``in`` matches a null iff
    the list holds one."""
    if f.keys is not None:
        k = key(rec) if callable(key) else rec.get(key, _MISSING)
        if k is _MISSING or not any(_same(k, x) for x in f.keys):
            return False
    for col, op, value in f.where:
        v = rec.get(col, _MISSING)
        if v is _MISSING:
            return False
        if op == "in":
            if not any(_same(v, x) for x in value):
                return False
        elif v is None or value is None or not _CMP[op](v, value):
            return False
    return True


def oracle_apply(f, records, key="k") -> list:
    out = [r for r in records if oracle_match(r, f, key)]
    if f.columns is not None:
        out = [{c: r[c] for c in f.columns if c in r} for r in out]
    return out


def canon(records) -> collections.Counter:
    """A batch of records (dicts, tuples, or an Arrow table/batch) as a multiset."""
    if isinstance(records, (pa.Table, pa.RecordBatch)):
        records = records.to_pylist()
    out = collections.Counter()
    for r in records:
        out[tuple(sorted(r.items())) if isinstance(r, dict) else tuple(r)] += 1
    return out


def in_force(order, program: list, t):
    """The filter of ``program`` (``[(boundary or None, Filter), ...]``) in force for ``t``."""
    f = program[0][1]
    for b, g in program[1:]:
        if any(order.le(x, t) for x in b):
            f = g
    return f


def expected_epochs(order, published: dict, join_uppers, program: list, key="k") -> dict:
    """``{t: multiset}`` a subscriber must hand out: every epoch its join does not drop (``t``
    not ``<=`` an upper of a snapshot) whose records matching the filter in force are not
    none, exactly those records."""
    out = {}
    for t, recs in published.items():
        if any(order.le(t, u) for u in join_uppers):
            continue
        got = oracle_apply(in_force(order, program, t), recs, key)
        if got:
            out[t] = canon(got)
    return out


def antichain(order, times) -> frozenset:
    times = set(times)
    return frozenset(t for t in times if not any(o != t and order.le(o, t) for o in times))


def merged_states(order, per_partition: list) -> set:
    """Every merged lower frontier a subscriber may see: the minimal elements of the union of
    one recorded state per partition."""
    return {antichain(order, itertools.chain.from_iterable(combo))
            for combo in itertools.product(*per_partition)}


def collect_events(sub, order, timeout: float = 10.0):
    """Consume ``sub.events()`` to the end: ``(epochs, frontier states)`` where ``epochs`` is
    ``{t: multiset}`` of the epochs completed (each released when the frontier passed it), and
    states the merged lower frontier after each update. Asserts that no data arrives for an
    epoch already complete, nor twice for one released."""
    frontier: dict = {}
    data: dict = collections.defaultdict(collections.Counter)
    released: dict = {}
    states = []
    for ev in sub.events(timeout=timeout):
        if isinstance(ev, DataMessage):
            t = ev.time
            assert t not in released, f"data at {t} after its epoch completed"
            assert any(order.le(x, t) for x in frontier), f"data at {t} behind {list(frontier)}"
            data[t] += canon(ev.data)
        elif isinstance(ev, LowerFrontierUpdate):
            apply_changes(frontier, ev.updates)
            states.append(frozenset(frontier))
            for t in list(data):
                if t not in released and not any(order.le(x, t) for x in frontier):
                    released[t] = data[t]
    assert not frontier, f"the stream ended with frontier {list(frontier)}"
    for t in data:
        released.setdefault(t, data[t])
    return {t: c for t, c in released.items() if c}, states


def to_arrow(records: list, as_batch: bool):
    if as_batch:
        return pa.RecordBatch.from_pylist(records, schema=SCHEMA)
    return pa.Table.from_pylist(records, schema=SCHEMA)
