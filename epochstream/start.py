"""Where a publisher starts: its initial lower frontier (capabilities) and upper frontier (the
epochs some data was sent for already, which a new subscriber's Strymon filter drops), decided
from what its predecessors left. Pure: the catalog's recorded upper frontier and the epoch log's
state are handed in (``transport/publisher_start.py`` reads them).

Four cases, one function each:

- :func:`given_frontiers` — the caller names both (a relay announces what its upstream join
  began in the middle of);
- :func:`inherited_upper` — no epoch log: a restart at ``start`` inherits the upper frontier the
  catalog recorded for the partition (every incarnation records its own before it sends data at
  a new maximal time);
- :func:`resumed_lower` — an unfinished epoch log (the predecessor crashed or aborted): resume
  at its lower frontier, or at a ``start`` not before it;
- :func:`continued_frontiers` — a finished epoch log (the predecessor closed): a new stream
  continues it with later epochs.

Each raises :class:`~epochstream.errors.ProtocolError` when no safe start can be derived
(``who`` names the publisher in the message). Frontiers are lists of times of ``order``.

>>> from epochstream.order import TOTAL
>>> inherited_upper(TOTAL, 5, None, who="t/0")
(4,)
>>> continued_frontiers(TOTAL, None, [9], who="t/0")
([10], [9])
"""

from __future__ import annotations

from .errors import ProtocolError
from .frontier import Antichain
from .order import TIME_MIN, check_time, dual

__all__ = ["given_frontiers", "inherited_upper", "resumed_lower", "continued_frontiers"]


def _first(order, start) -> list:
    """The fresh lower frontier: ``[start]`` (checked), the order's minimum for ``None``."""
    return [order.minimum if start is None else check_time(order, start)]


def given_frontiers(order, start, upper: list) -> tuple[list, list]:
    """``(lower, upper)`` for a publisher told its upper frontier: ``start`` a time, a list of
    times (an antichain of capabilities) or ``None`` (the minimum); both checked."""
    lower = [check_time(order, t) for t in start] if isinstance(start, list) else \
        _first(order, start)
    return lower, [check_time(order, t) for t in upper]


def inherited_upper(order, start, recorded: tuple | None, *, who: str) -> tuple:
    """The upper frontier a publisher without an epoch log starting at ``start`` announces:
    empty for a fresh stream (``start`` ``None`` or the minimum: every time is re-sent), else
    ``recorded`` (the catalog's, ``None`` if it has none) — never padded: padding it (e.g. with
    ``start - 1``) would filter the *other* partitions' data at epochs this one completed
    without data, and a new subscriber would miss those epochs silently — and without a record
    ``start - 1`` for a total order. :class:`ProtocolError` for another order without one
    (nothing could tell subscribers which epochs were begun)."""
    if start is None:
        return ()
    start = check_time(order, start)
    if start == order.minimum:
        return ()
    if recorded is not None:
        return tuple(recorded)
    if getattr(order, "name", None) == "total":
        return (start - 1,) if start > TIME_MIN else ()
    raise ProtocolError(
        f"publisher {who}: start={start!r} skips times an earlier incarnation may have begun, "
        f"and no catalog records its upper frontier; a restart past the minimum needs the "
        f"catalog the earlier incarnation registered in")


def resumed_lower(order, start, logged_lower: list, *, who: str) -> list:
    """The lower frontier of a publisher resuming an unfinished epoch log whose logged lower
    frontier is ``logged_lower``: that frontier without ``start``; ``[start]`` if it is at or
    beyond it; :class:`ProtocolError` if it is before (those epochs are complete in the log)."""
    if start is None:
        return list(logged_lower)
    fresh = _first(order, start)
    if not Antichain(order, logged_lower).less_equal(fresh[0]):
        raise ProtocolError(
            f"publisher {who}: start={start!r} is before the logged lower frontier "
            f"{list(logged_lower)!r}: those epochs are complete in the epoch log already; resume "
            f"at or beyond it (or leave start=None to resume there)")
    return fresh


def continued_frontiers(order, start, uppers: list, *, who: str) -> tuple[list, list]:
    """``(lower, upper)`` of a new stream continuing a finished epoch log whose stream (log and
    catalog together) reached the upper frontier elements ``uppers``: ``start`` (or the
    minimum) with no upper frontier when nothing was sent; else, without ``start``, the epoch
    after it for a total order (:class:`ProtocolError` for another order: pass ``start``);
    :class:`ProtocolError` for a ``start`` at or below one of ``uppers`` (complete already)."""
    upper = Antichain(dual(order), uppers)
    if not upper:
        return _first(order, start), []
    if start is None:
        if getattr(order, "name", None) != "total":
            raise ProtocolError(
                f"publisher {who}: its epoch log holds a finished stream up to "
                f"{list(upper.elements)!r}; pass start= (a time not at or below any of them) to "
                f"continue it, or drop the topic to start afresh")
        start = max(upper.elements) + 1
    start = check_time(order, start)
    if upper.less_equal(start):  # over the dual order: some upper element is >= start
        raise ProtocolError(
            f"publisher {who}: start={start!r} is not after the finished stream in its epoch "
            f"log (upper frontier {list(upper.elements)!r}); those epochs are complete already "
            f"(drop the topic to start afresh)")
    return [start], list(upper.elements)
