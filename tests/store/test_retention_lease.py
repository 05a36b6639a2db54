"""Retention by a lease holder (issue 23): the catalog's retention lease (SQLite, PostgreSQL and
the network catalog), its holders (a publisher, ``epochstream retention run``) racing, and a
runner killed with SIGKILL mid-deletion. Real processes, a ``file://`` store and SeaweedFS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from epochstream import Catalog
from epochstream.errors import Fenced


def _log(cat, topic="t"):
    cat.create_topic(topic)
    cat.history_begin(topic, 0, "/tmp/nowhere-lease", [0], [])


def test_the_lease_has_one_holder_until_it_lapses(catalog_location):
    """Taken by one holder, refused to another (naming the holder) until it lapses on the
    catalog's clock; renewed by its holder; released; recorded limits read back."""
    cat = Catalog(catalog_location)
    _log(cat)
    assert cat.retention_acquire("t", 0, "a", lease=0.5) == (True, "a")
    ok, who = cat.retention_acquire("t", 0, "b", lease=30)
    assert not ok and who.startswith("a (pid ") and "lease 0.5 s" in who
    assert cat.retention_acquire("t", 0, "a", lease=0.5)[0]  # renewed
    time.sleep(0.7)
    assert cat.retention_acquire("t", 0, "b", lease=30) == (True, "b")  # lapsed: taken
    assert not cat.retention_acquire("t", 0, "a", lease=0.5)[0]
    assert not cat.retention_release("t", 0, "a") and cat.retention_release("t", 0, "b")
    assert cat.retention_acquire("t", 0, "a", lease=30)[0]
    assert cat.retention_acquire("nope", 0, "a", lease=30) == \
        (False, "nobody: the topic does not exist")
    assert cat.retention_limits("t") is None
    cat.retention_record("t", {"max_bytes": 10, "max_age": 1.5, "max_epochs": None})
    assert cat.retention_limits("t") == {"max_bytes": 10, "max_age": 1.5, "max_epochs": None}
    with pytest.raises(Exception, match="must be a number"):
        cat.retention_record("t", {"max_bytes": -1})
    with pytest.raises(Exception, match="lease"):
        cat.retention_acquire("t", 0, "a", lease=-1)


def test_a_trim_without_the_lease_is_fenced_and_changes_nothing(catalog_location):
    cat = Catalog(catalog_location)
    _log(cat)
    cat.history_commit("t", 0, epochs=[], lower=[1], upper=[], segment=0, committed=0,
                       roll_to=1)
    before = cat.history_state("t", 0)
    with pytest.raises(Fenced, match="does not hold the retention lease .held by nobody"):
        cat.history_trim("t", 0, 1, "x")
    cat.retention_acquire("t", 0, "a", lease=30)
    with pytest.raises(Fenced, match="held by a "):
        cat.history_trim("t", 0, 1, "x")
    assert cat.history_state("t", 0) == before
    since, _ = cat.history_trim("t", 0, 1, "a")
    assert since == (1,)


def test_a_dead_holder_on_this_host_loses_the_lease_at_once(tmp_path):
    """The same-host fast path: a holder whose process is gone holds nothing, whatever its
    lease (as a partition's row, catalog/holders.py)."""
    cat = Catalog(tmp_path / "cat")
    _log(cat)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert cat.retention_acquire("t", 0, "other", lease=600, pid=p.pid)[0]
        assert not cat.retention_acquire("t", 0, "me", lease=30)[0]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert cat.retention_acquire("t", 0, "me", lease=30) == (True, "me")


def test_the_network_catalog_grants_the_lease(tmp_path):
    from epochstream.catalog.server import CatalogServer

    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        cat = Catalog(srv.endpoint)
        _log(cat)
        assert cat.retention_acquire("t", 0, "a", lease=30) == (True, "a")
        ok, who = cat.retention_acquire("t", 0, "b", lease=30)
        assert not ok and f"pid {os.getpid()}" in who
        with pytest.raises(Fenced):
            cat.history_trim("t", 0, 0, "b")
        cat.retention_record("t", {"max_epochs": 3})
        assert cat.retention_limits("t") == {"max_bytes": None, "max_age": None,
                                             "max_epochs": 3}
        assert cat.retention_release("t", 0, "a")
        cat.close()
