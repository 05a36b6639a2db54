"""Serving a partition's epoch log to remote subscribers on the publisher's own endpoint
(docs/history.md, "Remote history").

A subscriber (or :class:`~epochstream.history.History`) on another machine cannot open the
log's segment files; it asks the partition's live publisher instead: an ``r`` message
(``{"topic", "partition", "req", "time"}``, any connection, no ``h`` first) names one complete
epoch, and the publisher answers ``R`` (the epoch's payloads, one frame per data message, as
sent) or ``X history`` (``reason``: ``"unavailable"``, ``"corrupt"``, ``"busy"``). The wire is
in :mod:`epochstream.wire`; the client is :mod:`epochstream.history_remote`.

Reads happen on a thread of their own, never on the loop thread: the loop hands a checked
request over (:meth:`LogServer.submit`), the reader thread looks the epoch up in the index
(:meth:`~epochstream.catalog.Catalog.history_epoch`, one primary-key read), reads and checks it
(:func:`~epochstream.epochlog.read_epoch`) and queues the reply, and the loop sends it when
woken (:meth:`LogServer.drain`) — live publishing goes on meanwhile. Memory is bounded: at
most ``max_pending`` reads (32) are queued or answered-but-unsent at a time, at most
``per_peer`` (8) for one connection; beyond them a request is answered ``busy`` at once (the
client waits and asks again). A reader's ``r`` says how many ``R`` answers it has received on
its connection (``received``): answers sent but not yet received (in its pipe, or on the way)
count against its 8 too, so a reader that stops reading makes the publisher hold at most 8
epochs for it, not a pipe's worth (``sndhwm``). One reply holds one epoch of one partition. A reply that finds its
connection's pipe full (``sndhwm``) is kept, still counted, and sent again a moment later; one
whose connection is gone is dropped.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time as _time
from typing import Any, Callable

import zmq

from .. import wire
from ..errors import HistoryCorrupt, ProtocolError
from ..frontier import Antichain
from ..order import check_time
from .sockets import FULL, inproc_pair

__all__ = ["LogServer", "HistoryServer", "MAX_PENDING", "PER_PEER"]

log = logging.getLogger("epochstream.transport")

MAX_PENDING = 32
"""Reads queued or answered-but-unsent at one time, over all connections."""
PER_PEER = 8
"""Reads one connection may have outstanding (its client's window is at most this)."""
RETRY_S = 0.005
"""Seconds before replies that found their connection's pipe full are sent again."""
_RETRY = object()  # a request-queue item: wake the loop again in RETRY_S (replies are held)
_WRAP = 1 << 31  # the ``received`` count of an ``r`` and the server's sent count wrap here
_MAX_CONNECTIONS = 10_000  # sent counts kept (the oldest is forgotten, then re-synced)


class LogServer:
    """``LogServer(ctx, topic, partition, order, catalog, directory)``: the reader thread of
    one partition's log (``stats``: the counter to count in, the publisher's). The loop thread polls :attr:`socket` (woken when replies are ready),
    calls :meth:`submit` for every ``r`` and :meth:`drain` when woken, and :meth:`close` when it
    ends. ``directory``: the log's directory (the publisher's
    :class:`~epochstream.epochlog.LogWriter` writes there)."""

    def __init__(self, ctx: zmq.Context, topic: str, partition: int, order, catalog,
                 directory: str, *, max_pending: int = MAX_PENDING, per_peer: int = PER_PEER,
                 stats: collections.Counter | None = None):
        self.topic, self.partition, self.order = topic, partition, order
        self._catalog, self._dir = catalog, str(directory)
        self.max_pending, self.per_peer = max_pending, per_peer
        self.socket, self._kick = inproc_pair(ctx)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: collections.deque = collections.deque()
        self._outstanding: dict[bytes, int] = {}  # loop thread only
        self._sent: dict[bytes, int] = {}  # R answers sent per connection (mod 2**31; loop only)
        self._retrying = False  # a _RETRY is queued (set by the loop, cleared by the reader)
        # the publisher's stats: "history_reads" (reader thread), "history_refused" (loop)
        self.stats = collections.Counter() if stats is None else stats
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"epochstream-history-{topic}-{partition}")
        self._thread.start()

    # -- loop thread -----------------------------------------------------------------------
    def submit(self, ident: bytes, header: dict) -> list | None:
        """Queue the read of a decoded ``r`` header from connection ``ident``; returns the
        frames of an immediate answer (``X error`` for another topic/partition or a time that
        does not fit the order, ``X history busy`` past the bounds), or ``None`` if queued."""
        req = header["req"]
        if header["topic"] != self.topic or header["partition"] != self.partition:
            return wire.encode_notice(
                "history", f"this publisher serves {self.topic!r} partition {self.partition}, not "
                           f"{header['topic']!r} partition {header['partition']}",
                req=req, reason="unavailable")
        try:
            t = check_time(self.order, header["time"])
        except (ProtocolError, TypeError, ValueError) as e:
            return wire.encode_notice("history", f"bad time: {e}", req=req, reason="error")
        pending = sum(self._outstanding.values())
        queued = mine = self._outstanding.get(ident, 0)
        received = header["received"]  # epochs sent to it not received yet: still in its pipe
        sent = self._sent.setdefault(ident, received)  # first seen (or forgotten): in sync
        if len(self._sent) > _MAX_CONNECTIONS:
            self._sent.pop(next(iter(self._sent)))
        mine += (sent - received) % _WRAP
        if pending >= self.max_pending or mine >= self.per_peer:
            self.stats["history_refused"] += 1
            return wire.encode_notice(
                "history", f"publisher busy serving history ({pending} reads outstanding); "
                           f"ask again", req=req, reason="busy")
        self._outstanding[ident] = queued + 1
        self._requests.put((ident, req, t))
        return None

    def drain(self, transmit: Callable[[bytes, list], Any]) -> None:
        """Consume the wake-up and send every reply that is ready (loop thread)."""
        while True:
            try:
                self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        replies = self._replies
        held: list = []
        full: set = set()
        while replies:
            ident, frames = replies.popleft()
            if ident in full or transmit(ident, frames) == FULL:
                full.add(ident)  # its pipe is full: keep the reply (still counted), retry
                held.append((ident, frames))
                continue
            if frames[0] == wire.HISTORY and ident in self._sent:
                self._sent[ident] = (self._sent[ident] + 1) % _WRAP
            left = self._outstanding.get(ident, 1) - 1  # sent, or the connection is gone
            if left > 0:
                self._outstanding[ident] = left
            else:
                self._outstanding.pop(ident, None)
        if held:
            replies.extendleft(reversed(held))
            if not self._retrying:
                self._retrying = True
                self._requests.put(_RETRY)

    def close(self) -> None:
        """Stop the reader thread (a read in progress finishes) and close the wake-up pipe."""
        self._requests.put(None)
        self._thread.join(10.0)
        self._kick.close(0)
        self.socket.close(0)

    # -- reader thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            if item is _RETRY:  # replies wait for a full pipe: wake the loop again shortly
                _time.sleep(RETRY_S)
                self._retrying = False
                self._wake()
                continue
            ident, req, t = item
            try:
                frames = self._read(req, t)
            except Exception as exc:  # noqa: BLE001 - one failed read must not stop serving
                log.exception("%s/%s: history read of %r failed", self.topic, self.partition, t)
                frames = wire.encode_notice("history", f"history read failed: {exc!r}",
                                            req=req, reason="error")
            self._replies.append((ident, frames))
            self._wake()

    def _wake(self) -> None:
        try:
            self._kick.send(b"K", zmq.NOBLOCK)
        except zmq.Again:  # the loop has a wake-up waiting already
            pass

    def _read(self, req: int, t) -> list:
        self.stats["history_reads"] += 1
        wire_t = list(t) if isinstance(t, tuple) else t
        rec = self._catalog.history_epoch(self.topic, self.partition, t)
        if rec is not None:
            from ..log.format import read_epoch  # the log package only for a publisher with one

            try:
                payloads = [p for _, p in read_epoch(self._dir, rec)]
            except HistoryCorrupt as e:
                if self._retained(t):
                    log.error("%s/%s: %s", self.topic, self.partition, e)
                    return wire.encode_notice("history", str(e), req=req, reason="corrupt")
                rec = None  # deleted by retention while being read
            else:
                return wire.encode_history(req, wire_t, self.partition, payloads)
        state = self._catalog.history_state(self.topic, self.partition)
        if state is None:
            why, retained = "keeps no epoch log", None
        elif not Antichain(self.order, state.since).less_equal(t):
            why, retained = f"retains epochs only from {list(state.since)} on", list(state.since)
        elif Antichain(self.order, state.lower).less_equal(t):
            why, retained = "has not completed it yet", list(state.since)
        else:  # complete, retained, and no data of this partition at t: an empty answer
            return wire.encode_history(req, wire_t, self.partition, [])
        return wire.encode_notice(
            "history", f"partition {self.partition} of {self.topic!r} {why} (epoch {t!r})",
            req=req, reason="unavailable", retained=retained)

    def _retained(self, t) -> bool:
        state = self._catalog.history_state(self.topic, self.partition)
        return state is not None and Antichain(self.order, state.since).less_equal(t)


#: deprecated alias of :class:`LogServer`, removed in the next release
HistoryServer = LogServer
