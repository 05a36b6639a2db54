"""Data-message versions 1 and 2 over real sockets (docs/protocol.md §2.2): a v1-only peer and a
v2 peer on one publisher both get every epoch whole, each in its version; a v2 subscriber
against a publisher forced to version 1 and against an old publisher (no ``wire`` in ``S``);
garbage v2 frames refused with ``X error`` (publisher side) or a precise ``WireError``
(subscriber side), everyone else served."""
import time
import uuid

import msgpack
import pytest
import zmq

from epochstream import wire
from epochstream.errors import WireError
from epochstream.transport import Publisher, Subscriber

BIG = 20_000  # bytes of one record that makes a payload above wire2.SPLIT_BYTES


def _raw(endpoint: str, offer=None, topic="t") -> zmq.Socket:
    """A hand-rolled subscriber: a DEALER that sent a hello (``offer``: its ``wire`` field, or
    none at all, as a subscriber from before version 2)."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    hello = {"topic": topic, "partition": 0, "id": uuid.uuid4().hex}
    if offer is not None:
        hello["wire"] = offer
    s.send_multipart(wire.encode_control(wire.HELLO, **hello))
    return s


def _read_raw(s: zmq.Socket, until_time, timeout=5.0):
    """``(snapshot header, [(frame-0 kind, n frames, time, records)], notices)`` read until a
    data message at ``until_time`` arrived."""
    snap, data, notices = None, [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not s.poll(100):
            continue
        frames = s.recv_multipart()
        kind = frames[0][:2]
        if kind == wire.SNAPSHOT:
            snap = wire.decode_snapshot_meta(frames)
        elif kind in (wire.DATA, wire.DATA2):
            m = wire.decode(frames)
            data.append((kind, len(frames), m.time, list(msgpack.unpackb(bytes(m.data)))))
            if m.time == until_time:
                break
        elif kind == wire.NOTICE:
            notices.append(wire.decode(frames))
    return snap, data, notices


def _wait_subscribers(pub, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while pub.subscribers < n:
        assert time.monotonic() < deadline, f"only {pub.subscribers} of {n} joined"
        time.sleep(0.01)


def _publish(pub):
    """Epochs 0..2 of small messages, epoch 3 one big payload; returns ``{time: records}``."""
    want = {}
    for e in range(3):
        for i in range(4):
            pub.send(e, [[e, i]])
            want.setdefault(e, []).append([e, i])
        pub.advance_to(e + 1)
    pub.send(3, [["x" * BIG]])
    want[3] = [["x" * BIG]]
    pub.advance_to(4)
    pub.flush()
    return want


def _by_time(data):
    out: dict = {}
    for _, _, t, records in data:
        out.setdefault(t, []).extend(records)
    return out


def test_v1_and_v2_peers_on_one_publisher_each_get_every_epoch_in_their_version():
    with Publisher("t", heartbeat_interval=0.2) as pub:
        old, new = _raw(pub.endpoint), _raw(pub.endpoint, [1, 2])
        subs = [Subscriber("t", endpoints=[pub.endpoint], wire_version=v) for v in (1, 2)]
        for sub in subs:
            assert sub.wait_ready(5)
        _wait_subscribers(pub, 4)
        want = _publish(pub)
        snap_old, data_old, _ = _read_raw(old, 3)
        snap_new, data_new, _ = _read_raw(new, 3)
        assert snap_old["wire"] == 1 and snap_new["wire"] == 2
        # the old peer: only 3-frame version-1 messages; the new one: version 2, one frame
        # (two for the payload above SPLIT_BYTES)
        assert {(k, n) for k, n, t, _ in data_old} == {(wire.DATA, 3)}
        assert {(k, n) for k, n, t, _ in data_new if t != 3} == {(wire.DATA2, 1)}
        assert [(k, n) for k, n, t, _ in data_new if t == 3] == [(wire.DATA2, 2)]
        assert _by_time(data_old) == _by_time(data_new) == want
        pub.close()
        for sub in subs:
            got = {e.time: [list(r) for r in e.records] for e in sub.epochs(timeout=5)}
            assert got == want
            sub.close()
        old.close()
        new.close()


def test_v2_subscriber_against_a_publisher_forced_to_v1():
    with Publisher("t", heartbeat_interval=0.2, wire_version=1) as pub:
        raw = _raw(pub.endpoint, [1, 2])
        sub = Subscriber("t", endpoints=[pub.endpoint])
        assert sub.wait_ready(5)
        _wait_subscribers(pub, 2)
        want = _publish(pub)
        snap, data, _ = _read_raw(raw, 3)
        assert snap["wire"] == 1 and {(k, n) for k, n, _, _ in data} == {(wire.DATA, 3)}
        pub.close()
        assert {e.time: [list(r) for r in e.records] for e in sub.epochs(timeout=5)} == want
        sub.close()
        raw.close()


def test_a_hello_offering_no_version_in_common_is_refused_and_others_served():
    with Publisher("t", heartbeat_interval=0.2, wire_version=1) as pub:
        raw = _raw(pub.endpoint, [2, 7])
        sub = Subscriber("t", endpoints=[pub.endpoint])
        assert sub.wait_ready(5)
        _wait_subscribers(pub, 1)
        pub.send(0, [[1]])
        _, _, notices = _read_raw(raw, None, timeout=1.0)
        assert [n.code for n in notices] == ["error"]
        assert "no data-message version in common" in notices[0].message
        pub.close()
        assert [list(e.records) for e in sub.epochs(timeout=5)] == [[(1,)]]
        sub.close()
        raw.close()


class _OldPublisher:
    """A publisher from before version 2, hand-rolled on a ROUTER: its ``S`` has no ``wire``
    field and it sends version-1 data — or whatever ``frames`` a test gives it."""

    def __init__(self):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def hello(self, timeout=5.0) -> tuple[bytes, dict]:
        assert self.sock.poll(int(timeout * 1000)), "no hello"
        ident, *frames = self.sock.recv_multipart()
        return ident, wire.decode_control(frames)[1]

    def send(self, ident, frames):
        self.sock.send_multipart([ident, *frames])

    def snapshot(self, ident):
        self.send(ident, [wire.SNAPSHOT, msgpack.packb(
            {"lower": [0], "upper": [], "topic": "t", "partition": 0, "order": "total",
             "codec": "msgpack", "incarnation": "old", "heartbeat": 1.0})])


def test_v2_subscriber_reads_an_old_publisher_without_the_field():
    old = _OldPublisher()
    sub = Subscriber("t", endpoints=[old.endpoint])
    ident, hello = old.hello()
    assert hello["wire"] == (1, 2)  # offered; an old publisher ignores it
    old.snapshot(ident)
    old.send(ident, wire.encode_data(0, msgpack.packb([[1], [2]])))
    old.send(ident, wire.encode_frontier(wire.LowerFrontierUpdate(((0, -1), (1, 1)))))
    old.send(ident, wire.encode_frontier(wire.LowerFrontierUpdate(((1, -1),))))
    assert [(e.time, list(e.records)) for e in sub.epochs(timeout=5)] == [(0, [(1,), (2,)])]
    sub.close()
    old.sock.close()


@pytest.mark.parametrize("frame, message", [
    (b"D\x02\x00", "at least 4 bytes"),
    (b"D\x02\x41\x00" + b"\x00" * 8, "arity 65 is above 64"),
    (b"D\x02\x02\x00" + b"\x00" * 16, "arity 2 does not fit the topic's order"),
    (b"D\x02\x00\x00\x01\x02", "truncated time"),
    (b"D\x09\x00\x00" + b"\x00" * 8, "unsupported data message version 9"),
])
def test_garbage_v2_data_fails_the_subscriber_with_a_precise_wire_error(frame, message):
    old = _OldPublisher()
    sub = Subscriber("t", endpoints=[old.endpoint])
    ident, _ = old.hello()
    old.snapshot(ident)
    old.send(ident, [frame])
    with pytest.raises(WireError, match=message):
        list(sub.epochs(timeout=5))
    sub.close()
    old.sock.close()


@pytest.mark.parametrize("extra, message", [
    ([b"p"], "unknown message kind b'p'"),  # a stray frame: refused as a message of its own
    ([wire.data_header2(0)], "does not decode"),  # a v2 header alone: an empty payload
])
def test_frames_after_a_complete_v2_data_frame_fail_the_subscriber_never_join_the_data(
        extra, message):
    """A v2 data frame longer than its header is a whole message (docs/protocol.md §2.2): the
    subscriber reads it without asking for more frames. A publisher that sends more frames
    after it gets the extra frames read as messages of their own and refused — the data before
    them is not extended, and no epoch is released with anything of them."""
    old = _OldPublisher()
    sub = Subscriber("t", endpoints=[old.endpoint])
    ident, _ = old.hello()
    old.snapshot(ident)
    old.send(ident, [wire.data_header2(0) + msgpack.packb([[1]]), *extra])
    old.send(ident, wire.encode_frontier(wire.LowerFrontierUpdate(((0, -1), (1, 1)))))
    with pytest.raises(WireError, match=message):
        list(sub.epochs(timeout=5))
    sub.close()
    old.sock.close()


def test_garbage_v2_frames_sent_to_a_publisher_get_x_error_and_everyone_else_is_served():
    with Publisher("t", heartbeat_interval=0.2) as pub:
        bad = _raw(pub.endpoint, [1, 2])
        good = Subscriber("t", endpoints=[pub.endpoint])
        assert good.wait_ready(5)
        _wait_subscribers(pub, 2)
        garbage = [[b"D\x02"], [b"D\x02\x41\x00" + b"\x00" * 8], [b"D\x02\x00\x00\x01"],
                   [wire.data_header2(1) + b"\x91\x01"], [b"D\x03\x00\x00" + b"\x00" * 8],
                   [wire.data_header2((1, 2)), b"p"]]
        for frames in garbage:
            bad.send_multipart(frames)
        deadline = time.monotonic() + 5
        while pub.stats["bad_messages"] < len(garbage):  # each answered before data is sent
            assert time.monotonic() < deadline
            time.sleep(0.01)
        want = _publish(pub)
        _, data, notices = _read_raw(bad, 3)
        assert [n.code for n in notices] == ["error"] * len(garbage)
        assert all("unknown message kind" in n.message or "unsupported protocol version" in
                   n.message for n in notices), [n.message for n in notices]
        assert pub.stats["bad_messages"] == len(garbage)
        assert _by_time(data) == want  # the offender stays registered: its hello was fine
        pub.close()
        assert {e.time: [list(r) for r in e.records] for e in good.epochs(timeout=5)} == want
        good.close()
        bad.close()


def test_handed_out_messages_are_not_kept_alive_by_the_poll_batch():
    """One object per message: the join's DataMessage gets its decoded records when handed out,
    so the batch of a poll must drop each one as it goes (else ~128 messages of decoded records
    stay alive together and the garbage collector runs about once per message: measured
    ~10,000 collections in a 2 s run instead of ~8)."""
    import gc

    payload = msgpack.packb([(i, "x", 1.5) for i in range(1000)])
    with Publisher("t", heartbeat_interval=0.2, coalesce_bytes=0) as pub:
        sub = Subscriber("t", endpoints=[pub.endpoint], rcvhwm=100_000)
        assert sub.wait_ready(5)
        _wait_subscribers(pub, 1)
        for e in range(3):
            for _ in range(100):
                pub.send_encoded(e, payload)
            pub.advance_to(e + 1)
        pub.flush()
        time.sleep(0.5)  # everything waits in the subscriber's socket: polls read full batches
        before = sum(g["collections"] for g in gc.get_stats())
        n = 0
        for item in sub.events(timeout=5):  # (epochs() holds an epoch's records until released)
            n += len(getattr(item, "data", ()))
            if n == 300_000:
                break
        collections = sum(g["collections"] for g in gc.get_stats()) - before
        assert n == 300_000
        # 300 messages of 1,000 records: a few dozen collections at most when each message is
        # freed once consumed (~420 when the batch keeps them: the mutation was tried)
        assert collections < 100, collections
        sub.close()


@pytest.mark.parametrize("version", [1, 2])
def test_flow_controlled_subscriber_with_payloads_received_as_memoryviews(version):
    """Frames over 2 KiB arrive as memoryviews of the zmq.Frame (no copy): a v2 message of
    5 KB (one frame) and a v1 one must still be counted for credit and cached by time."""
    with Publisher("t", heartbeat_interval=0.2, coalesce_bytes=0) as pub:
        sub = Subscriber("t", endpoints=[pub.endpoint], credit=4, wire_version=version)
        assert sub.wait_ready(5)
        _wait_subscribers(pub, 1)
        for e in range(5):
            for i in range(5):
                pub.send(e, [["x" * 5000, i]])
            pub.advance_to(e + 1)
        pub.close()
        assert [(ep.time, len(ep.records)) for ep in sub.epochs(timeout=5)] == \
            [(e, 5) for e in range(5)]
        sub.close()
