"""Unit tests for epochstream.order and epochstream.frontier (timely semantics)."""
import pytest

from epochstream.errors import ProtocolError
from epochstream.frontier import Antichain, MutableAntichain
from epochstream.order import TOTAL, by_name, dual, linear_extension, product


def test_total_order_basics():
    assert TOTAL.le(1, 1) and TOTAL.lt(1, 2) and not TOTAL.lt(2, 2)
    assert TOTAL.minimum == 0 and TOTAL.check(7) == 7
    with pytest.raises(ProtocolError, match="expected an int"):
        TOTAL.check((1, 2))
    with pytest.raises(ProtocolError):
        TOTAL.check(True)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_product_order_is_componentwise_not_lexicographic(n):
    P = product(n)
    a = (0,) * (n - 1) + (5,)
    b = (1,) + (0,) * (n - 1)
    if n > 1:
        assert a < b  # Python's lexicographic order says a < b ...
        assert not P.le(a, b) and not P.le(b, a)  # ... but they are incomparable
    assert P.le(P.minimum, a) and P.lt(P.minimum, b)
    assert P.check(list(a)) == a
    with pytest.raises(ProtocolError, match=f"tuple of {n} ints"):
        P.check((1,) * (n + 1))
    assert by_name(P.name) is P


def test_dual_and_linear_extension():
    P = product(2)
    D = dual(P)
    assert D.le((2, 2), (1, 1)) and not D.le((1, 1), (2, 2))
    times = [(2, 0), (0, 2), (1, 1), (0, 0), (2, 2)]
    ordered = linear_extension(P, times)
    for i, a in enumerate(ordered):
        for b in ordered[:i]:
            assert not P.lt(a, b)


def test_by_name_rejects_unknown():
    with pytest.raises(ValueError, match="unknown order"):
        by_name("lexicographic")


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
