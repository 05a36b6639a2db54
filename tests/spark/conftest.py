"""Fixtures of the Spark tests. Test modules here import the helpers of ``tests/`` (e.g.
``hypothesis_profiles``) and of this folder (:mod:`spark_support`) as top-level modules: both
folders are put on ``sys.path`` (pytest's default import mode would only add this one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

for _folder in (Path(__file__).parent, Path(__file__).parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@pytest.fixture
def quiet_spark(spark):
    """The session with 100-row Arrow batches (a day of ~900 rows is > 64 KiB: the sink really
    receives and stages rows before an injected fault) and no logging of the injected failures."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    spark.sparkContext.setLogLevel("OFF")
    try:
        yield spark
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.sparkContext.setLogLevel("ERROR")
