"""The catalog's records: the values a reader gets (:class:`TopicInfo`, :class:`PartitionInfo`)
and how a partition row's columns become them.

A partition's ``upper`` frontier is stored as JSON text (:func:`encode_upper`,
:func:`decode_upper`): a list of times, each an int or a list of ints (a product time); it reads
back as a tuple of times, product times as tuples. A row is read with the columns
:data:`ROW_COLUMNS`, in that order, and :func:`partition_from_row` turns it into a
:class:`PartitionInfo`, reporting a stored ``live`` state whose process is gone as ``"dead"``
(judged now, by :func:`~epochstream.catalog.holders.pid_alive`), or, for a row registered with
a lease (through the network catalog), whose lease expired
(:func:`~epochstream.catalog.holders.lease_alive`).
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any

from .holders import holder_alive, lease_alive
from ..errors import CatalogError
from ..order import by_name

__all__ = ["PartitionInfo", "TopicInfo", "ROW_COLUMNS", "partition_from_row", "encode_upper",
           "decode_upper", "STATES"]

STATES = ("live", "closed", "aborted")
"""The states stored in ``partitions.state`` (readers also report ``"dead"``:
:mod:`epochstream.catalog.schema`)."""

ROW_COLUMNS = ("idx, endpoint, ingest, state, incarnation, pid, pid_start, host, upper, "
               "updated_at, lease, server_key, generation, run")
"""The ``partitions`` columns :func:`partition_from_row` reads, in order (for a ``SELECT``)."""


def _to_time(t: Any) -> Any:
    """JSON gives lists for tuples: turn every (nested) list back into a tuple."""
    if isinstance(t, list):
        return tuple(_to_time(x) for x in t)
    return t


def encode_upper(upper: Any) -> str:
    """``upper`` (an iterable of times: ints, or tuples/lists of ints) as the stored JSON text.
    Raises :class:`CatalogError` for anything else (e.g. floats, strings, a non-iterable)."""
    try:
        times = [[operator.index(x) for x in t] if isinstance(t, (tuple, list))
                 else operator.index(t) for t in upper]
    except TypeError:
        raise CatalogError(f"upper must be an iterable of times (ints, or tuples of ints), "
                           f"got {upper!r}") from None
    return json.dumps(times)


def decode_upper(text: str) -> tuple:
    """The stored JSON text of an ``upper`` column as a tuple of times (ints, or tuples of ints);
    ``NULL``/empty text reads as ``()``."""
    return tuple(_to_time(t) for t in json.loads(text or "[]"))


@dataclass(frozen=True)
class PartitionInfo:
    """One registered partition of a topic, as the catalog saw it when it was read.

    - ``index``: partition number, ``0 <= index < TopicInfo.partitions``;
    - ``endpoint``: ZeroMQ endpoint of its publisher; ``ingest``: optional second endpoint;
    - ``state``: ``"live"``, ``"closed"`` (finished cleanly), ``"aborted"`` (stopped on an error;
      its open epochs will never complete), ``"expired"`` (stored ``live``, registered with a
      lease that was not renewed in time) or ``"dead"`` (stored ``live`` but the process is
      gone, judged when read);
    - ``incarnation``: id of the publisher run; ``pid``: its process id;
    - ``upper``: the stored upper frontier, a tuple of times (ints, or tuples of ints for product
      orders), in every state: while ``live`` the last one recorded (``register_partition(upper=)``,
      then :meth:`~epochstream.catalog.Catalog.record_upper`; ``()`` if none), once
      ``closed``/``aborted`` the final one given to
      :meth:`~epochstream.catalog.Catalog.close_partition`, when ``dead`` the last one recorded
      before the process died;
    - ``updated_at``: ``time.time()`` of the last register/heartbeat/record_upper/close, in
      seconds;
    - ``host``, ``pid_start``: where and when the publisher process started (liveness checks);
    - ``lease``: seconds, or ``None``. A partition registered through the network catalog
      (:mod:`epochstream.catalog.client`) holds a lease renewed by its publisher's heartbeats
      (each renewal stamps ``updated_at``): it is ``"dead"`` once ``updated_at + lease`` has
      passed, and its pid is not checked. ``None``: liveness is the pid check;
    - ``server_key``: the publisher's CURVE public key (Z85 text) when it serves with
      ``security=`` (a subscriber with ``Security.curve(server_public=None)`` connects with it),
      ``None`` for plain TCP (docs/security.md);
    - ``generation``: how many incarnations have registered this partition (Kafka's producer
      epoch): each registration by a new incarnation raises it by one, and every write of an
      older incarnation is refused (:class:`~epochstream.errors.Fenced`);
    - ``run``: the run of the topic this registration belongs to (1, 2, ...): a partition that
      closed is final for its run, and registering it again begins the next run once every
      partition of its run ended (``SqlCatalog`` ``claim_run``).
    """

    index: int
    endpoint: str
    ingest: str | None
    state: str
    incarnation: str
    pid: int
    upper: tuple
    updated_at: float
    host: str | None = None
    pid_start: float | None = None
    lease: float | None = None
    server_key: str | None = None
    generation: int = 0
    run: int = 1

    @property
    def alive(self) -> bool:
        """``True`` iff the state is ``"live"`` and the publisher process is running now (with a
        ``lease``: the lease has not expired now, by this machine's clock)."""
        return self.state == "live" and holder_alive(self.pid, self.pid_start, self.host,
                                                     self.lease, self.updated_at)


@dataclass(frozen=True)
class TopicInfo:
    """A topic's definition plus its registered partitions (``partition_info``, sorted by index;
    a partition nobody registered yet is absent, so it may hold fewer than ``partitions``)."""

    name: str
    order_name: str
    codec: str
    partitions: int
    schema: str | None
    partition_info: tuple[PartitionInfo, ...]
    partition_key: str | None = None
    """The key column of a key-partitioned topic (:mod:`epochstream.partitioning`), else None."""

    @property
    def order(self):
        """The order object (``epochstream.order.by_name(order_name)``)."""
        return by_name(self.order_name)

    @property
    def complete(self) -> bool:
        """Whether every partition ``0..partitions-1`` is registered."""
        return {p.index for p in self.partition_info} == set(range(self.partitions))

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Endpoints of partitions ``0..partitions-1``, in order.

        Raises :class:`CatalogError` naming the missing indices if some partition is not
        registered."""
        by_index = {p.index: p.endpoint for p in self.partition_info}
        missing = [i for i in range(self.partitions) if i not in by_index]
        if missing:
            raise CatalogError(
                f"topic {self.name!r}: partition(s) {missing} of {self.partitions} not registered "
                f"by any publisher yet")
        return tuple(by_index[i] for i in range(self.partitions))

    def describe(self) -> str:
        """The definition as one line of text (for error messages): order, codec, partitions,
        schema."""
        key = "" if self.partition_key is None else f", partition_key={self.partition_key!r}"
        return (f"order={self.order_name!r}, codec={self.codec!r}, partitions={self.partitions}, "
                f"schema={self.schema!r}{key}")


def partition_from_row(row, now: float | None = None) -> PartitionInfo:
    """The :class:`PartitionInfo` of one ``partitions`` row read with :data:`ROW_COLUMNS`; a
    ``live`` row whose process is not running now (or whose lease expired at ``now``, the
    catalog's clock in seconds, default this machine's) gets state ``"expired"`` (its lease ran
    out) or ``"dead"`` (its process is gone)."""
    (idx, endpoint, ingest, state, incarnation, pid, pid_start, host, upper, updated_at, lease,
     server_key, generation, run) = row
    if state == "live" and not holder_alive(pid, pid_start, host, lease, updated_at, now):
        # a lease that ran out reads "expired"; a process known to be gone, "dead"
        state = "expired" if lease is not None and not lease_alive(updated_at, lease,
                                                                  now) else "dead"
    return PartitionInfo(index=idx, endpoint=endpoint, ingest=ingest, state=state,
                         incarnation=incarnation, pid=pid, upper=decode_upper(upper),
                         updated_at=updated_at, host=host, pid_start=pid_start, lease=lease,
                         server_key=server_key, generation=generation, run=run)
