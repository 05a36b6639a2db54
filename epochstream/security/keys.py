"""Key files: where a CURVE key pair, a public key or an ``allow`` directory comes from
(docs/security.md, "Key sources and ``EPOCHSTREAM_KEYS``").

Keys are ZeroMQ certificates written by ``zmq.auth.create_certificates`` and read by
``zmq.auth.load_certificate`` (pyzmq's ``zmq.auth``:
https://pyzmq.readthedocs.io/en/latest/api/zmq.auth.html). A key source is

- a path to a certificate file: ``NAME.key_secret`` (public and secret key) for a key pair,
  ``NAME.key`` (public key only; a ``.key_secret`` works too) for a public key;
- a key pair ``(public, secret)`` of Z85 strings or bytes (``zmq.curve_keypair()``), or for a
  public key its 40-character Z85 text;
- a bare name, looked up in the key directory ``$EPOCHSTREAM_KEYS`` (:data:`ENV_KEYS`):
  ``<dir>/<name>.key_secret`` for a secret, ``<dir>/<name>.key`` for a public key, and for an
  ``allow`` directory the sub-directory ``<dir>/<name>/``.

Errors: a missing or unreadable key file, a key that is not 40 Z85 characters, a public key
that does not match its secret, an ``allow`` directory without certificates raise
``ValueError`` naming what was tried.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["ENV_KEYS", "is_z85_key", "check_server_key", "key_dir", "load_keypair", "load_public",
           "load_allowed"]

log = logging.getLogger("epochstream.security")

ENV_KEYS = "EPOCHSTREAM_KEYS"
"""The environment variable naming the default key directory (bare key names are looked up
there: ``<dir>/<name>.key_secret``, ``<dir>/<name>.key``, ``<dir>/<name>/``)."""

_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 ".-:+=^!/*?&<>()[]{}@%$#")  # the Z85 alphabet (ZeroMQ RFC 32)


def is_z85_key(value: Any) -> bool:
    """Whether ``value`` (str or bytes) is a 32-byte CURVE key in Z85: 40 characters of the Z85
    alphabet (ZeroMQ RFC 32)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return False
    return isinstance(value, str) and len(value) == 40 and set(value) <= _Z85


def check_server_key(key: Any) -> str | None:
    """``key`` as stored in the catalog: ``None`` or a Z85 public key (str; bytes are decoded).
    Raises ``ValueError`` for anything else."""
    if key is None:
        return None
    if not is_z85_key(key):
        raise ValueError(f"a server key must be a CURVE public key in Z85 (40 characters), "
                         f"got {str(key)[:60]!r}")
    return key.decode("ascii") if isinstance(key, (bytes, bytearray)) else key


def key_dir() -> Path | None:
    """The key directory ``$EPOCHSTREAM_KEYS`` (``None`` if unset or empty)."""
    d = os.environ.get(ENV_KEYS)
    return Path(d).expanduser() if d else None


def _candidates(source: Any, suffix: str) -> list[Path]:
    """Where a key given as ``source`` (a path or a bare name) may be, in order."""
    p = Path(source).expanduser()
    out = [p]
    d = key_dir()
    if d is not None and p.name == str(source) and os.sep not in str(source):
        out.append(d / f"{source}{suffix}")
    return out


def _find(source: Any, suffix: str, what: str) -> Path:
    tried = _candidates(source, suffix)
    for p in tried:
        if p.is_file():
            return p
    hint = "" if key_dir() is not None else f" (set ${ENV_KEYS} to look bare names up there)"
    raise ValueError(f"{what}: no certificate file at {', '.join(map(str, tried))}{hint}")


def _text(key: Any) -> str:
    return key.decode("ascii") if isinstance(key, (bytes, bytearray)) else str(key)


def load_keypair(source: Any, what: str = "key pair") -> tuple[str, str]:
    """``(public, secret)`` Z85 keys from ``source``: a ``.key_secret`` certificate's path, a
    bare name (``$EPOCHSTREAM_KEYS/<name>.key_secret``) or a ``(public, secret)`` pair of Z85
    str/bytes. Raises ``ValueError`` if there is none, it holds no secret key, or the public key
    does not belong to the secret one."""
    import zmq
    import zmq.auth

    if isinstance(source, (tuple, list)):
        if len(source) != 2 or not all(is_z85_key(k) for k in source):
            raise ValueError(f"{what}: a key pair is (public, secret), two 40-character Z85 "
                             f"keys")
        public, secret = _text(source[0]), _text(source[1])
        where = "the given key pair"
    else:
        path = _find(source, ".key_secret", what)
        try:
            pub, sec = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{what}: cannot read certificate {path}: {e}") from None
        if sec is None:
            raise ValueError(f"{what}: {path} holds no secret key (a .key file is the public "
                             f"half; use the .key_secret file)")
        if not (is_z85_key(pub) and is_z85_key(sec)):
            raise ValueError(f"{what}: {path} does not hold 40-character Z85 keys")
        public, secret = _text(pub), _text(sec)
        where = str(path)
    if zmq.curve_public(secret.encode("ascii")).decode("ascii") != public:
        raise ValueError(f"{what}: the public key in {where} does not belong to its secret key")
    return public, secret


def load_public(source: Any, what: str = "public key") -> str:
    """A Z85 public key from ``source``: its 40-character Z85 text (str or bytes), a certificate
    file's path (``.key`` or ``.key_secret``), or a bare name (``$EPOCHSTREAM_KEYS/<name>.key``).
    Raises ``ValueError``."""
    import zmq.auth

    if isinstance(source, (bytes, bytearray)) or (isinstance(source, str)
                                                  and not Path(source).expanduser().is_file()):
        if is_z85_key(source):
            return _text(source)
        if isinstance(source, (bytes, bytearray)):
            raise ValueError(f"{what}: not a 40-character Z85 key")
    path = _find(source, ".key", what)
    try:
        pub, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: cannot read certificate {path}: {e}") from None
    if not is_z85_key(pub):
        raise ValueError(f"{what}: {path} does not hold a 40-character Z85 key")
    return _text(pub)


def _allow_dir(source: Any) -> str:
    p = Path(source).expanduser()
    if not p.is_dir():
        d = key_dir()
        if d is not None and os.sep not in str(source) and (d / str(source)).is_dir():
            p = d / str(source)
        else:
            raise ValueError(f"allow: no directory {p} (a directory of client certificates, "
                             f"*.key files)")
    p = p.resolve()
    if not load_allowed(p):
        raise ValueError(f"allow: {p} holds no client certificate (*.key file): every client "
                         f"would be refused")
    return str(p)


def load_allowed(directory: Any) -> dict[str, str]:
    """``{public key (Z85): name}`` of the client certificates (``*.key`` files; the name is the
    file name without ``.key``) in ``directory``, read with ``zmq.auth.load_certificate``. A
    file that is not a certificate is skipped (logged). Raises ``OSError`` if the directory
    cannot be listed."""
    import zmq.auth

    out: dict[str, str] = {}
    for p in sorted(Path(directory).glob("*.key")):
        try:
            pub, _ = zmq.auth.load_certificate(p)
        except (OSError, ValueError) as e:
            log.warning("allow directory %s: skipping %s: %s", directory, p.name, e)
            continue
        if is_z85_key(pub):
            out[_text(pub)] = p.name[:-len(".key")]
    return out
