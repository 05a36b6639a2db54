"""Fixtures of the security tests (docs/security.md): key pairs written by pyzmq's
``zmq.auth.create_certificates``, an ``allow`` directory, publishers that are closed quickly,
and :class:`RawPeer`, a ``zmq.DEALER`` driven by hand that sends a hello exactly as
``Subscriber`` does and keeps every frame it receives (so a test can check at the socket level
that not a single ``S``/``D``/``R`` frame arrived)."""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq
import zmq.auth

from epochstream import wire

for _folder in (Path(__file__).parent, Path(__file__).parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

NAMES = ("server", "alice", "bob", "carol", "dave", "mallory")
ALLOWED = ("alice", "bob", "carol", "dave")  # mallory's key is not in the allow directory


@pytest.fixture(autouse=True)
def _no_env(monkeypatch, tmp_path):
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    monkeypatch.delenv("EPOCHSTREAM_KEYS", raising=False)
    monkeypatch.setenv("EPOCHSTREAM_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="session")
def _key_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    for n in NAMES:
        zmq.auth.create_certificates(d, n)
    return d


@pytest.fixture
def keys(_key_files, tmp_path) -> SimpleNamespace:
    """``dir`` (every ``NAME.key``/``NAME.key_secret``), ``allow`` (the public certificates of
    :data:`ALLOWED`), ``public[name]``/``secret[name]`` (Z85 bytes) and ``path(name)`` (the
    ``.key_secret`` file)."""
    allow = tmp_path / "allow"
    allow.mkdir()
    for n in ALLOWED:
        shutil.copy(_key_files / f"{n}.key", allow / f"{n}.key")
    public, secret = {}, {}
    for n in NAMES:
        public[n], secret[n] = zmq.auth.load_certificate(_key_files / f"{n}.key_secret")
    return SimpleNamespace(dir=_key_files, allow=allow, public=public, secret=secret,
                           path=lambda n: _key_files / f"{n}.key_secret")


@pytest.fixture
def publishers():
    """``make(*args, **kwargs)`` → a Publisher (heartbeat 0.2 s), closed with a short linger."""
    from epochstream import Publisher

    made = []

    def make(*args, **kwargs):
        kwargs.setdefault("heartbeat_interval", 0.2)
        pub = Publisher(*args, **kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close(linger=0.2)
    for pub in made:
        pub.join(3.0)


class RawPeer:
    """A hand-driven DEALER: optionally a CURVE client (``keypair`` = (public, secret) Z85
    bytes, ``server_key`` Z85 bytes), connected to ``endpoint``; sends a hello for ``topic``
    partition 0 (as ``Subscriber._join`` does) unless ``hello=False``. :meth:`read` collects
    every message for a while; :attr:`messages` holds them all (lists of bytes)."""

    def __init__(self, endpoint: str, topic: str, *, keypair=None, server_key=None,
                 hello: bool = True):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        if keypair is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey = keypair
            self.sock.curve_serverkey = server_key
        self.sock.connect(endpoint)
        self.topic = topic
        self.messages: list[list[bytes]] = []
        if hello:
            self.send(wire.HELLO, topic=topic, partition=0, id=uuid.uuid4().hex)

    def send(self, kind: bytes, **fields) -> bool:
        """Send without blocking; False if the socket has no pipe: libzmq drops the pipe of a
        connecting DEALER whose handshake was refused (a key not allowed, plain against
        CURVE), and a blocking send would then wait forever (CI hung here)."""
        try:
            self.sock.send_multipart(wire.encode_control(kind, **fields), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def read(self, seconds: float, until=None) -> list[list[bytes]]:
        """Collect messages for ``seconds`` (or until ``until(messages)`` is true)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until(self.messages):
                break
            if self.sock.poll(20):
                while True:
                    try:
                        self.messages.append(self.sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
        return self.messages

    def kinds(self) -> list[bytes]:
        return [m[0][:1] for m in self.messages]

    def notices(self) -> list:
        return [wire.decode(m) for m in self.messages if m[0] == wire.NOTICE]

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def raw():
    """``raw(endpoint, topic, **kw)`` → a :class:`RawPeer`, closed at the end."""
    peers = []

    def make(*args, **kwargs):
        p = RawPeer(*args, **kwargs)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
