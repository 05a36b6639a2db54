"""Checking a user-defined order: :func:`check_order` tests the partial-order laws on a finite
set of times and names the first violation in an :class:`OrderViolation`.

An order object has ``le(a, b) -> bool``, ``lt(a, b) -> bool``, ``minimum`` (a time ``<=`` every
time) and, optionally, ``key`` (a sort key listing times in a linear extension); see
:mod:`epochstream.order`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable

__all__ = ["OrderViolation", "check_order"]


class OrderViolation(AssertionError, ValueError):
    """An order object violates a partial-order law (both an ``AssertionError`` and a
    ``ValueError``). ``law`` names the law, ``witness`` the violating times."""

    def __init__(self, law: str, witness: tuple, message: str):
        super().__init__(message)
        self.law = law
        self.witness = witness


def check_order(order, times: Iterable[Any]) -> None:
    """Check that ``order`` is a partial order on ``times`` (plus ``order.minimum``).

    Checks, naming the first violating pair/triple in an :class:`OrderViolation`:

    - ``le`` returns a ``bool``; reflexivity ``le(a, a)``;
    - antisymmetry ``le(a, b) and le(b, a)`` ⇒ ``a == b``;
    - transitivity ``le(a, b) and le(b, c)`` ⇒ ``le(a, c)`` (O(n³) — keep ``times`` under ~40);
    - ``lt(a, b) == (le(a, b) and a != b)``;
    - ``le(minimum, a)`` for every ``a``;
    - if the order has ``key``: ``le(a, b)`` ⇒ ``key(a) <= key(b)`` and ``lt(a, b)`` ⇒
      ``key(a) < key(b)`` (sorting by ``key`` lists times in a linear extension).
    """
    le, lt = order.le, order.lt
    name = getattr(order, "name", repr(order))
    minimum = getattr(order, "minimum", None)
    ts = list(dict.fromkeys(times))
    if minimum is None:
        raise OrderViolation("minimum", (), f"order {name}: has no minimum")
    if minimum not in ts:
        ts.insert(0, minimum)
    _check_each(le, name, minimum, ts)
    LE = _relation(le, ts)
    _check_pairs(lt, name, ts, LE)
    _check_transitivity(name, ts, LE)
    key = getattr(order, "key", None)
    if key is not None:
        _check_key(key, name, ts, LE)


def _check_each(le: Callable, name: str, minimum, ts: list) -> None:
    """``le(a, a)`` is the bool ``True`` and ``le(minimum, a)`` holds, for every ``a`` in ``ts``."""
    for a in ts:
        r = le(a, a)
        if not isinstance(r, bool):
            raise OrderViolation("bool", (a,), f"order {name}: le({a!r}, {a!r}) returned {r!r}, not a bool")
        if not r:
            raise OrderViolation("reflexivity", (a,), f"order {name}: not reflexive: le({a!r}, {a!r}) is False")
        if not le(minimum, a):
            raise OrderViolation("minimum", (minimum, a),
                                 f"order {name}: minimum {minimum!r} is not <= {a!r}")


def _relation(le: Callable, ts: list) -> Callable[[Any, Any], bool]:
    """``le`` restricted to ``ts``, computed once per pair when the times are hashable (the
    transitivity check asks O(n³) times)."""
    if not _hashable(ts):
        return le
    rel = {(a, b): le(a, b) for a in ts for b in ts}
    return lambda a, b: rel[(a, b)]


def _check_pairs(lt: Callable, name: str, ts: list, LE: Callable) -> None:
    """Antisymmetry, and ``lt`` agreeing with ``LE``, for every pair of ``ts``."""
    for a, b in itertools.product(ts, ts):
        ab = LE(a, b)
        if ab and LE(b, a) and a != b:
            raise OrderViolation("antisymmetry", (a, b),
                                 f"order {name}: not antisymmetric: {a!r} <= {b!r} and {b!r} <= {a!r} "
                                 "but they differ")
        strict = lt(a, b)
        if strict != (ab and a != b):
            raise OrderViolation("lt", (a, b),
                                 f"order {name}: lt({a!r}, {b!r}) is {strict!r} but le is {ab!r} "
                                 f"and the times are {'equal' if a == b else 'different'}")


def _check_transitivity(name: str, ts: list, LE: Callable) -> None:
    """``LE(a, b) and LE(b, c)`` ⇒ ``LE(a, c)`` for every triple of ``ts``."""
    for a, b in itertools.product(ts, ts):
        if not LE(a, b):
            continue
        for c in ts:
            if LE(b, c) and not LE(a, c):
                raise OrderViolation("transitivity", (a, b, c),
                                     f"order {name}: not transitive: {a!r} <= {b!r} and {b!r} <= "
                                     f"{c!r} but not {a!r} <= {c!r}")


def _check_key(key: Callable, name: str, ts: list, LE: Callable) -> None:
    """``key`` is a linear extension: ``a < b`` ⇒ ``key(a) < key(b)`` on ``ts``."""
    for a, b in itertools.product(ts, ts):
        if LE(a, b) and a != b and not key(a) < key(b):
            raise OrderViolation("key", (a, b),
                                 f"order {name}: key is not a linear extension: {a!r} < {b!r} "
                                 f"but key({a!r}) = {key(a)!r} is not < key({b!r}) = {key(b)!r}")


def _hashable(ts) -> bool:
    """Whether every element of ``ts`` is hashable."""
    try:
        for t in ts:
            hash(t)
        return True
    except TypeError:
        return False
