"""The publisher's inbound quota (epochstream/transport/quota.py) as a pure state machine: a
connection is refused only when it was read ``burst`` times while the loop stayed behind; the
loop catching up forgives everyone; refusals are remembered within a bound; cuts come due once,
in order."""

import pytest
from hypothesis import given, strategies as st

import hypothesis_profiles  # noqa: F401
from epochstream.transport.quota import Quota


def test_a_loop_that_catches_up_refuses_nobody_whatever_was_read():
    q = Quota(burst=10)
    for _ in range(100):
        assert q.charge({b"a": 9, b"b": 9}, caught_up=True) == []
    assert q.charged(b"a") == 0


def test_a_connection_read_burst_times_while_behind_is_refused_once():
    q = Quota(burst=10)
    assert q.charge({b"flood": 6, b"sub": 1}, caught_up=False) == []
    assert q.charge({b"flood": 4, b"sub": 1}, caught_up=False) == [b"flood"]
    q.refuse(b"flood", now=1.0, context="fd")
    assert not q.admits(b"flood") and q.admits(b"sub")
    assert q.discarded == 1 and q.refusals == 1
    assert q.charged(b"sub") == 2


def test_catching_up_clears_the_charges():
    q = Quota(burst=10)
    q.charge({b"a": 9}, caught_up=False)
    q.charge({}, caught_up=True)
    assert q.charge({b"a": 9}, caught_up=False) == []


def test_cuts_come_due_once_after_cut_after():
    q = Quota(burst=1, cut_after=0.5)
    q.refuse(b"a", 1.0, "ctx-a")
    q.refuse(b"b", 1.2, "ctx-b")
    assert q.cuts_due(1.4) == []
    assert q.cuts_due(1.5) == [(b"a", "ctx-a")]
    assert q.cuts_due(9.0) == [(b"b", "ctx-b")]
    assert q.cuts_due(9.0) == []


def test_refused_connections_are_remembered_within_a_bound():
    q = Quota(burst=1, max_refused=3)
    for i in range(5):
        q.refuse(bytes([i]), 0.0)
    assert list(q.refused) == [bytes([2]), bytes([3]), bytes([4])]
    assert q.refusals == 5


@pytest.mark.parametrize("burst", [0, -1, 1.5, "10", None, True])
def test_a_bad_burst_is_refused(burst):
    with pytest.raises(ValueError, match="burst"):
        Quota(burst=burst)


@given(passes=st.lists(st.tuples(st.dictionaries(st.sampled_from([b"a", b"b", b"c"]),
                                                 st.integers(0, 300)),
                                 st.booleans()), max_size=40),
       burst=st.integers(1, 500))
def test_model_refused_exactly_when_the_reads_since_the_last_catch_up_reach_burst(passes, burst):
    """Against a model: a connection is returned by charge() exactly when its reads since the
    loop last caught up (or since it was last returned) reach ``burst``."""
    q, model = Quota(burst=burst), {}
    for read, caught_up in passes:
        over = q.charge(read, caught_up)
        if caught_up:
            model.clear()
            assert over == []
            continue
        want = []
        for ident, n in read.items():
            model[ident] = model.get(ident, 0) + n
            if model[ident] >= burst:
                want.append(ident)
                model.pop(ident)
        assert over == want
        for ident in model:
            assert q.charged(ident) == model[ident]
