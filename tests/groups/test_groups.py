"""Consumer groups with real worker processes (issue 12): shared work with a worker killed while
it holds leases, partial-order concurrency, fencing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from peer_processes import kill, read_until
from epochstream import (Catalog, EpochGroup, GroupStopped, History, LeaseExpired, Publisher,
                         Retention, product)

WORKER = str(Path(__file__).parent / "group_worker.py")


def _publish(cat, topic, n, order=None, times=None, partitions=1):
    """Publish epochs (``times`` or 0..n-1) with two records each, retention on."""
    kw = {} if order is None else {"order": order}
    pubs = [Publisher(topic, p, catalog=cat, partitions=partitions, retention=Retention(), **kw)
            for p in range(partitions)]
    try:
        for t in (times if times is not None else range(n)):
            for pub in pubs:
                pub.send(t, [[pub.partition, "a"], [pub.partition, "b"]])
        # (times are sent under the initial capability; the close completes them all)
    finally:
        for pub in pubs:
            pub.close(wait=True)


def _worker(cat, topic, name, mode="shared", work=0.0, max_epochs=1):
    return subprocess.Popen([sys.executable, WORKER, str(cat.path), topic, name, mode, str(work),
                             str(max_epochs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


class _Log:
    """Collects a worker's lines on a thread."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.split())

    def times(self, kind):
        return [json.loads(w[1]) for w in self.lines if w[0] == kind]


def test_three_workers_share_300_epochs_and_a_killed_workers_leases_are_redelivered(tmp_path):
    cat = Catalog(tmp_path)
    _publish(cat, "jobs", 300)
    procs = [_worker(cat, "jobs", "g", work=0.002, max_epochs=3) for _ in range(3)]
    for p in procs:
        read_until(p, "ready", 30)
    logs = [_Log(p) for p in procs]
    victim = logs[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # kill it while it holds leases it has not acked
        leased, acked = victim.times("leased"), victim.times("acked")
        if len(acked) >= 5 and len(leased) > len(acked):
            break
        time.sleep(0.001)
    kill(procs[0])
    victim.thread.join(5)
    for p in procs[1:]:
        p.wait(60)
    for log in logs:
        log.thread.join(5)
    held = set(victim.times("leased")) - set(victim.times("acked"))
    assert held, "the victim held no lease when killed: the test proved nothing"
    acked = [t for log in logs for t in log.times("acked")]
    assert sorted(acked) == list(range(300))  # every epoch acked exactly once
    redelivered = {json.loads(w[1]) for log in logs[1:] for w in log.lines
                   if w[0] == "leased" and int(w[2]) > 1}
    assert redelivered == held
    assert not [t for log in logs for t in log.times("refused")]


def test_partial_mode_leases_incomparable_epochs_together_and_comparable_ones_in_order(tmp_path):
    cat = Catalog(tmp_path)
    times = [(d, i) for d in range(3) for i in range(3)]  # (day, iteration)
    _publish(cat, "grid", 0, order=product(2), times=times)
    g = EpochGroup("grid", "p", cat, mode="partial")
    first = g.fetch(10)
    assert [l.epoch.time for l in first] == [(0, 0)]  # everything else is above it
    first[0].ack()
    second = g.fetch(10)
    assert sorted(l.epoch.time for l in second) == [(0, 1), (1, 0)]  # in flight together
    other = EpochGroup("grid", "p", cat, mode="partial", worker="other")
    assert other.fetch(10, expires=0.2) == []  # (1, 1) needs both; (0, 2), (2, 0) need one
    second[1].ack()
    got = sorted(l.epoch.time for l in other.fetch(10))
    want = sorted({(0, 2), (2, 0)} - {second[0].epoch.time} | (
        {(1, 1)} if False else set()))
    assert set(got) <= {(0, 2), (2, 0)} and got
    # nothing leased is above an unacked epoch
    unacked = [second[0].epoch.time]
    for t in got:
        assert not any(product(2).le(u, t) for u in unacked)


def test_an_ack_after_the_lease_expired_is_refused_and_the_epoch_completes_once(tmp_path):
    cat = Catalog(tmp_path)
    _publish(cat, "jobs", 2)
    slow = EpochGroup("jobs", "g", cat, ack_wait=0.2, worker="slow")
    fast = EpochGroup("jobs", "g", cat, ack_wait=0.2, worker="fast")
    lease = slow.fetch(1)[0]
    assert lease.epoch.time == 0 and len(lease.epoch.records) == 2
    time.sleep(0.3)
    again = fast.fetch(1)[0]
    assert again.epoch.time == 0 and again.deliveries == 2
    with pytest.raises(LeaseExpired, match="leased again"):
        lease.ack()
    again.ack()
    with pytest.raises(LeaseExpired):
        again.ack()


def test_max_deliver_goes_to_the_dead_letter_topic_whole_or_stops_the_group(tmp_path):
    cat = Catalog(tmp_path)
    _publish(cat, "jobs", 2)
    g = EpochGroup("jobs", "dl", cat, max_deliver=2, dead_letter="jobs.dead")
    for _ in range(2):
        lease = g.fetch(1)[0]
        assert lease.epoch.time == 0
        lease.nak()
    nxt = g.fetch(1)[0]  # epoch 0 is dead-lettered on the way
    assert nxt.epoch.time == 1
    dead = [e.records for e in History("jobs.dead", catalog=cat).epochs()]
    assert len(dead) == 1 and dead[0][0]["time"] == 0 and len(dead[0][0]["deliveries"]) == 2
    from epochstream import wire
    assert list(wire.codec("msgpack").decode(dead[0][0]["payloads"][0][1])) == \
        [(0, "a"), (0, "b")]
    stop = EpochGroup("jobs", "stop", cat, max_deliver=1)
    stop.fetch(1)[0].nak()
    with pytest.raises(GroupStopped, match="no dead_letter topic"):
        stop.fetch(1, expires=1)
    with pytest.raises(GroupStopped):
        EpochGroup("jobs", "stop", cat, max_deliver=1).fetch(1, expires=1)


def test_key_shared_keeps_per_key_order_across_workers_joining_and_leaving(tmp_path):
    """Records keyed by customer over 12 epochs; workers join and leave (one abandons its
    leases, which expire); every customer's records are processed in epoch order, each once."""
    cat = Catalog(tmp_path)
    customers = ["ann", "bob", "cyd", "dan", "eve", "fay"]
    with Publisher("orders", catalog=cat, retention=Retention()) as pub:
        for t in range(12):
            pub.send(t, [{"customer": c, "t": t} for c in customers if (t + len(c) + ord(c[0])) % 3])
            pub.advance_to(t + 1)
    kw = dict(mode="key_shared", key="customer", buckets=4, ack_wait=0.3)
    seen: dict = {}  # customer -> epochs processed, in processing order
    a = EpochGroup("orders", "g", cat, worker="a", **kw)
    b = EpochGroup("orders", "g", cat, worker="b", **kw)
    held_a = a.fetch(3)
    assert held_a and all(lease.bucket is not None for lease in held_a)
    buckets_a = {lease.bucket for lease in held_a}
    got_b = b.fetch(10)
    assert not ({lease.bucket for lease in got_b} & buckets_a)  # a bucket is one worker's
    for lease in got_b:
        for r in lease.epoch.records:
            seen.setdefault(r["customer"], []).append(lease.epoch.time)
        lease.ack()
    time.sleep(0.4)  # worker a went away: its leases expire, its buckets move to c
    c = EpochGroup("orders", "g", cat, worker="c", **kw)
    for worker in (c, b, c):
        for lease in worker.leases(expires=0.5):
            for r in lease.epoch.records:
                seen.setdefault(r["customer"], []).append(lease.epoch.time)
            lease.ack()
    for lease in held_a:
        with pytest.raises(LeaseExpired):
            lease.ack()
    for cust in customers:
        want = [t for t in range(12) if (t + len(cust) + ord(cust[0])) % 3]
        assert seen.get(cust) == want, cust  # in order, each once


def test_key_shared_worker_processes_keep_per_key_order_when_one_is_killed(tmp_path):
    """Three key_shared worker processes over 60 epochs of keyed records; one is killed with
    SIGKILL mid-way (its buckets move to the others at once). Every (epoch, customer) record is
    processed, and for every customer the epochs were acked in increasing order."""
    cat = Catalog(tmp_path)
    customers = [f"c{i}" for i in range(12)]
    with Publisher("orders", catalog=cat, retention=Retention()) as pub:
        for t in range(60):
            pub.send(t, [{"customer": c, "t": t} for c in customers if (t * 7 + int(c[1:])) % 4])
            pub.advance_to(t + 1)
    procs = [subprocess.Popen([sys.executable, WORKER, str(cat.path), "orders", "k", "key_shared",
                               "0.003", "2", "customer"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        read_until(p, "ready", 30)
    logs = [_Log(p) for p in procs]
    deadline = time.monotonic() + 30
    while len(logs[0].times("acked")) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    kill(procs[0])
    for p in procs[1:]:
        p.wait(60)
    for log in logs:
        log.thread.join(5)
    acks = [(float(w[3]), json.loads(w[1]), w[4].split(",") if len(w) > 4 else [])
            for log in logs for w in log.lines if w[0] == "acked"]
    seen: dict = {}
    for _, t, keys in sorted(acks):
        for c in keys:
            seen.setdefault(c, []).append(t)
    # the victim may have been killed between an accepted ack and its line: those epochs are
    # settled (the position says so) but unprinted; anything else must be there exactly once.
    # A lease is one (epoch, bucket): another bucket of the same epoch acked and printed does
    # not make this one printed (CI failed when the test compared epochs only)
    victim = logs[0].lines
    unprinted = {t for t, b in ({(json.loads(w[1]), w[3]) for w in victim if w[0] == "leased"}
                                - {(json.loads(w[1]), w[2]) for w in victim if w[0] == "acked"})}
    assert EpochGroup("orders", "k", cat, mode="key_shared", key="customer",
                      buckets=8).fetch(1, expires=0.5) == []
    for c in customers:
        want = [t for t in range(60) if (t * 7 + int(c[1:])) % 4]
        got = seen.get(c, [])
        assert got == sorted(got) and len(set(got)) == len(got), c  # per-key order, once each
        assert set(want) - set(got) <= unprinted, c
