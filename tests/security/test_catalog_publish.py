"""A secured network catalog (``CatalogServer(security=...)``, ``catalog serve --key --allow``)
registers a publisher's partition only for a key holding a ``publish`` (or ``admin``) grant for
the topic (docs/security.md): a ``Publisher`` or a ``SparkPublisherHost`` whose catalog client
key holds none fails with ``NotAuthorized`` and nothing of it is registered."""

from __future__ import annotations

import pytest

from epochstream import Catalog, NotAuthorized, Publisher, Security
from epochstream.catalog_client import RemoteCatalog
from epochstream.catalog_server import CatalogServer

TOPIC = "sec.pub"


def _client(url: str, keys, name: str) -> RemoteCatalog:
    return RemoteCatalog(f"{url}?timeout=5", security=Security.curve(
        client_secret=keys.path(name), server_public=keys.public["server"].decode()))


@pytest.fixture
def service(tmp_path, keys):
    """A secured catalog service: ``alice`` may publish to ``sec.*`` (by certificate name),
    ``carol`` is an admin of ``sec.*``, ``bob`` may only subscribe."""
    db = tmp_path / "db"
    cat = Catalog(db)
    cat.grant("alice", "sec.*", "publish")
    cat.grant(keys.public["carol"].decode(), "sec.*", "admin")
    cat.grant(keys.public["bob"].decode(), "sec.*", "subscribe")
    sec = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    with CatalogServer(db, "tcp://127.0.0.1:*", security=sec) as srv:
        clients: list[RemoteCatalog] = []

        def connect(name: str) -> RemoteCatalog:
            c = _client(srv.endpoint, keys, name)
            clients.append(c)
            return c

        yield cat, connect
        for c in clients:
            c.close()


def test_register_partition_needs_a_publish_grant(service, keys):
    cat, connect = service
    bob, alice, carol = connect("bob"), connect("alice"), connect("carol")
    bob.create_topic(TOPIC, partitions=3)
    with pytest.raises(NotAuthorized, match=f"not authorised to publish to topic '{TOPIC}'") as e:
        bob.register_partition(TOPIC, 0, "tcp://127.0.0.1:1")
    assert e.value.topic == TOPIC and e.value.principal == keys.public["bob"].decode()
    with pytest.raises(NotAuthorized, match="publish grant"):  # keyword form, same check
        bob.register_partition(topic=TOPIC, partition=0, endpoint="tcp://127.0.0.1:1")
    assert cat.lookup(TOPIC).partition_info == (), "nothing of bob's was registered"
    alice.register_partition(TOPIC, 0, "tcp://127.0.0.1:1")       # publish, by cert name
    carol.register_partition(TOPIC, 1, "tcp://127.0.0.1:2")       # admin implies publish
    with pytest.raises(NotAuthorized):
        alice.register_partition("other", 0, "tcp://127.0.0.1:3")  # outside her pattern
    assert sorted(p.index for p in cat.lookup(TOPIC).partition_info) == [0, 1]
    assert bob.lookup(TOPIC).partitions == 3  # reads stay open to every allowed key


def test_a_publisher_and_a_spark_host_need_the_grant_of_their_catalog_key(service, keys):
    pytest.importorskip("pyspark")
    from epochstream.spark import IngestError, SparkPublisherHost

    cat, connect = service
    with pytest.raises(NotAuthorized, match="not authorised to publish"):
        Publisher("sec.p", catalog=connect("bob"), heartbeat_interval=0.2)
    assert cat.lookup("sec.p").partition_info == ()
    pub = Publisher("sec.p", catalog=connect("alice"), heartbeat_interval=0.2)
    try:
        assert [p.state for p in cat.lookup("sec.p").partition_info] == ["live"]
    finally:
        pub.close(linger=0.2)

    server = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    host = SparkPublisherHost("sec.h", partitions=1, catalog=connect("bob"), security=server)
    with pytest.raises(IngestError, match="not authorised to publish to topic 'sec.h'"):
        host.start()
    assert cat.lookup("sec.h").partition_info == ()
    with SparkPublisherHost("sec.h", partitions=1, catalog=connect("alice"), security=server,
                            publisher_kwargs={"heartbeat_interval": 0.2}) as host:
        (part,) = cat.lookup("sec.h").partition_info
        assert part.ingest == host.ingest_endpoints[0]
        assert part.server_key == keys.public["server"].decode()
