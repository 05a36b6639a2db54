"""Subscriber settings that travel together, as values (as nats.py's ``ConsumerConfig`` and this
library's :class:`~epochstream.retention.Retention` and :class:`~epochstream.security.Security`):
:class:`Credit` (flow control) and :class:`Durable` (a durable subscription). A
:class:`~epochstream.filters.Filter` is the third (``Subscriber(filter=...)``).

The keyword forms stay: ``Subscriber(credit=100, credit_unit="epochs")`` is
``Subscriber(credit=Credit(100, unit="epochs"))``, and ``Subscriber(durable="name",
takeover=True)`` is ``Subscriber(durable=Durable("name", takeover=True))``.

>>> Credit(100, unit="epochs")
Credit(count=100, unit='epochs')
>>> Durable("reports").takeover
False
"""

from __future__ import annotations

from dataclasses import dataclass

from .filters import Filter

__all__ = ["Credit", "Durable", "UNITS", "subscriber_values"]

#: what flow-control credit counts: ``D``/``F`` messages, or frontier advances (epochs)
UNITS = ("messages", "epochs")


@dataclass(frozen=True)
class Credit:
    """Flow control: each publisher sends at most ``count`` messages (``unit="messages"``,
    ``D``/``F``; at least 2) or frontier advances (``unit="epochs"``, at least 1; the unit for
    a pulling consumer) ahead of what the subscriber has read (docs/protocol.md, "Credit").
    ``ValueError`` for a count or unit out of range."""

    count: int
    unit: str = "messages"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"credit_unit must be 'messages' or 'epochs', got {self.unit!r}")
        least = 2 if self.unit == "messages" else 1
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < least:
            raise ValueError(f"credit must be an int >= {least} ({self.unit}), got "
                             f"{self.count!r}")

    @staticmethod
    def of(credit, unit: str = "messages") -> "Credit | None":
        """``credit`` as a value: a :class:`Credit` as it is (then ``unit`` must be the
        default), an int with ``unit``, or ``None`` (no flow control)."""
        if credit is None:
            if unit not in UNITS:
                raise ValueError(f"credit_unit must be 'messages' or 'epochs', got {unit!r}")
            return None
        if isinstance(credit, Credit):
            if unit != "messages":
                raise ValueError("pass the unit inside Credit(...), not also as credit_unit=")
            return credit
        return Credit(credit, unit)


@dataclass(frozen=True)
class Durable:
    """A durable subscription: its ``name`` (the catalog holds its position), and whether to
    take the name over from a live holder (``takeover``; the previous holder's acks are
    refused from then on). docs/history.md, "Durable subscriptions". ``TypeError`` for a
    takeover that is not a bool; the catalog checks the name
    (:class:`~epochstream.errors.CatalogError`)."""

    name: str
    takeover: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.takeover, bool):  # a truthy "false" must not take a live name
            raise TypeError(f"takeover must be True or False, got {self.takeover!r}")

    @staticmethod
    def of(durable, takeover: bool = False) -> "Durable | None":
        """``durable`` as a value: a :class:`Durable` as it is (then ``takeover`` must be the
        default), a name with ``takeover``, or ``None``."""
        if not isinstance(takeover, bool):
            raise TypeError(f"takeover must be True or False, got {takeover!r}")
        if durable is None:
            return None
        if isinstance(durable, Durable):
            if takeover:
                raise ValueError("pass takeover inside Durable(...), not also as takeover=")
            return durable
        return Durable(durable, takeover)


def subscriber_values(record_filter, keys, columns, where, credit, credit_unit: str, durable,
                      takeover: bool) -> tuple[Filter, Credit | None, Durable | None]:
    """A subscriber's filter, credit and durable subscription as values, from either form:
    ``record_filter`` (a :class:`~epochstream.filters.Filter`) or ``keys``/``columns``/``where``
    (not both: ``ValueError``); :meth:`Credit.of`, :meth:`Durable.of`. Raises
    :class:`~epochstream.filters.FilterError` for a malformed filter."""
    if record_filter is None:
        record_filter = Filter(keys, columns, where)
    elif not isinstance(record_filter, Filter):
        raise TypeError(f"record_filter must be a Filter, got {type(record_filter).__name__}")
    elif keys is not None or columns is not None or where is not None:
        raise ValueError("pass the filter as record_filter=Filter(...) or as keys=, columns=, "
                         "where=, not both")
    return record_filter, Credit.of(credit, credit_unit), Durable.of(durable, takeover)
