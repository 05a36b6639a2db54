"""Spark session helpers: a local SparkSession tuned for small micro-batches, registering the
``epochstream`` data source (after checking that Spark's worker Python can import it), and
starting a streaming query into a topic (after checking that a host serves the topic)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from ..catalog import location_kind
from .client import require_host
from .ingest import IngestError
from .sink import SOURCE_NAME, EpochstreamDataSource

__all__ = ["local_session", "register", "start_query", "check_worker_python"]

#: what a Spark worker imports to run the sink (it unpickles EpochstreamDataSource from it)
_WORKER_IMPORT = "epochstream.spark.sink"
_worker_ok: set[str] = set()  # worker Pythons that passed check_worker_python in this process

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


#: settings of :func:`local_session` that only fit a local master (executors elsewhere must
#: reach the driver: Spark's default, ``$SPARK_LOCAL_IP`` or this host's name, decides there)
_LOCAL_ONLY = ("spark.driver.host", "spark.driver.bindAddress")


def local_session(app_name: str = "epochstream", master: str = "local[2]", conf: dict | None = None):
    """A SparkSession tuned for small, fast micro-batches (see ``_SETTINGS``, updated with
    ``conf``); its Python workers run this interpreter (``PYSPARK_PYTHON`` is set).

    ``master``: ``local[N]`` (the default ``local[2]``), or a cluster's master URL such as
    ``spark://host:7077``: the driver is then not pinned to ``127.0.0.1`` and the executors get
    the same JVM options as the driver. On a cluster, every worker machine needs this Python
    (the same path, with epochstream installed)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = dict(_SETTINGS)
    if not master.startswith("local"):
        for k in _LOCAL_ONLY:
            settings.pop(k)
        settings["spark.executor.extraJavaOptions"] = settings["spark.driver.extraJavaOptions"]
    b = SparkSession.builder.master(master).appName(app_name)
    for k, v in {**settings, **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _pyspark_path() -> list[str]:
    """PySpark's own zips, which Spark puts on its Python workers' ``PYTHONPATH``."""
    try:
        from pyspark.find_spark_home import _find_spark_home
        home = _find_spark_home()
    except (Exception, SystemExit):  # noqa: BLE001 - best effort (it may sys.exit)
        return []
    return sorted(glob.glob(os.path.join(home, "python", "lib", "*.zip")))


def check_worker_python(spark, timeout: float = 60.0) -> None:
    """Raise :class:`IngestError` unless the Python that Spark starts for its Python workers can
    import the sink. Spark ships the data source to its workers by reference (module and class
    name): a worker whose Python lacks epochstream fails, at the first micro-batch, with a
    ``ModuleNotFoundError`` deep in PySpark's unpickling, before any code of epochstream runs.

    The worker Python is ``spark.sparkContext.pythonExec`` (``PYSPARK_PYTHON`` when the
    SparkContext was created, else ``python3`` from the ``PATH``). The check runs
    ``<it> -c "import epochstream.spark.sink"`` once per interpreter and process (about a second;
    successes are cached), in this directory and environment with PySpark's zips on the
    ``PYTHONPATH``, as a local worker would. It checks this machine only: on a cluster, every
    worker machine needs the same interpreter with epochstream installed."""
    exe = spark.sparkContext.pythonExec
    if exe in _worker_ok:
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(_pyspark_path() + [p for p in [env.get("PYTHONPATH")] if p])
    fix = ("Set PYSPARK_PYTHON to a Python that has epochstream installed before the SparkSession "
           "is created (e.g. os.environ[\"PYSPARK_PYTHON\"] = sys.executable; "
           "epochstream.spark.local_session() does this), or install epochstream into that Python")
    try:
        r = subprocess.run([exe, "-c", f"import {_WORKER_IMPORT}"], env=env, timeout=timeout,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IngestError(f"cannot run the Spark workers' Python {exe!r} (PYSPARK_PYTHON, "
                          f"default python3) to check that it can import epochstream: {e}. "
                          f"{fix}") from None
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {r.returncode}"
        raise IngestError(f"the Spark workers' Python cannot import epochstream: {exe!r} "
                          f"(PYSPARK_PYTHON, default python3) fails on `import {_WORKER_IMPORT}` "
                          f"with {why}. {fix}")
    _worker_ok.add(exe)


def register(spark) -> None:
    """Register the ``epochstream`` data source with ``spark`` (idempotent), after
    :func:`check_worker_python` (raises :class:`IngestError` when Spark's worker Python cannot
    import epochstream)."""
    check_worker_python(spark)
    spark.dataSource.register(EpochstreamDataSource)


def start_query(spark, df, topic: str, *, checkpoint: str | os.PathLike,
                catalog: str | os.PathLike | Any = None, trigger: dict | None = None,
                query_name: str | None = None, options: dict | None = None):
    """Start ``df.writeStream.format("epochstream")`` into ``topic``; returns the StreamingQuery.

    ``checkpoint``: a fresh directory per query (a reused one resumes old batch ids = epochs);
    ``catalog``: a Catalog, a path (made absolute: workers may run elsewhere) or a catalog's
    URL (``"tcp://host:port"``, ``"postgresql://..."``); ``trigger``:
    keyword arguments for ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``);
    ``options``: more writer options (e.g. ``{"ackTimeout": 30}``).

    Raises :class:`IngestError` before starting anything when Spark's worker Python cannot
    import epochstream (:func:`register`) or when no live
    :class:`~epochstream.spark.SparkPublisherHost` serves ``topic`` in the catalog."""
    register(spark)
    cat_path = getattr(catalog, "url", None) or getattr(catalog, "path", catalog)
    if cat_path is not None:  # a URL stays as it is; a path becomes absolute
        cat_path = (str(cat_path) if location_kind(str(cat_path)) != "sqlite"
                    else str(Path(cat_path).absolute()))
    require_host(cat_path, topic)
    w = (df.writeStream.format(SOURCE_NAME).option("topic", topic)
         .option("checkpointLocation", str(Path(checkpoint).absolute())))
    if cat_path is not None:
        w = w.option("catalog", cat_path)
    for k, v in (options or {}).items():
        w = w.option(k, str(v))
    if trigger:
        w = w.trigger(**trigger)
    if query_name:
        w = w.queryName(query_name)
    return w.start()
