"""What one subscriber connection wants from a publisher partition: the pure policy behind
filtering at the source (docs/filters.md). No sockets, no clock.

An :class:`Interest` holds two things a publisher applies before sending a ``D``:

- ``skip``: the upper frontier of the snapshot the peer was sent. Its Strymon filter drops
  every epoch ``t <= u`` for some ``u`` in it (epochs begun before it joined), so data at such
  ``t`` is not sent to it at all. Retired once the partition's lower frontier has no element
  ``<=`` any ``u`` (no later data can be ``<= u``).
- ``program``: the peer's :class:`~epochstream.filters.FilterSchedule`. Data at ``t`` goes out
  filtered by the union of :meth:`~epochstream.filters.FilterSchedule.sent` ``(t)``, projected
  on those filters' columns plus every column their conjuncts and keys read (so the subscriber
  can re-check what it receives). ``unfiltered``: the peer joined past the partition's bound on
  distinct programs: it is sent everything (and re-checks, which stays correct).

:meth:`Interest.select` maps a time to what to send: :data:`SKIP`, :data:`ALL`, or a tuple of
filters (the publisher encodes each distinct tuple once per message: peers with equal
filters share one encoding). Cost: O(|skip|) comparisons plus O(entries) per message and peer.
"""

from __future__ import annotations

from ..filters import Filter, FilterSchedule
from ..frontier import Antichain
from ..order import dual

__all__ = ["Interest", "SKIP", "ALL"]

SKIP = None
"""Send nothing of this message to the peer."""
ALL: tuple = ()
"""Send the message as it is."""


class Interest:
    """``Interest(order, skip=(), program=None, unfiltered=False)``: see the module docstring.
    ``skip``: the snapshot's upper frontier (a tuple of times)."""

    __slots__ = ("order", "skip", "program", "unfiltered")

    def __init__(self, order, skip: tuple = (), program: FilterSchedule | None = None,
                 unfiltered: bool = False):
        self.order = order
        self.skip = Antichain(dual(order), skip) if skip else None
        self.program = program
        self.unfiltered = unfiltered

    @property
    def trivial(self) -> bool:
        """True when it changes nothing (the peer can be served the plain broadcast)."""
        return self.skip is None and (self.program is None or self.unfiltered
                                      or self.program.current.everything
                                      and len(self.program.entries) == 1)

    def select(self, t):
        """:data:`SKIP`, :data:`ALL` or the tuple of filters to send data at ``t`` under."""
        skip = self.skip
        if skip is not None and skip.less_equal(t):
            return SKIP
        program = self.program
        if program is None or self.unfiltered:
            return ALL
        fs = program.sent(t)
        if any(f.everything for f in fs):
            return ALL
        return fs

    def frontier(self, lower) -> None:
        """The partition's lower frontier is now ``lower`` (times): retire ``skip`` once no
        element of ``lower`` is ``<=`` one of its times; prune the program."""
        if self.skip is not None:
            skip = self.skip
            if not any(skip.less_equal(t) for t in lower):
                self.skip = None
        if self.program is not None and len(self.program.entries) > 1:
            self.program = self.program.prune(lower)


def sent_filter(f: Filter, key) -> Filter:
    """``f`` as a publisher applies it: the same rows, projected on its columns plus every
    column its conjuncts and keys read (``None``: all columns stay)."""
    if f.columns is None:
        return f
    extra = [c for c, _, _ in f.where]
    if f.keys is not None and isinstance(key, str):
        extra.append(key)
    cols = tuple(dict.fromkeys((*f.columns, *extra)))
    if cols == f.columns:
        return f
    return Filter(f.keys, cols, f.where)
