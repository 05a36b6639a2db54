"""Control-message fuzzing against a REAL publisher (tcp://127.0.0.1, no mocks).

A raw ZeroMQ DEALER plays a hostile subscriber: it sends control messages of every kind (``h``,
``p``, ``c``, ``b``) whose fields are mutated to every msgpack type (nil, bool, int including
negative and 2**64-1, float, str, bytes, array, map, nested), headers that are not maps, wrong
frame counts, unknown kinds, wrong version bytes, non-msgpack bytes and empty frames, from a
connection the publisher does not know and from one that it registered (a valid hello first).

After every message the DEALER sends a *sentinel* (an unknown kind the publisher always answers
with ``X error``), so each answer can be attributed to the message that caused it:

- the publisher must answer the sentinel (else that message ended its loop);
- a malformed message (judged by this file's own reading of the schema in ``docs/protocol.md``
  and :mod:`epochstream.wire`, not by calling :func:`wire.decode_control`) must be answered with
  exactly one ``X`` notice of code ``"error"``; no message gets more than one.

After each batch a fresh :class:`Subscriber` must join and receive a complete epoch that the
publisher publishes (``send`` + ``advance_to``).

Each example is a real socket round trip: ``examples(n)`` keeps the default run short and
``HYPOTHESIS_PROFILE=thorough`` scales it up.
"""
from __future__ import annotations

import contextlib
import math
import time

import hypothesis_profiles  # noqa: F401  (loads the fast/thorough profile)
import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis_profiles import examples

from epochstream import wire
from epochstream.transport import Publisher, Subscriber

TOPIC = "fuzz"
SENTINEL = [b"!sentinel"]  # an unknown kind: always answered with ``X error`` naming it
ANSWER_TIMEOUT = 3.0  # seconds; a live publisher answers in milliseconds
HEARTBEAT = 0.1


# -- this test's own reading of the control schema (the oracle) ---------------------------------
def _is_int(v) -> bool:
    return type(v) is int  # bool is not an int here


SCHEMA = {  # kind letter -> field -> (required, valid?)
    b"h": {"topic": (True, lambda v: type(v) is str),
           "partition": (True, lambda v: _is_int(v) and v >= 0),
           "id": (True, lambda v: type(v) is str and len(v) <= 128),
           "credit": (False, lambda v: _is_int(v) and 1 <= v <= 2**31)},
    b"p": {"id": (True, lambda v: type(v) is str and len(v) <= 128)},
    b"c": {"messages": (True, lambda v: _is_int(v) and 1 <= v <= 2**31)},
    b"b": {},
}
KINDS = [wire.HELLO, wire.PING, wire.CREDIT, wire.BYE]
assert [k[:1] for k in KINDS] == list(SCHEMA) and all(k[1] == 1 for k in KINDS)


def malformed(frames: list[bytes]) -> bool:
    """True iff ``frames`` is not a well-formed subscriber -> publisher message."""
    if not frames or len(frames[0]) != 2 or frames[0][1] != 1 or frames[0][:1] not in SCHEMA:
        return True
    if len(frames) != 2:
        return True
    try:
        h = msgpack.unpackb(frames[1], raw=False, use_list=False, strict_map_key=False)
    except Exception:
        return True
    if type(h) is not dict:
        return True
    for field, (required, ok) in SCHEMA[frames[0][:1]].items():
        if field in h:
            if not ok(h[field]):
                return True
        elif required:
            return True
    return False


def pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def show(frames) -> str:
    out = []
    for f in frames:
        try:
            v = msgpack.unpackb(f, raw=False, strict_map_key=False) if len(f) > 2 else f
        except Exception:
            v = f
        out.append(repr(v)[:120])
    return "[" + ", ".join(out) + "]"


# -- a hostile subscriber --------------------------------------------------------------------
class Hostile:
    """A raw DEALER connected to ``pub``; with ``register`` it first sends a valid hello
    (optionally with ``credit``), so the publisher knows the connection."""

    def __init__(self, pub: Publisher, register: bool = False, credit: int | None = None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(pub.endpoint)
        if register:
            hello = {"topic": TOPIC, "partition": 0, "id": f"hostile-{id(self)}"}
            if credit is not None:
                hello["credit"] = credit
            self.sock.send_multipart(wire.encode_control(wire.HELLO, **hello))

    def exchange(self, frames: list[bytes]):
        """Send ``frames`` then the sentinel; the ``X error`` notices the publisher sent in
        between (other messages -- snapshot, data, rejoin... -- are skipped), or ``None`` if the
        sentinel was not answered within :data:`ANSWER_TIMEOUT`."""
        self.sock.send_multipart(frames)
        self.sock.send_multipart(SENTINEL)
        errors = []
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(max(1, int(left * 1000))):
                return None
            msg = wire.decode(self.sock.recv_multipart())
            if isinstance(msg, wire.Notice) and msg.code == "error":
                if "!sentinel" in msg.message:
                    return errors
                errors.append(msg)

    def close(self):
        self.sock.close(0)


def check(hostile: Hostile, frames: list[bytes]) -> str | None:
    """Exchange one message; a description of what went wrong, or None."""
    errors = hostile.exchange(frames)
    if errors is None:
        return f"publisher stopped answering after {show(frames)}"
    if malformed(frames) and len(errors) != 1:
        return f"malformed {show(frames)} answered with {len(errors)} X error notices, not 1"
    if len(errors) > 1:
        return f"{show(frames)} answered with {len(errors)} X error notices"
    return None


def assert_serves(pub: Publisher, epoch: int = 0) -> None:
    """A fresh subscriber joins and receives a complete epoch published after it joined."""
    records = [{"epoch": epoch, "i": i} for i in range(3)]
    with Subscriber(TOPIC, endpoints=[pub.endpoint], timeout=5, ping_interval=HEARTBEAT) as sub:
        assert sub.wait_ready(5), "the publisher no longer answers a hello"
        pub.send(epoch, records)
        pub.advance_to(epoch + 1)
        got = next(iter(sub.epochs(timeout=5)))
        assert got.time == epoch and list(got.records) == records


@contextlib.contextmanager
def publisher():
    pub = Publisher(TOPIC, heartbeat_interval=HEARTBEAT)
    ok = False
    try:
        yield pub
        ok = True
    finally:
        try:
            pub.close(linger=1.0, wait=True)
        except Exception:
            if ok:
                raise


# -- Hypothesis strategies ---------------------------------------------------------------------
INT_EDGES = [0, 1, -1, 2**31, 2**31 + 1, 2**63, 2**64 - 1, -2**63]
leaves = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2**63, 2**64 - 1), st.sampled_from(INT_EDGES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.text(min_size=120, max_size=140),
    st.binary(max_size=8),
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3)), inner, max_size=3),
    max_leaves=6)
VALID_FIELD = {
    "topic": st.sampled_from([TOPIC, "other"]),
    "partition": st.sampled_from([0, 1, 2**64 - 1]),
    "id": st.text(max_size=128),
    "credit": st.integers(1, 2**31),
    "messages": st.integers(1, 2**31),
}


@st.composite
def control_headers(draw, kind: bytes):
    """A header for ``kind``: every field kept valid, dropped, or replaced by any msgpack value;
    perhaps unknown extra keys; or the whole header replaced by any value (mostly not a map)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    header = draw(st.dictionaries(st.text(max_size=6), values, max_size=2))
    for field in SCHEMA[kind[:1]]:
        how = draw(st.sampled_from(["valid", "drop", "any"]))
        if how == "valid":
            header[field] = draw(VALID_FIELD[field])
        elif how == "any":
            header[field] = draw(values)
        else:
            header.pop(field, None)
    return header


kinds = st.sampled_from(KINDS)
bad_kinds = st.one_of(
    st.sampled_from([b"Z\x01", b"S\x01", b"D\x01", b"F\x01", b"X\x01", b"H\x01", b"h", b"p", b"",
                     b"hh\x01", b"\x00\x01", b"\xff\xff"]),
    st.binary(max_size=3))
header_messages = kinds.flatmap(lambda k: control_headers(k).map(lambda h: [k, pack(h)]))
raw_messages = st.one_of(
    kinds.map(lambda k: [k]),  # no header frame
    st.tuples(kinds, st.lists(st.binary(max_size=4), min_size=1, max_size=2)).map(
        lambda t: [t[0], pack({"topic": TOPIC, "partition": 0, "id": "x", "messages": 1}), *t[1]]),
    st.tuples(bad_kinds, st.one_of(st.just(pack({})), values.map(pack))).map(list),  # unknown kind
    st.tuples(kinds, st.integers(0, 255).filter(lambda v: v != 1)).map(  # another version
        lambda t: [t[0][:1] + bytes([t[1]]), pack({"id": "x"})]),
    st.tuples(kinds, st.binary(max_size=12)).map(list),  # (mostly) not msgpack
    st.tuples(kinds, st.sampled_from([b"\xc1", b"\x92\x01", b"\x80\x80", b"\x81\x81\xa1a\x01\x01",
                                      b"\xdd\xff\xff\xff\xff"])).map(list),
    st.lists(st.just(b""), min_size=1, max_size=3),  # empty frames
    kinds.map(lambda k: [k, b""]),
)
messages = st.one_of(header_messages, header_messages, raw_messages)
sessions = st.lists(
    st.tuples(st.sampled_from([None, "plain", "credit"]),  # unknown / registered / flow-controlled
              st.lists(messages, min_size=1, max_size=6)),
    min_size=1, max_size=3)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sessions)
def test_publisher_survives_fuzzed_control_messages_and_keeps_serving(batch):
    with publisher() as pub:
        for register, msgs in batch:
            hostile = Hostile(pub, register=register is not None,
                              credit=4 if register == "credit" else None)
            try:
                for frames in msgs:
                    problem = check(hostile, frames)
                    assert problem is None, problem
            finally:
                hostile.close()
        pub.send(0, ["still", "sending"])  # a call on the publisher does not raise
        assert pub.flush(5)  # (so that the subscriber below joins after epoch 0 began)
        assert_serves(pub, epoch=1)


# -- every field of every kind x every msgpack type, deterministically --------------------------
POOL = [None, True, False, 0, 1, 7, -1, 2**31, 2**31 + 1, 2**63, 2**64 - 1, -2**63, 1.5, 0.0, 1.0,
        -0.5, math.inf, math.nan, "", "x", "7", "x" * 128, "x" * 129, b"", b"x", [], [1], ["x"],
        {}, {"k": 1}, {"id": "x"}, [{"k": [1, {"n": None}]}], {"k": {"n": [1]}}, [[[]]]]
BASE = {
    wire.HELLO: {"topic": TOPIC, "partition": 0, "id": "sweep", "credit": 4},
    wire.PING: {"id": "sweep"},
    wire.CREDIT: {"messages": 1},
    wire.BYE: {},
}


def sweep_messages() -> list[list[bytes]]:
    out = []
    for kind, base in BASE.items():
        for field in SCHEMA[kind[:1]]:
            for value in POOL:
                out.append([kind, pack(dict(base, **{field: value}))])
            out.append([kind, pack({k: v for k, v in base.items() if k != field})])  # missing
        for value in POOL:
            if not isinstance(value, dict):
                out.append([kind, pack(value)])  # header not a map
            out.append([kind, pack(dict(base, extra=value))])  # unknown key: ignored
        out += [[kind], [kind, pack(base), b""], [kind, pack(base), pack(base), b"x"],
                [kind, b""], [kind, b"\xc1"], [kind, b"\x92\x01"], [kind, b"\x80\x80"],
                [kind[:1] + b"\x02", pack(base)], [kind[:1] + b"\x00", pack(base)],
                [kind[:1], pack(base)], [kind + b"\x01", pack(base)]]
    out += [[b""], [b"", b""], [b"", pack({})], [b"Z\x01", pack({})], [wire.SNAPSHOT, pack({})],
            [wire.DATA, pack(0), b"\x90"], [wire.NOTICE, pack({"code": "error"})]]
    return out


def test_every_field_mutated_to_every_type_is_refused_and_the_publisher_keeps_serving():
    """Deterministic sweep: each message on a fresh connection, once unknown to the publisher,
    once registered (valid hello first) and once registered with flow control, so that no
    message depends on what an earlier one did. A publisher that stops answering is replaced,
    so that every failure is listed."""
    failures: list[str] = []
    todo = [(register, frames) for register in (None, "plain", "credit") for frames in sweep_messages()]
    while todo:
        with publisher() as pub:
            while todo:
                register, frames = todo.pop(0)
                hostile = Hostile(pub, register=register is not None,
                                  credit=4 if register == "credit" else None)
                try:
                    problem = check(hostile, frames)
                finally:
                    hostile.close()
                if problem is not None:
                    failures.append(f"[{register or 'unknown'} connection] {problem}")
                    if problem.startswith("publisher stopped"):
                        break  # go on with a new publisher
            else:
                assert_serves(pub)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


@pytest.mark.parametrize("frames", [
    [wire.PING, pack({"id": {"a": 1}})],       # killed the publisher: unhashable type: 'dict'
    [wire.PING, pack({"id": [{"a": 1}]})],     # ... also nested in an array
    [wire.PING, pack({"id": 7})],
    [wire.HELLO, pack({"topic": TOPIC, "partition": False, "id": "x"})],  # False == 0
    [wire.HELLO, pack({"topic": TOPIC, "partition": 0})],                   # no id
    [wire.CREDIT, pack({"messages": True})],
])
def test_known_killers_and_sneaks_are_answered_with_an_error(frames):
    with publisher() as pub:
        hostile = Hostile(pub)
        try:
            errors = hostile.exchange(frames)
            assert errors is not None, f"publisher stopped answering after {show(frames)}"
            assert [e.code for e in errors] == ["error"]
        finally:
            hostile.close()
        assert_serves(pub)
