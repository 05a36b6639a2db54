"""Unit tests for epochstream.frontier (timely progress/frontier.rs semantics); the model-based
property tests are in test_frontier_model.py."""
import pytest

from epochstream.errors import ProtocolError
from epochstream.frontier import Antichain, MutableAntichain, apply_changes
from epochstream.order import TOTAL, dual, product


def test_antichain_keeps_minimal_elements():
    P = product(2)
    a = Antichain(P)
    assert a.insert((1, 3)) and a.insert((3, 1))
    assert not a.insert((2, 3))  # (1, 3) <= (2, 3)
    assert a.insert((1, 1))  # evicts both
    assert a.elements == ((1, 1),)
    assert a.less_equal((1, 1)) and not a.less_than((1, 1)) and a.less_than((1, 2))
    assert not a.less_equal((0, 5))


def test_upper_frontier_over_dual_keeps_maximal():
    P = product(2)
    up = Antichain(dual(P), [(1, 1), (0, 3), (2, 0), (2, 2)])
    assert set(up.elements) == {(0, 3), (2, 2)}


def test_dominates_already_holds_at_subscription():
    # The pitfall named in the issue: lower frontier "dominates" the upper at subscription time.
    lower = Antichain(TOTAL, [3])
    upper = Antichain(TOTAL, [5])
    assert lower.dominates(upper)


def test_mutable_antichain_total_order():
    m = MutableAntichain(TOTAL, [(0, 1)])
    assert m.frontier == (0,)
    assert m.update_iter([(1, 1), (0, -1)]) == [(0, -1), (1, 1)]
    assert m.update_iter([(1, 1)]) == []  # count 2 at 1: frontier unchanged
    assert m.update_iter([(1, -1)]) == []
    assert m.update_iter([(5, 0)]) == []  # zero delta dropped
    assert m.update_iter([(1, -1)]) == [(1, -1)]
    assert m.frontier == () and len(m) == 0  # consolidated: nothing stored


def test_mutable_antichain_transient_negative():
    m = MutableAntichain(TOTAL, [(0, 1)])
    assert m.update_iter([(2, -1)]) == []  # -1 before its +1: not in the frontier
    assert m.count_for(2) == -1
    assert m.update_iter([(0, -1), (2, 1)]) == [(0, -1)]  # 2 nets to zero
    assert m.frontier == () and len(m) == 0


def test_mutable_antichain_product_order():
    P = product(2)
    m = MutableAntichain(P, [((0, 0), 1)])
    ch = m.update_iter([((1, 0), 1), ((0, 1), 1), ((0, 0), -1)])
    assert sorted(ch) == [((0, 0), -1), ((0, 1), 1), ((1, 0), 1)]
    assert m.update_iter([((1, 1), 1)]) == []  # beyond the frontier: no rebuild
    ch = m.update_iter([((0, 1), -1)])
    assert ch == [((0, 1), -1)]  # (1, 1) is dominated by (1, 0)
    assert m.frontier == ((1, 0),)
    assert m.update_iter([((1, 0), -1)]) == [((1, 0), -1), ((1, 1), 1)]


def test_apply_changes_is_the_frontier_bookkeeping():
    f = {0: True}
    apply_changes(f, [(0, -1), (2, 1), (1, 1)])
    assert list(f) == [2, 1]
    apply_changes(f, [(5, -1)])  # lenient: removing an absent element is a no-op
    assert list(f) == [2, 1]
    with pytest.raises(ProtocolError, match="already an element"):
        apply_changes(f, [(2, 1)], strict=True)
    with pytest.raises(ProtocolError, match="not an element"):
        apply_changes(f, [(7, -1)], strict=True)
