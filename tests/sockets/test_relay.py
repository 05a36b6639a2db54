"""Relays (epochstream/transport/relay.py) with real sockets and processes: a chain publisher →
relay → relay → subscribers with different filters joining mid-epoch gets whole epochs only;
the upstream link carries each message once; a relay killed with SIGKILL surfaces as
PublisherLost downstream, or, with recover=True and a restarted relay, as a Gap — never a
partial epoch."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from epochstream import Catalog, Publisher, Relay, Subscriber
from epochstream.errors import ProtocolError, PublisherAborted, PublisherLost
from epochstream.events import Gap

from peer_processes import read_until

KEYS = ("AA", "UA", "DL", "B6")


def _records(t: int, m: int) -> list:
    return [{"c": KEYS[(t + m + i) % len(KEYS)], "t": t, "m": m, "i": i} for i in range(5)]


def _matching(sent: dict, t: int, keys) -> list:
    return [r for r in sent.get(t, []) if keys is None or r["c"] in keys]


def test_chain_of_relays_five_subscribers_with_filters_joining_mid_epoch(tmp_path):
    """Subscribers join the tiers at random points, in the middle of epochs; every epoch each
    one gets is exactly the matching records of that epoch (whole), and from its first epoch on
    none is missing."""
    rng = random.Random(7)
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("chain", catalog=cat, key="c")
    sent: dict = {}
    subs: list = []
    filters = [None, {"AA"}, {"UA", "DL"}, {"B6"}, {"AA", "B6"}]
    relays = []
    try:
        for t in range(12):
            for m in range(3):
                recs = _records(t, m)
                sent.setdefault(t, []).extend(recs)
                pub.send(t, recs)
                pub.flush()
                if t == 1 and m == 1:  # the relays join mid-epoch
                    relays.append(Relay("chain", cat, tier="edge", key="c"))
                    relays.append(Relay("chain@edge", cat, tier="far", key="c"))
                if 2 <= t <= 8 and len(subs) < len(filters) and rng.random() < 0.4:
                    keys = filters[len(subs)]
                    tier = rng.choice(["chain@edge", "chain@edge@far"])
                    s = Subscriber(tier, cat, keys=keys, timeout=10)
                    assert s.wait_ready(10)
                    subs.append((s, keys, t))
            pub.advance_to(t + 1)
        assert len(subs) == len(filters)
        assert pub.subscribers == 1  # only the first relay reads the publisher
        pub.close()
        for s, keys, joined in subs:
            got = [(e.time, e.records) for e in s.epochs(timeout=10)]
            times = [t for t, _ in got]
            assert times and times[0] <= joined + 1, (keys, joined, times)
            expect = [t for t in range(times[0], 12) if _matching(sent, t, keys)]
            assert times == expect, (keys, joined, times)
            for t, records in got:
                assert records == _matching(sent, t, keys), (keys, t)
        assert all(r.join(10) and r.error is None for r in relays)
    finally:
        for s, _, _ in subs:
            s.close()
        for r in relays:
            r.close()


def test_upstream_abort_aborts_downstream(tmp_path):
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("ab", catalog=cat)
    with Relay("ab", cat, tier="edge") as relay:
        sub = Subscriber("ab@edge", cat, timeout=10)
        assert sub.wait_ready(10)
        pub.send(0, [1, 2])
        pub.advance_to(1)
        pub.send(1, [3])  # epoch 1 never completes
        pub.abort("test")
        got = []
        with pytest.raises(PublisherAborted):
            for e in sub.epochs(timeout=10):
                got.append((e.time, e.records))
        assert got == [(0, [1, 2])]
        assert relay.join(10) and relay.error is not None
        sub.close()


RELAY_PROC = textwrap.dedent("""
    import sys, time
    from epochstream import Catalog, Relay
    relay = Relay(sys.argv[2], Catalog(sys.argv[1]), tier="edge", heartbeat_interval=0.2)
    print("ready", relay.endpoint, flush=True)
    while True:
        time.sleep(1)
""")


def _relay_process(cat_dir, topic):
    proc = subprocess.Popen([sys.executable, "-c", RELAY_PROC, str(cat_dir), topic],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    read_until(proc, "ready", timeout=30)
    return proc


def _kill(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.mark.slow
def test_relay_killed_downstream_sees_publisher_lost_never_a_partial_epoch(tmp_path):
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("k9", catalog=cat)
    proc = _relay_process(tmp_path / "cat", "k9")
    try:
        sub = Subscriber("k9@edge", cat, timeout=1.5)
        assert sub.wait_ready(10)
        pub.send(0, [0, 1])
        pub.advance_to(1)
        pub.send(1, [2])  # epoch 1 half sent when the relay dies
        pub.flush()
        time.sleep(0.3)
        _kill(proc)
        got = []
        t0 = time.monotonic()
        with pytest.raises(PublisherLost):
            for e in sub.epochs(timeout=20):
                got.append((e.time, e.records))
        assert got == [(0, [0, 1])]
        assert time.monotonic() - t0 < 15
        sub.close()
    finally:
        if proc.poll() is None:
            _kill(proc)
        pub.close()


@pytest.mark.slow
def test_relay_killed_and_restarted_recover_reports_a_gap_then_whole_epochs(tmp_path):
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("k9r", catalog=cat)
    procs = [_relay_process(tmp_path / "cat", "k9r")]
    try:
        sub = Subscriber("k9r@edge", cat, timeout=2.0, recover=True)
        assert sub.wait_ready(10)
        sent: dict = {}

        def send(t, recs):
            sent.setdefault(t, []).extend(recs)
            pub.send(t, recs)

        send(0, [0, 1])
        pub.advance_to(1)
        send(1, [2])
        pub.flush()
        time.sleep(0.3)
        _kill(procs[0])
        procs.append(_relay_process(tmp_path / "cat", "k9r"))  # a new incarnation of the tier
        send(1, [3])
        pub.advance_to(2)
        got, gaps = [], []
        t, deadline = 2, time.monotonic() + 30
        epochs = sub.epochs(timeout=1)
        while len([x for x in got if gaps and x[0] > gaps[-1].last_epoch]) < 3:
            assert time.monotonic() < deadline, (got, gaps)
            send(t, [10 * t, 10 * t + 1])  # keep publishing until the re-joined subscriber
            pub.advance_to(t + 1)          # has three epochs from the new relay
            t += 1
            try:
                item = next(epochs)
            except TimeoutError:
                epochs = sub.epochs(timeout=1)
                continue
            if isinstance(item, Gap):
                gaps.append(item)
            else:
                got.append((item.time, item.records))
        assert len(gaps) == 1 and gaps[0].last_epoch == 0
        for et, records in got:
            assert records == sent[et], (et, records)  # whole, never partial
        assert got[0] == (0, [0, 1])
        assert 1 not in [et for et, _ in got]  # begun before the new relay joined: dropped
        sub.close()
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        pub.close()


def test_relay_command_serves_the_tier_and_stops_on_sigterm(tmp_path):
    """``epochstream relay TOPIC --tier edge`` as a real process: a subscriber of TOPIC@edge gets
    whole epochs; SIGTERM stops it with status 0 and a summary on stderr."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("cli", catalog=cat)
    proc = subprocess.Popen([sys.executable, "-m", "epochstream", "relay", "cli", "--tier", "edge",
                             "--catalog", str(tmp_path / "cat")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        words = read_until(proc, "relay", timeout=30)
        assert words[:4] == ["relay", "cli", "->", "cli@edge"], words
        sub = Subscriber("cli@edge", cat, timeout=10)
        assert sub.wait_ready(10)
        for t in range(3):
            pub.send(t, [t, t + 100])
            pub.advance_to(t + 1)
        epochs = sub.epochs(timeout=10)
        assert [(e.time, e.records) for e in (next(epochs) for _ in range(3))] == \
            [(0, [0, 100]), (1, [1, 101]), (2, [2, 102])]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert "relay cli@edge stopped (3 data messages" in proc.stderr.read()
        sub.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        pub.close()


def test_relay_command_unknown_topic_is_status_2(tmp_path):
    Catalog(tmp_path / "cat")
    proc = subprocess.run([sys.executable, "-m", "epochstream", "relay", "nope", "--wait", "0",
                           "--catalog", str(tmp_path / "cat")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "error:" in proc.stderr and "nope" in proc.stderr


# -- subscriptions travel up: the relay asks upstream for the cover of its subscribers' filters
def _produce(pub, sent: dict, epochs: int, pause: float, stop) -> None:
    try:
        _produce_epochs(pub, sent, epochs, pause, stop)
    except ProtocolError:  # closed by a failing test's clean-up
        assert stop.is_set()


def _produce_epochs(pub, sent: dict, epochs: int, pause: float, stop) -> None:
    for t in range(epochs):
        for m in range(3):
            recs = [{"c": KEYS[(t * 3 + m + i) % len(KEYS)], "t": t, "m": m, "i": i,
                     "d": (t + i) % 7} for i in range(8)]
            sent.setdefault(t, []).extend(recs)
            pub.send(t, recs)
            time.sleep(pause)
        pub.advance_to(t + 1)
        if stop.is_set():
            break
    pub.close()


def _check_whole(name, got, sent, phases) -> None:
    """Every epoch equals exactly its records under the filter in force for it: ``phases`` is
    [(first epoch, Filter)] (the filter from that epoch on)."""
    assert got, name
    times = [t for t, _ in got]
    assert times == sorted(set(times)), name
    for t, records in got:
        f = [f for b, f in phases if b <= t][-1]
        want = f.apply_records(sent[t], key="c")
        assert records == want, (name, t, f)
    first = times[0]
    expect = [t for t in range(first, max(sent) + 1)
              if [f for b, f in phases if b <= t][-1].apply_records(sent[t], key="c")]
    assert times == expect, name  # none missing from its first epoch on


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_relay_subscribes_upstream_with_the_cover_of_its_subscribers_filters(tmp_path, seed):
    """A producer runs; subscribers with different filters (keys, where, both) join a relay at
    random moments and one widens its filter mid-stream: the relay's upstream subscription
    narrows to the cover of what its subscribers need and widens before serving a filter it
    does not cover (the hello or update waits for the upstream change, then is served from its
    boundary on): every epoch each subscriber gets is whole under the filter in force for it."""
    import threading

    from epochstream.filters import Filter

    rng = random.Random(seed)
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("u", catalog=cat, key="c", heartbeat_interval=0.2)
    sent: dict = {}
    stop = threading.Event()
    relay = Relay("u", cat, tier="edge", heartbeat_interval=0.1)
    producer = threading.Thread(target=_produce, args=(pub, sent, 120, 0.004, stop), daemon=True)
    asks = [dict(keys={"AA"}), dict(keys={"UA"}, where=[("d", "<", 3)]),
            dict(where=[("c", "in", ["DL"])]), dict(keys={"B6", "AA"}, columns=["t", "i"])]
    rng.shuffle(asks)
    subs = []
    try:
        producer.start()
        for ask in asks:
            time.sleep(rng.uniform(0.05, 0.3))
            s = Subscriber("u@edge", cat, timeout=10, **ask)
            assert s.wait_ready(5)  # served within the upstream round trip, not an epoch
            subs.append((s, [(0, Filter(**ask))]))
        time.sleep(0.3)
        up = relay.upstream_filter
        assert not up.everything, up  # narrowed to the cover
        assert all(__import__("epochstream.filters", fromlist=["covers"]).covers(
            up, f, "c") for _, ph in subs for _, f in ph)
        s, phases = subs[rng.randrange(len(subs))]
        wider = Filter(keys=list(KEYS[:3]))
        b = s.update_filter(keys=wider.keys)
        phases.append((b[0], wider))
        producer.join(30)
        for i, (s, phases) in enumerate(subs):
            got = [(e.time, e.records) for e in s.epochs(timeout=10)]
            _check_whole(f"subscriber {i}", got, sent, phases)
        assert relay.join(10) and relay.error is None
        assert relay.stats["upstream_changes"] >= 2
        assert relay.publisher.stats["gated"] >= 1
    finally:
        stop.set()
        for s, _ in subs:
            s.close()
        relay.close()
        pub.close()


def test_subscriptions_travel_up_through_a_chain_of_relays(tmp_path):
    """publisher → edge → far: subscribers of the far tier only; the far relay's cover is the
    edge relay's subscriber filter, so the edge relay narrows its own upstream subscription
    too (transitively), and the far subscribers still get whole epochs."""
    import threading

    from epochstream.filters import Filter

    cat = Catalog(tmp_path / "cat")
    pub = Publisher("v", catalog=cat, key="c", heartbeat_interval=0.2)
    sent: dict = {}
    stop = threading.Event()
    edge = Relay("v", cat, tier="edge", heartbeat_interval=0.1)
    far = Relay("v@edge", cat, tier="far", heartbeat_interval=0.1)
    producer = threading.Thread(target=_produce, args=(pub, sent, 100, 0.004, stop), daemon=True)
    subs = []
    try:
        producer.start()
        for keys in ({"AA"}, {"DL"}):
            s = Subscriber("v@edge@far", cat, keys=keys, timeout=10)
            assert s.wait_ready(5)
            subs.append((s, [(0, Filter(keys=keys))]))
        deadline = time.monotonic() + 5
        while edge.upstream_filter.everything and time.monotonic() < deadline:
            time.sleep(0.02)
        assert far.upstream_filter == Filter(keys=["AA", "DL"])
        assert edge.upstream_filter == Filter(keys=["AA", "DL"])  # travelled up two tiers
        producer.join(30)
        for i, (s, phases) in enumerate(subs):
            _check_whole(f"subscriber {i}", [(e.time, e.records) for e in s.epochs(timeout=10)],
                         sent, phases)
    finally:
        stop.set()
        for s, _ in subs:
            s.close()
        far.close()
        edge.close()
        pub.close()


RELAY_UNTIL_END = textwrap.dedent("""
    import sys
    from epochstream import Catalog, Relay
    relay = Relay(sys.argv[2], Catalog(sys.argv[1]), tier="edge", heartbeat_interval=0.2)
    print("ready", relay.endpoint, flush=True)
    relay.join(60)
    relay.close()
    print("ended", relay.error, flush=True)
""")  # then the script returns: the process ends when the interpreter lets it


def test_relay_process_that_returns_after_join_still_delivers_its_backlog(tmp_path):
    """A relay in its own process that returns once its upstream ended (``join()``,
    ``close()``, the end of the script, as a benchmark's relay process does) while a
    flow-controlled subscriber in another process still has most of the stream to read: the
    process stays alive until that subscriber read to the end (the downstream publisher's
    closer thread is not a daemon although the relay's own thread, which closes downstream, is
    one), then exits by itself. It used to exit at once, dropping the backlog: the subscriber
    heard nothing more, not even heartbeats, and raised PublisherLost."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("tail", catalog=cat)
    proc = subprocess.Popen([sys.executable, "-c", RELAY_UNTIL_END, str(tmp_path / "cat"), "tail"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    sub = None
    try:
        read_until(proc, "ready", timeout=30)
        sub = Subscriber("tail@edge", cat, credit=16, timeout=3)
        assert sub.wait_ready(10)
        sent = {}
        for t in range(200):  # full speed; the subscriber reads nothing yet
            for m in range(5):
                recs = [t, m, *range(20)]
                sent.setdefault(t, []).extend(recs)
                pub.send(t, recs)
            pub.advance_to(t + 1)
        pub.close()
        assert read_until(proc, "ended", timeout=30) == ["ended", "None"]
        got = {e.time: e.records for e in sub.epochs(timeout=10)}  # the relay's backlog
        assert got == sent
        assert proc.wait(15) == 0  # it exits once the subscriber read to the end (its bye)
    finally:
        if sub is not None:
            sub.close()
        if proc.poll() is None:
            _kill(proc)
        pub.close()
