"""Where a publisher starts (epochstream/start.py), as pure functions: each case on its own,
including the refusals, and the property that matters to subscribers — a restart never
announces an upper frontier below what the catalog recorded (else a new subscriber would
combine a dead incarnation's part of an epoch with the new one's)."""

import doctest

import pytest
from hypothesis import given, strategies as st

import epochstream.start as start_mod
from epochstream.errors import ProtocolError
from epochstream.order import TOTAL, product
from epochstream.start import (continued_frontiers, given_frontiers, inherited_upper,
                               resumed_lower)

P2 = product(2)


def test_module_doctests_pass():
    result = doctest.testmod(start_mod)
    assert result.attempted >= 2 and result.failed == 0


def test_given_frontiers_checks_both_and_takes_an_antichain_of_capabilities():
    assert given_frontiers(TOTAL, None, [3]) == ([0], [3])
    assert given_frontiers(P2, [(0, 2), (1, 0)], [(0, 5)]) == ([(0, 2), (1, 0)], [(0, 5)])
    with pytest.raises(ProtocolError):
        given_frontiers(P2, (0, 1), [7])  # an upper time of the wrong shape


def test_a_fresh_stream_inherits_nothing():
    assert inherited_upper(TOTAL, None, (9,), who="t/0") == ()
    assert inherited_upper(TOTAL, 0, (9,), who="t/0") == ()  # the minimum: all re-sent


def test_the_recorded_upper_frontier_is_inherited_unpadded():
    # padding (5 - 1 = 4) would drop other partitions' data at epochs this one never began
    assert inherited_upper(TOTAL, 5, (2,), who="t/0") == (2,)
    assert inherited_upper(P2, (1, 1), ((0, 7), (3, 0)), who="t/0") == ((0, 7), (3, 0))


def test_without_a_record_a_total_order_takes_start_minus_one_and_others_refuse():
    assert inherited_upper(TOTAL, 5, None, who="t/0") == (4,)
    with pytest.raises(ProtocolError, match="t/0"):
        inherited_upper(P2, (1, 1), None, who="t/0")


def test_an_unfinished_log_resumes_at_its_lower_frontier_or_a_later_start():
    assert resumed_lower(TOTAL, None, [4], who="t/0") == [4]
    assert resumed_lower(TOTAL, 6, [4], who="t/0") == [6]
    with pytest.raises(ProtocolError, match="before the logged lower frontier"):
        resumed_lower(TOTAL, 3, [4], who="t/0")
    assert resumed_lower(P2, (2, 2), [(1, 0), (0, 2)], who="t/0") == [(2, 2)]
    with pytest.raises(ProtocolError):
        resumed_lower(P2, (0, 1), [(1, 0), (0, 2)], who="t/0")


def test_a_finished_log_continues_after_its_stream():
    assert continued_frontiers(TOTAL, None, [], who="t/0") == ([0], [])
    assert continued_frontiers(TOTAL, None, [9, 4], who="t/0") == ([10], [9])
    assert continued_frontiers(TOTAL, 12, [9], who="t/0") == ([12], [9])
    with pytest.raises(ProtocolError, match="not after the finished stream"):
        continued_frontiers(TOTAL, 9, [9], who="t/0")
    with pytest.raises(ProtocolError, match="pass start="):
        continued_frontiers(P2, None, [(1, 1)], who="t/0")
    assert continued_frontiers(P2, (2, 0), [(1, 1)], who="t/0") == ([(2, 0)], [(1, 1)])
    with pytest.raises(ProtocolError):
        continued_frontiers(P2, (0, 1), [(1, 1)], who="t/0")


@given(start=st.integers(1, 50), recorded=st.one_of(st.none(), st.lists(
    st.integers(0, 60), min_size=0, max_size=1).map(tuple)))
def test_a_restart_never_announces_less_than_the_record(start, recorded):
    upper = inherited_upper(TOTAL, start, recorded, who="t/0")
    if recorded is not None:
        assert upper == recorded
    else:
        assert upper == (start - 1,)


@given(start=st.one_of(st.none(), st.integers(0, 40)),
       uppers=st.lists(st.integers(0, 30), max_size=4))
def test_a_continued_stream_starts_strictly_after_every_logged_time(start, uppers):
    try:
        lower, upper = continued_frontiers(TOTAL, start, uppers, who="t/0")
    except ProtocolError:
        assert uppers and start is not None and start <= max(uppers)
        return
    assert all(lower[0] > u for u in uppers)
    assert sorted(upper) == sorted(set(max(uppers, default=None) for _ in [0]) - {None})
