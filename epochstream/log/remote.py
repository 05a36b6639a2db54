"""Reading a partition's epoch log through its live publisher, for readers on another machine
(docs/history.md, "Remote history"; the server side is
:mod:`epochstream.transport.log_server`, the messages ``r``/``R`` are in
:mod:`epochstream.wire`).

:class:`RemoteLog` keeps one DEALER connection to the publisher's endpoint and at most
``window`` reads outstanding (pipelined: a read costs one round trip only once per window).
Every answer is matched to its request by ``req``, across every :meth:`RemoteLog.read` in
progress on the connection (two iterations of one ``History`` may interleave); an answer to an
abandoned request is dropped. A ``busy`` answer is asked again after a short pause. An epoch
not served within ``timeout`` seconds of being waited for (the publisher died, the endpoint is
someone else's, or it answers only ``busy`` or stale answers) raises
:class:`~epochstream.errors.HistoryUnavailable` — never a hang.
"""

from __future__ import annotations

import itertools
import time as _time
from typing import Any, Iterable, Iterator

import zmq

from .. import wire
from ..errors import HistoryCorrupt, HistoryUnavailable, WireError
from ..zmq_context import default_context

__all__ = ["RemoteLog", "DEFAULT_TIMEOUT", "WINDOW"]

DEFAULT_TIMEOUT = 10.0
"""Seconds without any answer from the publisher before a read fails."""
WINDOW = 8
"""Reads kept outstanding (the server allows 8 per connection)."""
BUSY_PAUSE = 0.02
"""Seconds to wait before asking again after a ``busy`` answer."""


class RemoteLog:
    """``RemoteLog(endpoint, topic, partition)``: reads complete epochs of one partition from
    the publisher at ``endpoint`` (``"tcp://host:port"``). Use :meth:`read` and :meth:`close`
    (or ``with``). ``security``: ``Security.curve(client_secret=...)`` for a secured publisher
    whose public key is ``server_key`` (Z85; the catalog records it) — its key needs a
    ``subscribe`` grant, as for a subscriber (docs/security.md)."""

    def __init__(self, endpoint: str, topic: str, partition: int, *,
                 timeout: float = DEFAULT_TIMEOUT, window: int = WINDOW,
                 context: zmq.Context | None = None, security: Any = None,
                 server_key: str | None = None):
        self.endpoint, self.topic, self.partition = endpoint, topic, partition
        self.timeout, self.window = float(timeout), max(1, int(window))
        self._sock = (context or default_context()).socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if security is not None and security.enabled:
            from ..security import apply_client
            try:
                apply_client(self._sock, security, server_key)
            except BaseException:
                self._sock.close(0)
                raise
        self._sock.connect(endpoint)
        self._reqs = itertools.count()
        self._received = 0  # R answers received on this connection (mod 2**31), sent in each r
        # shared by every read() in progress: req -> time asked, and req -> the answer (payloads,
        # or the exception to raise) received but not yet handed out by its read()
        self._wanted: dict[int, Any] = {}
        self._answers: dict[int, Any] = {}

    def read(self, times: Iterable[Any]) -> Iterator[tuple[Any, list]]:
        """Yield ``(time, [payload, ...])`` for each time of ``times`` (complete epochs of this
        partition, e.g. from the catalog's index), in the order given; each payload a
        ``zmq.Frame``-backed bytes-like object, still encoded by the topic's codec. Raises
        :class:`HistoryUnavailable` (the publisher no longer retains it, keeps no log, or did not
        answer within ``timeout``; ``retained`` set when the publisher said), or
        :class:`HistoryCorrupt` (the publisher found the epoch's bytes failing their checks)."""
        todo = iter(times)
        mine: list[int] = []  # this read's reqs, in the order asked
        wanted, answers = self._wanted, self._answers
        exhausted = False
        try:
            while True:
                while not exhausted and len(mine) < self.window:
                    t = next(todo, _END)
                    if t is _END:
                        exhausted = True
                        break
                    req = self._ask(t)
                    wanted[req] = t
                    mine.append(req)
                if not mine:
                    return
                head = mine[0]
                deadline = _time.monotonic() + self.timeout  # busy or stale answers do not
                while head not in answers:                    # move it
                    self._receive(deadline)
                mine.pop(0)
                t, got = wanted.pop(head), answers.pop(head)
                if isinstance(got, Exception):
                    raise got
                yield t, got
        finally:  # abandoned (or failed): later answers to these reqs are dropped
            for req in mine:
                wanted.pop(req, None)
                answers.pop(req, None)

    def _ask(self, t, req: int | None = None) -> int:
        if req is None:
            req = next(self._reqs) % (1 << 31)
        try:  # never a blocking send: a DEALER whose handshake was refused has no pipe
            self._sock.send_multipart(wire.encode_control(  # and would block forever
                wire.READ, topic=self.topic, partition=self.partition, req=req,
                received=self._received,
                time=list(t) if isinstance(t, tuple) else t), zmq.NOBLOCK)
        except zmq.Again:
            raise HistoryUnavailable(
                f"topic {self.topic!r} partition {self.partition}: cannot send a history read "
                f"to the publisher at {self.endpoint}: no connection (refused: a CURVE key it "
                f"does not allow, or plain against CURVE?)") from None
        return req

    def _receive(self, deadline: float) -> None:
        """Receive one answer (waiting until ``deadline`` at most) and file it."""
        inflight, done = self._wanted, self._answers
        left = deadline - _time.monotonic()
        if left <= 0 or not self._sock.poll(max(1, int(left * 1000))):
            raise HistoryUnavailable(
                f"topic {self.topic!r} partition {self.partition}: the publisher at "
                f"{self.endpoint} did not answer a history read within {self.timeout:g} s")
        frames = self._sock.recv_multipart(copy=False)
        try:
            answer = wire.decode_history([f.bytes if i < 2 else f for i, f in enumerate(frames)])
        except WireError as e:
            raise HistoryUnavailable(f"topic {self.topic!r} partition {self.partition}: "
                                     f"the publisher at {self.endpoint} sent a bad answer: "
                                     f"{e}") from None
        if isinstance(answer, wire.Notice):
            req = answer.extra.get("req")
            if type(req) is not int or req not in inflight:
                if answer.code != "history":  # e.g. X error: a publisher of an older version
                    raise HistoryUnavailable(
                        f"topic {self.topic!r} partition {self.partition}: the publisher at "
                        f"{self.endpoint} does not serve history: {answer.message}")
                return  # the answer to an abandoned read
            reason = answer.extra.get("reason")
            if reason == "busy":  # nothing was queued: ask again, same req
                _time.sleep(BUSY_PAUSE)
                self._ask(inflight[req], req)
                return
            if reason == "corrupt":  # raised by the read() that asked, when it gets there
                done[req] = HistoryCorrupt(f"topic {self.topic!r} partition {self.partition} "
                                           f"(read through {self.endpoint}): {answer.message}")
                return
            retained = answer.extra.get("retained")
            done[req] = HistoryUnavailable(
                f"topic {self.topic!r}: {answer.message}",
                retained=tuple(_times(retained)) if isinstance(retained, (list, tuple)) else None)
            return
        req, _t, payloads = answer
        self._received = (self._received + 1) % (1 << 31)
        if req in inflight and req not in done:
            done[req] = [memoryview(p) if isinstance(p, zmq.Frame) else p for p in payloads]

    def close(self) -> None:
        """Close the connection (outstanding reads are abandoned)."""
        self._sock.close(0)

    def __enter__(self) -> "RemoteLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_END = object()


def _times(values) -> list:
    return [tuple(v) if isinstance(v, list) else v for v in values]
