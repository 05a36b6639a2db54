"""The network catalog's client: :class:`RemoteCatalog`, what ``Catalog("tcp://host:port")``
returns — the same methods as the embedded :class:`~epochstream.catalog.Catalog`, each one
request to ``epochstream catalog serve`` (:mod:`epochstream.catalog.server`), which runs it on
the catalog it owns. Messages: :mod:`epochstream.catalog.rpc`; sending them (a socket pool,
resends, timeouts): :class:`~epochstream.catalog.channel.Channel`, which the client holds.

URL: ``tcp://HOST:PORT``, optionally with ``?timeout=SECONDS&lease=SECONDS`` and, for a service
started with ``--key``, ``client_key=KEY&server_key=KEY`` (so that a URL in
``$EPOCHSTREAM_CATALOG``, ``--catalog`` or a Spark option can carry them; each ``KEY`` a key
file's path or a name in ``$EPOCHSTREAM_KEYS``, never the key itself: the client's secret
``NAME.key_secret`` and the service's public ``NAME.key``). Keyword arguments of
``Catalog(url, timeout=..., lease=..., security=...)`` win over the URL's.

- **Timeouts.** Every request waits at most ``timeout`` seconds (default
  :data:`DEFAULT_TIMEOUT`) for its answer, then raises
  :class:`~epochstream.errors.CatalogUnavailable` — never a hang; the socket of a request that
  timed out is closed (``LINGER`` 0) and the next request uses a fresh one. Opening the client
  asks the server to describe itself (``hello``), so an unreachable catalog is reported by
  ``Catalog(url)`` itself.
- **Errors** raised by the embedded catalog on the server are raised here with the same type,
  message and attributes (:func:`~epochstream.catalog.rpc.raise_error`).
- **Leases.** Liveness of a process on another machine cannot be checked from its pid, so a
  partition registered through this client (:meth:`RemoteCatalog.register_partition`) and a
  durable subscription claimed through it (:meth:`RemoteCatalog.durable_claim`) carry a lease of
  ``lease`` seconds (default :data:`DEFAULT_LEASE`): a background thread of this client renews
  every lease it holds every ``lease / 3`` seconds (also :meth:`RemoteCatalog.renew`), until the
  partition is closed (:meth:`~RemoteCatalog.close_partition`), the subscription released, the
  client closed (:meth:`RemoteCatalog.close`) or the process ends. A partition whose lease was
  not renewed for ``lease`` seconds reads as ``"dead"`` (the server's clock) and another
  publisher may take it over.
- **Threads and processes.** A client may be shared by threads (each request borrows a socket
  from a small pool); a child process made by ``fork()`` opens its own sockets and renews
  nothing of its parent's.
- **The local directory.** :attr:`RemoteCatalog.path` is the URL (a ``str``); its ``parent``
  is a local directory standing for "the catalog's directory": ``$EPOCHSTREAM_HOME/<host>_<port>``
  (default ``~/.epochstream/<host>_<port>``). ``Retention(dir=None)`` puts a publisher's epoch
  logs under it (``history/<topic>/<partition>``).
- **Consumer groups.** :meth:`RemoteCatalog.group_claim` cannot send its ``decide`` callable:
  it reads the group's states (``group_claim_read``), decides here, and applies the decision in
  one server transaction (``group_claim_apply``) only if the states did not change meanwhile;
  otherwise it reads and decides again.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from typing import Any, Callable
from urllib.parse import urlencode

from ..errors import CatalogError, TopicNotFound
from ..security import Grant
from .api import POLL_INTERVAL_S, Catalog, implementation
from .channel import IDLE_S, RESEND_S, Channel, check_seconds, parse_url, url_security
from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
from .history_records import DurableInfo, EpochRecord, HistoryState
from .holders import HOST, process_start
from .locations import ENV_VAR, CatalogURL, is_catalog_url, local_home
from .records import STATES, TopicInfo
from .renewals import Renewals
from .topics import topic_definition

# (parse_url, RESEND_S and IDLE_S are epochstream.catalog.channel's, importable from here too)
__all__ = ["RemoteCatalog", "CatalogURL", "parse_url", "local_home", "DEFAULT_TIMEOUT",
           "DEFAULT_LEASE", "CLAIM_ATTEMPTS", "RESEND_S", "IDLE_S"]

DEFAULT_TIMEOUT = 5.0
"""Seconds a request waits for the catalog server's answer."""
DEFAULT_LEASE = 10.0
"""Seconds a partition (or durable subscription) registered through the network catalog stays
alive without a renewal; renewed every third of it."""
CLAIM_ATTEMPTS = 100
"""Reads-and-decides a :meth:`RemoteCatalog.group_claim` tries before giving up (each failure
means another worker changed the group meanwhile)."""


@implementation("tcp")
class RemoteCatalog(Catalog):
    """The network catalog at ``url`` (``"tcp://host:port"``; ``None``: ``$EPOCHSTREAM_CATALOG``)
    with the methods of :class:`~epochstream.catalog.Catalog` (module docstring).

    ``timeout``: seconds each request may wait for its answer (default :data:`DEFAULT_TIMEOUT`,
    or the URL's ``?timeout=``); ``lease``: seconds of the leases this client takes (default
    :data:`DEFAULT_LEASE`, or ``?lease=``); ``security``: ``None`` (plain TCP) or
    ``Security.curve(client_secret=..., server_public=<the service's key>)`` for a service
    started with ``--key``/``--allow`` (docs/security.md).

    Raises :class:`CatalogError` for a malformed URL or argument and
    :class:`~epochstream.errors.CatalogUnavailable` if the server does not answer within
    ``timeout``; every method raises ``CatalogUnavailable`` likewise, and otherwise what the
    embedded method raises."""

    def __init__(self, url: str | None = None, *, timeout: float | None = None,
                 lease: float | None = None, security: Any = None):
        url = os.environ.get(ENV_VAR) if url is None else url
        if not is_catalog_url(url):
            raise CatalogError(f"a network catalog is named tcp://HOST:PORT, got {url!r}")
        host, port, params = parse_url(str(url))
        try:
            self.timeout = check_seconds("timeout", params.get("timeout", DEFAULT_TIMEOUT)
                                    if timeout is None else timeout)
            self.lease = check_seconds("lease", params.get("lease", DEFAULT_LEASE)
                                  if lease is None else lease)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        self.url = f"tcp://{host}:{port}"
        # CURVE towards a secured service (docs/security.md): Security.curve(client_secret=...,
        # server_public=<the service's key>), or the URL's client_key/server_key; None: plain
        if security is None and ("client_key" in params or "server_key" in params):
            security = url_security(url, params)
        self.security = security if security is not None and security.enabled else None
        if self.security is not None and (not self.security.is_client
                                          or self.security.server_public is None):
            raise CatalogError("a secured catalog service needs Security.curve(client_secret=..., "
                               "server_public=<the service's public key>)")
        keys = {k: params[k] for k in ("client_key", "server_key") if k in params}
        # passed on (e.g. to Spark executors), the URL keeps the key names (never the keys)
        self.path = CatalogURL(  # type: ignore[assignment]
            self.url + (f"?{urlencode(keys)}" if keys else ""))
        self._channel = Channel(self.url, self.timeout, self.security)
        self._fork_lock = threading.Lock()
        self._reset_process()
        self.server: dict = self._call("hello")
        """The server's description: ``db`` (its SQLite file), ``host``, ``pid``, ``schema``,
        ``version``."""

    def _reset_process(self) -> None:
        """State of this process (again after a ``fork()``: nothing of the parent's is used;
        the channel opens its own sockets likewise)."""
        self._pid = os.getpid()
        self._leases = Renewals(self, self.lease / 3, self.url)
        self._identity: tuple | None = None

    def _this_process(self) -> None:
        """Start afresh in a forked child (:meth:`_reset_process`)."""
        if self._pid != os.getpid():
            with self._fork_lock:
                if self._pid != os.getpid():
                    self._reset_process()

    def __repr__(self) -> str:
        return f"RemoteCatalog({self.url!r})"

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Send ``op(*args, **kwargs)``; return the decoded result or raise its error
        (:meth:`~epochstream.catalog.channel.Channel.call`: resent until ``timeout``)."""
        self._this_process()
        return self._channel.call(op, *args, **kwargs)

    def close(self) -> None:
        """Stop renewing leases (partitions registered through this client read as ``dead``
        once their lease passes) and close the idle sockets. Later calls open new sockets."""
        self._leases.close()
        self._channel.close()

    def __enter__(self) -> "RemoteCatalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- leases

    def _holder(self, pid: Any, pid_start: Any, host: Any) -> dict:
        """The holder a request names: ``pid``, ``pid_start``, ``host`` as given, else this
        process (the server cannot know the caller's process)."""
        if self._identity is None or self._identity[0] != os.getpid():
            me = os.getpid()
            self._identity = (me, process_start(me), HOST)
        if pid is None or pid == self._identity[0]:
            pid, start = self._identity[0], self._identity[1]
        else:  # another process of this machine (unless host says otherwise)
            start = None
        return {"pid": pid, "pid_start": start if pid_start is None else pid_start,
                "host": self._identity[2] if host is None else host}

    def _hold(self, key: tuple, ident: str) -> None:
        self._this_process()
        self._leases.hold(key, ident)

    def _drop(self, key: tuple, ident: str | None = None) -> None:
        self._leases.drop(key, ident)

    def renew(self) -> int:
        """Renew now every lease this client holds (the background thread does so every
        ``lease / 3`` seconds); returns how many are still held. A lease the catalog no longer
        grants (the partition was taken over or dropped, the subscription reset) is forgotten.
        Raises :class:`~epochstream.errors.CatalogUnavailable` if the server does not answer."""
        return self._leases.renew()

    @property
    def held(self) -> list[tuple]:
        """The leases this client renews: ``("partition", topic, index)`` and
        ``("durable", topic, name)``."""
        return self._leases.held

    # ---- the methods that do more than forward

    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        order_name, codec, partitions, schema, partition_key = topic_definition(
            topic, order, codec, partitions, schema, partition_key)
        extra = {} if partition_key is None else {"partition_key": partition_key}
        return self._call("create_topic", topic, order=order_name, codec=codec,
                          partitions=partitions, schema=schema, **extra)

    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        deadline = time.monotonic() + max(0.0, float(wait))
        while True:
            missing: TopicNotFound | None = None
            try:
                info = self._call("lookup", topic)
            except TopicNotFound as e:
                info, missing = None, e
            ready = info is not None and info.complete and all(
                p.state in STATES for p in info.partition_info)
            remaining = deadline - time.monotonic()
            if ready or remaining <= 0:
                if info is None:
                    assert missing is not None
                    raise missing
                return info
            time.sleep(min(POLL_INTERVAL_S, remaining))

    def register_partition(self, topic: str, partition: int, endpoint: str, *,
                           ingest: str | None = None, pid: int | None = None,
                           incarnation: str | None = None, upper: Any = (),
                           lease: float | None = None, host: str | None = None,
                           pid_start: float | None = None, server_key: str | None = None) -> str:
        me = self._holder(pid, pid_start, host)
        # chosen here, once: a resent registration must find its own claim (retry.retried)
        incarnation = uuid.uuid4().hex if incarnation is None else incarnation
        inc = self._call("register_partition", topic, partition, endpoint, ingest=ingest,
                         incarnation=incarnation, upper=upper,
                         lease=self.lease if lease is None else lease, server_key=server_key,
                         **me)
        self._hold(("p", topic, partition), inc)
        return inc

    def close_partition(self, topic: str, partition: int, incarnation: str, upper: Any = (),
                        *, aborted: bool = False) -> bool:
        self._drop(("p", topic, partition), incarnation)
        return self._call("close_partition", topic, partition, incarnation, upper,
                          aborted=aborted)

    def history_begin(self, topic: str, partition: int, directory: str, lower: Any,
                      upper: Any, store: str | None = None) -> Any:
        return self._call("history_begin", topic, partition, os.path.abspath(directory), lower,
                          upper, store)

    def history_uploaded(self, topic: str, partition: int, segment: int, name: str,
                         nbytes: int, incarnation: str | None = None) -> tuple[bool, str | None]:
        return self._call("history_uploaded", topic, partition, segment, name, nbytes,
                          incarnation)

    def durable_claim(self, topic: str, name: str, holder: str, *, takeover: bool = False,
                      pid: int | None = None, pid_start: float | None = None,
                      host: str | None = None, lease: float | None = None) -> Any:
        me = self._holder(pid, pid_start, host)
        info = self._call("durable_claim", topic, name, holder, takeover=takeover,
                          lease=self.lease if lease is None else lease, **me)
        self._hold(("d", topic, name), holder)
        return info

    def durable_release(self, topic: str, name: str, holder: str) -> None:
        self._drop(("d", topic, name), holder)
        return self._call("durable_release", topic, name, holder)

    def group_claim(self, topic: str, name: str, worker: str, decide: Callable[..., Any],
                    ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        for attempt in range(CLAIM_ATTEMPTS):
            view = self._call("group_claim_read", topic, name)
            the_plan, position = decide(dict(view.states), view.now, view.stored)
            got = self.group_claim_apply(topic, name, worker, list(the_plan.lease),
                                         list(the_plan.exhausted), position, view.fingerprint)
            if got is not None:
                return got
            time.sleep(random.uniform(0, 0.001 * min(attempt + 1, 20)))
        raise CatalogError(f"consumer group {name!r} of topic {topic!r}: no claim after "
                           f"{CLAIM_ATTEMPTS} attempts, the group kept changing meanwhile")

    def group_claim_apply(self, topic: str, name: str, worker: str, lease: Any, exhausted: Any,
                          position: Any, fingerprint: str, *, pid: int | None = None,
                          pid_start: float | None = None, host: str | None = None) -> Any:
        me = self._holder(pid, pid_start, host)
        return self._call("group_claim_apply", topic, name, worker, lease, exhausted, position,
                          fingerprint, **me)

    def grant(self, principal: str, topic_pattern: str, op: str) -> Any:
        # positional: a keyword ``op`` would collide with _call's own first parameter
        return self._call("grant", principal, topic_pattern, op)

    def revoke(self, principal: str, topic_pattern: str | None = None,
               op: str | None = None) -> int:
        return self._call("revoke", principal, topic_pattern, op)

    # ---- the methods that forward: one request each (rpc.OPS)

    def drop_topic(self, topic: str) -> None:
        return self._call("drop_topic", topic)

    def topics(self) -> list[TopicInfo]:
        return self._call("topics")

    def record_upper(self, topic: str, partition: int, incarnation: str, upper: Any) -> bool:
        return self._call("record_upper", topic, partition, incarnation, upper)

    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        return self._call("heartbeat", topic, partition, incarnation)

    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        return self._call("grants", topic, principal)

    def history_state(self, topic: str, partition: int) -> HistoryState | None:
        return self._call("history_state", topic, partition)

    def history_states(self, topic: str) -> dict[int, HistoryState]:
        return self._call("history_states", topic)

    def history_commit(self, topic: str, partition: int, *, epochs: list[EpochRecord],
                       lower: Any, upper: Any, segment: int, committed: int,
                       roll_to: int | None = None, durable: bool = True,
                       incarnation: str | None = None) -> None:
        return self._call("history_commit", topic, partition, epochs=epochs, lower=lower,
                          upper=upper, segment=segment, committed=committed, roll_to=roll_to,
                          durable=durable, incarnation=incarnation)

    def history_trim(self, topic: str, partition: int, keep_from: int,
                     holder: str | None = None) -> tuple[tuple, list[str]]:
        return self._call("history_trim", topic, partition, keep_from, holder)

    def retention_acquire(self, topic: str, partition: int, holder: str, *, lease: float,
                          pid: int | None = None, pid_start: float | None = None,
                          host: str | None = None) -> tuple[bool, str]:
        return self._call("retention_acquire", topic, partition, holder, lease=lease,
                          **self._holder(pid, pid_start, host))

    def retention_release(self, topic: str, partition: int, holder: str) -> bool:
        return self._call("retention_release", topic, partition, holder)

    def retention_record(self, topic: str, limits: dict) -> None:
        return self._call("retention_record", topic, limits)

    def retention_limits(self, topic: str) -> dict | None:
        return self._call("retention_limits", topic)

    def history_epochs(self, topic: str, partition: int, *, min_t0: int | None = None,
                       segment_from: int | None = None, after: Any = None,
                       limit: int | None = None) -> list[EpochRecord]:
        page = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
        return self._call("history_epochs", topic, partition, min_t0=min_t0,  # (an older
                          segment_from=segment_from, **page)  # server knows no page arguments)

    def history_epoch(self, topic: str, partition: int, time: Any) -> EpochRecord | None:
        return self._call("history_epoch", topic, partition, time)

    def durables(self, topic: str | None = None) -> list[DurableInfo]:
        return self._call("durables", topic)

    def durable(self, topic: str, name: str) -> DurableInfo | None:
        return self._call("durable", topic, name)

    def durable_ack(self, topic: str, name: str, holder: str, position: Any,
                    acked: Any = ()) -> bool:
        return self._call("durable_ack", topic, name, holder, position, acked)

    def durable_renew(self, topic: str, name: str, holder: str) -> bool:
        return self._call("durable_renew", topic, name, holder)

    def durable_reset(self, topic: str, name: str, position: Any | None) -> DurableInfo:
        return self._call("durable_reset", topic, name, position)

    def durable_drop(self, topic: str, name: str) -> bool:
        return self._call("durable_drop", topic, name)

    def group_open(self, topic: str, name: str, *, mode: str, ack_wait: float,
                   max_deliver: int, dead_letter: str | None) -> GroupInfo:
        return self._call("group_open", topic, name, mode=mode, ack_wait=ack_wait, max_deliver=max_deliver, dead_letter=dead_letter)

    def group_info(self, topic: str, name: str) -> GroupInfo:
        return self._call("group_info", topic, name)

    def groups(self, topic: str | None = None) -> list[GroupInfo]:
        return self._call("groups", topic)

    def group_drop(self, topic: str, name: str) -> bool:
        return self._call("group_drop", topic, name)

    def group_epochs(self, topic: str, name: str) -> list[GroupEpoch]:
        return self._call("group_epochs", topic, name)

    def group_claim_read(self, topic: str, name: str) -> ClaimView:
        return self._call("group_claim_read", topic, name)

    def group_settle(self, topic: str, name: str, unit: tuple, token: int, *, outcome: str,
                     delay: float = 0.0) -> float:
        return self._call("group_settle", topic, name, unit, token, outcome=outcome, delay=delay)

    def group_stop(self, topic: str, name: str, reason: str) -> None:
        return self._call("group_stop", topic, name, reason)

    def group_reset(self, topic: str, name: str) -> None:
        return self._call("group_reset", topic, name)

