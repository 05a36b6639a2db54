"""The exactly-once staging ledger (:mod:`epochstream.spark.staging`) on its own: no Spark, no
sockets. A Hypothesis state machine interleaves stage / flush / commit / abort / re-runs and
restarts (new run ids) across attempts and epochs, against a plain model of what each attempt
staged and a fake publisher (a list of published payloads and a frontier, advanced as the host
does after a commit)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis_profiles import examples

from epochstream.spark.staging import Staged, StagingLedger, StagingRefused

RUNS = ["run-0", "run-1", "run-2", "run-3"]


def snapshot(ledger: StagingLedger):
    """Everything observable about a ledger."""
    return (ledger.epochs(), {e: ledger.attempts(e) for e in ledger.epochs()},
            ledger.staged_bytes, ledger.counts)


class LedgerMachine(RuleBasedStateMachine):
    """Model: ``staged[(epoch, run, attempt)] = [(payload, rows), ...]`` still held; the fake
    publisher: ``published`` ``[(epoch, payload)]`` and ``frontier`` (first incomplete epoch)."""

    @initialize(max_bytes=st.integers(0, 3000))
    def setup(self, max_bytes):
        self.ledger = StagingLedger(max_bytes)
        self.frontier = 0
        self.runs = 1                      # run ids in use: RUNS[:runs]; a restart adds one
        self.staged: dict[tuple, list] = {}
        self.published: list[tuple[int, bytes]] = []
        self.published_rows = 0
        self.ids = itertools.count()

    # ---- helpers

    def epoch(self, data):
        return data.draw(st.integers(max(0, self.frontier - 2), self.frontier + 3), label="epoch")

    def attempt_key(self, data, epoch):
        """An attempt of ``epoch``: mostly one that staged, sometimes any."""
        known = sorted(k[1:] for k in self.staged if k[0] == epoch)
        fresh = st.tuples(st.sampled_from(RUNS[:self.runs]), st.integers(0, 3))
        return data.draw(st.sampled_from(known) | fresh if known else fresh, label="attempt")

    def held(self, epoch, key):
        items = self.staged.get((epoch, *key), [])
        return len(items), sum(r for _, r in items)

    def drop_below(self, frontier):
        for k in [k for k in self.staged if k[0] < frontier]:
            del self.staged[k]

    # ---- rules

    @rule(data=st.data(), size=st.integers(1, 400), rows=st.integers(0, 50))
    def stage(self, data, size, rows):
        epoch = self.epoch(data)
        run, attempt = data.draw(st.sampled_from(RUNS[:self.runs])), data.draw(st.integers(0, 3))
        payload = f"{next(self.ids)}:".encode().ljust(size, b".")
        before = snapshot(self.ledger)
        if epoch >= self.frontier and self.ledger.staged_bytes + len(payload) > \
                self.ledger.max_staged_bytes:
            with pytest.raises(StagingRefused, match="staging full"):
                self.ledger.stage(self.frontier, epoch, run, attempt, payload, rows)
            assert snapshot(self.ledger) == before
            return
        staged = self.ledger.stage(self.frontier, epoch, run, attempt, payload, rows)
        assert staged == (epoch >= self.frontier)
        if staged:
            self.staged.setdefault((epoch, run, attempt), []).append((payload, rows))
        else:  # a straggler of a committed epoch: dropped, nothing changes
            assert snapshot(self.ledger) == before

    @rule(data=st.data(), lie=st.sampled_from([(0, 0), (1, 0), (0, 1), (-1, 0), (0, -1)]))
    def flush(self, data, lie):
        epoch = self.epoch(data)
        run, attempt = self.attempt_key(data, epoch)
        batches, rows = self.held(epoch, (run, attempt))
        claim = (batches + lie[0], rows + lie[1])
        before = snapshot(self.ledger)
        if epoch < self.frontier:
            assert self.ledger.flush(self.frontier, epoch, run, attempt, *claim) is None
        elif lie != (0, 0):
            with pytest.raises(StagingRefused, match="the task sent"):
                self.ledger.flush(self.frontier, epoch, run, attempt, *claim)
        else:
            s = self.ledger.flush(self.frontier, epoch, run, attempt, *claim)
            assert (s.batches, s.rows) == (batches, rows)
        assert snapshot(self.ledger) == before

    @rule(data=st.data())
    def commit(self, data):
        epoch = self.epoch(data)
        n = data.draw(st.integers(0, 3), label="attempts named")
        named = [self.attempt_key(data, epoch) for _ in range(n)]
        reports = []
        for run, attempt in named:
            rows = self.held(epoch, (run, attempt))[1]
            how = data.draw(st.sampled_from(["true", "true", "none", "wrong"]), label="report")
            reports.append((run, attempt, {"true": rows, "none": None, "wrong": rows + 1}[how]))
        self.check_commit(epoch, named, reports)

    def check_commit(self, epoch, named, reports):
        before = snapshot(self.ledger)
        if epoch < self.frontier:  # a repeated commit, or the re-run of a committed batch
            plan = self.ledger.commit(self.frontier, epoch, reports)
            assert plan.duplicate and plan.payloads == () and plan.next_epoch == self.frontier
            assert snapshot(self.ledger)[:3] == before[:3]
            assert self.ledger.counts.duplicates == before[3].duplicates + 1
            return
        if any(r is not None and r != self.held(epoch, (run, a))[1] for run, a, r in reports):
            with pytest.raises(StagingRefused, match="staged rows differ"):
                self.ledger.commit(self.frontier, epoch, reports)
            assert snapshot(self.ledger) == before  # refused: nothing changed
            return
        plan = self.ledger.commit(self.frontier, epoch, reports)
        winners = list(dict.fromkeys(named))
        expected = [p for key in winners for p, _ in self.staged.get((epoch, *key), [])]
        assert not plan.duplicate and list(plan.payloads) == expected
        assert plan.rows == sum(self.held(epoch, k)[1] for k in winners)
        assert plan.empty_attempts == sum(1 for k in winners if (epoch, *k) not in self.staged)
        # the fake publisher: publish, then advance the frontier past the epoch
        self.published += [(epoch, p) for p in plan.payloads]
        self.published_rows += plan.rows
        assert plan.next_epoch == epoch + 1
        self.frontier = plan.next_epoch
        self.drop_below(self.frontier)

    @rule(data=st.data())
    def abort(self, data):
        epoch = self.epoch(data)
        n = sum(len(v) for k, v in self.staged.items() if k[0] == epoch)
        assert self.ledger.abort(epoch) == n
        for k in [k for k in self.staged if k[0] == epoch]:
            del self.staged[k]

    @precondition(lambda self: self.runs < len(RUNS))
    @rule()
    def restart(self):
        """The query restarts: a new run id; it re-runs the batch after the last one Spark
        recorded as committed, which may be one the host already completed."""
        self.runs += 1

    @rule(data=st.data())
    def rerun_committed_epoch(self, data):
        """A re-run of an epoch the host already completed: its rows are dropped on arrival,
        its COMMIT is a duplicate."""
        if self.frontier == 0:
            return
        epoch = data.draw(st.integers(0, self.frontier - 1))
        run = RUNS[self.runs - 1]
        before = snapshot(self.ledger)
        assert not self.ledger.stage(self.frontier, epoch, run, 9, b"late", 4)
        assert snapshot(self.ledger) == before
        self.check_commit(epoch, [(run, 9)], [(run, 9, 4)])

    # ---- invariants

    @invariant()
    def memory_is_accounted(self):
        live = [p for v in self.staged.values() for p, _ in v]
        assert self.ledger.staged_bytes == sum(len(p) for p in live)
        assert self.ledger.staged_bytes <= self.ledger.max_staged_bytes

    @invariant()
    def ledger_matches_the_model(self):
        epochs = sorted({k[0] for k in self.staged})
        assert list(self.ledger.epochs()) == epochs
        assert all(e >= self.frontier for e in epochs)  # committed epochs are freed
        for e in epochs:
            model = {k[1:]: Staged(len(v), sum(r for _, r in v), sum(len(p) for p, _ in v))
                     for k, v in self.staged.items() if k[0] == e}
            assert self.ledger.attempts(e) == model

    @invariant()
    def nothing_published_twice(self):
        payloads = [p for _, p in self.published]
        assert len(payloads) == len(set(payloads))
        epochs = [e for e, _ in self.published]
        assert epochs == sorted(epochs) and all(e < self.frontier for e in epochs)

    @invariant()
    def every_batch_is_accounted(self):
        c = self.ledger.counts
        live = sum(len(v) for v in self.staged.values())
        assert c.staged_batches == c.batches + c.discarded_batches + live
        assert c.batches == len(self.published) and c.rows == self.published_rows

    def teardown(self):
        if not hasattr(self, "ledger"):
            return
        # Spark commits one more epoch past everything staged: every stale batch is freed
        last = max([self.frontier, *(k[0] for k in self.staged)])
        self.check_commit(last, [], [])
        assert self.ledger.staged_bytes == 0 and self.ledger.epochs() == ()
        self.every_batch_is_accounted()


LedgerMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40)
TestLedger = LedgerMachine.TestCase


# ---- single properties


@settings(max_examples=examples(100))
@given(rows=st.lists(st.integers(1, 30), min_size=1, max_size=5), extra=st.integers(-3, 3))
def test_commit_with_mismatched_rows_is_refused_and_changes_nothing(rows, extra):
    ledger = StagingLedger()
    for i, n in enumerate(rows):
        ledger.stage(0, 0, "run", 1, b"x" * (i + 1), n)
    reported = sum(rows) + (extra or 1)
    before = snapshot(ledger)
    with pytest.raises(StagingRefused, match="staged rows differ"):
        ledger.commit(0, 0, [("run", 1, reported)])
    assert snapshot(ledger) == before
    plan = ledger.commit(0, 0, [("run", 1, sum(rows))])
    assert plan.rows == sum(rows) and plan.batches == len(rows)


@settings(max_examples=examples(100))
@given(batches=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3),
                                  st.integers(1, 9)), min_size=1, max_size=8))
def test_repeated_commit_and_rerun_after_restart_publish_nothing_twice(batches):
    """Commit epoch 0 with attempt ("a", 1); commit it again; a restart re-runs epoch 0 under
    run "r" (its rows arrive late, its COMMIT repeats): only the first commit publishes."""
    ledger = StagingLedger()
    for i, (run, attempt, n) in enumerate(batches):
        ledger.stage(0, 0, run, attempt, bytes([i]) * n, n)
    first = ledger.commit(0, 0, [("a", 1)])
    frontier = first.next_epoch
    assert frontier == 1
    again = ledger.commit(frontier, 0, [("a", 1)])
    assert not ledger.stage(frontier, 0, "r", 7, b"rerun", 1)
    rerun = ledger.commit(frontier, 0, [("r", 7, 1)])
    assert again.duplicate and rerun.duplicate and again.payloads == rerun.payloads == ()
    assert first.payloads == tuple(bytes([i]) * n for i, (run, a, n) in enumerate(batches)
                                   if (run, a) == ("a", 1))
    c = ledger.counts
    assert c.duplicates == 2 and c.epochs == 1 and ledger.staged_bytes == 0
    assert c.discarded_batches == len(batches) - len(first.payloads)


@settings(max_examples=examples(100))
@given(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=20), bound=st.integers(0, 500))
def test_staged_bytes_are_bounded_and_freed(sizes, bound):
    ledger = StagingLedger(bound)
    accepted = 0
    for i, n in enumerate(sizes):
        try:
            assert ledger.stage(0, i % 3, "run", i % 2, b"p" * n, 1)
            accepted += n
        except StagingRefused:
            assert accepted + n > bound
        assert ledger.staged_bytes == accepted <= bound
    ledger.abort(1)
    plan = ledger.commit(0, 2, [])  # frees epochs 0 .. 2
    assert plan.payloads == () and ledger.staged_bytes == 0 and ledger.epochs() == ()
