"""A secured network catalog (``CatalogServer(security=...)``, ``catalog serve --key --allow``)
registers a publisher's partition only for a key holding a ``publish`` (or ``admin``) grant for
the topic (docs/security.md): a ``Publisher`` or a ``SparkPublisherHost`` whose catalog client
key holds none fails with ``NotAuthorized`` and nothing of it is registered. Every other
operation that changes a topic's state needs its grant too (``catalog_server.TOPIC_GRANTS``):
a key without it is refused and nothing changes."""

from __future__ import annotations

import pytest

from epochstream import Catalog, NotAuthorized, Publisher, Security
from epochstream.catalog.client import RemoteCatalog
from epochstream.catalog.server import CatalogServer

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
    with pytest.raises(NotAuthorized, match="publish grant"):  # a subscriber creates no topic
        bob.create_topic(TOPIC, partitions=3)
    alice.create_topic(TOPIC, partitions=3)
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
    from epochstream.spark import SparkPublisherHost

    cat, connect = service
    with pytest.raises(NotAuthorized, match="not authorised to publish"):
        Publisher("sec.p", catalog=connect("bob"), heartbeat_interval=0.2)
    assert "sec.p" not in [t.name for t in cat.topics()]  # not even created
    pub = Publisher("sec.p", catalog=connect("alice"), heartbeat_interval=0.2)
    try:
        assert [p.state for p in cat.lookup("sec.p").partition_info] == ["live"]
    finally:
        pub.close(linger=0.2)

    server = Security.curve(server_secret=keys.path("server"), allow=keys.allow)
    refused = SparkPublisherHost("sec.h2", partitions=1, catalog=connect("bob"), security=server)
    with pytest.raises(NotAuthorized, match="not authorised to publish to topic 'sec.h2'"):
        refused.start()  # creating the topic needs the grant
    assert "sec.h2" not in [t.name for t in cat.topics()] and refused._closed
    cat.create_topic("sec.h", order="total", codec="arrow", partitions=1)  # made by an admin
    refused = SparkPublisherHost("sec.h", partitions=1, catalog=connect("bob"), security=server)
    with pytest.raises(NotAuthorized, match="not authorised to publish to topic 'sec.h'"):
        refused.start()
    assert cat.lookup("sec.h").partition_info == () and refused._closed
    with SparkPublisherHost("sec.h", partitions=1, catalog=connect("alice"), security=server,
                            publisher_kwargs={"heartbeat_interval": 0.2}) as host:
        (part,) = cat.lookup("sec.h").partition_info
        assert part.ingest == host.ingest_endpoints[0]
        assert part.server_key == keys.public["server"].decode()


def test_every_catalog_operation_is_classified():
    """A new catalog operation cannot cross the network unchecked by mistake: each one is a
    read, a grant change, or has its grant in TOPIC_GRANTS."""
    from epochstream.catalog import rpc as catalog_rpc, server as catalog_server

    ops = set(catalog_rpc.OPS)
    assert ops == set(catalog_server.TOPIC_GRANTS) | catalog_server.READ_OPS | {"grant", "revoke"}
    assert not set(catalog_server.TOPIC_GRANTS) & catalog_server.READ_OPS


# arguments that get past each operation's own checks far enough to change something if the
# grant check let them through (the topic exists; names and holders are made up)
_ARGS = {
    "create_topic": ((), {}),
    "register_partition": ((0, "tcp://127.0.0.1:9"), {}),
    "close_partition": ((0, "inc"), {}),
    "record_upper": ((0, "inc", [5]), {}),
    "heartbeat": ((0, "inc"), {}),
    "history_begin": ((0, "/tmp/nowhere", [0], []), {}),
    "history_commit": ((0,), dict(epochs=[], lower=[1], upper=[], segment=0, committed=0)),
    "history_trim": ((0, 1), {}),
    "history_uploaded": ((0, 0, "x.eslog", 1), {}),
    "retention_acquire": ((0, "h"), dict(lease=30.0)),
    "retention_release": ((0, "h"), {}),
    "retention_record": (({"max_epochs": 3},), {}),
    "durable_claim": (("d", "h"), {}),
    "durable_ack": (("d", "h", [3]), {}),
    "durable_release": (("d", "h"), {}),
    "durable_renew": (("d", "h"), {}),
    "durable_reset": (("d", [0]), {}),
    "group_open": (("g",), dict(mode="shared", ack_wait=5.0, max_deliver=3, dead_letter=None)),
    "group_settle": (("g", [0, 0], 1), dict(outcome="ack")),
    "group_stop": (("g", "stopped by a test"), {}),
    "group_reset": (("g",), {}),
    "group_claim_read": (("g",), {}),
    "group_claim_apply": (("g", "w", [], [], [], "fp"), {}),
    "drop_topic": ((), {}),
    "durable_drop": (("d",), {}),
    "group_drop": (("g",), {}),
}


@pytest.mark.parametrize("op", sorted(_ARGS))
def test_each_topic_operation_needs_its_grant(service, keys, op):
    """Per operation: keys whose grants fall short (none, or another op) get NotAuthorized
    naming the grant needed, and the topic's state is unchanged; an admin of the topic is let
    through (what the operation then says is its own business)."""
    from epochstream.catalog.server import TOPIC_GRANTS

    cat, connect = service
    need = TOPIC_GRANTS[op]
    topic = "sec.ops" if op != "create_topic" else "sec.new"
    cat.create_topic("sec.ops", partitions=1)
    cat.durable_claim("sec.ops", "d", "h")
    cat.group_open("sec.ops", "g", mode="shared", ack_wait=5.0, max_deliver=3, dead_letter=None)
    cat.grant(keys.public["dave"].decode(), "other.*", "admin")  # an admin elsewhere only
    before = (cat.topics(), cat.lookup("sec.ops"), cat.durables("sec.ops"), cat.groups("sec.ops"))
    args, kwargs = _ARGS[op]
    short = {"publish": ["bob", "dave"], "subscribe": ["alice", "dave"],
             "admin": ["alice", "bob", "dave"]}[need]
    for name in short:
        with pytest.raises(NotAuthorized, match=f"{need} grant") as e:
            connect(name)._call(op, topic, *args, **kwargs)
        assert e.value.topic == topic
        assert (cat.topics(), cat.lookup("sec.ops"), cat.durables("sec.ops"),
                cat.groups("sec.ops")) == before, f"{op} by {name} changed the catalog"
    try:
        connect("carol")._call(op, topic, *args, **kwargs)
    except NotAuthorized:
        pytest.fail(f"{op}: an admin of the topic was refused")
    except Exception:  # noqa: BLE001 - the made-up arguments may be wrong for the op itself
        pass
