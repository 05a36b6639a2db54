"""Wire format: framing, codecs and precise errors for malformed input."""
import datetime as dt

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from epochstream import wire
from epochstream.errors import WireError
from epochstream.protocol import DataMessage, InitialFrontierSnapshot, LowerFrontierUpdate


def test_roundtrip_all_kinds():
    snap = wire.encode_snapshot(InitialFrontierSnapshot((1,), (0,)), topic="t", partition=0)
    assert wire.decode(snap) == InitialFrontierSnapshot((1,), (0,))
    assert wire.decode_snapshot_meta(snap)["topic"] == "t"
    upd = LowerFrontierUpdate((((1, 2), -1), ((2, 2), 1)))
    assert wire.decode(wire.encode_frontier(upd)) == upd
    d = wire.decode(wire.encode_data((3, 4), b"payload"))
    assert d == DataMessage((3, 4), b"payload")  # payload not decoded
    hb = wire.decode(wire.encode_heartbeat([5]))
    assert hb.lower == (5,)
    n = wire.decode(wire.encode_notice("lagged", "too slow", partition=1))
    assert (n.code, n.message, n.extra["partition"]) == ("lagged", "too slow", 1)
    kind, h = wire.decode_control(wire.encode_control(wire.HELLO, topic="t", partition=2, id="s"))
    assert kind == wire.HELLO and h == {"topic": "t", "partition": 2, "id": "s"}


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b"Z\x01", b"\x90"], "unknown message kind"),
    ([b"D\x07", b"\x01", b""], "unsupported protocol version 7"),
    ([wire.DATA, b"\x01"], "needs 3 frames"),
    ([wire.FRONTIER, b"\xc1"], "does not decode"),
    ([wire.FRONTIER, msgpack.packb([1, 2])], r"\[\[time, delta\]"),
    ([wire.FRONTIER, msgpack.packb({"a1": 0})], r"\[\[time, delta\]"),  # was read as [("a", 1)]
    ([wire.SNAPSHOT, msgpack.packb({"lower": []})], "'lower' and 'upper'"),
    ([wire.SNAPSHOT, msgpack.packb({"lower": [], "upper": []}), b"extra"], "needs 2 frames"),
])
def test_malformed_frames_raise_wire_error(frames, match):
    with pytest.raises(WireError, match=match):
        wire.decode(frames)


def test_control_rejects_publisher_kinds():
    with pytest.raises(WireError, match="unknown message kind"):
        wire.decode_control(wire.encode_heartbeat([1]))


def test_msgpack_codec():
    c = wire.codec("msgpack")
    recs = [{"a": 1, "when": dt.datetime(2013, 1, 1, 5, 15)}, {"a": 2, "when": None}]
    out = c.decode(c.encode(recs))
    assert out[0] == {"a": 1, "when": "2013-01-01T05:15:00"} and len(out) == 2
    with pytest.raises(WireError, match="array of records"):
        c.decode(msgpack.packb({"x": 1}))
    with pytest.raises(WireError, match="cannot encode"):
        c.encode([object()])


def test_arrow_codec():
    c = wire.codec("arrow")
    batch = pa.RecordBatch.from_pydict({"x": [1, 2, 3], "y": ["a", "b", "c"]})
    out = c.decode(c.encode(batch))
    assert out.equals(batch)
    assert c.decode(c.encode(pa.Table.from_batches([batch, batch]))).num_rows == 6
    assert c.combine([out, out]).num_rows == 6
    with pytest.raises(WireError, match="arrow payload does not decode"):
        c.decode(b"not arrow")


def test_unknown_codec():
    with pytest.raises(ValueError, match="known codecs"):
        wire.codec("avro")


# -- control messages (subscriber -> publisher): one schema per kind, checked where decoded ----
def control(kind, header) -> list:
    """Frames of a control message with an arbitrary (possibly ill-typed) msgpack header."""
    return [kind, msgpack.packb(header, use_bin_type=True)]


VALID = {
    wire.HELLO: {"topic": "t", "partition": 0, "id": "sub-1"},
    wire.PING: {"id": "sub-1"},
    wire.CREDIT: {"messages": 1},
    wire.BYE: {},
}
NAMES = {wire.HELLO: "hello", wire.PING: "ping", wire.CREDIT: "credit", wire.BYE: "bye"}

# One value of every msgpack type (and the edges of the int ranges). For each field the test
# states which of them are valid; every other one must be refused.
POOL = {
    "None": None, "True": True, "False": False, "0": 0, "1": 1, "7": 7, "-1": -1,
    "2**31": 2**31, "2**31+1": 2**31 + 1, "2**64-1": 2**64 - 1, "-2**63": -2**63,
    "1.5": 1.5, "0.0": 0.0, "1.0": 1.0, "str": "x", "digits": "7", "empty-str": "",
    "str128": "x" * 128, "str129": "x" * 129, "bytes": b"x", "empty-list": [], "list": [1],
    "map": {"k": 1}, "empty-map": {}, "nested": [{"k": [1, {"n": None}]}], "nested-map": {"k": {"n": [1]}},
}
VALID_VALUES = {  # (kind, field) -> names in POOL that are valid for it
    (wire.HELLO, "topic"): {"str", "digits", "empty-str", "str128", "str129"},
    (wire.HELLO, "partition"): {"0", "1", "7", "2**31", "2**31+1", "2**64-1"},
    (wire.HELLO, "id"): {"str", "digits", "empty-str", "str128"},
    (wire.HELLO, "credit"): {"1", "7", "2**31"},
    (wire.PING, "id"): {"str", "digits", "empty-str", "str128"},
    (wire.CREDIT, "messages"): {"1", "7", "2**31"},
}
EXPECTED = {  # how the error message describes the field
    (wire.HELLO, "topic"): "a str",
    (wire.HELLO, "partition"): "an int >= 0",
    (wire.HELLO, "id"): "a str of at most 128 characters",
    (wire.HELLO, "credit"): "an int >= 1 (at most 2**31)",
    (wire.PING, "id"): "a str of at most 128 characters",
    (wire.CREDIT, "messages"): "an int >= 1 (at most 2**31)",
}
REQUIRED = [(wire.HELLO, "topic"), (wire.HELLO, "partition"), (wire.HELLO, "id"), (wire.PING, "id"),
            (wire.CREDIT, "messages")]


def _field_cases(valid: bool):
    for (kind, field), ok in VALID_VALUES.items():
        for name, value in POOL.items():
            if (name in ok) == valid:
                yield pytest.param(kind, field, value, id=f"{NAMES[kind]}.{field}={name}")


@pytest.mark.parametrize("kind, field, value", list(_field_cases(valid=False)))
def test_control_field_of_wrong_type_or_range_is_refused(kind, field, value):
    header = dict(VALID[kind], **{field: value})
    with pytest.raises(WireError) as err:
        wire.decode_control(control(kind, header))
    msg = str(err.value)
    assert msg.startswith(f"{NAMES[kind]}.{field} must be {EXPECTED[kind, field]}, got "), msg
    assert len(msg) < 200  # the offending value is shown, shortened


@pytest.mark.parametrize("kind, field, value", list(_field_cases(valid=True)))
def test_control_field_of_right_type_and_range_decodes(kind, field, value):
    header = dict(VALID[kind], **{field: value})
    got_kind, got = wire.decode_control(control(kind, header))
    assert got_kind == kind and got == header
    assert type(got[field]) is type(value)


def test_control_error_messages_name_kind_field_and_value():
    cases = [
        (wire.HELLO, {"topic": "t", "partition": "x", "id": "s"},
         "hello.partition must be an int >= 0, got 'x'"),
        (wire.HELLO, {"topic": "t", "partition": False, "id": "s"},
         "hello.partition must be an int >= 0, got False"),
        (wire.HELLO, {"topic": "t", "partition": 0, "id": "s", "credit": 0},
         "hello.credit must be an int >= 1 (at most 2**31), got 0"),
        (wire.HELLO, {"topic": b"t", "partition": 0, "id": "s"}, "hello.topic must be a str, got b't'"),
        (wire.PING, {"id": {"a": 1}}, "ping.id must be a str of at most 128 characters, got {'a': 1}"),
        (wire.CREDIT, {"messages": True}, "credit.messages must be an int >= 1 (at most 2**31), got True"),
        (wire.CREDIT, {"messages": 1.0}, "credit.messages must be an int >= 1 (at most 2**31), got 1.0"),
    ]
    for kind, header, message in cases:
        with pytest.raises(WireError) as err:
            wire.decode_control(control(kind, header))
        assert str(err.value) == message


def test_huge_offending_values_are_shortened_in_the_message():
    with pytest.raises(WireError) as err:
        wire.decode_control(control(wire.PING, {"id": "y" * 60_000}))
    assert str(err.value).startswith("ping.id must be a str of at most 128 characters, got 'yyy")
    assert str(err.value).endswith("...") and len(str(err.value)) < 200


@pytest.mark.parametrize("kind, field", REQUIRED, ids=[f"{NAMES[k]}.{f}" for k, f in REQUIRED])
def test_missing_required_control_field_is_refused(kind, field):
    header = {k: v for k, v in VALID[kind].items() if k != field}
    header["unrelated"] = 1
    with pytest.raises(WireError, match=rf"^{NAMES[kind]}\.{field} is required \("):
        wire.decode_control(control(kind, header))


def test_hello_credit_is_optional():
    _, h = wire.decode_control(control(wire.HELLO, VALID[wire.HELLO]))
    assert "credit" not in h
    _, h = wire.decode_control(control(wire.HELLO, dict(VALID[wire.HELLO], credit=16)))
    assert h["credit"] == 16


@pytest.mark.parametrize("kind", list(VALID), ids=list(NAMES.values()))
@pytest.mark.parametrize("header", [None, True, 0, -1, 2**64 - 1, 1.5, "x", b"x", [], [1, 2],
                                    [{"id": "s"}]],
                         ids=lambda h: type(h).__name__ + repr(h)[:10])
def test_control_header_that_is_not_a_map_is_refused(kind, header):
    with pytest.raises(WireError, match=rf"^{NAMES[kind]} header must be a map, got "):
        wire.decode_control(control(kind, header))


@pytest.mark.parametrize("kind", list(VALID), ids=list(NAMES.values()))
def test_unknown_control_keys_are_ignored_and_dropped(kind):
    header = dict(VALID[kind], filters=[[1, 2]], future={"x": None}, **{"": 0})
    raw = msgpack.packb({**header, 7: "seven", b"id": 1})  # non-str keys: msgpack allows them
    got_kind, got = wire.decode_control([kind, raw])
    assert got_kind == kind and got == VALID[kind] and type(got) is dict


def test_bye_needs_no_field_and_ignores_extra_keys():
    assert wire.decode_control(wire.encode_control(wire.BYE)) == (wire.BYE, {})
    assert wire.decode_control(control(wire.BYE, {"id": {"a": 1}, "x": None})) == (wire.BYE, {})


def test_what_the_subscriber_sends_decodes_unchanged():
    """The encoding side is unchanged: the transport's own control messages still decode."""
    hello = dict(topic="trades", partition=3, id="0123456789abcdef0123456789abcdef", credit=64)
    assert wire.decode_control(wire.encode_control(wire.HELLO, **hello)) == (wire.HELLO, hello)
    assert wire.decode_control(wire.encode_control(wire.PING, id="abc")) == (wire.PING, {"id": "abc"})
    assert wire.decode_control(wire.encode_control(wire.CREDIT, messages=32)) == (
        wire.CREDIT, {"messages": 32})


@pytest.mark.parametrize("kind", list(VALID), ids=list(NAMES.values()))
@pytest.mark.parametrize("frames_of, match", [
    (lambda k: [k], "needs 2 frames, got 1"),
    (lambda k: [k, msgpack.packb({}), b""], "needs 2 frames, got 3"),
    (lambda k: [k, b""], "does not decode as msgpack"),
    (lambda k: [k, b"\xc1"], "does not decode as msgpack"),
    (lambda k: [k, b"\x92\x01"], "does not decode as msgpack"),  # truncated array
    (lambda k: [k, b"\x80\x80"], "does not decode as msgpack"),  # trailing bytes
    (lambda k: [k, b"\x81\x81\xa1a\x01\x01"], "does not decode as msgpack"),  # a map as a map key
    (lambda k: [k[:1] + b"\x02", msgpack.packb({})], "unsupported protocol version 2"),
    (lambda k: [k[:1] + b"\x00", msgpack.packb({})], "unsupported protocol version 0"),
    (lambda k: [k[:1], msgpack.packb({})], "unknown message kind"),
    (lambda k: [k + b"\x01", msgpack.packb({})], "unknown message kind"),
    (lambda k: [b"", msgpack.packb({})], "unknown message kind"),
], ids=["1-frame", "3-frames", "empty-header", "not-msgpack", "truncated", "trailing", "map-key",
        "version-2", "version-0", "no-version", "long-kind", "empty-kind"])
def test_malformed_control_frames_are_refused(kind, frames_of, match):
    with pytest.raises(WireError, match=match):
        wire.decode_control(frames_of(kind))


@pytest.mark.parametrize("frames", [[], [b""], [b"", b""], [wire.DATA, b"\x01", b""],
                                    [wire.SNAPSHOT, msgpack.packb({"lower": [], "upper": []})]])
def test_control_refuses_empty_and_publisher_messages(frames):
    with pytest.raises(WireError, match="empty|unknown message kind"):
        wire.decode_control(frames)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


def _header_for(kind):
    """Headers that are often close to valid: the kind's fields with valid or arbitrary values."""
    fields = {wire.HELLO: {"topic": st.text(max_size=3), "partition": st.integers(0, 3),
                           "id": st.text(max_size=3), "credit": st.integers(1, 9)},
              wire.PING: {"id": st.text(max_size=3)},
              wire.CREDIT: {"messages": st.integers(0, 9)},
              wire.BYE: {}}[kind]
    return st.fixed_dictionaries({}, optional={name: strat | msgpack_values
                                               for name, strat in fields.items()}) | msgpack_values


@given(st.sampled_from(list(VALID)).flatmap(lambda k: st.tuples(st.just(k), _header_for(k))))
def test_decode_control_returns_only_well_typed_headers(case):
    kind, header = case
    try:
        got_kind, got = wire.decode_control(control(kind, header))
    except WireError:
        return
    assert got_kind == kind and type(got) is dict
    assert set(got) <= {"topic", "partition", "id", "credit", "messages"}
    if kind == wire.HELLO:
        assert type(got["topic"]) is str and type(got["id"]) is str and len(got["id"]) <= 128
        assert type(got["partition"]) is int and got["partition"] >= 0
        assert "credit" not in got or (type(got["credit"]) is int and 1 <= got["credit"] <= 2**31)
    elif kind == wire.PING:
        assert set(got) == {"id"} and type(got["id"]) is str
    elif kind == wire.CREDIT:
        assert set(got) == {"messages"} and type(got["messages"]) is int and got["messages"] >= 1
    else:
        assert got == {}


# -- publisher -> subscriber headers -----------------------------------------------------------
def test_frontier_deltas_any_int_still_decodes():
    for updates in ([], [[0, 1]], [[0, -1], [1, 1]], [[[1, 2], 5], [[0, 0], 0]], [[3, -2**63]]):
        got = wire.decode([wire.FRONTIER, msgpack.packb(updates)])
        assert got == LowerFrontierUpdate(tuple((tuple(t) if isinstance(t, list) else t, d)
                                                for t, d in updates))
        assert all(type(d) is int for _, d in got.updates)


@pytest.mark.parametrize("header", [
    {"a1": 0}, "ab", b"ab", None, 5, [[0, "1"]], [[0, 1.0]], [[0, True]], [[0, None]],
    [[0, [1]]], [[0, {"d": 1}]], [[0]], [[0, 1, 2]], [0], [[0, 1], "x1"], [{"t": 0, "d": 1}],
])
def test_frontier_update_with_bad_delta_or_shape_is_refused(header):
    with pytest.raises(WireError, match=r"frontier update header must be \[\[time, delta\], \.\.\.\] "
                                        r"with int deltas"):
        wire.decode([wire.FRONTIER, msgpack.packb(header)])


@pytest.mark.parametrize("header, match", [
    ({"code": None, "message": "m"}, "str 'code'"),
    ({"code": 1, "message": "m"}, "str 'code'"),
    ({"code": b"error"}, "str 'code'"),
    ({"code": ["error"]}, "str 'code'"),
    ({"message": "m"}, "str 'code'"),
    (["error", "m"], "str 'code'"),
])
def test_notice_code_must_be_a_str(header, match):
    with pytest.raises(WireError, match=match):
        wire.decode([wire.NOTICE, msgpack.packb(header)])


@pytest.mark.parametrize("field", ["lower", "upper"])
@pytest.mark.parametrize("value", [None, 0, "01", b"01", {"t": 0}, 1.5, True])
def test_snapshot_frontiers_must_be_arrays(field, value):
    header = {"lower": [0], "upper": [], field: value}
    with pytest.raises(WireError, match=f"{field} must be an array of times"):
        wire.decode([wire.SNAPSHOT, msgpack.packb(header)])


@pytest.mark.parametrize("value", [None, 0, "01", {"t": 0}])
def test_heartbeat_lower_must_be_an_array(value):
    with pytest.raises(WireError, match="lower must be an array of times"):
        wire.decode([wire.HEARTBEAT, msgpack.packb({"lower": value})])


def test_long_publisher_headers_are_shortened_in_errors():
    with pytest.raises(WireError) as err:
        wire.decode([wire.FRONTIER, msgpack.packb([[0, "x" * 50_000]])])
    assert len(str(err.value)) < 200


# -- codecs refuse what is not a batch of records ----------------------------------------------
NOT_RECORDS = [
    pytest.param({"a": 1}, "dict", id="dict"),
    pytest.param({}, "dict", id="empty-dict"),
    pytest.param("hello", "str", id="str"),
    pytest.param("", "str", id="empty-str"),
    pytest.param(b"hello", "bytes", id="bytes"),
    pytest.param(bytearray(b"hi"), "bytearray", id="bytearray"),
    pytest.param(memoryview(b"hi"), "memoryview", id="memoryview"),
    pytest.param({1, 2}, "set", id="set"),
    pytest.param(frozenset([1]), "frozenset", id="frozenset"),
    pytest.param(None, "None", id="None"),
    pytest.param(3, "int", id="int"),
    pytest.param(2.5, "float", id="float"),
    pytest.param(True, "bool", id="bool"),
    pytest.param(iter([1, 2]), "list_iterator", id="iterator"),
    pytest.param((x for x in [1, 2]), "generator", id="generator"),
    pytest.param({"a": 1}.values(), "dict_values", id="dict-values"),
]


@pytest.mark.parametrize("records, what", NOT_RECORDS)
def test_msgpack_codec_refuses_what_is_not_a_sequence_of_records(records, what):
    with pytest.raises(WireError, match=rf"^records must be a list or tuple of records, got {what}$"):
        wire.codec("msgpack").encode(records)


def test_msgpack_codec_refusing_an_iterator_consumes_nothing():
    it = iter([1, 2, 3])
    with pytest.raises(WireError):
        wire.codec("msgpack").encode(it)
    assert list(it) == [1, 2, 3]


@pytest.mark.parametrize("records", [[], (), [1, "a", None], ({"a": 1}, [1, 2]), range(3),
                                     __import__("collections").deque([{"a": 1}])],
                         ids=["list", "tuple", "scalars", "tuple-of-records", "range", "deque"])
def test_msgpack_codec_accepts_sequences_of_records(records):
    c = wire.codec("msgpack")
    out = c.decode(c.encode(records))
    assert len(out) == len(records)


def test_msgpack_codec_list_output_unchanged():
    recs = [{"a": 1}, [1, 2], "s", None, 2.5]
    assert wire.codec("msgpack").encode(recs) == msgpack.packb(recs, use_bin_type=True)
    assert wire.codec("msgpack").encode(tuple(recs)) == msgpack.packb(recs, use_bin_type=True)


@pytest.mark.parametrize("records, what", NOT_RECORDS)
def test_arrow_codec_refuses_what_is_not_a_batch(records, what):
    with pytest.raises(WireError, match=rf"^records must be a pyarrow.RecordBatch, a pyarrow.Table "
                                        rf"or a list of dicts, got {what}$"):
        wire.codec("arrow").encode(records)


@pytest.mark.parametrize("records, match", [
    ([1, 2], "records must be dicts, record 0 is of type int"),
    ([{"a": 1}, "x"], "records must be dicts, record 1 is of type str"),
    ([{"a": 1}, None], "records must be dicts, record 1 is of type None"),
    ([{"a": 1}, {"a": "x"}], "arrow codec cannot encode records: .*convert"),
])
def test_arrow_codec_refuses_bad_rows_with_a_wire_error(records, match):
    with pytest.raises(WireError, match=match):
        wire.codec("arrow").encode(records)


def test_arrow_codec_accepts_batches_tables_and_lists_of_dicts():
    c = wire.codec("arrow")
    batch = pa.RecordBatch.from_pylist([{"x": 1}, {"x": 2}])
    assert c.decode(c.encode(batch)).equals(batch)
    assert c.decode(c.encode(pa.Table.from_batches([batch]))).equals(batch)
    assert c.decode(c.encode([{"x": 1}, {"x": 2}])).equals(batch)
    assert c.decode(c.encode(({"x": 1}, {"x": 2}))).equals(batch)
    assert c.decode(c.encode([])).num_rows == 0


def _stream_bytes(batch) -> bytes:
    """What pyarrow's own stream writer makes of one batch (the reference encoding)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_arrow_encoding_from_serialised_messages_is_the_stream_writers_bytes():
    """The encoder builds [schema, batch, end] from the two serialised messages once the stream
    writer was seen to agree for a schema: the bytes stay pyarrow's, for the first batch and
    every later one, for sliced batches, and for schemas that differ only in metadata; a schema
    with dictionaries (a dictionary batch in the stream) keeps the writer and round-trips."""
    c = wire.codec("arrow")
    batch = pa.RecordBatch.from_pylist([{"id": i, "s": f"x{i}", "f": i / 3} for i in range(100)])
    for b in (batch, batch, batch.slice(10, 30), batch.slice(99, 1), batch.slice(0, 0)):
        assert c.encode(b) == _stream_bytes(b)
        assert c.decode(c.encode(b)).equals(b)
    tagged = batch.replace_schema_metadata({"owner": "a"})
    for b in (tagged, tagged, batch.replace_schema_metadata({"owner": "b"})):
        got = c.decode(c.encode(b))
        assert c.encode(b) == _stream_bytes(b) and got.schema.metadata == b.schema.metadata
    d = pa.RecordBatch.from_pydict({"k": pa.array(["a", "b", "a"]).dictionary_encode(),
                                    "v": [1, 2, 3]})
    for b in (d, d, d.slice(1, 2)):
        got = c.decode(c.encode(b))
        assert got.equals(b) and pa.types.is_dictionary(got.schema.field("k").type)
