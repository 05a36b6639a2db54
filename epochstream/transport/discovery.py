"""Which publishers a subscriber joins: the catalog's view of a topic's partitions.

A partition is joined at its registered endpoint when its publisher is live; a closed partition
is not joined — its final upper frontier stands in for its snapshot (an empty lower frontier: it
contributes to the filter and nothing else); a dead or aborted one cannot be joined.
"""

from __future__ import annotations

import os
import time

from ..catalog import Catalog, PartitionInfo, TopicInfo

from ..errors import (EpochstreamError, NotAuthorized, PublisherAborted, PublisherLost,
                      TopicClosed)

__all__ = ["resolve_catalog", "partition_endpoints", "catalog_partitions", "await_live",
           "await_one_run", "server_keys"]

ENDED = ("closed", "aborted", "dead", "expired")


def resolve_catalog(catalog) -> Catalog:
    """A :class:`~epochstream.catalog.Catalog` from a catalog, a path, or ``None`` (the default
    catalog: ``$EPOCHSTREAM_CATALOG`` or ``./.epochstream``)."""
    if catalog is None or isinstance(catalog, (str, os.PathLike)):
        return Catalog(catalog)
    return catalog


def server_keys(topic: str, security, info: TopicInfo | None, endpoints: list) -> dict:
    """``{partition: the publisher's CURVE key}`` to connect to each live partition of
    ``endpoints`` with: ``security``'s ``server_public`` (a
    :class:`~epochstream.security.Security` or ``None``), else the catalog's (``info``). Raises
    :class:`NotAuthorized` when a live partition's catalog entry and ``security`` do not match
    (one is CURVE, the other not)."""
    recorded = {} if info is None else {p.index: p.server_key for p in info.partition_info}
    keys = {}
    for i, ep in enumerate(endpoints):
        if ep is None:
            continue
        key = recorded.get(i)
        if security is None:
            if key is not None:
                raise NotAuthorized(
                    f"topic {topic!r}: the publisher of partition {i} requires CURVE "
                    f"(server key {key}); pass security=Security.curve(client_secret=...)",
                    topic=topic, partition=i)
            continue
        if security.server_public is not None:
            keys[i] = security.server_public
        elif key is None:
            raise NotAuthorized(
                f"topic {topic!r}: the catalog records no CURVE key for partition {i} "
                f"(its publisher serves plain TCP, without security=); pass "
                f"Security.curve(server_public=...) or subscribe without security=",
                topic=topic, partition=i)
        else:
            keys[i] = key
    return keys


def partition_endpoints(info: TopicInfo, wait: float) -> tuple[list, dict, dict]:
    """``(endpoints, closed, incarnations)`` for every partition ``0..partitions-1`` of
    ``info``: the endpoint to join (``None`` for a closed partition), ``{partition: final upper
    frontier}`` of the closed ones, ``{partition: incarnation}`` of the live ones. Raises
    :class:`~epochstream.errors.PublisherLost` for a partition nobody registered (after
    ``wait`` seconds) or whose publisher is dead, and
    :class:`~epochstream.errors.PublisherAborted` for an aborted one."""
    by_index = {p.index: p for p in info.partition_info}
    endpoints, closed, incarnations = [], {}, {}
    for i in range(info.partitions):
        p = by_index.get(i)
        if p is None:
            raise PublisherLost(f"topic {info.name!r}: partition {i} has no publisher registered "
                                f"after waiting {wait} s", partition=i)
        if p.state == "closed":
            closed[i] = tuple(p.upper)
            endpoints.append(None)
            continue
        if p.state in ("dead", "expired"):
            why = "is dead" if p.state == "dead" else "let its lease expire"
            raise PublisherLost(f"topic {info.name!r}: the publisher of partition {i} "
                                f"(pid {p.pid} on {p.host}) {why}", partition=i)
        if p.state == "aborted":
            raise PublisherAborted(f"topic {info.name!r}: the publisher of partition {i} "
                                   f"(pid {p.pid}) aborted; its open epochs never complete",
                                   partition=i)
        endpoints.append(p.endpoint)
        incarnations[i] = p.incarnation
    return endpoints, closed, incarnations


def catalog_partitions(catalog: Catalog | None, topic: str) -> dict[int, PartitionInfo]:
    """``{index: PartitionInfo}`` of ``topic`` (``{}`` without a catalog, or if it cannot be
    read: liveness checks then simply learn nothing this time)."""
    if catalog is None:
        return {}
    try:
        info = catalog.lookup(topic)
    except EpochstreamError:
        return {}
    return {p.index: p for p in info.partition_info}


def await_live(catalog: Catalog, info: TopicInfo, wait: float, *, poll: float = 0.05) -> TopicInfo:
    """For a ``start="latest"`` subscriber: if every partition of ``info`` has ended (closed,
    aborted or dead — an earlier run's publishers), wait up to ``wait`` seconds until new
    publishers replaced every one of them, and return the topic as it is then. A topic with a
    live partition is returned at once. When time is up and every partition is closed, raise
    :class:`~epochstream.errors.TopicClosed` ("topic 'x' is closed (publisher pid N ended at
    ...)") — never a silent success with nothing; for aborted or dead ones the caller's
    :func:`partition_endpoints` raises as before."""
    parts = info.partition_info
    if not parts or any(p.state not in ENDED for p in parts):
        return info
    ended = {p.index: p.incarnation for p in parts}
    deadline = time.monotonic() + max(0.0, float(wait))
    while time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        try:
            now = catalog.lookup(info.name)
        except EpochstreamError:
            continue
        if all(p.state == "live" and p.incarnation != ended.get(p.index)
               for p in now.partition_info) and now.complete:
            return now
        info = now
    if all(p.state == "closed" for p in info.partition_info):
        last = max(p.updated_at for p in info.partition_info)
        pids = ", ".join(str(pid) for pid in sorted({p.pid for p in info.partition_info}))
        raise TopicClosed(
            f"topic {info.name!r} is closed (publisher pid {pids} ended at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last))}) and no new publisher "
            f"started within {wait:g} s; a subscriber with start=\"latest\" would receive "
            f"nothing (replay what the topic retains with start=\"earliest\")",
            topic=info.name, ended_at=last)
    return info


def await_one_run(catalog: Catalog, info: TopicInfo, wait: float, *,
                  poll: float = 0.05) -> TopicInfo:
    """``info`` once every partition belongs to the topic's newest run (``PartitionInfo.run``):
    while a new run's partitions are still registering (some publish run *n + 1*, the others
    ended run *n* and were not restarted yet), wait up to ``wait`` seconds for the rest —
    joining then would combine partitions of two runs into one epoch (a closed partition of
    run *n* would stand for its successor of run *n + 1*, whose records the epochs would lack).
    Raises :class:`~epochstream.errors.PublisherLost` for the first partition still of an
    older run when time is up."""
    deadline = time.monotonic() + max(0.0, float(wait))
    while True:
        top = max((p.run for p in info.partition_info), default=1)
        behind = sorted((p.index, p.run, p.state) for p in info.partition_info
                        if p.run < top and p.state in ENDED)
        if not behind:
            return info
        left = deadline - time.monotonic()
        if left <= 0:
            i, run, state = behind[0]
            raise PublisherLost(
                f"topic {info.name!r} is between runs: partition(s) "
                f"{[b[0] for b in behind]} ended run {run} ({state}) and did not register for "
                f"run {top}, which the others began, within {wait:g} s; a subscriber never "
                f"combines partitions of two runs into one epoch", partition=i)
        time.sleep(min(poll, left))
        try:
            info = catalog.lookup(info.name)
        except EpochstreamError:
            continue
