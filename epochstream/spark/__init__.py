"""Spark Structured Streaming ↔ epochstream: as a sink one Spark micro-batch is one epoch; as a
source a micro-batch is a range of whole epochs between two frontiers (docs/spark.md).

- :class:`EpochstreamDataSource` — a Python Data Source named ``epochstream`` (PySpark >= 4):
  ``df.writeStream.format("epochstream").option("topic", ...).option("catalog", ...)`` writes a
  topic, ``spark.readStream.format("epochstream").option("topic", ...)...load()`` reads one
  from its durable history (:class:`EpochstreamStreamReader`) (:func:`register` /
  :func:`start_query` register it).
- :class:`SparkPublisherHost` — runs in the user's driver program: creates the topic and, per
  topic partition, a :class:`~epochstream.transport.Publisher` plus an *ingest* endpoint that the
  query's tasks send their rows to.
- :func:`start_query`, :func:`local_session` — Spark helpers.

Exactly-once epochs follow Spark's two-phase sink protocol: every task attempt *stages* its
batches on the host; the driver-side commit names the attempts Spark kept, and the host
publishes exactly those and then completes the epoch. A repeated commit publishes nothing; a
commit whose attempts staged other row counts than their tasks reported is refused; staged
bytes are bounded.

Modules, one concept each:

- :mod:`~epochstream.spark.ingest` — the ingest wire: message types and their one codec;
- :mod:`~epochstream.spark.staging` — the pure exactly-once staging ledger;
- :mod:`~epochstream.spark.host` — :class:`SparkPublisherHost`, serving every partition;
- :mod:`~epochstream.spark.partition_server` — the serving loop of one partition, which drives
  the ledger and the Publisher;
- :mod:`~epochstream.spark.client` — a Spark worker's connections to the ingest endpoints, and
  the driver-side COMMIT of an epoch;
- :mod:`~epochstream.spark.sink` — the Data Source, its stream writer and commit message;
- :mod:`~epochstream.spark.source` — the Data Source's stream reader: batches of whole epochs
  between two frontiers, the query's durable subscription; its parts:
  :mod:`~epochstream.spark.source_options` (the options, ``SourceError``),
  :mod:`~epochstream.spark.offsets` (offsets as frontiers, the pure ``batch_end``),
  :mod:`~epochstream.spark.source_history` (log states, the latest complete frontier, the
  start), :mod:`~epochstream.spark.source_schema` (the rows' schema, at ``.load()``) and
  :mod:`~epochstream.spark.source_read` (what one task reads, as Arrow batches);
- :mod:`~epochstream.spark.session` — :func:`local_session`, :func:`register`,
  :func:`start_query`.

Importing this package imports PySpark.
"""

from .client import DEFAULT_COMMIT_TIMEOUT, send_commit  # noqa: F401 - importable as before
from .host import PartitionStats, Pause, SparkPublisherHost  # noqa: F401
from .ingest import IngestError
from .session import local_session, register, start_query
from .sink import (DEFAULT_ACK_TIMEOUT, SOURCE_NAME, EpochstreamCommitMessage,  # noqa: F401
                   EpochstreamDataSource, EpochstreamStreamWriter)
from .source import EpochstreamStreamReader, SourceError
from .staging import DEFAULT_MAX_STAGED_BYTES  # noqa: F401

__all__ = ["EpochstreamDataSource", "EpochstreamStreamWriter", "EpochstreamCommitMessage",
           "EpochstreamStreamReader", "SourceError", "SparkPublisherHost", "IngestError",
           "register", "start_query", "local_session", "SOURCE_NAME"]
