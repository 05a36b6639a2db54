"""The ingest codec (:mod:`epochstream.spark.ingest`) on its own: every message and reply
round-trips, the wire layout is the documented one, and a field of the wrong type or a missing
one is refused with an :class:`IngestMessageError` that keeps the request id when readable."""

from __future__ import annotations

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

pytest.importorskip("pyspark")

from epochstream.spark.ingest import (ABORT, COMMIT, DATA, ERR, FLUSH, OK, Abort,  # noqa: E402
                                      AbortAck, AttemptRef, Commit, CommitAck, Data, Flush,
                                      FlushAck, IngestMessageError, Refusal, decode_reply,
                                      decode_request, encode_reply, encode_request)

counts = st.integers(0, 2**63 - 1)
texts = st.text(max_size=12)
reqs = st.none() | texts
attempts = st.lists(st.builds(AttemptRef, texts, counts, st.none() | counts), max_size=4).map(tuple)
requests = st.one_of(
    st.builds(Data, texts, counts, counts, counts, counts, st.binary(max_size=64)),
    st.builds(Flush, reqs, texts, counts, counts, counts, counts),
    st.builds(Commit, reqs, counts, attempts, st.none() | texts),
    st.builds(Abort, reqs, counts, attempts))
replies = st.one_of(
    st.builds(FlushAck, reqs, counts, counts, st.booleans()),
    st.builds(CommitAck, reqs, st.booleans(), counts, counts, counts, counts),
    st.builds(AbortAck, reqs, counts),
    st.builds(Refusal, reqs, texts))
KIND_OF = {FlushAck: FLUSH, CommitAck: COMMIT, AbortAck: ABORT, Refusal: FLUSH}


@settings(max_examples=examples(200))
@given(requests)
def test_requests_round_trip(msg):
    frames = encode_request(msg)
    assert decode_request(frames) == msg
    # as the host receives them: zmq frames
    assert decode_request([zmq.Frame(f) for f in frames]).req == msg.req


@settings(max_examples=examples(200))
@given(replies)
def test_replies_round_trip(reply):
    got = decode_reply(encode_reply(reply), KIND_OF[type(reply)])
    if isinstance(reply, CommitAck) and reply.duplicate:
        assert got == CommitAck(reply.req, True, reply.published_batches, reply.rows,
                                reply.next_epoch)  # empty_attempts is not sent then
    else:
        assert got == reply


def test_wire_layout_is_the_documented_one():
    data = encode_request(Data("run", 2, 1, 7, 10, b"ipc"))
    assert data[0] == DATA and msgpack.unpackb(data[1]) == ["run", 2, 1, 7, 10] and data[2] == b"ipc"
    commit = encode_request(Commit("r1", 2, (AttemptRef("run", 7, 10), AttemptRef("old", 3))))
    assert commit[0] == COMMIT and msgpack.unpackb(commit[1]) == {
        "req": "r1", "epoch": 2, "attempts": [["run", 7, 10], ["old", 3]], "query": None}
    assert msgpack.unpackb(encode_request(Abort("r2", 2))[1]) == {"req": "r2", "epoch": 2}
    stale = encode_reply(FlushAck("r3", 0, 0, stale=True))
    assert stale[0] == OK and msgpack.unpackb(stale[1]) == {"req": "r3", "batches": 0, "rows": 0,
                                                            "stale": True}
    dup = encode_reply(CommitAck("r4", True, 0, 0, 3))
    assert msgpack.unpackb(dup[1]) == {"req": "r4", "duplicate": True, "published_batches": 0,
                                       "rows": 0, "next_epoch": 3}
    err = encode_reply(Refusal(None, "nope"))
    assert err[0] == ERR and msgpack.unpackb(err[1]) == {"req": None, "error": "nope"}


BAD_VALUES = [None, -1, 1.5, True, "x", [], {}]


@settings(max_examples=examples(200))
@given(msg=requests.filter(lambda m: not isinstance(m, Data)), data=st.data())
def test_a_mistyped_or_missing_field_is_refused_with_the_request_id(msg, data):
    header = msgpack.unpackb(encode_request(msg)[1])
    name = data.draw(st.sampled_from(sorted(k for k in header if k != "req")))
    if data.draw(st.booleans()):
        del header[name]
        if name in ("attempts", "query"):  # optional fields
            assert decode_request([msg.KIND, msgpack.packb(header)]).req == msg.req
            return
    else:
        bad = data.draw(st.sampled_from(BAD_VALUES))
        if (name, bad) in (("attempts", None), ("attempts", []), ("query", None),
                           ("query", "x"), ("run", "x")):
            return  # valid values
        header[name] = bad
    with pytest.raises(IngestMessageError) as e:
        decode_request([msg.KIND, msgpack.packb(header)])
    assert e.value.req == msg.req


@pytest.mark.parametrize("frames", [
    [], [b"DATA"], [b"NOPE", msgpack.packb({"req": "r1"})], [b"COMMIT", b"\xc1not msgpack"],
    [b"COMMIT", msgpack.packb({"req": "r2"})], [b"COMMIT", msgpack.packb(["r2", 1])],
    [b"DATA", msgpack.packb(["r", "x", 0, 1, 2]), b"payload"],
    [b"DATA", msgpack.packb(["r", 1, 0, 1, 2])],
    [b"DATA", msgpack.packb(["r", 1, 0, 1, 2]), b"p", b"extra"],
    [b"FLUSH", msgpack.packb({"req": "r", "run": "r", "epoch": 0, "attempt": 1, "batches": 1,
                              "rows": 1}), b"extra"],
    [b"COMMIT", msgpack.packb({"req": "r", "epoch": 0, "attempts": [["r", 1, 2, 3]]})],
    [b"COMMIT", msgpack.packb({"req": "r", "epoch": 0, "attempts": [[1, 1]]})],
])
def test_malformed_requests_are_refused(frames):
    with pytest.raises(IngestMessageError):
        decode_request(frames)


def test_malformed_replies_are_refused_and_a_late_reply_keeps_its_id():
    for frames in ([], [OK], [b"MAYBE", msgpack.packb({"req": "r"})], [OK, b"\xc1"],
                   [OK, msgpack.packb({"req": "r", "batches": 1})]):
        with pytest.raises(IngestMessageError):
            decode_reply(frames, FLUSH)
    # a late ABORT acknowledgement read while waiting for a FLUSH: refused, with its id
    with pytest.raises(IngestMessageError) as e:
        decode_reply(encode_reply(AbortAck("old-1", 2)), FLUSH)
    assert e.value.req == "old-1"
