"""Key-partitioned topics: which partition holds a key (docs/filters.md, "Key-partitioned
topics"). Pure, no I/O.

A topic created with ``partitioning="hash"`` and a key column assigns every record to the
partition :func:`partition_of` its key value: ``zlib.crc32(msgpack.packb(key)) % partitions``,
the key packed as msgpack does on the wire (``use_bin_type=True``: ``str`` and ``bytes`` stay
apart, and ``1``, ``1.0`` and ``True`` are different keys, as in a filter's ``keys``). CRC-32
(ISO 3309, zlib's) is stable across processes,
machines and languages, unlike Python's ``hash()``. Each partition's publisher refuses a record
whose key belongs to another partition (:func:`check_records`), so a subscriber asking for
``keys`` needs only the partitions :func:`partitions_for` names.

>>> partition_of("AA", 4), partition_of("UA", 4)
(2, 3)
>>> sorted(partitions_for(["AA", "UA", "DL"], 4))
[2, 3]
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable

import msgpack

from .errors import EpochstreamError

__all__ = ["HASH", "PARTITIONINGS", "partition_of", "partitions_for", "split", "check_records",
           "partition_key",
           "PartitioningError"]

HASH = "hash"
"""The one partitioning there is: by the CRC-32 of the msgpack-packed key."""
PARTITIONINGS = (None, HASH)
"""``None``: records go to any partition (the publisher's choice); :data:`HASH`: by key."""

_packb = msgpack.Packer(use_bin_type=True).pack


class PartitioningError(EpochstreamError, ValueError):
    """A record sent to a partition that does not hold its key, or one without the key."""


def partition_of(key: Any, partitions: int) -> int:
    """The partition (``0 .. partitions - 1``) that holds records whose key is ``key`` (a
    msgpack scalar). Raises ``TypeError`` for a key msgpack cannot pack."""
    return zlib.crc32(_packb(key)) % partitions


def partitions_for(keys: Iterable[Any], partitions: int) -> set[int]:
    """The partitions that can hold any of ``keys``."""
    return {partition_of(k, partitions) for k in keys}


def _key_values(records, key: str) -> list:
    if hasattr(records, "column") and hasattr(records, "schema"):  # Arrow batch or table
        if key not in records.schema.names:
            raise PartitioningError(f"the batch has no key column {key!r}")
        return records.column(key).to_pylist()
    out = []
    for r in records:
        if not isinstance(r, dict) or key not in r:
            raise PartitioningError(f"a record without the key column {key!r}: {r!r:.80}")
        out.append(r[key])
    return out


def split(records, key: str, partitions: int) -> dict[int, Any]:
    """``{partition: its records}`` (lists of dict records, or Arrow tables/batches taken
    row by row, in order) for a producer that writes to every partition of a key-partitioned
    topic. Raises :class:`PartitioningError` for a record without the key."""
    values = _key_values(records, key)
    index: dict[int, list] = {}
    for i, v in enumerate(values):
        index.setdefault(partition_of(v, partitions), []).append(i)
    if hasattr(records, "take"):
        return {p: records.take(rows) for p, rows in index.items()}
    recs = list(records)
    return {p: [recs[i] for i in rows] for p, rows in index.items()}


def check_records(records, key: str, partition: int, partitions: int) -> None:
    """Raise :class:`PartitioningError` (naming the first offender) unless every record's key
    belongs to ``partition``."""
    for v in _key_values(records, key):
        p = partition_of(v, partitions)
        if p != partition:
            raise PartitioningError(
                f"key {v!r} belongs to partition {p} of {partitions}, not {partition} (a "
                f"key-partitioned topic: use epochstream.partitioning.split)")


def partition_key(key, partitioning: str | None) -> str | None:
    """The topic's ``partition_key`` for a publisher's ``key`` (a column name, a function
    ``record -> key`` or ``None``) and ``partitioning`` (``None`` or :data:`HASH`): the key
    column of a key-partitioned topic, else ``None``. ``TypeError`` for a key of another kind,
    ``ValueError`` for an unknown partitioning or hash partitioning without a key column."""
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise TypeError(f"key must be a column name or a function, got {type(key).__name__}")
    if partitioning not in PARTITIONINGS:
        raise ValueError(f"partitioning must be None or {HASH!r}, got {partitioning!r}")
    if partitioning is not None and not isinstance(key, str):
        raise ValueError(f"partitioning={partitioning!r} needs the topic's key column "
                         f"(key='column'), got key={key!r}")
    return key if partitioning is not None else None
