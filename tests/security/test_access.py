"""CURVE and per-topic grants over real sockets on 127.0.0.1 (docs/security.md): who gets the
stream, checked at the socket level with hand-driven DEALERs — an unauthenticated (plain)
client, a client with the wrong server key, a key not in the ``allow`` directory, a valid key
without a grant, a revoked key — none receives a single ``S``, ``D`` or ``R`` frame, while a
granted client on the same publisher receives whole epochs."""

from __future__ import annotations

import os
import socket
import time

import msgpack
import pytest
import zmq

import epochstream.security.authorizer as security  # where GRANTS_REFRESH_S is read
from epochstream import (Catalog, NotAuthorized, PublisherLost, Retention, Security, Subscriber,
                         wire)
from epochstream.catalog.server import CatalogServer

STREAM = (wire.SNAPSHOT[:1], wire.DATA[:1], wire.HISTORY[:1])
TOPIC = "sec.flights"


def _publish(pub, epochs: range, per_epoch: int = 3) -> None:
    for t in epochs:
        for i in range(per_epoch):
            pub.send(t, [{"t": t, "i": i}])
        pub.advance_to(t + 1)


def _whole(epochs, per_epoch: int = 3) -> None:
    for e in epochs:
        assert sorted(r["i"] for r in e.records) == list(range(per_epoch)), e
        assert {r["t"] for r in e.records} == {e.time}


def _records(messages) -> int:
    """Records in the ``D`` frames of ``messages`` (the publisher may coalesce sends)."""
    return sum(len(msgpack.unpackb(m[2])) for m in messages if m[0] == wire.DATA)


def _refused(messages) -> bool:
    """Whether ``messages`` hold an ``X error`` with reason ``not_authorised``."""
    notices = [wire.decode(m) for m in messages if m[0] == wire.NOTICE]
    return any(n.code == "error" and n.extra.get("reason") == security.NOT_AUTHORISED
               for n in notices)


def test_only_granted_clients_receive_anything(tmp_path, keys, publishers, raw):
    cat = Catalog(tmp_path / "cat")
    cat.grant(keys.public["alice"].decode(), "sec.*", "subscribe")
    cat.grant("dave", TOPIC, "subscribe")                 # by certificate name in allow/
    cat.grant(keys.public["bob"].decode(), "other.*", "subscribe")  # another topic only
    cat.grant(keys.public["carol"].decode(), "sec.*", "subscribe")
    assert cat.revoke(keys.public["carol"].decode()) == 1
    cat.grant(keys.public["mallory"].decode(), "*", "admin")  # granted, but not in allow/
    pub = publishers(TOPIC, catalog=cat, retention=Retention(dir=tmp_path / "logs"),
                     security=Security.curve(server_secret=keys.path("server"),
                                             allow=keys.allow))
    assert cat.lookup(TOPIC).partition_info[0].server_key == pub.server_key == \
        keys.public["server"].decode()
    ep, skey = pub.endpoint, keys.public["server"]
    pair = lambda n: (keys.public[n], keys.secret[n])  # noqa: E731

    plain = raw(ep, TOPIC)
    wrong_server = raw(ep, TOPIC, keypair=pair("alice"), server_key=keys.public["bob"])
    unknown_key = raw(ep, TOPIC, keypair=pair("mallory"), server_key=skey)
    no_grant = raw(ep, TOPIC, keypair=pair("bob"), server_key=skey)
    revoked = raw(ep, TOPIC, keypair=pair("carol"), server_key=skey)
    granted = raw(ep, TOPIC, keypair=pair("alice"), server_key=skey)
    alice = Subscriber(TOPIC, cat, security=Security.curve(client_secret=keys.path("alice")),
                       timeout=5)
    dave = Subscriber(TOPIC, cat, security=Security.curve(client_secret=keys.path("dave")),
                      timeout=5)
    assert alice.wait_ready(5) and dave.wait_ready(5)
    granted.read(5, until=lambda m: any(x[0] == wire.SNAPSHOT for x in m))
    for p in (no_grant, revoked):
        p.read(5, until=lambda m: bool(m))
    _publish(pub, range(4))
    assert pub.flush(5)
    for p in (no_grant, revoked, granted, plain, unknown_key):  # history reads: refused too
        p.send(wire.READ, topic=TOPIC, partition=0, req=1, time=1, received=0)
    got = [e for _, e in zip(range(4), alice.epochs(timeout=5))]
    assert [e.time for e in got] == [0, 1, 2, 3]
    _whole(got)
    _whole([e for _, e in zip(range(4), dave.epochs(timeout=5))])
    granted.read(3, until=lambda m: any(x[0] == wire.HISTORY for x in m) and _records(m) == 12)
    for p in (plain, wrong_server, unknown_key, no_grant, revoked):
        p.read(0.3)
    # the granted raw client: S, every D, its history read answered
    assert granted.kinds()[0] == b"S" and _records(granted.messages) == 12
    assert b"R" in granted.kinds()
    # nobody else: not one frame of the stream
    for p in (plain, wrong_server, unknown_key, no_grant, revoked):
        assert not set(p.kinds()) & set(STREAM), p.kinds()
    # handshake failures hear nothing at all; valid keys without a grant hear why, twice
    # (the hello and the history read), with the topic and their principal
    assert plain.messages == wrong_server.messages == unknown_key.messages == []
    for p, who in ((no_grant, "bob"), (revoked, "carol")):
        assert p.kinds() == [b"X", b"X"] and _refused(p.messages), p.notices()
        n = p.notices()[0]
        assert f"not authorised for topic {TOPIC!r}" in n.message
        assert n.extra["principal"] == keys.public[who].decode()
    assert pub.subscribers == 3
    alice.close()
    dave.close()


def test_a_revoked_grant_drops_a_registered_subscriber(tmp_path, keys, publishers, raw,
                                                         monkeypatch):
    monkeypatch.setattr(security, "GRANTS_REFRESH_S", 0.1)
    cat = Catalog(tmp_path / "cat")
    cat.grant("dave", "sec.*", "subscribe")
    cat.grant("alice", "sec.*", "subscribe")
    pub = publishers(TOPIC, catalog=cat, security=Security.curve(
        server_secret=keys.path("server"), allow=keys.allow))
    peer = raw(pub.endpoint, TOPIC, keypair=(keys.public["dave"], keys.secret["dave"]),
               server_key=keys.public["server"])
    sub = Subscriber(TOPIC, cat, security=Security.curve(client_secret=keys.path("alice")),
                     timeout=5)
    assert sub.wait_ready(5)
    peer.read(5, until=lambda m: bool(m))
    _publish(pub, range(2))
    peer.read(3, until=lambda m: _records(m) == 6 and m[-1][0] == wire.FRONTIER)
    assert peer.kinds()[0] == b"S" and _records(peer.messages) == 6
    it = sub.epochs(timeout=5)
    assert [next(it).time for _ in range(2)] == [0, 1]
    cat.revoke("dave")
    cat.revoke("alice", "sec.*", "subscribe")
    peer.read(3, until=_refused)
    assert _refused(peer.messages)
    with pytest.raises(NotAuthorized, match="not authorised for topic") as info:
        next(it)
    assert info.value.partition == 0 and info.value.topic == TOPIC
    seen = len(peer.messages)
    _publish(pub, range(2, 5))  # after the refusal: nothing more reaches it
    assert pub.flush(5)
    peer.read(0.5)
    assert [m[0][:1] for m in peer.messages[seen:]] == []
    assert pub.subscribers == 0
    sub.close()


def test_subscriber_errors_are_clear_and_bounded(tmp_path, keys, publishers):
    cat = Catalog(tmp_path / "cat")
    cat.grant("alice", "*", "subscribe")
    pub = publishers(TOPIC, catalog=cat, security=Security.curve(
        server_secret=keys.path("server"), allow=keys.allow))
    plain_pub = publishers("plain.topic", catalog=cat)
    # no grant: NotAuthorized from wait_ready, and from the iterators
    for read in (lambda s: s.wait_ready(5), lambda s: next(s.epochs(timeout=5))):
        sub = Subscriber(TOPIC, cat, security=Security.curve(client_secret=keys.path("bob")))
        with pytest.raises(NotAuthorized, match=r"principal .* holds no subscribe grant"):
            read(sub)
        sub.close()
    # the two sides do not match: refused before connecting
    with pytest.raises(NotAuthorized, match="requires CURVE"):
        Subscriber(TOPIC, cat)
    with pytest.raises(NotAuthorized, match="records no CURVE key"):
        Subscriber("plain.topic", cat, security=Security.curve(client_secret=keys.path("alice")))
    # a wrong server key never completes the handshake: PublisherLost after the timeout
    t0 = time.monotonic()
    wrong = Subscriber(TOPIC, cat, timeout=1.0, ping_interval=0.2, security=Security.curve(
        client_secret=keys.path("alice"), server_public=keys.path("bob").with_suffix(".key")))
    with pytest.raises(PublisherLost, match="no message from partition 0"):
        wrong.wait_ready(5)
    assert 0.9 < time.monotonic() - t0 < 4
    wrong.close()
    # static endpoints need the key given
    with pytest.raises(ValueError, match="server_public"):
        Subscriber(TOPIC, endpoints=[pub.endpoint],
                   security=Security.curve(client_secret=keys.path("alice")))
    ok = Subscriber(TOPIC, endpoints=[pub.endpoint], timeout=5, security=Security.curve(
        client_secret=keys.path("alice"), server_public=pub.server_key))
    assert ok.wait_ready(5)
    ok.close()
    assert plain_pub.server_key is None


def test_without_a_catalog_the_allow_directory_is_the_only_check(keys, publishers, raw):
    pub = publishers(TOPIC, security=Security.curve(server_secret=keys.path("server"),
                                                    allow=keys.allow))
    skey = keys.public["server"]
    bob = raw(pub.endpoint, TOPIC, keypair=(keys.public["bob"], keys.secret["bob"]),
              server_key=skey)
    mallory = raw(pub.endpoint, TOPIC, keypair=(keys.public["mallory"], keys.secret["mallory"]),
                  server_key=skey)
    bob.read(5, until=lambda m: bool(m))
    _publish(pub, range(2))
    bob.read(3, until=lambda m: _records(m) == 6)
    mallory.read(0.3)
    assert _records(bob.messages) == 6 and mallory.messages == []
    # a certificate added to allow/ takes effect at the next handshake
    (keys.allow / "mallory.key").write_bytes((keys.dir / "mallory.key").read_bytes())
    os.utime(keys.allow, ns=(time.time_ns(), time.time_ns() + 10**9))
    late = raw(pub.endpoint, TOPIC, keypair=(keys.public["mallory"], keys.secret["mallory"]),
               server_key=skey)
    late.read(5, until=lambda m: bool(m))
    assert late.kinds() == [b"S"]


def test_allow_any_and_an_allow_directory_in_one_process(keys, publishers, raw):
    """pyzmq's CURVE_ALLOW_ANY is one flag per authenticator: each publisher's rule must stay
    its own (a ZAP domain each)."""
    strict = publishers("strict", security=Security.curve(server_secret=keys.path("server"),
                                                          allow=keys.allow))
    anyone = publishers("anyone", security=Security.curve(server_secret=keys.path("server")))
    stranger = zmq.curve_keypair()
    a = raw(anyone.endpoint, "anyone", keypair=stranger, server_key=keys.public["server"])
    s = raw(strict.endpoint, "strict", keypair=stranger, server_key=keys.public["server"])
    a.read(5, until=lambda m: bool(m))
    s.read(0.5)
    assert a.kinds() == [b"S"] and s.messages == []


def test_garbage_and_oversized_clients_do_not_stop_the_publisher(tmp_path, keys, publishers,
                                                                 raw):
    cat = Catalog(tmp_path / "cat")
    cat.grant("alice", TOPIC, "subscribe")
    pub = publishers(TOPIC, catalog=cat, security=Security.curve(
        server_secret=keys.path("server"), allow=keys.allow))
    host, port = pub.endpoint.rsplit("/", 1)[1].rsplit(":", 1)
    junk = []
    for payload in (os.urandom(4096),
                    # a ZMTP 3 greeting announcing CURVE, then a HELLO command far too long
                    b"\xff" + b"\0" * 8 + b"\x7f\x03\x00CURVE" + b"\0" * 15 + b"\0" * 32
                    + b"\x06" + (1 << 40).to_bytes(8, "big") + os.urandom(65536),
                    b"\xff" + b"\0" * 8 + b"\x7f" + os.urandom(1 << 20)):
        s = socket.create_connection((host, int(port)), timeout=2.0)
        try:
            s.sendall(payload)
        except OSError:
            pass  # the publisher may already have closed it
        junk.append(s)
    strangers = [raw(pub.endpoint, TOPIC, keypair=zmq.curve_keypair(),
                     server_key=keys.public["server"]) for _ in range(20)]
    sub = Subscriber(TOPIC, cat, timeout=5,
                     security=Security.curve(client_secret=keys.path("alice")))
    assert sub.wait_ready(5)
    _publish(pub, range(3))
    got = [e for _, e in zip(range(3), sub.epochs(timeout=5))]
    _whole(got)
    for s in strangers:
        s.read(0.02)
        assert s.messages == []
    for s in junk:
        s.close()
    sub.close()


def test_grants_through_the_network_catalog(tmp_path, keys, publishers, raw, monkeypatch):
    monkeypatch.setattr(security, "GRANTS_REFRESH_S", 0.1)
    with CatalogServer(tmp_path / "served", "tcp://127.0.0.1:*") as srv:
        remote = Catalog(srv.endpoint)
        remote.grant(keys.public["alice"].decode(), "sec.*", "subscribe")
        pub = publishers(TOPIC, catalog=srv.endpoint, security=Security.curve(
            server_secret=keys.path("server"), allow=keys.allow))
        assert remote.lookup(TOPIC).partition_info[0].server_key == pub.server_key
        sub = Subscriber(TOPIC, srv.endpoint, timeout=5,
                         security=Security.curve(client_secret=keys.path("alice")))
        assert sub.wait_ready(5)
        bob = raw(pub.endpoint, TOPIC, keypair=(keys.public["bob"], keys.secret["bob"]),
                  server_key=keys.public["server"])
        bob.read(5, until=_refused)
        assert _refused(bob.messages) and not set(bob.kinds()) & set(STREAM)
        _publish(pub, range(2))
        _whole([e for _, e in zip(range(2), sub.epochs(timeout=5))])
        assert remote.revoke(keys.public["alice"].decode()) == 1
        with pytest.raises(NotAuthorized):
            for _ in sub.epochs(timeout=5):
                pass
        sub.close()
        pub.close(linger=0.2)
        pub.join(3)
        remote.close()


def test_a_relay_serves_a_secured_topic_securely(tmp_path, keys, publishers):
    """publisher (CURVE) → relay (a client key with a grant upstream, a server key downstream)
    → subscriber (a grant on the tier): whole epochs; a subscriber granted the upstream topic
    but not the tier is refused at the relay, and a relay without a grant cannot subscribe."""
    from epochstream import Relay

    cat = Catalog(tmp_path / "cat")
    cat.grant("carol", TOPIC, "subscribe")  # the relay's identity upstream (its certificate)
    cat.grant(keys.public["alice"].decode(), f"{TOPIC}@edge", "subscribe")
    cat.grant(keys.public["bob"].decode(), TOPIC, "subscribe")  # the topic, not the tier
    pub = publishers(TOPIC, catalog=cat,
                     security=Security.curve(server_secret=keys.path("server"), allow=keys.allow))
    relay = Relay(TOPIC, cat, tier="edge", heartbeat_interval=0.2,
                  upstream_security=Security.curve(client_secret=keys.path("carol")),
                  security=Security.curve(server_secret=keys.path("server"), allow=keys.allow))
    try:
        alice = Subscriber(f"{TOPIC}@edge", cat, timeout=5,
                           security=Security.curve(client_secret=keys.path("alice")))
        assert alice.wait_ready(5)
        bob = Subscriber(f"{TOPIC}@edge", cat, timeout=5,
                         security=Security.curve(client_secret=keys.path("bob")))
        with pytest.raises(NotAuthorized):
            bob.wait_ready(5)
        bob.close()
        _publish(pub, range(3))
        got = [e for _, e in zip(range(3), alice.epochs(timeout=5))]
        assert [e.time for e in got] == [0, 1, 2]
        _whole(got)
        alice.close()
    finally:
        relay.close()
    with pytest.raises(NotAuthorized):  # no grant for "dave" upstream: the relay cannot start
        Relay(TOPIC, cat, tier="far", wait=3, timeout=3,
              upstream_security=Security.curve(client_secret=keys.path("dave")))


def test_history_through_a_secured_publisher(tmp_path, keys, publishers, monkeypatch):
    """A secured subscriber joining at "earliest" reads the publisher's history through CURVE
    (its key needs the subscribe grant, as for the stream); a reader without a key gets
    nothing."""
    from epochstream import History
    from epochstream.errors import HistoryUnavailable

    monkeypatch.setenv("EPOCHSTREAM_HISTORY_SOURCE", "publisher")
    cat = Catalog(tmp_path / "cat")
    cat.grant(keys.public["alice"].decode(), TOPIC, "subscribe")
    pub = publishers(TOPIC, catalog=cat, retention=Retention(dir=tmp_path / "logs"),
                     security=Security.curve(server_secret=keys.path("server"), allow=keys.allow))
    _publish(pub, range(4))
    assert pub.flush(5)
    alice = Security.curve(client_secret=keys.path("alice"))
    sub = Subscriber(TOPIC, cat, security=alice, start="earliest", timeout=5)
    try:
        got = [e for _, e in zip(range(4), sub.epochs(timeout=5))]
        assert [e.time for e in got] == [0, 1, 2, 3]
        _whole(got)
        assert sub.stats["history_epochs"] >= 1  # from history, through the publisher
    finally:
        sub.close()
    with History(TOPIC, cat, security=alice) as h:
        assert [e.time for e in h.epochs(until=2)] == [0, 1]
    with History(TOPIC, cat, timeout=1) as h:  # no key: the handshake never completes
        with pytest.raises(HistoryUnavailable):
            list(h.epochs(until=1))


def test_a_refused_history_reader_gets_an_error_every_time_never_a_hang(tmp_path, keys,
                                                                         publishers):
    """A key the publisher's ZAP handler refuses: libzmq then drops the reader's pipe, and a
    blocking send would wait forever. Each read, the first and every later one on the same
    connection, raises HistoryUnavailable within the reader's timeout."""
    import threading

    from epochstream.errors import HistoryUnavailable
    from epochstream.log import RemoteLog

    pub = publishers(TOPIC, catalog=Catalog(tmp_path / "cat"),
                     retention=Retention(dir=tmp_path / "logs"),
                     security=Security.curve(server_secret=keys.path("server"), allow=keys.allow))
    _publish(pub, range(2))
    assert pub.flush(5)
    mallory = Security.curve(client_secret=keys.path("mallory"),  # not in allow/
                             server_public=keys.public["server"].decode())
    errors: list = []

    def reads():
        with RemoteLog(pub.endpoint, TOPIC, 0, timeout=0.5, security=mallory) as log:
            for _ in range(3):
                with pytest.raises(HistoryUnavailable) as info:
                    list(log.read([0, 1]))
                errors.append(str(info.value))
                time.sleep(0.3)  # the refusal has dropped the pipe by now

    t = threading.Thread(target=reads, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"a history read hung after {len(errors)} errors"
    assert len(errors) == 3, errors
