"""A small program written against epochstream's public API the way a user would, with full type
annotations. It is not a test module (no ``test_`` prefix): ``tests/test_cli.py`` runs
``mypy --strict`` on it, and runs it, so that it stays correct both for the type checker and at
run time.

What it exercises: ``Catalog`` (look up, list, drop), ``Publisher`` (send, advance_to, progress,
flush, close, as a context manager), ``Subscriber`` (epochs, wait_ready; ``Gap`` narrowed away),
``Epoch`` fields, the exception hierarchy, product orders, and ``epochstream.__version__``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import epochstream
from epochstream.catalog import Catalog, PartitionInfo, TopicInfo
from epochstream.errors import EpochstreamError, TopicNotFound
from epochstream.order import product
from epochstream.events import Epoch
from epochstream.transport import Gap, Publisher, Subscriber

# The names are imported from their modules: ``from epochstream import Publisher`` works at run
# time, but the package's lazy ``__getattr__`` makes every such name ``Any`` for a type checker
# (tests/test_cli.py::test_top_level_names_are_typed shows it).


def publish(pub: Publisher, days: int) -> None:
    """Epoch ``d`` holds ``d + 1`` records; then the stream ends."""
    for day in range(days):
        records: list[dict[str, object]] = [{"day": day, "i": i} for i in range(day + 1)]
        pub.send(day, records)
        pub.advance_to(day + 1)
    pub.flush()
    pub.close()


def complete_epochs(sub: Subscriber) -> Iterator[Epoch]:
    for item in sub.epochs(timeout=10.0):
        if isinstance(item, Gap):  # only with Subscriber(..., recover=True)
            raise AssertionError(f"unexpected {item!r}")
        yield item


def sizes(catalog: Catalog, topic: str, days: int) -> dict[int, int]:
    """Publish ``days`` epochs to a subscriber that joined first; {epoch time: record count}."""
    seen: dict[int, int] = {}
    with Publisher(topic, partition=0, catalog=catalog) as pub:
        with Subscriber(topic, catalog=catalog, wait=10.0, timeout=10.0) as sub:
            ready: bool = sub.wait_ready(10.0)
            assert ready
            publish(pub, days)
            for epoch in complete_epochs(sub):
                t: int = epoch.time
                n: int = len(epoch)
                nbytes: int = epoch.nbytes
                assert nbytes >= 0
                first_seen: float | None = epoch.first_seen
                assert first_seen is None or first_seen > 0
                seen[t] = n
    return seen


def product_times(catalog: Catalog) -> list[tuple[int, int]]:
    """A product(2) topic: (day, iteration) times; progress moves capabilities explicitly."""
    got: list[tuple[int, int]] = []
    with Publisher("grid", catalog=catalog, order=product(2)) as pub:
        with Subscriber("grid", catalog=catalog) as sub:
            sub.wait_ready(10.0)
            pub.send((0, 0), ["a"])
            pub.send((0, 1), ["b", "c"])
            pub.progress([((0, 2), +1), ((0, 0), -1)])
            pub.advance_to((1, 2))
            pub.close()
            for epoch in complete_epochs(sub):
                got.append(epoch.time)
    return got


def catalog_tour(catalog: Catalog, topic: str) -> list[str]:
    info: TopicInfo = catalog.lookup(topic)
    parts: tuple[PartitionInfo, ...] = info.partition_info
    states = [p.state for p in parts]
    names = [t.name for t in catalog.topics()]
    catalog.drop_topic(topic)
    try:
        catalog.lookup(topic)
    except TopicNotFound as e:
        existing: tuple[str, ...] = e.existing
        assert topic not in existing
    except EpochstreamError:
        raise
    return states + names


def main() -> int:
    version: str = epochstream.__version__
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Catalog(Path(tmp) / "catalog.sqlite")
        got = sizes(catalog, "typed", 3)
        assert got == {0: 1, 1: 2, 2: 3}, got
        assert product_times(catalog) == [(0, 0), (0, 1)]
        tour = catalog_tour(catalog, "typed")
        assert tour[0] == "closed" and "typed" in tour, tour
    print(f"epochstream {version}: typed usage ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
