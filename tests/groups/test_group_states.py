"""A Hypothesis state machine over real EpochGroup workers sharing one catalog (in-process):
workers fetch, ack, nak, let leases expire and go away; the invariants of issue 12 hold at every
step and every epoch is completed exactly once in the end."""

from __future__ import annotations

import tempfile
import time

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import hypothesis_profiles  # noqa: F401
from hypothesis_profiles import examples
from epochstream import Catalog, EpochGroup, LeaseExpired, Publisher, Retention, product

ACK_WAIT = 0.2
ORDER = product(2)
TIMES = [(d, i) for d in range(3) for i in range(3)]


class GroupMachine(RuleBasedStateMachine):
    @initialize(mode=st.sampled_from(["shared", "ordered", "partial"]))
    def setup(self, mode):
        self.dir = tempfile.TemporaryDirectory()
        self.cat = Catalog(self.dir.name)
        with Publisher("w", catalog=self.cat, order=ORDER, retention=Retention()) as pub:
            for t in TIMES:
                pub.send(t, [[t[0], t[1]]])
        self.mode = mode
        self.workers = [EpochGroup("w", "g", self.cat, mode=mode, ack_wait=ACK_WAIT,
                                   max_deliver=1000, worker=f"w{i}") for i in range(3)]
        self.held: dict = {}  # time -> (worker index, lease)
        self.completed: list = []  # times whose ack was accepted

    def teardown(self):
        if hasattr(self, "dir"):
            self.dir.cleanup()

    @rule(w=st.integers(0, 2), n=st.integers(1, 3))
    def fetch(self, w, n):
        for lease in self.workers[w].fetch(n, expires=0):
            t = lease.epoch.time
            assert t not in self.completed, f"epoch {t} leased after it was completed"
            assert list(lease.epoch.records) == [t], "an epoch must be whole"
            if self.mode != "shared":  # nothing below an unacked epoch is ... above it
                for u in TIMES:
                    if ORDER.lt(u, t):
                        assert u in self.completed, f"{t} leased before {u} was acked"
            self.held[t] = (w, lease)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        t = data.draw(st.sampled_from(sorted(self.held)))
        w, lease = self.held.pop(t)
        try:
            lease.ack()
        except LeaseExpired:
            return  # it expired: someone else may complete it
        assert t not in self.completed, f"epoch {t} completed twice"
        self.completed.append(t)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def nak(self, data):
        t = data.draw(st.sampled_from(sorted(self.held)))
        w, lease = self.held.pop(t)
        try:
            lease.nak()
        except LeaseExpired:
            pass

    @rule()
    def expire(self):
        time.sleep(ACK_WAIT * 1.5)

    @invariant()
    def one_live_lease_per_epoch(self):
        if not hasattr(self, "cat"):
            return
        info = self.cat.group_info("w", "g")
        assert len(set(info.leased)) == len(info.leased)
        assert not set(info.acked) & set(info.leased)

    def check_end(self):
        for _, lease in list(self.held.values()):
            try:
                lease.ack()
                self.completed.append(lease.epoch.time)
            except LeaseExpired:
                pass
        self.held.clear()
        time.sleep(ACK_WAIT * 1.5)
        for lease in self.workers[0].leases(expires=2 * ACK_WAIT):
            try:
                lease.ack()
            except LeaseExpired:  # a slow moment: it is leased again below
                continue
            self.completed.append(lease.epoch.time)
        assert sorted(self.completed) == sorted(TIMES)  # exactly once each


class GroupMachineEnding(GroupMachine):
    def teardown(self):
        try:
            if hasattr(self, "cat"):
                self.check_end()
        finally:
            super().teardown()


TestGroupStates = GroupMachineEnding.TestCase
TestGroupStates.settings = settings(max_examples=examples(6), stateful_step_count=12,
                                    deadline=None)
