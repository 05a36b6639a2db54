"""Partial orders on logical times (timely-dataflow's ``PartialOrder`` trait).

An *order* is any object with

- ``le(a, b) -> bool`` — ``a`` is less than or equal to ``b`` (timely ``less_equal``);
- ``lt(a, b) -> bool`` — ``a`` is strictly less than ``b`` (timely ``less_than``);
- ``minimum`` — the least time, which every time is ``>=`` (timely ``Timestamp::minimum``).

The orders shipped here also provide

- ``key(t)`` — a sort key that is a *linear extension* of the order: ``le(a, b)`` implies
  ``key(a) <= key(b)``. Sorting by it lists times in an order consistent with the partial order.
  Python's own ``<`` on tuples is lexicographic — a linear extension of the product order, never
  the product order itself: use it only as such a key;
- ``check(t)`` — normalise a time to its canonical Python shape or raise
  :class:`~epochstream.errors.ProtocolError` naming the expected shape;
- ``name`` — a string that :func:`by_name` turns back into the order (stored in the catalog).

Shipped orders:

- :data:`TOTAL` — ``int`` times (Spark micro-batch ids, timely ``u64``), the usual ``<=``;
  ``minimum == 0``.
- :func:`product` ``(n)`` — ``n``-tuples of ints in the component-wise (product) order, timely's
  ``Product<Product<..>>`` for nested scopes; ``minimum == (0,)*n``. ``(1, 2)`` and ``(2, 1)`` are
  incomparable.
- :func:`dual` ``(order)`` — the reversed order; an :class:`~epochstream.frontier.Antichain` over
  the dual keeps *maximal* elements (the Strymon *upper frontier*).

Example::

    >>> from epochstream.order import TOTAL, product
    >>> P2 = product(2)
    >>> P2.le((1, 2), (1, 3)), P2.le((1, 2), (2, 1)), P2.le((2, 1), (1, 2))
    (True, False, False)
    >>> TOTAL.lt(3, 4)
    True
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

from .errors import ProtocolError

__all__ = ["TIME_MIN", "TIME_MAX", "PartialOrder", "TotalOrder", "ProductOrder", "DualOrder", "TOTAL", "product", "dual",
           "by_name", "sort_key", "check_time", "linear_extension"]

#: Range of an integer time (or product-time component): what msgpack carries (int64 .. uint64).
#: Checked by the shipped orders' ``check`` so that a time is refused before any state changes.
TIME_MIN = -(1 << 63)
TIME_MAX = (1 << 64) - 1


class PartialOrder(Protocol):
    """What epochstream needs of an order: ``le``, ``lt`` and ``minimum`` (see module docs)."""

    minimum: Any

    def le(self, a: Any, b: Any) -> bool: ...

    def lt(self, a: Any, b: Any) -> bool: ...


class TotalOrder:
    """Integers with the usual order. ``minimum == 0``; ``key`` is the identity."""

    name = "total"
    minimum = 0
    width = None

    @staticmethod
    def le(a: int, b: int) -> bool:
        return a <= b

    @staticmethod
    def lt(a: int, b: int) -> bool:
        return a < b

    @staticmethod
    def key(t: int) -> int:
        return t

    @staticmethod
    def join(a: int, b: int) -> int:
        """Least upper bound (timely ``Lattice::join``): ``max(a, b)``."""
        return a if a >= b else b

    @staticmethod
    def check(t: Any) -> int:
        """Return ``t`` as an ``int`` in ``TIME_MIN .. TIME_MAX`` (``bool`` is refused); raise
        ``ProtocolError`` otherwise."""
        if isinstance(t, bool) or isinstance(t, (tuple, list)):
            raise ProtocolError(f"time {t!r} has the wrong shape for order 'total': expected an int")
        try:
            t = operator.index(t)
        except TypeError:
            raise ProtocolError(
                f"time {t!r} has the wrong shape for order 'total': expected an int") from None
        if not TIME_MIN <= t <= TIME_MAX:
            raise ProtocolError(f"time {t!r} is out of range: times are 64-bit integers "
                                f"({TIME_MIN} .. {TIME_MAX}) on the wire")
        return t

    def __repr__(self) -> str:
        return "TOTAL"

    def __reduce__(self):
        return (by_name, (self.name,))


def _le2(a, b):
    return a[0] <= b[0] and a[1] <= b[1]


def _le3(a, b):
    return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]


class ProductOrder:
    """``n``-tuples of ints, ordered component-wise (timely ``Product``): ``a <= b`` iff
    ``a[i] <= b[i]`` for every ``i``. ``minimum == (0,) * n``; ``key`` is the tuple itself
    (lexicographic order, a linear extension). Cost: ``le``/``lt`` O(n)."""

    def __init__(self, n: int):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"product order needs a width n >= 1, got {n!r}")
        self.width = n
        self.name = f"product({n})"
        self.minimum = (0,) * n
        if n == 2:
            self.le = _le2
        elif n == 3:
            self.le = _le3

    def le(self, a: tuple, b: tuple) -> bool:
        for x, y in zip(a, b):
            if x > y:
                return False
        return True

    def lt(self, a: tuple, b: tuple) -> bool:
        return a != b and self.le(a, b)

    @staticmethod
    def key(t: tuple) -> tuple:
        return t

    @staticmethod
    def join(a: tuple, b: tuple) -> tuple:
        """Least upper bound (timely ``Lattice::join`` for ``Product``): the component-wise
        maximum, e.g. ``join((1, 5), (3, 2)) == (3, 5)``. O(n)."""
        return tuple(x if x >= y else y for x, y in zip(a, b))

    def check(self, t: Any) -> tuple:
        """Return ``t`` as an ``n``-tuple of ints in ``TIME_MIN .. TIME_MAX``; raise
        ``ProtocolError`` naming the shape or range otherwise."""
        if isinstance(t, (tuple, list)) and len(t) == self.width:
            try:
                out = tuple(operator.index(x) for x in t)
            except TypeError:
                pass
            else:
                if not any(isinstance(x, bool) for x in t):
                    if all(TIME_MIN <= x <= TIME_MAX for x in out):
                        return out
                    raise ProtocolError(f"time {t!r} is out of range: each component is a 64-bit "
                                        f"integer ({TIME_MIN} .. {TIME_MAX}) on the wire")
        raise ProtocolError(
            f"time {t!r} has the wrong shape for order {self.name!r}: expected a tuple of "
            f"{self.width} ints")

    def __eq__(self, other):
        return isinstance(other, ProductOrder) and other.width == self.width

    def __hash__(self):
        return hash(("product", self.width))

    def __repr__(self) -> str:
        return f"product({self.width})"

    def __reduce__(self):
        return (product, (self.width,))


class DualOrder:
    """The reversed order of ``base``: ``le(a, b) == base.le(b, a)``. An antichain over the dual
    keeps maximal elements. It has no ``minimum`` (that would be the base order's top)."""

    def __init__(self, base):
        self.base = base
        self.name = f"dual({getattr(base, 'name', repr(base))})"
        self.minimum = None
        base_key = getattr(base, "key", None)
        self.key = None if base_key is None else _negated_key(base_key)

    def le(self, a, b) -> bool:
        return self.base.le(b, a)

    def lt(self, a, b) -> bool:
        return self.base.lt(b, a)

    def __repr__(self) -> str:
        return self.name


class _Neg:
    """Wraps a sort key to reverse its comparison (a linear extension of the dual order)."""

    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k

    def __lt__(self, other):
        return other.k < self.k

    def __gt__(self, other):
        return other.k > self.k

    def __le__(self, other):
        return other.k <= self.k

    def __ge__(self, other):
        return other.k >= self.k

    def __eq__(self, other):
        return self.k == other.k


def _negated_key(base_key):
    return lambda t: _Neg(base_key(t))


TOTAL = TotalOrder()
_PRODUCTS: dict[int, ProductOrder] = {}


def product(n: int) -> ProductOrder:
    """The product (component-wise) order on ``n``-tuples of ints (cached per ``n``)."""
    order = _PRODUCTS.get(n)
    if order is None:
        order = _PRODUCTS[n] = ProductOrder(n)
    return order


def dual(order) -> DualOrder:
    """The reversed order of ``order`` (see :class:`DualOrder`)."""
    if isinstance(order, DualOrder):
        return order.base
    return DualOrder(order)


def by_name(name: str):
    """Turn an order's ``name`` (``"total"``, ``"product(n)"``) back into the order.

    Raises ``ValueError`` for any other name."""
    name = name.strip()
    if name == "total":
        return TOTAL
    if name.startswith("product(") and name.endswith(")"):
        try:
            return product(int(name[len("product("):-1]))
        except ValueError:
            pass
    raise ValueError(f"unknown order {name!r}: expected 'total' or 'product(n)'")


def sort_key(order):
    """The linear-extension sort key of ``order``: its ``key`` attribute, or, for a user order
    without one, ``None`` (callers then fall back to repeatedly taking minimal elements)."""
    return getattr(order, "key", None)


def check_time(order, t):
    """Normalise ``t`` with ``order.check`` when the order has one; user orders pass ``t`` through."""
    check = getattr(order, "check", None)
    return t if check is None else check(t)


def linear_extension(order, times):
    """Return ``times`` as a list sorted consistently with ``order`` (``le(a, b)`` ⇒ ``a`` first).

    Uses ``order.key`` when present (O(n log n)); otherwise repeatedly extracts minimal elements
    (O(n²) comparisons), which works for any partial order."""
    key = sort_key(order)
    if key is not None:
        return sorted(times, key=key)
    rest = list(times)
    out = []
    while rest:
        for i, t in enumerate(rest):
            if not any(order.lt(u, t) for u in rest):
                out.append(rest.pop(i))
                break
        else:  # pragma: no cover - only for orders that are not partial orders
            raise ValueError("order has a cycle; it is not a partial order")
    return out
