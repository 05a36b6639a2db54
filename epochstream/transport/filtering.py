"""A subscriber's filter: what it sends its publishers, how it re-checks what it receives, and
how :meth:`Filtering.update_filter` changes it at an epoch boundary (docs/filters.md).

A mixin of :class:`~epochstream.transport.subscriber.Subscriber`. The rules are the pure
:class:`~epochstream.filters.Program` and :func:`~epochstream.filters.boundary`; this module
sends ``u`` messages and collects the ``X filter`` answers.

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
import time as _time
from typing import Any

from .. import wire
from ..errors import ProtocolError
from ..events import LowerFrontierUpdate
from ..filters import MAX_WIRE_BYTES, Filter, FilterError, Program, boundary
from ..frontier import Antichain, apply_changes, join
from ..order import dual
from ..partitioning import partitions_for
from .sockets import send_nowait

__all__ = ["Filtering"]

_update_ids = itertools.count(1)


class Filtering:
    """Filters at the source, for the Subscriber."""

    def _init_filter(self, keys, columns, where) -> None:
        f = Filter(keys, columns, where)
        self._program: Program | None = None if f.everything else Program.single(self.order, f)
        if self._program is not None:
            _check_size(self._program)
        self._topic_key: Any = None   # the key column the publishers announced
        self._keys_trusted = False    # a publisher applies keys= by a key function
        self._handed_lower: dict = {}  # the merged lower frontier as handed out
        # the maximal times data arrived for from any partition (a finished partition cannot
        # answer a filter change; its data so far was filtered by the old program)
        self._data_upper = Antichain(dual(self.order))
        self._filter_wait: dict | None = None  # partition -> upper, while a change is pending
        self._filter_floors: list = []  # floors a relay answered with (its upstream changed)
        self._partitions_joined: set | None = None  # of a key-partitioned topic (None: all)
        self._filter_id: int | None = None

    def _pruned(self, info) -> list:
        """The partitions of key-partitioned topic ``info`` that hold none of the keys every
        filter of the program asks for (none to skip when a filter has no keys): this
        subscriber does not join them (docs/filters.md, "Key-partitioned topics")."""
        key = getattr(info, "partition_key", None)
        if key is None or self._program is None:
            return []
        filters = [f for _, f in self._program.entries]
        if any(f.keys is None for f in filters):
            return []
        wanted = partitions_for((k for f in filters for k in f.keys), info.partitions)
        self._partitions_joined = wanted
        return [i for i in range(info.partitions) if i not in wanted]

    @property
    def record_filter(self) -> Filter:
        """The newest record filter (``keys``/``columns``/``where``; ``Filter()``: none). Not
        :attr:`filter`, which is the Strymon join filter's antichain."""
        return Filter() if self._program is None else self._program.current

    # -- receiving -------------------------------------------------------------------------
    def _filter_snapshot(self, partition: int, snap, meta: dict) -> None:
        key = meta.get("key")
        if isinstance(key, str):
            self._topic_key = key
        elif meta.get("filters") == 1:
            self._keys_trusted = True
        floor = meta.get("floor")
        if floor is not None:  # a relay serves this join from there on (docs/filters.md)
            if not isinstance(floor, (list, tuple)):
                raise ProtocolError(f"partition {partition}: snapshot floor {floor!r:.80} is "
                                    f"not a list of times")
            self._protocol.raise_floor(floor)
        if self._filter_wait is not None:  # a re-join while a change is pending: its snapshot
            self._filter_wait[partition] = tuple(snap.upper)  # is its switch

    def _filter_acked(self, partition: int, msg: wire.Notice) -> None:
        upper = msg.extra.get("upper")
        if (self._filter_wait is None or msg.extra.get("id") != self._filter_id
                or not isinstance(upper, (list, tuple))):
            return  # the answer to step 2, or to a change given up
        floor = msg.extra.get("floor")
        try:
            check = self._check or (lambda t: t)
            if floor is not None:
                if not isinstance(floor, (list, tuple)) or not floor:
                    raise ProtocolError(f"floor {floor!r:.80} is not a non-empty list of times")
                self._filter_floors.append(tuple(check(t) for t in floor))
            self._filter_wait[partition] = tuple(check(t) for t in upper)
        except ProtocolError as e:
            raise ProtocolError(f"publisher of partition {partition} answered a filter update "
                                f"with a bad upper frontier: {e}") from None

    def _recheck(self, t, records):
        """``records`` of epoch ``t`` re-filtered by the filter in force for ``t``; ``None`` if
        nothing matches."""
        f = self._program.in_force(t)
        if f.everything:
            return records
        key = self._topic_key
        if f.keys is not None and key is None:
            if not self._keys_trusted:
                raise FilterError(f"keys= on topic {self.topic!r}: its publishers announced no "
                                  f"key column and do not filter (an older version?)")
            f = Filter(None, f.columns, f.where)  # the publisher's key function applied it
        if self.codec.name == "arrow":
            out = f.apply_arrow(records, key)
            return out if out.num_rows else None
        out = f.apply_records(records, key)
        return out or None

    def _filter_frontier(self, update: LowerFrontierUpdate) -> None:
        """A merged frontier change is handed out: prune the program."""
        apply_changes(self._handed_lower, update.updates)
        if self._program is not None and len(self._program.entries) > 1:
            self._program = self._program.prune(tuple(self._handed_lower))

    # -- changing --------------------------------------------------------------------------
    def update_filter(self, keys=None, columns=None, where=None, *,
                      timeout: float = 10.0) -> tuple:
        """Change the filter to ``Filter(keys, columns, where)`` (``Filter()`` for everything)
        and return the boundary ``B``, a tuple of times (a frontier): every epoch at or beyond
        ``B`` is handed out under the new filter, every other epoch under the old one — never
        a mix. Blocks until every live publisher answered (at most ``timeout`` seconds; data
        arriving meanwhile is kept). Raises :class:`~epochstream.filters.FilterError` for a
        malformed filter, one too big for the wire, or a change of ``keys`` on a topic whose
        publishers declare no key column (a key function: this subscriber cannot re-check keys;
        nothing changes), ``TimeoutError`` if a publisher did not answer
        (the change then stays pending-safe: later epochs are still whole under one of the two
        filters, released under the old one), ``NotImplementedError`` for orders other than
        total and product."""
        new = Filter(keys, columns, where)
        boundary(self.order, [])  # NotImplementedError before anything is sent
        joined = self._partitions_joined
        if joined is not None and (new.keys is None or not partitions_for(
                new.keys, self.partitions) <= joined):
            raise FilterError(
                f"topic {self.topic!r} is partitioned by key and this subscriber joined only "
                f"partitions {sorted(joined)} (where its keys live): the new filter needs keys "
                f"held there; subscribe anew for others")
        deadline = _time.monotonic() + timeout
        if not self.wait_ready(timeout):
            raise TimeoutError(f"topic {self.topic!r}: not every partition's snapshot arrived "
                               f"within {timeout} s")
        old = self._program or Program.single(self.order, Filter())
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
        self._filter_id = next(_update_ids) % (1 << 31)
        self._filter_wait = {}
        self._filter_floors = []
        self._program = pending
        self._send_program(self._filter_id)
        try:
            while True:
                live = set(self._by_partition)
                if live <= set(self._filter_wait):
                    break
                left = deadline - _time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"topic {self.topic!r}: partitions {sorted(live - set(self._filter_wait))} "
                        f"did not answer the filter update within {timeout} s")
                self._pump(min(left, 0.05))  # what arrives waits in _parked
            uppers = [t for p, ts in self._filter_wait.items() for t in ts]
            uppers.extend(self._data_upper.elements)  # data received from partitions that
            # finished (no answer) or whose answer overtook nothing: filtered by the old one
        finally:
            self._filter_wait = None
        b = boundary(self.order, uppers)
        for floor in self._filter_floors:  # a relay widened its upstream from ``floor`` on:
            b = join(self.order, b, floor)  # no epoch before it came under the new filter
        self._program = old.with_change(new, b)
        self._send_program(next(_update_ids) % (1 << 31))
        self.stats["filter_updates"] += 1
        return b

    def _send_program(self, uid: int) -> None:
        frames = wire.encode_control(wire.UPDATE, id=uid, filter=self._program.to_wire())
        for s in list(self._by_partition.values()):
            send_nowait(s, frames)  # not taken (a refused connection): its answer times out


def _check_size(program: Program) -> None:
    """FilterError for a program too big to travel in a hello or an update (MAX_WIRE_BYTES;
    a publisher's socket would drop the connection, not answer)."""
    n = len(wire.encode_control(wire.UPDATE, id=0, filter=program.to_wire())[1])
    if n > MAX_WIRE_BYTES:
        raise FilterError(f"the filter takes {n} bytes on the wire, more than {MAX_WIRE_BYTES} "
                          f"(a hello or update travels in at most 64 KiB): use fewer keys or "
                          f"'in' values")
