"""Positions on the command line: reading ``--from``, ``--since``, ``--until`` and ``--to``
(``earliest``, ``latest``, a time or a frontier) and writing a position (a frontier) back.

A time is an int (``3``), comma-separated ints for a product order (``3,1``) or JSON (``[3, 1]``
for a product time); a frontier of several times is a JSON list of them (``[[3,1],[1,4]]``).
Positions are inclusive: epochs ``t`` with some element of the frontier ``<= t`` (docs/history.md).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from ..errors import ProtocolError
from ..frontier import Antichain
from ..position import resolve_position
from .formats import fmt_time

__all__ = ["TIME_HELP", "parse_position", "fmt_position", "fmt_times"]

#: What a time argument may be, for help texts.
TIME_HELP = ("an int, comma-separated ints for a product order (3,1), or JSON for a frontier of "
             "several times ([[3,1],[1,4]])")


def _time_value(order: Any, text: str) -> Any:
    """``text`` as what :func:`~epochstream.position.resolve_position` takes: an int, a tuple
    (a product time) or a list of times (a frontier). Raises ``ValueError``."""
    width = getattr(order, "width", None)
    try:
        value = json.loads(text)
    except RecursionError:  # "[[[[..." thousands deep: not a time, and no traceback
        raise ValueError(f"not a time: {text[:40]!r}...") from None
    except ValueError:
        parts = [p.strip() for p in text.split(",")]
        try:
            ints = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"not a time: {text!r}") from None
        if len(ints) == 1:
            return ints[0]
        if width is None:
            raise ValueError(f"{text!r} has {len(ints)} components, but the topic's times are "
                             f"ints (a frontier of several: JSON, e.g. [3,5])")
        return tuple(ints)
    if isinstance(value, bool):
        raise ValueError(f"not a time: {text!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        if width is not None and value and all(isinstance(v, int) for v in value):
            return tuple(value)  # one product time
        if width is not None:
            return [tuple(v) if isinstance(v, list) else v for v in value]
        return value
    raise ValueError(f"not a time: {text!r}")


def parse_position(order: Any, text: str, *, allow: Iterable[str] = ()) -> tuple[Any, Any]:
    """Read a position: one of the words in ``allow`` (``earliest``, ``latest``) or a time or
    frontier (see the module docs). Returns ``(value, frontier)``: ``value`` as
    :class:`~epochstream.transport.Subscriber`'s ``start`` and :class:`~epochstream.History`
    take it, ``frontier`` its checked elements (a tuple of times; ``None`` for a word). Raises
    ``ValueError`` with a message naming what was expected."""
    text = text.strip()
    words = tuple(allow)
    if text in words:
        return text, None
    try:
        value = _time_value(order, text)
        frontier = resolve_position(order, value)
    except (ValueError, ProtocolError) as e:
        expected = (", ".join(words) + ", or a time: " if words else "a time: ") + TIME_HELP
        raise ValueError(f"{e}; expected {expected}") from None
    return value, tuple(frontier or ())


def fmt_times(times: Iterable[Any]) -> str:
    """Times separated by commas: ``3, 4`` or ``(3, 1), (1, 4)``."""
    return ", ".join(fmt_time(t) for t in times)


def fmt_position(order: Any, position: Optional[Iterable[Any]]) -> str:
    """A frontier as ``[3]`` or ``[(3, 1), (1, 4)]`` (its minimal elements, in a linear
    extension of the order); ``[]`` is the end of the stream; ``None`` is ``-`` (not set)."""
    if position is None:
        return "-"
    elements = Antichain(order, position).elements
    key = getattr(order, "key", None)
    return "[" + fmt_times(sorted(elements, key=key) if key else elements) + "]"
