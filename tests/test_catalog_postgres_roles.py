"""docs/deploy.md "PostgreSQL privileges", checked: each side runs as a role holding only the
privileges that table lists (granted by the tables' owner, the admin role), against a real
PostgreSQL server. A missing grant fails here with PostgreSQL's "permission denied for table
X" -- the table in the docs is then wrong."""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from epochstream import Catalog, EpochGroup, Publisher, Retention, Subscriber
from epochstream.errors import CatalogError

# the grants of docs/deploy.md, table by table
PUBLISHER = {
    "epochstream_schema": "SELECT",
    "topics": "SELECT, INSERT, UPDATE",
    "partitions": "SELECT, INSERT, UPDATE",
    "history_partitions": "SELECT, INSERT, UPDATE",
    "history_segments": "SELECT, INSERT, UPDATE, DELETE",
    "history_epochs": "SELECT, INSERT, DELETE",
    "durables": "SELECT, UPDATE",
    "groups": "SELECT, UPDATE",
    "group_epochs": "SELECT",
    "grants": "SELECT",
    "retention_leases": "SELECT, INSERT, UPDATE, DELETE",
    "retention_limits": "SELECT, INSERT, UPDATE",
}
SUBSCRIBER = {
    "epochstream_schema": "SELECT",
    "topics": "SELECT",
    "partitions": "SELECT",
    "history_partitions": "SELECT",
    "history_segments": "SELECT",
    "history_epochs": "SELECT",
    "durables": "SELECT, INSERT, UPDATE",
    "groups": "SELECT, INSERT, UPDATE",
    "group_epochs": "SELECT, INSERT, UPDATE, DELETE",
    "grants": "SELECT",
    "retention_leases": "SELECT",
    "retention_limits": "SELECT",
}


def _role(postgres, owner_url: str, name: str, grants: dict) -> str:
    """Create login role ``name`` holding exactly ``grants``; return its URL."""
    postgres.admin(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
        sql.Identifier(name), sql.Literal("pw")))
    with psycopg.connect(owner_url, autocommit=True) as conn:
        for table, privileges in grants.items():
            conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(
                sql.SQL(privileges), sql.Identifier(table), sql.Identifier(name)))
    return owner_url.replace(f"{quote(postgres.user, safe='')}:{quote(postgres.password, safe='')}@",
                             f"{name}:pw@")


def test_each_side_runs_with_only_the_documented_privileges(postgres, pg_url, tmp_path):
    Catalog(pg_url).close()  # the admin role (the owner) creates the tables
    tag = os.getpid()
    pub_url = _role(postgres, pg_url, f"es_pub_{tag}", PUBLISHER)
    sub_url = _role(postgres, pg_url, f"es_sub_{tag}", SUBSCRIBER)

    with pytest.raises(CatalogError, match="permission denied"):  # the subscriber's role
        Catalog(sub_url).create_topic("nope")                    # cannot define topics

    with Publisher("t", catalog=Catalog(pub_url), retention=Retention(
            dir=tmp_path / "log", max_epochs=50, segment_bytes=4096)) as pub:
        got, failed = [], []
        sub = Subscriber("t", catalog=sub_url, durable="d", start="earliest", wait=10)

        def live():
            try:
                with sub:
                    for epoch in sub.epochs(timeout=10):
                        got.append(epoch.time)
                        sub.ack(epoch)
                        if epoch.time == 79:
                            return
            except BaseException as e:  # noqa: BLE001 - asserted below
                failed.append(e)

        reader = threading.Thread(target=live, daemon=True)
        reader.start()
        for e in range(80):  # past max_epochs: retention deletes segments and index rows
            pub.send(e, [{"e": e, "pad": "x" * 200}])
            pub.advance_to(e + 1)
            deadline = time.monotonic() + 10
            while len(got) < e - 10 and not failed and time.monotonic() < deadline:
                time.sleep(0.005)  # stay within max_epochs of the durable's acks
        reader.join(30)
        assert not failed, failed
        assert got == list(range(80))
        group = EpochGroup("t", "g", catalog=Catalog(sub_url))
        leases = group.fetch(3, expires=5)
        assert leases
        for lease in leases:
            lease.ack()
    cat = Catalog(pg_url)
    assert cat.durable("t", "d").position == (80,)
    assert cat.lookup("t").partition_info[0].state == "closed"
    assert cat.history_state("t", 0).since[0] > 0  # retention ran (a refusal is only logged)
    cat.close()
