"""Reading durable history: complete epochs of a topic from its partitions' epoch logs, with no
live publisher (the logs' index lives in the catalog; the files are read directly).

>>> import tempfile
>>> from epochstream import Catalog, Publisher, Retention, History
>>> cat = Catalog(tempfile.mkdtemp())
>>> with Publisher("hist-doc", catalog=cat, retention=Retention()) as pub:
...     for day in range(3):
...         pub.send(day, [{"day": day, "n": i} for i in range(2)])
...         _ = pub.advance_to(day + 1)
>>> [(e.time, len(e.records)) for e in History("hist-doc", catalog=cat).epochs(since=1)]
[(1, 2), (2, 2)]

Where the bytes come from (``source``, default ``$EPOCHSTREAM_HISTORY_SOURCE`` or ``"auto"``):
``"disk"`` reads the segment files (the log's directory must be readable here); ``"publisher"``
asks the partition's live publisher on its endpoint (:mod:`epochstream.log.remote`);
``"store"`` reads every epoch whose segment is in the log's object store from there
(``Retention(store=...)``, :mod:`epochstream.log.store`: range reads) and the rest as
``"auto"``; ``"auto"`` reads the files when the log was written on this host and its directory
exists, else the object store for sealed segments, and asks the live publisher for the rest.
The index is always read from the catalog.

Positions (``since``, ``until``) are frontiers (:mod:`epochstream.position`): ``since`` is
inclusive (epochs ``t`` with ``since <= t``), ``until`` exclusive (epochs not at or beyond it),
like timely's and Materialize's ``since``/``upper``. An epoch is served only once it is complete
in every partition's log and retained by every partition, so it is whole or not served.
"""

from __future__ import annotations

import logging
import math
import os
import time as _time
from typing import Any, Iterator

from .. import wire
from ..catalog import Catalog
from ..catalog.holders import HOST
from ..catalog.history import EpochRecord, HistoryState
from ..errors import HistoryCorrupt, HistoryUnavailable
from ..events import Epoch
from ..frontier import Antichain, join
from ..order import linear_extension
from ..position import resolve_position
from .format import check_epoch, read_epoch
from .remote import DEFAULT_TIMEOUT, RemoteLog
from .store import LogStore, open_store

__all__ = ["History", "SOURCES"]

log = logging.getLogger("epochstream.history")

SOURCES = ("auto", "disk", "publisher", "store")
"""Where :class:`History` reads epochs' bytes from (see the module docstring)."""


def _catalog(catalog) -> Catalog:
    if catalog is None or isinstance(catalog, (str, os.PathLike)):
        return Catalog(catalog)
    return catalog


class History:
    """The retained epochs of ``topic`` (``catalog``: a :class:`~epochstream.catalog.Catalog`, a
    path, or ``None`` for the default catalog).

    Raises :class:`~epochstream.errors.TopicNotFound` for an unknown topic. Reading raises
    :class:`~epochstream.errors.HistoryUnavailable` when a partition that has data keeps no log
    or when ``since`` is older than what is retained, and
    :class:`~epochstream.errors.HistoryCorrupt` when a segment fails its checksum (its bytes are
    never returned as data).

    ``source``: ``"auto"``, ``"disk"`` or ``"publisher"`` (module docstring; ``None``: the
    ``EPOCHSTREAM_HISTORY_SOURCE`` environment variable, else ``"auto"``); ``timeout``: seconds a
    remote read may wait for the publisher's answer; ``security``: a client key pair
    (``Security.curve(client_secret=...)``) for reading through secured publishers (their keys
    come from the catalog). Reading through a publisher keeps one connection per partition:
    :meth:`close` them (or use ``with History(...) as h``).

    ``store``: the object store to read sealed segments from (a URI or a
    ``pyarrow.fs.FileSystem``), instead of the one each log recorded in the catalog (needed for
    logs whose publisher was given a FileSystem object). The stores this reader will need are
    opened and probed here: a URI pyarrow cannot open raises ``ValueError``, a missing bucket,
    wrong credentials or an unreachable store :class:`HistoryUnavailable`, one line each —
    except a recorded store of a partition whose files are here or whose publisher is live:
    then a WARNING, and its epochs are read from those instead."""

    def __init__(self, topic: str, catalog=None, *, source: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, security=None, store=None):
        if source is not None and source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES} or None, got {source!r}")
        source = source or os.environ.get("EPOCHSTREAM_HISTORY_SOURCE") or "auto"
        if source not in SOURCES:
            raise ValueError(f"$EPOCHSTREAM_HISTORY_SOURCE must be one of {SOURCES}, got "
                             f"{source!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be seconds > 0, got {timeout!r}")
        self.topic, self.source, self.timeout = topic, source, float(timeout)
        self.security = security
        self.catalog = _catalog(catalog)
        info = self.catalog.lookup(topic)
        self.order = info.order
        self.codec = wire.codec(info.codec)
        self.partitions = info.partitions
        self._remote: dict[int, RemoteLog] = {}
        #: ``{partition: endpoint}`` of publishers known to serve this topic (a subscriber's own
        #: connections): asked for a partition whose log is not readable here and which the
        #: catalog no longer lists as live (its publisher closed, and may still linger)
        self.endpoints: dict[int, str] = {}
        self._stores: dict[str, LogStore] = {}  # by recorded URI, opened once
        self._broken: set[str] = set()  # recorded URIs that failed their probe (not read)
        self._given = None if store is None else open_store(store, write=False)
        self._probe_stores(info)

    # -- object stores ---------------------------------------------------------------------
    def _probe_stores(self, info) -> None:
        """Open (and probe) the stores of the logs this reader would read from a store."""
        if self._given is not None or self.source in ("disk", "publisher"):
            return
        pinfo = {p.index: p for p in info.partition_info}
        for p, state in self.states().items():
            if state.store is not None and state.store not in self._broken \
                    and any(g.object for g in state.segments) \
                    and (self.source == "store" or not self._local(state, pinfo.get(p))):
                try:
                    self._log_store(state.store)
                except (HistoryUnavailable, ValueError) as e:
                    live = getattr(pinfo.get(p), "state", None) == "live"
                    if not live and not self._local(state, pinfo.get(p)):
                        raise
                    log.warning("topic %r: %s; its partitions' epochs are read from their "
                                "files or live publishers instead", self.topic, e)
                    self._broken.add(state.store)

    def _log_store(self, uri: str | None) -> LogStore:
        """The opened store of a log whose catalog row records ``uri``."""
        if self._given is not None:
            return self._given
        if uri is None or uri.startswith("fs:"):
            raise HistoryUnavailable(
                f"topic {self.topic!r}: its publisher was given its object store as a pyarrow "
                f"FileSystem ({uri}); pass History(..., store=...) to read it")
        opened = self._stores.get(uri)
        if opened is None:
            opened = self._stores[uri] = open_store(uri, write=False)
        return opened

    @staticmethod
    def _local(state: HistoryState, pinfo) -> bool:
        """Whether the log's segment files are readable here (written on this host, and its
        directory exists)."""
        return getattr(pinfo, "host", None) in (None, HOST) and os.path.isdir(state.dir)

    def _use_store(self, r: EpochRecord, state: HistoryState | None, pinfo) -> bool:
        """Whether epoch record ``r`` is read from the object store (``source``)."""
        if r.object is None or state is None or self.source in ("disk", "publisher") \
                or state.store in self._broken:
            return False
        return self.source == "store" or not self._local(state, pinfo)

    def _read_store(self, state: HistoryState, r: EpochRecord, files: dict) -> list[bytes]:
        store = self._log_store(state.store)
        where = store.where(r.object)
        try:
            chunks = store.read_extents(r.object, r.extents, files)
            return [pl for _, pl in check_epoch(f"object {where}", where, r, chunks)]
        except OSError as e:
            raise HistoryUnavailable(f"topic {self.topic!r}: the object store {store.uri} cannot "
                                     f"be read ({' '.join(str(e).split())[:300]})") from None
        except HistoryCorrupt:
            self._trimmed(r)
            raise

    def close(self) -> None:
        """Close the connections to publishers that served reads (reading again reopens)."""
        for r in self._remote.values():
            r.close()
        self._remote.clear()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- index -----------------------------------------------------------------------------
    def states(self) -> dict[int, HistoryState]:
        """``{partition: HistoryState}`` of the partitions that keep a log (read now)."""
        return self.catalog.history_states(self.topic)

    def _checked_states(self, states: dict[int, HistoryState] | None = None,
                        info=None) -> dict[int, HistoryState]:
        states = self.states() if states is None else states
        info = self.catalog.lookup(self.topic) if info is None else info
        missing = [p.index for p in info.partition_info
                   if p.index not in states and p.upper]
        if missing:
            raise HistoryUnavailable(
                f"topic {self.topic!r}: partition(s) {missing} sent data but keep no epoch log "
                f"(publish with retention=Retention(...) to keep history)")
        return states

    @property
    def since(self) -> tuple:
        """The earliest position whose epochs are all retained: the join of every partition's
        ``since`` (a tuple of times; the order's minimum when no partition keeps a log)."""
        return self._since(self.states())

    def _since(self, states: dict[int, HistoryState]) -> tuple:
        out: tuple = (self.order.minimum,)
        for s in states.values():
            out = join(self.order, out, s.since)
        return out

    def records(self, since=None, until=None, *, states: dict[int, HistoryState] | None = None,
                info=None) -> list[tuple[Any, list[EpochRecord]]]:
        """``[(time, [EpochRecord per partition with data]), ...]`` of the complete retained
        epochs at or beyond ``since`` and not at or beyond ``until``, in a linear extension of
        the order. ``since=None``: everything retained; ``since`` older than what is retained
        raises :class:`HistoryUnavailable`. ``states`` (:meth:`states`) and ``info``
        (``Catalog.lookup``) just read by the caller spare reading them again (the states are
        read once more after the index, whatever is passed)."""
        order = self.order
        if isinstance(since, str) and since == "earliest":
            since = None
        if isinstance(until, str) and until == "earliest":
            raise ValueError("until='earliest' names no epoch (nothing is before the earliest "
                             "retained one); give a time or a frontier, or None for no bound")
        states = self._checked_states(states, info)
        retained = self._since(states)
        if since is None:
            position = Antichain(order, retained)
        else:
            position = Antichain(order, resolve_position(order, since) or ())
            if not all(Antichain(order, retained).less_equal(a) for a in position):
                raise HistoryUnavailable(
                    f"topic {self.topic!r}: position {list(position)} is older than what is "
                    f"retained (since {list(retained)})", retained=retained)
        stop = None if until is None else Antichain(order, resolve_position(order, until) or ())
        lowers = [Antichain(order, s.lower) for s in states.values()]
        min_t0 = min((a[0] if isinstance(a, tuple) else a) for a in position) if position else None
        by_time: dict[Any, list[EpochRecord]] = {}
        for p in states:
            for r in self.catalog.history_epochs(self.topic, p, min_t0=min_t0):
                by_time.setdefault(r.time, []).append(r)
        # read again: a segment deleted meanwhile must not leave an epoch half served
        after = self.states()
        sinces = [Antichain(order, s.since) for s in after.values()]
        keep = [t for t in by_time
                if position.less_equal(t)
                and (stop is None or not stop.less_equal(t))
                and not any(low.less_equal(t) for low in lowers)
                and all(s.less_equal(t) for s in sinces)]
        return [(t, by_time[t]) for t in linear_extension(order, keep)]

    def payloads(self, records: list[EpochRecord], *,
                 states: dict[int, HistoryState] | None = None,
                 info=None) -> list[tuple[int, bytes]]:
        """``[(partition, encoded payload), ...]`` of one epoch's records (:meth:`read` of one
        epoch). Raises :class:`HistoryUnavailable` if retention deleted the epoch meanwhile (or
        its partition's log is neither readable here nor served by a live publisher),
        :class:`HistoryCorrupt` if its bytes fail the checks. ``states``/``info``: as for
        :meth:`records` (where each partition's log is read from is decided with them)."""
        if not records:
            return []
        for _, _, out in self.read([(records[0].time, records)], states=states, info=info):
            return out
        return []

    def read(self, epochs: list[tuple[Any, list[EpochRecord]]], *,
             states: dict[int, HistoryState] | None = None, info=None
             ) -> Iterator[tuple[Any, list[EpochRecord], list[tuple[int, bytes]]]]:
        """For each ``(time, records)`` of ``epochs`` (as :meth:`records` returns them), in
        order, yield ``(time, records, [(partition, encoded payload), ...])``: the payloads in
        the order they were sent, per partition in the order of ``records``. Files are read and
        checked here (:func:`~epochstream.log.format.read_epoch`); reads through a publisher are
        pipelined (:class:`~epochstream.log.remote.RemoteLog`) and their message counts
        checked against the index. Raises as :meth:`payloads`; ``states``/``info`` as there."""
        epochs = list(epochs)
        states = self.states() if states is None else states
        info = self.catalog.lookup(self.topic) if info is None else info
        pinfo = {p.index: p for p in info.partition_info}
        stored = {(r.partition, t) for t, recs in epochs for r in recs
                  if self._use_store(r, states.get(r.partition), pinfo.get(r.partition))}
        wanted: dict[int, list] = {}
        for t, recs in epochs:
            for r in recs:
                if (r.partition, t) not in stored:
                    wanted.setdefault(r.partition, []).append(t)
        where = self._where(wanted, states, info) if wanted else {}
        streams = {p: self._remote_log(p, w).read(wanted[p])
                   for p, (kind, w) in where.items() if kind == "publisher"}
        files: dict = {}  # objects open for range reads, reused while this read goes on
        try:
            for t, recs in epochs:
                out: list[tuple[int, bytes]] = []
                for r in recs:
                    if (r.partition, t) in stored:
                        got = self._read_store(states[r.partition], r, files)
                    elif r.partition not in streams:
                        got = self._read_local(where[r.partition][1], states, r, files)
                    else:
                        got = next(streams[r.partition])[1]
                        if len(got) != r.messages:
                            raise HistoryCorrupt(
                                f"topic {self.topic!r}: the publisher of partition "
                                f"{r.partition} served {len(got)} messages of epoch {t!r}; "
                                f"the index holds {r.messages}")
                    out.extend((r.partition, pl) for pl in got)
                yield t, recs, out
        finally:
            for f in files.values():
                f.close()

    def _where(self, partitions, states=None, info=None) -> dict[int, tuple[str, str]]:
        """``{partition: ("disk", directory) | ("publisher", endpoint)}`` for ``partitions``
        (``states``/``info`` read now when not given)."""
        states = self.states() if states is None else states
        info = {p.index: p for p in (self.catalog.lookup(self.topic) if info is None
                                     else info).partition_info}
        out = {}
        for p in partitions:
            state, pinfo = states.get(p), info.get(p)
            if state is None:
                raise HistoryUnavailable(f"topic {self.topic!r}: partition {p} keeps no epoch log")
            host = getattr(pinfo, "host", None)
            local = host in (None, HOST) and os.path.isdir(state.dir)
            if self.source == "disk" or (self.source in ("auto", "store") and local):
                out[p] = ("disk", state.dir)
            elif pinfo is not None and pinfo.state == "live":
                out[p] = ("publisher", pinfo.endpoint)
            elif p in self.endpoints:
                out[p] = ("publisher", self.endpoints[p])
            else:
                where = (f"in {state.dir}, which does not exist here" if host in (None, HOST)
                         else f"in {state.dir} on host {host!r}, which this process cannot read")
                raise HistoryUnavailable(
                    f"topic {self.topic!r}: the epoch log of partition {p} is {where}, and no "
                    f"live publisher serves it (partition state: "
                    f"{getattr(pinfo, 'state', 'unregistered')})")
        return out

    def _remote_log(self, partition: int, endpoint: str) -> RemoteLog:
        r = self._remote.get(partition)
        if r is None or r.endpoint != endpoint:
            if r is not None:
                r.close()
            key = next((p.server_key for p in self.catalog.lookup(self.topic).partition_info
                        if p.index == partition), None) if self.security is not None else None
            if self.security is not None and self.security.server_public is not None:
                key = self.security.server_public
            r = self._remote[partition] = RemoteLog(endpoint, self.topic, partition,
                                                    timeout=self.timeout, security=self.security,
                                                    server_key=key)
        return r

    def _read_local(self, directory: str, states, r: EpochRecord, files: dict) -> list[bytes]:
        """``r``'s payloads from the segment file; if the file is missing or fails its checks
        and the epoch is in the log's object store too (``source`` not ``"disk"``), from there."""
        try:
            return self._read_disk(directory, r)
        except HistoryCorrupt:
            state = states.get(r.partition)
            if r.object is None or state is None or self.source == "disk":
                raise
            return self._read_store(state, r, files)

    def _read_disk(self, directory: str, r: EpochRecord) -> list[bytes]:
        try:
            return [payload for _, payload in read_epoch(directory, r)]
        except HistoryCorrupt:
            self._trimmed(r)
            raise

    def _trimmed(self, r: EpochRecord) -> None:
        """After ``r``'s bytes failed: raise :class:`HistoryUnavailable` if retention deleted
        its epoch meanwhile (else the caller raises the :class:`HistoryCorrupt`)."""
        state = self.catalog.history_state(self.topic, r.partition)
        if state is not None and not Antichain(self.order, state.since).less_equal(r.time):
            raise HistoryUnavailable(
                f"topic {self.topic!r}: epoch {r.time!r} of partition {r.partition} was "
                f"deleted by retention while being read (retained since "
                f"{list(state.since)})", retained=tuple(state.since)) from None

    # -- epochs ----------------------------------------------------------------------------
    def epochs(self, since=None, until=None) -> Iterator[Epoch]:
        """Yield the complete retained :class:`~epochstream.events.Epoch`\\ s at or beyond
        ``since`` and not at or beyond ``until`` (frontiers: a time, a list of times, or
        ``None``), whole, in an order consistent with the partial order; ``records`` combined
        across partitions as a live subscriber gets them (a list, or a ``pyarrow.Table``),
        ``first_seen`` the time the epoch completed in the log, ``released_at`` now."""
        decode, combine = self.codec.decode, self.codec.combine
        for t, recs, payloads in self.read(self.records(since, until)):
            chunks = [decode(p) for _, p in payloads]
            nbytes = sum(r.nbytes for r in recs)
            yield Epoch(t, combine(chunks), len(chunks), nbytes,
                        max(r.completed_at for r in recs), _time.time())

    def to_arrow(self, since=None, until=None):
        """The retained epochs (as :meth:`epochs`) as one ``pyarrow.Table`` with two more
        columns: ``_epoch`` (the time; a list of ints for product orders) and ``_partition``.
        For Arrow topics only (raises ``TypeError`` for msgpack topics)."""
        import pyarrow as pa

        if self.codec.name != "arrow":
            raise TypeError(f"topic {self.topic!r} uses codec {self.codec.name!r}; to_arrow() "
                            f"needs an Arrow topic (iterate epochs() instead)")
        tables = []
        for t, recs, payloads in self.read(self.records(since, until)):
            for partition, payload in payloads:
                table = self.codec.combine([self.codec.decode(payload)])
                n = table.num_rows
                epoch = list(t) if isinstance(t, tuple) else t
                table = table.append_column("_epoch", pa.array([epoch] * n))
                table = table.append_column("_partition", pa.array([partition] * n, pa.int32()))
                tables.append(table)
        if not tables:
            return pa.table({"_epoch": pa.array([], pa.int64()),
                             "_partition": pa.array([], pa.int32())})
        return pa.concat_tables(tables, promote_options="default")
