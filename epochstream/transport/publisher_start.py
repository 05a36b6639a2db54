"""A publisher's start, read from what its predecessors left: the upper frontier the catalog
recorded for the partition, and its epoch log (opened, recovered, continued). The decisions are
the pure functions of :mod:`epochstream.start`; this module does the reading for them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..catalog import Catalog
from ..catalog.runs import claim_run
from ..errors import EpochstreamError
from ..frontier import Antichain
from .. import wire
from ..order import by_name, check_time, dual
from ..partitioning import partition_key
from ..protocol import PublisherProtocol
from ..retention import Retention
from ..start import continued_frontiers, given_frontiers, inherited_upper as _inherited
from ..start import resumed_lower

if TYPE_CHECKING:  # the log package is imported by a publisher that keeps one (open_log)
    from ..log.writer import LogWriter

__all__ = ["topic_definition", "start_protocol", "start_frontiers", "open_log", "inherited_upper", "recorded_upper", "history_dir"]

log = logging.getLogger("epochstream.transport")


def topic_definition(partition: int, partitions: int, order, codec: str, key, partitioning):
    """``(order, codec, partition key)`` of a publisher's topic, checked: ``order`` an order or
    its name, ``codec`` a codec's name (:func:`epochstream.wire.codec`), ``key`` and
    ``partitioning`` as :func:`epochstream.partitioning.partition_key` takes them.
    ``ValueError``/``TypeError`` for a partition out of ``0..partitions - 1`` or a bad
    option."""
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise ValueError(f"partition {partition!r} out of range 0..{partitions - 1}")
    order = by_name(order) if isinstance(order, str) else order
    return order, wire.codec(codec), partition_key(key, partitioning)


def recorded_upper(catalog: Catalog | None, topic: str, partition: int, order) -> tuple | None:
    """The upper frontier the catalog recorded for ``partition`` of ``topic`` (``None``: no
    catalog, no such topic or partition, or a topic of another order)."""
    if catalog is None:
        return None
    try:
        info = catalog.lookup(topic)
    except EpochstreamError:
        return None
    if info.order_name != getattr(order, "name", None):
        return None
    p = next((x for x in info.partition_info if x.index == partition), None)
    return None if p is None else tuple(p.upper)


def inherited_upper(catalog: Catalog | None, topic: str, partition: int, order, start) -> tuple:
    """The upper frontier a publisher without an epoch log starting at ``start`` announces
    (:func:`epochstream.start.inherited_upper` on the catalog's record)."""
    if start is None:
        return ()
    return _inherited(order, start, recorded_upper(catalog, topic, partition, order),
                      who=f"{topic}/{partition}")


def history_dir(catalog: Catalog, retention: Retention, topic: str, partition: int):
    """Where the epoch log of ``partition`` of ``topic`` lives: under ``retention.dir``, or
    ``history/`` next to the catalog file."""
    from ..log.format import partition_dir

    base = retention.dir if retention.dir is not None else catalog.path.parent / "history"
    return partition_dir(base, topic, partition)


def start_frontiers(catalog: Catalog | None, topic: str, partition: int, order, start,
                    upper: list | None) -> tuple[list | None, list | tuple]:
    """``(lower, upper)`` of a publisher without an epoch log: ``upper`` given (a relay), or
    inherited from the catalog; ``lower`` is ``None`` when the protocol takes ``start``
    itself."""
    if upper is not None:
        return given_frontiers(order, start, upper)
    if isinstance(start, list):
        raise ValueError("start= as a list of times (an antichain) needs upper=")
    return None, inherited_upper(catalog, topic, partition, order, start)


def open_log(catalog: Catalog | None, retention: Retention, topic: str, partition: int, order,
             start, incarnation: str, create) -> tuple[LogWriter, list, list]:
    """Open (or recover, or continue) ``partition``'s epoch log; ``create()`` creates the topic
    in the catalog first. Returns ``(writer, lower, upper)``: the frontiers to start with.
    ``TypeError``/``ValueError`` for a bad ``retention`` or no catalog;
    :class:`~epochstream.errors.ProtocolError` for a ``start`` the log refuses."""
    if not isinstance(retention, Retention):
        raise TypeError(f"retention must be a Retention, got {type(retention).__name__}")
    if catalog is None:
        raise ValueError("retention needs a catalog: the epoch log's index lives there")
    from ..log.store import open_store
    from ..log.uploader import Uploader
    from ..log.writer import LogWriter

    # a store is opened and probed first: a bad one fails the constructor, nothing created
    store = None if retention.store is None else open_store(retention.store, write=True)
    create()
    who = f"{topic}/{partition}"
    prior = catalog.history_state(topic, partition)
    info = catalog.lookup(topic) if prior is not None else None
    mine = None if info is None else \
        next((p for p in info.partition_info if p.index == partition), None)
    writer = LogWriter(catalog, topic, partition, order, retention,
                       history_dir(catalog, retention, topic, partition))
    writer.incarnation = incarnation
    if store is not None:
        writer.uploader = Uploader(store, catalog, topic, partition, incarnation,
                                   retention.upload_backlog)
        if retention.upload == "frontier":
            from ..log.tails import TailChain

            writer.tails = TailChain(store, catalog, topic, partition, incarnation)
    try:
        return _open_writer(writer, catalog, topic, partition, order, start, prior, info, mine,
                            who)
    except BaseException:
        uploader, writer.uploader = writer.uploader, None
        if uploader is not None:
            uploader.close()
        raise


def _open_writer(writer: LogWriter, catalog, topic: str, partition: int, order, start, prior,
                 info, mine, who: str) -> tuple[LogWriter, list, list]:
    """:func:`open_log` once the writer is built: open it where its predecessors left it."""
    if prior is not None and not prior.lower:
        # a finished log continues only where the catalog would take the registration:
        # refused before the log is touched for a partition closed while its run goes on
        claim_run(topic, partition, mine, list(info.partition_info))
        uppers = [*prior.upper, *(mine.upper if mine is not None else ())]
        lower, upper = continued_frontiers(order, start, uppers, who=who)
        if start is None and uppers:
            log.info("publisher %s continues its finished epoch log at epoch %s", who, lower[0])
        writer.open(lower, upper)
        return writer, lower, upper
    if prior is not None:  # unfinished: the recorded upper frontier bounds what was sent
        uppers = [*prior.upper, *(mine.upper if mine is not None else ())]
        upper = list(Antichain(dual(order), uppers).elements)
    else:
        upper = list(inherited_upper(catalog, topic, partition, order, start))
    fresh = [order.minimum if start is None else check_time(order, start)]
    state = writer.open(fresh, upper)
    if prior is None:
        return writer, fresh, upper
    try:
        lower = resumed_lower(order, start, list(state.lower), who=who)
    except BaseException:
        writer.close()
        raise
    if start is None:
        log.info("publisher %s resumes from its epoch log at %s", who, list(state.lower))
    return writer, lower, upper


def start_protocol(catalog: Catalog | None, retention: Retention | None, topic: str,
                   partition: int, order, start, upper: list | None, strict: bool,
                   incarnation: str, create) -> tuple[PublisherProtocol, LogWriter | None,
                                                       tuple | None]:
    """The protocol state a publisher starts with, from its epoch log (``retention``), a given
    upper frontier (a relay) or the catalog's record; ``create()`` creates the topic before a
    log is opened. Returns ``(protocol, writer or None, resumed_at)``: ``resumed_at`` is the
    lower frontier taken from an unfinished log without ``start`` (``None`` otherwise)."""
    if retention is None:
        lower, upper = start_frontiers(catalog, topic, partition, order, start, upper)
        if lower is None:
            return PublisherProtocol(order, start=start, upper=upper, strict=strict), None, None
        return PublisherProtocol(order, lower=lower, upper=upper, strict=strict), None, None
    if upper is not None:
        raise ValueError("upper= is not for a publisher with retention (its log recovers it)")
    writer, lower, upper = open_log(catalog, retention, topic, partition, order, start,
                                    incarnation, create)
    resumed_at = tuple(lower) if start is None and tuple(lower) != (order.minimum,) else None
    return PublisherProtocol(order, lower=lower, upper=upper, strict=strict), writer, resumed_at
