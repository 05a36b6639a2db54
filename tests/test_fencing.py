"""Ownership by generation on a PostgreSQL catalog (issue 27): a zombie publisher is fenced.

A publisher process is stopped (SIGSTOP) past its lease, a successor takes the partition over
with the next generation, and the zombie is continued (SIGCONT) and keeps sending: it must
complete nothing more (it finds itself fenced by its own clock, or the catalog refuses its next
write), exit with ``Fenced``, and a subscriber following the topic through the change must get
every epoch whole, from one generation each, never a zombie's epoch after a successor's."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochstream import Catalog, Fenced, Publisher, Subscriber
from epochstream.errors import PartitionHeld
from epochstream.events import Gap

PEER = Path(__file__).with_name("fencing_peer.py")
LEASE = 1.5


def _lines(proc: subprocess.Popen) -> "queue.Queue[str]":
    q: "queue.Queue[str]" = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.strip())
        q.put("<eof>")
    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: "queue.Queue[str]", prefix: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        if line.startswith(prefix) or line == "<eof>":
            return line


def test_a_stopped_publisher_is_fenced_when_it_wakes(pg_url):
    proc = subprocess.Popen([sys.executable, str(PEER), pg_url, str(LEASE)],
                            stdout=subprocess.PIPE, text=True)
    got: list = []
    gaps: list = []
    done = threading.Event()
    failed: list = []

    def consume(sub):
        try:
            for epoch in sub.epochs(timeout=30):
                if isinstance(epoch, Gap):  # the re-join (recover=True): epochs may be missed
                    gaps.append(epoch.reason)
                    continue
                got.append((epoch.time, [r["from"] for r in epoch.records]))
                if done.is_set():
                    return
        except BaseException as e:  # noqa: BLE001 - asserted below
            failed.append(e)

    try:
        q = _lines(proc)
        zombie = _wait_for(q, "registered").split()[1]
        sub = Subscriber("z", catalog=pg_url, recover=True, wait=10)
        reader = threading.Thread(target=consume, args=(sub,), daemon=True)
        reader.start()
        assert _wait_for(q, "sent 20").startswith("sent")
        proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        cat = Catalog(pg_url, lease=LEASE)
        with pytest.raises(PartitionHeld):  # its lease still runs: nobody may take it yet
            cat.register_partition("z", 0, "tcp://127.0.0.1:9")
        while cat.lookup("z").partition_info[0].state != "expired":
            assert time.monotonic() - stopped < LEASE + 3, "the zombie's lease never expired"
            time.sleep(0.05)
        # the successor begins beyond every time the zombie may have sent (its recorded upper)
        start = max(cat.lookup("z").partition_info[0].upper)
        with Publisher("z", catalog=cat, start=start) as successor:
            p = cat.lookup("z").partition_info[0]
            assert (p.incarnation, p.generation, p.state) == (successor.incarnation, 2, "live")
            proc.send_signal(signal.SIGCONT)  # the zombie wakes up and keeps sending
            e = start
            deadline = time.monotonic() + 20
            while sum(1 for _, s in got if s == ["successor"]) < 10:
                assert time.monotonic() < deadline and not failed, (got, gaps, failed)
                successor.send(e, [{"from": "successor", "e": e}])
                successor.advance_to(e + 1)
                e += 1
                time.sleep(0.02)
            done.set()
            proc.wait(20)
        reader.join(10)
        sub.close()
        p = cat.lookup("z").partition_info[0]
        assert (p.incarnation, p.generation) == (successor.incarnation, 2)  # never the zombie's
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    rest = [line for line in iter(q.get, "<eof>")]
    assert proc.returncode == 3, rest  # it raised Fenced
    assert any(line.startswith("fenced") for line in rest), rest
    assert zombie != successor.incarnation
    # every epoch whole and from one generation; the zombie's stop where the successor's begin
    assert all(len(sources) == 1 for _, sources in got), got
    kinds = [sources[0] for _, sources in got]
    first = kinds.index("successor")
    assert "zombie" not in kinds[first:], got
    assert kinds[:first] and set(kinds[:first]) == {"zombie"}, got
    times = [t for t, _ in got]
    assert times == sorted(set(times)), got  # each epoch once, in order
    assert times[first] >= start


def test_the_catalog_refuses_a_fenced_incarnation(pg_url):
    """The catalog side of fencing: once a new generation holds the partition, every write
    of the old incarnation is refused: its frontier, its heartbeat (lease renewal), its close,
    its epoch log index commits (Fenced, nothing applied)."""
    from epochstream.catalog.history import EpochRecord

    cat = Catalog(pg_url, lease=0.3)
    cat.create_topic("f")
    old = cat.register_partition("f", 0, "tcp://127.0.0.1:1", pid=999_999_999 % 4_000_000,
                                 host="elsewhere")
    cat.history_begin("f", 0, "/tmp/es-fenced-log", [0], [0])
    time.sleep(0.5)  # its lease runs out (another host: no pid check)
    new = cat.register_partition("f", 0, "tcp://127.0.0.1:2")
    info = cat.lookup("f").partition_info[0]
    assert (info.incarnation, info.generation) == (new, 2)
    assert cat.record_upper("f", 0, old, [5]) is False
    assert cat.heartbeat("f", 0, old) is False
    assert cat.close_partition("f", 0, old, [5]) is False
    with pytest.raises(Fenced) as e:
        cat.history_commit("f", 0, epochs=[EpochRecord(0, 0, 0, ((0, 1),), 1, 1, 0, 0.0)],
                           lower=[1], upper=[1], segment=0, committed=1, incarnation=old)
    assert e.value.incarnation == old and e.value.partition == 0
    assert cat.history_epochs("f", 0) == []  # nothing of the refused commit
    cat.history_commit("f", 0, epochs=[EpochRecord(0, 0, 0, ((0, 1),), 1, 1, 0, 0.0)],
                       lower=[1], upper=[1], segment=0, committed=1, incarnation=new)
    assert len(cat.history_epochs("f", 0)) == 1
    info = cat.lookup("f").partition_info[0]
    assert (info.state, info.incarnation) == ("live", new)
    cat.close()


def test_a_durable_holder_on_postgres_holds_a_renewed_lease(pg_url):
    """On PostgreSQL a durable subscription's holder has a lease (judged on the database's
    clock) that its catalog object renews: alive through several leases while its process
    runs, free once renewals stop (a holder on another machine whose process died: its pid
    cannot be checked from here), taken without takeover=True."""
    holder = Catalog(pg_url, lease=0.6)
    holder.create_topic("d")
    holder.durable_claim("d", "dur", "h1")
    other = Catalog(pg_url, lease=0.6)
    time.sleep(1.5)  # 2.5 leases: alive through renewals
    info = other.durable("d", "dur")
    assert info.holder == "h1" and info.holder_alive
    from epochstream.errors import SubscriptionHeld
    with pytest.raises(SubscriptionHeld):
        other.durable_claim("d", "dur", "h2")
    holder.close()  # renewals stop, as when its process dies
    time.sleep(1.0)
    assert not other.durable("d", "dur").holder_alive
    assert other.durable_claim("d", "dur", "h2").holder == "h2"
    other.close()
