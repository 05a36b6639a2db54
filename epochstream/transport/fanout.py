"""Fan-out policy of one publisher partition: which subscriber gets which message when, per-peer
backlogs and their bounds, credit (flow control), probing and eviction. Pure: no sockets, no
clock. The driver (the publisher's loop) hands in ``now`` (seconds, monotonic) and a
``transmit(ident, frames) -> SENT | FULL | GONE`` function that tries one non-blocking send
(:func:`~epochstream.transport.sockets.transmit_to`); tests hand in a model of bounded pipes.

Rules (docs/protocol.md §4):

- Stream order per peer: a message never overtakes an older one waiting in that peer's backlog.
- A peer without flow control whose backlog exceeds ``max_messages`` or ``max_bytes`` is
  evicted: its backlog is freed and an ``X lagged`` notice is queued (delivered when its pipe
  takes it). Its subscriber id is remembered (bounded: 10,000 ids) so a ping from it on a new
  connection is answered with the notice again.
- A flow-controlled peer (``credit`` not ``None``) is sent at most its granted ``D``/``F``
  messages; heartbeats spend no credit. When its backlog reaches either bound, :attr:`Fanout.full`
  is set and the driver stops taking calls (back-pressure); a peer that holds the producer back
  for ``credit_timeout`` seconds without a grant is evicted at the next :meth:`Fanout.probe`.
- Peers that are sent nothing (credit spent, pipe full) are probed with a heartbeat: a send that
  reports ``GONE`` forgets the peer and frees its backlog.

Costs: :meth:`Fanout.broadcast` is O(peers) sends; bounds are checked in O(1) per peer.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable

from .. import wire
from .sockets import FULL, GONE, SENT

__all__ = ["Peer", "Fanout", "Transmit", "frames_nbytes"]

#: frame 0 of a frontier update (``F``): what spends a peer's credit counted in epochs
FRONTIER_KIND = b"F\x01"
#: the first two bytes of frame 0 of the messages that spend credit counted in messages (``D``
#: in either version, ``F``)
_CREDITED = frozenset((b"D\x01", b"D\x02", FRONTIER_KIND))

Transmit = Callable[[bytes, list], int]

_MAX_EVICTED_IDS = 10_000


def frames_nbytes(frames: Iterable) -> int:
    """Total size of a message's frames, bytes."""
    return sum(len(f) for f in frames)


class Peer:
    """One registered subscriber connection. ``ident``: its ROUTER routing id; ``sub_id``: the
    subscriber's own stable id (the same on every partition and reconnection); ``credit``:
    ``None`` (no flow control) or the ``D``/``F`` messages it may still be sent — or, with
    ``epochs=True``, the frontier updates (``F``): credit counted in epochs, so a pulling
    subscriber is sent at most that many frontier advances ahead, whatever their size;
    ``wire``: the data-message version its connection was answered with (1 or 2)."""

    __slots__ = ("ident", "sub_id", "credit", "backlog", "backlog_bytes", "evicted", "notice",
                 "stalled_since", "epochs", "interest", "wire")

    def __init__(self, ident: bytes, credit: int | None = None, sub_id: str | None = None,
                 epochs: bool = False, wire: int = 1):
        self.ident = ident
        self.wire = wire
        self.sub_id = sub_id
        self.credit = credit
        self.epochs = epochs
        self.backlog: collections.deque = collections.deque()
        self.backlog_bytes = 0
        self.evicted = False
        self.notice: list | None = None  # frames to send once the backlog is out
        self.stalled_since: float | None = None  # backlog full (holding the producer back) since
        self.interest = None  # what it wants (transport/interest.py), None: everything

    def full(self, max_messages: int, max_bytes: int) -> bool:
        """True when the backlog reached either bound."""
        return len(self.backlog) >= max_messages or self.backlog_bytes >= max_bytes


class Fanout:
    """The peers of one partition and what each is owed (see the module docstring).

    ``max_messages`` / ``max_bytes``: backlog bounds per peer (messages / bytes);
    ``credit_timeout``: seconds; ``describe``: the partition's name for notices, e.g.
    ``"'trades' partition 0"``; ``partition``: its index (carried in notices)."""

    def __init__(self, describe: str, partition: int, *, max_messages: int, max_bytes: int,
                 credit_timeout: float):
        self.describe = describe
        self.partition = partition
        self.max_messages = int(max_messages)
        self.max_bytes = int(max_bytes)
        self.credit_timeout = float(credit_timeout)
        self.peers: dict[bytes, Peer] = {}
        self.evicted_ids: collections.OrderedDict = collections.OrderedDict()
        self.full = False  # a flow-controlled peer's backlog reached its bound
        self.stats: collections.Counter = collections.Counter()
        self.log: list[str] = []  # eviction messages, for the driver to log (then clear)

    # -- membership ------------------------------------------------------------------------
    def join(self, ident: bytes, credit: int | None, sub_id: str, epochs: bool = False,
             wire: int = 1) -> Peer:
        """Register ``ident`` (replacing a previous registration of it), served data messages
        in version ``wire``."""
        self.evicted_ids.pop(sub_id, None)
        peer = self.peers[ident] = Peer(ident, credit, sub_id, epochs, wire)
        self.stats["subscribers_joined"] += 1
        return peer

    def leave(self, ident: bytes) -> None:
        """Forget ``ident`` (its ``bye``, or its connection is gone)."""
        self.peers.pop(ident, None)

    def lagged_notice(self, sub_id: str) -> list | None:
        """The ``X lagged`` notice of a subscriber id evicted recently, else ``None``."""
        return self.evicted_ids.get(sub_id)

    def registered(self) -> int:
        """Peers currently served (evicted ones excluded)."""
        return sum(1 for p in list(self.peers.values()) if not p.evicted)

    def queued(self) -> tuple[int, int, int]:
        """``(messages, bytes, stalled peers)`` waiting in the peers' backlogs now: read from
        another thread (approximate, as :meth:`registered`); a stalled peer holds the producer
        back (its credit or backlog bound exhausted)."""
        messages = nbytes = stalled = 0
        for p in list(self.peers.values()):
            messages += len(p.backlog)
            nbytes += p.backlog_bytes
            stalled += p.stalled_since is not None
        return messages, nbytes, stalled

    def grant(self, ident: bytes, messages: int, transmit: Transmit) -> bool:
        """A ``c`` message: ``messages`` more credit for ``ident``. False if it is not a
        registered flow-controlled peer (nothing changes)."""
        peer = self.peers.get(ident)
        if peer is None or peer.credit is None:
            return False
        peer.credit += messages
        peer.stalled_since = None
        if self._drain(peer, transmit):
            self.leave(ident)
        return True

    # -- the stream ------------------------------------------------------------------------
    def broadcast(self, frames: list, transmit: Transmit, now: float, counted: bool = True,
                  variant: Callable | None = None, render: Callable | None = None) -> None:
        """Send ``frames`` to every peer in stream order. ``counted``: a ``D``/``F`` message
        (spends credit, waits in the backlog when it cannot go now); heartbeats
        (``counted=False``) skip peers with a backlog and spend no credit. ``variant(peer)``
        (data filtered at the source): for a peer with an ``interest``, the frames to send it
        instead, or ``None`` to send it nothing of this message. ``render(frames)`` (a data
        message): the frames as data-message version 2, for the peers served version 2 —
        called lazily, at most once per distinct frames of this message."""
        gone = v2 = rendered = None
        all_frames = frames
        for peer in self.peers.values():
            if peer.evicted:
                continue
            if variant is not None:
                if peer.interest is not None:
                    frames = variant(peer)
                    if frames is None:
                        continue
                else:
                    frames = all_frames
                if render is not None and peer.wire == 2:  # one rendering per distinct variant
                    rendered = rendered if rendered is not None else {}
                    got = rendered.get(id(frames))
                    if got is None:
                        got = rendered[id(frames)] = render(frames)
                    frames = got
            elif render is not None:
                if peer.wire == 2:
                    frames = v2 if v2 is not None else (v2 := render(all_frames))
                else:
                    frames = all_frames
            if peer.backlog and self._drain(peer, transmit):
                (gone := gone or []).append(peer.ident)
                continue
            if not peer.backlog and (not counted or peer.credit is None or peer.credit > 0):
                status = transmit(peer.ident, frames)
                if status == SENT:
                    if counted and peer.credit is not None and (
                            not peer.epochs or frames[0] == FRONTIER_KIND):
                        peer.credit -= 1
                    continue
                if status == GONE:
                    (gone := gone or []).append(peer.ident)
                    continue
            if counted:
                self._queue(peer, frames, now)
        if gone:
            for ident in gone:
                self.peers.pop(ident, None)
                self.stats["subscribers_lost"] += 1

    def post(self, ident: bytes, frames: list, transmit: Transmit, now: float) -> None:
        """Send a notice to one peer in stream order (behind its backlog), spending no credit."""
        peer = self.peers.get(ident)
        if peer is None or peer.evicted:
            return
        if not peer.backlog and transmit(ident, frames) == SENT:
            return
        peer.backlog.append(frames)
        peer.backlog_bytes += frames_nbytes(frames)

    def _queue(self, peer: Peer, frames: list, now: float) -> None:
        peer.backlog.append(frames)
        peer.backlog_bytes += frames_nbytes(frames)
        if peer.credit is None:
            if len(peer.backlog) > self.max_messages or peer.backlog_bytes > self.max_bytes:
                self.evict(peer, "messages / bytes queued beyond the socket's high-water mark")
        elif peer.full(self.max_messages, self.max_bytes):
            self.full = True  # the producer is held back from now on
            if peer.stalled_since is None:
                peer.stalled_since = now

    def blocked(self) -> bool:
        """True while a flow-controlled peer's backlog is full: take no more calls. Updates
        :attr:`full`."""
        mm, mb = self.max_messages, self.max_bytes
        self.full = any(p.credit is not None and p.full(mm, mb) for p in self.peers.values())
        return self.full

    def pending(self) -> bool:
        """True while some peer has a backlog or an undelivered notice."""
        return any(p.backlog or p.notice for p in self.peers.values())

    def drain(self, transmit: Transmit) -> None:
        """Send what each peer's pipe takes from its backlog (then its notice); forget peers
        that are finished with (notice delivered) or gone."""
        done = [p.ident for p in self.peers.values()
                if (p.backlog or p.notice) and self._drain(p, transmit)]
        for ident in done:
            self.peers.pop(ident, None)

    def _drain(self, peer: Peer, transmit: Transmit) -> bool:
        """True when ``peer`` is finished with (notice delivered, or its connection is gone)."""
        while peer.backlog:
            if peer.credit is not None and peer.credit <= 0:
                return False
            frames = peer.backlog[0]
            status = transmit(peer.ident, frames)
            if status != SENT:
                return status == GONE
            peer.backlog.popleft()
            peer.backlog_bytes -= frames_nbytes(frames)
            if peer.credit is not None and (frames[0] == FRONTIER_KIND if peer.epochs
                                            else frames[0][:2] in _CREDITED):
                peer.credit -= 1
        if peer.notice is not None:
            status = transmit(peer.ident, peer.notice)
            if status == FULL:
                return False
            peer.notice = None
            return True
        return False

    # -- liveness and endings --------------------------------------------------------------
    def probe(self, heartbeat: list, transmit: Transmit, now: float, all_peers: bool = False) -> None:
        """Send ``heartbeat`` (spending no credit) to every peer that is sent nothing — credit
        spent or a backlog waiting — or to every peer (``all_peers``, while closing); forget
        the peers that are gone; evict a flow-controlled peer that held the producer back for
        ``credit_timeout`` seconds without a grant."""
        for peer in list(self.peers.values()):
            if peer.evicted:
                continue
            if not (all_peers or peer.backlog or (peer.credit is not None and peer.credit <= 0)):
                continue
            if peer.stalled_since is not None and not peer.full(self.max_messages, self.max_bytes):
                peer.stalled_since = None  # it read enough: no longer holding the producer back
            if (peer.credit is not None and peer.stalled_since is not None
                    and now - peer.stalled_since >= self.credit_timeout):
                self.evict(peer, f"no credit granted for {now - peer.stalled_since:.1f} s while "
                                 f"it held the producer back (credit_timeout {self.credit_timeout} s)")
                if self._drain(peer, transmit):
                    self.leave(peer.ident)
                continue
            if transmit(peer.ident, heartbeat) == GONE:
                self.peers.pop(peer.ident, None)
                self.stats["subscribers_lost"] += 1

    def evict(self, peer: Peer, why: str) -> None:
        """Free ``peer``'s backlog and queue its ``X lagged`` notice."""
        queued, nbytes = len(peer.backlog), peer.backlog_bytes
        peer.backlog.clear()
        peer.backlog_bytes = 0
        peer.evicted = True
        peer.credit = None
        message = (f"evicted from {self.describe}: {why} ({queued} messages / {nbytes} bytes "
                   f"queued; bounds {self.max_messages} messages / {self.max_bytes} bytes)")
        self.log.append(message)
        peer.notice = wire.encode_notice("lagged", message, partition=self.partition)
        if peer.sub_id is not None:
            self.evicted_ids[peer.sub_id] = peer.notice
            while len(self.evicted_ids) > _MAX_EVICTED_IDS:
                self.evicted_ids.popitem(last=False)
        self.stats["subscribers_evicted"] += 1

    def notify_all(self, notice: list, transmit: Transmit) -> None:
        """Queue ``notice`` behind every served peer's backlog (earlier messages still go first)
        and send what can go now: used when the publisher aborts."""
        for peer in self.peers.values():
            if not peer.evicted:
                peer.notice = notice
        self.drain(transmit)
