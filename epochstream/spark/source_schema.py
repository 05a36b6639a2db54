"""The rows' schema of a Spark read of a topic: what ``DataSource.schema()`` returns at
``.load()`` (:func:`source_schema`, checking everything a query needs), the ``_epoch`` and
``_partition`` columns the source adds, and the Arrow schema read batches must have
(docs/spark.md, "Options" and "Errors")."""

from __future__ import annotations

from collections.abc import Mapping

from ..history import History
from .source_history import _resolve_start, _states
from .source_options import SourceError, SourceOptions

__all__ = ["source_schema", "EPOCH_COLUMN", "PARTITION_COLUMN"]

EPOCH_COLUMN = "_epoch"
PARTITION_COLUMN = "_partition"


def _meta_fields(order):
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StructField

    epoch = (LongType() if getattr(order, "width", None) is None
             else ArrayType(LongType(), containsNull=False))
    return [StructField(EPOCH_COLUMN, epoch, nullable=False),
            StructField(PARTITION_COLUMN, IntegerType(), nullable=False)]


def source_schema(options: Mapping[str, str]):
    """The rows' schema for ``.load()`` without a user schema: the topic's Arrow schema, taken
    from its newest retained epoch (or, with none retained yet, the catalog's schema text as a
    Spark DDL string, e.g. ``SparkPublisherHost(..., schema=...)``), plus ``_epoch`` and
    ``_partition``. Returns a ``StructType`` or a DDL string.

    Checks everything a query needs, so that ``.load()`` fails: raises ``TopicNotFound``,
    ``HistoryUnavailable`` (no log, or ``startingPosition`` older than what is retained) or
    :class:`SourceError` (bad option; a msgpack topic — give ``.schema(...)``; an Arrow topic
    with no retained epoch and no schema text; a column named ``_epoch`` or ``_partition``)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    opts = SourceOptions(options)
    history = History(opts.topic, catalog=opts.catalog)
    checked = _states(history)
    _resolve_start(history, opts, checked)
    info = checked[1]
    if history.codec.name != "arrow":
        raise SourceError(
            f"topic {opts.topic!r} uses codec {history.codec.name!r}: its records carry no "
            f"schema; give one with spark.readStream.schema(\"<columns>, _epoch "
            f"{'bigint' if getattr(history.order, 'width', None) is None else 'array<bigint>'}, "
            f"_partition int\") (records are dicts, read by column name, or sequences, by "
            f"position), or publish it with codec=\"arrow\"")
    retained = history.records()
    if retained:
        _, recs = retained[-1]
        _, payload = history.payloads(list(recs[:1]))[0]
        fields = list(from_arrow_schema(history.codec.decode(payload).schema).fields)
    elif info.schema:
        return f"{info.schema}, {EPOCH_COLUMN} " + (
            "BIGINT" if getattr(history.order, "width", None) is None else "ARRAY<BIGINT>") + \
            f", {PARTITION_COLUMN} INT"
    else:
        raise SourceError(
            f"topic {opts.topic!r} has no retained epoch yet to take its Arrow schema from, and "
            f"the catalog has no schema text for it: give one with "
            f"spark.readStream.schema(...) (its columns plus {EPOCH_COLUMN}, {PARTITION_COLUMN})")
    clash = [f.name for f in fields if f.name in (EPOCH_COLUMN, PARTITION_COLUMN)]
    if clash:
        raise SourceError(f"topic {opts.topic!r} has column(s) {clash}, which the source adds "
                          f"itself; rename them or give a schema with .schema(...)")
    return StructType(fields + _meta_fields(history.order))


def _arrow_schema(schema):
    """Spark ``StructType`` -> the exact ``pyarrow.Schema`` PySpark checks read batches
    against (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # PySpark 4.0: no timezone argument (timestamps are UTC)
        return to_arrow_schema(schema)
