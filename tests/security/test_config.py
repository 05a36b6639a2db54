"""The pieces of security without a stream (docs/security.md): the ``Security`` value and its
key sources, the grant decision, the catalog's grants and server keys (embedded and through the
network catalog), the schema-5 migration of a version-4 file, and the ``keys``/``grant``
commands."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import zmq
import zmq.auth
from typer.testing import CliRunner

from epochstream import Catalog, Security
from epochstream.catalog.client import RemoteCatalog
from epochstream.catalog.schema import SCHEMA_VERSION
from epochstream.catalog.server import CatalogServer
from epochstream.cli import app
from epochstream.errors import CatalogError
from epochstream.security import (ENV_KEYS, Grant, check_grant, grant_matches, is_z85_key,
                                  load_allowed)

CLI_ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EPOCHSTREAM_CATALOG": None,
           "EPOCHSTREAM_KEYS": None}


# ---- the Security value -------------------------------------------------------------------


def test_security_values_and_key_sources(keys, monkeypatch):
    srv = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    assert srv.is_server and not srv.is_client and srv.enabled
    assert srv.server_public == keys.public["server"].decode()
    assert srv.allow == str(keys.allow.resolve())
    assert keys.secret["server"].decode() not in repr(srv)  # secrets stay out of repr
    any_client = Security.curve(server_secret=(keys.public["server"], keys.secret["server"]))
    assert any_client.allow is None and any_client.server_secret == keys.secret["server"].decode()
    cli = Security.curve(client_secret=str(keys.path("alice")),
                         server_public=keys.public["server"])
    assert cli.is_client and cli.server_public == keys.public["server"].decode()
    assert Security.curve(client_secret=keys.path("alice"), server_public=keys.path(
        "server")).server_public == cli.server_public  # a .key_secret gives its public half
    assert Security.curve(client_secret=keys.path("alice")).server_public is None
    assert Security.none() == Security() and not Security.none().enabled
    # bare names come from $EPOCHSTREAM_KEYS: NAME.key_secret, NAME.key, NAME/
    with pytest.raises(ValueError, match=f"set \\${ENV_KEYS}"):
        Security.curve(client_secret="alice")
    monkeypatch.setenv(ENV_KEYS, str(keys.dir))
    (keys.dir / "readers").mkdir(exist_ok=True)
    (keys.dir / "readers" / "alice.key").write_bytes((keys.dir / "alice.key").read_bytes())
    named = Security.curve(client_secret="alice", server_public="server")
    assert named.client_public == keys.public["alice"].decode()
    assert named.server_public == keys.public["server"].decode()
    assert Security.curve(server_secret="server", allow="readers").allow == \
        str((keys.dir / "readers").resolve())


@pytest.mark.parametrize("kwargs, match", [
    ({}, "give server_secret"),
    ({"server_secret": "SERVER", "client_secret": "ALICE"}, "one of them"),
    ({"client_secret": "nope/none.key_secret"}, "no certificate file at nope/none.key_secret"),
    ({"client_secret": "PUBLIC"}, "holds no secret key"),
    ({"client_secret": ("a" * 40, "b" * 40)}, "does not belong to its secret key"),
    ({"client_secret": ("short", "b" * 40)}, "two 40-character Z85 keys"),
    ({"client_secret": "ALICE", "server_public": "x" * 39}, "no certificate file"),
    ({"client_secret": "ALICE", "server_public": b"\xff" * 40}, "not a 40-character Z85 key"),
    ({"client_secret": "ALICE", "allow": "."}, "allow= is the publisher's side"),
    ({"server_secret": "SERVER", "allow": "EMPTY"}, "holds no client certificate"),
    ({"server_secret": "SERVER", "allow": "nowhere"}, "no directory"),
    ({"server_secret": "SERVER", "server_public": "x"}, "server_public= is the subscriber's"),
    ({"server_secret": "GARBAGE"}, "cannot read certificate"),
])
def test_bad_security_configurations_are_refused(keys, tmp_path, kwargs, match):
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.key_secret").write_text("not a certificate\n")
    real = {"PUBLIC": keys.dir / "alice.key", "ALICE": keys.path("alice"),
            "SERVER": keys.path("server"), "EMPTY": tmp_path / "empty",
            "GARBAGE": tmp_path / "garbage.key_secret"}
    kwargs = {k: real.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        Security.curve(**kwargs)


def test_wrong_roles_are_refused(keys):
    from epochstream import Publisher, Subscriber

    with pytest.raises(ValueError, match="server_secret"):
        Publisher("t", security=Security.curve(client_secret=keys.path("alice")))
    with pytest.raises(TypeError, match="Security"):
        Publisher("t", security="curve")
    with pytest.raises(ValueError, match="client_secret"):
        Subscriber("t", endpoints=["tcp://127.0.0.1:1"],
                   security=Security.curve(server_secret=keys.path("server")))


def test_grant_matches():
    gs = [Grant("K1", "flights.*", "subscribe"), Grant("alice", "weather", "admin"),
          Grant("*", "public.[ab]?", "subscribe"), Grant("K2", "x", "publish")]
    assert grant_matches(gs, "K1", "flights.daily", "subscribe")
    assert not grant_matches(gs, "K1", "Flights.daily", "subscribe")  # case-sensitive
    assert not grant_matches(gs, "K1", "flights.daily", "publish")
    assert grant_matches(gs, ("K9", "alice"), "weather", "subscribe")  # admin implies it
    assert grant_matches(gs, ("K9", "alice"), "weather", "publish")
    assert grant_matches(gs, "anyone", "public.a1", "subscribe")
    assert not grant_matches(gs, "anyone", "public.c1", "subscribe")
    assert not grant_matches(gs, "K2", "x", "subscribe")
    assert not grant_matches(gs, (), "public.a1", "subscribe")
    assert not grant_matches([], "K1", "flights.daily", "subscribe")
    with pytest.raises(ValueError, match="op must be one of"):
        grant_matches(gs, "K1", "flights", "read")
    with pytest.raises(ValueError, match="principal"):
        check_grant("a b", "t", "subscribe")
    with pytest.raises(ValueError, match="pattern"):
        check_grant("a", "", "subscribe")
    assert is_z85_key(zmq.curve_keypair()[0]) and not is_z85_key("~" * 40)


# ---- the catalog -------------------------------------------------------------------------------


@pytest.fixture(params=["embedded", "remote"])
def cat(request, tmp_path):
    """The same file, opened directly or through a catalog server."""
    if request.param == "embedded":
        yield Catalog(tmp_path / "cat.sqlite")
        return
    with CatalogServer(tmp_path / "cat.sqlite", "tcp://127.0.0.1:*") as srv:
        remote = Catalog(srv.endpoint)
        assert isinstance(remote, RemoteCatalog)
        yield remote
        remote.close()


def test_catalog_grants_and_server_keys(cat):
    key = zmq.curve_keypair()[0].decode()
    assert cat.grants() == []
    assert cat.grant(key, "flights.*", "subscribe") == Grant(key, "flights.*", "subscribe")
    cat.grant(key, "flights.*", "subscribe")  # idempotent
    cat.grant("alice", "*", "admin")
    cat.grant("*", "public", "subscribe")
    assert cat.grants() == sorted([Grant(key, "flights.*", "subscribe"),
                                   Grant("alice", "*", "admin"),
                                   Grant("*", "public", "subscribe")],
                                  key=lambda g: (g.principal, g.pattern, g.op))
    assert sorted(cat.grants("flights.daily"), key=lambda g: g.op) == \
        [Grant("alice", "*", "admin"), Grant(key, "flights.*", "subscribe")]
    assert cat.grants(principal="alice") == [Grant("alice", "*", "admin")]
    for bad in [("", "t", "subscribe"), ("a", "t", "read"), ("a", 3, "subscribe")]:
        with pytest.raises(CatalogError, match="grant's"):
            cat.grant(*bad)
    assert cat.revoke("alice", "other") == 0
    assert cat.revoke(key, op="publish") == 0
    assert cat.revoke(key, "flights.*", "subscribe") == 1
    assert cat.revoke("*") == 1
    assert cat.grants() == [Grant("alice", "*", "admin")]
    # the partition's CURVE key is recorded with its registration
    cat.create_topic("t", partitions=2)
    cat.register_partition("t", 0, "tcp://h:1", server_key=key)
    cat.register_partition("t", 1, "tcp://h:2")
    assert [p.server_key for p in cat.lookup("t").partition_info] == [key, None]
    with pytest.raises(CatalogError, match="server key must be"):
        cat.register_partition("t", 1, "tcp://h:2", server_key="not a key")


def test_a_version_4_catalog_is_migrated_to_the_current_version(tmp_path):
    path = tmp_path / "v4.sqlite"
    Catalog(path).create_topic("t")
    Catalog(path).register_partition("t", 0, "tcp://h:1", incarnation="i0", upper=[3])
    conn = sqlite3.connect(path, isolation_level=None)  # back to version 4, as it was written
    conn.execute("DROP TABLE grants")
    conn.execute("ALTER TABLE partitions DROP COLUMN server_key")
    conn.execute("ALTER TABLE partitions DROP COLUMN generation")
    conn.execute("ALTER TABLE partitions DROP COLUMN run")
    for column in ("acked_total", "dead_total", "redelivered_total", "settled_at"):
        conn.execute(f"ALTER TABLE groups DROP COLUMN {column}")
    conn.execute("ALTER TABLE group_epochs DROP COLUMN settled_at")
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    cat = Catalog(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"retention_leases", "retention_limits"} <= tables  # version 10
        columns = {r[1] for r in conn.execute("PRAGMA table_info(partitions)")}
        assert {"server_key", "generation", "run"} <= columns
        columns = {r[1] for r in conn.execute("PRAGMA table_info(groups)")}
        assert {"acked_total", "dead_total", "redelivered_total", "settled_at"} <= columns
    finally:
        conn.close()
    p = cat.lookup("t").partition_info[0]
    assert (p.endpoint, p.incarnation, p.upper, p.server_key, p.generation) == (
        "tcp://h:1", "i0", (3,), None, 0)  # a row from before generations: 0
    cat.grant("alice", "t", "subscribe")
    assert cat.grants("t") == [Grant("alice", "t", "subscribe")]
    assert Catalog(path).grants() == [Grant("alice", "t", "subscribe")]  # opening again


# ---- the command line ---------------------------------------------------------------------------


def test_keys_generate_writes_loadable_certificates(tmp_path):
    runner = CliRunner(env=CLI_ENV)
    result = runner.invoke(app, ["keys", "generate", str(tmp_path / "k"), "alice"])
    assert result.exit_code == 0, result.output
    public, secret = zmq.auth.load_certificate(tmp_path / "k" / "alice.key_secret")
    assert result.stdout.strip() == public.decode() and secret is not None
    assert zmq.auth.load_certificate(tmp_path / "k" / "alice.key") == (public, None)
    assert os.stat(tmp_path / "k" / "alice.key_secret").st_mode & 0o077 == 0
    assert load_allowed(tmp_path / "k") == {public.decode(): "alice"}
    assert Security.curve(client_secret=tmp_path / "k" / "alice.key_secret").client_public == \
        public.decode()
    again = runner.invoke(app, ["keys", "generate", str(tmp_path / "k"), "alice"])
    assert again.exit_code == 1 and "exists already" in again.output
    assert zmq.auth.load_certificate(tmp_path / "k" / "alice.key")[0] == public  # untouched
    bad = runner.invoke(app, ["keys", "generate", str(tmp_path / "k"), "../x"])
    assert bad.exit_code == 2
    env = CliRunner(env={**CLI_ENV, ENV_KEYS: str(tmp_path / "env")})
    assert env.invoke(app, ["keys", "generate", "bob"]).exit_code == 0
    assert (tmp_path / "env" / "bob.key_secret").is_file()


def test_grant_commands(tmp_path, keys):
    runner = CliRunner(env=CLI_ENV)
    c = ["--catalog", str(tmp_path / "cat")]
    assert runner.invoke(app, ["grant", "ls", *c]).exit_code == 2  # no catalog: not created
    r = runner.invoke(app, ["grant", "add", str(keys.dir / "alice.key"), "flights.*", *c])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["grant", "add", "ops", "*", "--op", "admin", *c]).exit_code == 0
    assert runner.invoke(app, ["grant", "add", "x", "t", "--op", "read", *c]).exit_code == 2
    r = runner.invoke(app, ["grant", "ls", "flights.daily", "--json", *c])
    assert r.exit_code == 0, r.output
    rows = sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda r: r["op"])
    assert rows == [{"principal": "ops", "pattern": "*", "op": "admin"},
                    {"principal": keys.public["alice"].decode(), "pattern": "flights.*",
                     "op": "subscribe"}]
    r = runner.invoke(app, ["grant", "ls", *c])
    assert "flights.*" in r.stdout and "admin" in r.stdout
    r = runner.invoke(app, ["grant", "revoke", str(keys.dir / "alice.key"), *c])
    assert r.exit_code == 0 and "revoked 1 grant" in r.stdout
    assert Catalog(tmp_path / "cat").grants() == [Grant("ops", "*", "admin")]


@pytest.mark.parametrize("command", [["keys"], ["grant"], ["keys", "generate"],
                                     ["grant", "add"], ["grant", "ls"], ["grant", "revoke"]])
def test_security_help_renders(command):
    result = CliRunner(env={**CLI_ENV, "COLUMNS": "80"}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output


def test_security_doc_examples_use_existing_names():
    """docs/security.md names only things that exist."""
    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for name in ("Security.curve", "keys generate", "grant add", "grant ls", "grant revoke",
                 "server_public", "allow=", "EPOCHSTREAM_KEYS", "NotAuthorized"):
        assert name in doc, name


def test_relay_command_key_options_are_checked(tmp_path):
    """``epochstream relay`` takes --client-key / --server-key / --allow; bad ones are usage
    errors (status 2) before anything connects."""
    from typer.testing import CliRunner

    from epochstream import Catalog
    from epochstream.cli import app

    cat = tmp_path / "cat"
    Catalog(cat).create_topic("t")
    run = lambda *a: CliRunner().invoke(app, ["relay", "t", "--catalog", str(cat), *a])  # noqa: E731
    r = run("--allow", str(tmp_path))
    assert r.exit_code == 2 and "--allow needs --server-key" in r.output
    r = run("--client-key", str(tmp_path / "missing.key_secret"))
    assert r.exit_code == 2 and "missing" in r.output
