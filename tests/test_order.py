"""Unit tests for epochstream.order (timely's PartialOrder semantics, the 64-bit time range)."""
import pytest

from epochstream.errors import ProtocolError
from epochstream.order import TIME_MAX, TIME_MIN, TOTAL, by_name, dual, linear_extension, product


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


def test_times_are_64_bit_on_the_wire():
    assert TOTAL.check(TIME_MAX) == TIME_MAX and TOTAL.check(TIME_MIN) == TIME_MIN
    for bad in (TIME_MAX + 1, TIME_MIN - 1):
        with pytest.raises(ProtocolError, match="out of range"):
            TOTAL.check(bad)
        with pytest.raises(ProtocolError, match="out of range"):
            product(2).check((0, bad))
