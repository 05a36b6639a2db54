"""The ``Security`` value: how one socket is secured, CURVE or plain TCP (docs/security.md).

``Security.curve(server_secret=..., allow=...)`` for a publisher (the CURVE server),
``Security.curve(client_secret=..., server_public=...)`` for a subscriber (a CURVE client);
``None`` or ``Security.none()`` is plain TCP, the default everywhere. The keys are read when the
value is made, from the sources of :mod:`epochstream.security.keys`.

``allow``: a directory of client certificates (``*.key`` files, one per client, as
``epochstream keys generate`` writes them; only their public key is read) — a client whose
public key is not there fails the handshake; ``None``: any client with a well-formed CURVE
handshake is let in (encrypted, and identified by its public key, which the grants then
check). The directory is read again whenever its modification time changes
(:mod:`epochstream.security.zap`), so adding or removing a certificate file takes effect at the
next handshake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .keys import _allow_dir, load_keypair, load_public

__all__ = ["Security", "checked"]


@dataclass(frozen=True)
class Security:
    """How a socket is secured; build it with :meth:`curve` or :meth:`none`.

    - ``mechanism``: ``"curve"`` or ``"null"`` (plain TCP);
    - ``server_public``/``server_secret``: the publisher's own key pair (Z85 text), or, on a
      subscriber, ``server_public`` alone: the publisher's public key (``None``: the one the
      catalog recorded for each partition);
    - ``client_public``/``client_secret``: a subscriber's key pair;
    - ``allow``: the absolute path of the publisher's client-certificate directory, or ``None``
      (any client key).

    Secret keys are left out of ``repr``."""

    mechanism: str = "null"
    server_public: str | None = None
    server_secret: str | None = field(default=None, repr=False)
    client_public: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    allow: str | None = None

    @classmethod
    def none(cls) -> "Security":
        """Plain TCP (the same as passing ``security=None``)."""
        return cls()

    @classmethod
    def curve(cls, *, server_secret: Any = None, allow: Any = None, client_secret: Any = None,
              server_public: Any = None) -> "Security":
        """CURVE. A publisher gives ``server_secret`` (its key pair: a ``.key_secret`` path, a
        name in ``$EPOCHSTREAM_KEYS`` or a ``(public, secret)`` pair) and ``allow`` (a directory
        of client ``*.key`` certificates, a name of a sub-directory of ``$EPOCHSTREAM_KEYS``, or
        ``None``: any client key). A subscriber gives ``client_secret`` (as ``server_secret``)
        and ``server_public`` (the publisher's public key: Z85 text, a certificate path or a
        name; ``None``: the key the catalog recorded for each partition). One value is one
        side: a process that publishes and subscribes makes two. Files are read here, once (the
        ``allow`` directory again whenever it changes). Raises ``ValueError``
        (:mod:`epochstream.security.keys`)."""
        if (server_secret is None) == (client_secret is None):
            raise ValueError("Security.curve: give server_secret= (a publisher's key pair) or "
                             "client_secret= (a subscriber's key pair), one of them")
        if allow is not None and server_secret is None:
            raise ValueError("Security.curve: allow= is the publisher's side (needs "
                             "server_secret=)")
        spub = ssec = cpub = csec = None
        if server_secret is not None:
            spub, ssec = load_keypair(server_secret, "server_secret")
        if client_secret is not None:
            cpub, csec = load_keypair(client_secret, "client_secret")
        if server_public is not None:
            if client_secret is None:
                raise ValueError("Security.curve: server_public= is the subscriber's side "
                                 "(needs client_secret=)")
            spub = load_public(server_public, "server_public")
        return cls("curve", spub, ssec, cpub, csec,
                   None if allow is None else _allow_dir(allow))

    @property
    def enabled(self) -> bool:
        """True for CURVE, False for plain TCP."""
        return self.mechanism == "curve"

    @property
    def is_server(self) -> bool:
        """True if this value can secure a publisher (it holds a server key pair)."""
        return self.enabled and self.server_secret is not None

    @property
    def is_client(self) -> bool:
        """True if this value can secure a subscriber (it holds a client key pair)."""
        return self.enabled and self.client_secret is not None


def _enabled(sec: Security | None) -> bool:
    if sec is None:
        return False
    if not isinstance(sec, Security):
        raise TypeError(f"security must be a Security (Security.curve(...)) or None, got "
                        f"{type(sec).__name__}")
    return sec.enabled


def checked(security, side: str) -> Security | None:
    """``security`` for one ``side`` (``"server"``: a publisher; ``"client"``: a subscriber),
    ``None`` when off (``None`` or plain TCP). ``TypeError`` for another type, ``ValueError``
    when it lacks that side's key pair."""
    if security is not None and not isinstance(security, Security):
        raise TypeError(f"security must be a Security or None, got {type(security).__name__}")
    if security is None or not security.enabled:
        return None
    if side == "server" and not security.is_server:
        raise ValueError("a publisher's security needs its key pair: "
                         "Security.curve(server_secret=..., allow=...)")
    if side == "client" and not security.is_client:
        raise ValueError("a subscriber's security needs its key pair: "
                         "Security.curve(client_secret=..., server_public=...)")
    return security
