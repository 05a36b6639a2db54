"""The network catalog (epochstream catalog serve, Catalog("tcp://...")) with real processes and
real sockets on 127.0.0.1; no mocks. Peers: tests/catalog_server_peer.py."""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq
from typer.testing import CliRunner

import test_catalog as tc
from epochstream import (Catalog, CatalogUnavailable, EpochGroup, History, Publisher, Retention,
                         Subscriber)
from epochstream.catalog.client import CLAIM_ATTEMPTS, RemoteCatalog
from epochstream.catalog.history import EpochRecord
from epochstream.catalog.rpc import OPS, decode
from epochstream.catalog.api import OPERATIONS
from epochstream.catalog.server import CatalogServer
from epochstream.cli import app
from epochstream.errors import (CatalogError, GroupStopped, LeaseExpired, PartitionHeld,
                                PublisherLost, SubscriptionHeld, TopicNotFound)
from epochstream.leases import Plan

PEER = Path(__file__).with_name("catalog_server_peer.py")
CLI_ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """Every test's local directory for remote catalogs' logs; no catalog from the environment."""
    monkeypatch.setenv("EPOCHSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    return tmp_path / "home"


@pytest.fixture
def server(tmp_path):
    """A catalog server in this process (its own thread and socket)."""
    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        yield srv


@pytest.fixture(params=["embedded", "remote", "remote-postgresql"])
def cat(request, tmp_path):
    """The same file, opened directly or through a catalog server (over SQLite, or over
    PostgreSQL)."""
    if request.param == "embedded":
        yield Catalog(tmp_path / "cat.sqlite")
        return
    db = (tmp_path / "cat.sqlite" if request.param == "remote"
          else request.getfixturevalue("pg_url"))
    with CatalogServer(db, "tcp://127.0.0.1:*") as srv:
        remote = Catalog(srv.endpoint)
        assert isinstance(remote, RemoteCatalog)
        yield remote
        remote.close()


def _env(home: Path) -> dict:
    env = dict(os.environ)
    env.pop("EPOCHSTREAM_CATALOG", None)
    env["EPOCHSTREAM_HOME"] = str(home)
    return env


class Lines:
    """The lines a process writes to a pipe, readable with a timeout."""

    def __init__(self, stream):
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in iter(stream.readline, ""):
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def get(self, timeout: float = 10.0) -> str | None:
        return self._q.get(timeout=timeout)


def _serve(db: Path, home: Path, bind: str = "tcp://127.0.0.1:*"):
    """``epochstream catalog serve`` as a process: ``(process, url, stdout lines, stderr)``."""
    proc = subprocess.Popen([sys.executable, "-m", "epochstream", "catalog", "serve", "--db",
                             str(db), "--bind", bind], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(home))
    lines = Lines(proc.stdout)
    first = lines.get(20)
    m = re.match(r"catalog service on (tcp://\S+) \(database (.+)\)$", first or "")
    if m is None:
        proc.kill()
        raise AssertionError(f"unexpected first line {first!r}: {proc.stderr.read()}")
    return proc, m.group(1), lines


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One ``epochstream catalog serve`` process for the tests that need processes: its URL."""
    root = tmp_path_factory.mktemp("served")
    proc, url, _ = _serve(root / "db", root / "home")
    yield url, root / "home"
    _stop(proc)


def _peer(*args: str, home: Path, stdin=None) -> tuple[subprocess.Popen, Lines]:
    proc = subprocess.Popen([sys.executable, str(PEER), *args], stdout=subprocess.PIPE,
                            stdin=stdin, text=True, env=_env(home))
    return proc, Lines(proc.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the same API through the service ----------------------------------------------------------

def _params(test, i: int = 0) -> list:
    """The parameter values of an existing test's ``parametrize`` mark."""
    return list(test.pytestmark[i].args[1])


# existing tests of tests/test_catalog.py that use only the catalog's public API, run against the
# ``cat`` fixture: embedded, and through a server
SHARED = [
    (tc.test_create_topic_returns_info_and_is_idempotent, ()),
    (tc.test_create_topic_defaults, ()),
    (tc.test_conflicting_definition_names_both, ()),
    *((tc.test_create_topic_rejects_bad_arguments, p)
      for p in _params(tc.test_create_topic_rejects_bad_arguments)),
    (tc.test_topics_sorted_and_drop, ()),
    (tc.test_lookup_unknown_lists_existing, ()),
    (tc.test_infos_are_frozen, ()),
    (tc.test_register_and_lookup, ()),
    (tc.test_register_unknown_topic_and_bad_index, ()),
    (tc.test_live_holder_in_this_process_refuses_other_incarnation, ()),
    (tc.test_closed_partition_can_be_taken_over, ()),
    (tc.test_close_partition_stores_upper_as_tuples, ()),
    (tc.test_close_with_wrong_incarnation_is_noop, ()),
    (tc.test_heartbeat_updates_updated_at, ()),
    (tc.test_endpoints_raises_when_incomplete, ()),
    (tc.test_lookup_wait_returns_partial_after_timeout, ()),
    (tc.test_lookup_without_wait_returns_immediately, ()),
    (tc.test_lookup_waits_for_topic_and_partitions_from_thread, ()),
    (tc.test_concurrent_threads_share_one_catalog, ()),
    (tc.test_register_partition_stores_given_upper, ()),
    *((tc.test_bad_upper_is_a_catalog_error, (p,))
      for p in _params(tc.test_bad_upper_is_a_catalog_error)),
    (tc.test_record_upper_moves_the_stored_upper_while_live, ()),
    (tc.test_record_upper_after_close_is_a_noop, ()),
    (tc.test_topics_command_shows_aborted, ()),
]


@pytest.mark.parametrize("case, args", SHARED,
                         ids=[f"{f.__name__[5:]}{list(a) if a else ''}" for f, a in SHARED])
def test_existing_catalog_tests(cat, case, args):
    case(cat, *args)


def _norm(v):
    """A value with its exact types kept (tuple vs list, record types) and times of day
    (floats) and leases left out: embedded and remote runs compare equal."""
    if isinstance(v, float):
        return "<float>"
    if isinstance(v, tuple):
        return ("tuple", [_norm(x) for x in v])
    if isinstance(v, list):
        return ("list", [_norm(x) for x in v])
    if isinstance(v, dict):
        return ("dict", sorted((repr(k), _norm(x)) for k, x in v.items()))
    if dataclasses.is_dataclass(v):
        return (type(v).__name__, {f.name: _norm(getattr(v, f.name))
                                   for f in dataclasses.fields(v) if f.name != "lease"})
    return v


def _scenario(cat: Catalog, root: Path) -> list:
    """History, durable subscriptions, consumer groups and errors: every result or exception."""
    out: list = []

    def rec(f, *a, **k):
        try:
            out.append((f.__name__, "ok", _norm(f(*a, **k))))
        except Exception as e:  # recorded: the same type, message and attributes are expected
            out.append((f.__name__, "error", type(e).__name__, str(e),
                        _norm({k: v for k, v in vars(e).items() if not k.startswith("_")})))

    cat.create_topic("h", order="product(2)", partitions=2)
    rec(cat.history_state, "h", 0)
    rec(cat.history_begin, "h", 0, str(root / "logs"), [(0, 0)], [])
    rec(cat.history_begin, "h", 0, str(root / "elsewhere"), [(0, 0)], [])
    epochs = [EpochRecord(0, (1, 0), 0, ((0, 10), (10, 5)), 15, 2, 123, 1.5),
              EpochRecord(0, (2, 1), 0, ((15, 4),), 4, 1, 7, 2.5)]
    rec(cat.history_commit, "h", 0, epochs=epochs, lower=[(3, 0)], upper=[(2, 1)], segment=0,
        committed=19, roll_to=1)
    rec(cat.history_epochs, "h", 0)
    rec(cat.history_epochs, "h", 0, min_t0=2)
    rec(cat.history_states, "h")
    rec(cat.history_trim, "h", 0, 7)
    if hasattr(Catalog, "history_epoch"):
        rec(cat.history_epoch, "h", 0, (2, 1))
    rec(cat.durable_claim, "h", "d", "A")
    rec(cat.durable_ack, "h", "d", "A", [(2, 0)], [(3, 3)])
    rec(cat.history_trim, "h", 0, 1)  # expires "d"
    rec(cat.durable_claim, "h", "d", "A")
    rec(cat.durable_reset, "h", "d", None)
    rec(cat.durable_claim, "h", "d", "A")
    rec(cat.durable_claim, "h", "d", "B")  # A is live: held
    rec(cat.durable_ack, "h", "d", "B", [(9, 9)])
    rec(cat.durable, "h", "d")
    rec(cat.durables)
    rec(cat.durable_reset, "h", "zz", None)
    rec(cat.durable_claim, "nope", "d", "A")
    rec(cat.durable_claim, "h", "", "A")
    rec(cat.durable_release, "h", "d", "A")
    rec(cat.durable_drop, "h", "d")
    rec(cat.durable_drop, "h", "d")
    cat.create_topic("g")
    rec(cat.group_open, "g", "w", mode="shared", ack_wait=30.0, max_deliver=1, dead_letter=None)
    rec(cat.group_open, "g", "w", mode="ordered", ack_wait=30.0, max_deliver=1, dead_letter=None)
    seen: list = []

    def decide(states, now, stored):
        seen.append((_norm(states), stored))
        return Plan(((0, -1), (1, -1)), ()), (0,)

    rec(cat.group_claim, "g", "w", "worker-1", decide)
    rec(cat.group_settle, "g", "w", (0, -1), 1, outcome="ack")
    rec(cat.group_settle, "g", "w", (0, -1), 1, outcome="ack")  # settled already
    rec(cat.group_settle, "g", "w", (1, -1), 2, outcome="nak")
    rec(cat.group_claim, "g", "w", "worker-2",
        lambda states, now, stored: (seen.append((_norm(states), stored)),
                                     (Plan((), ((1, -1),)), (1,)))[1])
    rec(cat.group_info, "g", "w")
    rec(cat.groups)
    rec(lambda: sorted(cat.group_epochs("g", "w"), key=lambda u: (u.time, u.bucket)))
    rec(cat.group_stop, "g", "w", "stopped by the test")
    rec(cat.group_claim, "g", "w", "worker-1", decide)
    rec(cat.group_reset, "g", "w")
    rec(cat.group_drop, "g", "w")
    rec(cat.group_drop, "g", "w")
    rec(cat.group_info, "g", "w")
    rec(cat.drop_topic, "nope")
    out.append(("decide saw", _norm(seen)))
    return out


def test_history_durables_and_groups_give_the_same_results(tmp_path, postgres):
    """Every operation gives the same result or error on SQLite, on PostgreSQL, and through
    the service over each."""
    embedded = _scenario(Catalog(tmp_path / "a.sqlite"), tmp_path)
    with CatalogServer(tmp_path / "b.sqlite", "tcp://127.0.0.1:*") as srv:
        remote = _scenario(Catalog(srv.endpoint), tmp_path)
    assert remote == embedded
    on_postgres = _scenario(Catalog(postgres.create_database("scenario_a")), tmp_path)
    assert on_postgres == embedded
    with CatalogServer(postgres.create_database("scenario_b"), "tcp://127.0.0.1:*") as srv:
        remote = _scenario(Catalog(srv.endpoint), tmp_path)
    assert remote == embedded
    kinds = {(r[0], r[1]) for r in embedded[:-1]}  # the scenario exercises errors as well
    for expected in [("history_begin", "error"), ("durable_claim", "error"),
                     ("group_settle", "error"), ("group_claim", "error"), ("drop_topic", "error")]:
        assert expected in kinds
    errors = {r[2] for r in embedded[:-1] if r[1] == "error"}
    assert {"CatalogError", "SubscriptionExpired", "SubscriptionHeld", "TopicNotFound",
            "LeaseExpired", "GroupStopped"} <= errors


def test_every_public_catalog_method_is_forwarded(server):
    """Every method of the one interface (Catalog's abstract methods) is an operation of the
    service (catalog.rpc.OPS) and implemented by the client (a class lacking one is refused
    when it is made); none runs on a SQL store here."""
    local_only = {"group_claim"}  # its callable stays here: group_claim_read + _apply
    abstract = set(OPERATIONS)
    assert len(abstract) > 30
    assert abstract - OPS - local_only == set(), "add these to epochstream.catalog.rpc.OPS"
    remote = Catalog(server.endpoint)
    assert isinstance(remote, RemoteCatalog) and isinstance(remote, Catalog)
    for name in abstract:
        assert getattr(RemoteCatalog, name) is not getattr(Catalog, name), name
    assert not hasattr(remote, "_store") and not hasattr(remote, "_connect")
    remote.close()


# ---- publishers and subscribers that share only the URL ------------------------------------------


def test_publisher_and_subscriber_share_only_the_url(served):
    url, home = served
    proc, lines = _peer("publish", url, "whole", "2", "60", "0.02", home=home)
    try:
        assert lines.get(20) == "registered"
        got = []
        with Subscriber("whole", catalog=url, wait=10) as sub:
            for epoch in sub.epochs():
                got.append(epoch)
        assert lines.get(20) == "done"
        assert proc.wait(10) == 0
    finally:
        _stop(proc)
    assert len(got) >= 20  # joined while the stream ran, then every later epoch
    times = [e.time for e in got]
    assert times == list(range(times[0], 60))
    for e in got:  # whole: both partitions' records, and nothing else
        assert sorted(map(tuple, e.records)) == [(e.time, p, k) for p in (0, 1) for k in range(3)]


def test_retention_and_history_through_a_remote_catalog(served):
    url, home = served
    proc, lines = _peer("publish", url, "kept", "1", "5", "0", "retention", home=home)
    try:
        assert lines.get(20) == "registered"
        assert lines.get(20) == "done"
        assert proc.wait(10) == 0
    finally:
        _stop(proc)
    epochs = History("kept", catalog=url).epochs()
    assert [(e.time, [tuple(r) for r in e.records]) for e in epochs] == \
        [(t, [(t, 0, k) for k in range(3)]) for t in range(5)]
    port = url.rsplit(":", 1)[1]
    logs = home / f"127.0.0.1_{port}" / "history" / "kept" / "0"  # Retention(dir=None), remote
    assert logs.is_dir() and any(logs.iterdir())
    state = Catalog(url).history_state("kept", 0)
    assert Path(state.dir) == logs
    with Subscriber("kept", catalog=url, start="earliest", wait=5) as sub:
        assert [e.time for e in sub.epochs()] == list(range(5))


def test_advertised_address_is_what_the_catalog_holds(server, tmp_path):
    url = server.endpoint
    cat = Catalog(url)
    with Publisher("adv", catalog=cat, endpoint="tcp://0.0.0.0:*", advertise="127.0.0.1",
                   retention=Retention(dir=tmp_path / "logs")) as pub:
        port = pub.endpoint.rsplit(":", 1)[1]
        assert pub.endpoint == f"tcp://0.0.0.0:{port}"
        assert pub.advertised == f"tcp://127.0.0.1:{port}"
        assert cat.lookup("adv").endpoints == (pub.advertised,)
        for t in range(3):
            pub.send(t, [t])
            pub.advance_to(t + 1)
        pub.flush()
        with Subscriber("adv", catalog=url, start="earliest") as sub:  # through the advertised
            it = sub.epochs()
            assert [next(it).records for _ in range(3)] == [[0], [1], [2]]
    with Publisher("adv2", catalog=cat, endpoint="tcp://0.0.0.0:*") as pub:  # the default
        assert pub.advertised == f"tcp://{socket.gethostname()}:{pub.endpoint.rsplit(':', 1)[1]}"
        assert cat.lookup("adv2").endpoints == (pub.advertised,)
    with Publisher("adv3", catalog=cat, advertise="tcp://pub-3.example:7000") as pub:
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
        assert cat.lookup("adv3").endpoints == ("tcp://pub-3.example:7000",)
    with Publisher("adv4", catalog=cat) as pub:  # a specific address is advertised as bound
        assert pub.advertised == pub.endpoint
        assert cat.lookup("adv4").endpoints == (pub.endpoint,)


def test_consumer_group_workers_through_the_service(server):
    url = server.endpoint
    with Publisher("jobs", catalog=Catalog(url), retention=Retention()) as pub:
        for t in range(30):
            pub.send(t, [["job", t]])
            pub.advance_to(t + 1)
    done: list = []
    failures: list = []

    def work():
        try:
            group = EpochGroup("jobs", "w", catalog=url)  # a client of its own
            for lease in group.leases(expires=1):
                done.append(lease.epoch.time)
                lease.ack()
        except Exception as e:  # asserted below
            failures.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert failures == []
    assert sorted(done) == list(range(30))  # every epoch once, across competing claims
    assert EpochGroup("jobs", "w", catalog=url).info().position == (30,)
    assert CLAIM_ATTEMPTS >= 10


# ---- leases ------------------------------------------------------------------------------------


def test_killed_publisher_lease_expires_and_a_new_one_takes_over(served):
    url, home = served
    lease = 1.5
    proc, lines = _peer("hold", f"{url}?lease={lease}", "leased", "dur", home=home)
    try:
        line = lines.get(20)
        assert line and line.startswith("held "), line
        inc = line.split()[1]
        cat = Catalog(url)
        time.sleep(2 * lease + 0.3)  # alive through renewals, well past one lease
        p = cat.lookup("leased").partition_info[0]
        assert (p.state, p.incarnation, p.lease, p.pid) == ("live", inc, lease, proc.pid)
        assert p.alive
        assert cat.durable("leased", "dur").holder_alive
        with pytest.raises(PartitionHeld):
            cat.register_partition("leased", 0, "tcp://127.0.0.1:3")
        # stopped, not killed: its pid stays alive (a killed one on this host is dead at once,
        # liveness.holder_alive's fast path), so only the lease running out frees the partition
        proc.send_signal(signal.SIGSTOP)
        killed = time.monotonic()
        with pytest.raises(PartitionHeld):  # the lease still runs for a while
            cat.register_partition("leased", 0, "tcp://127.0.0.1:3")
        while cat.lookup("leased").partition_info[0].state != "expired":
            assert time.monotonic() - killed < lease + 2.0, "the lease did not expire"
            time.sleep(0.05)
        dead_after = time.monotonic() - killed
        assert dead_after <= lease + 0.5  # renewed every lease/3 s until the kill
        result = CliRunner(env=CLI_ENV).invoke(app, ["topics", "--catalog", url])
        assert result.exit_code == 0, result.output
        assert re.search(r"leased .* expired", result.output), result.output
        with pytest.raises(PublisherLost, match="let its lease expire"):  # a subscriber sees
            Subscriber("leased", catalog=url, wait=0)
        assert not cat.durable("leased", "dur").holder_alive
        info = cat.durable_claim("leased", "dur", "new-holder")  # no takeover needed
        assert info.holder == "new-holder"
        with Publisher("leased", catalog=cat) as pub:  # takes the dead partition over
            p = cat.lookup("leased").partition_info[0]
            assert (p.state, p.incarnation, p.pid) == ("live", pub.incarnation, os.getpid())
        cat.durable_release("leased", "dur", "new-holder")
    finally:
        _stop(proc)


def test_renewals_stop_when_the_partition_is_closed(server):
    cat = Catalog(server.endpoint, lease=0.6)
    cat.create_topic("r", partitions=2)
    a = cat.register_partition("r", 0, "tcp://a")
    cat.register_partition("r", 1, "tcp://b")
    assert sorted(cat.held) == [("partition", "r", 0), ("partition", "r", 1)]
    cat.close_partition("r", 0, a, upper=[1])
    assert cat.held == [("partition", "r", 1)]
    time.sleep(1.0)
    assert [p.state for p in cat.lookup("r").partition_info] == ["closed", "live"]
    cat.close()  # no more renewals: partition 1 expires once its lease passes
    time.sleep(0.9)
    assert [p.state for p in Catalog(server.endpoint).lookup("r").partition_info] == \
        ["closed", "expired"]


# ---- bad input ---------------------------------------------------------------------------------


def test_unreachable_catalog_is_an_error_within_the_timeout(tmp_path, monkeypatch):
    url = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable) as ei:
        Catalog(url, timeout=0.5)
    assert 0.45 <= time.monotonic() - t0 < 2.0
    assert isinstance(ei.value, CatalogError) and ei.value.url == url and ei.value.timeout == 0.5
    assert "did not answer hello within 0.5 s" in str(ei.value)
    monkeypatch.setenv("EPOCHSTREAM_CATALOG", f"{url}?timeout=0.3")  # the URL carries it
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable):
        Subscriber("t")
    assert time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    result = CliRunner(env=CLI_ENV).invoke(app, ["topics"])
    assert result.exit_code == 1 and "did not answer" in result.output, result.output
    assert time.monotonic() - t0 < 2.0
    monkeypatch.delenv("EPOCHSTREAM_CATALOG")
    # a peer that takes requests and never answers
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        t0 = time.monotonic()
        with pytest.raises(CatalogUnavailable):
            Catalog(f"tcp://127.0.0.1:{port}", timeout=0.4)
        assert time.monotonic() - t0 < 2.0
    finally:
        silent.close(0)
    # a server that goes away and comes back on the same port
    srv = CatalogServer(tmp_path / "c", f"tcp://127.0.0.1:{port}").start()
    cat = Catalog(srv.endpoint, timeout=0.5)
    cat.create_topic("t")
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable):
        cat.lookup("t")
    assert time.monotonic() - t0 < 2.0
    with CatalogServer(tmp_path / "c", f"tcp://127.0.0.1:{port}"):
        assert cat.lookup("t").name == "t"  # a fresh socket, no stale answer


def _ask(sock, *frames: bytes) -> tuple[list, dict]:
    sock.send_multipart(list(frames))
    assert sock.poll(5000), "no reply"
    reply = sock.recv_multipart()
    return reply, decode(reply[-1], strict=False)


def test_garbage_requests_get_error_replies(server):
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.endpoint)
    good = Catalog(server.endpoint)
    good.create_topic("t")
    pk = lambda v: msgpack.packb(v, use_bin_type=True)  # noqa: E731
    mark = msgpack.ExtType(1, b"")  # heads an array that is a tuple
    record = lambda *v: [msgpack.ExtType(2, b""), *v]  # noqa: E731
    cases = [
        (b"\xc1", "msgpack"),
        (b"not msgpack", "msgpack"),
        (b"", "msgpack"),
        (pk([1, 2]), "must be a map"),
        (pk({"args": []}), "unknown catalog operation"),
        (pk({"op": "_connect"}), "unknown catalog operation '_connect'"),
        (pk({"op": "__class__"}), "unknown catalog operation '__class__'"),
        (pk({"op": "group_claim", "args": ["t", "g", "w", None]}), "unknown catalog operation"),
        (pk({"op": 7}), "unknown catalog operation"),
        (pk({"op": "topics", "more": 1}), "only op, args, kwargs"),
        (pk({"op": "lookup", "args": "t"}), "args must be an array"),
        (pk({"op": "lookup", "args": list(range(100_000))}), "args must be an array of at most"),
        (pk({"op": "lookup", "args": ["t"], "kwargs": {"__init__": 1}}), "keyword names"),
        (pk({"op": "lookup", "args": ["t"], "kwargs": {1: 2}}), "msgpack"),
        (pk({"op": "lookup", "args": [{"a": 1}]}), ""),
        (pk({"op": "lookup", "args": [], "kwargs": {"topic": "t", "bogus": 1}}), "bogus"),
        (pk({"op": "register_partition", "args": ["t", "0", "tcp://x"]}), "must be an int"),
        (pk({"op": "register_partition", "args": ["t", 0, "tcp://x"],
             "kwargs": {"lease": "forever"}}), "lease must be seconds"),
        (pk({"op": "create_topic", "args": ["u"], "kwargs": {"partitions": [1]}}), "partitions"),
        (pk({"op": "lookup", "args": [msgpack.ExtType(9, b"x")]}), "extension type 9"),
        (pk({"op": "lookup", "args": [msgpack.ExtType(1, b"x")]}), "extension type 1"),
        (pk({"op": "lookup", "args": [[1, mark]]}), "first element"),
        (pk({"op": "lookup", "args": [], "kwargs": {"topic": mark}}), "first element"),
        (pk({"op": "lookup", "args": [record("os.system", "ls")]}), "record array"),
        (pk({"op": "lookup", "args": [record("TopicInfo", "x")]}), "has 7 fields"),
        (pk({"op": "history_commit", "args": ["t", 0], "kwargs": {
            "epochs": [record("EpochRecord", 0, {"x": 1}, 0, "e", 1, 1, 1, 1.0)],
            "lower": [1], "upper": [1], "segment": 0, "committed": 0}}), ""),
        (pk({"op": "group_claim_apply", "args": ["t", "g", "w", [["x", 1]], [], None, "f"]}),
         "must be lists of units"),
        (pk({"op": "group_claim_apply", "args": ["t", "g", "w", [[1, -1]], [], None, "f"]}),
         "no consumer group"),
        (b"\x82" + pk("op") + pk("lookup") + pk("args") + b"\x91" * 100_001 + b"\xc0",
         "msgpack"),  # {"op": "lookup", "args": [[[[...]]]]} nested 100,000 deep
    ]
    for body, expected in cases:
        reply, answer = _ask(raw, b"req-1", body)
        assert reply[0] == b"req-1", body[:40]
        assert set(answer) == {"error"}, (body[:40], answer)
        error = answer["error"]
        message = " ".join(map(str, error["args"]))
        assert error["type"] in ("CatalogError", "TopicNotFound", "TypeError"), (body[:40], error)
        assert expected in message, (body[:40], message)
    # too many envelope frames: answered without echoing them
    reply, answer = _ask(raw, *[b"e"] * 6, pk({"op": "topics"}))
    assert len(reply) == 1 and "envelope" in " ".join(answer["error"]["args"])
    # the service keeps serving: this raw client and a well-formed one
    reply, answer = _ask(raw, b"req-2", pk({"op": "lookup", "args": ["t"]}))
    assert reply[0] == b"req-2" and answer["ok"].name == "t"
    with pytest.raises(TopicNotFound) as ei:
        good.lookup("nope")
    assert ei.value.existing == ("t",) and ei.value.topic == "nope"
    assert [t.name for t in good.topics()] == ["t"]
    assert server.stats["errors"] == len(cases) + 2  # + the envelope, + lookup("nope")
    raw.close(0)


def test_arguments_that_cannot_be_sent_are_refused_by_the_client(server):
    cat = Catalog(server.endpoint)
    cat.create_topic("t")
    with pytest.raises(CatalogError, match="cannot send"):
        cat.register_partition("t", 0, "tcp://x", upper=[object()])
    with pytest.raises(CatalogError, match="order must be"):
        cat.create_topic("u", order=object())
    from epochstream.catalog.api import Catalog as Interface

    with pytest.raises(TypeError, match="does not implement the catalog operations .*topics"):
        type("Partial", (Interface,), {})  # an implementation lacking operations is refused


def test_two_processes_race_for_one_partition(served):
    url, home = served
    Catalog(url).create_topic("race")
    procs = [_peer("race", url, "race", home=home, stdin=subprocess.PIPE) for _ in range(4)]
    try:
        for proc, lines in procs:
            assert lines.get(20) == "ready"
        start = time.time() + 0.2
        for proc, _ in procs:
            proc.stdin.write(f"go {start!r}\n")
            proc.stdin.flush()
        outcomes = [lines.get(20).split()[0] for _, lines in procs]
        assert sorted(outcomes) == ["held", "held", "held", "won"]
        winner = procs[outcomes.index("won")][0]
        assert Catalog(url).lookup("race").partition_info[0].pid == winner.pid
    finally:
        for proc, _ in procs:
            proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                _stop(proc)


# ---- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_catalog_serve_as_a_process_stops_on_a_signal(tmp_path, sig):
    proc, url, _ = _serve(tmp_path / "db", tmp_path / "home")
    try:
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", url)  # the * port resolved
        cat = Catalog(url)
        cat.create_topic("x")
        assert cat.server["db"] == str(tmp_path / "db" / "catalog.sqlite")
        proc.send_signal(sig)
        assert proc.wait(5) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        _stop(proc)
    assert Catalog(tmp_path / "db").lookup("x").name == "x"  # it was written to the file
    with pytest.raises(CatalogUnavailable):
        Catalog(url, timeout=0.3)
    with socket.socket() as s:  # the port is free again (no listener; TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))


def test_catalog_serve_refuses_bad_arguments(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        runner = CliRunner(env=CLI_ENV)
        result = runner.invoke(app, ["catalog", "serve", "--db", str(tmp_path / "d"), "--bind",
                                     f"tcp://127.0.0.1:{busy.getsockname()[1]}"])
        assert result.exit_code == 1 and "cannot bind" in result.output, result.output
        result = runner.invoke(app, ["catalog", "serve", "--db", "tcp://127.0.0.1:1"])
        assert result.exit_code == 2 and "not a catalog service" in result.output, result.output
    finally:
        busy.close()


def test_commands_take_the_url(server, monkeypatch):
    url = server.endpoint
    cat = Catalog(url)
    with Publisher("cli", catalog=cat, retention=Retention()) as pub:
        for t in range(4):
            pub.send(t, [{"t": t}])
            pub.advance_to(t + 1)
    group = EpochGroup("cli", "g", catalog=url)
    lease = group.fetch(1)[0]
    runner = CliRunner(env=CLI_ENV)

    def run(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, (args, result.output)
        return result.output

    assert re.search(r"cli .* closed", run("topics", "--catalog", url))
    assert len(re.findall(r"^\s+\d+\s+1\s", run("history", "cli", "--catalog", url), re.M)) == 4
    tailed = run("tail", "cli", "--from", "earliest", "--durable", "d", "--json", "--catalog", url)
    assert [line for line in tailed.splitlines() if line.startswith("{")][-1].startswith(
        '{"time": 3')
    assert "cli" in run("durable", "ls", "--catalog", url)
    info = run("group", "info", "cli", "g", "--catalog", url)
    assert "leased" in info and "0" in info
    lease.ack()
    monkeypatch.setenv("EPOCHSTREAM_CATALOG", url)  # the URL from the environment
    assert re.search(r"cli\s+│\s+g\s+│", run("group", "ls"))
    assert "dropped topic 'cli'" in run("drop", "cli")
    assert cat.topics() == []


def test_spark_option_takes_the_url(server):
    from epochstream.spark.client import ingest_endpoints

    cat = Catalog(server.endpoint)
    cat.create_topic("sp", partitions=2)
    for p in (0, 1):
        cat.register_partition("sp", p, f"tcp://127.0.0.1:{5000 + p}",
                               ingest=f"tcp://127.0.0.1:{6000 + p}")
    assert ingest_endpoints(server.endpoint, "sp") == ["tcp://127.0.0.1:6000",
                                                       "tcp://127.0.0.1:6001"]


def test_errors_keep_their_types_through_the_service(server):
    cat = Catalog(server.endpoint)
    cat.create_topic("t")
    cat.group_open("t", "g", mode="shared", ack_wait=1.0, max_deliver=1, dead_letter=None)
    cat.group_stop("t", "g", "because")
    with pytest.raises(GroupStopped, match="because"):
        cat.group_claim("t", "g", "w", lambda s, n, p: (Plan((), ()), None))
    with pytest.raises(LeaseExpired):
        cat.group_reset("t", "g")
        cat.group_settle("t", "g", (0, -1), 1, outcome="ack")
    cat.durable_claim("t", "d", "A")
    with pytest.raises(SubscriptionHeld) as ei:
        cat.durable_claim("t", "d", "B")
    assert type(ei.value) is SubscriptionHeld and "takeover=True" in str(ei.value)


def test_the_documented_example_runs_as_written(served, tmp_path):
    """docs/index.md's remote.py, in a process of its own, given only the URL."""
    try:
        socket.getaddrinfo(socket.gethostname(), None)
    except OSError:  # pragma: no cover - the example advertises this host's name
        pytest.skip("this machine's host name does not resolve")
    url, home = served
    text = (Path(__file__).parent.parent / "docs" / "index.md").read_text()
    m = re.search(r"^`remote\.py`[^\n]*\n(?:[^\n]+\n)*\n```python\n(.*?)```", text, re.S | re.M)
    assert m, "no remote.py in docs/index.md"
    (tmp_path / "remote.py").write_text(m.group(1))
    env = dict(_env(home), EPOCHSTREAM_CATALOG=url)
    done = subprocess.run([sys.executable, "remote.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(0, 1), (1, 1), (2, 1)]"


def test_a_client_left_open_does_not_knock_on_the_port_after_the_service_stopped(tmp_path):
    """Regression (a CI run): a cached client (the Spark sink's, never closed) kept pooled DEALER
    sockets connected to a stopped catalog service; they reconnected every second and greeted,
    in ZMTP, whatever bound that port next — there, a Spark driver's Python-worker callback
    port, whose handshake then failed the query. Idle sockets are closed after IDLE_S."""
    from epochstream.catalog.client import IDLE_S

    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        remote = Catalog(srv.endpoint)  # deliberately never closed
        remote.create_topic("t")
        remote.lookup("t")
        port = int(srv.endpoint.rsplit(":", 1)[1])
    time.sleep(IDLE_S + 0.6)
    lis = socket.socket()
    lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lis.bind(("127.0.0.1", port))
    lis.listen(8)
    lis.settimeout(1.5)  # > RECONNECT_IVL_MAX (1 s): a leaked socket would have knocked by then
    try:
        with pytest.raises(socket.timeout):
            conn, _ = lis.accept()
            conn.close()
    finally:
        lis.close()
    with pytest.raises(CatalogUnavailable):  # the service is gone: a clear error, no hang
        Catalog(f"tcp://127.0.0.1:{port}?timeout=0.5").lookup("t")
