"""The pure fan-out policy (epochstream.transport.fanout) against a model of bounded pipes, with
no sockets: Hypothesis chooses broadcasts, grants, reads, deaths, probes and the clock."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hypothesis_profiles import examples

from epochstream import wire
from epochstream.transport.fanout import Fanout
from epochstream.transport.sockets import FULL, GONE, SENT

PIPE = 3  # messages a peer's pipe holds (its ZeroMQ high-water mark, in the model)
MAX_MESSAGES, MAX_BYTES = 6, 60


class Pipes:
    """What the sockets would do: each peer has a bounded pipe; a dead peer is GONE."""

    def __init__(self):
        self.pipe: dict[bytes, list] = {}
        self.read: dict[bytes, list] = {}
        self.dead: set[bytes] = set()

    def transmit(self, ident, frames):
        if ident in self.dead:
            return GONE
        pipe = self.pipe.setdefault(ident, [])
        if len(pipe) >= PIPE:
            return FULL
        pipe.append(frames)
        return SENT

    def consume(self, ident, n):
        pipe = self.pipe.get(ident, [])
        got, self.pipe[ident] = pipe[:n], pipe[n:]
        self.read.setdefault(ident, []).extend(got)
        return got


def _data(i: int, size: int = 10) -> list:
    return [wire.DATA, b"\x00", bytes([i % 256]) * size]


class FanoutMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.fan = Fanout("'t' partition 0", 0, max_messages=MAX_MESSAGES, max_bytes=MAX_BYTES,
                          credit_timeout=5.0)
        self.pipes = Pipes()
        self.now = 0.0
        self.sent: list = []  # every counted message, in order
        self.joined_at: dict[bytes, int] = {}  # ident -> index of the first message it is owed
        self.granted: dict[bytes, int] = {}
        self.credit_peer: dict[bytes, bool] = {}
        self.next_id = 0

    @rule(credit=st.one_of(st.none(), st.integers(1, 4)))
    def join(self, credit):
        ident = bytes([self.next_id])
        self.next_id += 1
        self.fan.join(ident, credit, f"sub-{ident.hex()}")
        self.joined_at[ident] = len(self.sent)
        self.granted[ident] = credit or 0
        self.credit_peer[ident] = credit is not None

    @precondition(lambda self: not self.fan.blocked())
    @rule(size=st.integers(1, 30))
    def broadcast(self, size):
        frames = _data(len(self.sent), size)
        self.sent.append(frames)
        self.fan.broadcast(frames, self.pipes.transmit, self.now)

    @rule()
    def heartbeat(self):
        self.fan.broadcast([wire.HEARTBEAT, b"\x80"], self.pipes.transmit, self.now, counted=False)

    @rule(data=st.data(), n=st.integers(1, 4))
    def peer_reads(self, data, n):
        if not self.joined_at:
            return
        ident = data.draw(st.sampled_from(sorted(self.joined_at)))
        self.pipes.consume(ident, n)

    @rule(data=st.data(), n=st.integers(1, 4))
    def peer_grants(self, data, n):
        peers = sorted(i for i in self.fan.peers if self.fan.peers[i].credit is not None)
        if not peers:
            return
        ident = data.draw(st.sampled_from(peers))
        assert self.fan.grant(ident, n, self.pipes.transmit)
        self.granted[ident] += n

    @rule(data=st.data())
    def peer_dies(self, data):
        if not self.joined_at:
            return
        self.pipes.dead.add(data.draw(st.sampled_from(sorted(self.joined_at))))

    @rule(dt=st.floats(0.1, 3.0))
    def tick_and_probe(self, dt):
        self.now += dt
        self.fan.probe([wire.HEARTBEAT, b"\x80"], self.pipes.transmit, self.now)

    @rule()
    def drain(self):
        self.fan.drain(self.pipes.transmit)

    # -- invariants ------------------------------------------------------------------------
    def _delivered(self, ident) -> list:
        return [f for f in self.pipes.read.get(ident, []) + self.pipes.pipe.get(ident, [])
                if f[0] == wire.DATA]

    @invariant()
    def stream_order_without_loss_or_duplicates(self):
        """Each peer got a contiguous run of the messages broadcast since it joined, in order;
        what it did not get is in its backlog (or it was evicted / is gone)."""
        for ident, start in self.joined_at.items():
            got = self._delivered(ident)
            owed = self.sent[start:]
            assert got == owed[:len(got)], ident
            peer = self.fan.peers.get(ident)
            if peer is not None and not peer.evicted:
                assert list(peer.backlog) == owed[len(got):], ident

    @invariant()
    def credit_is_never_overspent(self):
        for ident, is_credit in self.credit_peer.items():
            if is_credit:
                assert len(self._delivered(ident)) <= self.granted[ident]
                peer = self.fan.peers.get(ident)
                if peer is not None and peer.credit is not None:
                    assert peer.credit >= 0

    @invariant()
    def backlogs_are_bounded(self):
        """A plain peer past a bound is evicted; a flow-controlled one holds the producer back
        (it is full, and no broadcast runs while full)."""
        for peer in self.fan.peers.values():
            assert len(peer.backlog) <= MAX_MESSAGES and peer.backlog_bytes <= MAX_BYTES + 40
            assert peer.backlog_bytes == sum(len(b"".join(f)) for f in peer.backlog)

    @invariant()
    def evicted_peers_are_told(self):
        for ident in self.joined_at:
            peer = self.fan.peers.get(ident)
            if peer is not None and peer.evicted:
                assert not peer.backlog and peer.notice is not None
        for ident, frames in self.pipes.read.items():
            notices = [f for f in frames if f[0] == wire.NOTICE]
            assert all(wire.decode(n).code == "lagged" for n in notices)

    @invariant()
    def stalled_flow_control_peer_is_evicted_after_credit_timeout(self):
        for peer in self.fan.peers.values():
            if peer.credit is not None and peer.stalled_since is not None:
                assert self.now - peer.stalled_since < 5.0  # evicted at the first probe past it


TestFanout = FanoutMachine.TestCase
TestFanout.settings = settings(max_examples=examples(60), stateful_step_count=40, deadline=None)


def test_hung_credit_peer_is_evicted_and_unblocks_the_producer():
    fan = Fanout("'t' partition 0", 0, max_messages=2, max_bytes=1000, credit_timeout=1.0)
    pipes = Pipes()
    fan.join(b"h", 1, "hung")
    for i in range(3):  # 1 sent (credit), 2 queued: full
        fan.broadcast(_data(i), pipes.transmit, 0.0)
    assert fan.full and fan.blocked()
    fan.probe([wire.HEARTBEAT, b"\x80"], pipes.transmit, 0.5)
    assert fan.blocked()  # not yet
    fan.probe([wire.HEARTBEAT, b"\x80"], pipes.transmit, 1.2)
    assert not fan.blocked() and fan.stats["subscribers_evicted"] == 1
    assert [f[0] for f in pipes.pipe[b"h"]][-1] == wire.NOTICE
    assert "no credit granted" in fan.log[0]


def test_gone_peer_is_forgotten_when_probed():
    fan = Fanout("'t' partition 0", 0, max_messages=10, max_bytes=1000, credit_timeout=30)
    pipes = Pipes()
    fan.join(b"d", 1, "dead")
    fan.broadcast(_data(0), pipes.transmit, 0.0)
    fan.broadcast(_data(1), pipes.transmit, 0.0)  # credit spent: waits in the backlog
    pipes.dead.add(b"d")
    fan.probe([wire.HEARTBEAT, b"\x80"], pipes.transmit, 1.0)
    assert b"d" not in fan.peers and fan.stats["subscribers_lost"] == 1


def test_credit_counted_in_epochs_spends_only_on_frontier_updates():
    """A peer with credit counted in epochs (a pulling subscriber) is sent data freely up to
    its granted frontier updates; then everything waits, and a grant releases exactly one more
    frontier advance (with the data before it)."""
    fan = Fanout("'t' partition 0", 0, max_messages=100, max_bytes=10_000, credit_timeout=30)
    fan.join(b"e", 1, "puller", epochs=True)
    frontier = [wire.FRONTIER, b"\x91\x92\x00\xff"]
    sent = []

    def transmit(ident, frames):
        sent.append(frames[0])
        return SENT

    for frames in (_data(0), _data(1), frontier, _data(2), frontier, _data(3)):
        fan.broadcast(frames, transmit, 0.0)
    assert sent == [wire.DATA, wire.DATA, wire.FRONTIER]  # one epoch: then nothing
    assert len(fan.peers[b"e"].backlog) == 3
    assert fan.grant(b"e", 1, transmit)
    fan.drain(transmit)
    assert sent[3:] == [wire.DATA, wire.FRONTIER]  # exactly one more frontier advance
    assert len(fan.peers[b"e"].backlog) == 1
    # a message-counted peer spends on data too
    fan2 = Fanout("'t' partition 0", 0, max_messages=100, max_bytes=10_000, credit_timeout=30)
    sent.clear()
    fan2.join(b"m", 1, "messages")
    for frames in (_data(0), _data(1), frontier):
        fan2.broadcast(frames, transmit, 0.0)
    assert sent == [wire.DATA]
