"""Spark session helpers: a local SparkSession tuned for small micro-batches, registering the
``epochstream`` data source, and starting a streaming query into a topic."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from .sink import SOURCE_NAME, EpochstreamDataSource

__all__ = ["local_session", "register", "start_query"]

#: settings of :func:`local_session` (fast start, small and quick micro-batches, no UI)
_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.sql.streaming.stopTimeout": "10s",
    "spark.python.worker.reuse": "true",
}


def local_session(app_name: str = "epochstream", master: str = "local[2]", conf: dict | None = None):
    """A local SparkSession tuned for small, fast micro-batches (see ``_SETTINGS``, updated
    with ``conf``); its Python workers run this interpreter (``PYSPARK_PYTHON`` is set)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    b = SparkSession.builder.master(master).appName(app_name)
    for k, v in {**_SETTINGS, **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def register(spark) -> None:
    """Register the ``epochstream`` data source with ``spark`` (idempotent)."""
    spark.dataSource.register(EpochstreamDataSource)


def start_query(spark, df, topic: str, *, checkpoint: str | os.PathLike,
                catalog: str | os.PathLike | Any = None, trigger: dict | None = None,
                query_name: str | None = None, options: dict | None = None):
    """Start ``df.writeStream.format("epochstream")`` into ``topic``; returns the StreamingQuery.

    ``checkpoint``: a fresh directory per query (a reused one resumes old batch ids = epochs);
    ``catalog``: a Catalog or path (made absolute: workers may run elsewhere); ``trigger``:
    keyword arguments for ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``);
    ``options``: more writer options (e.g. ``{"ackTimeout": 30}``)."""
    register(spark)
    cat_path = getattr(catalog, "path", catalog)
    w = (df.writeStream.format(SOURCE_NAME).option("topic", topic)
         .option("checkpointLocation", str(Path(checkpoint).absolute())))
    if cat_path is not None:
        w = w.option("catalog", str(Path(cat_path).absolute()))
    for k, v in (options or {}).items():
        w = w.option(k, str(v))
    if trigger:
        w = w.trigger(**trigger)
    if query_name:
        w = w.queryName(query_name)
    return w.start()
