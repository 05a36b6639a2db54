"""The executor side of the Spark source: what one Spark task reads (:class:`EpochSlice`,
whole epochs of one topic partition, cut to about :data:`SLICE_BYTES` by :func:`_slices`) and
its rows as Arrow record batches of the query's schema, read from the logged, checksummed
bytes (:func:`_read_slice`): a pure function of the slice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import InputPartition

from ..catalog.history import EpochRecord
from ..history import History
from .offsets import _json_time
from .source_options import SourceError
from .source_schema import EPOCH_COLUMN, PARTITION_COLUMN

__all__ = ["EpochSlice", "SLICE_BYTES"]

SLICE_BYTES = 64 << 20
"""Payload bytes per input partition (one Spark task): a topic partition's epochs of a batch are
cut into slices of about this size (whole epochs; one larger epoch is a slice of its own)."""


class EpochSlice(InputPartition):
    """What one Spark task reads: ``records``, the :class:`EpochRecord`\\ s of whole epochs of
    topic partition ``partition`` (from the index, in a linear extension of the order), with
    the ``topic`` and ``catalog`` to read them from. ``value`` is ``(partition, times)``."""

    def __init__(self, topic: str, catalog: str | None, partition: int,
                 records: tuple[EpochRecord, ...]):
        super().__init__((partition, tuple(r.time for r in records)))
        self.topic = topic
        self.catalog = catalog
        self.partition = partition
        self.records = records


def _slices(topic: str, catalog: str | None, epochs) -> list[EpochSlice]:
    """Per topic partition, the batch's records cut into slices of about :data:`SLICE_BYTES`."""
    by_partition: dict[int, list[EpochRecord]] = {}
    for _, recs in epochs:
        for r in recs:
            by_partition.setdefault(r.partition, []).append(r)
    out = []
    for p in sorted(by_partition):
        chunk: list[EpochRecord] = []
        size = 0
        for r in by_partition[p]:
            if chunk and size + r.nbytes > SLICE_BYTES:
                out.append(EpochSlice(topic, catalog, p, tuple(chunk)))
                chunk, size = [], 0
            chunk.append(r)
            size += r.nbytes
        if chunk:
            out.append(EpochSlice(topic, catalog, p, tuple(chunk)))
    return out


def _read_slice(partition: EpochSlice, target: Any) -> Iterator:
    """The rows of ``partition``'s epochs as ``pyarrow.RecordBatch``\\ es of schema ``target``
    (a ``pyarrow.Schema``), one per logged payload (what the stream reader's ``read`` yields,
    :class:`~epochstream.spark.source.EpochstreamStreamReader`)."""
    import pyarrow as pa

    columns = [f.name for f in target if f.name not in (EPOCH_COLUMN, PARTITION_COLUMN)]
    history = History(partition.topic, catalog=partition.catalog)
    codec = history.codec
    for record in partition.records:
        epoch = _json_time(record.time)
        for p, payload in history.payloads([record]):
            data = codec.decode(payload)
            n = data.num_rows if codec.name == "arrow" else len(data)
            if n == 0:
                continue
            arrays = []
            for field in target:
                if field.name == EPOCH_COLUMN:
                    arrays.append(pa.array([epoch] * n, field.type))
                elif field.name == PARTITION_COLUMN:
                    arrays.append(pa.array([p] * n, field.type))
                else:
                    arrays.append(_column(data, codec.name, field, columns.index(field.name),
                                          n, partition.topic, record.time))
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


def _column(data, codec: str, field, position: int, n: int, topic: str, t: Any):
    """Column ``field`` of one payload, converted to ``field.type``: an Arrow batch's column of
    that name (nulls if it has none); msgpack records' values, by name for dicts, else by
    ``position`` (among the schema's columns without ``_epoch``/``_partition``)."""
    import pyarrow as pa

    try:
        if codec == "arrow":
            i = data.schema.get_field_index(field.name)
            if i < 0:
                return pa.nulls(n, field.type)
            col = data.column(i)
            return col if col.type == field.type else col.cast(field.type)
        name = field.name
        values = [r.get(name) if isinstance(r, dict)
                  else (r[position] if isinstance(r, (list, tuple)) and position < len(r)
                        else None)
                  for r in data]
        return pa.array(values, field.type)
    except (pa.ArrowException, TypeError, ValueError, KeyError) as e:
        raise SourceError(f"topic {topic!r}, epoch {t!r}: column {field.name!r} does not "
                          f"convert to {field.type}: {e}") from None
