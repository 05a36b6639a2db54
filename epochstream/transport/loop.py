"""The loop thread of a :class:`~epochstream.transport.publisher.Publisher`: it owns the ROUTER,
registers subscribers (taking each one's snapshot in the same step), runs the commands the
calling threads hand over, and lets the pure :class:`~epochstream.transport.fanout.Fanout`
decide who gets what; remote history reads (``r``) go to the partition's
:class:`~epochstream.transport.history_server.HistoryServer` thread and its answers are sent
from here. Heartbeats: peers that are sent nothing are probed every
``heartbeat_interval``; the others get a heartbeat when the stream was idle that long."""

from __future__ import annotations

import logging
import time as _time
from typing import Callable

import zmq

from .. import wire
from ..errors import HistoryWriteError
from ..filters import Filter, FilterError, FilterSchedule, union_arrow, union_records
from ..order import check_time
from ..events import InitialFrontierSnapshot
from ..frontier import Antichain, apply_changes
from ..order import dual
from ..retention import check_interval
from .fanout import Fanout
from .handoff import Handoff
from .log_server import LogServer as HistoryServer
from .interest import ALL, Interest, sent_filter
from .upstream import HELLO, UPDATE, UpstreamCover
from .quota import PASS_MESSAGES, Quota
from .sockets import SENT, connection_of, cut, transmit_to

__all__ = ["PublisherLoop", "DATA", "FRONTIER", "SYNC", "ABORT", "STOP", "GATE", "UPPER"]

log = logging.getLogger("epochstream.transport")

# loop commands (caller thread -> loop thread): (kind, argument, frames)
DATA, FRONTIER, SYNC, ABORT, STOP = "data", "frontier", "sync", "abort", "stop"
#: a relay's upstream change is done: argument ``(cover, boundary, error)`` (docs/filters.md)
GATE = "gate"
#: data at a time that grows the upper frontier: argument ``(time, request)``, frames as DATA;
#: the upper frontier request (its sequence number) is recorded first (transport/upper.py).
#: One command, not a marker ahead of the data: it takes no more queue space than the data
UPPER = "upper"

#: payloads of at least this many bytes are wrapped in one ``zmq.Frame`` when the message goes
#: to more than one peer: libzmq then shares the buffer (reference-counted) instead of copying
#: the payload once per subscriber. Below it, the Frame object costs more than the copies save.
SHARE_FRAME_BYTES = 4096

#: only payloads smaller than this are coalesced (and only into messages of at most
#: ``coalesce_bytes``): merging big payloads saves few wire messages, and the subscriber pays for
#: the bigger arrays with garbage collections (docs/benchmarks.md, "Garbage collection")
COALESCE_PAYLOAD_BYTES = 4096

#: warnings about what subscribers send are logged at most once per this many seconds
PEER_WARNING_EVERY_S = 1.0


class PublisherLoop:
    """Loop-side state of one partition. ``publisher`` supplies the identity (topic, partition,
    order, codec, incarnation, heartbeat_interval, coalesce_bytes); ``lower``/``upper``: the
    frontiers at start; ``closing()`` tells whether close()/abort() was called (flow control
    then no longer holds the end of the stream back). :attr:`error` is the exception that ended
    the loop, if any."""

    def __init__(self, publisher, router: zmq.Socket, handoff: Handoff, fanout: Fanout,
                 lower: tuple, upper: tuple, closing: Callable[[], bool]):
        p = publisher
        self.topic, self.partition, self.order, self.codec = p.topic, p.partition, p.order, p.codec
        self.incarnation, self.heartbeat_interval = p.incarnation, p.heartbeat_interval
        self.coalesce_bytes = p.coalesce_bytes
        self._router, self._handoff, self._fanout = router, handoff, fanout
        self._transmit = transmit_to(router)
        self._closing = closing
        self.stats = fanout.stats
        self.error: BaseException | None = None
        # the loop's own copies of the frontiers (what it has sent): snapshots read these
        self._loop_lower: dict = dict.fromkeys(lower, True)
        self._loop_upper = Antichain(dual(self.order), upper)
        self._loop_aborted: list | None = None  # the X aborted notice, once the loop aborted
        # the upper frontier is recorded in the catalog before data beyond it is sent; once the
        # catalog refused (fenced) or failed, nothing more is sent (halted)
        self._upper = getattr(p, "_upper", None)
        self._halted = False
        self._last_broadcast = self._last_probe = _time.monotonic()
        self._stop_linger = 0.0
        # the epoch log (retention): data is logged as it is sent; frontier changes are written
        # at once but sent only after the group commit that makes them durable (_commit_log)
        self._log = getattr(p, "_log", None)
        self._log_lower: dict = dict(self._loop_lower)  # the lower frontier as logged
        self._unsent: list = []  # (update, frames) of frontier changes awaiting the commit
        self.log_error: HistoryWriteError | None = None  # set once the log failed
        self._log_closed = False
        # the age limit also applies while nothing is committed (an idle publisher)
        self._expire_every = None if self._log is None else check_interval(self._log.retention)
        self._last_expire = _time.monotonic()
        # remote history reads (``r``) are served by a reader thread; None without a log
        self._history: HistoryServer | None = None
        self._ctx = p._ctx
        # filtering at the source (docs/filters.md): the topic's key, the bound on distinct
        # programs, and whether some peer has an Interest (then data goes through _variant)
        self.key = getattr(p, "key", None)
        self.max_filter_classes = getattr(p, "max_filter_classes", 32)
        self._filtering = False
        # a relay's publisher: downstream filters travel upstream (transport/upstream.py);
        # ``gate.request(cover)`` asks the relay's thread to change its upstream subscription
        self._gate = getattr(p, "gate", None)
        self._upstream = None if self._gate is None else UpstreamCover(
            self.order, self._gate.key)
        self._last_narrow = float("-inf")
        # security (docs/security.md): who may subscribe; the ZAP User-Id of the message at hand
        self._authz = getattr(p, "_authz", None)
        self._user: str | None = None
        # what one connection may send (transport/quota.py): a flood is refused and cut
        self._quota = Quota()
        self._warned_at, self._warned_count, self._peer_warnings = float("-inf"), 0, 0

    def run(self) -> None:
        """The thread's body: serve until stopped; a failure is kept in :attr:`error`."""
        try:
            if self._log is not None:  # started here: a publisher that fails to start has none
                self._history = HistoryServer(self._ctx, self.topic, self.partition, self.order,
                                              self._log.catalog, str(self._log.dir),
                                              stats=self.stats)
            self._serve()
        except BaseException as exc:  # a bug here must not pass silently: callers raise it
            self.error = exc
            log.exception("publisher loop %s/%s died", self.topic, self.partition)
            raise
        finally:
            if self._log is not None:
                self._log.close()
            if self._history is not None:
                self._history.close()
            for kind, arg, _ in self._handoff.ended():  # nobody may wait for a flush forever
                if kind == SYNC:
                    arg.set()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._handoff.socket, zmq.POLLIN)
        blocked_poller = zmq.Poller()  # while flow control holds the producer back
        blocked_poller.register(self._router, zmq.POLLIN)
        history = self._history
        if history is not None:  # replies go out even while flow control blocks the producer
            poller.register(history.socket, zmq.POLLIN)
            blocked_poller.register(history.socket, zmq.POLLIN)
        commands, fanout = self._handoff.commands, self._fanout
        stop_at = None
        while stop_at is None or (fanout.peers and _time.monotonic() < stop_at):
            pending = fanout.pending()
            # Flow control holds the producer back, except once close()/abort() was called:
            # the end of the stream is never stuck behind a consumer.
            blocked = pending and stop_at is None and not self._closing() and fanout.blocked()
            events = dict((blocked_poller if blocked else poller).poll(
                self._poll_timeout(pending, blocked, stop_at)))
            if self._router in events:
                self._handle_peers()
            if history is not None and history.socket in events:
                history.drain(self._transmit)
            if self._handoff.socket in events:
                self._handoff.woken()
            if not blocked and stop_at is None and commands and self._run_commands():
                stop_at = _time.monotonic() + self._stop_linger
            if pending:
                fanout.drain(self._transmit)
            self._tick(stop_at is not None)

    def _poll_timeout(self, pending: bool, blocked: bool, stop_at: float | None) -> int:
        """Milliseconds to wait for input in this pass of the loop."""
        if stop_at is not None:
            return 1 if pending else 20
        if pending:
            return 0 if (self._handoff.commands and not blocked) else 1
        if self._handoff.commands:
            return 0  # commands left from the last batch: serve peers, then go on
        due = min(self._last_broadcast, self._last_probe) + self.heartbeat_interval
        return max(1, int((due - _time.monotonic()) * 1000))

    def _tick(self, closing: bool) -> None:
        """Heartbeats: probe peers that are sent nothing every interval; broadcast one to the
        others when the stream was idle for an interval."""
        now = _time.monotonic()
        hb = self.heartbeat_interval
        self._cut_refused(now)
        if now - self._last_probe >= hb:
            self._last_probe = now
            frames = wire.encode_heartbeat(list(self._loop_lower))
            self._fanout.probe(frames, self._transmit, now, all_peers=closing)
            self._log_evictions()
            if self._upstream is not None and not closing:
                self._gate_narrow(now)
        if self._authz is not None:  # grants changed: drop peers no longer authorised
            self._authz.enforce(self._fanout.peers, self._fanout.leave, self._transmit)
        if now - self._last_broadcast >= hb and not closing:
            self._last_broadcast = now
            self._fanout.broadcast(wire.encode_heartbeat(list(self._loop_lower)), self._transmit,
                                   now, counted=False)
        every = self._expire_every
        if every is not None and now - self._last_expire >= every and not self._unsent \
                and self.log_error is None and not self._log_closed:
            self._last_expire = now
            self._log.expire(_time.time())

    def _log_evictions(self) -> None:
        for message in self._fanout.log:
            log.warning("%s", message)
        self._fanout.log.clear()

    def _run_commands(self, limit: int = 4096) -> bool:
        """Run queued commands (at most ``limit``, then let the loop serve peers; fewer when a
        flow-controlled peer's backlog fills up); True on STOP."""
        commands, fanout, transmit = self._handoff.commands, self._fanout, self._transmit
        now = self._last_broadcast = _time.monotonic()
        data = 0
        fanout.full = False
        logging_ = self._log is not None
        for _ in range(limit):
            if not commands or fanout.full:
                break
            kind, arg, frames = commands.popleft()
            if kind is DATA:
                if self._halted:
                    continue
                self._loop_upper.insert(arg)
                if commands and self.coalesce_bytes:
                    frames = self._coalesce(arg, frames, now)
                if logging_ and not self._log_data(arg, frames):
                    continue
                if len(fanout.peers) > 1 and len(frames[2]) >= SHARE_FRAME_BYTES:
                    frames = [frames[0], frames[1], zmq.Frame(frames[2])]
                if self._filtering:
                    self._broadcast_filtered(arg, frames, now)
                else:
                    fanout.broadcast(frames, transmit, now)
                data += 1
            elif kind is FRONTIER:
                if self._halted:
                    continue
                if logging_:
                    self._log_frontier(arg, frames)
                    continue
                apply_changes(self._loop_lower, arg.updates)
                fanout.broadcast(frames, transmit, now)
                if self._filtering:
                    self._interests_advance()
                if self._upstream is not None:
                    self._gate_frontier()
            elif kind is UPPER:  # record the upper frontier, then run it as data
                if self._halted:
                    continue
                if not self._upper.ensure(arg[1]):
                    self._upper_refused()
                    continue
                commands.appendleft((DATA, arg[0], frames))
            elif kind is SYNC:
                self._commit_log(now)
                arg.set()
            elif kind is ABORT:
                self._commit_log(now)
                self._close_log()  # nothing more is logged: a successor may open the log now
                self._abort_peers(arg)
            elif kind is GATE:
                self._gate_done(*arg)
            elif kind is STOP:
                self._commit_log(now)
                self._close_log()
                self._stop_linger = arg
                return True
        self._commit_log(now)
        self.stats["data_messages"] += data
        self._handoff.made_space()
        self._log_evictions()
        return False

    # -- the epoch log (retention) ----------------------------------------------------------
    def _close_log(self) -> None:
        """Flush and close the segment file (uncommitted records stay, for recovery to
        truncate); later data and frontier commands are not logged and not sent."""
        if self._log is not None and not self._log_closed:
            self._log.close()
            self._log_closed = True

    def _log_data(self, t, frames: list) -> bool:
        """Append a data message to the log; False (send nothing) once the log failed or was
        closed."""
        if self.log_error is not None or self._log_closed:
            return False
        try:
            self._log.data(t, frames[1], frames[2])
        except HistoryWriteError as e:
            self._log_failed(e)
            return False
        return True

    def _log_frontier(self, update, frames: list) -> None:
        """Write a frontier change's ``F`` record; it is sent after the next commit."""
        if self.log_error is not None or self._log_closed:
            return
        apply_changes(self._log_lower, update.updates)
        try:
            self._log.frontier_write(tuple(self._log_lower), self._loop_upper.elements, frames[1])
        except HistoryWriteError as e:
            self._log_failed(e)
            return
        self._unsent.append((update, frames))
        if self._log.full:  # the segment may roll at this epoch boundary: commit now
            self._commit_log(_time.monotonic())

    def _commit_log(self, now: float) -> None:
        """Group commit: make the frontier changes written so far durable (one fsync, one
        catalog transaction), then send them, in order."""
        if not self._unsent:
            return
        try:
            self._log.commit()
        except HistoryWriteError as e:
            self._log_failed(e)
            return
        unsent, self._unsent = self._unsent, []
        self.stats["log_commits"] += 1
        for update, frames in unsent:
            apply_changes(self._loop_lower, update.updates)
            self._fanout.broadcast(frames, self._transmit, now)
        if self._filtering:
            self._interests_advance()
        if self._upstream is not None:
            self._gate_frontier()

    def _log_failed(self, e: HistoryWriteError) -> None:
        """The log failed: send no more data or frontier changes (no epoch it could not log
        completes), tell every subscriber the publisher aborted; the publisher's next call
        raises :attr:`log_error`."""
        log.error("publisher %s/%s: %s", self.topic, self.partition, e)
        self.log_error = e
        self._unsent.clear()
        if self._loop_aborted is None:
            self._abort_peers(f"the epoch log failed: {e}")

    def _upper_refused(self) -> None:
        """The catalog refused (or could not take) the upper frontier: send no more data or
        frontier changes and tell every subscriber the publisher aborted; the publisher's next
        call raises the error."""
        log.error("publisher %s/%s: %s", self.topic, self.partition, self._upper.error)
        self._halted = True
        self._unsent.clear()
        self._abort_peers(f"the catalog refused its upper frontier: {self._upper.error}")

    def _abort_peers(self, reason: str) -> None:
        """Queue an ``X aborted`` notice behind each peer's backlog; later hellos and pings
        from unknown peers get it too."""
        self._loop_aborted = wire.encode_notice(
            "aborted", f"publisher of {self.topic!r} partition {self.partition} aborted: {reason}",
            partition=self.partition, incarnation=self.incarnation)
        self._fanout.notify_all(self._loop_aborted, self._transmit)

    def _coalesce(self, time, frames: list, now: float) -> list:
        """Merge the data commands for ``time`` queued right behind ``frames`` into one message
        (see ``coalesce_bytes``); payloads of ``COALESCE_PAYLOAD_BYTES`` or more are not merged."""
        commands = self._handoff.commands
        payloads = [frames[2]]
        size = len(frames[2])
        if size >= COALESCE_PAYLOAD_BYTES:
            return frames
        while commands and size < self.coalesce_bytes:
            kind, t, nxt = commands[0]
            if (kind is not DATA or t != time or len(nxt[2]) >= COALESCE_PAYLOAD_BYTES
                    or size + len(nxt[2]) > self.coalesce_bytes):
                break
            commands.popleft()
            payloads.append(nxt[2])
            size += len(nxt[2])
        if len(payloads) == 1:
            return frames
        merged = self.codec.merge(payloads)
        if merged is None:  # a payload that is not an array: send them one by one, in order
            for p in payloads[:-1]:
                self._fanout.broadcast([frames[0], frames[1], p], self._transmit, now)
            return [frames[0], frames[1], payloads[-1]]
        self.stats["coalesced"] += len(payloads) - 1
        return [frames[0], frames[1], merged]

    def _handle_peers(self) -> None:
        """Read up to :data:`~epochstream.transport.quota.PASS_MESSAGES` subscriber messages.
        Peer input never ends the loop: a message that does not decode, or whose handling
        fails, is answered with ``X error``; a connection over its quota while the loop is
        behind is refused and cut (:meth:`_refuse`)."""
        authz, quota, recv = self._authz, self._quota, self._router.recv_multipart
        read: dict[bytes, int] = {}
        last: dict[bytes, zmq.Frame] = {}
        caught_up = False
        for _ in range(PASS_MESSAGES):
            try:
                msg = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                caught_up = True
                break
            ident = msg[0].bytes
            if not quota.admits(ident):
                continue
            read[ident] = read.get(ident, 0) + 1
            last[ident] = msg[-1]
            if authz is not None:  # the connection's authenticated identity (ZAP User-Id)
                self._user = authz.user_of(msg[-1])
            try:
                kind, header = wire.decode_control([f.bytes for f in msg[1:]])
                self._control(ident, kind, header)
            except Exception as exc:  # noqa: BLE001 - the offender is refused, the loop goes on
                self._bad_message(ident, exc)
        for ident in quota.charge(read, caught_up):
            self._refuse(ident, last[ident])

    def _bad_message(self, ident: bytes, exc: Exception) -> None:
        """Answer a message that failed with ``X error``; count it and warn."""
        self.stats["bad_messages"] += 1
        self._transmit(ident, wire.encode_notice("error", str(exc)))
        self._warn_peer("bad message from subscriber %r: %r", ident, exc)

    def _warn_peer(self, fmt: str, *args) -> None:
        """Log a warning about what a peer did, at most one per :data:`PEER_WARNING_EVERY_S`
        (with the number left out since): a flood of bad input must not become a flood of log
        lines — a blocked stderr would stall the loop. The stats count every case."""
        now = _time.monotonic()
        self._peer_warnings += 1
        if now - self._warned_at < PEER_WARNING_EVERY_S:
            return
        left_out = self._peer_warnings - self._warned_count - 1
        self._warned_at, self._warned_count = now, self._peer_warnings
        tail = f" ({left_out} more peer warnings left out since the last)" if left_out > 0 else ""
        log.warning("%s/%s: " + fmt + "%s", self.topic, self.partition, *args, tail)

    def _refuse(self, ident: bytes, frame: zmq.Frame) -> None:
        """``ident`` went over its quota: forget it, tell it (``X error``, reason ``quota``),
        and cut its connection :data:`~epochstream.transport.quota.CUT_AFTER_S` later (its
        further messages are discarded unread meanwhile)."""
        q = self._quota
        q.refuse(ident, _time.monotonic(), connection_of(frame))
        self.stats["peers_refused_quota"] += 1
        self._fanout.leave(ident)
        if self._upstream is not None:
            self._upstream.drop(lambda item: item[0] == ident)
        self._warn_peer("refused subscriber connection %r: it sent over %d control messages "
                        "while the loop was behind (its quota)", ident, q.burst)
        self._transmit(ident, wire.encode_notice(
            "error", f"publisher of {self.topic!r} partition {self.partition}: this connection "
                     f"sent over {q.burst} control messages faster than the publisher reads "
                     f"them (its quota); it is refused and disconnected", reason="quota"))

    def _cut_refused(self, now: float) -> None:
        """Cut the connections refused at least ``CUT_AFTER_S`` ago."""
        for _ident, connection in self._quota.cuts_due(now):
            if connection is not None and cut(connection):
                self.stats["connections_cut"] += 1

    def _control(self, ident: bytes, kind: bytes, header: dict) -> None:
        """Act on one decoded control message (fields type-checked by
        :func:`~epochstream.wire.decode_control`)."""
        fanout = self._fanout
        if kind == wire.HELLO:
            self._hello(ident, header)
        elif kind == wire.CREDIT:
            if not fanout.grant(ident, header["messages"], self._transmit):
                self._transmit(ident, wire.encode_notice(
                    "error", "credit refused: not a registered flow-controlled subscriber"))
        elif kind == wire.BYE:
            fanout.leave(ident)
            if self._upstream is not None:
                self._upstream.drop(lambda item: item[0] == ident)
        elif kind == wire.UPDATE:
            self._update_filter(ident, header)
        elif kind == wire.READ:
            refusal = (self._authz.refusal(self._user, "read history")
                       if self._authz is not None else None)
            if refusal is not None:
                self._transmit(ident, refusal)
                return
            refusal = (self._history.submit(ident, header) if self._history is not None else
                       wire.encode_notice(
                           "history", f"publisher of {self.topic!r} partition {self.partition} "
                                      f"keeps no epoch log (no retention)",
                           req=header["req"], reason="unavailable"))
            if refusal is not None:
                self._transmit(ident, refusal)
        elif ident not in fanout.peers:  # a ping from a connection we do not know
            self._transmit(ident, fanout.lagged_notice(header["id"]) or self._loop_aborted
                           or wire.encode_notice(
                               "rejoin", f"publisher {self.topic!r} partition {self.partition} "
                                         f"(incarnation {self.incarnation}) does not know this "
                                         f"subscriber", incarnation=self.incarnation,
                               partition=self.partition))
        # a ping from a known peer: nothing to do (ZMTP heartbeats keep the connection)

    # -- filtering at the source (docs/filters.md) ------------------------------------------
    def _program(self, obj) -> FilterSchedule | None:
        """The decoded filter program of a hello or update (``None``: none). Raises
        :class:`~epochstream.filters.FilterError`."""
        if obj is None:
            return None
        program = FilterSchedule.from_wire(self.order, obj, lambda t: check_time(self.order, t))
        for _, f in program.entries:
            if f.keys is not None and self.key is None:
                raise FilterError(f"keys= needs a topic key, and the publisher of "
                                  f"{self.topic!r} declares none (Publisher(..., key=...))")
        return program

    def _over_bound(self, program: FilterSchedule) -> bool:
        """True if serving ``program`` would make more distinct programs than the bound
        (a key function's filters are never left to the subscriber: it cannot re-check them)."""
        if callable(self.key) and any(f.keys is not None for _, f in program.entries):
            return False
        programs = {p.interest.program for p in self._fanout.peers.values()
                    if p.interest is not None and p.interest.program is not None
                    and not p.interest.unfiltered}
        return program not in programs and len(programs) >= self.max_filter_classes

    def _broadcast_filtered(self, t, frames: list, now: float) -> None:
        """Broadcast a data message, each peer with an Interest sent what it selects; each
        distinct selection is filtered and encoded once. A filter the data cannot be filtered
        by (a column it lacks) refuses that peer with ``X error``."""
        cache: dict = {}
        decoded: list = []
        refused: dict = {}
        codec, key = self.codec, self.key

        def variant(peer):
            sel = peer.interest.select(t)
            if sel is None or sel is ALL:
                return None if sel is None else frames
            if sel in cache:
                got = cache[sel]
            else:
                try:
                    if not decoded:
                        decoded.append(codec.decode(frames[2]))
                    sent = tuple(sent_filter(f, key) for f in sel)
                    if codec.name == "arrow":
                        out = union_arrow(sent, decoded[0], key)
                        n = out.num_rows
                    else:
                        out = union_records(sent, decoded[0], key)
                        n = len(out)
                    if not n:
                        got = None
                    elif n == codec.count(decoded[0]) and all(f.columns is None for f in sent):
                        got = frames  # every record matched, none cut: the payload as it is
                    else:
                        got = [frames[0], frames[1], codec.encode(out)]
                except FilterError as e:
                    got = e
                except Exception as e:  # noqa: BLE001 - e.g. a key function that raises:
                    got = FilterError(f"{type(e).__name__}: {e}")  # refuse them, not everyone
                cache[sel] = got
                self.stats["filter_encodings"] += 1
            if isinstance(got, FilterError):
                refused[peer.ident] = got
                return None
            if got is None:
                self.stats["filtered_messages"] += 1
            return got

        self._fanout.broadcast(frames, self._transmit, now, variant=variant)
        for ident, e in refused.items():
            self._warn_peer("subscriber %r: its filter does not fit the data: %s", ident, e)
            self._fanout.leave(ident)
            self._transmit(ident, wire.encode_notice("error", f"filter does not fit the data "
                                                              f"of {self.topic!r}: {e}"))

    def _interests_advance(self) -> None:
        """The lower frontier moved: retire skips and prune programs; stop filtering when no
        peer needs it."""
        lower = tuple(self._loop_lower)
        any_left = False
        for peer in self._fanout.peers.values():
            interest = peer.interest
            if interest is None:
                continue
            interest.frontier(lower)
            if interest.trivial:
                peer.interest = None
            else:
                any_left = True
        self._filtering = any_left

    def _update_filter(self, ident: bytes, header: dict, floor: tuple | None = None,
                       gated: bool = False) -> None:
        """A ``u``: replace the peer's program; answer ``X filter`` with this partition's upper
        frontier, in stream order (everything sent before it was filtered by the old one), and
        for a relay whose upstream had to widen first, the ``floor`` the change waited for."""
        peer = self._fanout.peers.get(ident)
        if peer is None or peer.evicted:
            self._transmit(ident, wire.encode_notice(
                "error", "filter update refused: not a registered subscriber"))
            return
        program = self._program(header["filter"])  # FilterError: X error by _handle_peers
        if self._upstream is not None and not gated:
            self._upstream.drop(lambda item: item[0] == ident)  # a newer update replaces it
            if self._gate_hold(UPDATE, ident, header, program):
                return
        interest = peer.interest
        if interest is None:
            interest = Interest(self.order, (), program,
                                unfiltered=program is not None and self._over_bound(program))
        else:  # a peer served unfiltered stays so (the subscriber knows what it receives)
            interest.program = program
        interest.frontier(tuple(self._loop_lower))
        peer.interest = None if interest.trivial else interest
        self._filtering = self._filtering or peer.interest is not None
        extra = {} if floor is None else {"floor": list(floor)}
        self._fanout.post(ident, wire.encode_notice(
            "filter", "filter updated", id=header["id"],
            upper=list(self._loop_upper.elements), **extra), self._transmit, _time.monotonic())

    def _hello(self, ident: bytes, header: dict, gated: bool = False,
               floor: tuple | None = None) -> None:
        if self._authz is not None and not gated:  # not authorised: X error, never registered
            refusal = self._authz.refusal(self._user)  # (no S, no D); a gated hello was checked
            if refusal is not None:
                self._warn_peer("refused hello from %r: not authorised (%s)", ident, self._user)
                self._fanout.leave(ident)
                self._transmit(ident, refusal)
                return
            self._authz.checked(ident, self._user)
        topic, partition = header["topic"], header["partition"]
        if topic != self.topic or partition != self.partition:
            msg = (f"this publisher serves {self.topic!r} partition {self.partition}, "
                   f"not {topic!r} partition {partition!r}")
            self._warn_peer("refused hello: %s", msg)
            self._transmit(ident, wire.encode_notice("error", msg))
            return
        if self._loop_aborted is not None:
            self._transmit(ident, self._loop_aborted)
            return
        try:
            program = self._program(header.get("filter"))
        except FilterError as e:
            self._warn_peer("refused hello: %s", e)
            self._transmit(ident, wire.encode_notice("error", f"bad filter: {e}"))
            return
        if self._upstream is not None and not gated:
            self._upstream.drop(lambda item: item[0] == ident)
            if self._gate_hold(HELLO, ident, header, program):
                return
        snap = InitialFrontierSnapshot(tuple(self._loop_lower), self._loop_upper.elements)
        self._fanout.leave(ident)
        interest = Interest(self.order, snap.upper, program,
                            unfiltered=program is not None and self._over_bound(program))
        frames = wire.encode_snapshot(
            snap, topic=self.topic, partition=self.partition, order=getattr(self.order, "name", ""),
            codec=self.codec.name, incarnation=self.incarnation, heartbeat=self.heartbeat_interval,
            key=self.key if isinstance(self.key, str) else None, filters=1,
            **({} if floor is None else {"floor": list(floor)}))
        # registered before the snapshot leaves, so that whoever has seen the snapshot also
        # sees the registration (``Publisher.subscribers`` is read from other threads)
        peer = self._fanout.join(ident, header.get("credit"), header["id"],
                                 epochs=header.get("credit_unit") == "epochs")
        if self._transmit(ident, frames) == SENT:
            if self._authz is not None:
                self._authz.registered(ident)
            if not interest.trivial:
                peer.interest = interest
                self._filtering = True
            if self._upstream is not None:
                self._gate_narrow(_time.monotonic())
        else:
            self._fanout.leave(ident)
            self._warn_peer("could not send a snapshot to %r", ident)

    # -- a relay's publisher: subscriptions travel upstream (transport/upstream.py) ----------
    def _live_filters(self) -> list:
        """Every filter the subscribers served need (``Filter()`` for one served unfiltered)."""
        out = []
        for peer in self._fanout.peers.values():
            interest = peer.interest
            if interest is None or interest.program is None or interest.unfiltered:
                out.append(Filter())
            else:
                out.extend(f for _, f in interest.program.entries)
        return out

    def _gate_hold(self, kind: str, ident: bytes, header: dict, program) -> bool:
        """True if the hello or update must wait for a wider upstream subscription (then it
        is held, or refused as busy)."""
        up = self._upstream
        needs = [Filter()] if program is None else [f for _, f in program.entries]
        if up.admit(needs):
            return False
        if not up.hold(kind, (ident, header), needs):
            self._transmit(ident, wire.encode_notice(
                "error", f"relay {self.topic!r} is busy: too many subscribers wait for its "
                         f"upstream subscription to widen; try again"))
            return True
        self.stats["gated"] += 1
        self._gate_step()
        return True

    def _gate_narrow(self, now: float) -> None:
        """Narrow the relay's upstream subscription to what its subscribers need, at most once
        per heartbeat interval (the first subscriber's join narrows it at once)."""
        if now - self._last_narrow < self.heartbeat_interval:
            return
        target = self._upstream.narrow(self._live_filters())
        if target is not None:
            self._last_narrow = now
            self._gate.request(target)

    def _gate_step(self) -> None:
        """Serve the hellos and updates that may go now (with their floor); ask the relay for
        a wider cover if some are still held."""
        up = self._upstream
        while up.ready:
            kind, (ident, header), b = up.ready.pop(0)
            if kind == HELLO:
                self._hello(ident, header, gated=True, floor=b)
                continue
            try:
                self._update_filter(ident, header, floor=b, gated=True)
            except FilterError as e:
                self._transmit(ident, wire.encode_notice("error", f"bad filter: {e}"))
        target = up.request(self._live_filters())
        if target is not None:
            self._gate.request(target)

    def _gate_done(self, target, b, error) -> None:
        """The relay's thread changed its upstream subscription to ``target`` from ``b`` on
        (or failed with ``error``, a str)."""
        up = self._upstream
        if error is not None:
            for ident, _ in up.failed():
                self._transmit(ident, wire.encode_notice(
                    "error", f"relay {self.topic!r} could not widen its upstream subscription "
                             f"for this filter: {error}"))
            return
        up.granted(target, b)
        self._gate_frontier()
        self._gate_step()

    def _gate_frontier(self) -> None:
        """The lower frontier moved: upstream changes it reached become the cover."""
        self._upstream.frontier(tuple(self._loop_lower))
