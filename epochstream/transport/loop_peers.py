"""What a publisher's subscribers send it, handled in its loop thread: hellos (registration with
the snapshot), filter updates, credit, goodbyes, history reads, pings from connections it does
not know; who may subscribe (security), the inbound quota of each connection and the refusal of
one that floods, ``X error`` for a message that fails, and the ``X aborted`` notice once the
publisher aborted.

:class:`PeerControl` is composed into the :class:`~epochstream.transport.loop.PublisherLoop`
(its own state: the :class:`~epochstream.transport.quota.Quota`, the authoriser and the ZAP
User-Id of the message at hand, the abort notice); it uses the loop's
:class:`~epochstream.transport.loop_filters.SourceFilters` and, in a relay,
:class:`~epochstream.transport.loop_gate.RelayGate` through their public methods.
:class:`PeerWarnings` rate-limits the warnings about what peers do.
"""

from __future__ import annotations

import logging
import time as _time
from typing import Callable

import zmq

from .. import wire
from ..events import InitialFrontierSnapshot
from ..filters import FilterError
from .fanout import Fanout, Transmit
from .loop_filters import SourceFilters
from .loop_gate import RelayGate
from .quota import PASS_MESSAGES, Quota
from .sockets import SENT, connection_of, cut
from .upstream import HELLO, UPDATE

__all__ = ["PEER_WARNING_EVERY_S", "PeerControl", "PeerWarnings"]

log = logging.getLogger("epochstream.transport")

#: warnings about what subscribers send are logged at most once per this many seconds
PEER_WARNING_EVERY_S = 1.0


class PeerWarnings:
    """Warnings about what the peers of partition ``partition`` of ``topic`` did, at most one
    per :data:`PEER_WARNING_EVERY_S` (with the number left out since): a flood of bad input
    must not become a flood of log lines — a blocked stderr would stall the loop."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self._warned_at, self._warned_count, self._peer_warnings = float("-inf"), 0, 0

    def warn(self, fmt: str, *args) -> None:
        """Log a warning (``fmt % args``) unless one was logged less than
        :data:`PEER_WARNING_EVERY_S` ago. The stats count every case."""
        now = _time.monotonic()
        self._peer_warnings += 1
        if now - self._warned_at < PEER_WARNING_EVERY_S:
            return
        left_out = self._peer_warnings - self._warned_count - 1
        self._warned_at, self._warned_count = now, self._peer_warnings
        tail = f" ({left_out} more peer warnings left out since the last)" if left_out > 0 else ""
        log.warning("%s/%s: " + fmt + "%s", self.topic, self.partition, *args, tail)


class PeerControl:
    """The subscribers' side of one partition's loop. ``snapshot``: the fields of its snapshots
    (``topic``, ``partition``, ``order``, ``codec``, ``incarnation``, ``heartbeat``, ``key``);
    ``fanout``/``transmit``/``stats``: the loop's; ``authz``: who may subscribe (or ``None``);
    ``filters``, ``gate`` (``None`` unless a relay's): the loop's parts; ``frontiers()``: the
    loop's lower frontier (a tuple) and upper frontier (its elements), as sent; ``warn``: the
    loop's :meth:`PeerWarnings.warn`; ``speaks``: the newest data-message version served."""

    def __init__(self, snapshot: dict, fanout: Fanout, transmit: Transmit, stats, *, authz,
                 filters: SourceFilters, gate: RelayGate | None,
                 frontiers: Callable[[], tuple], warn: Callable[..., None], speaks: int = 2):
        self._snapshot = snapshot
        self._speaks = speaks
        self.topic, self.partition = snapshot["topic"], snapshot["partition"]
        self.incarnation = snapshot["incarnation"]
        self._fanout, self._transmit, self._stats = fanout, transmit, stats
        self._filters, self._gate, self._frontiers, self._warn = filters, gate, frontiers, warn
        # security (docs/security.md): who may subscribe; the ZAP User-Id of the message at hand
        self._authz = authz
        self._user: str | None = None
        # what one connection may send (transport/quota.py): a flood is refused and cut
        self._quota = Quota()
        self.aborted: list | None = None  # the X aborted notice, once the loop aborted

    # -- reading --------------------------------------------------------------------------
    def receive(self, recv: Callable, control: Callable[[bytes, bytes, dict], None]) -> None:
        """Read up to :data:`~epochstream.transport.quota.PASS_MESSAGES` subscriber messages
        with ``recv`` (the ROUTER's ``recv_multipart``), each decoded one handed to
        ``control(ident, kind, header)``. Peer input never ends the loop: a message that does
        not decode, or whose handling fails, is answered with ``X error``; a connection over
        its quota while the loop is behind is refused and cut (:meth:`_refuse`)."""
        authz, quota = self._authz, self._quota
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
                control(ident, kind, header)
            except Exception as exc:  # noqa: BLE001 - the offender is refused, the loop goes on
                self._bad_message(ident, exc)
        for ident in quota.charge(read, caught_up):
            self._refuse(ident, last[ident])

    def _bad_message(self, ident: bytes, exc: Exception) -> None:
        """Answer a message that failed with ``X error``; count it and warn."""
        self._stats["bad_messages"] += 1
        self._transmit(ident, wire.encode_notice("error", str(exc)))
        self._warn("bad message from subscriber %r: %r", ident, exc)

    def _refuse(self, ident: bytes, frame: zmq.Frame) -> None:
        """``ident`` went over its quota: forget it, tell it (``X error``, reason ``quota``),
        and cut its connection :data:`~epochstream.transport.quota.CUT_AFTER_S` later (its
        further messages are discarded unread meanwhile)."""
        q = self._quota
        q.refuse(ident, _time.monotonic(), connection_of(frame))
        self._stats["peers_refused_quota"] += 1
        self._fanout.leave(ident)
        if self._gate is not None:
            self._gate.drop(ident)
        self._warn("refused subscriber connection %r: it sent over %d control messages "
                   "while the loop was behind (its quota)", ident, q.burst)
        self._transmit(ident, wire.encode_notice(
            "error", f"publisher of {self.topic!r} partition {self.partition}: this connection "
                     f"sent over {q.burst} control messages faster than the publisher reads "
                     f"them (its quota); it is refused and disconnected", reason="quota"))

    def cut_refused(self, now: float) -> None:
        """Cut the connections refused at least ``CUT_AFTER_S`` ago."""
        for _ident, connection in self._quota.cuts_due(now):
            if connection is not None and cut(connection):
                self._stats["connections_cut"] += 1

    def enforce(self) -> None:
        """Grants changed: drop the peers no longer authorised."""
        if self._authz is not None:
            self._authz.enforce(self._fanout.peers, self._fanout.leave, self._transmit)

    def abort(self, reason: str) -> None:
        """Queue an ``X aborted`` notice behind each peer's backlog; later hellos and pings
        from unknown peers get it too."""
        self.aborted = wire.encode_notice(
            "aborted", f"publisher of {self.topic!r} partition {self.partition} aborted: {reason}",
            partition=self.partition, incarnation=self.incarnation)
        self._fanout.notify_all(self.aborted, self._transmit)

    # -- the messages ---------------------------------------------------------------------
    def credit(self, ident: bytes, messages: int) -> None:
        """A ``c``: ``messages`` more credit for ``ident``."""
        if not self._fanout.grant(ident, messages, self._transmit):
            self._transmit(ident, wire.encode_notice(
                "error", "credit refused: not a registered flow-controlled subscriber"))

    def bye(self, ident: bytes) -> None:
        """A ``b``: forget ``ident``."""
        self._fanout.leave(ident)
        if self._gate is not None:
            self._gate.drop(ident)

    def read(self, ident: bytes, header: dict, history) -> None:
        """An ``r``: a remote history read, handed to ``history`` (the partition's
        :class:`~epochstream.transport.log_server.LogServer`, ``None`` without a log)
        if the connection may read."""
        refusal = (self._authz.refusal(self._user, "read history")
                   if self._authz is not None else None)
        if refusal is None:
            refusal = (history.submit(ident, header) if history is not None else
                       wire.encode_notice(
                           "history", f"publisher of {self.topic!r} partition {self.partition} "
                                      f"keeps no epoch log (no retention)",
                           req=header["req"], reason="unavailable"))
        if refusal is not None:
            self._transmit(ident, refusal)

    def unknown(self, ident: bytes, header: dict) -> None:
        """A ping from a connection that is not registered: lagged, aborted, or re-join."""
        self._transmit(ident, self._fanout.lagged_notice(header["id"]) or self.aborted
                       or wire.encode_notice(
                           "rejoin", f"publisher {self.topic!r} partition {self.partition} "
                                     f"(incarnation {self.incarnation}) does not know this "
                                     f"subscriber", incarnation=self.incarnation,
                           partition=self.partition))

    def hello(self, ident: bytes, header: dict, gated: bool = False,
              floor: tuple | None = None) -> None:
        """An ``h``: register ``ident`` and send its snapshot — unless it is not authorised,
        asks for another partition, the publisher aborted, its filter is bad, or (a relay's)
        it must wait for a wider upstream subscription. ``gated``: a hello the gate held,
        served with the ``floor`` it waited for."""
        if not self._admitted(ident, header, gated):
            return
        if wire.choose_wire(header.get("wire"), self._speaks) is None:
            msg = (f"no data-message version in common: this publisher speaks "
                   f"{list(range(1, self._speaks + 1))}, the hello offered {list(header['wire'])}")
            self._warn("refused hello: %s", msg)
            self._transmit(ident, wire.encode_notice("error", msg))
            return
        try:
            program = self._filters.program(header.get("filter"))
        except FilterError as e:
            self._warn("refused hello: %s", e)
            self._transmit(ident, wire.encode_notice("error", f"bad filter: {e}"))
            return
        if self._gate is not None and not gated and self._gated(HELLO, ident, header, program):
            return
        self._register(ident, header, program, floor)

    def _admitted(self, ident: bytes, header: dict, gated: bool) -> bool:
        """False (it was answered) if the hello is not authorised (a gated one was checked),
        names another topic or partition, or the publisher aborted."""
        if self._authz is not None and not gated:  # not authorised: X error, never registered
            refusal = self._authz.refusal(self._user)  # (no S, no D)
            if refusal is not None:
                self._warn("refused hello from %r: not authorised (%s)", ident, self._user)
                self._fanout.leave(ident)
                self._transmit(ident, refusal)
                return False
            self._authz.checked(ident, self._user)
        topic, partition = header["topic"], header["partition"]
        if topic != self.topic or partition != self.partition:
            msg = (f"this publisher serves {self.topic!r} partition {self.partition}, "
                   f"not {topic!r} partition {partition!r}")
            self._warn("refused hello: %s", msg)
            self._transmit(ident, wire.encode_notice("error", msg))
            return False
        if self.aborted is not None:
            self._transmit(ident, self.aborted)
            return False
        return True

    def _register(self, ident: bytes, header: dict, program, floor: tuple | None) -> None:
        """Register ``ident`` and send it the snapshot of the frontiers sent so far."""
        snap = InitialFrontierSnapshot(*self._frontiers())
        self._fanout.leave(ident)
        interest = self._filters.joining(program, snap.upper)
        version = wire.choose_wire(header.get("wire"), self._speaks)  # checked by hello()
        frames = wire.encode_snapshot(snap, **self._snapshot, filters=1, wire=version,
                                      **({} if floor is None else {"floor": list(floor)}))
        # registered before the snapshot leaves, so that whoever has seen the snapshot also
        # sees the registration (``Publisher.subscribers`` is read from other threads)
        peer = self._fanout.join(ident, header.get("credit"), header["id"],
                                 epochs=header.get("credit_unit") == "epochs", wire=version)
        if self._transmit(ident, frames) == SENT:
            if self._authz is not None:
                self._authz.registered(ident)
            self._filters.joined(peer, interest)
            if self._gate is not None:
                self._gate.narrow(_time.monotonic(), self._filters.live)
        else:
            self._fanout.leave(ident)
            self._warn("could not send a snapshot to %r", ident)

    def update_filter(self, ident: bytes, header: dict, floor: tuple | None = None,
                      gated: bool = False) -> None:
        """A ``u``: replace the peer's program; answer ``X filter`` with this partition's upper
        frontier, in stream order (everything sent before it was filtered by the old one), and
        for a relay whose upstream had to widen first, the ``floor`` the change waited for.
        Raises :class:`~epochstream.filters.FilterError` for a bad program."""
        peer = self._fanout.peers.get(ident)
        if peer is None or peer.evicted:
            self._transmit(ident, wire.encode_notice(
                "error", "filter update refused: not a registered subscriber"))
            return
        program = self._filters.program(header["filter"])  # FilterError: X error by receive
        if self._gate is not None and not gated and self._gated(UPDATE, ident, header, program):
            return
        lower, upper = self._frontiers()
        self._filters.update(peer, program, lower)
        extra = {} if floor is None else {"floor": list(floor)}
        self._fanout.post(ident, wire.encode_notice(
            "filter", "filter updated", id=header["id"], upper=list(upper), **extra),
            self._transmit, _time.monotonic())

    # -- a relay's publisher: subscriptions travel upstream (transport/loop_gate.py) ----------
    def _gated(self, kind: str, ident: bytes, header: dict, program) -> bool:
        """True if the hello or update must wait for a wider upstream subscription (then it
        is held, or refused as busy); a newer one of ``ident`` replaces what it had held."""
        gate = self._gate
        gate.drop(ident)
        if gate.admits(program):
            return False
        if gate.hold(kind, ident, header, program):
            self.gate_step()
        return True

    def gate_step(self) -> None:
        """Serve the hellos and updates that may go now (with their floor); ask the relay for
        a wider cover if some are still held."""
        gate = self._gate
        while (item := gate.next_ready()) is not None:
            kind, ident, header, b = item
            if kind == HELLO:
                self.hello(ident, header, gated=True, floor=b)
                continue
            try:
                self.update_filter(ident, header, floor=b, gated=True)
            except FilterError as e:
                self._transmit(ident, wire.encode_notice("error", f"bad filter: {e}"))
        gate.request(self._filters.live())

    def gate_done(self, target, b, error) -> None:
        """A ``UPSTREAM_CHANGED`` command: the relay's thread changed its upstream subscription to
        ``target`` from ``b`` on (or failed with ``error``, a str)."""
        if self._gate.done(target, b, error, self._frontiers()[0]):
            self.gate_step()
