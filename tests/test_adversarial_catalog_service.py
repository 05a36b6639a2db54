"""Adversarial: durable subscriptions and consumer groups through `epochstream catalog serve`
while the service is killed with SIGKILL and restarted on the same db file and port at the
worst moments. Real processes and sockets on 127.0.0.1."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochstream import Catalog, CatalogUnavailable, EpochGroup, Publisher, Retention, Subscriber
from epochstream.errors import CatalogError

# the racier, slower cases run with HYPOTHESIS_PROFILE=thorough (kills landing on a publisher's
# index commit: the known failure below)
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
_THOROUGH_ONLY = pytest.mark.skipif(not THOROUGH, reason="racy and slow: HYPOTHESIS_PROFILE=thorough")

PEER = Path(__file__).with_name("catalog_server_peer.py")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EPOCHSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    return tmp_path / "home"


def _env(home: Path) -> dict:
    env = dict(os.environ)
    env.pop("EPOCHSTREAM_CATALOG", None)
    env["EPOCHSTREAM_HOME"] = str(home)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """`epochstream catalog serve` on a fixed port, killable and restartable."""

    def __init__(self, db: Path, home: Path):
        self.db, self.home = db, home
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            proc = subprocess.Popen(
                [sys.executable, "-m", "epochstream", "catalog", "serve", "--db", str(self.db),
                 "--bind", self.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_env(self.home))
            first = proc.stdout.readline()
            if re.match(r"catalog service on tcp://", first):
                self.proc = proc
                return
            proc.kill()
            err = proc.stderr.read()
            proc.wait()
            if time.monotonic() > deadline:
                raise AssertionError(f"service did not start: {first!r} {err}")
            time.sleep(0.05)  # port still held: try again

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def service(tmp_path, home):
    svc = Service(tmp_path / "cat.sqlite", home)
    yield svc
    svc.kill()


def _publish_all(url: str, topic: str, epochs: int, parts: int = 2) -> None:
    """Publish epochs 0..epochs-1 (records [e, p, k], k < 3) with retention, then close."""
    cat = Catalog(url)
    pubs = [Publisher(topic, p, catalog=cat, partitions=parts, retention=Retention())
            for p in range(parts)]
    for e in range(epochs):
        for p, pub in enumerate(pubs):
            pub.send(e, [[e, p, k] for k in range(3)])
            pub.advance_to(e + 1)
    for pub in pubs:
        pub.close()
    cat.close()


def _check_epoch(epoch, parts: int = 2) -> None:
    e = epoch.time
    want = sorted([e, p, k] for p in range(parts) for k in range(3))
    got = sorted(list(r) for r in epoch.records)
    assert got == want, f"epoch {e} not whole/correct: {got}"


def _ack_until_ok(sub, t, svc: Service, deadline: float) -> None:
    while True:
        try:
            sub.ack(t)
            return
        except (CatalogUnavailable, CatalogError):
            assert time.monotonic() < deadline, "ack never succeeded"
            if svc.proc is None:
                svc.start()


# ---- durable subscriptions -----------------------------------------------------------------

def test_ack_with_service_down_fails_cleanly_and_retry_works(service):
    """Kill between receive and ack: the ack raises CatalogUnavailable quickly, position and
    the subscriber's own state are unchanged; after a restart the same ack works; a new
    subscriber resumes exactly after it."""
    url = service.url + "?timeout=1&lease=2"
    _publish_all(url, "t1", 6)
    sub = Subscriber("t1", url, durable="d", start="earliest", timeout=5)
    it = sub.epochs()
    e0 = next(it)
    _check_epoch(e0)
    sub.ack(e0)
    assert sub.position == (1,)
    e1 = next(it)
    _check_epoch(e1)
    service.kill()  # between receive and ack
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable):
        sub.ack(e1)
    assert time.monotonic() - t0 < 3.0, "the failing ack did not fail within the timeout"
    assert sub.position == (1,), "a failed ack moved the subscriber's position"
    with pytest.raises(CatalogUnavailable):  # the same ack again: still a clean failure
        sub.ack(e1)
    assert sub.position == (1,)
    service.start()
    sub.ack(e1)  # the retry works (it was not recorded as acked by the failure)
    assert sub.position == (2,)
    sub.close()
    with Subscriber("t1", url, durable="d", timeout=5) as sub2:
        got = []
        for ep in sub2.epochs():
            _check_epoch(ep)
            got.append(ep.time)
        assert got == [2, 3, 4, 5]


def test_failed_ack_not_retried_then_later_acks_resume_redelivers_only_it(service):
    """An ack fails (service killed), is never retried, later epochs are acked out of order
    beyond it after the restart: a new subscriber redelivers exactly the unacked epoch, whole,
    and none of the acked ones."""
    url = service.url + "?timeout=1&lease=2"
    _publish_all(url, "t7", 6)
    sub = Subscriber("t7", url, durable="d", start="earliest", timeout=5)
    it = sub.epochs()
    e0 = next(it)
    sub.ack(e0)
    e1 = next(it)
    service.kill()
    with pytest.raises(CatalogUnavailable):
        sub.ack(e1)
    assert sub.position == (1,)
    service.start()
    for _ in range(2):
        ep = next(it)
        _check_epoch(ep)
        sub.ack(ep)  # 2 and 3: acked beyond the position
    assert sub.position == (1,)
    sub.close()
    with Subscriber("t7", url, durable="d", timeout=5) as sub2:
        got = []
        for ep in sub2.epochs():
            _check_epoch(ep)
            got.append(ep.time)
        assert got == [1, 4, 5]


def test_close_with_service_down_does_not_hang_and_resume_works(service):
    """Subscriber.close() while the service is dead returns within the timeout (no hang); the
    unreleased hold lapses with its lease and a new Subscriber(durable) resumes after the last
    ack."""
    url = service.url + "?timeout=1&lease=1"
    _publish_all(url, "t8", 5)
    sub = Subscriber("t8", url, durable="d", start="earliest", timeout=5)
    it = sub.epochs()
    for _ in range(2):
        sub.ack(next(it))
    next(it)  # 2: received, never acked
    service.kill()
    t0 = time.monotonic()
    try:
        sub.close()
    except CatalogUnavailable:
        pass
    assert time.monotonic() - t0 < 5.0, "close() hung on a dead catalog service"
    service.start()
    time.sleep(1.3)
    with Subscriber("t8", url, durable="d", timeout=5) as sub2:
        got = []
        for ep in sub2.epochs():
            _check_epoch(ep)
            got.append(ep.time)
        assert got == [2, 3, 4]


@_THOROUGH_ONLY
def test_kill_during_acks_resume_after_last_effective_ack(service):
    """SIGKILL the service at random instants while acks are in flight (each ack racing the
    kill), restart it, carry on. Every ack either succeeds, or raises a catalog error and
    leaves the position unchanged. A fresh subscriber resumes after the last ack that took
    effect: acked epochs never come back, unacked ones come back whole."""
    url = service.url + "?timeout=1&lease=1"
    n = 24
    _publish_all(url, "t2", n)
    rng = random.Random(1234)
    confirmed = -1   # last epoch whose ack returned normally
    attempted = -1   # last epoch whose ack was attempted (maybe took effect)
    deadline = time.monotonic() + 20
    round_ = 0
    while confirmed < n - 1:
        round_ += 1
        assert round_ < 60, "too many rounds"
        sub = Subscriber("t2", url, durable="d", start="earliest", timeout=5, takeover=True)
        it = sub.epochs()
        first = True
        for ep in it:
            _check_epoch(ep)
            if first:  # resume point: after the last ack that took effect
                assert ep.time in (confirmed + 1, attempted + 1), \
                    f"resumed at {ep.time}; confirmed {confirmed}, attempted {attempted}"
                assert ep.time > confirmed, f"acked epoch {ep.time} redelivered"
                first = False
            before = sub.position
            kill_now = rng.random() < 0.25
            killer = None
            if kill_now:
                delay = rng.uniform(0, 0.004)
                killer = threading.Thread(target=lambda: (time.sleep(delay), service.kill()))
                killer.start()
            attempted = ep.time
            try:
                sub.ack(ep)
                confirmed = ep.time
                assert sub.position == (ep.time + 1,) or ep.time == n - 1
            except (CatalogUnavailable, CatalogError):
                assert sub.position == before, "a failed ack changed the subscriber's position"
            if killer is not None:
                killer.join()
                service.start()
                # retry the same ack if it failed, sometimes; otherwise abandon this subscriber
                if confirmed != ep.time and rng.random() < 0.5:
                    _ack_until_ok(sub, ep, service, deadline)
                    confirmed = ep.time
                    assert sub.position == (ep.time + 1,) or ep.time == n - 1
                if rng.random() < 0.3:
                    break  # a crashed consumer: resume in a new Subscriber
            assert time.monotonic() < deadline
        try:
            sub.close()
        except Exception:  # noqa: BLE001 - best effort
            pass
    cat = Catalog(url)
    assert cat.durable("t2", "d").position in ([n], (n,)) or \
        tuple(cat.durable("t2", "d").position) >= (n,)


def test_subscriber_killed_between_receive_and_ack_while_service_restarts(service, home):
    """A subscriber *process* receives epochs, acks some, is SIGKILLed between receive and ack
    while the service is down too; after the restart a new Subscriber(durable) resumes exactly
    after the last confirmed ack."""
    url = service.url + "?timeout=1&lease=1"
    _publish_all(url, "t3", 10)
    code = (
        "import sys, time\n"
        "from epochstream import Subscriber\n"
        "sub = Subscriber('t3', sys.argv[1], durable='d', start='earliest', timeout=5)\n"
        "for ep in sub.epochs():\n"
        "    print('got', ep.time, flush=True)\n"
        "    if ep.time == 4:\n"
        "        print('waiting', flush=True)\n"
        "        time.sleep(60)\n"
        "    sub.ack(ep)\n"
        "    print('acked', ep.time, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                            text=True, env=_env(home))
    try:
        lines = []
        while True:
            line = proc.stdout.readline().strip()
            assert line, f"subscriber ended: {lines}"
            lines.append(line)
            if line == "waiting":
                break
        assert lines[-3:] == ["acked 3", "got 4", "waiting"]
        service.kill()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    service.start()
    time.sleep(1.2)  # the dead process's lease (1 s) passes
    with Subscriber("t3", url, durable="d", timeout=5) as sub:
        got = []
        for ep in sub.epochs():
            _check_epoch(ep)
            got.append(ep.time)
            sub.ack(ep)
        assert got == list(range(4, 10))


@_THOROUGH_ONLY
def test_live_publisher_survives_service_kills_and_durable_consumer_sees_everything(service,
                                                                                     home):
    """A publisher process keeps publishing (with retention) while the service is killed and
    restarted twice; a durable subscriber acking as it goes (retrying failed acks) sees every
    epoch whole, exactly once overall, and the publisher finishes."""
    url = service.url
    epochs = 30
    pub = subprocess.Popen([sys.executable, str(PEER), "publish", url, "t4", "1", str(epochs),
                            "0.1", "retention"], stdout=subprocess.PIPE, text=True,
                           env=_env(home))
    try:
        assert pub.stdout.readline().strip() == "registered"
        sub = Subscriber("t4", url + "?timeout=1", durable="d", start="earliest", timeout=10)
        got = []
        deadline = time.monotonic() + 25
        kills = {5, 15}
        for ep in sub.epochs():
            assert list(map(list, ep.records)) == [[ep.time, 0, k] for k in range(3)]
            got.append(ep.time)
            if ep.time in kills:
                service.kill()
                time.sleep(0.3)
                service.start()
            _ack_until_ok(sub, ep, service, deadline)
            if ep.time == epochs - 1:
                break
        assert got == list(range(epochs))
        sub.close()  # (a finished publisher lingers while a subscriber is connected)
        assert pub.stdout.readline().strip() == "done"
        assert pub.wait(10) == 0
    finally:
        if pub.poll() is None:
            pub.kill()
            pub.wait()


# ---- consumer groups -----------------------------------------------------------------------

def test_group_ack_and_fetch_with_service_killed(service):
    """Consumer group through the service: kill while a lease is held (between fetch and ack)
    and during fetch/ack; failed calls raise catalog errors, every epoch is eventually acked
    exactly once-or-redelivered, never lost, every record checked."""
    url = service.url + "?timeout=1&lease=1"
    n = 10
    _publish_all(url, "t5", n)
    group = EpochGroup("t5", "g", catalog=url, ack_wait=3.0, worker="w1")
    acked: set = set()
    seen: dict = {}
    rng = random.Random(7)
    deadline = time.monotonic() + 25
    while len(acked) < n:
        assert time.monotonic() < deadline, f"stuck: acked {sorted(acked)}"
        try:
            leases = group.fetch(max_epochs=2, expires=0.5)
        except (CatalogUnavailable, CatalogError):
            if service.proc is None:
                service.start()
            continue
        for lease in leases:
            _check_epoch(lease.epoch)
            t = lease.epoch.time
            assert t not in acked, f"acked epoch {t} leased again"
            seen[t] = seen.get(t, 0) + 1
            r = rng.random()
            if r < 0.2:  # killed between lease and ack: the ack fails cleanly
                service.kill()
                t0 = time.monotonic()
                with pytest.raises(CatalogUnavailable):
                    lease.ack()
                assert time.monotonic() - t0 < 3.0
                service.start()
                if rng.random() < 0.5:  # the retry of the same ack works
                    lease.ack()
                    acked.add(t)
            elif r < 0.4:  # killed racing the ack
                delay = rng.uniform(0, 0.004)
                killer = threading.Thread(target=lambda: (time.sleep(delay), service.kill()))
                killer.start()
                try:
                    lease.ack()
                    acked.add(t)
                except (CatalogUnavailable, CatalogError):
                    pass
                killer.join()
                service.start()
            else:
                lease.ack()
                acked.add(t)
        # an ack that raised but took effect: the epoch is settled; check via the catalog
        if service.proc is not None:
            try:
                info = group.info()
            except (CatalogUnavailable, CatalogError):
                continue
            pos = info.position
            if pos:
                acked |= set(range(0, min(n, tuple(pos)[0])))
    assert group.fetch(max_epochs=1, expires=0) == []  # nothing left (and the position moves)
    info = group.info()
    assert tuple(info.position) == (n,)
    assert all(c <= 2 for c in seen.values()), seen


@_THOROUGH_ONLY
@pytest.mark.parametrize("timeout, down", [(5, 2.5)])
def test_publisher_keeps_publishing_through_an_outage_shorter_than_the_timeout(service, timeout,
                                                                                down):
    """The service is killed while idle and stays down 2.5 s (< the 5 s timeout) while a
    retention publisher goes on publishing: requests made meanwhile wait for the restart. A
    send/advance_to that fails with CatalogUnavailable (nothing changed) is retried; the publisher must keep working and close
    cleanly; afterwards the whole history is readable through a durable subscription, every
    record of every epoch."""
    url = service.url + f"?timeout={timeout}&lease=8"
    epochs = 40
    cat = Catalog(url)
    pubs = [Publisher("t6", p, catalog=cat, partitions=2, retention=Retention())
            for p in range(2)]
    failures = []

    def retry(f, *a):
        deadline = time.monotonic() + 15
        while True:
            try:
                return f(*a)
            except CatalogUnavailable as e:
                failures.append(e)
                assert time.monotonic() < deadline
                time.sleep(0.1)

    def outage():
        time.sleep(down)
        service.start()

    def publish(lo, hi):
        for e in range(lo, hi):
            for p, pub in enumerate(pubs):
                retry(pub.send, e, [[e, p, k] for k in range(3)])
                retry(pub.advance_to, e + 1)
            time.sleep(0.05)

    publish(0, 10)
    for pub in pubs:
        pub.flush()  # nothing in flight: the kill hits an idle service (see the in-flight test)
    service.kill()
    th = threading.Thread(target=outage)
    th.start()
    try:
        publish(10, epochs)  # the first requests wait for the restart (queued, not lost)
        th.join()
        for pub in pubs:
            retry(pub.close)
    finally:
        th.join()
    with Subscriber("t6", url, durable="d", start="earliest", timeout=5) as sub:
        got = []
        for ep in sub.epochs():
            _check_epoch(ep)
            got.append(ep.time)
            sub.ack(ep)
        assert got == list(range(epochs))


def test_retention_publisher_survives_a_quick_restart_with_a_commit_in_flight(service):
    """A retention publisher commits its epoch log index (history_commit) through the service
    for every epoch; the service is SIGKILLed while a commit is in flight and restarted at once
    (down ~0.5 s on a quiet machine, a few seconds on a loaded one: below the client's 10 s
    timeout, within which it resends), eight times. The publisher must keep publishing (brief:
    publishers keep publishing), and every epoch must be readable whole. (With a 3 s timeout
    the test failed once in CI under heavy load: a restart took longer than that.)"""
    url = service.url + "?timeout=10&lease=20"
    cat = Catalog(url)
    pub = Publisher("t9", 0, catalog=cat, partitions=1, retention=Retention())
    stop = threading.Event()

    def restarts():
        for _ in range(8):
            time.sleep(0.15)
            service.kill()
            service.start()
        stop.set()

    th = threading.Thread(target=restarts)
    th.start()
    e = 0
    lost = []

    def retry(f, *a):  # a catalog call of the caller's thread that failed may be retried
        for _ in range(10):
            try:
                return f(*a)
            except CatalogUnavailable as err:
                lost.append(err)
        raise AssertionError("no retry worked")

    try:
        while not stop.is_set() or e < 10:
            retry(pub.send, e, [[e, 0, k] for k in range(3)])
            retry(pub.advance_to, e + 1)
            e += 1
        pub.close()
    finally:
        th.join()
    with Subscriber("t9", url, durable="d", start="earliest", timeout=5) as sub:
        got = []
        for ep in sub.epochs():
            _check_epoch(ep, parts=1)
            got.append(ep.time)
        assert got == list(range(e))
