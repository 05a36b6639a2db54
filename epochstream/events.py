"""Every value a subscriber hands to its user, as small frozen classes (in the style of h11's
events). Times are ``int`` for :data:`~epochstream.order.TOTAL` or tuples of ints for
:func:`~epochstream.order.product`.

Protocol messages (Strymon pubsub protocol, "Protocol Messages"):

- :class:`InitialFrontierSnapshot` ``(lower, upper)`` — the first message a new subscriber gets
  from a partition: both frontiers at the moment it joined.
- :class:`LowerFrontierUpdate` ``(updates)`` — net changes of a lower frontier, each
  ``(t, +1)`` or ``(t, -1)`` (timely's ``ChangeBatch`` after consolidation).
- :class:`DataMessage` ``(time, data, nbytes)`` — one batch of records at one time.

What a :class:`~epochstream.transport.Subscriber` yields:

- :class:`Epoch` — all records of one time, once complete (``Subscriber.epochs()``);
- :class:`DataMessage` and :class:`LowerFrontierUpdate` as they arrive (``Subscriber.events()``);
- :class:`Gap` — the subscriber re-joined its topic (``recover=True``) and may have missed the
  epochs it describes; after a ``Gap`` the merged lower frontier is announced afresh, as ``+1``
  changes from the empty frontier;
- :class:`FetchResult` — the whole epochs one ``Subscriber.fetch()`` returned, with a status.

Until release 0.3, ``for message, nbytes in sub.events()`` (and ``item[0]``, ``item[1]``) keeps
working: an event then acts as the pair ``(event, nbytes)``, with a :class:`DeprecationWarning`
(use the event itself and ``event.nbytes``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InitialFrontierSnapshot", "LowerFrontierUpdate", "DataMessage", "Epoch", "Gap",
           "FetchResult"]


class _PairShim:
    """Lets ``message, nbytes = event`` (the shape ``events()`` yielded before 0.2) work for one
    more release, with a :class:`DeprecationWarning`."""

    __slots__ = ()

    def _pair(self) -> tuple:
        warnings.warn("Subscriber.events() now yields event objects; using them as "
                      "(message, nbytes) pairs is deprecated and will be removed in 0.3: use "
                      "the event itself and event.nbytes", DeprecationWarning, stacklevel=3)
        return (self, getattr(self, "nbytes", 0))

    def __iter__(self):
        return iter(self._pair())

    def __getitem__(self, i):
        return self._pair()[i]


@dataclass(frozen=True, slots=True)
class InitialFrontierSnapshot:
    """Both frontiers of a partition at the moment a subscriber joined.

    ``lower``: tuple of times (minimal times that may still occur); ``upper``: tuple of times
    (maximal times seen in data so far)."""

    lower: tuple
    upper: tuple


@dataclass(frozen=True, slots=True)
class LowerFrontierUpdate(_PairShim):
    """Net changes of a lower frontier: a tuple of ``(time, +1 | -1)`` pairs. ``nbytes`` is
    always 0 (present so every event has it)."""

    updates: tuple
    nbytes = 0


@dataclass(frozen=True, slots=True)
class DataMessage(_PairShim):
    """A batch of records at one logical ``time``. ``data`` is opaque to the protocol (encoded
    bytes on the wire; a list of records or a ``pyarrow.Table`` once a subscriber decoded it);
    ``nbytes``: the encoded payload's size in bytes (0 where unknown)."""

    time: Any
    data: Any
    nbytes: int = 0


def data_message(time, data, nbytes: int, _new=object.__new__, _cls=DataMessage,
                 _time=DataMessage.time.__set__, _data=DataMessage.data.__set__,
                 _nbytes=DataMessage.nbytes.__set__) -> DataMessage:
    """``DataMessage(time, data, nbytes)`` for a subscriber's hot path: the slots set directly
    (a frozen dataclass's ``__init__`` goes through ``object.__setattr__`` per field: 0.30
    against 0.18 µs a message, measured). Equal in every way to the constructor's result."""
    m = _new(_cls)
    _time(m, time)
    _data(m, data)
    _nbytes(m, nbytes)
    return m


@dataclass(frozen=True, slots=True)
class Epoch:
    """All records of one time, released once the merged lower frontier has passed it.

    ``time``: the epoch's time; ``records``: the combined payloads (a list for list payloads, or
    whatever the assembler's ``combine`` returns, e.g. a ``pyarrow.Table``); ``messages``: number
    of data messages combined; ``nbytes``: payload bytes as reported by the caller;
    ``first_seen`` / ``released_at``: caller-supplied clock readings (seconds, e.g.
    ``time.time()``) of the first data message and of the release, or ``None``."""

    time: Any
    records: Any
    messages: int = 0
    nbytes: int = 0
    first_seen: float | None = None
    released_at: float | None = None

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True, slots=True)
class Gap(_PairShim):
    """A subscriber re-joined its topic and may have missed epochs (``recover=True`` only).

    - ``reason``: ``"lagged"`` (a publisher evicted it), ``"restarted"`` (a publisher came back
      with a new incarnation) or ``"aborted"`` (a publisher aborted and a new incarnation took
      over);
    - ``partition``: the partition that caused it;
    - ``last_epoch``: the last complete epoch handed out before the gap (``None`` if none; always
      ``None`` from ``events()``, which hands out no epochs);
    - ``since``: the merged lower frontier before the gap (tuple of times): every epoch not at or
      beyond it had been delivered (or had no data);
    - ``until``: the merged lower frontier of the fresh snapshots: epochs not at or beyond it
      were complete before the re-join;
    - ``through``: the maximal upper-frontier elements of the fresh snapshots: epochs at or below
      them had begun before the re-join;
    - ``order``: the topic's order (not compared, not shown).

    An epoch ``t`` may have been missed (:meth:`may_have_missed`) iff it is at or beyond
    ``since`` and either below ``until`` or at or below some ``through`` element; every other
    epoch is delivered whole, and no epoch is delivered twice."""

    reason: str
    partition: int
    last_epoch: Any
    since: tuple
    until: tuple
    through: tuple
    order: Any = field(default=None, compare=False, repr=False)
    nbytes = 0

    def may_have_missed(self, t) -> bool:
        """True iff epoch ``t`` falls into the gap (see the class docstring). Cost: O(w) order
        comparisons for frontiers of width ``w``."""
        le = self.order.le
        if not any(le(s, t) for s in self.since):
            return False
        return not any(le(u, t) for u in self.until) or any(le(t, u) for u in self.through)


#: the statuses of a :class:`FetchResult`
FETCH_STATUSES = ("ok", "timeout", "no_data", "epoch_too_large")


@dataclass(frozen=True, slots=True, repr=False)
class FetchResult(Sequence):
    """What one ``Subscriber.fetch()`` returned: a read-only sequence of whole :class:`Epoch`
    objects (``len``, indexing, slicing to a tuple, iteration; empty is falsy), in the order
    ``Subscriber.epochs()`` would have yielded them.

    - ``epochs``: the same epochs, as a tuple;
    - ``status``: ``"ok"`` — at least one epoch; ``"timeout"`` — no epoch, and the pull waited
      its whole ``expires``; ``"no_data"`` — no epoch, returned without waiting out an
      ``expires``: ``no_wait=True`` found none ready, the stream ended (``finished``), the pull
      was superseded (``superseded``), or a failure is pending (raised by the next call);
      ``"epoch_too_large"`` — exactly one epoch, larger on its own than the pull's
      ``max_bytes`` (handed out anyway: it could never fit, and holding it back would stall the
      stream);
    - ``gaps``: the :class:`Gap` events (``recover=True``) the pull met, in order, whatever its
      status; each one's ``last_epoch`` names the last epoch handed out before it;
    - ``finished``: the stream ended (every partition finished) and every epoch was handed out:
      later pulls return ``"no_data"`` at once;
    - ``superseded``: a newer ``fetch()`` (from another thread) cut this one short; it returned
      what it had.

    :attr:`nbytes` is the sum of the epochs' ``nbytes`` (encoded payload bytes)."""

    epochs: tuple = ()
    status: str = "no_data"
    gaps: tuple = ()
    finished: bool = False
    superseded: bool = False

    def __post_init__(self):
        if self.status not in FETCH_STATUSES:
            raise ValueError(f"FetchResult status must be one of {FETCH_STATUSES}, "
                             f"got {self.status!r}")
        object.__setattr__(self, "epochs", tuple(self.epochs))
        object.__setattr__(self, "gaps", tuple(self.gaps))
        n = len(self.epochs)
        if (n == 0) != (self.status in ("timeout", "no_data")) or \
                (self.status == "epoch_too_large" and n != 1):
            raise ValueError(f"FetchResult status {self.status!r} with {n} epochs")

    def __len__(self) -> int:
        return len(self.epochs)

    def __getitem__(self, i):
        return self.epochs[i]

    def __iter__(self):
        return iter(self.epochs)

    @property
    def nbytes(self) -> int:
        """Total encoded payload bytes of the epochs (the quantity ``max_bytes`` bounds)."""
        return sum(e.nbytes for e in self.epochs)

    @property
    def times(self) -> list:
        """The epochs' times, in order."""
        return [e.time for e in self.epochs]

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("gaps", "finished", "superseded")
                        if getattr(self, k))
        return f"FetchResult(status={self.status!r}, times={self.times!r}, nbytes={self.nbytes}{extra})"
