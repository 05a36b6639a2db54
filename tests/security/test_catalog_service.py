"""The network catalog over CURVE (``CatalogServer(security=...)``, ``epochstream catalog
serve --key --allow``): only allowed keys get an answer at all; changing grants needs an
``admin`` grant of the requesting key (the first made on the catalog file)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from epochstream import Catalog, CatalogUnavailable, NotAuthorized, Security
from epochstream.catalog.client import RemoteCatalog
from epochstream.catalog.server import CatalogServer
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


def test_a_catalog_url_carries_the_key_names(tmp_path, keys, monkeypatch):
    """``tcp://HOST:PORT?client_key=K&server_key=K``: what a place that takes only a URL
    (``--catalog``, ``$EPOCHSTREAM_CATALOG``, a Spark option) needs for a secured service. The
    keys are paths or names in ``$EPOCHSTREAM_KEYS``; the client's ``path`` passes the names on
    (never a secret); a key outside allow/ times out, half a pair or an unknown key file is a
    CatalogError naming the URL."""
    from epochstream.errors import CatalogError

    db = tmp_path / "db"
    Catalog(db).grant(keys.public["alice"].decode(), "u.*", "publish")  # to create u.t
    sec = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    with CatalogServer(db, "tcp://127.0.0.1:*", security=sec) as srv:
        url = srv.endpoint
        by_path = Catalog(f"{url}?client_key={keys.path('alice')}"
                          f"&server_key={keys.dir / 'server.key'}&timeout=5")
        by_path.create_topic("u.t")
        monkeypatch.setenv("EPOCHSTREAM_KEYS", str(keys.dir))
        by_name = Catalog(f"{url}?client_key=bob&server_key=server")
        assert by_name.lookup("u.t").name == "u.t"
        again = Catalog(str(by_name.path))  # passed on: the names travel, and still work
        assert "client_key=bob" in str(by_name.path) and again.lookup("u.t").name == "u.t"
        assert "timeout" not in str(by_path.path)
        with pytest.raises(CatalogUnavailable):  # a key outside allow/
            Catalog(f"{url}?client_key=mallory&server_key=server&timeout=1")
        with pytest.raises(CatalogError, match="together"):
            Catalog(f"{url}?client_key=alice")
        with pytest.raises(CatalogError, match="nobody"):
            Catalog(f"{url}?client_key=nobody&server_key=server")
        with pytest.raises(CatalogError, match="empty"):
            Catalog(f"{url}?client_key=&server_key=server")
        for c in (by_path, by_name, again):
            c.close()
