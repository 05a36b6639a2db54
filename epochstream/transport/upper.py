"""Recording a publisher's upper frontier in the catalog, off the caller's thread.

A publisher with a catalog records its upper frontier (the maximal times it may have sent data
at) there *before* data at a new maximal time leaves the process: a restarted incarnation
announces that frontier, so no subscriber ever combines the dead incarnation's part of an epoch
with the new one's (``Publisher``'s ``start``). Written by the caller of ``send`` that would be
one catalog round trip per new epoch on the caller's thread (~0.3 ms on a local PostgreSQL,
which capped a publisher at ~3,000 epochs/s). Instead the caller only *requests* the new upper
frontier (:meth:`UpperRecorder.request`, no I/O) and hands the data to the loop as an
``UPPER`` command (the data with the request's number: no more queue space than the data);
the publisher's loop thread, reaching it, writes the newest requested frontier once
(:meth:`UpperRecorder.ensure`): every request behind it in the queue is covered by that write,
so a burst of new epochs costs one write, and no data leaves before its time is recorded.

A refusal (another incarnation holds the partition: :class:`~epochstream.errors.Fenced`) or a
catalog that stays unreachable past its retry deadline
(:class:`~epochstream.errors.CatalogUnavailable`) is kept in :attr:`UpperRecorder.error`: the
loop then sends nothing more and the publisher's next call raises it (as Kafka's producer
reports a failed send on the next call or ``flush``).
"""

from __future__ import annotations

import threading

from ..errors import CatalogError, Fenced

__all__ = ["UpperRecorder"]


class UpperRecorder:
    """``UpperRecorder(catalog, topic, partition, incarnation)``: the upper frontier requests of
    one publisher incarnation and the catalog writes that satisfy them. Thread-safe: callers
    request (holding the publisher's lock), the loop thread ensures, :meth:`flush` may run on
    any thread."""

    __slots__ = ("_catalog", "topic", "partition", "incarnation", "_latest", "_recorded",
                 "_write", "error")

    def __init__(self, catalog, topic: str, partition: int, incarnation: str):
        self._catalog = catalog
        self.topic, self.partition, self.incarnation = topic, partition, incarnation
        self._latest: tuple[int, list] = (0, [])  # (sequence number, elements) last requested
        self._recorded = 0  # the sequence number of the newest request written
        self._write = threading.Lock()
        #: the :class:`~epochstream.errors.CatalogError` (``Fenced`` among them) that stopped
        #: recording; None while recording works
        self.error: CatalogError | None = None

    def request(self, elements: list) -> int:
        """Ask for ``elements`` (the whole new upper frontier, maximal times) to be recorded;
        returns the request's sequence number, to pass to :meth:`ensure` before data at the new
        time is sent. No I/O."""
        seq = self._latest[0] + 1
        self._latest = (seq, elements)  # one assignment: read whole by the loop thread
        return seq

    def ensure(self, seq: int) -> bool:
        """Make sure request ``seq`` is recorded: nothing to do when a newer one was written
        already; otherwise write the newest request (covering ``seq`` and every request before
        it). Returns False, keeping :attr:`error`, if the catalog refused or failed (then no
        data beyond the recorded frontier may be sent)."""
        if seq <= self._recorded:
            return True
        with self._write:
            if seq <= self._recorded:
                return True
            if self.error is not None:
                return False
            latest, elements = self._latest
            try:
                ok = self._catalog.record_upper(self.topic, self.partition, self.incarnation,
                                                list(elements))
            except CatalogError as e:
                self.error = e
                return False
            if not ok:
                self.error = Fenced(
                    f"publisher {self.topic}/{self.partition}: the catalog no longer lists this "
                    f"incarnation ({self.incarnation}) as live; another publisher took the "
                    f"partition over (a newer generation) or the topic was dropped: this "
                    f"publisher aborts", topic=self.topic, partition=self.partition,
                    incarnation=self.incarnation)
                return False
            self._recorded = latest
            return True

    def flush(self) -> bool:
        """:meth:`ensure` the newest request (before the partition is marked ended: after that
        the catalog refuses upper frontier writes)."""
        return self.ensure(self._latest[0])
