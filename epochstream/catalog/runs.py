"""Runs of a topic: when a partition may be registered again (pure; the catalog applies it
inside its write transaction, a publisher checks it before it touches its epoch log).

A topic's partitions publish together in a **run**. A partition that closed (its lower frontier
became empty: its publisher finished) is final for its run — subscribers that saw it end stopped
listening to it, so a publisher continuing it while its siblings still publish would have
their later epochs released without its records. It may be registered again only once every
partition of its run ended (closed, aborted or dead), which begins the next run. A partition
that aborted or died is continued in its run by its successor (``recover=True`` subscribers
wait for it). Runs are numbered from 1 (``PartitionInfo.run``).
"""

from __future__ import annotations

from typing import Any

from ..errors import CatalogError

__all__ = ["claim_run"]


def claim_run(topic: str, partition: int, current: Any, infos: list) -> int:
    """The run a new incarnation of ``partition`` joins, given its row ``current`` (``None``:
    never registered) and every partition row of ``topic`` (``infos``, liveness judged).

    A partition that closed (its lower frontier became empty) is final for its run: it may be
    registered again only once every partition of that run ended (closed, aborted or dead),
    which begins the next run (or joins it, if another partition began it already). An aborted
    or dead partition is continued in its run by its successor. Raises :class:`CatalogError`
    naming the choices for a closed partition whose run goes on."""
    top = max((p.run for p in infos), default=1)
    if current is None or current.state != "closed":
        return top if current is None else current.run
    running = sorted(p.index for p in infos
                     if p.run == current.run and p.index != partition and p.state == "live")
    if running:
        raise CatalogError(
            f"partition {partition} of topic {topic!r} closed in run {current.run}, which goes "
            f"on (partition(s) {running} still publish): a closed partition is final for its "
            f"run. Abort a publisher that a successor will replace instead of closing it "
            f"(Publisher.abort(): the successor continues the run), or restart the topic's "
            f"partitions once all of run {current.run} ended (a new run)")
    return top + 1 if current.run == top else top
