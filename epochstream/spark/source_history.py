"""What the Spark source reads of a topic's history before it plans a batch: the partitions'
log states (checked: the source reads nothing but the logs), the latest complete frontier, and
``startingPosition`` resolved to a retained frontier (docs/spark.md, "Offsets are frontiers")."""

from __future__ import annotations

from typing import Any

from ..errors import HistoryUnavailable
from ..frontier import Antichain, join
from ..history import History
from ..order import dual
from .offsets import _canonical
from .source_options import SourceOptions


def _history(options: SourceOptions) -> History:
    """The topic's :class:`History`. Raises ``TopicNotFound``, ``HistoryUnavailable`` (no
    partition keeps a log, or a registered one does not)."""
    history = History(options.topic, catalog=options.catalog)
    _states(history)
    return history


def _states(history: History) -> tuple[dict, Any]:
    """The partitions' log states and the topic's :class:`~epochstream.catalog.records.TopicInfo`,
    checked: raises ``HistoryUnavailable`` if no partition keeps a log or a registered one keeps
    none (the source reads nothing but the logs)."""
    states = history.states()
    info = history.catalog.lookup(history.topic)
    unlogged = sorted(p.index for p in info.partition_info if p.index not in states)
    if not states or unlogged:
        which = f"partition(s) {unlogged}" if states else "no partition"
        raise HistoryUnavailable(
            f"topic {history.topic!r}: {which} keep(s) an epoch log; the Spark source reads "
            f"the topic's history: publish every partition with retention=Retention() "
            f"(SparkPublisherHost(..., retention=Retention()))")
    return states, info


def _after(order, upper) -> tuple:
    """The frontier of the times not ``<=`` any element of ``upper`` (the complement of its
    down-set), for the total and ``product(n)`` orders: ``[u + 1]``, or per ``u`` the ``n``
    unit steps ``(0, .., u_i + 1, .., 0)``, joined over ``upper`` (the intersection of their
    up-sets)."""
    out: tuple = (order.minimum,)
    width = getattr(order, "width", None)
    for u in upper:
        if width is None:
            step: tuple = (u + 1,)
        else:
            step = tuple(tuple(u[i] + 1 if j == i else order.minimum[j] for j in range(width))
                         for i in range(width))
        out = join(order, out, step)
    return out


def _latest(history: History, checked: tuple[dict, Any]) -> tuple:
    """The merged lower frontier of the logs: every epoch not at or beyond it is complete and
    logged in every partition (``History.records``' test). A partition without a log yet (not
    started) contributes the order's minimum: nothing is complete until it starts.

    A finished log (closed: an empty lower frontier) contributes :func:`_after` the topic's
    upper frontier (every partition's, logged and in the catalog; the minimum if no partition
    ever sent data) instead of nothing: a later run may continue the topic with later epochs,
    and an offset that reached the empty frontier could never read them."""
    states, info = checked
    order = history.order
    merged = Antichain(order)
    finished = False
    for s in states.values():
        merged.extend(s.lower)
        finished |= not s.lower
    if finished:
        upper = Antichain(dual(order))
        for s in states.values():
            upper.extend(s.upper)
        for p in info.partition_info:
            upper.extend(p.upper)
        merged.extend(_after(order, upper.elements))
    if len(states) < history.partitions:
        merged.insert(order.minimum)
    return _canonical(order, merged.elements)


def _resolve_start(history: History, options: SourceOptions, checked: tuple) -> tuple:
    """``startingPosition`` as a frontier: ``earliest`` the retained ``since``, ``latest`` the
    merged lower frontier now, or the given one, checked to be retained (raises
    ``HistoryUnavailable`` naming what is)."""
    order = history.order
    position = options.position(order)
    if position == "earliest":
        return _canonical(order, history.since)
    if position == "latest":
        return _latest(history, checked)
    retained = Antichain(order, history.since)
    if not all(retained.less_equal(a) for a in position):
        raise HistoryUnavailable(
            f"topic {history.topic!r}: startingPosition {list(position)} is older than what is "
            f"retained (since {list(history.since)}); start at 'earliest' or later",
            retained=tuple(history.since))
    return _canonical(order, position)
