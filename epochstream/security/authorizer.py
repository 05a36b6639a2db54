"""The publisher's side of grants: the :class:`Authorizer` of a secured publisher (or
Spark ingest host) decides per message whether the peer may subscribe or publish, and re-reads
the grants from the catalog on a thread of its own (docs/security.md, "What happens on the
wire" and "The Spark ingest path").

A publisher with ``security=`` and a catalog checks, before registering a subscriber (its
hello) or answering a history read, that the peer's principal holds a ``subscribe`` grant for
the topic; otherwise the peer gets ``X error`` with ``reason: "not_authorised"``
(:data:`NOT_AUTHORISED`) and the message ``not authorised for topic 'T' ...``, and nothing
else. Grants are re-read from the catalog every :data:`GRANTS_REFRESH_S` seconds by a thread of
the publisher's own (the loop never waits for the catalog); a registered subscriber whose
grant was revoked is dropped with the same notice within about that time. A publisher with
``security=`` and no catalog has no grants to read: the ``allow`` directory is the only check,
and every peer that completes the handshake may subscribe.

``publish`` grants are checked in two places. A
:class:`~epochstream.spark.SparkPublisherHost` with ``security=`` makes its ingest ROUTERs CURVE
servers like its publishers (same key pair, same ``allow``,
:func:`~epochstream.security.zap.apply_server`) and serves a Spark task's or the driver-side
commit's DATA/FLUSH/COMMIT/ABORT only if the connection's principal holds ``publish`` (or
``admin``) for the topic (:meth:`Authorizer.publish_refusal`); otherwise the request gets the
ingest protocol's ``ERR`` ("not authorised to publish to topic 'T' ...") and nothing of it is
staged. And a secured network catalog service
(:class:`~epochstream.catalog.server.CatalogServer`) registers a publisher's partition
(``register_partition``) only for a key holding ``publish`` for the topic. The executors' side
(a CURVE client with the sink's ``clientKey``, the host's key from the catalog) is
:mod:`epochstream.spark.client`.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from typing import Any, Callable

from .config import Security
from .grants import Grant, grant_matches
from .zap import _allow_list

__all__ = ["Authorizer", "NOT_AUTHORISED", "GRANTS_REFRESH_S"]

log = logging.getLogger("epochstream.security")

NOT_AUTHORISED = "not_authorised"
"""The ``reason`` field of the ``X error`` a refused peer gets (the subscriber raises
:class:`~epochstream.errors.NotAuthorized` for it)."""

GRANTS_REFRESH_S = 1.0
"""Seconds between two reads of the grants by a secured publisher with a catalog."""


class Authorizer:
    """A secured publisher's access decisions for ``topic``: the authenticated principal of
    each message (:meth:`user_of`), whether it may subscribe (:meth:`refusal`), and dropping
    registered peers whose grant was revoked (:meth:`enforce`). ``catalog``: where grants are
    read (``Catalog.grants(topic)``), or ``None`` (every authenticated peer may subscribe).

    The grants are read once here (raises what the catalog raises), then every ``refresh``
    seconds (default :data:`GRANTS_REFRESH_S`) by a daemon thread (:meth:`start`); a failed
    read keeps the last grants (logged). The loop thread only reads the current tuple."""

    def __init__(self, topic: str, sec: Security, catalog: Any = None, *,
                 refresh: float | None = None):
        self.topic = topic
        self.catalog = catalog
        self.refresh_s = float(GRANTS_REFRESH_S if refresh is None else refresh)
        self._allow = _allow_list(sec.allow)
        self.grants: tuple[Grant, ...] | None = (None if catalog is None
                                                 else tuple(catalog.grants(topic)))
        self.version = 0  # bumped when the grants change
        self._enforced = 0
        self._principals: dict[bytes, str | None] = {}  # registered ident -> User-Id
        self._checked: dict[bytes, str | None] = {}  # authorised hello, not registered yet
        self._thread: threading.Thread | None = None

    @staticmethod
    def user_of(frame: Any) -> str | None:
        """The ZAP ``User-Id`` of the connection a ``zmq.Frame`` (received with
        ``copy=False``) came over; ``None`` if it has none."""
        import zmq

        try:
            return frame.get("User-Id") or None
        except (zmq.ZMQError, UnicodeDecodeError):
            return None

    def principals(self, user_id: str | None) -> tuple[str, ...]:
        """The principals of a peer whose ``User-Id`` is ``user_id``: the key, and its
        certificate name in the ``allow`` directory."""
        if not user_id:
            return ()
        name = self._allow.keys().get(user_id)
        return (user_id,) if name is None else (user_id, name)

    def refusal(self, user_id: str | None, what: str = "subscribe") -> list[bytes] | None:
        """``None`` if the peer ``user_id`` may subscribe to the topic, else the ``X error``
        frames to answer it with."""
        if not user_id:
            why = "no authenticated identity"
        elif self.grants is None:
            return None
        elif grant_matches(self.grants, self.principals(user_id), self.topic, "subscribe"):
            return None
        else:
            why = f"principal {user_id} holds no subscribe grant"
        return self.notice(user_id, f"{why}; cannot {what}")

    def allows(self, user_id: str | None, op: str) -> bool:
        """Whether the peer authenticated as ``user_id`` may do ``op`` (:data:`OPERATIONS`) on
        the topic: it has an identity and, with a catalog, one of its principals (or ``*``) holds
        a grant for ``op`` or ``admin`` matching the topic; without a catalog any identity may."""
        if not user_id:
            return False
        if self.grants is None:
            return True
        return grant_matches(self.grants, self.principals(user_id), self.topic, op)

    def publish_refusal(self, user_id: str | None) -> str | None:
        """``None`` if the peer ``user_id`` may publish to the topic (:meth:`allows`), else
        the message to refuse it with: ``not authorised to publish to topic 'T' (...)``."""
        if self.allows(user_id, "publish"):
            return None
        why = ("no authenticated identity" if not user_id
               else f"principal {user_id} holds no publish grant")
        return f"not authorised to publish to topic {self.topic!r} ({why})"

    def notice(self, user_id: str | None, why: str) -> list[bytes]:
        """The ``X error`` frames refusing ``user_id``, naming the topic and ``why``."""
        from .. import wire

        return wire.encode_notice("error", f"not authorised for topic {self.topic!r} ({why})",
                                  reason=NOT_AUTHORISED, principal=user_id or "")

    def checked(self, ident: bytes, user_id: str | None) -> None:
        """The hello of ``ident`` (authenticated as ``user_id``) was authorised; its
        registration may come later (a relay's gated hello)."""
        if len(self._checked) >= 4096:  # hellos authorised but never registered: forget old ones
            for old in list(self._checked)[:1024]:
                del self._checked[old]
        self._checked[ident] = user_id

    def registered(self, ident: bytes) -> None:
        """The loop registered ``ident`` (with the identity its authorised hello had)."""
        self._principals[ident] = self._checked.pop(ident, None)

    def enforce(self, peers: dict[bytes, Any], leave: Callable[[bytes], None],
                transmit: Callable[[bytes, list[bytes]], Any]) -> int:
        """If the grants changed since the last call: drop (``leave``) and notify every peer of
        ``peers`` (the registered idents) no longer authorised. Returns how many."""
        if self._enforced == self.version:
            if len(self._principals) > len(peers) + 1024:  # forget peers that left
                for ident in [i for i in self._principals if i not in peers]:
                    del self._principals[ident]
            return 0
        self._enforced = self.version
        for ident in [i for i in self._principals if i not in peers]:
            del self._principals[ident]
        dropped = 0
        for ident, user in list(self._principals.items()):
            refusal = self.refusal(user, "go on (grant revoked)")
            if refusal is not None:
                log.warning("%s: dropping subscriber %r: %s", self.topic, ident,
                            "grant revoked")
                leave(ident)
                transmit(ident, refusal)
                del self._principals[ident]
                dropped += 1
        return dropped

    def reload(self) -> bool:
        """Read the grants again; True if they changed. A failure keeps the old ones (logged)."""
        if self.catalog is None:
            return False
        try:
            fresh = tuple(self.catalog.grants(self.topic))
        except Exception as e:  # noqa: BLE001 - the catalog may be away; keep serving
            log.warning("%s: could not read the grants (keeping the last ones): %s",
                        self.topic, e)
            return False
        if fresh != self.grants:
            self.grants = fresh
            self.version += 1
            return True
        return False

    def start(self, alive: Callable[[], bool]) -> None:
        """Re-read the grants every ``refresh`` seconds while ``alive()`` (the publisher's loop
        runs), on a daemon thread. Without a catalog: nothing to do."""
        if self.catalog is None or self._thread is not None:
            return

        def run() -> None:
            while True:
                _time.sleep(self.refresh_s)
                if not alive():
                    return
                self.reload()

        self._thread = threading.Thread(target=run, daemon=True,
                                        name=f"epochstream-grants-{self.topic}")
        self._thread.start()
