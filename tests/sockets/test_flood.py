"""No client can abort a publisher, and a publisher killed at the worst moment cannot abort a
subscriber (issue 26; docs/reliability.md, "Flooding clients").

libzmq 4.3.5 aborts a process (``Assertion failed: !_io_error (stream_engine_base.cpp:310)``,
zeromq/libzmq #4767) when a connection whose input it stopped (its pipe at the receive
high-water mark) breaks and the engine then sends on it: its own ZMTP PING, or the PONG to a
buffered PING. Before, 6 connections flooding a publisher for a second and going away aborted
it. Every process here is real: the publisher in its own process (so an abort is seen as its
exit status, SIGABRT, not as the test run dying), flooders and stalled peers as raw pyzmq
sockets in other processes, two good subscribers in this one."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth
from hypothesis import HealthCheck, given, settings, strategies as st

from epochstream import Catalog, Subscriber
from epochstream.security import Security
from epochstream.transport.quota import DEFAULT_BURST

sys.path.insert(0, str(Path(__file__).parent.parent))
from hypothesis_profiles import examples  # noqa: E402

pytestmark = pytest.mark.slow

RECORDS = 5  # records per epoch
#: the documented bound (docs/reliability.md): what a publisher may grow by while flooded
MEMORY_BOUND_MB = 200

PUBLISHER = r"""
import json, sys, time
from epochstream import Catalog, Publisher
from epochstream.security import Security
cat, hb, keys, epochs, pace = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
    float(sys.argv[5])
sec = None
if keys:
    sec = Security.curve(server_secret=keys + "/server.key_secret", allow=keys + "/allow")
def status(field):
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":"))
pub = Publisher("t", catalog=Catalog(cat), heartbeat_interval=hb, security=sec)
print("ready", pub.endpoint, status("VmHWM"), flush=True)
sys.stdin.readline()  # go
for e in range(epochs):
    pub.send(e, [(e, i) for i in range(%d)])
    pub.advance_to(e + 1)
    time.sleep(pace)
pub.flush(30)
print("stats", json.dumps(dict(pub.stats), separators=(",", ":")), status("VmHWM"), flush=True)
pub.close(linger=5)
print("closed", flush=True)
""" % RECORDS

#: a raw peer that attacks a publisher with a plan: a JSON list of steps
#: ["flood", kinds, seconds, conns, zmtp_ping_ms] | ["stall", seconds] | ["hit", n] | ["garbage", n]
ATTACKER = r"""
import json, os, sys, time, zmq
from epochstream import wire
ep, plan, secret, server = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = zmq.Context()
MSGS = {
    "h": wire.encode_control(wire.HELLO, topic="t", partition=0, id="flood"),
    "c": wire.encode_control(wire.CREDIT, messages=5),
    "b": wire.encode_control(wire.BYE),
    "u": wire.encode_control(wire.UPDATE, id=1, filter=[[0, {"keys": [1]}]]),
    "r": wire.encode_control(wire.READ, topic="t", partition=0, req=1, time=1, received=0),
    "p": wire.encode_control(wire.PING, id="flood"),
    "g": [b"\xff\x00garbage", os.urandom(40)],
    "1": [b"p"],
}
def sock(ping_ms=0, rcvhwm=1000):
    s = ctx.socket(zmq.DEALER)
    if secret:
        from epochstream.security import load_keypair
        pub, sec = load_keypair(secret)
        s.curve_publickey, s.curve_secretkey = pub.encode(), sec.encode()
        s.curve_serverkey = server.encode()
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 100_000)
    s.setsockopt(zmq.RCVHWM, rcvhwm)
    if ping_ms:
        s.setsockopt(zmq.HEARTBEAT_IVL, ping_ms)
    s.connect(ep)
    return s
sent = 0
for step in plan:
    if step[0] == "flood":
        _, kinds, seconds, conns, ping_ms = step
        socks = [sock(ping_ms) for _ in range(conns)]
        msgs = [MSGS[k] for k in kinds]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for s in socks:
                for i in range(100):
                    try:
                        s.send_multipart(msgs[i % len(msgs)], zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        pass
        for s in socks:
            s.close(0)
    elif step[0] == "stall":  # a hello, then read nothing; go away with data unread (RST)
        s = sock(rcvhwm=1)
        s.send_multipart(wire.encode_control(wire.HELLO, topic="t", partition=0, id="stall"))
        time.sleep(step[1])
        s.close(0)
    elif step[0] == "hit":  # connect, hello, go away at once, n times
        for _ in range(step[1]):
            s = sock()
            s.send_multipart(MSGS["h"])
            s.close(0)
    elif step[0] == "garbage":
        s = sock()
        for _ in range(step[1]):
            s.send_multipart([os.urandom(n) for n in (1, 7, 300)[: 1 + sent % 3]])
            sent += 1
        time.sleep(0.05)
        s.close(0)
    time.sleep(0.05)
print("done", sent, flush=True)
"""


def _run(code: str, *args) -> subprocess.Popen:
    """``code`` in a new Python process; its stderr is read as it comes (a peer that logs a
    lot must not block on a full pipe) and its last lines kept in ``proc.err``."""
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], text=True,
                            bufsize=1, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.err = collections.deque(maxlen=20)
    threading.Thread(target=lambda: proc.err.extend(proc.stderr), daemon=True).start()
    return proc


def _err(proc: subprocess.Popen) -> str:
    time.sleep(0.1)
    return "".join(proc.err)[-800:]


def _line(proc: subprocess.Popen, prefix: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ln = proc.stdout.readline()
        if not ln:
            raise AssertionError(f"process exited (rc={proc.wait(5)}) before {prefix!r}: "
                                 f"{_err(proc)!r}")
        if ln.startswith(prefix):
            return ln.split()
    raise AssertionError(f"no {prefix!r} within {timeout} s")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


class Good:
    """A real subscriber reading every epoch in a thread; ``problems`` lists what was wrong."""

    def __init__(self, cat: Path, epochs: int, security=None):
        self.epochs, self.got, self.problems = epochs, [], []
        self.sub = Subscriber("t", Catalog(cat), timeout=20, security=security)
        assert self.sub.wait_ready(20)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for ep in self.sub.epochs(timeout=60):
                recs = sorted(ep.records)
                if recs != [(ep.time, i) for i in range(RECORDS)]:
                    self.problems.append(f"epoch {ep.time} not whole: {recs}")
                self.got.append(ep.time)
                if len(self.got) == self.epochs:
                    break
        except Exception as e:  # noqa: BLE001 - reported by check()
            self.problems.append(repr(e))
        finally:
            self.sub.close()

    def check(self):
        self.thread.join(90)
        assert not self.thread.is_alive(), "a good subscriber hung"
        assert not self.problems, self.problems
        assert self.got == list(range(self.epochs))


def _attack(tmp_path: Path, plan: list, *, hb: float, keys: Path | None = None,
            epochs: int = 150, pace: float = 0.01) -> dict:
    """Publish ``epochs`` epochs to two good subscribers while an attacker runs ``plan``;
    the publisher must stay up and serve both whole. Returns the publisher's stats (with its
    VmHWM growth, MB, as ``grown_mb``)."""
    cat = tmp_path / "cat"
    if keys is not None:  # any key in allow/ (alice's: the flooder's too) may subscribe
        Catalog(cat).grant("*", "t", "subscribe")
    pub = _run(PUBLISHER, cat, hb, keys or "", epochs, pace)
    attacker = None
    try:
        _, endpoint, hwm0 = _line(pub, "ready")
        client = server = None
        if keys is not None:
            client = Security.curve(client_secret=keys / "alice.key_secret")
            server = zmq.auth.load_certificate(keys / "server.key")[0].decode()
        goods = [Good(cat, epochs, client) for _ in range(2)]
        attacker = _run(ATTACKER, endpoint, json.dumps(plan),
                        keys / "alice.key_secret" if keys else "", server or "")
        pub.stdin.write("go\n")
        pub.stdin.flush()
        _line(attacker, "done", 120)
        fields = _line(pub, "stats", 120)
        stats = json.loads(fields[1])
        stats["grown_mb"] = (int(fields[2]) - int(hwm0)) / 1024
        for g in goods:
            g.check()
        _line(pub, "closed", 30)
        assert pub.wait(10) == 0, _err(pub)
        return stats
    finally:
        if attacker is not None:
            _kill(attacker)
        rc = pub.poll()
        _kill(pub)
        assert rc in (None, 0), f"the publisher died: rc={rc}: {_err(pub)!r}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("floodkeys")
    for n in ("server", "alice"):
        zmq.auth.create_certificates(d, n)
    (d / "allow").mkdir()
    (d / "allow" / "alice.key").write_bytes((d / "alice.key").read_bytes())
    return d


ALL_KINDS = "hcburpg1"


@pytest.mark.parametrize("hb", [0.05, 1.0], ids=["hb=0.05", "hb=1"])
@pytest.mark.parametrize("secured", [False, True], ids=["plain", "curve"])
def test_six_connections_flooding_every_kind_cannot_abort_the_publisher(tmp_path, keys, hb,
                                                                        secured):
    """6 connections flood every message kind (valid ones, garbage, a wrong frame count) as
    fast as pyzmq sends, twice, and go away with the publisher's answers unread; half of them
    send ZMTP PINGs every 10 ms (a PING buffered behind the flood was the other way to abort).
    Before: the publisher aborted (SIGABRT). Now it stays up, both good subscribers get every
    epoch whole, the flooders are refused by their quota and cut, and its memory grows by less
    than the documented bound."""
    plan = [["flood", ALL_KINDS, 0.7, 3, 0], ["flood", ALL_KINDS, 0.7, 3, 10]] * 2
    stats = _attack(tmp_path, plan, hb=hb, keys=keys if secured else None)
    assert stats.get("peers_refused_quota", 0) >= 1, stats
    assert stats["grown_mb"] < MEMORY_BOUND_MB, stats


def test_a_peer_under_its_quota_is_served_and_never_refused(tmp_path):
    """The quota refuses floods, not busy peers: one connection sending half its burst of
    pings in one go, then a steady stream below the rate, is never refused."""
    plan = [["flood", "p", 0.0, 1, 0]]  # a connection that sends nothing, as a control
    stats = _attack(tmp_path, plan, hb=0.2, epochs=30)
    assert stats.get("peers_refused_quota", 0) == 0, stats
    cat = tmp_path / "steady"
    pub = _run(PUBLISHER, cat, 0.2, "", 5, 0.01)
    try:
        _, endpoint, _ = _line(pub, "ready")
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.connect(endpoint)
        from epochstream import wire
        ping = wire.encode_control(wire.PING, id="steady")
        for _ in range(DEFAULT_BURST // 2):
            s.send_multipart(ping)
        time.sleep(0.5)
        for _ in range(20):  # ~4,000/s for 0.5 s
            for _ in range(200):
                s.send_multipart(ping)
            time.sleep(0.025)
        answers = []
        while s.poll(500):
            answers.append(s.recv_multipart())
        s.close(0)
        assert answers and all(b"quota" not in a[-1] for a in answers)
        pub.stdin.write("go\n")
        pub.stdin.flush()
        stats = json.loads(_line(pub, "stats")[1])
        assert stats.get("peers_refused_quota", 0) == 0, stats
    finally:
        _kill(pub)


STEPS = st.one_of(
    st.tuples(st.just("flood"), st.sampled_from(["hcburpg1", "r", "p", "c", "g", "u", "h"]),
              st.sampled_from([0.4, 0.7, 0.1]), st.integers(2, 6), st.sampled_from([0, 10])),
    st.tuples(st.just("stall"), st.sampled_from([0.1, 0.5])),
    st.tuples(st.just("hit"), st.integers(1, 20)),
    st.tuples(st.just("garbage"), st.integers(1, 300)),
)


@settings(max_examples=examples(3), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.lists(STEPS, min_size=2, max_size=5), hb=st.sampled_from([0.05, 0.3]))
def test_any_mix_of_flood_stall_and_disconnect_leaves_the_publisher_serving(tmp_path_factory,
                                                                            plan, hb):
    """A Hypothesis-chosen sequence of floods (of one kind or all, with or without ZMTP
    pings), stalled subscribers that go away with a full pipe, connect-and-vanish hits and
    garbage, against a publisher serving two good subscribers: it stays up, they get every
    epoch whole, memory stays within the bound."""
    stats = _attack(tmp_path_factory.mktemp("mix"), [list(s) for s in plan], hb=hb, epochs=80)
    assert stats["grown_mb"] < MEMORY_BOUND_MB, stats


# -- the subscriber side --------------------------------------------------------------------------
STALLED = r"""
import sys, time
from epochstream import Catalog, Subscriber
from epochstream.errors import PublisherLost
sub = Subscriber("t", Catalog(sys.argv[1]), rcvhwm=2, timeout=2, ping_interval=0.05)
assert sub.wait_ready(20)
it = sub.epochs(timeout=30)
first = next(it)
print("stalling", first.time, flush=True)
sys.stdin.readline()  # the publisher was killed meanwhile
n = 1
try:
    for ep in it:
        n += 1
except PublisherLost as e:
    print("lost", n, flush=True)
else:
    print("ended", n, flush=True)
"""

FAST_PUBLISHER = r"""
import sys, time
from epochstream import Catalog, Publisher
pub = Publisher("t", catalog=Catalog(sys.argv[1]), heartbeat_interval=float(sys.argv[2]))
print("ready", flush=True)
e = 0
while True:
    pub.send(e, [(e, "x" * 200)] * 20)
    pub.advance_to(e + 1)
    e += 1
    if e % 50 == 0:
        time.sleep(0.001)
"""


@pytest.mark.parametrize("hb", [0.05, 0.3])
def test_a_publisher_killed_while_a_subscriber_stalls_with_a_full_pipe_cannot_abort_it(
        tmp_path, hb):
    """A subscriber with a full pipe (rcvhwm=2) stops reading; its publisher, streaming as
    fast as it can with a short heartbeat, is killed (-9: TCP reset) while it stalls; then it
    reads on. Before, a ZMTP PING buffered behind the data (or its own ping timer) made libzmq
    abort the subscriber once the broken connection was drained. Now it reads what arrived and
    raises PublisherLost."""
    cat = tmp_path / "cat"
    pub = _run(FAST_PUBLISHER, cat, hb)
    sub = None
    try:
        _line(pub, "ready")
        sub = _run(STALLED, cat)
        _line(sub, "stalling")
        time.sleep(max(0.5, 4 * hb))  # pipes fill, pings (if any) queue behind the data
        _kill(pub)
        time.sleep(0.3)
        sub.stdin.write("go\n")
        sub.stdin.flush()
        words = _line(sub, "lost", 60)
        assert int(words[1]) >= 1
        assert sub.wait(10) == 0
    finally:
        _kill(pub)
        if sub is not None:
            rc = sub.poll()
            _kill(sub)
            assert rc in (None, 0), f"the subscriber died: rc={rc}: {_err(sub)!r}"
