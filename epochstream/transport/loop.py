"""The loop of a :class:`~epochstream.transport.publisher.Publisher`, a bounded, non-blocking
step (:meth:`PublisherLoop.wants`, :meth:`PublisherLoop.step`) that a driver calls — the
process's shared reactor or a thread of its own (:mod:`~epochstream.transport.reactor`;
:meth:`PublisherLoop.run` is the latter's body). It owns the ROUTER and runs the commands
the calling threads hand over — data and frontier changes broadcast through the pure
:class:`~epochstream.transport.fanout.Fanout`, heartbeats — and hands the rest to the parts it
holds, each with its own state: what subscribers send to
:class:`~epochstream.transport.loop_peers.PeerControl`, the epoch log (group commit before
frontier updates leave; remote history reads) to
:class:`~epochstream.transport.loop_log.LogDriver`, per-peer filtering to
:class:`~epochstream.transport.loop_filters.SourceFilters`, a relay's upstream subscription to
:class:`~epochstream.transport.loop_gate.RelayGate`. Heartbeats: peers that are sent nothing
are probed every ``heartbeat_interval``; the others get a heartbeat when the stream was idle
that long."""

from __future__ import annotations

import logging
import time as _time
from typing import Callable

import zmq

from .. import wire
from ..errors import HistoryWriteError
from ..frontier import Antichain, apply_changes
from ..order import dual
from .fanout import Fanout
from .handoff import Handoff
from .loop_filters import SourceFilters
from .loop_gate import RelayGate
from .loop_log import LogDriver
from .loop_peers import PEER_WARNING_EVERY_S, PeerControl, PeerWarnings
from .sockets import transmit_to

__all__ = ["PublisherLoop", "DATA", "FRONTIER", "SYNC", "ABORT", "STOP", "UPSTREAM_CHANGED",
           "GATE", "UPPER", "PEER_WARNING_EVERY_S"]

log = logging.getLogger("epochstream.transport")

# loop commands (caller thread -> loop thread): (kind, argument, frames)
DATA, FRONTIER, SYNC, ABORT, STOP = "data", "frontier", "sync", "abort", "stop"
#: a relay's upstream change is done: argument ``(cover, boundary, error)`` (docs/filters.md)
UPSTREAM_CHANGED = "upstream_changed"
#: deprecated alias of :data:`UPSTREAM_CHANGED`, removed in the next release
GATE = UPSTREAM_CHANGED
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


class PublisherLoop:
    """Loop-side state of one partition. ``publisher`` supplies the identity (its public
    attributes topic, partition, order, codec, incarnation, heartbeat_interval, coalesce_bytes,
    key, max_filter_classes, gate); ``lower``/``upper``: the frontiers at start; ``closing()``
    tells whether close()/abort() was called (flow control then no longer holds the end of the
    stream back); ``ctx`` the ZeroMQ context; ``recorder`` its
    :class:`~epochstream.transport.upper.UpperRecorder` (``None``: no catalog), ``log`` its
    epoch log's writer, ``authz`` its authorizer (``None``: none). :attr:`error` is the exception that ended
    the loop, if any; :attr:`log_error` the failure of the epoch log, once it failed."""

    def __init__(self, publisher, router: zmq.Socket, handoff: Handoff, fanout: Fanout,
                 lower: tuple, upper: tuple, closing: Callable[[], bool], *,
                 ctx: zmq.Context, recorder=None, log=None, authz=None):
        p = publisher
        self.topic, self.partition, self.order, self.codec = p.topic, p.partition, p.order, p.codec
        self.incarnation, self.heartbeat_interval = p.incarnation, p.heartbeat_interval
        self.coalesce_bytes = p.coalesce_bytes
        #: the newest data-message version served (docs/protocol.md §2.2); a peer that
        #: negotiated version 2 is sent each message rendered once by ``_render`` (lazily)
        self.wire_version = getattr(p, "wire_version", 2)
        self._render = wire.V2Renderer() if self.wire_version >= 2 else None
        self._router, self._handoff, self._fanout = router, handoff, fanout
        self._transmit = transmit_to(router)
        self._closing = closing
        self.stats = fanout.stats
        self.error: BaseException | None = None
        self.log_error: HistoryWriteError | None = None  # set once the epoch log failed
        # the loop's own copies of the frontiers (what it has sent): snapshots read these
        self._loop_lower: dict = dict.fromkeys(lower, True)
        self._loop_upper = Antichain(dual(self.order), upper)
        # the upper frontier is recorded in the catalog before data beyond it is sent; once the
        # catalog refused (fenced) or failed, nothing more is sent (halted)
        self._upper = recorder
        self._halted = False
        self._last_broadcast = self._last_probe = _time.monotonic()
        self._stop_linger = 0.0
        self._stop_at: float | None = None  # monotonic deadline of the linger, once stopped
        self._done = False
        self._compose(p, ctx, log, authz)

    def _compose(self, p, ctx: zmq.Context, log_writer, authz) -> None:
        """The parts, each holding its own state (see the module docstring)."""
        self._logs = None if log_writer is None else LogDriver(
            log_writer, ctx, self.topic, self.partition, self.order, self._loop_lower,
            self.stats, self._log_failed)
        if log_writer is not None and getattr(log_writer, "tails", None) is not None:
            # upload="frontier": while a commit waits for the store, heartbeats go on (with the
            # lower frontier as announced), so subscribers do not take the wait for a death
            log_writer.tails.on_wait = lambda: self._tick(False)
        # filtering at the source (docs/filters.md): the topic's key, the bound on programs
        self.key = getattr(p, "key", None)
        self.max_filter_classes = getattr(p, "max_filter_classes", 32)
        warnings = PeerWarnings(self.topic, self.partition)
        self._filters = SourceFilters(self.topic, self.order, self.codec, self.key,
                                      self.max_filter_classes, self._fanout, self._transmit,
                                      self.stats, warnings.warn)
        # a relay's publisher: downstream filters travel upstream (transport/upstream.py);
        # ``gate.request(cover)`` asks the relay's thread to change its upstream subscription
        relay = getattr(p, "gate", None)
        self._gate = None if relay is None else RelayGate(
            relay, self.topic, self.order, self.heartbeat_interval, self._transmit, self.stats)
        snapshot = {"topic": self.topic, "partition": self.partition,
                    "order": getattr(self.order, "name", ""), "codec": self.codec.name,
                    "incarnation": self.incarnation, "heartbeat": self.heartbeat_interval,
                    "key": self.key if isinstance(self.key, str) else None}
        self._peers = PeerControl(snapshot, self._fanout, self._transmit, self.stats,
                                  authz=authz, filters=self._filters, speaks=self.wire_version,
                                  gate=self._gate, frontiers=self._frontiers,
                                  warn=warnings.warn)

    def _frontiers(self) -> tuple:
        """The lower frontier (a tuple) and the upper frontier (its elements) sent so far."""
        return tuple(self._loop_lower), self._loop_upper.elements

    # -- driving: a pass of the loop is a step; run() is the driver of a loop of its own ----
    @property
    def done(self) -> bool:
        """True once the loop ended: stopped (after its linger) or failed (:attr:`error`)."""
        return self._done

    def start(self) -> None:
        """Start what runs beside the loop (the epoch log's history server): called by the
        driver, in its thread, before the first :meth:`step` (a publisher that fails to start
        has none)."""
        if self._logs is not None:
            self._logs.start()

    def wants(self) -> tuple[list, int]:
        """``(sockets, timeout)``: the sockets to wait on for input (zmq sockets: the ROUTER,
        the hand-off's wake-up pipe unless flow control holds the producer back or the loop has
        none, the history server's socket) and the milliseconds to wait at most (0: step
        again at once) before the next :meth:`step`. Loop thread only."""
        pending = self._fanout.pending()
        blocked = self._blocked(pending)
        sockets = [self._router]
        if not blocked and self._handoff.socket is not None:
            sockets.append(self._handoff.socket)
        if self._logs is not None and self._logs.history is not None:
            sockets.append(self._logs.history.socket)
        return sockets, self._poll_timeout(pending, blocked, self._stop_at)

    def _blocked(self, pending: bool) -> bool:
        """Flow control holds the producer back, except once close()/abort() was called: the
        end of the stream is never stuck behind a consumer."""
        return bool(pending and self._stop_at is None and not self._closing()
                    and self._fanout.blocked())

    def step(self, ready=(), woken: bool = False) -> None:
        """One pass, bounded (at most 4096 commands, a pass of subscriber messages) and not
        blocking on sockets: read the sockets in ``ready`` (a container of the sockets of
        :meth:`wants` found readable), run queued commands unless flow control holds them back,
        drain the subscribers' backlogs, tick heartbeats. Sets :attr:`done` once stopped and
        lingered. ``woken``: the driver was told (a hand-off without a pipe) that commands
        were handed over: the wake-up is re-armed before the commands are drained. Raises
        what a bug raises (the driver then calls :meth:`fail`)."""
        fanout, commands = self._fanout, self._handoff.commands
        pending = fanout.pending()
        blocked = self._blocked(pending)
        if self._router in ready:
            self._handle_peers()
        history = None if self._logs is None else self._logs.history
        if history is not None and history.socket in ready:
            history.drain(self._transmit)
        if woken or (self._handoff.socket is not None and self._handoff.socket in ready):
            self._handoff.woken()
        if not blocked and self._stop_at is None and commands and self._run_commands():
            self._stop_at = _time.monotonic() + self._stop_linger
        if pending:
            fanout.drain(self._transmit)
        self._tick(self._stop_at is not None)
        if self._stop_at is not None and (not fanout.peers or _time.monotonic() >= self._stop_at):
            self._done = True

    def fail(self, exc: BaseException) -> None:
        """The loop raised ``exc``: keep it in :attr:`error` (callers raise it), log it."""
        self.error, self._done = exc, True
        log.error("publisher loop %s/%s died", self.topic, self.partition, exc_info=exc)

    def finish(self) -> None:
        """The loop ended (stopped or failed): close the epoch log, release every caller
        waiting (blocked at ``queue_hwm``, or for a flush: its event is set). Called once by
        the driver, in its thread."""
        try:
            if self._logs is not None:
                self._logs.close()
        finally:
            for kind, arg, _ in self._handoff.ended():  # nobody may wait for a flush forever
                if kind == SYNC:
                    arg.set()

    def run(self) -> None:
        """The body of a thread of its own (``loop="own"``): serve until stopped; a failure is
        kept in :attr:`error` and re-raised."""
        try:
            self.start()
            pollers: dict = {}  # one poller per set of sockets (at most two: flow control)
            while not self._done:
                sockets, timeout = self.wants()
                key = tuple(id(s) for s in sockets)
                poller = pollers.get(key)
                if poller is None:
                    poller = pollers[key] = zmq.Poller()
                    for s in sockets:
                        poller.register(s, zmq.POLLIN)
                self.step(dict(poller.poll(timeout)))
        except BaseException as exc:  # a bug here must not pass silently: callers raise it
            self.fail(exc)
            raise
        finally:
            self.finish()

    def _poll_timeout(self, pending: bool, blocked: bool, stop_at: float | None) -> int:
        """Milliseconds to wait for input before the next pass of the loop."""
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
        self._peers.cut_refused(now)
        if now - self._last_probe >= hb:
            self._last_probe = now
            frames = wire.encode_heartbeat(list(self._loop_lower))
            self._fanout.probe(frames, self._transmit, now, all_peers=closing)
            self._log_evictions()
            if self._gate is not None and not closing:
                self._gate.narrow(now, self._filters.live)
        self._peers.enforce()  # grants changed: drop peers no longer authorised
        if now - self._last_broadcast >= hb and not closing:
            self._last_broadcast = now
            self._fanout.broadcast(wire.encode_heartbeat(list(self._loop_lower)), self._transmit,
                                   now, counted=False)
        if self._logs is not None:
            self._logs.expire(now)

    def _log_evictions(self) -> None:
        for message in self._fanout.log:
            log.warning("%s", message)
        self._fanout.log.clear()

    # -- commands (the hot path: DATA) -------------------------------------------------------
    def _run_commands(self, limit: int = 4096) -> bool:
        """Run queued commands (at most ``limit``, then let the loop serve peers; fewer when a
        flow-controlled peer's backlog fills up); True on STOP."""
        commands, fanout, transmit = self._handoff.commands, self._fanout, self._transmit
        upper, logs, filters = self._loop_upper, self._logs, self._filters
        now = self._last_broadcast = _time.monotonic()
        data, last_time = 0, None
        fanout.full = False
        for _ in range(limit):
            if not commands or fanout.full:
                break
            kind, arg, frames = commands.popleft()
            if kind is not DATA:
                if self._command(kind, arg, frames, now):
                    return True
                continue
            if self._halted:
                continue
            if arg is not last_time:  # many messages at one time: that time is in already
                upper.insert(arg)
                last_time = arg
            if commands and self.coalesce_bytes:
                frames = self._coalesce(arg, frames, now)
            if logs is not None and not logs.data(arg, frames):
                continue
            if len(fanout.peers) > 1 and len(frames[2]) >= SHARE_FRAME_BYTES:
                frames = [frames[0], frames[1], zmq.Frame(frames[2])]
            if filters.active:
                filters.broadcast(arg, frames, now, self._render)
            else:
                fanout.broadcast(frames, transmit, now, render=self._render)
            data += 1
        self._commit_log(now)
        self.stats["data_messages"] += data
        self._handoff.made_space()
        self._log_evictions()
        return False

    def _command(self, kind, arg, frames, now: float) -> bool:
        """Run one command other than DATA; True on STOP."""
        if kind is FRONTIER:
            if self._halted:
                return False
            if self._logs is not None:  # written now, sent after the commit
                if self._logs.frontier(arg, frames, self._loop_upper.elements):
                    self._commit_log(_time.monotonic())  # the segment may roll here
                return False
            apply_changes(self._loop_lower, arg.updates)
            self._fanout.broadcast(frames, self._transmit, now)
            self._lower_moved()
        elif kind is UPPER:  # record the upper frontier, then run it as data
            if self._halted:
                return False
            if not self._upper.ensure(arg[1]):
                self._upper_refused()
                return False
            self._handoff.commands.appendleft((DATA, arg[0], frames))
        elif kind is SYNC:
            self._commit_log(now)
            arg.set()
        elif kind is ABORT:
            self._commit_log(now)
            self._close_log()  # nothing more is logged: a successor may open the log now
            self._peers.abort(arg)
        elif kind is UPSTREAM_CHANGED:
            self._peers.gate_done(*arg)
        elif kind is STOP:
            self._commit_log(now)
            self._close_log()
            self._stop_linger = arg
            return True
        return False

    def _lower_moved(self) -> None:
        """The lower frontier sent moved: the filters and a relay's gate follow it."""
        if self._filters.active:
            self._filters.advance(tuple(self._loop_lower))
        if self._gate is not None:
            self._gate.frontier(tuple(self._loop_lower))

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
                self._fanout.broadcast([frames[0], frames[1], p], self._transmit, now,
                                       render=self._render)
            return [frames[0], frames[1], payloads[-1]]
        self.stats["coalesced"] += len(payloads) - 1
        return [frames[0], frames[1], merged]

    # -- the epoch log (retention, transport/loop_log.py) ------------------------------------
    def _commit_log(self, now: float) -> None:
        """Group commit: make the frontier changes written so far durable (one fsync, one
        catalog transaction), then send them, in order."""
        if self._logs is None:
            return
        committed = self._logs.commit()
        if not committed:
            return
        for update, frames in committed:
            apply_changes(self._loop_lower, update.updates)
            self._fanout.broadcast(frames, self._transmit, now)
        self._lower_moved()

    def _close_log(self) -> None:
        """Flush and close the segment file; later data and frontier commands are not logged
        and not sent."""
        if self._logs is not None:
            self._logs.close_log()

    def _log_failed(self, e: HistoryWriteError) -> None:
        """The log failed: send no more data or frontier changes (no epoch it could not log
        completes), tell every subscriber the publisher aborted; the publisher's next call
        raises :attr:`log_error`."""
        self.log_error = e
        if self._peers.aborted is None:
            self._peers.abort(f"the epoch log failed: {e}")

    def _upper_refused(self) -> None:
        """The catalog refused (or could not take) the upper frontier: send no more data or
        frontier changes and tell every subscriber the publisher aborted; the publisher's next
        call raises the error."""
        log.error("publisher %s/%s: %s", self.topic, self.partition, self._upper.error)
        self._halted = True
        if self._logs is not None:
            self._logs.discard()
        self._peers.abort(f"the catalog refused its upper frontier: {self._upper.error}")

    # -- what subscribers send (transport/loop_peers.py) -------------------------------------
    def _handle_peers(self) -> None:
        """Read a pass of subscriber messages from the ROUTER (:meth:`PeerControl.receive`:
        quota, ``X error`` for a message that fails), each handled by :meth:`_control`."""
        self._peers.receive(self._router.recv_multipart, self._control)

    def _control(self, ident: bytes, kind: bytes, header: dict) -> None:
        """Act on one decoded control message (fields type-checked by
        :func:`~epochstream.wire.decode_control`)."""
        peers = self._peers
        if kind == wire.HELLO:
            peers.hello(ident, header)
        elif kind == wire.CREDIT:
            peers.credit(ident, header["messages"])
        elif kind == wire.BYE:
            peers.bye(ident)
        elif kind == wire.UPDATE:
            peers.update_filter(ident, header)
        elif kind == wire.READ:
            peers.read(ident, header, None if self._logs is None else self._logs.history)
        elif ident not in self._fanout.peers:  # a ping from a connection we do not know
            peers.unknown(ident, header)
        # a ping from a known peer: nothing to do (ZMTP heartbeats keep the connection)
