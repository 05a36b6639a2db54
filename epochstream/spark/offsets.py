"""Offsets of the Spark source as frontiers, and the pure planning rule of a micro-batch's end
(docs/spark.md, "Offsets are frontiers"): an offset is the JSON object
``{"topic": <name>, "frontier": [<time>, ...]}``; a micro-batch from ``start`` to ``end`` holds
the complete retained epochs ``t`` with ``start <= t`` and not ``end <= t``. No I/O here."""

from __future__ import annotations

from typing import Any

from ..errors import ProtocolError
from ..frontier import Antichain, join
from ..order import linear_extension
from .source_options import SourceError

__all__ = ["batch_end"]


def _json_time(t: Any) -> Any:
    return list(t) if isinstance(t, tuple) else t


def _canonical(order, frontier) -> tuple:
    """``frontier`` as its antichain's elements in a linear extension of ``order`` (so that
    equal frontiers have equal JSON: Spark compares offsets as text)."""
    return tuple(linear_extension(order, Antichain(order, frontier).elements))


def _offset(topic: str, order, frontier) -> dict:
    return {"topic": topic, "frontier": [_json_time(t) for t in _canonical(order, frontier)]}


def _frontier(topic: str, order, offset: Any) -> tuple:
    """The frontier of an offset this source produced (from Spark's offset log). Raises
    :class:`SourceError` for an offset of another topic or another shape."""
    if not isinstance(offset, dict) or not isinstance(offset.get("frontier"), list):
        raise SourceError(f"not an offset of the epochstream source: {offset!r}")
    if offset.get("topic") != topic:
        raise SourceError(f"the query's checkpoint holds offsets of topic {offset.get('topic')!r}, "
                          f"not {topic!r}: use a fresh checkpoint location for another topic")
    try:
        times = [tuple(t) if isinstance(t, list) else t for t in offset["frontier"]]
        return tuple(Antichain(order, [order.check(t) for t in times]).elements)
    except ProtocolError as e:
        raise SourceError(f"offset {offset!r} does not fit topic {topic!r}: {e}") from None


def batch_end(order, start, latest, epochs, *, max_epochs: int | None = None,
              max_bytes: int | None = None) -> tuple:
    """The end offset (a frontier) of a micro-batch starting at ``start``.

    ``latest``: the merged lower frontier (every epoch not at or beyond it is complete);
    ``epochs``: ``[(time, nbytes), ...]``, the complete retained epochs with data at or beyond
    ``start`` and not at or beyond ``latest``, in a linear extension of ``order`` (what
    :meth:`History.records <epochstream.history.History.records>` returns). Returns ``start``
    itself when ``epochs`` is empty (nothing to read: Spark runs no batch); otherwise ``E``
    such that the batch ``{t : start <= t and not E <= t}`` holds exactly the first ``n`` of
    ``epochs`` with ``n = len(epochs)`` capped by ``max_epochs`` and by ``max_bytes`` (but at
    least 1: a batch always makes progress), every time in it complete, and every element of
    ``E`` at or beyond ``start``:

        E = the antichain of  epochs[n:]  and  join(start, latest)

    A prefix of a linear extension is closed downwards (nothing outside it is ``<=`` anything
    in it), so no epoch left out is below one taken and ``E`` cuts exactly there, for any
    partial order. O(k·w) comparisons for k epochs left and an antichain of width w."""
    full = join(order, start, latest)
    if not epochs:
        return tuple(start)
    n = len(epochs)
    if max_epochs is not None:
        n = min(n, max(1, int(max_epochs)))
    if max_bytes is not None:
        total, take = 0, 0
        for _, nbytes in epochs[:n]:
            total += nbytes
            if take and total > max_bytes:
                break
            take += 1
        n = take
    return _canonical(order, [t for t, _ in epochs[n:]] + list(full))
