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


# ---- PostgreSQL (the catalog's second store) -------------------------------------------------
# ONE throwaway server for the session (started on first use, stopped at the end), a fresh
# database per test. PostgreSQL 15 is installed on every machine of this project: a missing
# server is an error here, never a skip.

_databases = __import__("itertools").count()


@pytest.fixture(scope="session")
def postgres():
    from epochstream.testing.postgres import PostgresServer

    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(postgres) -> str:
    """A new, empty database on the session's PostgreSQL server: its URL (with password)."""
    return postgres.create_database(f"t{os.getpid()}_{next(_databases)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_location(request, tmp_path, monkeypatch):
    """Where a test's catalog lives: a SQLite file, then a PostgreSQL database (whose local
    stand-in directory, for epoch logs with ``Retention(dir=None)``, goes under ``tmp_path``
    through ``$EPOCHSTREAM_HOME``, which child processes inherit)."""
    if request.param == "sqlite":
        return tmp_path / "cat.sqlite"
    monkeypatch.setenv("EPOCHSTREAM_HOME", str(tmp_path / "home"))
    return request.getfixturevalue("pg_url")


@pytest.fixture(params=[1, 2], ids=["wire1", "wire2"])
def wire_version(request, monkeypatch):
    """Run a test once per data-message version (docs/protocol.md §2.2): ``1`` makes every
    publisher and subscriber of this process speak version 1 only (as before version 2 existed:
    subscribers offer ``[1]``, publishers choose 1), ``2`` leaves the default (both offered, 2
    chosen). Peers in other processes keep the default."""
    if request.param == 1:
        from epochstream import wire, wire2

        monkeypatch.setattr(wire, "WIRE_VERSIONS", (1,))
        monkeypatch.setattr(wire2, "WIRE_VERSIONS", (1,))
    return request.param
