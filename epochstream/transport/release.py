"""Releasing whole epochs: a subscriber's handed-out events become complete
:class:`~epochstream.events.Epoch`\\ s (Strymon: an epoch is complete once the merged lower
frontier passes it).

:class:`Release` is composed into the :class:`~epochstream.transport.subscriber.Subscriber` (its
own state: the :class:`~epochstream.protocol.EpochAssembler` of the current join and the last
epoch handed out). Its one generator, :meth:`Release.released`, is the single source of
:meth:`~epochstream.transport.subscriber.Subscriber.epochs` and
:meth:`~epochstream.transport.subscriber.Subscriber.fetch` (driven by
:class:`~epochstream.transport.stream.EpochStream`): live epochs as the frontier completes them,
a history fill's epochs ahead of the frontier change they are complete against, a
:class:`~epochstream.events.Gap` where a re-join lost epochs, and a durable subscription's
accounting (what was released, handed out, skipped as acked in an earlier session).
"""

from __future__ import annotations

import dataclasses
import time as _time
from typing import Iterator

from ..events import DataMessage, Gap, LowerFrontierUpdate
from ..frontier import Antichain
from ..assembler import EpochAssembler
from .durable import DurableCursor
from .fill import HistoryBatch, HistoryFill, Rejoined
from .fill_pages import raise_t0

__all__ = ["Release"]


class Release:
    """Epoch assembly for one subscriber of a topic of ``order``, payloads combined by
    ``codec``; ``durable``: its cursor (or ``None``); ``fill``: its history fill."""

    def __init__(self, order, codec, durable: DurableCursor | None, fill: HistoryFill):
        self.order, self.codec = order, codec
        self.durable, self.fill = durable, fill
        self.assembler = EpochAssembler(order, codec.combine)
        self.last_epoch = None  # the time of the last epoch handed out

    def released(self, outputs: Iterator) -> Iterator:
        """Epochs and gaps released from ``outputs`` (handed-out events: decoded
        :class:`DataMessage`, :class:`LowerFrontierUpdate`, :class:`HistoryBatch`,
        :class:`Rejoined`, :class:`Gap`), and ``None`` for each ``None`` of ``outputs`` (a tick
        after each poll)."""
        for item in outputs:
            kind = type(item)
            if kind is DataMessage:
                self.assembler.data(item, nbytes=item.nbytes, now=_time.time())
            elif kind is LowerFrontierUpdate:
                yield from self._frontier(item)
            elif kind is HistoryBatch:
                yield from self._history(item)
            elif kind is Rejoined:  # the old join's incomplete epochs come from history
                self.assembler = EpochAssembler(self.order, self.codec.combine)
            elif kind is Gap:  # epochs of the old join still pending can never complete
                self.assembler = EpochAssembler(self.order, self.codec.combine)
                yield dataclasses.replace(item, last_epoch=self.last_epoch)
            elif item is None:
                yield None

    def _frontier(self, update: LowerFrontierUpdate) -> Iterator:
        done = self.assembler.frontier_changed(update, now=_time.time())
        durable = self.durable
        acks = durable.acks if durable is not None else None
        if acks is None:
            for epoch in done:
                self.last_epoch = epoch.time
                yield epoch
            return
        for epoch in done:  # released: they hold the position back, and become ackable
            acks.released(epoch.time)  # only as each is handed out
        durable.frontier(self.assembler.frontier)
        for epoch in done:
            if acks.skips(epoch.time):
                acks.skip(epoch.time)  # acked in an earlier session
                continue
            acks.handed_out(epoch.time)
            self.last_epoch = epoch.time
            yield epoch

    def _history(self, batch: HistoryBatch) -> Iterator:
        durable = self.durable
        acks = durable.acks if durable is not None else None
        released: set = set()
        told: list = []  # the times of the chunk being handed out

        def frontier(bound) -> None:  # its lower, held back by the live epochs the following
            low = Antichain(self.order, batch.lower)  # update releases, and (``bound``) by
            held = [*batch.lower, *(t for t in self.assembler.pending  # the batch's epochs
                                    if not low.less_equal(t))]  # still to come
            if bound is not None:
                held += [raise_t0(a, bound) for a in floor]
            durable.frontier(held)

        def on_chunk(times: list, bound) -> None:
            skip_unreleased()
            told[:] = times
            for t in times:  # as for released epochs: the chunk at once, then the frontier
                acks.released(t)
            frontier(bound)

        def skip_unreleased() -> None:  # nothing of it matched the filter: as an epoch
            for t in told:                # without data, it needs no ack
                if t not in released:
                    acks.skip(t)
            released.clear()
        floor = acks.floor if acks is not None else ()
        for epoch in self.fill.epochs(batch, _time.time(), on_chunk if acks else None):
            released.add(epoch.time)
            if acks is not None:
                if acks.skips(epoch.time):
                    acks.skip(epoch.time)
                    continue
                acks.handed_out(epoch.time)
            self.last_epoch = epoch.time
            yield epoch
        if acks is not None:
            skip_unreleased()
            frontier(None)
