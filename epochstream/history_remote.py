"""Reading a partition's epoch log through its live publisher, for readers on another machine
(docs/history.md, "Remote history"; the server side is
:mod:`epochstream.transport.history_server`, the messages ``r``/``R`` are in
:mod:`epochstream.wire`).

:class:`RemoteLog` keeps one DEALER connection to the publisher's endpoint and at most
``window`` reads outstanding (pipelined: a read costs one round trip only once per window).
Every answer is matched to its request by ``req``; an answer to an abandoned request is
dropped. A ``busy`` answer is asked again after a short pause. No answer within ``timeout``
seconds (the publisher died, or the endpoint is someone else's) raises
:class:`~epochstream.errors.HistoryUnavailable` — never a hang.
"""

from __future__ import annotations

import itertools
import time as _time
from typing import Any, Iterable, Iterator

import zmq

from . import wire
from .errors import HistoryCorrupt, HistoryUnavailable, WireError

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
    (or ``with``)."""

    def __init__(self, endpoint: str, topic: str, partition: int, *,
                 timeout: float = DEFAULT_TIMEOUT, window: int = WINDOW,
                 context: zmq.Context | None = None):
        self.endpoint, self.topic, self.partition = endpoint, topic, partition
        self.timeout, self.window = float(timeout), max(1, int(window))
        self._sock = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._reqs = itertools.count()

    def read(self, times: Iterable[Any]) -> Iterator[tuple[Any, list]]:
        """Yield ``(time, [payload, ...])`` for each time of ``times`` (complete epochs of this
        partition, e.g. from the catalog's index), in the order given; each payload a
        ``zmq.Frame``-backed bytes-like object, still encoded by the topic's codec. Raises
        :class:`HistoryUnavailable` (the publisher no longer retains it, keeps no log, or did not
        answer within ``timeout``; ``retained`` set when the publisher said), or
        :class:`HistoryCorrupt` (the publisher found the epoch's bytes failing their checks)."""
        todo = iter(times)
        inflight: dict[int, Any] = {}  # req -> time, in the order asked
        order: list[int] = []
        done: dict[int, list] = {}
        exhausted = False
        while True:
            while not exhausted and len(inflight) < self.window:
                t = next(todo, _END)
                if t is _END:
                    exhausted = True
                    break
                req = self._ask(t)
                inflight[req] = t
                order.append(req)
            if not order:
                return
            head = order[0]
            while head not in done:
                self._receive(inflight, done)
            order.pop(0)
            yield inflight.pop(head), done.pop(head)

    def _ask(self, t, req: int | None = None) -> int:
        if req is None:
            req = next(self._reqs) % (1 << 31)
        self._sock.send_multipart(wire.encode_control(
            wire.READ, topic=self.topic, partition=self.partition, req=req,
            time=list(t) if isinstance(t, tuple) else t))
        return req

    def _receive(self, inflight: dict, done: dict) -> None:
        if not self._sock.poll(int(self.timeout * 1000)):
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
            if req not in inflight:
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
            if reason == "corrupt":
                raise HistoryCorrupt(f"topic {self.topic!r} partition {self.partition} (read "
                                     f"through {self.endpoint}): {answer.message}")
            retained = answer.extra.get("retained")
            raise HistoryUnavailable(
                f"topic {self.topic!r}: {answer.message}",
                retained=tuple(_times(retained)) if isinstance(retained, (list, tuple)) else None)
        req, _t, payloads = answer
        if req in inflight:
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
