"""Shared fixtures. ``spark``: ONE local SparkSession for the whole test session, created lazily
(only when a test asks for it); tests that use it are marked ``@pytest.mark.spark``."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from epochstream.spark import local_session

    # local[2,2]: two cores, one retry per task (the fault-injection test relies on it)
    session = local_session("epochstream-tests", master="local[2,2]")
    try:
        yield session
    finally:
        session.stop()
