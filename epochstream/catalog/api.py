"""The catalog's one interface, :class:`Catalog`, and which implementation serves a location.

``Catalog(location)`` opens the catalog at ``location`` and returns the implementation that
serves it; each implements every method below, with the same arguments, results and errors:

============================================  ==============================================
``location``                                  implementation
============================================  ==============================================
``None``                                      ``$EPOCHSTREAM_CATALOG`` if set, else
                                              ``./.epochstream/catalog.sqlite``
a path (``str`` or ``os.PathLike``),          :class:`~epochstream.catalog.sqlcatalog.SqlCatalog`
``sqlite:///path``                            on a SQLite file (embedded, the default)
``postgresql://user:pw@host:port/db?...``     :class:`~epochstream.catalog.sqlcatalog.SqlCatalog`
(also ``postgres://``)                        on a PostgreSQL database (psycopg 3)
``tcp://host:port``                           :class:`~epochstream.catalog.client.RemoteCatalog`,
                                              a client of ``epochstream catalog serve``
============================================  ==============================================

Any other ``scheme://`` is refused with :class:`~epochstream.errors.CatalogError` naming the
schemes this version knows (it is never taken for a directory name).

Locations (:func:`location_kind`, :func:`resolve_path`, :class:`CatalogURL`, ...) are
:mod:`epochstream.catalog.locations`, importable from here too. The implementations register
themselves here (:func:`implementation`); this module imports none of them, so nothing below it
imports back up (the registry: :mod:`epochstream.catalog.registry`). The package names the
module of each kind (:func:`implemented_in`), imported on the first ``Catalog(location)`` of
that kind: a program on a SQLite file never loads the network client, and
``import epochstream`` loads no implementation.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..security import Grant
from .locations import (DEFAULT_DIR, DEFAULT_FILE, ENV_VAR, HOME_VAR, SCHEMES, URL_SCHEME,
                        CatalogURL, default_catalog_path, is_catalog_url, local_home,
                        location_kind, resolve_path)
from .records import TopicInfo
from .registry import implementation, implemented_in, implementing

if TYPE_CHECKING:  # what the operations return, in annotations only (their modules load with
    # an implementation or a caller that uses them, not with the interface)
    from .group_records import Claimed, ClaimView, GroupEpoch, GroupInfo
    from .history_records import DurableInfo, EpochRecord, HistoryState

__all__ = ["Catalog", "ENV_VAR", "DEFAULT_DIR", "DEFAULT_FILE", "POLL_INTERVAL_S", "URL_SCHEME",
           "SCHEMES", "OPERATIONS", "default_catalog_path", "is_catalog_url", "location_kind", "resolve_path",
           "implementation", "implemented_in", "local_home", "HOME_VAR", "CatalogURL"]

POLL_INTERVAL_S = 0.05
"""Seconds between two reads of the catalog while :meth:`Catalog.lookup` waits."""

OPERATIONS: set[str] = set()
"""The names of the interface's operations (every implementation defines each one)."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _operation(method: _F) -> _F:
    """Mark ``method`` as an operation of the interface (its docstring is the contract)."""
    OPERATIONS.add(method.__name__)
    return method


class Catalog:
    """The topic catalog: where publishers announce their partitions and subscribers find them,
    plus the index of durable history, durable subscriptions, consumer groups and grants.

    ``Catalog(location=None, **options)`` returns the implementation for ``location`` (module
    docstring); ``options`` are that implementation's (e.g. ``timeout=``, ``lease=``,
    ``security=`` of :class:`~epochstream.catalog.client.RemoteCatalog`). Every implementation
    is safe to share between threads and usable after ``fork()`` in the child, and may be
    closed (:meth:`close`, or ``with Catalog(...) as cat:``).

    :attr:`path` names the catalog: a :class:`~pathlib.Path` for SQLite, a ``str`` subclass
    (the URL) otherwise, whose ``parent`` is a local directory standing for the catalog's
    directory (the default home of epoch logs, ``Retention(dir=None)``).

    Raises :class:`CatalogError` for an unknown URL scheme or a location that cannot be opened
    (see each implementation)."""

    path: Any
    lease: float | None = None
    """Seconds of the lease a partition registered through this catalog holds (its publisher
    renews it, :mod:`epochstream.transport.lease_keeper`), or ``None``: liveness by pid."""

    def __new__(cls, location: Any = None, *args: Any, **kwargs: Any) -> "Catalog":
        if cls is Catalog:
            cls = implementing(location_kind(os.environ.get(ENV_VAR) if location is None
                                             else location))
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that derives from :class:`Catalog` directly must define every operation
        (itself or through its other bases): checked when the class is made, so a missing one
        fails at import, not at the first call."""
        super().__init_subclass__(**kwargs)
        if Catalog in cls.__bases__:
            missing = sorted(n for n in OPERATIONS if getattr(cls, n) is getattr(Catalog, n))
            if missing:
                raise TypeError(f"{cls.__name__} does not implement the catalog operations "
                                f"{', '.join(missing)}")

    @property
    def where(self) -> str:
        """The catalog's name for messages: its file, or its URL without a password."""
        return str(self.path)

    def close(self) -> None:
        """Release what this object holds (connections, leases it renews). Idempotent."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- topics and partitions, grants

    @_operation
    def create_topic(self, topic: str, *, order: Any = "total", codec: str = "msgpack",
                     partitions: int = 1, schema: str | None = None,
                     partition_key: str | None = None) -> TopicInfo:
        """Define ``topic`` and return its :class:`TopicInfo`.

        - ``order``: an order object (anything with ``.name``, e.g. ``order.TOTAL``,
          ``order.product(2)``) or its name (``"total"``, ``"product(n)"``); stored by name;
        - ``codec``: payload codec name (``"msgpack"``, ``"arrow"``);
        - ``partitions``: number of partitions, an int ``>= 1``;
        - ``schema``: optional ``str`` describing the payload (e.g. an Arrow schema as text/JSON);
        - ``partition_key``: a key column for a key-partitioned topic (records go to the
          partition :func:`epochstream.partitioning.partition_of` their key), else ``None``.

        Idempotent: if the topic exists with the identical definition nothing changes. Raises
        :class:`CatalogError` if it exists with a different definition (the message names both),
        or if an argument is invalid (unknown order name, ``partitions < 1``, empty names)."""

    @_operation
    def drop_topic(self, topic: str) -> None:
        """Delete ``topic`` and all its partition rows. Raises :class:`TopicNotFound` if absent."""

    @_operation
    def topics(self) -> list[TopicInfo]:
        """All topics with their registered partitions, sorted by name (liveness judged now)."""

    @_operation
    def lookup(self, topic: str, wait: float = 0.0) -> TopicInfo:
        """Return ``topic``'s :class:`TopicInfo`, waiting up to ``wait`` seconds for it.

        Polls every ~50 ms until the topic exists *and* each of its partitions is registered
        with state ``live``, ``closed`` or ``aborted`` (a ``dead`` holder is waited on, in the
        hope that it is replaced; ``aborted``, like ``closed``, is a publisher's own final word
        and is returned at once), or until ``wait`` seconds have passed (``0`` = look once).

        Raises :class:`TopicNotFound` (its ``existing`` lists the known topic names, sorted) if
        the topic still does not exist. If the topic exists but is incomplete when the wait ends,
        returns what exists: ``partition_info`` then lists only the registered partitions
        (including ``dead`` ones), sorted by index — check :attr:`TopicInfo.complete`, or use
        :attr:`TopicInfo.endpoints`, which raises."""

    @_operation
    def register_partition(self, topic: str, partition: int, endpoint: str, *,
                           ingest: str | None = None, pid: int | None = None,
                           incarnation: str | None = None, upper: Any = (),
                           lease: float | None = None, host: str | None = None,
                           pid_start: float | None = None, server_key: str | None = None) -> str:
        """Claim ``partition`` of ``topic`` for the publisher at ``endpoint``; return its incarnation.

        - ``partition``: int, ``0 <= partition < partitions`` (else :class:`CatalogError`);
        - ``endpoint``/``ingest``: ZeroMQ endpoints (``ingest`` optional);
        - ``pid``: the publisher's process id, default ``os.getpid()``;
        - ``incarnation``: id of this publisher run, default a fresh ``uuid4().hex``;
        - ``upper``: the partition's initial upper frontier, stored in the row's ``upper`` column
          (an iterable of times: ints, or tuples of ints for product orders; read back as a
          tuple of times in :attr:`PartitionInfo.upper`). Default ``()``: nothing sent yet;
        - ``lease``: seconds, or ``None`` (the default). With a lease the partition is alive
          while ``updated_at + lease`` has not passed: its holder renews it with
          :meth:`heartbeat` (:meth:`record_upper` renews it too), and its pid is not checked
          (the network catalog's client registers this way, :mod:`epochstream.catalog.client`);
        - ``host``, ``pid_start``: the publisher's machine and process start time (default:
          this machine, and the start time of ``pid`` here);
        - ``server_key``: the publisher's CURVE public key (40 Z85 characters) when it serves
          with ``security=``, else ``None`` (:attr:`PartitionInfo.server_key`).

        Sets state ``live``, stores ``upper``, stamps ``updated_at = time.time()``. Raises
        :class:`TopicNotFound` if the topic does not exist, :class:`PartitionHeld` if a
        *live* publisher (state ``live`` and its process still running) with a different
        incarnation holds the partition, and :class:`CatalogError` for an invalid argument
        (including an ``upper`` that is not an iterable of int times). A dead, closed or aborted
        holder is replaced. Re-registering with the same incarnation overwrites the row (its
        ``upper`` too)."""

    @_operation
    def close_partition(self, topic: str, partition: int, incarnation: str,
                        upper: Any = (), *, aborted: bool = False) -> bool:
        """Mark ``partition`` of ``topic`` finished, storing its final upper frontier ``upper``
        in the row's ``upper`` column (an iterable of times: ints, or tuples of ints for product
        orders; read back as a tuple of times in :attr:`PartitionInfo.upper`).

        The state becomes ``closed`` (finished cleanly), or ``aborted`` if ``aborted=True`` (the
        publisher stopped on an error: epochs it had sent data for but not completed will never
        complete). Only acts if the stored incarnation is ``incarnation`` (whatever
        the current state); otherwise (replaced by another publisher, or topic dropped) it is a
        no-op. Returns whether a row was updated (callers may ignore it). ``updated_at`` becomes
        ``time.time()``. Raises :class:`CatalogError` if ``upper`` is not an iterable of int
        times or the file cannot be written."""

    @_operation
    def record_upper(self, topic: str, partition: int, incarnation: str, upper: Any) -> bool:
        """Store ``upper`` as the current upper frontier of ``partition`` of ``topic`` (the row's
        ``upper`` column; same encoding as :meth:`close_partition`: an iterable of times, ints or
        tuples of ints; read back as a tuple of times in :attr:`PartitionInfo.upper`), and stamp
        ``updated_at = time.time()`` (seconds).

        Only acts if the row is still held by ``incarnation`` *and* its stored state is ``live``;
        returns whether a row was updated (``False``: replaced by another incarnation, already
        closed/aborted, or topic dropped — nothing is changed then).

        Meant for a publisher's hot path (called once per new maximal data time, before that
        data leaves the process), so it is one ``UPDATE`` in one autocommit transaction on a
        connection kept open per thread, with ``synchronous=NORMAL``: durable once it returns
        against a crash of the calling process, not against power loss (see :meth:`_hot`).
        About 30-40 µs per call on a local SSD. Raises :class:`CatalogError` if ``upper`` is
        invalid or the file cannot be written (e.g. locked by another writer for longer than
        the busy timeout of 5 s)."""

    @_operation
    def heartbeat(self, topic: str, partition: int, incarnation: str) -> bool:
        """Stamp ``updated_at = time.time()`` (seconds) on ``partition`` of ``topic`` if it is
        still held by ``incarnation`` (this renews its lease, if it has one). Returns whether it
        was (``False``: replaced or dropped)."""

    @_operation
    def grant(self, principal: str, topic_pattern: str, op: str) -> Grant:
        """Let ``principal`` (a client's CURVE public key in Z85, the name of its certificate in
        a publisher's ``allow`` directory, or ``"*"``: any authenticated peer) do ``op``
        (``"subscribe"``, ``"publish"`` or ``"admin"``, which implies the others) on every topic
        matching ``topic_pattern`` (``fnmatch``: ``*``, ``?``, ``[seq]``; case-sensitive).
        Returns the :class:`~epochstream.security.Grant`. Idempotent. Secured publishers see a
        new grant within about a second (:data:`~epochstream.security.GRANTS_REFRESH_S`).
        Raises :class:`CatalogError` for an invalid argument."""

    @_operation
    def revoke(self, principal: str, topic_pattern: str | None = None,
               op: str | None = None) -> int:
        """Delete ``principal``'s grants: those with exactly this ``topic_pattern`` (``None``:
        every pattern) and ``op`` (``None``: every op). Returns how many were deleted. A secured
        publisher drops a subscriber it no longer authorises within about a second. Raises
        :class:`CatalogError` for an invalid argument."""

    @_operation
    def grants(self, topic: str | None = None, principal: str | None = None) -> list[Grant]:
        """The grants, sorted by principal, pattern and op: all of them, or those whose pattern
        matches ``topic`` (``fnmatch.fnmatchcase``) and/or that name ``principal``."""


    # ---- the epoch log index and durable subscriptions

    @_operation
    def history_state(self, topic: str, partition: int) -> HistoryState | None:
        """The :class:`HistoryState` of ``partition`` of ``topic``, or ``None`` if it keeps no
        log."""

    @_operation
    def history_states(self, topic: str) -> dict[int, HistoryState]:
        """``{partition: HistoryState}`` for every partition of ``topic`` that keeps a log."""

    @_operation
    def history_begin(self, topic: str, partition: int, directory: str, lower: Any,
                      upper: Any, store: str | None = None) -> HistoryState:
        """Start the log of ``partition`` of ``topic`` in ``directory`` if it has none (since =
        ``lower``, segment 0) and return its :class:`HistoryState`. An existing log is returned
        unchanged; raises :class:`CatalogError` if it lives in another directory — unless
        ``store`` is the store it records: then the log moves to ``directory`` (another host;
        its segments come from the store). ``store``: the URI (no credentials) of the object
        store, recorded for readers; :class:`CatalogError` if segments are in another."""

    @_operation
    def history_uploaded(self, topic: str, partition: int, segment: int, name: str,
                         nbytes: int, incarnation: str | None = None) -> tuple[bool, str | None]:
        """Index the object ``name`` (under the store's root), which holds the first ``nbytes``
        bytes of ``segment`` whole, as that segment's object — called only after the upload
        completed. Returns ``(indexed, replaced)``: ``indexed`` False if the segment was
        trimmed meanwhile, has fewer committed bytes, or an object holding as many is indexed
        already (the caller deletes its object unless it is that one); ``replaced``: the name
        of the shorter object it replaces (the caller deletes it), or, not indexed, the object
        indexed for the segment; ``None`` if none. ``incarnation``: as for
        :meth:`history_commit` for a chain (``"tails:…"``, ``log.store.tails_object``: it may
        cover uncommitted bytes and replaces a chain), else refused only while another lives."""

    @_operation
    def history_commit(self, topic: str, partition: int, *, epochs: list[EpochRecord],
                       lower: Any, upper: Any, segment: int, committed: int,
                       roll_to: int | None = None, durable: bool = True,
                       incarnation: str | None = None) -> None:
        """Index ``epochs`` (complete, written to ``segment``) and record the log's ``lower``
        and ``upper`` frontiers and ``committed`` bytes of ``segment``, in one transaction.
        ``roll_to``: the next segment's number, started now with ``since = lower``.
        ``durable=False`` commits without an fsync of the catalog (``Retention.fsync="none"``).
        ``incarnation``: the writing publisher's; the commit is refused with
        :class:`~epochstream.errors.Fenced` (nothing applied) if the partition's row names
        another (a newer generation registered, live or ended since: the writer is a zombie).
        An epoch indexed already is neither written nor counted again (a retried commit)."""

    @_operation
    def history_trim(self, topic: str, partition: int, keep_from: int,
                     holder: str | None = None) -> tuple[tuple, list[str]]:
        """Forget the segments of ``partition`` numbered below ``keep_from`` (their epochs'
        index rows too) and move the log's ``since`` to the ``since`` of segment ``keep_from``;
        durable subscriptions of ``topic`` whose position is no longer retained are marked
        expired, and consumer groups stopped, in the same transaction. Returns ``(since, names
        of the newly expired)`` (groups as ``"group:<name>"``); the caller deletes the files
        and objects afterwards. ``holder``: the caller as holder of the retention lease
        (:meth:`retention_acquire`), else :class:`~epochstream.errors.Fenced`, nothing changed
        (``None``: unchecked; the library passes one)."""

    @_operation
    def retention_acquire(self, topic: str, partition: int, holder: str, *, lease: float,
                          pid: int | None = None, pid_start: float | None = None,
                          host: str | None = None) -> tuple[bool, str]:
        """Take or renew ``partition``'s retention lease for ``holder`` (a non-empty str), for
        ``lease`` seconds on the catalog's clock, as process ``pid`` (started ``pid_start``) on
        ``host`` (default: this process). ``(True, holder)`` if it holds it now; ``(False,
        who)`` while another's lease has not lapsed (or no topic); CatalogError: bad input."""

    @_operation
    def retention_release(self, topic: str, partition: int, holder: str) -> bool:
        """Give up ``holder``'s retention lease of ``partition`` (True if it held it)."""
    @_operation
    def retention_record(self, topic: str, limits: dict) -> None:
        """Record ``topic``'s limits ``{"max_bytes", "max_age", "max_epochs": number or None}``
        (what ``epochstream retention run`` applies); CatalogError for a bad value."""
    @_operation
    def retention_limits(self, topic: str) -> dict | None:
        """``topic``'s recorded retention limits (:meth:`retention_record`), or ``None``."""

    @_operation
    def history_epochs(self, topic: str, partition: int, *, min_t0: int | None = None,
                       segment_from: int | None = None, after: Any = None,
                       limit: int | None = None) -> list[EpochRecord]:
        """The index entries of ``partition`` of ``topic`` (every complete retained epoch with
        data), sorted by time's first component, then by its stored text (a total order of the
        index, not a linear extension of a product order); ``min_t0`` keeps only times whose
        first component (the time itself for a total order) is ``>= min_t0``. A page: at most
        ``limit`` (a positive int) entries, after the time ``after`` in that order (the next
        page: ``after`` the last entry of this one; none skipped or repeated, however many
        times share a first component). :class:`CatalogError` for a ``limit`` that is not a
        positive int or an ``after`` that is not a time."""

    @_operation
    def history_epoch(self, topic: str, partition: int, time: Any) -> EpochRecord | None:
        """The index entry of epoch ``time`` of ``partition`` of ``topic`` (complete, retained,
        with data in that partition), or ``None``. One primary-key lookup."""

    @_operation
    def durables(self, topic: str | None = None) -> list[DurableInfo]:
        """Every durable subscription (of ``topic``, if given), sorted by topic and name."""

    @_operation
    def durable(self, topic: str, name: str) -> DurableInfo | None:
        """The durable subscription ``name`` of ``topic``, or ``None``."""

    @_operation
    def durable_claim(self, topic: str, name: str, holder: str, *,
                      takeover: bool = False, pid: int | None = None,
                      pid_start: float | None = None, host: str | None = None,
                      lease: float | None = None) -> DurableInfo:
        """Hold the durable subscription ``name`` of ``topic`` for ``holder`` (a subscriber id),
        creating it (position ``None``) on first use. Raises :class:`TopicNotFound`,
        :class:`SubscriptionExpired` (it expired: reset it first), or :class:`SubscriptionHeld`
        if another live holder has it and ``takeover`` is false (a holder whose process is gone
        is replaced).

        ``pid``/``pid_start``/``host``: the holder's process (default: this one); ``lease``:
        seconds the hold lasts without a renewal (:meth:`durable_renew`, or an ack), or ``None``
        (the default: the holder is alive while its process runs). The network catalog's
        client passes its own process and a lease."""

    @_operation
    def durable_ack(self, topic: str, name: str, holder: str, position: Any,
                    acked: Any = ()) -> bool:
        """Store ``position`` (a frontier) and ``acked`` (times at or beyond it acked out of
        order) as the acked state of ``name`` if ``holder`` still holds it and it is active;
        returns whether it did (``False``: taken over, expired, reset or dropped — the fencing
        check). An ack renews the holder's lease, if it has one."""

    @_operation
    def durable_release(self, topic: str, name: str, holder: str) -> None:
        """Let go of ``name`` if ``holder`` holds it (a closing subscriber)."""

    @_operation
    def durable_renew(self, topic: str, name: str, holder: str) -> bool:
        """Renew ``holder``'s lease on ``name`` (stamp ``holder_seen = time.time()``); returns
        whether ``holder`` still holds it (``False``: taken over, reset, released or dropped)."""

    @_operation
    def durable_reset(self, topic: str, name: str, position: Any | None) -> DurableInfo:
        """Re-arm ``name`` at ``position`` (a frontier, or ``None``: resolved by the next
        subscriber's ``start``), active and free (like Materialize's ``RESET``). Raises
        :class:`CatalogError` if there is no such durable subscription."""

    @_operation
    def durable_drop(self, topic: str, name: str) -> bool:
        """Delete ``name``; returns whether it existed."""


    # ---- consumer groups

    @_operation
    def group_open(self, topic: str, name: str, *, mode: str, ack_wait: float,
                   max_deliver: int, dead_letter: str | None) -> GroupInfo:
        """Create the group ``name`` of ``topic`` or check that the existing one has the same
        definition (:class:`CatalogError` naming both otherwise); return its :class:`GroupInfo`."""

    @_operation
    def group_info(self, topic: str, name: str) -> GroupInfo:
        """The :class:`GroupInfo` of group ``name`` (:class:`CatalogError` if there is none)."""

    @_operation
    def groups(self, topic: str | None = None) -> list[GroupInfo]:
        """Every consumer group (of ``topic``, if given), sorted by topic and name."""

    @_operation
    def group_drop(self, topic: str, name: str) -> bool:
        """Delete group ``name`` and its state; returns whether it existed."""

    @_operation
    def group_epochs(self, topic: str, name: str) -> list[GroupEpoch]:
        """Every unit stored for group ``name`` of ``topic`` (those at or beyond its position:
        settled units behind it are forgotten), as :class:`GroupEpoch` rows in no particular
        order; ``[]`` for an unknown group. Read-only."""

    @_operation
    def group_claim(self, topic: str, name: str, worker: str, decide: Callable[[dict, float], Any],
                    ) -> tuple[list[Claimed], list[Claimed], tuple | None]:
        """In one transaction: read the group's epoch states, call ``decide(states, now,
        stored_position)`` (the position stored now: epochs not at or beyond it are settled and
        their rows may be forgotten, so the decision must ignore them) →
        ``(plan, position)`` (a :class:`~epochstream.leases.Plan` and the new position or
        ``None``), lease ``plan.lease`` to ``worker`` (new fencing tokens, deadline now +
        ack_wait, deliveries + 1) and lease ``plan.exhausted`` to it too, for dead-lettering
        (deliveries unchanged; settle them with ``outcome="dead"`` once they are in the
        dead-letter topic, or they are offered again when the lease ends). Returns ``(claimed,
        exhausted, position)``. Acked or dead rows not at or beyond the new
        position are forgotten. Raises :class:`GroupStopped` if the group stopped."""

    @_operation
    def group_claim_read(self, topic: str, name: str) -> ClaimView:
        """The first half of a :meth:`group_claim` decided by the caller (the network catalog's
        client, whose ``decide`` cannot cross the network): the group's epoch states, the
        time and the stored position, with their fingerprint. Raises as :meth:`group_claim`."""

    @_operation
    def group_claim_apply(self, topic: str, name: str, worker: str, lease: Any, exhausted: Any,
                          position: Any, fingerprint: str, *, pid: int | None = None,
                          pid_start: float | None = None, host: str | None = None
                          ) -> tuple[list[Claimed], list[Claimed], tuple | None] | None:
        """The second half: in one transaction, if the group's states and stored position still
        have ``fingerprint`` (:meth:`group_claim_read`), lease the units ``lease`` and
        ``exhausted`` (as a :class:`~epochstream.leases.Plan`) to ``worker`` (process ``pid``,
        ``pid_start``, ``host``; default this one) and store ``position`` (or ``None``), exactly
        as :meth:`group_claim` does, and return its result; if anything changed in between,
        change nothing and return ``None`` (read and decide again). Raises as
        :meth:`group_claim`, and :class:`CatalogError` for malformed units."""

    @_operation
    def group_settle(self, topic: str, name: str, unit: tuple, token: int, *, outcome: str,
                     delay: float = 0.0) -> float:
        """Settle the lease ``token`` of ``unit`` ``(time, bucket)``: ``outcome`` ``"ack"`` (acked),
        ``"dead"`` (dead-lettered), ``"nak"`` (free again after ``delay`` seconds) or
        ``"extend"`` (deadline moved to now + ack_wait; returns the new deadline). Raises
        :class:`LeaseExpired` if the lease is no longer held by that token or its deadline
        passed (fencing: an epoch is never completed twice)."""

    @_operation
    def group_stop(self, topic: str, name: str, reason: str) -> None:
        """Stop the group (every later fetch raises :class:`GroupStopped`)."""

    @_operation
    def group_reset(self, topic: str, name: str) -> None:
        """Re-activate a stopped group (its exhausted epochs are leased again)."""
