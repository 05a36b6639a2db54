"""Wire format: framing, codecs and precise errors for malformed input."""
import datetime as dt

import msgpack
import pyarrow as pa
import pytest

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
    kind, h = wire.decode_control(wire.encode_control(wire.HELLO, topic="t", partition=2))
    assert kind == wire.HELLO and h == {"topic": "t", "partition": 2}


@pytest.mark.parametrize("frames, match", [
    ([], "empty"),
    ([b"Z\x01", b"\x90"], "unknown message kind"),
    ([b"D\x07", b"\x01", b""], "unsupported protocol version 7"),
    ([wire.DATA, b"\x01"], "needs 3 frames"),
    ([wire.FRONTIER, b"\xc1"], "does not decode"),
    ([wire.FRONTIER, msgpack.packb([1, 2])], r"\[\[time, delta\]"),
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
