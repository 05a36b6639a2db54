"""Lag, metrics, health and ``top`` (epochstream.lag, .report, .metrics, .web, the CLI) against
a scenario whose truth is known, on SQLite and on PostgreSQL: a publisher at epoch 100 with an
epoch log, a durable subscription acked to 90 and paused, a consumer group with 3 leased and 2
redelivered epochs, a product-order topic with an antichain frontier. Every number is checked
in the report, the Prometheus text (parsed by prometheus_client's own parser), ``top --once
--json`` and the metrics server's JSON endpoints; a reader's status walks ok -> stall -> stop
as it stays paused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from urllib.error import HTTPError

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from epochstream import Catalog, EpochGroup, Publisher, Retention, Subscriber
from epochstream.cli import app
from epochstream.lag import LagWindow, Sample, evaluate, lag
from epochstream.metrics import CatalogCollector
from epochstream.order import TOTAL, product
from epochstream.report import read_report


@pytest.fixture
def scenario(catalog_location, tmp_path):
    """The known truth (module docstring); yields the catalog and the publishers."""
    cat = Catalog(catalog_location)
    logs = Retention(dir=tmp_path / "logs")
    pub = Publisher("t", catalog=cat, retention=logs)
    P2 = product(2)
    grid = Publisher("grid", catalog=cat, order=P2, retention=logs)
    try:
        for e in range(100):
            pub.send(e, [{"e": e}])
            pub.advance_to(e + 1)
        pub.flush(10)
        for t in ((1, 0), (0, 1), (1, 1), (3, 0)):
            grid.send(t, [{"t": list(t)}])
        grid.progress([((2, 0), 1), ((0, 2), 1), ((0, 0), -1)])  # lower [(2, 0), (0, 2)]
        grid.flush(10)
        with Subscriber("t", catalog=cat, durable="d", start="earliest", timeout=10) as sub:
            for epoch in sub.epochs(timeout=10):
                sub.ack(epoch)
                if epoch.time == 89:
                    break
        first = EpochGroup("t", "g", cat, ack_wait=0.3, worker="first")
        assert [x.epoch.time for x in first.fetch(2)] == [0, 1]
        time.sleep(0.4)  # their leases expire unacked
        second = EpochGroup("t", "g", cat, ack_wait=0.3, worker="second")
        got = second.fetch(3)
        assert [(x.epoch.time, x.deliveries) for x in got] == [(0, 2), (1, 2), (2, 1)]
        yield cat
    finally:
        pub.close(linger=0)
        grid.close(linger=0)


def test_the_report_has_the_known_values(scenario):
    r = read_report(scenario)
    t = r.topic("t")
    (p,) = t.partitions
    assert (p.state, p.upper, p.lower, p.retained) == ("live", (99,), (100,), 100)
    (d,) = t.durables
    assert (d.name, d.position, d.lag_epochs, d.state, d.status) == ("d", (90,), 10, "active",
                                                                       "ok")
    assert 0 < d.lag_seconds < 60
    (g,) = t.groups
    assert (g.leased, g.redelivered_total, g.pending, g.lag_epochs, g.acked_total) == \
        (3, 2, 97, 100, 0)
    grid = r.topic("grid")
    (q,) = grid.partitions
    assert set(q.upper) == {(1, 1), (3, 0)} and set(q.lower) == {(2, 0), (0, 2)}
    assert q.retained == 3  # (1, 0), (0, 1), (1, 1) are complete; (3, 0) is not


def test_prometheus_metrics_have_the_known_values(scenario):
    registry = CollectorRegistry()
    registry.register(CatalogCollector(scenario))
    text = generate_latest(registry).decode()
    values = {}
    for family in text_string_to_metric_families(text):  # prometheus_client's own parser
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "catalog"))
            values[(s.name, labels)] = s.value
    assert values[("epochstream_partition_upper_epoch",
                   (("partition", "0"), ("topic", "t")))] == 99
    assert values[("epochstream_partition_lower_epoch",
                   (("partition", "0"), ("topic", "t")))] == 100
    assert values[("epochstream_durable_lag_epochs", (("name", "d"), ("topic", "t")))] == 10
    assert values[("epochstream_durable_lag_seconds", (("name", "d"), ("topic", "t")))] > 0
    assert values[("epochstream_group_pending_epochs", (("group", "g"), ("topic", "t")))] == 97
    assert values[("epochstream_group_leased_epochs", (("group", "g"), ("topic", "t")))] == 3
    assert values[("epochstream_group_redelivered_total",
                   (("group", "g"), ("topic", "t")))] == 2
    # the product order's antichains, element by element (sorted), coordinate by coordinate
    grid = {(k[1][1][1], k[1][0][1]): v for k, v in values.items()
            if k[0] == "epochstream_partition_upper_time"}
    assert grid == {("0", "0"): 1, ("0", "1"): 1, ("1", "0"): 3, ("1", "1"): 0}, grid
    lows = {(dict(k[1])["element"], dict(k[1])["dim"]): v for k, v in values.items()
            if k[0] == "epochstream_partition_lower_time"}
    assert lows == {("0", "0"): 0, ("0", "1"): 2, ("1", "0"): 2, ("1", "1"): 0}, lows
    assert values[("epochstream_partition_frontier_elements",
                   (("frontier", "upper"), ("partition", "0"), ("topic", "grid")))] == 2
    assert ("epochstream_partition_upper_epoch", (("partition", "0"), ("topic", "grid"))) \
        not in values


def test_top_once_json_reports_the_same(scenario, catalog_location):
    r = CliRunner().invoke(app, ["top", "--once", "--json", "--catalog", str(catalog_location)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    (t,) = [t for t in data["topics"] if t["name"] == "t"]
    assert t["durables"][0]["lag_epochs"] == 10 and t["durables"][0]["position"] == [90]
    assert (t["groups"][0]["leased"], t["groups"][0]["redelivered_total"]) == (3, 2)
    r = CliRunner().invoke(app, ["top", "--once", "--catalog", str(catalog_location)])
    assert r.exit_code == 0 and "durable" in r.stdout and "group" in r.stdout, r.output


def test_status_walks_ok_stall_stop_as_the_reader_stays_paused(scenario):
    """Sampled by a long-running reporter: the paused durable subscription (lag 10, position
    fixed) is ok at first (too few samples), stall once the window holds half a window of
    samples that do not move, stop once its last ack is older than the window (chosen so that
    stall lasts about 0.5 s, whenever the scenario's last ack was)."""
    since_ack = time.time() - scenario.durable("t", "d").acked_at
    window = LagWindow(2 * since_ack + 1.0)
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = read_report(scenario, ["t"], window=window).topic("t").durables[0].status
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "stop":
            break
        time.sleep(0.1)
    assert seen == ["ok", "stall", "stop"], seen


def test_lag_and_status_definitions():
    """The pure definitions (epochstream.lag): the product-order example of its docstring,
    and each Burrow rule."""
    P2 = product(2)
    got = lag(P2, [(1, 0), (0, 2)], [], [(3, 0), (0, 3)],
              [((0, 0), 1.0), ((1, 1), 2.0), ((2, 0), 3.0), ((0, 2), 4.0), ((3, 1), 5.0)], 10.0)
    assert (got.epochs, got.seconds) == (3, 8.0)
    assert lag(TOTAL, None, [], [5], [(t, float(t)) for t in range(8)], 10.0).epochs == 5
    assert lag(TOTAL, (3,), [3], [5], [(t, float(t)) for t in range(8)], 10.0).epochs == 1

    def s(at, pos, lg, committed=None):
        return Sample(at, None if pos is None else (pos,), lg, at if committed is None
                      else committed)
    w = 10.0
    assert evaluate(TOTAL, [s(0, 5, 0)], 1, w) == "ok"
    assert evaluate(TOTAL, [s(0, 5, 3), s(1, 4, 3)], 2, w) == "rewind"
    assert evaluate(TOTAL, [s(0, 5, 3, -20)], 1, w) == "stop"
    assert evaluate(TOTAL, [s(0, 5, 3), s(3, 5, 3), s(6, 5, 4)], 6, w) == "stall"
    assert evaluate(TOTAL, [s(0, 5, 3), s(3, 6, 4), s(6, 7, 5)], 6, w) == "warn"
    assert evaluate(TOTAL, [s(0, 5, 3), s(3, 6, 2), s(6, 7, 5)], 6, w) == "ok"


def test_two_catalogs_in_one_registry_never_collide(tmp_path):
    """One collector of two catalogs: the same names, told apart by the catalog label, every
    series once; a second collector of the same names is refused by the registry."""
    a, b = Catalog(tmp_path / "a"), Catalog(tmp_path / "b")
    for cat in (a, b):
        cat.create_topic("t")
    registry = CollectorRegistry()
    registry.register(CatalogCollector(a, b))
    series = [(s.name, tuple(sorted(s.labels.items())))
              for f in text_string_to_metric_families(generate_latest(registry).decode())
              for s in f.samples]
    assert len(series) == len(set(series))
    catalogs = {dict(lab)["catalog"] for name, lab in series if name == "epochstream_catalog_up"}
    assert catalogs == {a.where, b.where}
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(CatalogCollector(a))


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except HTTPError as e:
        return e.code, e.read()


def test_metrics_serve_as_a_process(tmp_path):
    """``epochstream metrics serve`` in its own process: its line names the port, /metrics is
    Prometheus text, /varz and /topicz JSON, /healthz 200 while healthy and 503 once a
    partition aborted; SIGTERM stops it with status 0."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("t", catalog=cat, retention=Retention(dir=tmp_path / "logs"))
    for e in range(5):
        pub.send(e, [e])
        pub.advance_to(e + 1)
    pub.flush(10)
    env = dict(os.environ, EPOCHSTREAM_CATALOG=str(tmp_path / "cat"))
    proc = subprocess.Popen([sys.executable, "-m", "epochstream", "metrics", "serve", "--bind",
                             "tcp://127.0.0.1:*"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("metrics on http://127.0.0.1:"), (line, proc.stderr.read())
        base = line.split()[2].rsplit("/", 1)[0]
        status, body = _get(base + "/metrics")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert status == 200 and "epochstream_partition_upper_epoch" in names
        status, body = _get(base + "/varz")
        varz = json.loads(body)
        assert status == 200 and varz["catalogs"][0]["topics"][0]["name"] == "t"
        status, body = _get(base + "/topicz?topic=t")
        assert json.loads(body)["catalogs"][0]["topics"][0]["partitions"][0]["upper"] == [4]
        assert _get(base + "/topicz?topic=nope")[0] == 404
        assert _get(base + "/healthz") == (200, b'{"status":"ok"}')
        pub.abort("a test")
        status, body = _get(base + "/healthz")
        assert status == 503 and "partition 0 is aborted" in json.loads(body)["problems"][0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pub.close(linger=0)


def test_health_exit_statuses(tmp_path):
    cat = Catalog(tmp_path / "cat")
    runner = CliRunner()
    args = ["--catalog", str(tmp_path / "cat")]
    with Publisher("ok", catalog=cat) as pub:
        pub.send(0, [1])
        r = runner.invoke(app, ["health", "ok", *args])
        assert (r.exit_code, r.stdout.strip()) == (0, "topic ok: healthy")
    bad = Publisher("bad", catalog=cat)
    bad.abort("on purpose")
    r = runner.invoke(app, ["health", "bad", *args])
    assert r.exit_code == 1 and "topic 'bad' partition 0 is aborted" in r.stdout, r.output
    r = runner.invoke(app, ["health", "nope", *args])
    assert r.exit_code == 2 and "unknown topic 'nope'" in r.output, r.output


def _doc_examples() -> list[tuple[str, str | None]]:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", text, re.S)]


@pytest.mark.parametrize("index", range(len(_doc_examples())))
def test_operations_doc_example_runs_as_written(tmp_path, index):
    """Every Python block of docs/operations.md, in a fresh process: it prints exactly the
    text block after it."""
    code, expected = _doc_examples()[index]
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ)
    env.pop("EPOCHSTREAM_CATALOG", None)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, (code, proc.stderr)
    assert expected is None or proc.stdout == expected, (code, proc.stdout)


def test_bench_metrics_builds_and_scrapes_a_small_catalog(tmp_path):
    """benchmarks/bench_metrics.py at a tiny size (its catalog builder and one scrape): the
    readers' lag it sets up is what the scrape reports."""
    from benchmarks.bench_metrics import build

    cat = build(str(tmp_path / "cat"), topics=2, partitions=2, readers=3, epochs=4)
    registry = CollectorRegistry()
    registry.register(CatalogCollector(cat))
    lags = {dict(s.labels)["name"]: s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode())
            for s in f.samples if s.name == "epochstream_durable_lag_epochs"}
    assert lags == {"d0": 2, "d1": 2, "d2": 2}


def test_publisher_collector_reports_the_partitions_hot_counters():
    """The in-process collector of publishers: data messages, subscribers joined, what waits in
    a stalled flow-controlled subscriber's backlog (it reads nothing: credit 2), and closed —
    parsed back with prometheus_client's own parser."""
    from epochstream.metrics import PublisherCollector

    def scrape(registry):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(generate_latest(registry).decode())
                for s in f.samples}

    pub = Publisher("hot", max_queue_messages=10, credit_timeout=30.0)
    registry = CollectorRegistry()
    registry.register(PublisherCollector(pub))
    lab = (("partition", "0"), ("topic", "hot"))
    sub = Subscriber("hot", endpoints=[pub.endpoint], credit=2)
    try:
        assert sub.wait_ready(5)
        blocked = threading.Thread(target=lambda: [pub.send(t, [[t]]) for t in range(30)],
                                   daemon=True)
        blocked.start()  # the backlog fills, then send blocks (back-pressure)
        deadline = time.monotonic() + 10
        while scrape(registry).get(("epochstream_publisher_stalled_subscribers", lab)) != 1:
            assert time.monotonic() < deadline, scrape(registry)
            time.sleep(0.05)
        got = scrape(registry)
        assert got[("epochstream_publisher_subscribers", lab)] == 1
        assert got[("epochstream_publisher_subscribers_joined_total", lab)] == 1
        assert got[("epochstream_publisher_queued_messages", lab)] >= 10
        assert got[("epochstream_publisher_queued_bytes", lab)] > 0
        assert got[("epochstream_publisher_refusals_total",
                    (("partition", "0"), ("reason", "quota"), ("topic", "hot")))] == 0
        assert got[("epochstream_publisher_closed", lab)] == 0
    finally:
        sub.close()
        pub.close()
    assert scrape(registry)[("epochstream_publisher_closed", lab)] == 1


def test_subscriber_collector_reports_a_live_subscribers_own_lag():
    """A live subscriber (not in the catalog): delivered messages and its consumer's lag — the
    epochs complete at it and not handed out — 0 once it has taken everything, growing while
    it does not read."""
    from epochstream.metrics import SubscriberCollector

    def scrape(registry):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(generate_latest(registry).decode())
                for s in f.samples}

    with Publisher("live") as pub, Subscriber("live", endpoints=[pub.endpoint]) as sub:
        registry = CollectorRegistry()
        registry.register(SubscriberCollector(sub))
        assert sub.wait_ready(5)
        lab = (("durable", ""), ("subscriber", sub.id[:8]), ("topic", "live"))
        for t in range(5):
            pub.send(t, [[t]])
            pub.advance_to(t + 1)
        it = sub.epochs(timeout=5)
        assert [next(it).time for _ in range(5)] == [0, 1, 2, 3, 4]
        got = scrape(registry)
        assert got[("epochstream_subscriber_lag_epochs", lab)] == 0
        assert got[("epochstream_subscriber_handed_out_epoch", lab)] == 4
        assert got[("epochstream_subscriber_delivered_messages_total", lab)] == 5
        for t in range(5, 12):  # complete, received, not read by the consumer
            pub.send(t, [[t]])
            pub.advance_to(t + 1)
        pub.flush()
        deadline = time.monotonic() + 5
        while sub.lower != (12,):
            assert time.monotonic() < deadline
            sub._join.pump(0.05)  # received, kept for the iterators: not handed out
        got = scrape(registry)
        assert got[("epochstream_subscriber_lower_epoch", lab)] == 12
        assert got[("epochstream_subscriber_lag_epochs", lab)] == 7
