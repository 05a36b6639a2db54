"""The network catalog over CURVE (``CatalogServer(security=...)``, ``epochstream catalog
serve --key --allow``): only allowed keys get an answer at all; changing grants needs an
``admin`` grant of the requesting key (the first made on the catalog file)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from epochstream import Catalog, CatalogUnavailable, NotAuthorized, Security
from epochstream.catalog_client import RemoteCatalog
from epochstream.catalog_server import CatalogServer
from epochstream.cli import app


def _client(url: str, keys, name: str, server: str = "server", timeout: float = 1.0):
    return RemoteCatalog(f"{url}?timeout={timeout}", security=Security.curve(
        client_secret=keys.path(name), server_public=keys.public[server].decode()))


def test_only_allowed_keys_are_answered_and_grants_need_admin(tmp_path, keys):
    db = tmp_path / "db"
    Catalog(db).grant(keys.public["alice"].decode(), "sec.*", "admin")  # bootstrap: the file
    sec = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    with CatalogServer(db, "tcp://127.0.0.1:*", security=sec) as srv:
        url = srv.endpoint
        with pytest.raises(CatalogUnavailable):              # plain TCP: no handshake
            Catalog(f"{url}?timeout=1")
        with pytest.raises(CatalogUnavailable):              # a key outside allow/
            _client(url, keys, "mallory")
        with pytest.raises(CatalogUnavailable):              # the wrong server key
            _client(url, keys, "alice", server="bob")
        alice = _client(url, keys, "alice", timeout=5)
        alice.create_topic("sec.t")
        bob_key = keys.public["bob"].decode()
        alice.grant(bob_key, "sec.t", "subscribe")           # admin for sec.*
        with pytest.raises(NotAuthorized, match="admin grant"):
            alice.grant(bob_key, "other", "subscribe")       # outside its admin pattern
        bob = _client(url, keys, "bob", timeout=5)
        assert bob.lookup("sec.t").name == "sec.t"           # allowed: reads and writes data
        with pytest.raises(NotAuthorized, match="admin grant"):
            bob.grant(bob_key, "sec.*", "admin")             # but cannot grant itself
        with pytest.raises(NotAuthorized):
            bob.revoke(keys.public["alice"].decode())
        assert [g.op for g in Catalog(db).grants("sec.t") if g.principal == bob_key] == \
            ["subscribe"]
        alice.close()
        bob.close()
    assert srv.stats["requests"] >= 4


def test_the_client_needs_the_service_key(tmp_path, keys):
    with pytest.raises(Exception, match="server_public"):
        RemoteCatalog("tcp://127.0.0.1:1", security=Security.curve(
            client_secret=keys.path("alice")))


def test_serve_allow_without_key_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(app, ["catalog", "serve", "--db", str(tmp_path / "db"),
                                 "--allow", str(tmp_path)])
    assert r.exit_code == 2 and "--allow needs --key" in r.output
