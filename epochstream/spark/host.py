"""The host of a Spark-fed topic, in the user's driver program (:class:`SparkPublisherHost`):
it creates the topic and serves each partition — a :class:`~epochstream.transport.Publisher`
and an ingest ROUTER — on a thread of its own (:mod:`~epochstream.spark.partition_server`,
which has the serving loop and its security), and answers for them all: endpoints, statistics,
pause points, the frontier, closing and aborting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, overload

import zmq

from ..catalog import Catalog
from ..order import TOTAL
from ..retention import Retention
from ..security import Authorizer, Security, release_authenticator
from .ingest import IngestError
from .partition_server import PartitionStats, _PartitionServer
from .pause import Pause
from .staging import DEFAULT_MAX_STAGED_BYTES

__all__ = ["SparkPublisherHost", "PartitionStats", "Pause"]


class SparkPublisherHost:
    """Hosts the publishers of a Spark-fed topic in the driver program (context manager).

    - ``topic``; ``partitions``: topic partitions (Spark partition ``i`` feeds ``i % partitions``);
    - ``catalog``: a :class:`~epochstream.catalog.Catalog`, a path, or ``None`` (the default
      catalog); :attr:`catalog_path` is what to pass to the query's ``catalog`` option;
    - ``host``: interface the publisher and ingest sockets bind to (ports are chosen freely);
    - ``schema``: schema text stored in the catalog (e.g. a Spark DDL string);
    - ``on_published(partition, epoch, rows)``: called on a serving thread after a partition
      completed an epoch (keep it quick);
    - ``max_staged_bytes``: bound on the bytes staged per partition (batches received from
      tasks, not yet committed or discarded); a batch past it is refused;
    - ``publisher_kwargs``: extra keyword arguments for each ``Publisher``;
    - ``security``: ``None`` (plain TCP, the default) or
      ``Security.curve(server_secret=..., allow=...)`` (docs/security.md): the publishers and
      the ingest endpoints become CURVE servers with that key pair (registered in the catalog
      as each partition's ``server_key``; the sink's tasks connect with it and their
      ``clientKey``), clients are authenticated against ``allow`` (``None``: any key), a
      subscriber needs a ``subscribe`` grant on the topic and a task (or the driver-side
      commit) a ``publish`` grant, read from the catalog (re-read every second);
    - ``retention``: a :class:`~epochstream.retention.Retention` to keep each partition's epoch
      log (``None``: no history). Each committed epoch is then written, synced and indexed
      before it completes, and a restarted host resumes each partition from its log: its
      frontier (:meth:`next_epoch`) is the first epoch not yet committed, so a COMMIT of an
      epoch committed before the restart is recognised as a duplicate and publishes nothing
      (COMMIT idempotency survives a restart of the host, not only of the query).

    - ``order``: the topic's order, ``order.TOTAL`` (the default) or ``order.product(k)`` for
      a query writing ``epochColumns`` (k integer columns: docs/spark.md "Event time"); a
      product-order host takes only such queries, and its statistics' ``next_epoch`` and
      ``data_upper`` are ``-1`` (``frontier`` has its antichain).

    :meth:`start` creates the topic (its ``order``, codec ``arrow``) and, per partition, a
    Publisher and an ingest endpoint registered next to it in the catalog. :meth:`pause`
    installs a pause point (see :class:`Pause`) so that a subscriber can attach at a precise
    moment; :meth:`wait_epoch` waits until every partition completed an epoch."""

    def __init__(self, topic: str, *, partitions: int = 2, catalog: Any = None,
                 host: str = "127.0.0.1", schema: str | None = None,
                 on_published: Callable[[int, int, int], None] | None = None,
                 max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES,
                 publisher_kwargs: dict | None = None, retention: Retention | None = None,
                 security: Security | None = None, order: Any = None):
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        publisher_kwargs = dict(publisher_kwargs or {})
        if "security" in publisher_kwargs:  # the publishers and the ingest path share one value
            if security is not None and publisher_kwargs["security"] != security:
                raise ValueError("give security= once: it secures the publishers and the "
                                 "ingest endpoints alike (not also in publisher_kwargs)")
            security = publisher_kwargs.pop("security")
        if security is not None and not isinstance(security, Security):
            raise TypeError(f"security must be a Security or None, got {type(security).__name__}")
        self.security = security if security is not None and security.enabled else None
        if self.security is not None and not self.security.is_server:
            raise ValueError("a SparkPublisherHost's security needs its key pair: "
                             "Security.curve(server_secret=..., allow=...)")
        self.topic = topic
        self.order = TOTAL if order is None else order
        if getattr(self.order, "name", None) != "total" and \
                getattr(self.order, "width", None) is None:
            raise ValueError(f"order must be order.TOTAL or order.product(k), got {order!r}")
        self.partitions = partitions
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.catalog_path = str(self.catalog.path)
        self.bind_host = host
        self.schema = schema
        self.on_published = on_published
        self.max_staged_bytes = max_staged_bytes
        self.publisher_kwargs = publisher_kwargs
        if retention is not None:
            self.publisher_kwargs["retention"] = retention
        if self.security is not None:
            self.publisher_kwargs["security"] = self.security
        self._authz: Authorizer | None = None  # publish grants (security=), made by start()
        self._zctx = zmq.Context()
        self._stop = threading.Event()
        self._pauses: list[Pause] = []
        self._servers = [_PartitionServer(self, i) for i in range(partitions)]
        self._started = self._closed = False
        self._abort_reason: str | None = None

    def start(self) -> SparkPublisherHost:
        """Create the topic and start serving every partition; returns ``self``. Raises
        :class:`IngestError` (after closing) if a partition cannot start, e.g. because a live
        publisher holds it; what the catalog raises creating the topic (after closing), e.g.
        :class:`~epochstream.errors.NotAuthorized` from a secured catalog service for a key
        without a ``publish`` grant."""
        if self._started:
            return self
        self._started = True
        try:
            self.catalog.create_topic(self.topic, order=self.order, codec="arrow",
                                      partitions=self.partitions, schema=self.schema)
        except BaseException:
            self.close()
            raise
        if self.security is not None:  # reads the grants now, then every second
            self._authz = Authorizer(self.topic, self.security, self.catalog)
            self._authz.start(lambda: not self._stop.is_set())
        for s in self._servers:
            s.thread.start()
        for s in self._servers:
            s.ready.wait(30)
            if s.error is not None or not s.ready.is_set():
                self.close()
                raise IngestError(f"partition {s.index} of topic {self.topic!r} failed to start: "
                                  f"{s.error!r}") from s.error
        return self

    def __enter__(self) -> SparkPublisherHost:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Normal exit: :meth:`close`; an exception (``KeyboardInterrupt`` too): :meth:`abort`."""
        if exc_type is None:
            self.close()
        else:
            self.abort(f"{exc_type.__name__}: {exc}")

    def abort(self, reason: str = "aborted") -> None:
        """Stop serving and abort every publisher (see
        :meth:`~epochstream.transport.Publisher.abort`): epochs not completed yet never
        complete, subscribers raise :class:`~epochstream.errors.PublisherAborted`, the catalog
        marks the partitions ``aborted``. Idempotent; after :meth:`close` it does nothing."""
        if not self._closed:
            self._abort_reason = str(reason)
        self.close()

    def close(self) -> None:
        """Stop serving, close every publisher (every epoch published so far completes and
        subscribers see the stream end). A partition whose ingest loop failed is aborted
        instead."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for p in self._pauses:
            p.resume()
        for s in self._servers:
            if s.thread.is_alive():
                s.thread.join(30)
        release_authenticator(self._zctx)  # its sockets live in our context
        self._zctx.term()

    # ---- introspection

    @property
    def endpoints(self) -> list[str | None]:
        """Each partition's publisher endpoint (``None`` until started)."""
        return [s.endpoint for s in self._servers]

    @property
    def ingest_endpoints(self) -> list[str | None]:
        """Each partition's ingest endpoint (``None`` until started)."""
        return [s.ingest for s in self._servers]

    @overload
    def stats(self, partition: None = None) -> list[PartitionStats]: ...

    @overload
    def stats(self, partition: int) -> PartitionStats: ...

    def stats(self, partition: int | None = None) -> PartitionStats | list[PartitionStats]:
        """:class:`PartitionStats` of one partition, or a list for all."""
        if partition is not None:
            return self._servers[partition].stats()
        return [s.stats() for s in self._servers]

    def next_epoch(self) -> int:
        """The smallest partition frontier: every epoch below it is complete everywhere."""
        return min(s.next_epoch for s in self._servers)

    def data_upper(self) -> int:
        """The largest epoch any partition has published data of (``-1``: none)."""
        return max(s.data_upper for s in self._servers)

    def staged_bytes(self, partition: int | None = None) -> int:
        """Bytes staged (received from tasks, neither published nor discarded yet) on one
        partition, or summed over all: what a batch in flight, or the last batch of a killed
        driver, holds in this process (bounded by ``max_staged_bytes`` per partition)."""
        if partition is not None:
            return self._servers[partition].ledger.staged_bytes
        return sum(s.ledger.staged_bytes for s in self._servers)

    def subscribers(self) -> int:
        """Subscribers connected now (the largest count over the partitions' publishers)."""
        return max((s.pub.subscribers for s in self._servers if s.pub is not None), default=0)

    def errors(self) -> list[BaseException]:
        """The exceptions that ended partitions' serving loops (or their start)."""
        return [s.error for s in self._servers if s.error is not None]

    def pause(self, partition: int, epoch: int, stage: str = "data") -> Pause:
        """Install a pause point (see :class:`Pause`); resume it with ``Pause.resume()``."""
        p = Pause(partition, epoch, stage)
        self._pauses.append(p)
        return p

    def wait_epoch(self, epoch: int, timeout: float | None = None) -> bool:
        """Wait until every partition has completed ``epoch``; returns whether it did
        (``False`` after ``timeout`` seconds or once the host stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.next_epoch() <= epoch:
            if self._stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.01)
        return True
