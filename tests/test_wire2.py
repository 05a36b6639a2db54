"""Version 2 of the data message (epochstream/wire2.py, docs/protocol.md §2.2): the layout, the
negotiation, every malformed header refused with a precise WireError, and the fan-out serving
each peer its version, rendering each message at most once."""
import struct

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pytest
from hypothesis import given, strategies as st

from epochstream import wire, wire2
from epochstream.errors import WireError
from epochstream.transport.fanout import Fanout
from epochstream.transport.sockets import SENT

I64, U64 = (-(1 << 63), (1 << 63) - 1), (1 << 64) - 1


# -- layout -------------------------------------------------------------------------------------
def test_total_order_header_is_twelve_bytes_little_endian():
    h = wire.data_header2(5)
    assert h == b"D\x02\x00\x00" + struct.pack("<q", 5) and len(h) == wire2.header_size(0) == 12
    assert wire.encode_data2(h, b"abc") == [h + b"abc"]


def test_product_header_and_unsigned_flag():
    assert wire.data_header2((1, -2)) == b"D\x02\x02\x00" + struct.pack("<2q", 1, -2)
    assert wire.data_header2((U64, 0)) == b"D\x02\x02\x01" + struct.pack("<2Q", U64, 0)
    assert wire.data_header2(U64) == b"D\x02\x00\x01" + struct.pack("<Q", U64)
    # no v2 encoding: mixed signs beyond int64, empty, too wide, not a time
    for t in [(-1, U64), (), (0,) * 65, "x", None, 1.0, (1, True)]:
        assert wire.data_header2(t) is None, t


times = st.one_of(st.integers(-(1 << 63), U64),
                  st.lists(st.integers(*I64), min_size=1, max_size=64).map(tuple),
                  st.lists(st.integers(0, U64), min_size=1, max_size=8).map(tuple))


@given(times, st.binary(max_size=64), st.booleans())
def test_roundtrip_every_time_both_forms(t, payload, split):
    h = wire.data_header2(t)
    frames = wire.encode_data2(h, payload, split=0 if split else 1 << 20)
    assert len(frames) == (2 if split else 1)
    arity = 0 if type(t) is int else len(t)
    for decode in (lambda f: wire.decode_data2(f, arity), wire.decode_data2):
        got_t, got_p = decode(frames)
        assert got_t == t and bytes(got_p) == payload
    m = wire.decode(frames)
    assert (m.time, bytes(m.data), m.nbytes) == (t, payload, len(payload))
    if not split:  # the fast decoder of the topic's arity
        got_t, got_p = wire.data_decoder(arity)(frames)
        assert got_t == t and bytes(got_p) == payload


def test_a_big_payload_is_a_view_of_the_frame_not_a_copy_a_small_one_bytes():
    frame = wire.data_header2(7) + b"x" * wire2.VIEW_BYTES
    for decode in (wire.data_decoder(0), wire.decode_data2):
        _, payload = decode([frame])
        assert type(payload) is memoryview and payload.obj is frame
    small = wire.data_header2(7) + b"x" * 100
    assert wire.data_decoder(0)([small]) == (7, b"x" * 100)


def test_renderer_encodes_once_per_header_and_falls_back_to_v1():
    r = wire.V2Renderer(split=10)
    hdr = wire.encode_time(3)
    assert r([wire.DATA, hdr, b"ab"]) == [wire.data_header2(3) + b"ab"]
    assert r([wire.DATA, hdr, b"x" * 10]) == [wire.data_header2(3), b"x" * 10]  # split
    v1 = [wire.DATA, wire.encode_time((-1, U64)), b"ab"]
    assert r(v1) is v1  # no v2 encoding of that time: version 1, which a v2 peer reads too


# -- malformed version-2 data -------------------------------------------------------------------
BAD = [
    ([b"D\x02"], "at least 4 bytes"),  # short header
    ([b"D\x02\x00\x00" + b"\x00" * 7], "truncated time"),
    ([b"D\x02\x03\x00" + b"\x00" * 16], "truncated time"),
    ([b"D\x02\x41\x00" + b"\x00" * 600], "arity 65 is above 64"),
    ([b"D\x02\xff\x00" + b"\x00" * 600], "arity 255 is above 64"),
    ([b"D\x02\x00\x02" + b"\x00" * 8], "unknown flags 2"),
    ([b"D\x02\x00\x00" + b"\x00" * 9, b"p"], "header frame must be exactly 12 bytes"),
    ([b"D\x02\x00\x00" + b"\x00" * 8, b"p", b"q"], "1 or 2 frames"),
]


@pytest.mark.parametrize("frames, message", BAD)
def test_garbage_v2_frames_are_a_clear_wire_error(frames, message):
    with pytest.raises(WireError, match=message):
        wire.decode(frames)
    arity = frames[0][2] if len(frames[0]) > 2 and frames[0][2] <= 64 else 0
    with pytest.raises(WireError, match=message):  # the fast decoder of the topic's arity
        wire.data_decoder(arity)(frames)


def test_arity_of_another_order_is_refused_by_the_topics_decoder():
    frames = [wire.data_header2((1, 2)) + b"p"]
    with pytest.raises(WireError, match="arity 2 does not fit the topic's order .arity 0"):
        wire.data_decoder(0)(frames)
    with pytest.raises(WireError, match="arity 0 does not fit"):
        wire.data_decoder(3)([wire.data_header2(1) + b"p"])


def test_wrong_version_byte_is_refused():
    with pytest.raises(WireError, match="unsupported data message version 3"):
        wire.decode([b"D\x03\x00\x00" + b"\x00" * 8 + b"p"])
    with pytest.raises(WireError, match="unsupported protocol version 2 of kind b'S'"):
        wire.decode([b"S\x02", msgpack.packb({})])
    with pytest.raises(WireError, match="unknown message kind"):  # not a control kind
        wire.decode_control([wire.data_header2(1) + b"p"])


@given(st.binary(max_size=80), st.integers(0, 3))
def test_any_bytes_after_the_v2_kind_decode_or_raise_wire_error(rest, n_frames):
    frames = [b"D\x02" + rest] + [b"p"] * n_frames
    for decode in (wire.decode, wire.data_decoder(0), wire.data_decoder(2)):
        try:
            decode(frames)
        except WireError:
            pass


# -- negotiation ---------------------------------------------------------------------------------
def test_choose_wire():
    assert wire.choose_wire(None) == 1  # an old subscriber: no field
    assert wire.choose_wire((1, 2)) == 2
    assert wire.choose_wire((1,)) == 1
    assert wire.choose_wire((1, 2), speaks=1) == 1  # a publisher forced to version 1
    assert wire.choose_wire((2,), speaks=1) is None
    assert wire.choose_wire((3, 9)) is None


def test_hello_wire_field_is_checked_and_optional():
    def hello(**extra):
        return [wire.HELLO, msgpack.packb({"topic": "t", "partition": 0, "id": "s", **extra})]
    assert wire.decode_control(hello(wire=[1, 2]))[1]["wire"] == (1, 2)
    assert "wire" not in wire.decode_control(hello())[1]
    for bad in ([], "2", [True], [1.0], list(range(9))):
        with pytest.raises(WireError, match="hello.wire must be an array of 1..8 ints"):
            wire.decode_control(hello(wire=bad))


# -- the fan-out: each peer its version, each message rendered at most once -------------------
def test_fanout_serves_each_peer_its_version_rendering_lazily_once():
    sent: dict = {}

    def transmit(ident, frames):
        sent.setdefault(ident, []).append(frames)
        return SENT

    calls = []

    def render(frames):
        calls.append(frames)
        return wire.V2Renderer()(frames)

    f = Fanout("t", 0, max_messages=10, max_bytes=1 << 20, credit_timeout=30)
    f.join(b"old", None, "a")
    msg = [wire.DATA, wire.encode_time(4), b"payload"]
    f.broadcast(msg, transmit, 0.0, render=render)
    assert calls == [] and sent[b"old"] == [msg]  # no v2 peer: never rendered
    f.join(b"new1", 3, "b", wire=2)
    f.join(b"new2", None, "c", wire=2)
    f.broadcast(msg, transmit, 0.0, render=render)
    assert len(calls) == 1
    assert sent[b"old"][-1] is msg
    assert sent[b"new1"] == sent[b"new2"] == [[wire.data_header2(4) + b"payload"]]
    assert f.peers[b"new1"].credit == 2  # a v2 data message spends credit like a v1 one


def test_fanout_backlog_of_a_v2_peer_spends_credit_when_drained():
    f = Fanout("t", 0, max_messages=10, max_bytes=1 << 20, credit_timeout=30)
    f.join(b"p", 1, "a", wire=2)
    out = []
    msg = [wire.DATA, wire.encode_time(1), b"x"]
    f.broadcast(msg, lambda i, fr: out.append(fr) or SENT, 0.0, render=wire.V2Renderer())
    f.broadcast(msg, lambda i, fr: out.append(fr) or SENT, 0.0, render=wire.V2Renderer())
    assert len(out) == 1 and len(f.peers[b"p"].backlog) == 1  # credit 1: the second waits
    f.grant(b"p", 1, lambda i, fr: out.append(fr) or SENT)
    assert len(out) == 2 and f.peers[b"p"].credit == 0 and out[1][0][:2] == wire.DATA2


def test_fanout_renders_each_filtered_variant_once_for_its_v2_peers():
    class _Interest:  # (only its presence matters to the fan-out)
        pass

    sent: dict = {}
    calls = []

    def render(frames):
        calls.append(frames[2])
        return wire.V2Renderer()(frames)

    f = Fanout("t", 0, max_messages=10, max_bytes=1 << 20, credit_timeout=30)
    for ident, version in ((b"a", 2), (b"b", 2), (b"c", 1), (b"d", 2)):
        f.join(ident, None, ident.decode(), wire=version).interest = _Interest()
    msg = [wire.DATA, wire.encode_time(1), b"all"]
    small = [wire.DATA, msg[1], b"some"]
    variants = {b"a": small, b"b": small, b"c": small, b"d": msg}
    f.broadcast(msg, lambda i, fr: sent.setdefault(i, fr) and SENT or SENT, 0.0,
                variant=lambda peer: variants[peer.ident], render=render)
    assert sorted(calls) == [b"all", b"some"]  # once per distinct variant, not per peer
    assert sent[b"a"] == sent[b"b"] == [wire.data_header2(1) + b"some"]
    assert sent[b"c"] is small and sent[b"d"] == [wire.data_header2(1) + b"all"]
