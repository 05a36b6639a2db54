"""Handing out a subscriber's events, composed into the Subscriber (its own state: none beyond
what it is given).

A poll returns events with data still encoded. They are handed out one at a time, as the caller
consumes them: a :class:`~epochstream.events.DataMessage` gets its payload decoded (and, with a
record filter, re-checked; with a durable subscription, skipped when acked in an earlier
session); a frontier change prunes the filter schedule; a history fill's batch is read as it is
consumed. Decoding a whole poll's batch at once kept ~256,000 objects alive at 1000 records per
message and made the garbage collector run ~1,000 times more (half the records/s, measured):
each batch entry is dropped as it is handed out.
"""

from __future__ import annotations

from typing import Iterator

from ..events import DataMessage, Gap, LowerFrontierUpdate
from .fill import HistoryBatch, Rejoined

__all__ = ["HandOut"]

#: sets a (frozen) DataMessage's ``data`` slot: used once per message, before it is handed out
_set_data = DataMessage.data.__set__


class HandOut:
    """``HandOut(codec, filters, durable, fill)`` for one subscriber: its codec, its
    ``FilterSession``, its ``DurableCursor`` (or ``None``) and its ``HistoryFill``."""

    __slots__ = ("codec", "_filters", "_durable", "_fill")

    def __init__(self, codec, filters, durable, fill):
        self.codec, self._filters, self._durable, self._fill = codec, filters, durable, fill

    def __call__(self, m):
        """``m`` as handed out: data decoded and re-checked against the record filter
        (``None``: nothing of it matches, or acked before); other events as they are."""
        kind = type(m)
        if kind is DataMessage:
            if self._durable is not None and self._durable.skips(m.time):
                return None  # acked in an earlier session of this durable subscription
            records = self.codec.decode(m.data)
            if self._filters.program is not None:
                records = self._filters.recheck(m.time, records)
                if records is None:
                    return None
            # one object per message: the join's DataMessage (nobody else holds it) gets its
            # decoded records in place of the payload, instead of a second DataMessage
            _set_data(m, records)
            return m
        if kind is LowerFrontierUpdate:
            self._filters.handed(m)
        elif kind is Gap or kind is Rejoined:
            self._filters.restarted()
        return m

    def batch(self, got: list) -> Iterator:
        """The events of one poll's messages ``got`` (a list this consumes: each entry is set to
        ``None`` as it is handed out), each handed out when it is consumed, in order; a history
        fill's messages read as they are consumed."""
        decode, filters = self.codec.decode, self._filters
        for i, m in enumerate(got):
            got[i] = None  # handed-out events hold decoded records: the batch must not keep them
            if type(m) is DataMessage and self._durable is None and filters.program is None:
                _set_data(m, decode(m.data))  # the common case of __call__, inline
                yield m
                continue
            m = self(m)
            if m is None:
                continue
            kind = type(m)
            if kind is HistoryBatch:
                yield from self._fill.messages(m)
            elif kind is Rejoined:
                if m.withdraw is not None:
                    yield m.withdraw
            else:
                yield m
