"""Adversarial tests of DURABLE SUBSCRIPTIONS (docs/history.md, "Durable subscriptions").

Real processes: durable subscribers are ``tests/history/durable_peer.py`` (driven line by line on
stdin, or acking on their own with ``--auto``), publishers are in-process ``Publisher`` objects
or ``tests/history/history_peer.py publish``; the CLI is ``python -m epochstream``. Processes are
killed with SIGKILL at the worst moments (right after receiving, in the middle of an ack, in
the middle of a takeover). Every delivered epoch is compared record by record with what was
published; the catalog's stored position is checked against a model of the acks after every
step: an epoch with data is "covered" by the stored state (not at or beyond the position, or
in its acked-beyond list) iff it was acked.

The promises attacked:

- acked epochs are NEVER delivered again to a later holder; unacked ones are, whole;
- ``sub.position`` is the acked frontier, also for product-order times acked out of order;
- a second live holder gets ``SubscriptionHeld`` unless ``takeover=True``; after a takeover the
  old holder is fenced (its acks refused with a clear error);
- an ack of garbage, of an epoch never delivered, or twice, is a clear error that changes
  nothing;
- ``epochstream durable reset|drop`` refuse a live holder without ``--force``, and ``reset``
  reports exactly what it skips.

Failing (bugs, kept failing on purpose): an ack of a released but never handed-out epoch is
accepted (and the epoch is then skipped for good); a refused (fenced) or failed ack still moves
the subscriber's position and makes the retry say "acked already"; a durable subscription that
acked everything of a finished run is stored at ``[]`` and never gets the next run's epochs;
``events()`` of a resumed durable subscription delivers epochs acked out of order again.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import event, note, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hypothesis_profiles import examples
from history_peer import epoch_records

from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.events import DataMessage
from epochstream.order import TOTAL, product

HERE = Path(__file__).parent
PEER = str(HERE / "durable_peer.py")
HISTORY_PEER = str(HERE / "history_peer.py")
P2 = product(2)
ENV = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb")
ENV.pop("EPOCHSTREAM_CATALOG", None)


# ---- helpers ----------------------------------------------------------------------------------


def jt(t):
    """A time (or frontier) as JSON-able lists."""
    if isinstance(t, tuple):
        return [jt(x) for x in t]
    return t


def pt(v):
    """A JSON time back as a Python time (lists become tuples)."""
    return tuple(v) if isinstance(v, list) else v


def pframe(v):
    """A JSON frontier back as a tuple of Python times."""
    return None if v is None else tuple(pt(t) for t in v)


def recs_for(t) -> list:
    """The messages (lists of records) published at time ``t``: 1-3 messages of 1-3 records,
    every record naming its time, message and index (content differs between epochs)."""
    lab = list(t) if isinstance(t, tuple) else [t]
    k = sum(lab) + 3 * lab[-1]
    return [[[*lab, m, i, "x" * ((k * 13 + m + i) % 6)] for i in range(1 + (k * 7 + m) % 3)]
            for m in range(1 + k % 3)]


def flat(t) -> list:
    return [r for msg in recs_for(t) for r in msg]


class Peer:
    """A durable_peer.py process; stdout lines are read by a thread (timeouts never hang)."""

    def __init__(self, cat, name, *args, topic="t", script=PEER):
        self.proc = subprocess.Popen(
            [sys.executable, script, str(cat), topic, name, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1, env=ENV)
        self.pid = self.proc.pid
        self.lines: queue.Queue = queue.Queue()
        self.err: list = []
        self.out: list = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _drain(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def line(self, timeout=20.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"peer {self.pid} printed nothing in {timeout} s; "
                                 f"stderr: {''.join(self.err)[-2000:]}") from None
        if line is None:
            self.lines.put(None)
            raise AssertionError(f"peer {self.pid} exited (rc={self.proc.poll()}); "
                                 f"stderr: {''.join(self.err)[-2000:]}")
        self.out.append(line)
        return line

    def word(self, timeout=20.0) -> tuple[str, str]:
        w, _, rest = self.line(timeout).partition(" ")
        return w, rest

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def ask(self, text: str, timeout=20.0) -> tuple[str, str]:
        self.send(text)
        return self.word(timeout)

    def all_lines(self, timeout=30.0) -> list[str]:
        """Every line until the process exits."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"peer {self.pid} did not end in {timeout} s: {out[-5:]}")
            if line is None:
                self.lines.put(None)
                self.proc.wait(10)
                return out
            self.out.append(line)
            out.append(line)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout=10) -> int:
        return self.proc.wait(timeout)


def parse_got(rest: str):
    t, _, recs = rest.partition(" ")
    return pt(json.loads(t)), json.loads(recs)


def covered(order, info, t) -> bool:
    """Whether the stored state of a durable subscription says ``t`` was acked: ``t`` is not at
    or beyond its position, or is in its acked-beyond list."""
    if info is None or info.position is None:
        return False
    return not any(order.le(a, t) for a in info.position) or t in info.acked


def state(cat, name="d", topic="t"):
    info = cat.durable(topic, name)
    return None if info is None else (info.position, info.acked, info.acked_at, info.state)


def cli(cat_dir, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "epochstream", *map(str, args), "--catalog",
                           str(cat_dir)], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def publish_total(pub, times):
    for t in times:
        for msg in recs_for(t):
            pub.send(t, msg)
        pub.advance_to(t + 1)
    pub.flush()


@contextlib.contextmanager
def peers():
    """Collects Peer objects and kills every one left at the end."""
    made: list = []
    try:
        yield made
    finally:
        for p in made:
            p.kill()


# ---- 1. the stateful attack ------------------------------------------------------------------


class Consumer:
    def __init__(self, peer, start_acked):
        self.peer = peer
        self.start_acked = frozenset(start_acked)  # acked when this session claimed the name
        self.delivered: list = []
        self.unacked: list = []
        self.acked: list = []
        self.closed = False
        self.dead = False  # killed by the test (the model's view, not polled)

    def kill(self):
        self.peer.kill()
        self.dead = True


GARBAGE_TOTAL = ["None", "'0'", "'1'", "0.0", "1.5", "float('nan')", "float('inf')", "True",
                 "False", "b'\\x00'", "bytearray(b'1')", "[0]", "(0,)", "[]", "{}", "{0}",
                 "object()", "1j", "2**64", "-2**63-1", "-1", "10**6", "Ellipsis", "int",
                 "(0, 0)"]
GARBAGE_P2 = ["0", "1", "(0,)", "(0, 0, 0)", "(0.0, 0)", "(True, 0)", "(0, None)", "'00'",
              "[[0, 0]]", "((0, 0),)", "(2**64, 0)", "(-2**63-1, 0)", "(500, 500)", "(-1, 0)",
              "{(0, 0)}", "None", "float('nan')", "object()", "{}", "[]"]


class DurableMachine(RuleBasedStateMachine):
    """One topic (TOTAL or product(2), 1 or 2 partitions, with retention) published in steps by
    in-process publishers (product: some steps complete (k, 0) before (k, 1); two partitions:
    partition 1 may lag behind partition 0); at most two durable-subscriber processes of the name "d" at a time, spawned
    with and without takeover, reading, acking (in random, out-of-order choices), acking
    garbage, acking twice, killed with SIGKILL (right after receiving, in the middle of an ack,
    in the middle of a takeover) or closed. A model of the acks checks each answer, each
    delivered epoch (whole, in order, never one acked before its session began) and, after
    every step, the catalog's stored state."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="adv-durable-")
        self.cat = Catalog(self.dir)
        self.pub = None
        self.consumers: list[Consumer] = []
        self.all_peers: list[Peer] = []
        self.holder: Consumer | None = None
        self.acked: set = set()
        self.data: dict = {}
        self.steps = 0  # since the last fresh session

    # -- the publishers
    @initialize(order=st.sampled_from(["total", "product"]), parts=st.sampled_from([1, 1, 2]),
                first=st.integers(1, 3))
    def start(self, order, parts, first):
        """``parts`` partitions, one in-process publisher each (message ``m`` of a time goes to
        partition ``m % parts``); with two, partition 1 may lag behind partition 0, so that a
        subscriber joins (resumes) while an epoch is complete in one log and not the other."""
        self.order = TOTAL if order == "total" else P2
        self.pubs = [Publisher("t", p, catalog=self.cat, order=self.order, partitions=parts,
                               retention=Retention(), heartbeat_interval=0.2)
                     for p in range(parts)]
        self.pub = self.pubs[0]
        self.lowers = [[self.order.minimum] for _ in range(parts)]
        self.k = 0
        self.split = None
        self._publish(first, False)
        self.spawn(False)  # a first holder, at "earliest"

    def _publish(self, n, split, lag=False):
        pubs, order = self.pubs, self.order
        for _ in range(n):
            k = self.k
            self.k += 1
            times = [k] if order is TOTAL else [(k, 0), (k, 1)]
            for t in times:
                for m, msg in enumerate(recs_for(t)):
                    pubs[m % len(pubs)].send(t, msg)
                self.data[t] = flat(t)
            nxt = k + 1 if order is TOTAL else (k + 1, 0)
            if len(pubs) == 2:  # partition 1 lags (or catches up)
                for p in (0,) if lag else (0, 1):
                    pubs[p].advance_to(nxt)
                    self.lowers[p] = [nxt]
                continue
            pub = pubs[0]
            if order is TOTAL:
                pub.advance_to(nxt)
                self.lowers[0] = [nxt]
                continue
            if self.split is not None:  # complete the (k-1, 1) held back by the last split
                pub.progress([((self.split, 1), -1)])
                self.split = None
                self.lowers[0] = [(k, 0)]
            if split:  # (k, 0) complete now, (k, 1) only at the next step
                pub.progress([((k, 1), 1), ((k + 1, 0), 1), ((k, 0), -1)])
                self.split = k
                self.lowers[0] = [(k, 1), (k + 1, 0)]
            else:
                pub.advance_to(nxt)
                self.lowers[0] = [nxt]
        for pub in pubs:
            pub.flush()

    def complete(self) -> set:
        return {t for t in self.data
                if not any(self.order.le(l, t) for lower in self.lowers for l in lower)}

    def same(self, records, t) -> bool:
        """An epoch's records are exactly those published (in order with one partition; as a
        multiset with two: the partitions' messages interleave)."""
        want = self.data[t]
        if len(self.pubs) == 1:
            return records == want
        return sorted(map(json.dumps, records)) == sorted(map(json.dumps, want))

    def live(self) -> list[Consumer]:
        return [c for c in self.consumers if not c.dead and not c.closed]

    def remaining(self, c: Consumer) -> set:
        return self.complete() - c.start_acked - set(c.delivered)

    def is_holder(self, c: Consumer) -> bool:
        return self.holder is c and not c.dead and not c.closed

    def _spawn(self, takeover: bool) -> Peer:
        args = ["--start", '"earliest"'] + (["--takeover"] if takeover else [])
        p = Peer(self.dir, "d", *args)
        self.all_peers.append(p)
        return p

    # -- the one rule: a weighted choice of actions (Hypothesis' swarm testing of separate
    # rules left most examples with no acks at all). Whether an ack cut by SIGKILL, or a claim,
    # committed depends on timing and changes the model, so every step draws the same values
    # whatever the state (an action and eight integers, each taken modulo what it picks from),
    # else Hypothesis reports inconsistent data generation. ``note`` says what each step did.
    ACTIONS = ["publish"] * 2 + ["spawn"] * 2 + ["next"] * 4 + ["ack"] * 3 + \
        ["bad_ack", "stop", "fresh"]

    def applicable(self, action) -> bool:
        live = self.live()
        return {"publish": True, "spawn": len(live) < 2, "next": bool(live),
                "ack": any(c.unacked for c in live), "bad_ack": bool(live), "stop": bool(live),
                "fresh": self.steps >= 8}[action]

    @rule(action=st.integers(0, 999), p=st.lists(st.integers(0, 999), min_size=8, max_size=8))
    def act(self, action, p):
        name = self.ACTIONS[action % len(self.ACTIONS)]
        if not self.applicable(name):
            name = "spawn" if self.applicable("spawn") and not self.live() else "publish"
        getattr(self, "do_" + name)(p)

    def name_of(self, c) -> str:
        return f"consumer {self.consumers.index(c)} (pid {c.peer.pid})"

    def do_publish(self, p):
        n, split, lag = 1 + p[0] % 3, bool(p[1] % 2), bool(p[2] % 2)
        note(f"publish {n} step(s), split={split}, lag={lag}")
        self._publish(n, split, lag)

    def do_spawn(self, p):
        takeover = [True, True, False][p[0] % 3]
        kill_after = ([None] * 8 + [0.0, 0.05, 0.12, 0.2, 0.3])[p[1] % 13]
        note(f"spawn takeover={takeover} kill_after={kill_after}")
        self.spawn(takeover, kill_after)

    def spawn(self, takeover, kill_after=None):
        """A new subscriber of "d" (SubscriptionHeld without takeover while a live subscriber
        holds it); ``kill_after``: SIGKILL it that many seconds after it started, in the middle
        of its claim or not."""
        held_by_live = self.holder is not None and self.is_holder(self.holder)
        acked_now = set(self.acked)
        before = self.cat.durable("t", "d")
        p = self._spawn(takeover)
        if kill_after is not None:
            time.sleep(kill_after)
            p.kill()
            info = self.cat.durable("t", "d")
            if info is not None and info.holder_pid == p.pid:  # its claim committed
                assert takeover or not held_by_live, "claimed a name a live subscriber holds"
                self.holder = None  # the old holder is fenced; the name's holder is dead
                event("killed mid-claim: after the claim committed")
            else:
                assert (None if info is None else info.holder) == \
                    (None if before is None else before.holder), "a dead claim changed the holder"
                event("killed mid-claim: before the claim")
            return
        w, rest = p.word()
        if held_by_live and not takeover:
            assert w == "SubscriptionHeld", (w, rest)
            assert "takeover=True" in rest
            assert p.wait() == 2
            return
        assert w == "held", (w, rest)
        info = self.cat.durable("t", "d")
        assert pframe(json.loads(rest)) == info.position
        assert info.holder_pid == p.pid
        if held_by_live:
            event("takeover of a live holder")
        c = Consumer(p, acked_now)
        self.consumers.append(c)
        self.holder = c

    def do_next(self, p):
        """Receive 1-3 epochs; after each, maybe ack one received epoch (any of them)."""
        live = self.live()
        c = live[p[0] % len(live)]
        n, look = 1 + p[1] % 3, p[2] % 4
        note(f"next x{n} on {self.name_of(c)}")
        for i in range(n):
            if not self.remaining(c):
                if look == 0:  # nothing may come: not an acked one again
                    w, rest = c.peer.ask("next 0.3")
                    assert w == "none", (w, rest, "expected nothing", c.delivered, self.acked)
                return
            self.next_epoch_of(c)
            if p[3 + i] % 2:
                self._ack(c, c.unacked[p[6] % len(c.unacked)])

    def next_epoch_of(self, c):
        todo = self.remaining(c)
        w, rest = c.peer.ask("next 10")
        assert w == "got", (w, rest, todo)
        t, records = parse_got(rest)
        assert t not in c.start_acked, f"epoch {t} acked before this session began came again"
        assert t not in c.delivered, f"epoch {t} delivered twice in one session"
        assert t in todo, (t, todo)
        assert not any(self.order.lt(r, t) for r in todo), (t, todo)  # the partial order
        assert self.same(records, t), f"epoch {t} not whole/exact: {records}"
        c.delivered.append(t)
        c.unacked.append(t)

    def do_ack(self, p):
        """Ack 1-3 received epochs, in any order; ``kill_after``: send the last ack and
        SIGKILL the subscriber that many seconds later, maybe in the middle of its catalog
        write."""
        some = [c for c in self.live() if c.unacked]
        c = some[p[0] % len(some)]
        n = 1 + p[1] % 3
        kill_after = ([None] * 6 + [0.0, 0.0005, 0.002, 0.005, 0.02])[p[2] % 11]
        for i in range(n):
            if not c.unacked:
                return
            t = c.unacked[p[3 + i] % len(c.unacked)]  # any order: out of order too
            if kill_after is not None and i == n - 1:
                note(f"ack {t} on {self.name_of(c)}, SIGKILL after {kill_after} s")
                self._ack_and_kill(c, t, kill_after)
            else:
                note(f"ack {t} on {self.name_of(c)}")
                self._ack(c, t)

    def _ack(self, c, t):
        holds = self.is_holder(c)
        before = state(self.cat)
        c.unacked.remove(t)
        w, rest = c.peer.ask("ack " + json.dumps(jt(t)))
        if holds:
            assert w == "acked", (w, rest)
            if any(self.order.lt(u, t) for u in self.complete() - self.acked):
                event("ack out of order")
            self.acked.add(t)
            c.acked.append(t)
        else:
            assert w == "fenced", (w, rest)
            assert "no longer holds it" in rest
            assert state(self.cat) == before, "a fenced ack changed the stored position"
            event("ack refused: fenced")

    def _ack_and_kill(self, c, t, kill_after):
        holds = self.is_holder(c)
        before = self.cat.durable("t", "d")
        c.unacked.remove(t)
        c.peer.send("ack " + json.dumps(jt(t)))
        time.sleep(kill_after)
        c.kill()
        after = self.cat.durable("t", "d")
        for u in self.data:
            if u != t:
                assert covered(self.order, before, u) == covered(self.order, after, u), \
                    f"the ack of {t}, cut by SIGKILL, changed whether {u} is acked"
        if covered(self.order, after, t) and not covered(self.order, before, t):
            assert holds, "a fenced subscriber's ack was stored"
            self.acked.add(t)
        event(f"ack cut by SIGKILL: {'stored' if t in self.acked else 'not stored'}"
              f"{'' if holds else ' (fenced)'}")

    def do_bad_ack(self, p):
        """Ack garbage of any type, a time never delivered (not complete yet), or an epoch
        acked already: a ValueError that changes nothing."""
        live = self.live()
        c = live[p[0] % len(live)]
        values = (GARBAGE_TOTAL if self.order is TOTAL else GARBAGE_P2) + \
            [repr(t) for t in c.acked]
        expr = values[p[1] % len(values)]
        note(f"ack {expr} on {self.name_of(c)}")
        before = state(self.cat)
        pos = c.peer.ask("pos")
        w, rest = c.peer.ask("ackpy " + expr)
        assert (w, rest.split(" ")[0]) == ("error", "ValueError"), (expr, w, rest)
        assert state(self.cat) == before, expr
        assert c.peer.ask("pos") == pos, expr

    def do_stop(self, p):
        live = self.live()
        c = live[p[0] % len(live)]
        how = ["kill", "close"][p[1] % 2]
        note(f"{how} {self.name_of(c)}")
        if how == "kill":
            c.kill()
            return
        assert c.peer.ask("close") == ("closed", "")
        c.closed = True
        c.peer.wait()
        if self.holder is c:
            self.holder = None
            assert self.cat.durable("t", "d").holder is None

    def do_fresh(self, p):
        """Kill everyone; a new holder (no takeover needed) delivers every complete epoch not
        acked, whole, then nothing."""
        for c in self.live():
            c.kill()
        self.spawn(False)
        c = self.consumers[-1]
        assert self.holder is c
        while self.remaining(c):
            self.next_epoch_of(c)
        w, rest = c.peer.ask("next 0.3")
        assert w == "none", (w, rest)
        assert set(c.delivered) == self.complete() - self.acked
        self.steps = 0

    # -- the stored state, after every step
    @invariant()
    def stored_state_is_exactly_the_acks(self):
        if self.pub is None:
            return
        self.steps += 1
        info = self.cat.durable("t", "d")
        if info is None:
            assert not self.acked
            return
        assert info.state == "active"
        for t in self.data:
            assert covered(self.order, info, t) == (t in self.acked), (
                f"epoch {t}: stored {info.position} acked-beyond {info.acked}, "
                f"acked {sorted(self.acked)}")
        assert set(info.acked) <= self.acked

    def teardown(self):
        for p in self.all_peers:
            p.kill()
        for pub in getattr(self, "pubs", []):
            pub.close(linger=1, wait=True)
        shutil.rmtree(self.dir, ignore_errors=True)


DurableMachine.TestCase.settings = settings(max_examples=examples(5), stateful_step_count=30,
                                            deadline=None)
TestDurableStateful = DurableMachine.TestCase


# ---- 2. an ack of an epoch never delivered ----------------------------------------------------


def test_ack_of_an_epoch_released_but_never_handed_out_is_refused(tmp_path):
    """Epochs 0..5 are complete (replayed from the log). The consumer has received epoch 0
    only; an ack of epoch 4, which it never received, must be refused and change nothing —
    else a crash then makes epoch 4 skipped for good: never delivered to anyone."""
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(6))
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[0]")
            w, rest = a.ask("next 10")
            assert (w, parse_got(rest)) == ("got", (0, flat(0)))
            before = state(cat)
            answer = a.ask("ack 4")
            a.kill()  # crashes before it ever sees epoch 4
            assert not covered(TOTAL, cat.durable("t", "d"), 4), \
                f"the ack of never-delivered epoch 4 was stored ({answer})"
            assert answer[0] == "error" and answer[1].startswith("ValueError"), answer
            assert state(cat) == before
            b = Peer(tmp_path, "d")
            made.append(b)
            assert b.word() == ("held", "[0]")
            for t in range(6):  # all of them, 4 included, whole
                w, rest = b.ask("next 10")
                assert (w, parse_got(rest)) == ("got", (t, flat(t)))
        finally:
            pub.close(linger=1, wait=True)


# ---- 3. a refused ack changes nothing ---------------------------------------------------------


def test_fenced_ack_changes_nothing_and_is_refused_again(tmp_path):
    """A holds, has acked 0 and received 1; B takes over. A's ack of 1 is refused
    (SubscriptionHeld) — and must change nothing: A's position stays the stored one, and
    acking 1 again is refused the same way (not "acked already")."""
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(4))
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[0]")
            assert parse_got(a.ask("next 10")[1]) == (0, flat(0))
            assert a.ask("ack 0") == ("acked", "0")
            assert parse_got(a.ask("next 10")[1]) == (1, flat(1))
            assert a.ask("pos") == ("pos", "[1]")
            b = Peer(tmp_path, "d", "--takeover")
            made.append(b)
            assert b.word() == ("held", "[1]")
            before = state(cat)
            w, rest = a.ask("ack 1")
            assert w == "fenced" and "another subscriber took it over" in rest, (w, rest)
            assert state(cat) == before
            assert a.ask("pos") == ("pos", "[1]"), "a refused ack moved the fenced position"
            w, rest = a.ask("ack 1")
            assert w == "fenced", f"second ack of 1 after the refusal: {w} {rest}"
            # B gets 1 again, whole
            assert parse_got(b.ask("next 10")[1]) == (1, flat(1))
            assert b.ask("ack 1") == ("acked", "1")
            assert cat.durable("t", "d").position == (2,)
        finally:
            pub.close(linger=1, wait=True)


def test_ack_that_failed_on_a_busy_catalog_changes_nothing(tmp_path):
    """An ack that cannot be written (the catalog is locked by another process for longer
    than the busy timeout) raises — and must change nothing: the position stays, and the same
    ack succeeds once the catalog is free."""
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(3))
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[0]")
            assert parse_got(a.ask("next 10")[1]) == (0, flat(0))
            pub.flush()
            lock = sqlite3.connect(cat.path, timeout=10, isolation_level=None)
            try:
                lock.execute("BEGIN IMMEDIATE")  # another writer holds the catalog
                w, rest = a.ask("ack 0", timeout=30)
                assert (w, rest.split(" ")[0]) == ("error", "CatalogError"), (w, rest)
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            assert cat.durable("t", "d").position == (0,)
            assert a.ask("pos") == ("pos", "[0]"), "a failed ack moved the position"
            assert a.ask("ack 0") == ("acked", "0"), "the retried ack was refused"
            assert cat.durable("t", "d").position == (1,)
        finally:
            pub.close(linger=1, wait=True)


# ---- 4. a durable subscription across publisher runs ----------------------------------------


def _publish_run(cat_dir, *args):
    p = subprocess.run([sys.executable, HISTORY_PEER, "publish", str(cat_dir), "t", *map(str, args)],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 0 and "closed" in p.stdout, p.stderr
    return p.stdout


def _auto(cat_dir, *args):
    p = Peer(cat_dir, "d", "--auto", "--idle", "2", *args)
    lines = p.all_lines()
    assert lines[0].startswith("held"), lines
    got = [parse_got(l.split(" ", 1)[1]) for l in lines if l.startswith("got ")]
    acked = [json.loads(l.split(" ")[1]) for l in lines if l.startswith("acked ")]
    return lines[0], got, acked, lines[-1]


def test_durable_subscription_goes_on_when_the_topic_goes_on(tmp_path):
    """README: run publish.py again and the topic goes on at the next epoch; billing.py (a
    durable subscriber) run again "goes on at the first epoch it had not acked". A durable
    subscription that acked everything of the first run must get the second run's epochs."""
    cat = tmp_path / "cat"
    out = _publish_run(cat, "--last", 3)
    assert out.startswith("ready")
    held, got, acked, done = _auto(cat, "--start", '"earliest"')
    want = lambda t: [list(r) for r in epoch_records(t, 2, 3)]
    assert got == [(t, want(t)) for t in range(3)] and acked == [0, 1, 2]
    out = _publish_run(cat, "--resume", "--last", 6)  # goes on at epoch 3
    assert out.split()[2] == "[3]", out
    assert [(e.time, [list(r) for r in e.records]) for e in History("t", Catalog(cat)).epochs()] \
        == [(t, want(t)) for t in range(6)]  # the log has every epoch of both runs
    held, got, acked, done = _auto(cat)
    assert [t for t, _ in got] == [3, 4, 5], (
        f"resumed with {held!r}: the epochs of the second run were never delivered ({done})")
    assert got == [(t, want(t)) for t in (3, 4, 5)]


# ---- 5. many processes racing for one name ----------------------------------------------------


def test_racing_claims_without_takeover_leave_exactly_one_holder(tmp_path):
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(5))
            for round_, want_pos in ((0, "[0]"), (1, "[1]")):
                racers = [Peer(tmp_path, "d") for _ in range(4)]
                made.extend(racers)
                first = [r.word() for r in racers]
                winners = [r for r, (w, _) in zip(racers, first) if w == "held"]
                assert len(winners) == 1, first
                assert sorted(w for w, _ in first) == ["SubscriptionHeld"] * 3 + ["held"]
                assert all(r.wait() == 2 for r in racers if r is not winners[0])
                win = winners[0]
                assert first[racers.index(win)][1] == want_pos
                assert cat.durable("t", "d").holder_pid == win.pid
                if round_ == 0:
                    assert parse_got(win.ask("next 10")[1]) == (0, flat(0))
                    assert win.ask("ack 0") == ("acked", "0")
                    assert parse_got(win.ask("next 10")[1]) == (1, flat(1))
                    win.kill()  # right after receiving 1, before acking it
                else:
                    for t in range(1, 5):
                        assert parse_got(win.ask("next 10")[1]) == (t, flat(t))
                    assert win.ask("next 0.3")[0] == "none"
        finally:
            pub.close(linger=1, wait=True)


def test_racing_takeovers_fence_all_but_one_and_lose_nothing(tmp_path):
    """Three subscribers take the name over from each other while epochs stream in live, each
    acking every epoch it gets. No epoch is acked by two of them (the fenced ones' acks are
    refused), exactly one is never fenced, the stored state is exactly the union of their acks,
    and a later holder gets exactly the rest, whole."""
    cat = Catalog(tmp_path)
    rnd = random.Random(7)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(3))
            first = Peer(tmp_path, "d", "--auto", "--idle", "2")
            made.append(first)
            assert first.word()[0] == "held"
            stop = threading.Event()
            sent = []

            def stream():
                t = 3
                while not stop.is_set() and t < 80:
                    publish_total(pub, [t])
                    sent.append(t)
                    t += 1
                    time.sleep(0.02)

            th = threading.Thread(target=stream, daemon=True)
            th.start()
            others = []
            for _ in range(3):
                time.sleep(rnd.uniform(0.05, 0.3))
                p = Peer(tmp_path, "d", "--auto", "--idle", "2", "--takeover")
                made.append(p)
                others.append(p)
            for p in others:
                assert p.word()[0] == "held"
            th.join(30)
            stop.set()
            runs = {p: p.all_lines() for p in [first] + others}
            acked_by = {}
            never_fenced = []
            for p, lines in runs.items():
                got = [parse_got(l.split(" ", 1)[1]) for l in lines if l.startswith("got ")]
                for t, recs in got:
                    assert recs == flat(t), (t, recs)
                times = [t for t, _ in got]
                assert times == sorted(set(times)), times
                fenced_at = next((i for i, l in enumerate(lines) if l.startswith("fenced")), None)
                acks = [json.loads(l.split(" ")[1]) for l in lines if l.startswith("acked ")]
                if fenced_at is None:
                    never_fenced.append(p)
                else:
                    assert not any(l.startswith("acked") for l in lines[fenced_at:])
                for t in acks:
                    assert t not in acked_by, f"epoch {t} acked by two holders"
                    acked_by[t] = p
            assert len(never_fenced) == 1, [runs[p][-3:] for p in runs]
            info = cat.durable("t", "d")
            everything = list(range(3)) + sent
            for t in everything:
                assert covered(TOTAL, info, t) == (t in acked_by), (t, info)
            last = Peer(tmp_path, "d", "--auto", "--idle", "1")
            made.append(last)
            lines = last.all_lines()
            got = [parse_got(l.split(" ", 1)[1]) for l in lines if l.startswith("got ")]
            assert got == [(t, flat(t)) for t in everything if t not in acked_by]
        finally:
            pub.close(linger=1, wait=True)


# ---- 6. SIGKILL in the middle of a stream of acks --------------------------------------------


def test_kill9_in_the_middle_of_acking_never_loses_or_redelivers(tmp_path):
    """A subscriber acks every epoch as fast as it can and is killed at a random moment,
    five times over; each session gets exactly the epochs not acked before it (whole, in
    order), at most the one epoch whose ack was cut short is in doubt, and a last session gets
    exactly the rest."""
    cat = Catalog(tmp_path)
    rnd = random.Random(11)
    everything = list(range(700))
    acked: set = set()
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, everything)
            for round_ in range(5):
                p = Peer(tmp_path, "d", "--auto", "--idle", "2", "--ack-delay", "0.002")
                made.append(p)
                w, rest = p.word()
                assert w == "held", (w, rest)
                time.sleep(rnd.uniform(0.05, 0.3))
                p.kill()
                lines = []
                while True:
                    try:
                        line = p.lines.get(timeout=5)
                    except queue.Empty:
                        break
                    if line is None:
                        break
                    lines.append(line)
                got = [parse_got(l.split(" ", 1)[1]) for l in lines
                       if l.startswith("got ") and l.count(" ") >= 2]
                acks = [json.loads(l.split(" ")[1]) for l in lines if l.startswith("acked ")]
                due = [t for t in everything if t not in acked]
                assert [t for t, _ in got] == due[:len(got)]
                assert 0 < len(got) < len(due), "killed before it got anything, or after the end"
                for t, recs in got:
                    assert recs == flat(t)
                info = cat.durable("t", "d")
                now = {t for t in everything if covered(TOTAL, info, t)}
                doubt = now - acked - set(acks)
                assert set(acks) <= now and acked <= now, "a printed ack was lost"
                assert doubt <= {t for t, _ in got[-1:]}, (doubt, got[-2:], acks[-2:])
                assert now <= acked | {t for t, _ in got}, "an epoch never received is acked"
                acked = now
            last = Peer(tmp_path, "d", "--auto", "--idle", "1")
            made.append(last)
            lines = last.all_lines()
            got = [parse_got(l.split(" ", 1)[1]) for l in lines if l.startswith("got ")]
            assert got == [(t, flat(t)) for t in everything if t not in acked]
        finally:
            pub.close(linger=1, wait=True)


# ---- 7. garbage acks --------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["total", "product"])
def test_garbage_acks_are_a_clear_error_and_change_nothing(tmp_path, order):
    o = TOTAL if order == "total" else P2
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, order=o, retention=Retention(), heartbeat_interval=0.2)
        try:
            if o is TOTAL:
                publish_total(pub, range(3))
                t0, t1 = 0, 1
            else:
                for t in [(0, 0), (0, 1), (1, 0)]:
                    for msg in recs_for(t):
                        pub.send(t, msg)
                pub.advance_to((2, 0))
                pub.flush()
                t0, t1 = (0, 0), (0, 1)
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word()[0] == "held"
            w, rest = a.ask("ackepoch")  # no epoch received yet: ack(None)
            assert (w, rest.split(" ")[0]) == ("error", "ValueError"), (w, rest)
            assert parse_got(a.ask("next 10")[1]) == (t0, flat(t0))
            assert parse_got(a.ask("next 10")[1]) == (t1, flat(t1))
            assert a.ask("ack " + json.dumps(jt(t1)))[0] == "acked"  # out of order
            before, pos = state(cat), a.ask("pos")
            for expr in (GARBAGE_TOTAL if o is TOTAL else GARBAGE_P2) + [repr(t1), repr(t1)]:
                w, rest = a.ask("ackpy " + expr)
                assert (w, rest.split(" ")[0]) == ("error", "ValueError"), (expr, w, rest)
                assert state(cat) == before, expr
                assert a.ask("pos") == pos, expr
            w, rest = a.ask("ackepoch")  # the Epoch object of t1, acked already
            assert (w, rest.split(" ")[0]) == ("error", "ValueError"), (w, rest)
            assert state(cat) == before
            assert a.ask("ack " + json.dumps(jt(t0)))[0] == "acked"  # a real ack still works
            info = cat.durable("t", "d")
            assert all(covered(o, info, t) for t in (t0, t1))
            assert not covered(o, info, (1, 0) if o is not TOTAL else 2)
        finally:
            pub.close(linger=1, wait=True)


# ---- 8. the command line against a live holder ------------------------------------------------


def _ls(cat_dir):
    p = cli(cat_dir, "durable", "ls", "t", "--json")
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def test_cli_reset_and_drop_of_a_live_holder(tmp_path):
    """``durable reset|drop`` refuse a name a live process holds (status 1, nothing changed);
    with ``--force`` they fence it (its next ack is refused, saying why), ``reset`` says
    exactly which retained epochs it skips (not the ones acked out of order) or delivers
    again, and the next holder starts exactly there."""
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(8))
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[0]")
            for t in range(3):
                assert parse_got(a.ask("next 10")[1]) == (t, flat(t))
            assert a.ask("ack 0") == ("acked", "0")
            assert a.ask("ack 2") == ("acked", "2")  # out of order: 1 is not acked
            before = cat.durable("t", "d")
            assert (before.position, before.acked, before.holder_pid) == ((1,), (2,), a.pid)
            assert [(d["position"], d["acked"], d["holder_pid"], d["holder_alive"])
                    for d in _ls(tmp_path)] == [([1], [2], a.pid, True)]
            for cmd in (["reset", "t", "d", "--to", "4"], ["drop", "t", "d"]):
                p = cli(tmp_path, "durable", *cmd)
                assert p.returncode == 1, (cmd, p.stdout, p.stderr)
                assert f"is held by a live subscriber (pid {a.pid}" in p.stderr, p.stderr
                assert cat.durable("t", "d") == before, cmd
            p = cli(tmp_path, "durable", "reset", "t", "d", "--to", "4", "--force")
            assert p.returncode == 0, p.stderr
            assert p.stdout.splitlines() == [
                "reset 'd' of topic 't' from [1] to [4]: epochs at or beyond [1] and not at or "
                "beyond [4] will not be delivered (2 retained epoch(s): 1, 3)"]
            after = cat.durable("t", "d")
            assert (after.position, after.acked, after.holder) == ((4,), (), None)
            w, rest = a.ask("ack 1")  # fenced by the reset
            assert w == "fenced" and "reset" in rest, (w, rest)
            assert cat.durable("t", "d").position == (4,)
            b = Peer(tmp_path, "d")  # free: no takeover needed
            made.append(b)
            assert b.word() == ("held", "[4]")
            for t in (4, 5):
                assert parse_got(b.ask("next 10")[1]) == (t, flat(t))
            assert b.ask("ack 4") == ("acked", "4")
            p = cli(tmp_path, "durable", "drop", "t", "d", "--force")
            assert p.returncode == 0, p.stderr
            assert p.stdout.splitlines() == [
                "dropped durable subscription 'd' of topic 't' (it was at [5])"]
            assert cat.durable("t", "d") is None and _ls(tmp_path) == []
            w, rest = b.ask("ack 5")
            assert w == "fenced" and "dropped" in rest, (w, rest)
            assert cat.durable("t", "d") is None, "a dropped subscription came back by an ack"
            a.kill()
            b.kill()
            c = Peer(tmp_path, "d", "--start", "6")  # a new one, at its own start
            made.append(c)
            assert c.word() == ("held", "[6]")
            assert parse_got(c.ask("next 10")[1]) == (6, flat(6))
            assert c.ask("ack 6") == ("acked", "6")
            assert c.ask("close") == ("closed", "")
            p = cli(tmp_path, "durable", "reset", "t", "d", "--to", "2")  # free: no --force
            assert p.returncode == 0, p.stderr
            assert p.stdout.splitlines() == [
                "reset 'd' of topic 't' from [7] to [2]: epochs at or beyond [2] and not at or "
                "beyond [7] will be delivered again (5 retained epoch(s): 2, 3, 4, 5, 6)"]
            d = Peer(tmp_path, "d")
            made.append(d)
            assert d.word() == ("held", "[2]")
            for t in range(2, 8):
                assert parse_got(d.ask("next 10")[1]) == (t, flat(t))
            assert d.ask("next 0.3")[0] == "none"
        finally:
            pub.close(linger=1, wait=True)


def test_cli_reset_report_for_product_times_acked_out_of_order(tmp_path):
    cat = Catalog(tmp_path)
    grid = [(a, b) for a in range(3) for b in range(3)]
    with peers() as made:
        pub = Publisher("t", catalog=cat, order=P2, retention=Retention(), heartbeat_interval=0.2)
        try:
            for t in grid:
                for msg in recs_for(t):
                    pub.send(t, msg)
            pub.advance_to((3, 0))
            pub.flush()
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[[0,0]]")
            got = [parse_got(a.ask("next 10")[1]) for _ in grid]
            assert sorted(t for t, _ in got) == grid
            assert all(recs == flat(t) for t, recs in got)
            for t in [(2, 2), (0, 1), (1, 0), (0, 0), (0, 2)]:
                assert a.ask("ack " + json.dumps(list(t)))[0] == "acked"
            # unacked: (1, 1), (1, 2), (2, 0), (2, 1); (2, 2) acked beyond the position
            assert a.ask("pos") == ("pos", "[[1,1],[2,0]]")
            info = cat.durable("t", "d")
            assert (set(info.position), info.acked) == ({(1, 1), (2, 0)}, ((2, 2),))
            p = cli(tmp_path, "durable", "reset", "t", "d", "--to", "2,1", "--force")
            assert p.returncode == 0, p.stderr
            assert p.stdout.splitlines() == [
                "reset 'd' of topic 't' from [(1, 1), (2, 0)] to [(2, 1)]: epochs at or beyond "
                "[(1, 1), (2, 0)] and not at or beyond [(2, 1)] will not be delivered "
                "(3 retained epoch(s): (1, 1), (1, 2), (2, 0))",
                "epochs acked out of order ((2, 2)) will be delivered again"]
            a.kill()
            b = Peer(tmp_path, "d")
            made.append(b)
            assert b.word() == ("held", "[[2,1]]")
            for t in [(2, 1), (2, 2)]:
                assert parse_got(b.ask("next 10")[1]) == (t, flat(t))
            assert b.ask("next 0.3")[0] == "none"
        finally:
            pub.close(linger=1, wait=True)


# ---- 9. events() of a durable subscription ----------------------------------------------------


def test_events_of_a_resumed_durable_subscription_skip_what_was_acked(tmp_path):
    """A durable session acks 0 and 2 (not 1). The next session reads with events(): the
    messages of epoch 2, acked, must not be delivered again (epochs() skips it)."""
    cat = Catalog(tmp_path)
    with peers() as made:
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, range(4))
            a = Peer(tmp_path, "d")
            made.append(a)
            assert a.word() == ("held", "[0]")
            for t in range(3):
                assert parse_got(a.ask("next 10")[1]) == (t, flat(t))
            assert a.ask("ack 0") == ("acked", "0")
            assert a.ask("ack 2") == ("acked", "2")
            a.kill()
            with Subscriber("t", cat, durable="d", timeout=5) as sub:
                assert sub.position == (1,)
                got: dict = {}
                for m in sub.events(timeout=1):
                    if isinstance(m, DataMessage):
                        got.setdefault(m.time, []).extend(m.data)
                    if set(got) >= {1, 3}:
                        break
            assert 2 not in got, "an acked epoch was delivered again by events()"
            assert {t: [list(r) for r in recs] for t, recs in got.items()} == \
                {1: flat(1), 3: flat(3)}
        finally:
            pub.close(linger=1, wait=True)


# ---- 10. tail --durable killed in the middle of its output ------------------------------------


def test_tail_durable_killed_mid_output_prints_every_acked_epoch_whole(tmp_path):
    """``epochstream tail --durable --records --json`` writes each epoch's records, then acks
    it. Killed (SIGKILL) at random moments: every epoch the catalog counts as acked was written
    whole before, and the next runs print exactly the others, whole."""
    cat = Catalog(tmp_path)
    rnd = random.Random(5)
    everything = list(range(1500))
    acked: set = set()
    with peers():
        pub = Publisher("t", catalog=cat, retention=Retention(), heartbeat_interval=0.2)
        try:
            publish_total(pub, everything)
            for round_ in range(3):
                p = subprocess.Popen(
                    [sys.executable, "-m", "epochstream", "tail", "t", "--from", "earliest",
                     "--durable", "d", "--records", "--json", "--catalog", str(tmp_path)],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
                lines: list = []
                reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
                reader.start()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not lines:
                    time.sleep(0.005)
                assert lines, "tail printed nothing"
                time.sleep(rnd.uniform(0.0, 0.06))
                p.send_signal(signal.SIGKILL)
                p.wait(10)
                reader.join(10)
                by_time: dict = {}
                for line in lines:
                    if not line.endswith("\n"):
                        continue  # cut by the kill
                    obj = json.loads(line)
                    by_time.setdefault(obj["time"], []).append(obj["record"])
                info = cat.durable("t", "d")
                now = {t for t in everything if covered(TOTAL, info, t)}
                assert acked <= now
                for t in now - acked:
                    assert by_time.get(t) == flat(t), f"epoch {t} acked but not printed whole"
                for t, recs in by_time.items():
                    assert t not in acked, f"epoch {t}, acked in an earlier run, printed again"
                    assert recs == flat(t)[:len(recs)], t
                assert 0 < len(now - acked) < len(everything) - len(acked), \
                    "killed before any ack or after the end"
                acked = now
            rest = cli(tmp_path, "tail", "t", "--durable", "d", "--records", "--json",
                       "--max-epochs", len(everything) - len(acked))
            assert rest.returncode == 0, rest.stderr
            by_time = {}
            for line in rest.stdout.splitlines():
                obj = json.loads(line)
                by_time.setdefault(obj["time"], []).append(obj["record"])
            assert by_time == {t: flat(t) for t in everything if t not in acked}
        finally:
            pub.close(linger=1, wait=True)
