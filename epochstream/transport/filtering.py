"""A subscriber's filter: what it sends its publishers, how it re-checks what it receives, and
how a change is made at an epoch boundary (docs/filters.md).

:class:`FilterSession` holds this state for one
:class:`~epochstream.transport.subscriber.Subscriber` (which drives it: it sends the frames the
session makes and pumps its sockets while a change waits for answers). The rules are the pure
:class:`~epochstream.filters.FilterSchedule` and :func:`~epochstream.filters.boundary`.

A change, in two steps (every partition's publisher applies them in its stream order):

1. the program gains the new filter with an unknown boundary; each publisher now sends data at
   every time filtered by the union of the old and new filters, and answers with its upper
   frontier ``U_p`` when it switched (everything it sent before was filtered by the old one);
2. the boundary ``B`` is the minimal times not ``<=`` any time of the ``U_p``: no partition sent
   data at a time at or beyond ``B`` before it switched. Epochs at or beyond ``B`` are released
   under the new filter, the others under the old one; the subscriber sends the program with
   ``B`` so publishers narrow to the new filter beyond ``B``.

Each epoch's data is a superset of the records matching the filter in force for it, so the
re-check (which runs when data is handed out, after the change is settled) releases exactly them.
"""

from __future__ import annotations

import itertools
from typing import Any

from .. import wire
from ..errors import ProtocolError
from ..events import LowerFrontierUpdate
from ..filters import MAX_WIRE_BYTES, Filter, FilterError, FilterSchedule, boundary
from ..frontier import Antichain, apply_changes, join
from ..order import dual
from ..partitioning import partitions_for

__all__ = ["FilterSession"]

_update_ids = itertools.count(1)


class FilterSession:
    """The filter of one subscriber of ``topic`` (``order``, ``codec``: the topic's; ``keys``,
    ``columns``, ``where``: as :class:`~epochstream.filters.Filter`, which raises
    :class:`~epochstream.filters.FilterError` for a malformed one)."""

    def __init__(self, topic: str, order, codec: str, partitions: int, keys=None,
                 columns=None, where=None):
        self.topic, self.order, self.codec, self.partitions = topic, order, codec, partitions
        f = Filter(keys, columns, where)
        #: the program in force (``None``: no filter); read on the hot path
        self.program: FilterSchedule | None = (None if f.everything
                                               else FilterSchedule.single(order, f))
        if self.program is not None:
            _check_size(self.program)
        self.topic_key: Any = None    # the key column the publishers announced
        self._keys_trusted = False    # a publisher applies keys= by a key function
        self._handed_lower: dict = {}  # the merged lower frontier as handed out
        # the maximal times data arrived for from any partition (a finished partition cannot
        # answer a filter change; its data so far was filtered by the old program)
        self._data_upper = Antichain(dual(order))
        self._wait: dict | None = None  # partition -> upper, while a change is pending
        self._floors: list = []  # floors a relay answered with (its upstream changed)
        self._joined: set | None = None  # partitions of a key-partitioned topic (None: all)
        self._id: int | None = None
        self._change: tuple | None = None  # (old program, new filter) while a change is pending

    def pruned(self, info) -> list:
        """The partitions of key-partitioned topic ``info`` that hold none of the keys every
        filter of the program asks for (none to skip when a filter has no keys): the
        subscriber does not join them (docs/filters.md, "Key-partitioned topics")."""
        key = getattr(info, "partition_key", None)
        if key is None or self.program is None:
            return []
        filters = [f for _, f in self.program.entries]
        if any(f.keys is None for f in filters):
            return []
        wanted = partitions_for((k for f in filters for k in f.keys), info.partitions)
        self._joined = wanted
        return [i for i in range(info.partitions) if i not in wanted]

    @property
    def record_filter(self) -> Filter:
        """The newest record filter (``Filter()``: none)."""
        return Filter() if self.program is None else self.program.current

    # -- receiving -------------------------------------------------------------------------
    def snapshot(self, partition: int, snap, meta: dict, protocol) -> None:
        """A snapshot arrived with ``meta`` (its header): learn the key column, and raise the
        ``protocol``'s floor where a relay serves this join from."""
        key = meta.get("key")
        if isinstance(key, str):
            self.topic_key = key
        elif meta.get("filters") == 1:
            self._keys_trusted = True
        floor = meta.get("floor")
        if floor is not None:  # a relay serves this join from there on (docs/filters.md)
            if not isinstance(floor, (list, tuple)):
                raise ProtocolError(f"partition {partition}: snapshot floor {floor!r:.80} is "
                                    f"not a list of times")
            protocol.advance_as_of(floor)
        if self._wait is not None:  # a re-join while a change is pending: its snapshot
            self._wait[partition] = tuple(snap.upper)  # is its switch

    def acked(self, partition: int, msg: wire.Notice, check) -> None:
        """An ``X filter`` answer from ``partition`` (``check``: the order's time check, or
        ``None``); raises :class:`~epochstream.errors.ProtocolError` for a bad one."""
        upper = msg.extra.get("upper")
        if (self._wait is None or msg.extra.get("id") != self._id
                or not isinstance(upper, (list, tuple))):
            return  # the answer to step 2, or to a change given up
        floor = msg.extra.get("floor")
        try:
            check = check or (lambda t: t)
            if floor is not None:
                if not isinstance(floor, (list, tuple)) or not floor:
                    raise ProtocolError(f"floor {floor!r:.80} is not a non-empty list of times")
                self._floors.append(tuple(check(t) for t in floor))
            self._wait[partition] = tuple(check(t) for t in upper)
        except ProtocolError as e:
            raise ProtocolError(f"publisher of partition {partition} answered a filter update "
                                f"with a bad upper frontier: {e}") from None

    def data_at(self, t) -> None:
        """Data arrived for time ``t`` (first sight of its header): bounds a change."""
        self._data_upper.insert(t)

    def recheck(self, t, records):
        """``records`` of epoch ``t`` re-filtered by the filter in force for ``t``; ``None`` if
        nothing matches. Call only with a program (``self.program is not None``)."""
        f = self.program.in_force(t)
        if f.everything:
            return records
        key = self.topic_key
        if f.keys is not None and key is None:
            if not self._keys_trusted:
                raise FilterError(f"keys= on topic {self.topic!r}: its publishers announced no "
                                  f"key column and do not filter (an older version?)")
            f = Filter(None, f.columns, f.where)  # the publisher's key function applied it
        if self.codec == "arrow":
            out = f.apply_arrow(records, key)
            return out if out.num_rows else None
        out = f.apply_records(records, key)
        return out or None

    def handed(self, update: LowerFrontierUpdate) -> None:
        """A merged frontier change is handed out: prune the program."""
        apply_changes(self._handed_lower, update.updates)
        if self.program is not None and len(self.program.entries) > 1:
            self.program = self.program.prune(tuple(self._handed_lower))

    def restarted(self) -> None:
        """A re-join: the merged frontier is announced afresh from empty."""
        self._handed_lower = {}

    # -- changing (two steps; the module docstring) ------------------------------------------
    def check_change(self, new: Filter) -> None:
        """Refuse, before anything is sent, a change the topic cannot take:
        :class:`~epochstream.filters.FilterError` (keys outside the partitions joined),
        ``NotImplementedError`` (an order without boundaries)."""
        boundary(self.order, [])  # NotImplementedError before anything is sent
        joined = self._joined
        if joined is not None and (new.keys is None or not partitions_for(
                new.keys, self.partitions) <= joined):
            raise FilterError(
                f"topic {self.topic!r} is partitioned by key and this subscriber joined only "
                f"partitions {sorted(joined)} (where its keys live): the new filter needs keys "
                f"held there; subscribe anew for others")

    def propose(self, new: Filter) -> list:
        """Step 1: the program gains ``new`` with an unknown boundary; returns the ``u`` frames
        to send to every live partition. Raises :class:`~epochstream.filters.FilterError` (a
        key change the publishers' key function cannot take, or too big for the wire)."""
        old = self.program or FilterSchedule.single(self.order, Filter())
        old = old.prune(tuple(self._handed_lower)) if self._handed_lower else old
        if self._keys_trusted and any(f.keys != new.keys for _, f in old.entries):
            # the publishers apply keys= by a key function (or the topic has no key): this
            # subscriber cannot re-check keys, so the union sent during a change could not be
            # narrowed to the filter in force — the epochs around the boundary would mix
            raise FilterError(f"keys= cannot change on topic {self.topic!r}: its publishers "
                              f"declare no key column (a key function, or no key), so the "
                              f"change could not be made at an epoch boundary; subscribe anew")
        pending = old.with_change(new, None)
        _check_size(old.with_change(new, boundary(self.order, [])))
        self._id = next(_update_ids) % (1 << 31)
        self._wait, self._floors, self._change = {}, [], (old, new)
        self.program = pending
        return self.frames(self._id)

    def missing(self, live) -> set:
        """The partitions of ``live`` that have not answered the pending change."""
        return set(live) - set(self._wait or ())

    def settle(self) -> tuple[tuple, list]:
        """Step 2, once every live partition answered: ``(boundary, frames)``: the boundary
        ``B`` and the ``u`` frames with it to send to every live partition."""
        old, new = self._change
        uppers = [t for ts in self._wait.values() for t in ts]
        uppers.extend(self._data_upper.elements)  # data received from partitions that
        # finished (no answer) or whose answer overtook nothing: filtered by the old one
        b = boundary(self.order, uppers)
        for floor in self._floors:  # a relay widened its upstream from ``floor`` on:
            b = join(self.order, b, floor)  # no epoch before it came under the new filter
        self.program = old.with_change(new, b)
        self.end_change()
        return b, self.frames(next(_update_ids) % (1 << 31))

    def end_change(self) -> None:
        """The change is settled or given up (answers to it are ignored from now on; a given
        up change stays pending-safe: epochs are whole under one of the two filters)."""
        self._wait, self._change = None, None

    def frames(self, uid: int) -> list:
        """The ``u`` frames carrying the program, with update id ``uid``."""
        return wire.encode_control(wire.UPDATE, id=uid, filter=self.program.to_wire())


def _check_size(program: FilterSchedule) -> None:
    """FilterError for a program too big to travel in a hello or an update (MAX_WIRE_BYTES;
    a publisher's socket would drop the connection, not answer)."""
    n = len(wire.encode_control(wire.UPDATE, id=0, filter=program.to_wire())[1])
    if n > MAX_WIRE_BYTES:
        raise FilterError(f"the filter takes {n} bytes on the wire, more than {MAX_WIRE_BYTES} "
                          f"(a hello or update travels in at most 64 KiB): use fewer keys or "
                          f"'in' values")
