"""Adversarial tests of the README's three promises, over real processes and real sockets.

    "every epoch whole or not at all", "nothing dropped silently", "memory stays bounded"

Nothing we ship is mocked. Each partition's publisher is its own OS process
(``tests/sockets/adversary_peer.py publisher``: a real ``with Publisher(...)`` block driven by commands on
its stdin), each subscriber is its own OS process (``adversary_peer.py subscriber``: a real
``Subscriber(...).epochs()`` loop printing one JSON line per Epoch / Gap / exception), all on
127.0.0.1, all sharing one SQLite catalog in a fresh temporary directory. Faults are real:
``SIGKILL`` (publishers and subscribers, at any moment, also mid-epoch and while commands are in
flight), ``SIGSTOP``/``SIGCONT`` (stalled subscribers), an exception raised inside the
``with Publisher`` block, garbage and half-open fake peers from raw ZeroMQ DEALER sockets.

:class:`AdversarialPubSub` is a Hypothesis ``RuleBasedStateMachine`` that lets Hypothesis choose
the moment of every action (:class:`AdversarialProduct`: the same over ``product(2)`` times); the
``test_regression_*`` tests replay, step by step, the three defects an independent review
reported and two more the state machine found (all five failed at commit 5ebe8d1).

Knobs (environment): ``HYPOTHESIS_PROFILE=thorough`` (5x the examples, 50 steps each, shrinking
on); ``ADVERSARY_VERBOSE=1`` (print every run's event log, with ``pytest -s``);
``ADVERSARY_OFF=rule,rule`` (switch rules off, e.g. ``raise_inside_with_publisher`` to look for
other defects behind a known one); ``ADVERSARY_SHRINK=1`` (shrink failures in the default
profile too: slow, every example is real processes).

Preconditions and draws depend only on what earlier rules did (``intent``), never on what the
processes did meanwhile, so that Hypothesis sees the same rules enabled for the same choices.
Real processes are not deterministic, though: a failure Hypothesis replays may come out
differently (it then reports a ``FlakyFailure`` that contains the original violation).

The model (what the test process knows)
---------------------------------------
For each partition ``p`` the test keeps the list of its publisher *incarnations* (``gen`` 0, 1,
...: the first process and its restarts). For each incarnation it knows, from what it issued
and what the process acknowledged (the peer prints ``DO seq`` before and ``OK seq`` after every
command), per time ``t`` the number of records it sent at ``t`` as an interval ``[lo, hi]``
(``lo``: acknowledged, ``hi``: issued and possibly executed) and its capability as an interval
(``cap_certain``: the last acknowledged ``advance_to`` -- acknowledged only after
``flush()``, so the loop handed the data and the frontier change to the sockets;
``cap_possible``: the last one issued and possibly executed). After a ``SIGKILL`` the dead
process's remaining output is read: a command without ``DO`` never ran (it is taken back), one
with ``DO`` but no ``OK`` may or may not have run (it stays ambiguous). Every record carries its
(partition, gen, time, i) in its int id, so a subscriber can say exactly whose records an epoch
held.

What "whole" means across restarts
----------------------------------
Incarnation ``g`` of partition ``p`` *completes* time ``t`` when its capability moves past ``t``
(``advance_to``; ``close`` moves it past everything). A killed or aborted incarnation completes
nothing more; its successor is started with ``start=`` the first epoch it had not completed
(``cap_certain``), so every time is completed by exactly one incarnation of each partition (two
candidates only while an ``advance`` was in flight at the kill: then either is accepted). An
epoch ``t`` delivered by a subscriber is **whole** iff

- every partition has completed ``t`` (an epoch released while some partition still holds a
  capability at or before ``t`` -- e.g. because its publisher crashed or was aborted and the
  subscriber took that for a clean end -- is partial);
- for every partition ``p``, its records are exactly records ``0..n-1`` that the incarnation
  which completed ``t`` sent at ``t`` (``lo <= n <= hi``), and nothing else: no records of a
  killed/aborted incarnation that did not complete ``t`` (records of an incarnation that died
  mid-epoch were never committed; a restart re-sends the epoch in full), no records of another
  time, no record twice.

So if an epoch was sent partially by a killed incarnation and then sent again by its restart,
the only whole version is the restart's (plus the other partitions' records); delivering the
dead incarnation's part, alone or mixed with the restart's, is a violation, and so is delivering
the epoch with the other partitions' records only.

Invariants (checked after every step; subscriber output is polled without blocking)
-----------------------------------------------------------------------------------
1. **No partial epoch** (above), checked on every ``epoch`` line of every subscriber.
2. **No epoch twice, in time order**: a subscriber never delivers ``t`` after having delivered
   some ``u >= t``.
3. **Nothing skipped silently**: an epoch ``t`` is *owed* to a subscriber iff it was latent when
   the subscriber joined (no send at any time ``u >= t`` had been issued, by any incarnation of
   any partition, when the subscriber printed READY), every partition has certainly completed it
   and it certainly holds records. Once the subscriber delivered an epoch ``u > t`` (epochs are
   released in an order consistent with the partial order, so ``t`` cannot come later), ``t``
   must have been delivered or covered by ``Gap.may_have_missed(t)`` of a Gap it yielded;
   at the end of every run (subscribers resumed, bounded settle) every owed epoch must have been
   delivered or covered, unless the subscriber ended with an explicit error
   (``SubscriberLagged``, ``PublisherLost``, ``PublisherAborted``, ``ProtocolError``). Any other
   exception in a subscriber fails the test, and so do ``SubscriberLagged`` from a
   ``recover=True`` subscriber (it must re-join) and ``PublisherAborted`` naming a partition
   that was never aborted.
4. **Memory stays bounded**: every publisher process' RSS stays below
   :data:`RSS_LIMIT` (its ``max_queue_bytes`` is 4 MiB, ``sndhwm`` 32; subscribers with flow
   control may be stalled, fake peers may say hello and never read).
5. **Live publishers keep serving**: every live publisher process is running and answers a fresh
   raw ``hello`` with a snapshot within :data:`PROBE_TIMEOUT` seconds; no publisher call stays
   blocked longer than ``credit_timeout`` + :data:`BLOCK_SLACK` seconds; no valid command is
   refused with an error.

New API the test is written against (it may not exist yet; the rules that need it then fail):
``epochstream.PublisherAborted`` (``.partition``), ``Publisher.abort``,
``Publisher(..., credit_timeout=s)``, restarts announcing the predecessor's upper frontier.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import zmq
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from hypothesis_profiles import PROFILE, examples

import adversary_peer as peer_mod
from epochstream import wire
from epochstream.order import TOTAL, product

PEER = str(Path(__file__).with_name("adversary_peer.py"))
TOPIC = "adv"
PARTITIONS = 2
RSS_LIMIT = 300 << 20
PROBE_TIMEOUT = 5.0
BLOCK_SLACK = 10.0
CREDIT_TIMEOUT = 2.0
SUB_TIMEOUT = 5.0  # a subscriber's PublisherLost timeout
SUB_PING = 0.2
CALM_STEPS = 3
MAX_SUBS = 8  # subscriber processes started per run
CLOSE_AFTER = 12  # steps before a partition may be closed for good
#: heartbeat 1 s (the default): a stalled (SIGSTOPped) subscriber cannot answer ZMTP pings, and
#: the publisher drops its connection after 3 heartbeats -- stalls shorter than that keep it.
PUB_OPTIONS = ["heartbeat=1.0", f"max_queue_bytes={4 << 20}", "sndhwm=32",
               f"credit_timeout={CREDIT_TIMEOUT}"]
#: explicit errors a subscriber may end with (the README's "told precisely what it missed")
EXPLICIT = {"SubscriberLagged", "PublisherLost", "PublisherAborted", "ProtocolError", "WireError",
            "TopicClosed"}
THOROUGH = PROFILE == "thorough"
VERBOSE = bool(os.environ.get("ADVERSARY_VERBOSE"))  # print every run's event log
#: rules switched off (comma-separated names), e.g. to look for other defects behind a known one
OFF = set(filter(None, os.environ.get("ADVERSARY_OFF", "").split(",")))

_ENV = dict(os.environ)
_ENV["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parents[1]), _ENV.get("PYTHONPATH", "")]).rstrip(os.pathsep)


# -- child processes -------------------------------------------------------------------------------
class Child:
    """A peer process; a daemon thread moves its stdout lines into a queue (never blocks us)."""

    def __init__(self, args, workdir: Path, name: str):
        self.name = name
        self.stderr_path = workdir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "w")
        self.popen = subprocess.Popen([sys.executable, PEER, *map(str, args)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                      bufsize=1, env=_ENV, cwd=str(workdir))
        self.lines: queue.Queue = queue.Queue()
        self.eof = False
        self.stopped = False  # SIGSTOPped by us
        threading.Thread(target=self._read, daemon=True, name=f"reader-{name}").start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self):
        try:
            for line in self.popen.stdout:
                self.lines.put(line.rstrip("\n"))
        except (ValueError, OSError):
            pass
        self.lines.put(None)

    def new_lines(self) -> list:
        out = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return out
            if line is None:
                self.eof = True
            else:
                out.append(line)

    def wait_line(self, timeout: float):
        """The next line, or None on EOF / timeout."""
        if self.eof:
            return None
        try:
            line = self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if line is None:
            self.eof = True
        return line

    def write(self, text: str) -> bool:
        try:
            self.popen.stdin.write(text + "\n")
            self.popen.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            self._stderr.flush()
            return self.stderr_path.read_text()[-n:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.kill()
        for f in (self.popen.stdin, self.popen.stdout):
            try:
                f.close()
            except Exception:
                pass
        self._stderr.close()


# -- the model ---------------------------------------------------------------------------------------
class Gen:
    """One publisher incarnation of a partition (one process)."""

    def __init__(self, partition: int, gen: int, start, child: Child):
        self.partition, self.gen, self.start, self.child = partition, gen, start, child
        self.state = "starting"  # live | aborting | aborted | killed | closed | crashed (observed)
        self.intent = "live"  # live | aborted | killed | closed: what the test did to it
        self.incarnation = self.endpoint = None
        self.caps: dict = {}
        self.sent: dict = {}  # t -> [lo, hi]
        self.cmds: dict = {}  # seq -> dict(verb, args, issued, status)
        self.advances: list = []  # seqs of advance commands, in order
        self.close_seq = None
        self.seq = 0
        self.rss = 0

    @property
    def name(self) -> str:
        return f"p{self.partition}g{self.gen}"

    def cap_certain(self):
        for seq in reversed(self.advances):
            if self.cmds[seq]["status"] == "ok":
                return self.cmds[seq]["args"][0]
        return self.start

    def cap_possible(self):
        for seq in reversed(self.advances):
            if self.cmds[seq]["status"] != "never":
                return self.cmds[seq]["args"][0]
        return self.start

    def closed_certain(self) -> bool:
        return self.close_seq is not None and self.cmds[self.close_seq]["status"] == "ok"

    def closed_possible(self) -> bool:
        return self.close_seq is not None and self.cmds[self.close_seq]["status"] != "never"

    def pending(self) -> list:
        return [c for c in self.cmds.values() if c["status"] in ("issued", "do")]


class Sub:
    def __init__(self, idx: int, child: Child, recover: bool, credit: int):
        self.idx, self.child, self.recover, self.credit = idx, child, recover, credit
        self.state = "starting"  # running | ended | errored | killed | noready (observed)
        self.intent = "running"  # running | killed: what the test did to it
        self.joined_sent: set = set()  # times with sends issued before it joined
        self.delivered: list = []
        self.delivered_set: set = set()
        self.gaps: list = []
        self.error = None
        self.ready_info = None

    @property
    def name(self) -> str:
        return f"s{self.idx}({'R' if self.recover else '-'}{'C' if self.credit else '-'})"


class Violation(AssertionError):
    pass


class Cluster:
    """Two (or more) partitions' publishers and any number of subscribers, plus the checker."""

    def __init__(self, order=TOTAL, partitions: int = PARTITIONS, pub_options=None):
        self.order = order
        self.partitions = partitions
        self.workdir = Path(tempfile.mkdtemp(prefix="epochstream-adv-"))
        # Not created here: both partitions' publishers open the fresh catalog at the same
        # moment (at 5ebe8d1 one of them failed now and then with "database is locked").
        self.catalog = self.workdir / "catalog"
        self.pub_options = list(PUB_OPTIONS if pub_options is None else pub_options)
        self.gens: dict[int, list[Gen]] = {p: [] for p in range(partitions)}
        self.subs: list[Sub] = []
        self.issued_times: set = set()
        self.violations: list[str] = []
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.ctx = zmq.Context()
        self.garbage_sockets: list = []

    # ---- bookkeeping
    def note(self, text: str) -> None:
        self.log.append(f"{time.monotonic() - self.t0:7.2f} {text}")

    def violate(self, text: str) -> None:
        self.note("VIOLATION " + text)
        self.violations.append(text)

    def assert_ok(self) -> None:
        if self.violations:
            first = self.violations[:6]
            raise Violation("\n".join(first) + "\n--- recent events:\n" + "\n".join(self.log[-60:])
                            + self._stderr_dump())

    def _stderr_dump(self) -> str:
        parts = []
        for p in self.gens:
            for g in self.gens[p]:
                tail = g.child.stderr_tail(600)
                if "Traceback" in tail or "Error" in tail:
                    parts.append(f"--- stderr of {g.name}:\n{tail}")
        return ("\n" + "\n".join(parts[-3:])) if parts else ""

    def current(self, p: int) -> Gen:
        return self.gens[p][-1]

    # ---- time helpers
    def le(self, a, b) -> bool:
        return self.order.le(a, b)

    def lt(self, a, b) -> bool:
        return self.order.lt(a, b)

    def tkey(self, t):
        return tuple(t) if isinstance(t, list) else t

    # ---- publishers
    def spawn_pub(self, p: int, start=None) -> Gen:
        gen = len(self.gens[p])
        if start is None:
            start = self.order.minimum
        child = Child(["publisher", self.catalog, TOPIC, p, self.partitions, self.order.name, gen,
                       peer_mod.jtime(start), *self.pub_options], self.workdir, f"p{p}g{gen}")
        g = Gen(p, gen, start, child)
        self.gens[p].append(g)
        self.note(f"{g.name} spawned start={start}")
        return g

    def wait_pub_ready(self, g: Gen, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = g.child.wait_line(deadline - time.monotonic())
            if line is None:
                break
            if line.startswith("READY"):
                _, g.incarnation, g.endpoint, rss, caps = line.split(" ", 4)
                g.rss = int(rss)
                g.caps = json.loads(caps)
                g.state = "live"
                self.note(f"{g.name} READY {g.endpoint} inc={g.incarnation[:8]}")
                return True
        g.state = "crashed"
        self.violate(f"{g.name} did not start (rc={g.child.popen.poll()}): {g.child.stderr_tail()}")
        return False

    def command(self, g: Gen, verb: str, *args) -> str:
        g.seq += 1
        seq = str(g.seq)
        text = " ".join([seq, verb, *[peer_mod.jtime(a) if verb in ("send", "burst", "advance") and i == 0
                                      else str(a) for i, a in enumerate(args)]])
        cmd = {"verb": verb, "args": args, "issued": time.monotonic(), "status": "issued"}
        g.cmds[seq] = cmd
        if verb in ("send", "burst"):
            t = args[0]
            n = args[1] if verb == "send" else args[1] * args[2]
            cmd["n"] = n
            g.sent.setdefault(t, [0, 0])[1] += n
            self.issued_times.add(t)
        elif verb == "advance":
            g.advances.append(seq)
        elif verb == "close":
            g.close_seq = seq
        self.note(f"{g.name} <- {text}")
        if not g.child.write(text):
            self.note(f"{g.name}: stdin closed")
        return seq

    def _pub_line(self, g: Gen, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "DO":
            c = g.cmds.get(rest.strip())
            if c is not None and c["status"] == "issued":
                c["status"] = "do"
        elif word == "OK":
            parts = rest.split(" ")
            c = g.cmds.get(parts[0])
            g.rss = int(parts[1])
            if c is not None:
                c["status"] = "ok"
                c["done"] = time.monotonic()
                if c["done"] - c["issued"] > 0.5:
                    self.note(f"{g.name} slow ack: {c['verb']} {c['args']} took {c['done'] - c['issued']:.2f} s")
                if c["verb"] in ("send", "burst"):
                    g.sent[c["args"][0]][0] += c["n"]
        elif word == "ERR":
            seq, _, msg = rest.partition(" ")
            c = g.cmds.get(seq)
            if c is not None:
                c["status"] = "never"
                if c["verb"] in ("send", "burst"):
                    g.sent[c["args"][0]][1] -= c["n"]
            self.violate(f"{g.name} refused a valid command {c and c['verb']} {c and c['args']}: {msg}")
        elif word == "ABORTED":
            g.state = "aborted"
            self.note(f"{g.name} ABORTED")
        else:
            self.note(f"{g.name} says {line[:200]}")

    def pump_pub(self, g: Gen) -> None:
        for line in g.child.new_lines():
            self._pub_line(g, line)

    def wait_acks(self, g: Gen, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while g.pending() and time.monotonic() < deadline and not g.child.eof:
            line = g.child.wait_line(min(0.05, deadline - time.monotonic()))
            if line is not None:
                self._pub_line(g, line)
            self.pump_pub(g)
        return not g.pending()

    def _resolve_dead(self, g: Gen) -> None:
        """The process is gone: read what it printed; commands never started are taken back."""
        deadline = time.monotonic() + 5
        while not g.child.eof and time.monotonic() < deadline:
            line = g.child.wait_line(deadline - time.monotonic())
            if line is not None:
                self._pub_line(g, line)
        for seq, c in g.cmds.items():
            if c["status"] == "issued":
                c["status"] = "never"
                if c["verb"] in ("send", "burst"):
                    g.sent[c["args"][0]][1] -= c["n"]
            elif c["status"] == "do":
                self.note(f"{g.name}: command {seq} {c['verb']} {c['args']} was in flight when it ended")

    def kill_pub(self, g: Gen) -> None:
        g.child.kill()
        g.state = "killed"
        g.intent = "killed"
        self.note(f"{g.name} SIGKILLed")
        self._resolve_dead(g)

    def abort_pub(self, g: Gen) -> None:
        self.command(g, "raise")
        g.state = "aborting"
        g.intent = "aborted"

    def confirm_abort(self, g: Gen, timeout: float = 5.0) -> None:
        """After ``raise``: wait for ABORTED and the process to exit (a supervisor kills it after
        a few seconds, like a real one would); then the gen is fully resolved."""
        deadline = time.monotonic() + timeout
        while g.state == "aborting" and time.monotonic() < deadline and not g.child.eof:
            line = g.child.wait_line(min(0.1, deadline - time.monotonic()))
            if line is not None:
                self._pub_line(g, line)
        try:
            g.child.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.note(f"{g.name} still running after raise; supervisor SIGKILLs it")
        if g.state != "aborted":
            g.state = "killed"  # never reached the raise (blocked): it is a kill after all
        g.child.kill()
        self._resolve_dead(g)

    def restart_pub(self, p: int) -> Gen:
        old = self.current(p)
        assert old.intent in ("killed", "aborted"), old.intent
        start = old.cap_certain()
        g = self.spawn_pub(p, start)
        self.wait_pub_ready(g)
        return g

    def close_pub(self, g: Gen) -> None:
        self.command(g, "close")
        g.state = "closed"
        g.intent = "closed"

    # ---- completion model
    def completion(self, p: int, t):
        """``(alternatives, certain)``: the incarnations of ``p`` that may have completed ``t``
        and whether one certainly did."""
        alts = []
        for g in self.gens[p]:
            possibly = g.closed_possible() or not self.le(g.cap_possible(), t)
            certainly = g.closed_certain() or not self.le(g.cap_certain(), t)
            if possibly or certainly:
                alts.append(g)
            if certainly:
                return alts, True
        return alts, False

    def certainly_owed_content(self, t) -> bool:
        """``t`` is certainly complete in every partition and certainly holds records."""
        has_data = False
        for p in range(self.partitions):
            alts, certain = self.completion(p, t)
            if not certain:
                return False
            if all(g.sent.get(t, [0, 0])[0] > 0 for g in alts):
                has_data = True
        return has_data

    # ---- subscribers
    def spawn_sub(self, recover: bool, credit: int, wait: float = 15.0) -> Sub:
        idx = len(self.subs)
        child = Child(["subscriber", self.catalog, TOPIC, int(recover), credit, SUB_TIMEOUT, SUB_PING],
                      self.workdir, f"s{idx}")
        s = Sub(idx, child, recover, credit)
        self.subs.append(s)
        states_before = [self.current(p).state for p in range(self.partitions)]
        self.note(f"{s.name} spawned")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            line = child.wait_line(deadline - time.monotonic())
            if line is None:
                break
            if line.startswith("READY"):
                s.state = "running"
                s.joined_sent = set(self.issued_times)
                s.ready_info = json.loads(line.split(" ", 1)[1])
                self.note(f"{s.name} READY {line[6:300]}")
                return s
            self._sub_line(s, line)
            if s.state != "starting":
                return s
        all_live = all(st_ in ("live", "closed") for st_ in states_before) and all(
            self.current(p).state in ("live", "closed") for p in range(self.partitions))
        if s.state == "starting" or (s.error or {}).get("type") == "NotReady":
            s.state = "noready"
            if all_live:
                self.violate(f"{s.name} got no snapshot from live publishers within {wait} s "
                             f"(stderr: {child.stderr_tail(500)})")
        return s

    def _sub_line(self, s: Sub, line: str) -> None:
        try:
            ev = json.loads(line)
        except ValueError:
            self.note(f"{s.name} says {line[:200]}")
            return
        kind = ev.get("ev")
        if kind == "epoch":
            self._check_epoch(s, ev)
        elif kind == "gap":
            s.gaps.append(ev)
            self.note(f"{s.name} GAP {ev}")
        elif kind == "error":
            s.error = ev
            s.state = "errored"
            self.note(f"{s.name} ERROR {ev['type']}: {ev['msg'][:300]}")
            if ev["type"] != "NotReady" and (ev["type"] not in EXPLICIT or not ev.get("library")):
                self.violate(f"{s.name} failed with an unexpected {ev['type']}: {ev['msg'][:1500]}")
            elif ev["type"] == "SubscriberLagged" and s.recover:
                self.violate(f"{s.name}: recover=True must re-join after an eviction, not raise: {ev['msg'][:300]}")
            elif ev["type"] == "TopicClosed" and not all(
                    any(g.intent == "closed" for g in self.gens[p]) for p in self.gens):
                self.violate(f"{s.name}: TopicClosed, but some partition was never closed: "
                             f"{ev['msg'][:300]}")
            elif ev["type"] == "PublisherAborted" and not any(
                    g.intent == "aborted" for g in self.gens.get(ev.get("partition"), ())):
                self.violate(f"{s.name}: PublisherAborted for partition {ev.get('partition')}, which "
                             f"was never aborted: {ev['msg'][:300]}")
        elif kind == "end":
            s.state = "ended"
            self.note(f"{s.name} END")

    def pump_subs(self) -> None:
        for s in self.subs:
            for line in s.child.new_lines():
                if line.startswith("READY"):
                    continue
                self._sub_line(s, line)

    def pump(self) -> None:
        for p in self.gens:
            for g in self.gens[p]:
                self.pump_pub(g)
        self.pump_subs()

    # ---- the checks
    def may_have_missed(self, gap: dict, t) -> bool:
        since = [self.tkey(x) for x in gap["since"]]
        until = [self.tkey(x) for x in gap["until"]]
        through = [self.tkey(x) for x in gap["through"]]
        if not any(self.le(x, t) for x in since):
            return False
        return not any(self.le(u, t) for u in until) or any(self.le(t, u) for u in through)

    def _check_epoch(self, s: Sub, ev: dict) -> None:
        t = self.tkey(ev["t"])
        where = f"{s.name} epoch {t!r}"
        summary = f"groups={ev['groups'][:8]} n={ev['n']}"
        self.note(f"{s.name} EPOCH {t!r} n={ev['n']} groups={[(g[0], g[1], g[3][:3]) for g in ev['groups']][:6]}")
        # 2. no epoch twice, in time order
        if t in s.delivered_set:
            self.violate(f"{where}: delivered twice")
        later = [u for u in s.delivered if self.le(t, u) and u != t]
        if later:
            self.violate(f"{where}: delivered after epoch(s) {later[:3]} at or beyond it")
        s.delivered.append(t)
        s.delivered_set.add(t)
        if ev["dups"] or ev["bad"]:
            self.violate(f"{where}: {ev['dups']} duplicate / {ev['bad']} foreign records")
        # 1. whole
        te = peer_mod.tenc(t)
        by_part: dict = {}
        for p, gen, gte, ranges in ev["groups"]:
            if gte != te:
                self.violate(f"{where}: holds records of another time (tenc {gte}) from p{p}g{gen}")
                continue
            if p not in self.gens or gen >= len(self.gens[p]):
                self.violate(f"{where}: records of an unknown publisher p{p}g{gen}")
                continue
            by_part.setdefault(p, []).append((gen, ranges))
        for p in range(self.partitions):
            alts, certain = self.completion(p, t)
            got = by_part.get(p, [])
            if not alts:
                sent = {g.gen: g.sent.get(t) for g in self.gens[p] if g.sent.get(t)}
                self.violate(f"{where}: PARTIAL - partition {p} never completed {t!r} (no incarnation "
                              f"moved its capability past it; states {[g.state for g in self.gens[p]]}, "
                              f"records sent at {t!r}: {sent}); delivered {summary}")
                continue
            if len(got) > 1:
                self.violate(f"{where}: PARTIAL/MIXED - partition {p}'s records come from several "
                             f"incarnations {[g for g, _ in got]}: {summary}")
                continue
            ok = False
            for g in alts:
                lo, hi = g.sent.get(t, [0, 0])
                if not got:
                    ok = ok or lo == 0
                    continue
                gen, ranges = got[0]
                if gen == g.gen and len(ranges) == 1 and ranges[0][0] == 0 and lo <= ranges[0][1] <= hi:
                    ok = True
            if not ok:
                expect = {g.name: g.sent.get(t, [0, 0]) for g in alts}
                self.violate(f"{where}: PARTIAL - partition {p} should contribute records 0..n-1 of "
                             f"one of {expect} (records [lo, hi]) but delivered {got or 'nothing'}")
        # 3. skipped silently? every owed epoch before t must be delivered or covered by a gap
        self._check_skips(s, before=t)

    def _owed(self, s: Sub, t) -> bool:
        return (not any(self.le(t, u) for u in s.joined_sent)) and self.certainly_owed_content(t)

    def _covered(self, s: Sub, t) -> bool:
        return any(self.may_have_missed(gap, t) for gap in s.gaps)

    def _check_skips(self, s: Sub, before=None) -> list:
        missing = []
        for t in sorted(self.issued_times, key=self.order.key):
            if before is not None and not self.lt(t, before):
                continue
            if t in s.delivered_set or not self._owed(s, t) or self._covered(s, t):
                continue
            missing.append(t)
        if missing and before is not None:
            self.violate(f"{s.name}: SKIPPED SILENTLY - epochs {missing[:5]} were latent when it "
                         f"joined (sent before: {sorted(s.joined_sent, key=self.order.key)[-3:]}), are "
                         f"complete with records in every partition, precede the delivered epoch "
                         f"{before!r}, and no Gap covers them (gaps: {s.gaps})")
        return missing

    def check_publishers(self, probe: bool = True) -> None:
        now = time.monotonic()
        for p in range(self.partitions):
            for g in self.gens[p]:
                if g.state not in ("live", "aborting", "closed"):
                    continue
                if g.state == "live" and not g.child.alive():
                    g.state = "crashed"
                    self.violate(f"{g.name} died on its own (rc={g.child.popen.poll()}): "
                                 f"{g.child.stderr_tail()}")
                    continue
                if g.child.alive():
                    try:
                        rss = psutil.Process(g.child.pid).memory_info().rss
                    except psutil.Error:
                        rss = 0
                    g.rss = max(g.rss, rss)
                    if rss > RSS_LIMIT:
                        self.violate(f"{g.name} RSS {rss >> 20} MiB > {RSS_LIMIT >> 20} MiB")
                if g.state == "live":
                    old = [c for c in g.pending() if now - c["issued"] > CREDIT_TIMEOUT + BLOCK_SLACK]
                    if old:
                        c = old[0]
                        self.violate(f"{g.name}: {c['verb']} {c['args']} still blocked after "
                                     f"{now - c['issued']:.1f} s (credit_timeout {CREDIT_TIMEOUT} s)")
                        c["issued"] = now  # report once
                    if probe:
                        self.probe(g)

    def probe(self, g: Gen) -> None:
        """A fresh raw hello to a live publisher must be answered with a snapshot."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 4)
        try:
            sock.connect(g.endpoint)
            sock.send_multipart(wire.encode_control(wire.HELLO, topic=TOPIC, partition=g.partition,
                                                    id=uuid.uuid4().hex))
            if not sock.poll(int(PROBE_TIMEOUT * 1000)):
                self.violate(f"{g.name} did not answer a fresh hello within {PROBE_TIMEOUT} s")
                return
            frames = sock.recv_multipart()
            if frames[0] != wire.SNAPSHOT:
                self.violate(f"{g.name} answered a fresh hello with {frames[:2]!r}, not a snapshot")
            sock.send_multipart(wire.encode_control(wire.BYE))
        finally:
            sock.close(0)

    def final_check(self, settle: float = 10.0) -> None:
        """Resume stalled subscribers and give everyone time to catch up; then every owed epoch
        must have been delivered or covered (or the subscriber ended with an explicit error)."""
        for s in self.subs:
            if s.child.stopped and s.state in ("running", "starting"):
                s.child.signal(signal.SIGCONT)
                s.child.stopped = False
        deadline = time.monotonic() + settle
        while True:
            self.pump()
            waiting = [(s, m) for s in self.subs if s.state == "running"
                       for m in [self._check_skips(s)] if m]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for s, missing in waiting:
            self.violate(f"{s.name}: epochs {missing[:5]} were latent when it joined and are "
                         f"complete with records, but after {settle} s it neither delivered them nor "
                         f"reported a Gap or an error (delivered {s.delivered[-5:]}, gaps {s.gaps})")

    # ---- garbage
    def garbage(self, g: Gen, messages: list, keep: bool) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 4)
        sock.connect(g.endpoint)
        for frames in messages:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.note(f"garbage -> {g.name}: {[[f[:12] for f in m] for m in messages][:4]} keep={keep}")
        if keep:
            self.garbage_sockets.append(sock)
        else:
            time.sleep(0.02)
            sock.close(0)

    # ---- teardown
    def cleanup(self) -> None:
        for s in self.subs:
            s.child.cleanup()
        for p in self.gens:
            for g in self.gens[p]:
                g.child.cleanup()
        for sock in self.garbage_sockets:
            sock.close(0)
        self.ctx.term()
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- the state machine ------------------------------------------------------------------------------
def _crafted(topic: str, partition: int) -> list:
    """Hand-made bad or hostile control messages (lists of multipart messages)."""
    hello = lambda **kw: wire.encode_control(wire.HELLO, **kw)  # noqa: E731
    me = uuid.uuid4().hex
    return [
        [hello(topic="other", partition=partition, id=me)],
        [hello(topic=topic, partition=partition + 5, id=me)],
        [hello(topic=topic, partition=partition, id=me, credit=1)],  # a flow-controlled peer that never reads
        [hello(topic=topic, partition=partition, id=me)],  # a peer that says hello and never reads
        [hello(topic=topic, partition=partition, id=me, credit=2),
         wire.encode_control(wire.CREDIT, messages=1 << 31)] * 3,  # credit flood, never reads
        [wire.encode_control(wire.CREDIT, messages=1 << 31)],
        [wire.encode_control(wire.PING, id=me)],
        [wire.encode_control(wire.BYE)],
        [[b"h\x09", b"\x80"]],
        [[wire.HELLO, b"\xdd\xff\xff\xff\xff"]],  # array header claiming 4G elements
        [[wire.HELLO, b"x" * 70_000]],  # over MAXMSGSIZE
        [[wire.HELLO, wire._packb({"topic": topic, "partition": True, "id": me})]],
        [[wire.HELLO, wire._packb({"topic": topic, "partition": partition, "id": me, "credit": -1})]],
        [[wire.DATA, wire._packb(3), b"\x91\x01"]],  # a publisher kind sent to a publisher
        [hello(topic=topic, partition=partition, id=me), hello(topic=topic, partition=partition, id=me)],
    ]


random_message = st.lists(st.binary(max_size=24), min_size=1, max_size=4)
hello_garbage = st.builds(lambda body: [wire.HELLO, body], st.binary(max_size=48))


class AdversarialPubSub(RuleBasedStateMachine):
    """See the module docstring. ``ORDER`` is overridden by subclasses."""

    ORDER = TOTAL

    def __init__(self):
        super().__init__()
        self.c = Cluster(order=self.ORDER)
        self.t_started = time.monotonic()
        self.steps = 0
        self.last_fault = -CALM_STEPS

    def calm(self) -> bool:
        """Publisher faults (kill, raise, close) come at least CALM_STEPS steps apart, so that
        epochs flow between them."""
        return self.steps - self.last_fault >= CALM_STEPS

    @initialize(subs=st.lists(st.tuples(st.booleans(), st.sampled_from([0, 0, 4, 16])), min_size=1, max_size=2))
    def start_publishers_and_subscribers(self, subs):
        subs = [(True, subs[0][1]), *subs[1:]]  # at least one subscriber that recovers
        c = self.c
        gens = [c.spawn_pub(p) for p in range(c.partitions)]
        for g in gens:
            c.wait_pub_ready(g)
        for recover, credit in subs:
            c.spawn_sub(recover, credit)
        c.assert_ok()

    # ---- helpers
    # Preconditions and draws depend only on what the rules did (``intent``), never on what
    # the processes did meanwhile: Hypothesis needs the same choices to enable the same rules.
    def live(self) -> list:
        return [p for p in range(self.c.partitions) if self.c.current(p).intent == "live"]

    def dead(self) -> list:
        return [p for p in range(self.c.partitions) if self.c.current(p).intent in ("killed", "aborted")]

    def running_subs(self, stopped=None) -> list:
        return [s for s in self.c.subs if s.intent == "running"
                and (stopped is None or s.child.stopped == stopped)]

    def offset(self, t, d):
        if isinstance(t, tuple):
            return tuple(a + b for a, b in zip(t, d))
        return t + d

    def deltas(self, allow_zero: bool):
        if self.ORDER is TOTAL:
            return st.sampled_from([0, 0, 1, 2] if allow_zero else [1, 1, 2])
        vals = [(0, 0), (0, 0), (1, 0), (0, 1), (1, 1)] if allow_zero else [(1, 0), (0, 1), (1, 1), (0, 1)]
        return st.sampled_from(vals)

    # ---- publisher rules
    def _work(self, data, ops):
        """Publish records at the current epoch (or a little beyond it) and/or advance, on one or
        both partitions, in the order Hypothesis chose; then wait (briefly) for the acks."""
        touched = []
        for p, what, n in ops:
            live = self.live()
            if not live:
                break
            p = live[p % len(live)]
            g = self.c.current(p)
            if what in ("send", "both"):
                t = self.offset(g.cap_possible(), data.draw(self.deltas(True), label="dt"))
                self.c.command(g, "send", t, n)
            if what in ("advance", "both"):
                self.c.command(g, "advance", self.offset(g.cap_possible(), data.draw(self.deltas(False), label="d")))
            touched.append(g)
        for g in dict.fromkeys(touched):
            self.c.wait_acks(g, 1.0)

    _ops = st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["send", "advance", "both", "both"]),
                              st.integers(1, 40)), min_size=1, max_size=6)

    # (four copies: Hypothesis picks rules uniformly, and most steps should move the stream on)
    @precondition(lambda self: self.live())
    @rule(data=st.data(), ops=_ops)
    def add_epochs(self, data, ops):
        self._work(data, ops)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), ops=_ops)
    def add_more_epochs(self, data, ops):
        self._work(data, ops)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), ops=_ops)
    def add_yet_more_epochs(self, data, ops):
        self._work(data, ops)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), ops=_ops)
    def add_epochs_again(self, data, ops):
        self._work(data, ops)

    @precondition(lambda self: 'burst' not in OFF)
    @precondition(lambda self: self.live())
    @rule(data=st.data(), k=st.integers(1, 60), m=st.integers(1, 8), pad=st.sampled_from([512, 4000]))
    def burst(self, data, k, m, pad):
        """Many messages of padded records at once (bytes, not records, are what fill memory):
        up to ~2 MB, below the 4 MiB backlog bound."""
        p = data.draw(st.sampled_from(self.live()), label="partition")
        g = self.c.current(p)
        self.c.command(g, "burst", g.cap_possible(), k, m, pad)
        self.c.wait_acks(g, 2.0)

    @precondition(lambda self: 'flood' not in OFF)
    @precondition(lambda self: self.live())
    @rule(data=st.data(), k=st.integers(100, 600), m=st.integers(8, 14))
    def flood(self, data, k, m):
        """Up to ~34 MB in one go (messages of ~32-56 KB): far past every backlog bound; slow
        subscribers must be evicted (or hold the producer back), memory must stay bounded."""
        p = data.draw(st.sampled_from(self.live()), label="partition")
        g = self.c.current(p)
        self.c.command(g, "burst", g.cap_possible(), k, m, 4000)
        self.c.wait_acks(g, 3.0)

    @precondition(lambda self: 'close' not in OFF)
    @precondition(lambda self: self.live() and self.calm() and self.steps >= CLOSE_AFTER)
    @rule(data=st.data())
    def close(self, data):
        """Close a partition cleanly (final: it is never restarted), late in a run."""
        self.last_fault = self.steps
        p = data.draw(st.sampled_from(self.live()), label="partition")
        self.c.close_pub(self.c.current(p))
        self.c.wait_acks(self.c.current(p), 1.0)

    @precondition(lambda self: 'raise_inside_with_publisher' not in OFF)
    @precondition(lambda self: self.live() and self.calm())
    @rule(data=st.data())
    def raise_inside_with_publisher(self, data):
        """Raise inside the ``with Publisher(...)`` block (mid-epoch, whatever was sent)."""
        self.last_fault = self.steps
        p = data.draw(st.sampled_from(self.live()), label="partition")
        g = self.c.current(p)
        self.c.abort_pub(g)
        self.c.wait_acks(g, 0.5)

    @precondition(lambda self: 'kill_publisher' not in OFF)
    @precondition(lambda self: self.calm() and self.live())
    @rule(data=st.data(), settle_first=st.booleans(), restart_now=st.sampled_from([True, True, False]),
          then_subscribe=st.sampled_from([None, (False, 0), (True, 0), (True, 4)]))
    def kill_publisher(self, data, settle_first, restart_now, then_subscribe):
        """SIGKILL a publisher: right away (commands may be in flight) or once it acknowledged
        everything (mid-epoch: whatever it sent at its current epoch stays incomplete); and
        maybe restart it at once (before subscribers give up on it), as a supervisor would."""
        self.last_fault = self.steps
        p = data.draw(st.sampled_from(self.live()), label="partition")
        g = self.c.current(p)
        if settle_first:
            self.c.wait_acks(g, 2.0)
        self.c.kill_pub(g)
        if restart_now and "restart_publisher" not in OFF:
            self.c.restart_pub(p)
            if then_subscribe is not None and len(self.c.subs) < MAX_SUBS:
                self.c.spawn_sub(*then_subscribe)

    @precondition(lambda self: 'restart_publisher' not in OFF)
    @precondition(lambda self: self.dead())
    @rule(data=st.data(), then_subscribe=st.sampled_from([None, None, (False, 0), (True, 0), (True, 4)]))
    def restart_publisher(self, data, then_subscribe):
        """Restart a killed/aborted publisher at its first incomplete epoch (and maybe start a
        fresh subscriber right after, while the restart's snapshot is all it has sent)."""
        p = data.draw(st.sampled_from(self.dead()), label="partition")
        g = self.c.current(p)
        if g.intent == "aborted":
            self.c.confirm_abort(g, timeout=3.0)
        self.c.restart_pub(p)
        if then_subscribe is not None and len(self.c.subs) < MAX_SUBS:
            self.c.spawn_sub(*then_subscribe)

    @precondition(lambda self: 'garbage' not in OFF)
    @precondition(lambda self: self.live())
    @rule(data=st.data(), messages=st.lists(st.one_of(random_message, hello_garbage), max_size=4),
          crafted=st.integers(0, 14), keep=st.booleans())
    def garbage(self, data, messages, crafted, keep):
        p = data.draw(st.sampled_from(self.live()), label="partition")
        g = self.c.current(p)
        self.c.garbage(g, _crafted(TOPIC, p)[crafted] + messages, keep)

    # ---- subscriber rules
    @precondition(lambda self: 'start_subscriber' not in OFF)
    @precondition(lambda self: len(self.c.subs) < MAX_SUBS)
    @rule(recover=st.booleans(), credit=st.sampled_from([0, 0, 4, 16]))
    def start_subscriber(self, recover, credit):
        self.c.spawn_sub(recover, credit)

    @precondition(lambda self: 'stall_subscriber' not in OFF)
    @precondition(lambda self: self.running_subs(stopped=False))
    @rule(data=st.data())
    def stall_subscriber(self, data):
        s = data.draw(st.sampled_from(self.running_subs(stopped=False)), label="sub")
        s.child.signal(signal.SIGSTOP)
        s.child.stopped = True
        self.c.note(f"{s.name} SIGSTOP")

    @precondition(lambda self: 'resume_subscriber' not in OFF)
    @precondition(lambda self: self.running_subs(stopped=True))
    @rule(data=st.data())
    def resume_subscriber(self, data):
        s = data.draw(st.sampled_from(self.running_subs(stopped=True)), label="sub")
        s.child.signal(signal.SIGCONT)
        s.child.stopped = False
        self.c.note(f"{s.name} SIGCONT")

    @precondition(lambda self: 'kill_subscriber' not in OFF)
    @precondition(lambda self: self.running_subs() and self.calm())
    @rule(data=st.data())
    def kill_subscriber(self, data):
        self.last_fault = self.steps
        s = data.draw(st.sampled_from(self.running_subs()), label="sub")
        s.child.kill()
        s.intent = "killed"
        if s.state in ("starting", "running"):
            s.state = "killed"
        self.c.note(f"{s.name} SIGKILLed")

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0]))
    def settle(self, seconds):
        time.sleep(seconds)

    # ---- invariants
    @invariant()
    def promises_hold(self):
        c = self.c
        self.steps += 1
        c.pump()
        c.check_publishers(probe=True)
        c.pump()
        c.assert_ok()

    def teardown(self):
        c = self.c
        try:
            if not c.violations:
                c.pump()
                c.final_check(settle=10.0)
            c.assert_ok()
        finally:
            c.cleanup()
            if VERBOSE:
                print(f"\n=== run of {time.monotonic() - self.t_started:.1f} s, {self.steps} steps, "
                      f"{sum(len(s.delivered) for s in c.subs)} epochs delivered, "
                      f"{sum(len(s.gaps) for s in c.subs)} gaps, "
                      f"errors {[s.error['type'] for s in c.subs if s.error]}")
                print("\n".join(c.log[-400:]))


class AdversarialProduct(AdversarialPubSub):
    ORDER = product(2)


_PHASES = ([Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink] if THOROUGH or
           os.environ.get("ADVERSARY_SHRINK") else [Phase.explicit, Phase.reuse, Phase.generate])

TestAdversarialTotal = AdversarialPubSub.TestCase
TestAdversarialTotal.settings = settings(max_examples=examples(4), stateful_step_count=50 if THOROUGH else 30,
                                         deadline=None, phases=_PHASES, report_multiple_bugs=False)
TestAdversarialTotal = pytest.mark.slow(pytest.mark.timeout(1800)(TestAdversarialTotal))

TestAdversarialProduct = AdversarialProduct.TestCase
TestAdversarialProduct.settings = settings(max_examples=examples(3), stateful_step_count=50 if THOROUGH else 25,
                                           deadline=None, phases=_PHASES, report_multiple_bugs=False)
TestAdversarialProduct = pytest.mark.slow(pytest.mark.timeout(1800)(TestAdversarialProduct))


# -- targeted regressions -------------------------------------------------------------------------------
@pytest.fixture
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.cleanup()


def _epoch(c: Cluster, g: Gen, t, n: int = 5) -> None:
    """Send ``n`` records at ``t`` and complete it (acknowledged)."""
    c.command(g, "send", t, n)
    c.command(g, "advance", t + 1)
    assert c.wait_acks(g, 10), f"{g.name} did not acknowledge"


def _wait_for(c: Cluster, cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c.pump()
        if cond():
            return True
        time.sleep(0.05)
    c.pump()
    return cond()


def _start(c: Cluster) -> tuple[Gen, Gen]:
    p0, p1 = c.spawn_pub(0), c.spawn_pub(1)
    assert c.wait_pub_ready(p0) and c.wait_pub_ready(p1), c.violations
    return p0, p1


@pytest.mark.slow
def test_regression_restart_never_yields_an_epoch_with_one_partitions_records(cluster):
    """Defect 1. Partition 0 is ahead (completed 0..4, sent part of 5), partition 1 behind
    (completed 0..2, sent part of 3). Partition 0's publisher is SIGKILLed and restarted at its
    first incomplete epoch (start=5); a recover=True subscriber re-joins and yields a Gap. After
    that it must never deliver an epoch with partition 1's records only: epoch 4 -- completed by
    partition 0's dead incarnation, whose records the subscriber lost at the re-join -- must be
    skipped (covered by the Gap), not delivered as partition 1's half; epoch 6 must come whole.
    At 5ebe8d1: the restart's snapshot had an empty upper frontier, so epoch 4 was delivered
    with partition 1's 5 records only (and the Gap did not cover it)."""
    c = cluster
    p0, p1 = _start(c)
    sub = c.spawn_sub(recover=True, credit=0)
    assert sub.state == "running", c.violations
    for t in range(5):
        _epoch(c, p0, t)
    for t in range(3):
        _epoch(c, p1, t)
    c.command(p0, "send", 5, 5)
    c.command(p1, "send", 3, 5)
    assert c.wait_acks(p0, 10) and c.wait_acks(p1, 10)
    assert _wait_for(c, lambda: 2 in sub.delivered_set, 10), (sub.delivered, c.log[-20:])
    time.sleep(0.3)
    c.kill_pub(p0)
    g1 = c.restart_pub(0)
    assert g1.state == "live", c.violations
    assert g1.start == 5
    assert _wait_for(c, lambda: sub.gaps or sub.state != "running", 15), c.log[-20:]
    assert sub.gaps, f"no Gap after the restart: {sub.error}"
    _epoch(c, g1, 5)  # the restart re-sends its first incomplete epoch in full
    _epoch(c, p1, 3)  # the rest of partition 1's epoch 3, then 4, 5, 6
    for t in range(4, 7):
        _epoch(c, p1, t)
    _epoch(c, g1, 6)
    _wait_for(c, lambda: 6 in sub.delivered_set or sub.state != "running", 15)
    c.assert_ok()
    assert 6 in sub.delivered_set, (sub.delivered, sub.error)


@pytest.mark.slow
def test_regression_restarted_publisher_announces_its_predecessors_upper_frontier(cluster):
    """Defect 2. Partition 1 sends and completes epochs 0..9, is SIGKILLed and restarted with
    start=10; a fresh subscriber joins; partition 0 (which had completed 0..4) then sends epochs
    5..9. Partition 1's records of 5..9 were sent before the subscriber joined, so it must skip
    5..9 -- not deliver them with partition 0's records only -- and then deliver epoch 10 whole.
    At 5ebe8d1 epochs 5..9 were delivered with partition 0's records only."""
    c = cluster
    p0, p1 = _start(c)
    for t in range(10):
        _epoch(c, p1, t)
    for t in range(5):
        _epoch(c, p0, t)
    c.kill_pub(p1)
    g1 = c.restart_pub(1)
    assert g1.state == "live" and g1.start == 10, c.violations
    sub = c.spawn_sub(recover=False, credit=0)
    assert sub.state == "running", (sub.error, c.violations)
    for t in range(5, 10):
        _epoch(c, p0, t)
    _epoch(c, p0, 10)
    _epoch(c, g1, 10)
    _wait_for(c, lambda: 10 in sub.delivered_set or sub.state != "running", 15)
    c.assert_ok()
    assert 10 in sub.delivered_set, (sub.delivered, sub.error)


@pytest.mark.slow
def test_regression_exception_inside_with_publisher_is_an_abort_not_a_close(cluster):
    """Defect 3. An exception inside ``with Publisher(...)`` mid-epoch (partition 0 sent part of
    epoch 3; partition 1 completed it): the subscriber must not receive epoch 3 as complete; it
    gets ``PublisherAborted`` naming partition 0. At 5ebe8d1 ``__exit__`` closed the publisher
    (as after a clean end), so epoch 3 was delivered with partition 0's 5 records, and epochs 4..7
    with partition 1's records only."""
    c = cluster
    p0, p1 = _start(c)
    sub = c.spawn_sub(recover=False, credit=0)
    assert sub.state == "running", c.violations
    for t in range(3):
        _epoch(c, p0, t)
    for t in range(5):
        _epoch(c, p1, t)
    c.command(p0, "send", 3, 5)
    assert c.wait_acks(p0, 10)
    c.abort_pub(p0)
    c.confirm_abort(p0, timeout=15)
    assert p0.state == "aborted", c.log[-10:]
    for t in range(5, 8):
        _epoch(c, p1, t)
    _wait_for(c, lambda: sub.state != "running", 15)
    c.assert_ok()
    assert sub.error is not None, f"no error after the abort; delivered {sub.delivered}, state {sub.state}"
    assert sub.error["type"] == "PublisherAborted" and sub.error["partition"] == 0, sub.error
    assert 3 not in sub.delivered_set


@pytest.mark.slow
def test_regression_rejoin_after_eviction_never_passes_the_tail_of_an_epoch(cluster):
    """Found by the state machine (5ebe8d1): a recover=True subscriber that is evicted mid-epoch
    and re-joins must drop what is left of that epoch (it is covered by the Gap). The
    subscriber's cache of filter verdicts, keyed by the protocol state's ``version``, survived the
    re-join; the new join's version counted up to the same number, so the stale "passes" verdict
    let the tail of epoch 1 through: epoch 1 was delivered with partition 1's records 10..19
    only."""
    c = cluster
    p0, p1 = _start(c)
    c.command(p0, "send", 0, 5)  # upper {0}: the subscriber's filter starts as {0} ...
    assert c.wait_acks(p0, 10)
    sub = c.spawn_sub(recover=True, credit=0)
    assert sub.state == "running", c.violations
    for g in (p0, p1):  # ... and is retired when both partitions pass 0
        c.command(g, "advance", 1)
    c.command(p1, "send", 1, 10)  # the subscriber caches "time 1 passes"
    assert c.wait_acks(p0, 10) and c.wait_acks(p1, 10)
    time.sleep(0.5)
    sub.child.signal(signal.SIGSTOP)
    c.command(p0, "burst", 1, 200, 10, 4000)  # ~8 MB while it is stopped: evicted (bound 4 MiB)
    assert c.wait_acks(p0, 20)
    c.command(p0, "flush")
    assert c.wait_acks(p0, 20)
    sub.child.signal(signal.SIGCONT)
    assert _wait_for(c, lambda: sub.gaps or sub.state != "running", 20), c.log[-10:]
    assert sub.gaps and sub.gaps[0]["reason"] == "lagged", (sub.gaps, sub.error)
    c.command(p1, "send", 1, 10)  # the tail of epoch 1, after the re-join
    for g in (p0, p1):
        c.command(g, "advance", 2)
        c.command(g, "send", 2, 3)
        c.command(g, "advance", 3)
    assert c.wait_acks(p0, 10) and c.wait_acks(p1, 10)
    _wait_for(c, lambda: 2 in sub.delivered_set or sub.state != "running", 15)
    c.assert_ok()
    assert 1 not in sub.delivered_set and 2 in sub.delivered_set, (sub.delivered, sub.error)


@pytest.mark.slow
def test_regression_publisher_memory_is_bounded_with_stalled_flow_controlled_peers(cluster):
    """"Memory stays bounded": with ``max_queue_bytes`` 4 MiB, a publisher whose subscribers
    asked for flow control and then stopped reading -- a real one (SIGSTOP) and a fake one (a raw
    hello with credit 1 that never reads) -- must not buffer what it is given without bound:
    its RSS stays below RSS_LIMIT while ~450 MB are published (the producer is held back and
    the stalled peers are evicted after ``credit_timeout``). At 5ebe8d1 a flow-controlled peer's
    backlog was bounded by ``max_queue_messages`` (default 100,000) only, not by bytes."""
    c = cluster
    p0, p1 = _start(c)
    subs = [c.spawn_sub(recover=False, credit=4), c.spawn_sub(recover=True, credit=16)]
    assert all(s.state == "running" for s in subs), c.violations
    for s in subs:
        s.child.signal(signal.SIGSTOP)
        s.child.stopped = True
    c.garbage(p0, [wire.encode_control(wire.HELLO, topic=TOPIC, partition=0, id=uuid.uuid4().hex,
                                       credit=1)], keep=True)
    peak = 0
    for t in range(16):  # 16 x 500 messages of 14 records of ~4 KB: ~450 MB in all
        c.command(p0, "burst", t, 500, 14, 4000)
        c.command(p0, "advance", t + 1)
        deadline = time.monotonic() + 60
        while p0.pending() and time.monotonic() < deadline:
            c.wait_acks(p0, 0.2)
            try:
                peak = max(peak, psutil.Process(p0.child.pid).memory_info().rss)
            except psutil.Error:
                break
            if peak > RSS_LIMIT:
                break
        if peak > RSS_LIMIT or p0.pending():
            break
    assert peak < RSS_LIMIT, f"publisher RSS reached {peak >> 20} MiB (limit {RSS_LIMIT >> 20} MiB)"
    assert not p0.pending(), f"the producer stayed blocked: {p0.pending()}"
    c.check_publishers(probe=True)
    c.assert_ok()


def test_new_failure_api_exists():
    """The API the adversarial rules rely on (being added to transport/errors)."""
    import inspect

    import epochstream
    from epochstream import errors
    from epochstream.transport import Publisher

    missing = [name for name, ok in [
        ("epochstream.errors.PublisherAborted", hasattr(errors, "PublisherAborted")),
        ("epochstream.PublisherAborted", "PublisherAborted" in getattr(epochstream, "__all__", ())),
        ("Publisher.abort", hasattr(Publisher, "abort")),
        ("Publisher(credit_timeout=)", "credit_timeout" in inspect.signature(Publisher.__init__).parameters),
    ] if not ok]
    assert not missing, f"missing: {missing}"
    exc = errors.PublisherAborted("x", partition=1)
    assert exc.partition == 1 and isinstance(exc, errors.EpochstreamError)
