"""The pure parts of filtering at the source (issue 14): :mod:`epochstream.filters` (Filter,
FilterSchedule, boundary, union_records / union_arrow) and
:mod:`epochstream.transport.interest` (what a publisher sends one peer).

Each property is checked against this file's own reading of the semantics (docs/filters.md and
the module docstrings), not against the code under test:

- a record matches when its key is in ``keys`` and every ``where`` conjunct holds; a null
  (``None``) fails every comparison and matches ``in`` only if the list holds ``None`` (what
  ``pyarrow.compute`` does, which dict records must agree with: "the same evaluator");
- a program's filter in force for ``t`` is the last entry whose boundary ``t`` is at or beyond;
  a publisher sends the union of that entry and every later one; the subscriber re-filters
  what it receives by the filter in force, which must give exactly the epoch under it;
- ``boundary(order, uppers)``: the minimal times not ``<=`` any upper (checked exhaustively on
  small grids).
"""

from __future__ import annotations

import collections
import doctest
import itertools
import math
import operator

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings, strategies as st

import epochstream.filters
from epochstream.errors import FilterError, ProtocolError
from epochstream.filters import (MAX_CONJUNCTS, MAX_ENTRIES, MAX_KEYS, OPS, Filter, FilterSchedule,
                                 boundary, union_arrow, union_records, cover, covers)
from epochstream.order import TOTAL, check_time, dual, product
from epochstream.transport.interest import ALL, SKIP, Interest, sent_filter

P2 = product(2)
P3 = product(3)


def _wire(obj):
    """``obj`` as it comes out of the wire (msgpack, arrays as tuples)."""
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), use_list=False, raw=False,
                           strict_map_key=False)


def _packed(f: Filter) -> bytes:
    return msgpack.packb(f.to_wire(), use_bin_type=True)


# =============================================================================================
# the module's doctests

def test_module_doctests_pass():
    result = doctest.testmod(epochstream.filters, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0, result


# =============================================================================================
# Filter: normalisation, equality, hash, wire

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.binary(max_size=3))
columns_names = st.sampled_from(["a", "b", "c", "k", "é", ""])
conjuncts = st.one_of(
    st.tuples(columns_names, st.sampled_from([op for op in OPS if op != "in"]), scalars),
    st.tuples(columns_names, st.just("in"), st.lists(scalars, max_size=4)))


@st.composite
def filters(draw):
    keys = draw(st.none() | st.lists(scalars, max_size=5))
    columns = draw(st.none() | st.lists(columns_names, min_size=1, max_size=4))
    where = draw(st.none() | st.lists(conjuncts, max_size=4))
    return keys, columns, where


def test_normalisation_examples():
    f = Filter(keys={"UA", "AA", "UA"}, columns=["b", "a", "b"],
               where=[("x", "in", [3, 1, 3]), ["y", ">", 2]])
    assert f.keys == ("AA", "UA")
    assert f.columns == ("b", "a")  # order kept (it is the projection's order), duplicates dropped
    assert f.where == (("x", "in", (1, 3)), ("y", ">", 2))
    assert f == Filter(keys=["AA", "UA"], columns=("b", "a"), where=(("x", "in", (3, 1)), ("y", ">", 2)))
    assert f != Filter(keys=["AA", "UA"], columns=("a", "b"), where=(("x", "in", (3, 1)), ("y", ">", 2)))
    assert Filter().everything and Filter(where=[]).everything and Filter(where=None).everything
    assert not Filter(keys=[]).everything and not Filter(columns=["a"]).everything
    assert Filter(keys=[]).to_wire() == {"keys": []}  # matches nothing, and says so
    assert Filter(keys=[]).apply_records([{"k": 1}], key="k") == []


def test_repr_does_not_hide_an_empty_key_set():
    """``Filter(keys=[])`` matches nothing; its repr must not read like ``Filter()``, which
    matches everything."""
    assert repr(Filter(keys=[])) != repr(Filter())


@given(filters(), st.randoms())
def test_equal_filters_are_equal_whatever_the_order_of_their_parts(parts, rnd):
    keys, columns, where = parts
    try:
        f = Filter(keys, columns, where)
    except FilterError:
        return
    k2 = None if keys is None else rnd.sample(keys, len(keys))
    w2 = None if where is None else [
        (c, op, rnd.sample(v, len(v)) if op == "in" else v) for c, op, v in where]
    g = Filter(k2, columns, w2)
    assert f == g and hash(f) == hash(g)
    assert _packed(f) == _packed(g)


@given(filters(), filters())
def test_equality_is_equality_of_the_canonical_wire_form(a, b):
    """Two filters are equal (and share one encoding at a publisher) iff they say the same thing
    on the wire: ``Filter(keys=[1]) != Filter(keys=[True])``, and a NaN value compares equal to
    itself."""
    try:
        f, g = Filter(*a), Filter(*b)
    except FilterError:
        return
    assert (f == g) == (_packed(f) == _packed(g))
    if f == g:
        assert hash(f) == hash(g)


def test_equality_examples_type_and_nan():
    assert Filter(keys=[1]) != Filter(keys=[True])
    assert Filter(where=[("x", "==", 1)]) != Filter(where=[("x", "==", 1.0)])
    nan = Filter(where=[("x", "==", float("nan"))])
    assert nan == Filter(where=[("x", "==", float("nan"))])
    assert hash(nan) == hash(Filter.from_wire(_wire(nan.to_wire())))


@given(filters())
def test_wire_round_trip(parts):
    try:
        f = Filter(*parts)
    except FilterError:
        return
    g = Filter.from_wire(_wire(f.to_wire()))
    assert g == f and hash(g) == hash(f)
    assert _packed(g) == _packed(f)
    assert g.everything == f.everything


# -- garbage: FilterError and nothing else ---------------------------------------------------
class _Weird:
    def __repr__(self):
        return "<weird>"


py_garbage_leaves = st.one_of(
    scalars, st.integers(2**64, 2**70), st.integers(-2**70, -2**63 - 1),
    st.complex_numbers(allow_nan=False, max_magnitude=10), st.just(object()),
    st.just(_Weird()), st.just(int), st.just(Ellipsis), st.builds(bytearray, st.binary(max_size=3)),
    st.just(math.inf), st.just(-0.0))
py_garbage = st.recursive(
    py_garbage_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner, inner)
    | st.frozensets(st.integers(-2, 2) | st.text(max_size=2), max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)


@given(py_garbage, py_garbage, py_garbage)
def test_python_api_garbage_is_a_filter_error_or_a_filter_that_travels(keys, columns, where):
    """Whatever a caller passes, ``Filter(...)`` raises FilterError or makes a filter that can
    travel (msgpack) and comes back equal — never TypeError, OverflowError, ..."""
    for args in ((keys, None, None), (None, columns, None), (None, None, where),
                 (keys, columns, where)):
        try:
            f = Filter(*args)
        except FilterError:
            continue
        assert Filter.from_wire(_wire(f.to_wire())) == f


@pytest.mark.parametrize("kwargs", [
    {"where": 5}, {"where": True}, {"where": 0}, {"where": 1.5}, {"where": "abc"},
    {"where": [("a", "==")]}, {"where": [("a", "=", 1)]}, {"where": [("a", "IN", [1])]},
    {"where": [(1, "==", 1)]}, {"where": [("a", "in", 5)]}, {"where": [("a", "in", "ab")]},
    {"where": [("a", "==", [1])]}, {"where": [("a", "==", {"x": 1})]},
    {"where": [("a", "==", 2**64)]}, {"where": [("a", "in", [2**64])]},
    {"where": [("a", "<", -2**63 - 1)]}, {"keys": [2**64]}, {"keys": [-2**63 - 1]},
    {"keys": "AA"}, {"keys": b"AA"}, {"keys": 5}, {"keys": [["AA"]]}, {"keys": [object()]},
    {"columns": "a"}, {"columns": []}, {"columns": [1]}, {"columns": 3}, {"columns": [None]},
    {"columns": ["c%d" % i for i in range(MAX_CONJUNCTS + 1)]},
    {"where": [("a", "==", 1)] * (MAX_CONJUNCTS + 1)},
])
def test_malformed_filters_raise_filter_error(kwargs):
    with pytest.raises(FilterError):
        Filter(**kwargs)


def test_too_many_keys_is_a_filter_error_naming_the_bound():
    with pytest.raises(FilterError, match=str(MAX_KEYS)):
        Filter(keys=range(MAX_KEYS + 1))
    with pytest.raises(FilterError, match=str(MAX_KEYS)):
        Filter(where=[("a", "in", list(range(MAX_KEYS + 1)))])
    assert len(Filter(keys=range(MAX_KEYS)).keys) == MAX_KEYS


wire_leaves = st.one_of(scalars, st.sampled_from([2**64 - 1, -2**63, 2**63]))
wire_values = st.recursive(
    wire_leaves,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3)), inner, max_size=3),
    max_leaves=10)
field_values = st.one_of(
    wire_values,
    st.lists(wire_values, max_size=4),  # an array of garbage
    st.lists(st.tuples(wire_values, st.sampled_from(OPS) | wire_values, wire_values), max_size=3),
    st.lists(st.tuples(columns_names, st.sampled_from(OPS), wire_values), max_size=3))


@st.composite
def wire_filter_maps(draw):
    m = {}
    for name in ("keys", "columns", "where"):
        if draw(st.booleans()):
            m[name] = draw(field_values)
    if draw(st.integers(0, 5)) == 0:
        m[draw(st.text(max_size=5))] = draw(wire_values)
    return m


@given(st.one_of(wire_values, wire_filter_maps()))
def test_wire_garbage_is_a_filter_error_never_another_exception(obj):
    obj = _wire(obj)
    try:
        f = Filter.from_wire(obj)
    except FilterError:
        return
    assert Filter.from_wire(_wire(f.to_wire())) == f


@pytest.mark.parametrize("obj", [
    None, 1, "keys", [], (), {"keys": None}, {"keys": 1}, {"keys": "AA"}, {"keys": {"a": 1}},
    {"columns": "a"}, {"columns": ()}, {"columns": (1,)}, {"where": "x"}, {"where": ((),)},
    {"where": (("a", "~", 1),)}, {"where": (("a", "in", 1),)}, {"where": (("a", "==", (1,)),)},
    {"where": (("a", "==", {"b": 1}),)}, {"keys": ({"a": 1},)}, {"other": 1},
    {"keys": (), "extra": 1},
])
def test_wire_garbage_examples(obj):
    with pytest.raises(FilterError):
        Filter.from_wire(_wire(obj))


# =============================================================================================
# evaluation: dict records and Arrow agree (and agree with this file's oracle)

MISSING = object()
_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}


def _same(a, b) -> bool:
    """Membership equality as Arrow's ``is_in`` has it: null matches null, NaN matches NaN."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def oracle_match(rec: dict, f: Filter, key) -> bool:
    if f.keys is not None:
        k = key(rec) if callable(key) else rec.get(key, MISSING)
        if k is MISSING or not any(_same(k, x) for x in f.keys):
            return False
    for col, op, value in f.where:
        v = rec.get(col, MISSING)
        if v is MISSING:
            return False
        if op == "in":
            if not any(_same(v, x) for x in value):
                return False
        elif v is None or value is None or not _CMP[op](v, value):
            return False
    return True


def oracle_apply(f: Filter, records, key="k") -> list:
    out = [r for r in records if oracle_match(r, f, key)]
    if f.columns is not None:
        out = [{c: r[c] for c in f.columns if c in r} for r in out]
    return out


def _canon(rows) -> list:
    """Rows comparable whatever NaN objects they hold."""
    def c(v):
        return ("NaN",) if isinstance(v, float) and v != v else v
    return [tuple(sorted((k, c(v)) for k, v in r.items())) for r in rows]


TYPES = {
    "int": (pa.int64(), st.integers(-3, 3)),
    # (no -0.0: Arrow's is_in tells -0.0 from 0.0, its equal does not; Python never does)
    "float": (pa.float64(), st.sampled_from([-1.5, 0.0, 1.0, 2.0, 2.5, math.inf, -math.inf,
                                              math.nan])),
    "str": (pa.string(), st.sampled_from(["", "a", "b", "ab"])),
    "bytes": (pa.binary(), st.sampled_from([b"", b"a", b"b"])),
    "bool": (pa.bool_(), st.booleans()),
}


def _value_for(kind):
    """Values a conjunct on a column of ``kind`` may compare with (same type; ints and floats
    mix), or None."""
    if kind in ("int", "float"):
        return st.none() | TYPES["int"][1] | TYPES["float"][1]
    return st.none() | TYPES[kind][1]


@st.composite
def table_and_filter(draw, key_kinds=("int", "str")):
    key_kind = draw(st.sampled_from(key_kinds))
    kinds = {"k": key_kind}
    for i in range(draw(st.integers(1, 4))):
        kinds[f"c{i}"] = draw(st.sampled_from(sorted(TYPES)))
    rows = draw(st.lists(st.fixed_dictionaries(
        {c: st.none() | TYPES[kind][1] for c, kind in kinds.items()}), max_size=12))
    schema = pa.schema([(c, TYPES[kind][0]) for c, kind in kinds.items()])
    return kinds, rows, schema, draw(filter_on(kinds))


@st.composite
def filter_on(draw, kinds):
    names = sorted(kinds)
    keys = draw(st.none() | st.lists(st.none() | TYPES[kinds["k"]][1], max_size=3))
    columns = draw(st.none() | st.lists(st.sampled_from(names), min_size=1, max_size=3))
    where = []
    for _ in range(draw(st.integers(0, 3))):
        col = draw(st.sampled_from(names))
        op = draw(st.sampled_from(OPS))
        if op == "in":
            value = draw(st.lists(_value_for(kinds[col]), max_size=3))
        else:
            value = draw(_value_for(kinds[col]))
        where.append((col, op, value))
    try:
        return Filter(keys, columns, where)
    except FilterError:
        assume(False)


@given(table_and_filter())
def test_dict_records_agree_with_the_oracle(case):
    _, rows, _, f = case
    assert _canon(f.apply_records(rows, key="k")) == _canon(oracle_apply(f, rows))
    assert [f.match(r, key="k") for r in rows] == [oracle_match(r, f, "k") for r in rows]


@given(table_and_filter())
def test_arrow_agrees_with_dict_records(case):
    """The same rows as dicts and as an Arrow table (nulls included) give the same records."""
    _, rows, schema, f = case
    table = pa.Table.from_pylist(rows, schema=schema)
    got = f.apply_arrow(table, key="k")  # well-typed: no FilterError either
    assert isinstance(got, pa.Table)
    if f.columns is not None:
        assert got.schema.names == list(f.columns)
    assert _canon(got.to_pylist()) == _canon(oracle_apply(f, rows))
    assert _canon(got.to_pylist()) == _canon(f.apply_records(rows, key="k"))
    batch = table.combine_chunks().to_batches()
    if batch:
        got_b = f.apply_arrow(batch[0], key="k")
        assert isinstance(got_b, pa.RecordBatch)
        assert _canon(got_b.to_pylist()) == _canon(got.to_pylist())


@pytest.mark.parametrize("where", [
    [("x", "==", None)], [("x", "!=", None)], [("x", "!=", 1)], [("x", ">=", None)],
    [("x", "in", [None])], [("x", "in", [None, 1])], [("x", "in", [1])],
    [("f", "in", [math.nan])], [("f", "!=", math.nan)], [("f", "==", math.nan)],
])
def test_nulls_and_nan_agree_between_dicts_and_arrow(where):
    rows = [{"x": 1, "f": 1.0}, {"x": None, "f": math.nan}, {"x": 3, "f": None}]
    table = pa.Table.from_pylist(rows, schema=pa.schema([("x", pa.int64()), ("f", pa.float64())]))
    f = Filter(where=where)
    arrow = _canon(f.apply_arrow(table).to_pylist())
    assert _canon(f.apply_records(rows)) == arrow
    assert arrow == _canon(oracle_apply(f, rows))


ARROW_TABLE = pa.Table.from_pylist(
    [{"k": "a", "x": 1, "s": "u", "b": True, "y": b"a"},
     {"k": None, "x": None, "s": None, "b": None, "y": None}])


@pytest.mark.parametrize("kwargs", [
    {"keys": [1, 2]}, {"keys": [None]}, {"keys": []}, {"keys": [True]}, {"keys": ["a", 1]},
    {"where": [("x", "==", "a")]}, {"where": [("s", "<", 1)]}, {"where": [("s", "in", [1, 2])]},
    {"where": [("x", "in", ["a"])]}, {"where": [("x", "==", True)]}, {"where": [("b", "==", 1)]},
    {"where": [("x", "==", 2**64 - 1)]}, {"where": [("x", "in", [1, 2**64 - 1])]},
    {"where": [("x", "in", [2**64 - 1, -1])]}, {"where": [("x", ">", 2**63)]},
    {"where": [("x", "in", [1, "a"])]}, {"where": [("x", "in", [1, True])]},
    {"where": [("nope", "==", 1)]}, {"columns": ["k", "nope"]}, {"keys": ["a"], "columns": ["x"]},
])
def test_arrow_refusals_are_filter_errors(kwargs):
    """On an Arrow batch a filter either evaluates or raises FilterError — never a pyarrow
    error or OverflowError, which would end a publisher's loop."""
    f = Filter(**kwargs)
    for data in (ARROW_TABLE, ARROW_TABLE.to_batches()[0]):
        try:
            f.apply_arrow(data, key="k")
        except FilterError:
            pass
        try:
            union_arrow((f, Filter(where=[("x", ">", 0)])), data, key="k")
        except FilterError:
            pass


def test_arrow_unknown_column_error_names_the_column():
    with pytest.raises(FilterError, match="'nope'"):
        Filter(where=[("nope", ">", 1)]).apply_arrow(ARROW_TABLE)
    with pytest.raises(FilterError, match="'nope'"):
        Filter(columns=["nope"]).apply_arrow(ARROW_TABLE)
    with pytest.raises(FilterError, match="key"):
        Filter(keys=["a"]).apply_arrow(ARROW_TABLE, key=None)
    with pytest.raises(FilterError, match="key"):
        Filter(keys=["a"]).apply_arrow(ARROW_TABLE, key=lambda r: r)


def test_mixed_types_in_dict_records_do_not_match_and_do_not_raise():
    f = Filter(where=[("x", "<", 2)])
    assert f.apply_records([{"x": "a"}, {"x": 1}, {"x": None}, {"x": [1]}, {"y": 1}]) == [{"x": 1}]
    assert Filter(keys=["a"]).apply_records([{"k": ["a"]}, {"k": {"a": 1}}, {"k": "a"}],
                                           key="k") == [{"k": "a"}]
    with pytest.raises(FilterError, match="dict records"):
        Filter(where=[("x", "==", 1)]).apply_records([(1, 2)])
    with pytest.raises(FilterError, match="key"):
        Filter(keys=["a"]).apply_records([{"k": "a"}], key=None)
    # a key function sees the whole record, whatever its shape
    assert Filter(keys=[2]).apply_records([(1, 2), (3, 4), (5, 2)], key=lambda r: r[1]) == \
        [(1, 2), (5, 2)]


def test_a_big_key_set_is_looked_up_not_scanned():
    """A subscriber may send up to MAX_KEYS keys; the publisher evaluates them for every record
    of every message, in its loop: a key lookup must not compare against every key."""
    compared = collections.Counter()

    class Probe:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            compared["eq"] += 1
            return self.v == other

        def __hash__(self):
            return hash(self.v)

    f = Filter(keys=range(20_000), where=[("x", "in", list(range(20_000)))])
    records = [{"k": Probe(30_000 + i), "x": Probe(i)} for i in range(100)]
    assert f.apply_records(records, key="k") == []
    assert compared["eq"] <= 10 * len(records), compared
    records = [{"k": Probe(i), "x": Probe(30_000 + i)} for i in range(100)]
    assert f.apply_records(records, key="k") == []
    assert compared["eq"] <= 40 * len(records), compared


# =============================================================================================
# unions: what a publisher sends during a change, re-filtered by the subscriber

@st.composite
def table_and_filters(draw):
    kinds, rows, schema, f = draw(table_and_filter())
    others = draw(st.lists(filter_on(kinds), min_size=0, max_size=2))
    return kinds, rows, schema, (f, *others)


@given(table_and_filters())
def test_union_of_sent_filters_refiltered_by_any_member_is_that_member(case):
    """The central step of the proof: a publisher sends the union of ``sent_filter(f)`` over the
    program's filters; the subscriber re-filters by the one in force and must get exactly what
    that one alone gives — for dict records and for Arrow."""
    _, rows, schema, fs = case
    sent = tuple(sent_filter(f, "k") for f in fs)
    union = union_records(sent, rows, key="k")
    # the union is: records matching any, on the union of the sent columns
    expect = [r for r in rows if any(oracle_match(r, g, "k") for g in fs)]
    cols = None if any(g.columns is None for g in sent) else \
        list(dict.fromkeys(c for g in sent for c in g.columns))
    if cols is not None:
        expect = [{c: r[c] for c in cols if c in r} for r in expect]
    assert _canon(union) == _canon(expect)
    for f in fs:
        assert _canon(f.apply_records(union, key="k")) == _canon(oracle_apply(f, rows))
    table = pa.Table.from_pylist(rows, schema=schema)
    u_arrow = union_arrow(sent, table, key="k")
    per = [f.apply_arrow(u_arrow, key="k") for f in fs]
    direct = [f.apply_arrow(table, key="k") for f in fs]
    assert _canon(u_arrow.to_pylist()) == _canon(union)
    for a, b in zip(per, direct):
        assert a.schema.names == b.schema.names
        assert _canon(a.to_pylist()) == _canon(b.to_pylist())


def test_union_examples():
    rows = [{"k": "A", "x": 1, "y": 10}, {"k": "B", "x": 5, "y": 20}, {"k": "C", "x": 9, "y": 30}]
    a = Filter(keys=["A"], columns=["y"])
    b = Filter(where=[("x", ">", 4)], columns=["x"])
    # every record sent is cut to the union of the columns (y, x)
    assert union_records((a, b), rows, key="k") == \
        [{"y": 10, "x": 1}, {"y": 20, "x": 5}, {"y": 30, "x": 9}]
    assert union_records((a, Filter()), rows, key="k") == rows  # one keeps everything
    assert union_records((a,), rows, key="k") == [{"y": 10}]
    t = pa.Table.from_pylist(rows)
    assert union_arrow((a, b), t, key="k").to_pylist() == \
        [{"y": 10, "x": 1}, {"y": 20, "x": 5}, {"y": 30, "x": 9}]
    assert sent_filter(a, "k") == Filter(keys=["A"], columns=["y", "k"])
    assert sent_filter(b, "k") == Filter(where=[("x", ">", 4)], columns=["x"])
    assert sent_filter(Filter(keys=["A"]), "k") == Filter(keys=["A"])
    assert sent_filter(Filter(keys=["A"], columns=["y"]), lambda r: r) == \
        Filter(keys=["A"], columns=["y"])


# =============================================================================================
# programs

F = [Filter(keys=["a"]), Filter(keys=["b"]), Filter(where=[("x", ">", 1)]), Filter(columns=["x"]),
     Filter()]

ORDERS = {"total": (TOTAL, list(range(0, 7))),
          "product(2)": (P2, list(itertools.product(range(5), repeat=2)))}


def _antichain(order, times):
    return tuple(t for t in dict.fromkeys(times)
                 if not any(o != t and order.le(o, t) for o in times))


@st.composite
def order_and_grid(draw):
    return ORDERS[draw(st.sampled_from(sorted(ORDERS)))]


def antichains(order, grid, min_size=1):
    return st.lists(st.sampled_from(grid), min_size=min_size, max_size=3).map(
        lambda ts: _antichain(order, ts))


@st.composite
def programs(draw, order, grid):
    entries = [(None, draw(st.sampled_from(F)))]
    for _ in range(draw(st.integers(0, 4))):
        b = draw(st.none() | antichains(order, grid))
        entries.append((b, draw(st.sampled_from(F))))
    return FilterSchedule(order, entries)


def _at_or_beyond(order, t, frontier) -> bool:
    return any(order.le(b, t) for b in frontier)


def _oracle_in_force(p: FilterSchedule, t):
    k = 0
    for i, (b, _) in enumerate(p.entries):
        if i and b is not None and _at_or_beyond(p.order, t, b):
            k = i
    return k


@given(st.data())
def test_in_force_and_sent_follow_the_definition(data):
    order, grid = data.draw(order_and_grid())
    p = data.draw(programs(order, grid))
    for t in grid:
        k = _oracle_in_force(p, t)
        assert p.in_force(t) == p.entries[k][1]
        sent = p.sent(t)
        assert sent == tuple(dict.fromkeys(f for _, f in p.entries[k:]))
        assert sent[0] == p.in_force(t)  # what is in force is always sent


@given(st.data())
def test_a_change_is_safe_whatever_was_sent_before_it(data):
    """The change protocol on one partition: data at ``t`` sent before the switch under
    ``old.sent(t)``, during the change under ``pending.sent(t)``, after it under
    ``final.sent(t)``; the subscriber releases ``t`` under ``final.in_force(t)``. Each of these
    unions must contain the filter in force for every ``t`` that can still have data then
    (before the switch: only ``t <=`` the upper frontier it answered)."""
    order, grid = data.draw(order_and_grid())
    old = data.draw(programs(order, grid))
    new = data.draw(st.sampled_from(F))
    uppers = data.draw(st.lists(st.sampled_from(grid), max_size=3))
    b = boundary(order, uppers)
    pending = old.with_change(new, None)
    final = old.with_change(new, b)
    for t in grid:
        assert pending.in_force(t) == old.in_force(t)  # a pending change takes no effect
        f = final.in_force(t)
        assert f == (new if _at_or_beyond(order, t, b) else old.in_force(t))
        if any(order.le(t, u) for u in uppers):  # data at t may have gone before the switch
            assert f in old.sent(t), (t, b)
        assert f in pending.sent(t)
        assert f in final.sent(t)
        # the publisher may meanwhile prune by its lower frontier: the union still fits
        # (pruning is checked in its own test)


@given(st.data())
def test_a_chain_of_changes_is_safe(data):
    """Several changes in a row on one partition. Between two switches the publisher uses the
    pending program of the earlier change, then its final one, and sends data only at times
    ``<=`` the upper frontier it answers at the next switch (uppers only grow); after the last
    switch, at any time. Whatever program it used, the filter finally in force for ``t`` is in
    the union it sent at ``t``."""
    order, grid = data.draw(order_and_grid())
    prog = FilterSchedule.single(order, data.draw(st.sampled_from(F)))
    uppers: list = []
    used = [prog]  # the programs used since the last switch
    history = []  # (program used, times it may have sent data at: None = any)
    for _ in range(data.draw(st.integers(1, 4))):
        uppers += data.draw(st.lists(st.sampled_from(grid), max_size=2))
        history += [(q, tuple(uppers)) for q in used]
        new = data.draw(st.sampled_from(F))
        pending = prog.with_change(new, None)
        prog = prog.with_change(new, boundary(order, uppers))
        used = [pending, prog]
    history += [(q, None) for q in used]
    for t in grid:
        f = prog.in_force(t)
        for q, could in history:
            if could is None or any(order.le(t, u) for u in could):
                assert f in q.sent(t), (t, q, prog)


@given(st.data())
def test_prune_keeps_what_is_in_force_at_or_beyond_the_lower_frontier(data):
    order, grid = data.draw(order_and_grid())
    p = data.draw(programs(order, grid))
    lower = data.draw(antichains(order, grid, min_size=0))
    q = p.prune(lower)
    assert q.entries[0][0] is None and len(q.entries) <= len(p.entries)
    assert q.current == p.current
    if not lower:
        assert q.entries == ((None, p.current),)
    for t in grid:
        if _at_or_beyond(order, t, lower):
            assert q.in_force(t) == p.in_force(t), (t, lower)
            assert q.sent(t) == p.sent(t), (t, lower)
    assert q.prune(lower) == q  # idempotent


def test_program_examples_total_order():
    a, b, c = F[0], F[1], F[2]
    p = FilterSchedule.single(TOTAL, a)
    assert p.in_force(0) == a and p.sent(5) == (a,) and p.current == a
    pend = p.with_change(b, None)
    assert pend.entries == ((None, a), (None, b)) and pend.in_force(9) == a
    assert pend.sent(0) == (a, b) and pend.current == b
    fin = pend.with_change(b, (4,))  # the pending entry's boundary set, no new entry
    assert fin.entries == ((None, a), ((4,), b))
    assert p.with_change(b, (4,)) == fin and hash(p.with_change(b, (4,))) == hash(fin)
    assert [fin.in_force(t) for t in range(6)] == [a, a, a, a, b, b]
    assert fin.sent(3) == (a, b) and fin.sent(4) == (b,)
    assert fin.prune((3,)) == fin and fin.prune((4,)).entries == ((None, b),)
    assert fin.prune(()).entries == ((None, b),)
    more = fin.with_change(c, None).with_change(c, (7,))
    assert [more.in_force(t) for t in (3, 4, 6, 7)] == [a, b, b, c]
    assert more.sent(3) == (a, b, c) and more.sent(5) == (b, c) and more.sent(8) == (c,)
    assert more.prune((5,)).entries == ((None, b), ((7,), c))
    assert pend.with_change(c, None).entries == ((None, a), (None, b), (None, c))


def test_program_refusals():
    with pytest.raises(FilterError):
        FilterSchedule(TOTAL, [])
    with pytest.raises(FilterError):
        FilterSchedule(TOTAL, [((1,), F[0])])
    with pytest.raises(FilterError, match=str(MAX_ENTRIES)):
        FilterSchedule(TOTAL, [(None, F[0])]
                       + [((i,), F[i % 2]) for i in range(1, MAX_ENTRIES + 1)])
    ok = FilterSchedule(TOTAL, [(None, F[0])] + [((i,), F[i % 2]) for i in range(1, MAX_ENTRIES)])
    with pytest.raises(FilterError):
        ok.with_change(F[2], (99,))


@given(st.data())
def test_program_wire_round_trip(data):
    order, grid = data.draw(order_and_grid())
    p = data.draw(programs(order, grid))
    q = FilterSchedule.from_wire(order, _wire(p.to_wire()), lambda t: check_time(order, t))
    assert q == p and hash(q) == hash(p)
    for t in grid:
        assert q.in_force(t) == p.in_force(t) and q.sent(t) == p.sent(t)


program_garbage = st.recursive(
    wire_leaves | st.just({"keys": ["a"]}) | st.just({}),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=2),
    max_leaves=12)


@given(st.sampled_from(sorted(ORDERS)), program_garbage)
def test_program_wire_garbage_is_a_filter_error(order_name, obj):
    order = ORDERS[order_name][0]
    try:
        p = FilterSchedule.from_wire(order, _wire(obj), lambda t: check_time(order, t))
    except FilterError:
        return
    assert p.entries[0][0] is None
    for b, _ in p.entries[1:]:
        assert b is None or all(check_time(order, t) == t for t in b)


@pytest.mark.parametrize("obj", [
    None, 1, [], [[None, {}]] * (MAX_ENTRIES + 1), [[[1], {}]], [[None]], [[None, {}, 1]],
    [[None, {"keys": 1}]], [[None, {}], [1, {}]], [[None, {}], [["x"], {}]],
    [[None, {}], [[True], {}]], [[None, {}], [[[1, 2]], {}]],
    [[None, {}], [list(range(1025)), {}]], [[None, {}], [[1], {"where": [["a", "~", 1]]}]],
])
def test_program_wire_garbage_examples(obj):
    with pytest.raises(FilterError):
        FilterSchedule.from_wire(TOTAL, _wire(obj), lambda t: check_time(TOTAL, t))


@pytest.mark.parametrize("t", [2**64, -2**63 - 1, 1.5, "1", None])
def test_program_boundary_times_out_of_range_are_filter_errors(t):
    with pytest.raises(FilterError):
        FilterSchedule.from_wire(TOTAL, [[None, {}], [[t], {}]], lambda t: check_time(TOTAL, t))


def test_program_boundary_times_of_the_wrong_shape_are_filter_errors():
    for obj in ([[None, {}], [[1], {}]], [[None, {}], [[(1, 2, 3)], {}]]):
        with pytest.raises(FilterError):
            FilterSchedule.from_wire(P2, _wire(obj), lambda t: check_time(P2, t))

    def boom(t):
        raise ProtocolError("bad")
    with pytest.raises(FilterError):
        FilterSchedule.from_wire(TOTAL, _wire([[None, {}], [[1], {}]]), boom)


def test_program_is_a_deprecated_alias_of_filter_schedule():
    from epochstream.filters import Program

    assert Program is FilterSchedule and "Program" in epochstream.filters.__all__
    assert Program.single(TOTAL, F[0]) == FilterSchedule.single(TOTAL, F[0])


# =============================================================================================
# boundary: exhaustively on small grids

def _check_boundary(order, grid, uppers):
    b = boundary(order, uppers)
    assert isinstance(b, tuple) and b
    for x in b:  # an antichain
        assert not any(y != x and order.le(y, x) for y in b), b
    for t in grid:
        beyond = any(order.le(x, t) for x in b)
        below_upper = any(order.le(t, u) for u in uppers)
        # safety: no time at or beyond B had data sent before the switch
        assert not (beyond and below_upper), (uppers, b, t)
        # tightness: every other time is one that may have had data
        assert beyond or below_upper, (uppers, b, t)
    for x in b:  # each element is itself a time that had no data, and minimal such
        assert not any(order.le(x, u) for u in uppers)
    return b


def test_boundary_total_order_exhaustive():
    grid = list(range(8))
    for n in range(4):
        for uppers in itertools.combinations(grid, n):
            b = _check_boundary(TOTAL, grid, list(uppers))
            assert b == ((max(uppers) + 1,) if uppers else (0,))


def test_boundary_product2_exhaustive():
    grid = list(itertools.product(range(5), repeat=2))
    for n in range(3):
        for uppers in itertools.combinations(grid, n):
            _check_boundary(P2, grid, list(uppers))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
                max_size=4))
def test_boundary_product3(uppers):
    _check_boundary(P3, list(itertools.product(range(5), repeat=3)), uppers)


def test_boundary_examples_and_refusals():
    assert boundary(TOTAL, [3, 5]) == (6,)
    assert boundary(TOTAL, []) == (0,)
    assert sorted(boundary(P2, [(1, 3), (2, 1)])) == [(0, 4), (2, 2), (3, 0)]
    assert boundary(P2, []) == ((0, 0),)
    assert sorted(boundary(P2, [(0, 0)])) == [(0, 1), (1, 0)]
    assert boundary(P2, [(1, 3), (1, 3), (0, 0)]) == boundary(P2, [(1, 3)])  # duplicates, dominated
    with pytest.raises(NotImplementedError):
        boundary(dual(TOTAL), [1])

    class Custom:
        name = "custom"
        minimum = 0

        @staticmethod
        def le(a, b):
            return a <= b
    with pytest.raises(NotImplementedError):
        boundary(Custom(), [1])


# =============================================================================================
# Interest: what a publisher sends one peer

@given(st.data())
def test_interest_select_and_frontier(data):
    order, grid = data.draw(order_and_grid())
    skip = data.draw(antichains(order, grid, min_size=0))
    program = data.draw(st.none() | programs(order, grid))
    unfiltered = data.draw(st.booleans())
    i = Interest(order, skip, program, unfiltered=unfiltered)
    lower = data.draw(antichains(order, grid, min_size=0))
    for step in range(2):
        for t in grid:
            got = i.select(t)
            skipped = i.skip is not None and any(order.le(t, u) for u in skip)
            if skipped:
                assert got is SKIP
            elif i.program is None or unfiltered:
                assert got is ALL or got == ALL
            else:
                sent = i.program.sent(t)
                assert got == (ALL if any(f.everything for f in sent) else sent)
        if step == 0:
            before = i.program
            i.frontier(lower)
            # the skip retires exactly when no lower element is <= one of its times
            if skip:
                retired = not any(order.le(l, u) for l in lower for u in skip)
                assert (i.skip is None) == retired
            if before is not None:
                assert i.program == (before.prune(lower) if len(before.entries) > 1 else before)


def test_interest_examples():
    a = Filter(keys=["a"])
    i = Interest(TOTAL, (3,), FilterSchedule.single(TOTAL, a))
    assert not i.trivial
    assert i.select(2) is SKIP and i.select(3) is SKIP and i.select(4) == (a,)
    i.frontier((2,))
    assert i.skip is not None and i.select(3) is SKIP
    i.frontier((4,))
    assert i.skip is None and i.select(3) == (a,)
    assert Interest(TOTAL).trivial and Interest(TOTAL).select(0) is ALL
    assert Interest(TOTAL, (), FilterSchedule.single(TOTAL, Filter())).trivial
    assert Interest(TOTAL, (), FilterSchedule.single(TOTAL, a), unfiltered=True).trivial
    assert not Interest(TOTAL, (1,), FilterSchedule.single(TOTAL, a), unfiltered=True).trivial
    assert Interest(TOTAL, (), FilterSchedule.single(TOTAL, a), unfiltered=True).select(0) is ALL
    p = FilterSchedule.single(TOTAL, a).with_change(Filter(), (5,))
    j = Interest(TOTAL, (), p)
    assert not j.trivial  # two entries: it still filters epochs before 5
    assert j.select(4) is ALL and j.select(5) is ALL  # the union keeps everything
    j.frontier((5,))
    assert j.trivial
    q = FilterSchedule.single(TOTAL, Filter()).with_change(a, (5,))
    k = Interest(TOTAL, (), q)
    assert k.select(4) is ALL and k.select(5) == (a,)


def test_what_a_publisher_sends_can_be_rechecked():
    """``sent_filter`` keeps, besides ``columns``, every column the conjuncts and the key read:
    the subscriber re-checks the projected records and must get the filter's exact result."""
    rows = [{"k": "A", "x": 2, "y": 1, "z": 0}, {"k": "A", "x": 0, "y": 2, "z": 0},
            {"k": "B", "x": 5, "y": 3, "z": 0}]
    f = Filter(keys=["A"], columns=["y"], where=[("x", ">", 1)])
    g = Filter(columns=["z"])
    sent = sent_filter(f, "k")
    assert set(sent.columns) == {"y", "x", "k"} and sent.keys == f.keys and sent.where == f.where
    for union in (sent.apply_records(rows, key="k"), union_records((sent, g), rows, key="k")):
        assert f.apply_records(union, key="k") == [{"y": 1}]
    table = pa.Table.from_pylist(rows)
    for union in (sent.apply_arrow(table, key="k"), union_arrow((sent, g), table, key="k")):
        assert f.apply_arrow(union, key="k").to_pylist() == [{"y": 1}]


# =============================================================================================
# cover / covers: what a relay asks upstream for (docs/filters.md, "Relays")

@st.composite
def rows_and_filters(draw):
    kinds, rows, _, first = draw(table_and_filter())
    more = draw(st.lists(filter_on(kinds), max_size=3))
    return rows, [first, *more]


def _reapplied(f: Filter, through: Filter, rows) -> list:
    """``f`` applied downstream to what ``through`` let through (as a relay serves it)."""
    return f.apply_records(through.apply_records(rows, key="k"), key="k")


@settings(max_examples=150)
@given(rows_and_filters())
def test_a_cover_serves_every_filter_it_covers_exactly(case):
    """Sound: every filter gets exactly its records when applied again to what the cover let
    through; and covers() says so."""
    rows, fs = case
    c = cover(fs, key="k")
    for f in fs:
        assert covers(c, f, key="k"), (c, f)
        assert _canon(_reapplied(f, c, rows)) == _canon(f.apply_records(rows, key="k"))


@settings(max_examples=150)
@given(rows_and_filters(), filters())
def test_covers_is_never_wrong_when_it_says_yes(case, parts):
    """covers(wide, narrow) == True implies narrow applied after wide is narrow alone."""
    rows, fs = case
    wide, narrow = fs[0], fs[-1]
    if covers(wide, narrow, key="k"):
        assert _canon(_reapplied(narrow, wide, rows)) == _canon(narrow.apply_records(rows, key="k"))


def test_cover_examples():
    aa, ua = Filter(keys=["AA"], columns=["delay"]), Filter(keys=["UA"], columns=["day"])
    c = cover([aa, ua], key="carrier")
    assert c == Filter(keys=["AA", "UA"], columns=["delay", "carrier", "day"])
    assert cover([aa, Filter()], key="carrier") == Filter()          # one takes everything
    assert cover([], key="carrier") == Filter()
    assert not covers(aa, ua, key="carrier") and not covers(Filter(keys=["AA"]), Filter())
    # a projection must keep what a conjunct reads downstream
    f = Filter(columns=["a"], where=[("b", ">", 1)])
    assert not covers(f, f) and covers(cover([f]), f)
    # too big for the wire: the cover only grows
    big = [Filter(keys=[f"k{i}-{j}" for j in range(2000)]) for i in range(4)]
    assert cover(big, key="k") == Filter()


@st.composite
def near_pairs(draw):
    """(rows, wide, narrow): wide made from narrow by dropping conjuncts and changing the value
    sets of its keys and ==/in conjuncts — the pairs where covers() has something to decide."""
    kinds, rows, _, narrow = draw(table_and_filter())

    def values_near(values, kind):
        keep = [v for v in values if draw(st.booleans())]
        return keep + draw(st.lists(st.none() | TYPES[kind][1], max_size=2))

    keys = narrow.keys
    if keys is not None and draw(st.booleans()):
        keys = values_near(keys, kinds["k"])
    where = []
    for col, op, v in narrow.where:
        if draw(st.booleans()):
            continue  # dropped: wide is wider there
        if op in ("==", "in") and draw(st.booleans()):
            v = values_near(v if op == "in" else [v], kinds[col])
            op = "in"
        where.append((col, op, v))
    columns = narrow.columns
    if columns is not None and draw(st.booleans()):
        columns = draw(st.lists(st.sampled_from(sorted(kinds)), min_size=1, max_size=4))
    try:
        return rows, Filter(keys, columns, where), narrow
    except FilterError:
        assume(False)


@settings(max_examples=300)
@given(near_pairs())
def test_covers_is_sound_on_near_pairs(case):
    rows, wide, narrow = case
    if covers(wide, narrow, key="k"):
        assert _canon(_reapplied(narrow, wide, rows)) == _canon(narrow.apply_records(rows, key="k"))


@pytest.mark.parametrize("wide, narrow, expected", [
    (Filter(where=[("c", "in", [2])]), Filter(where=[("c", "==", 1)]), False),
    (Filter(where=[("c", "in", [1, 2])]), Filter(where=[("c", "==", 1)]), True),
    (Filter(where=[("c", "in", [1, 2])]), Filter(where=[("c", "in", [1, 3])]), False),
    (Filter(where=[("c", "in", [1, True])]), Filter(where=[("c", "in", [1.0])]), False),
    (Filter(where=[("c", "==", 1)]), Filter(where=[("c", "in", [1])]), False),  # in [1] ≠ == 1? sound: no
    (Filter(where=[("c", ">", 1)]), Filter(where=[("c", ">", 2)]), False),      # incomplete, sound
    (Filter(keys=[1, 2]), Filter(keys=[1]), True),
    (Filter(keys=[1, 2]), Filter(keys=[3]), False),
    (Filter(keys=[1]), Filter(where=[("k", "==", 1)]), True),                  # keys: a conjunct on k
    (Filter(keys=[2]), Filter(where=[("k", "==", 1)]), False),
    (Filter(columns=["a", "k"]), Filter(keys=[1], columns=["a"]), True),
    (Filter(columns=["a"]), Filter(keys=[1], columns=["a"]), False),             # key column cut
    (Filter(columns=["a", "b"]), Filter(columns=["a"], where=[("b", ">", 0)]), True),
    (Filter(columns=["a"]), Filter(columns=["a"], where=[("b", ">", 0)]), False),
    (Filter(columns=["a"]), Filter(), False),
])
def test_covers_examples(wide, narrow, expected):
    assert covers(wide, narrow, key="k") is expected
