"""Finding a topic that ``tail`` can follow: it exists, every partition is registered, none is
dead or aborted, and not all are closed; with ``--wait``, waiting until that holds."""

from __future__ import annotations

import time
from typing import Optional

import typer

from ..catalog import Catalog, PartitionInfo, TopicInfo
from ..errors import EpochstreamError, TopicNotFound
from .errors import unknown_topic
from .formats import fmt_when
from .output import EXIT_CLOSED, EXIT_ERROR, err, escape, fail

__all__ = ["POLL_S", "publishers", "who", "cannot_tail", "find_topic"]

#: Seconds between two looks at the catalog while waiting.
POLL_S = 0.1


def publishers(parts: list[PartitionInfo], n_partitions: int) -> str:
    """``publisher pid 12`` (``of partitions 0, 1`` when the topic has several)."""
    pids = sorted({p.pid for p in parts})
    who = (f"publisher pid {pids[0]}" if len(pids) == 1
           else "publishers pid " + ", ".join(str(p) for p in pids))
    if n_partitions > 1:
        idx = [p.index for p in parts]
        who += f" of partition{'s' if len(idx) > 1 else ''} " + ", ".join(str(i) for i in idx)
    return who


def who(parts: list[PartitionInfo], verb: str, n_partitions: int) -> str:
    """``publisher pid 12 ended at <time>`` for the given partitions (the latest time)."""
    return (f"{publishers(parts, n_partitions)} {verb} "
            f"{fmt_when(max(p.updated_at for p in parts))}")


def cannot_tail(info: TopicInfo, replays: bool = False) -> Optional[tuple[int, str]]:
    """Why nothing can be tailed from ``info`` now, as (exit status, message); None if it can.
    ``replays``: the tail reads history (``--from``, ``--durable``), so a closed topic can be
    tailed (its retained epochs, then the end of the stream)."""
    name, n = info.name, info.partitions
    registered = {p.index for p in info.partition_info}
    missing = [i for i in range(n) if i not in registered]
    dead = [p for p in info.partition_info if p.state in ("dead", "expired")]
    aborted = [p for p in info.partition_info if p.state == "aborted"]
    closed = [p for p in info.partition_info if p.state == "closed"]
    if dead:
        return EXIT_ERROR, (f"topic {name!r} is dead "
                            f"({who(dead, 'exited without closing it; last seen at', n)})")
    if aborted:
        return EXIT_ERROR, (f"topic {name!r} is aborted ({who(aborted, 'aborted at', n)}; "
                            f"its open epochs never complete)")
    if missing:
        return EXIT_ERROR, (f"topic {name!r}: partition(s) {', '.join(map(str, missing))} of {n} "
                            f"not registered by any publisher yet")
    if len(closed) == n and not replays:
        return EXIT_CLOSED, f"topic {name!r} is closed ({who(closed, 'ended at', n)})"
    return None


def find_topic(cat: Catalog, topic: str, wait: float, replays: bool = False) -> TopicInfo:
    """Look ``topic`` up until it can be tailed (see :func:`cannot_tail`; ``replays``: the tail
    reads history, so a closed topic is followed as it is). A topic first seen
    ended (closed, dead or aborted) is waited on until new publishers replaced every partition
    that had ended. Gives up at once without ``wait``, else after ``wait`` seconds (exit 2 or 1,
    see the messages)."""
    deadline = time.monotonic() + wait
    stale: Optional[dict[int, str]] = None   # partition -> incarnation that had ended
    announced = False
    while True:
        info: Optional[TopicInfo] = None
        problem: Optional[tuple[int, str]] = None
        not_found: Optional[TopicNotFound] = None
        try:
            info = cat.lookup(topic)
        except TopicNotFound as e:
            not_found = e
        if info is not None:
            problem = cannot_tail(info, replays)
            if problem is not None and stale is None:
                stale = {p.index: p.incarnation for p in info.partition_info if p.state != "live"}
            elif problem is None and stale:
                old = [p for p in info.partition_info if stale.get(p.index) == p.incarnation]
                if old:  # e.g. one partition started again, another is still the old one
                    problem = (EXIT_CLOSED, f"topic {topic!r} is only partly restarted "
                                            f"({who(old, 'ended at', info.partitions)})")
            if problem is None:
                return info
        left = deadline - time.monotonic()
        if left <= 0:
            raise _give_up(cat, wait, not_found, problem, topic)
        if not announced:
            announced = True
            err().print(escape(f"waiting up to {wait:g} s for topic {topic!r} and its publishers"
                               if problem is None else
                               f"{problem[1]}; waiting up to {wait:g} s for a new publisher")
                        + " ...", soft_wrap=True)
        time.sleep(min(POLL_S, max(left, 0.0)))


def _give_up(cat: Catalog, wait: float, not_found: Optional[TopicNotFound],
             problem: Optional[tuple[int, str]], topic: str = "") -> typer.Exit:
    """The Exit to raise when :func:`find_topic`'s time is up: the topic is unknown, or still
    cannot be tailed (why, and how ``--wait`` helps)."""
    if not_found is not None:
        return unknown_topic(cat, not_found, wait)
    assert problem is not None
    code, message = problem
    history = _history_hint(cat, topic, code)
    if wait > 0:
        return fail(f"{message}; no new publisher within {wait:g} s", code, hint=history or None)
    return fail(message, code, hint="to wait for its publishers to start again, pass "
                                    "--wait SECONDS" + (f"; {history}" if history else ""))


def _history_hint(cat: Catalog, topic: str, code: int) -> str:
    """How to read the retained epochs of a topic that keeps history ('' if it keeps none)."""
    try:
        if not topic or not cat.history_states(topic):
            return ""
    except EpochstreamError:
        return ""
    if code == EXIT_CLOSED:
        return (f"to read its retained epochs, pass --from earliest (or: epochstream history "
                f"{topic})")
    return f"to read its retained epochs: epochstream history {topic}"
