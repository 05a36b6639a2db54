"""Writing one partition's epoch log (the file format: :mod:`epochstream.log.format`), indexed
in the catalog (timely-dataflow's capture/replay idea: ``capture/event.rs`` writes a stream's
``Messages`` and ``Progress`` events to any ``Write``; our ``D`` and ``F`` frames are those
events).

:class:`LogWriter`, driven by the publisher's loop thread: each data message appends a ``D``
record, and the writer remembers, per open epoch, where its records are. Each frontier change
appends its ``F`` record; when the changes the loop has at hand are written, one
:meth:`LogWriter.commit` ``fsync``\\ s (policy ``Retention.fsync``) and indexes the epochs they
complete and the new frontiers in one catalog transaction (a group commit) — all *before* the
loop sends those ``F`` messages, so an epoch a subscriber sees complete is always in the log.
A segment is closed at the first epoch boundary after it reached ``segment_bytes`` (or after
its oldest epoch is older than ``max_age``: :func:`~epochstream.retention.segment_aged`) at
which no open epoch has records in it, so every epoch lives in exactly one segment and deleting
a segment removes whole epochs. Retention
(:func:`~epochstream.retention.segments_to_delete`) then deletes the oldest whole segments: at
each commit, when a log is opened, and, for the age limit, when the publisher's loop calls
:meth:`LogWriter.expire` while it commits nothing (an idle publisher) — only while the writer
holds the partition's retention lease (:class:`~epochstream.log.retainer.RetentionLease`:
taken at :meth:`LogWriter.open`, renewed as it commits, released at :meth:`LogWriter.close`;
the limits are recorded in the catalog for ``epochstream retention run``).

A new publisher on a partition whose logged stream *finished* (closed: empty lower frontier)
continues the same log with later epochs (the publisher decides where it starts: after the
logged upper frontier), so nothing of the finished stream is lost.

Recovery (:meth:`LogWriter.open`): the tail of the current segment beyond the index's
``committed`` offset (records of epochs that never completed, or a record cut by a crash) is
truncated, and later segment files are removed, with a log line saying how many bytes.
"""

from __future__ import annotations

import logging
import os
import time as _time
import uuid
import zlib
from pathlib import Path
from typing import Any

from ..catalog.history import EpochRecord, HistoryState
from ..errors import CatalogError, Fenced, HistoryCorrupt, HistoryWriteError
from ..frontier import Antichain
from ..retention import Retention, SegmentStat, segment_aged, segments_to_delete

from .format import RECORD_HEADER, _D, _F, _HLEN, _U32, segment_path
from .retainer import ORPHAN_SWEEP, RetentionLease

__all__ = ["LogWriter", "UPLOADS_AT_CLOSE"]

UPLOADS_AT_CLOSE = 30.0
"""Seconds a closing publisher waits for its uploads to the store (the rest: its successor)."""

log = logging.getLogger("epochstream.history")

class _Open:
    """Where an open epoch's records are: extents in the current segment, bytes, crc."""

    __slots__ = ("extents", "nbytes", "messages", "crc")

    def __init__(self) -> None:
        self.extents: list[list[int]] = []
        self.nbytes = 0
        self.messages = 0
        self.crc = 0


class LogWriter:
    """Writes one partition's epoch log and indexes it in ``catalog``.

    ``LogWriter(catalog, topic, partition, order, retention, directory)`` — call :meth:`open`
    first (recovery), then :meth:`data` for every data message and :meth:`frontier` (or
    :meth:`frontier_write` and, for a group, one :meth:`commit`) for every lower frontier change,
    in the order the publisher sends them. Not thread-safe: one thread drives it (the
    publisher's loop thread). Every failure to write, sync or index raises
    :class:`~epochstream.errors.HistoryWriteError` and leaves the writer failed (every later
    call raises too): the publisher must not complete epochs it could not log.
    """

    def __init__(self, catalog, topic: str, partition: int, order, retention: Retention,
                 directory: str | os.PathLike):
        self.catalog, self.topic, self.partition, self.order = catalog, topic, partition, order
        self.retention = retention
        self.dir = Path(directory).absolute()
        self._open: dict[Any, _Open] = {}
        self._file: Any = None
        self._failed: BaseException | None = None
        self._pending: tuple | None = None  # (lower, upper) written, not committed yet
        self._frontiers: tuple = ((), ())  # (lower, upper) as last committed
        self._oldest: float | None = None  # when the oldest epoch of the open segment completed
        self.state: HistoryState | None = None
        self.incarnation: str | None = None  # the writer's: a newer one fences its commits
        #: the :class:`~epochstream.log.uploader.Uploader` of sealed segments (``store=``)
        self.uploader: Any = None
        #: the :class:`~epochstream.log.tails.TailChain` of ``upload="frontier"`` (or ``None``)
        self.tails: Any = None
        self._committed = 0  # bytes of the segment being written the index covers
        self._tail_sent = 0  # of those, bytes handed to the uploader at a close
        self.lease: RetentionLease | None = None  # the partition's retention lease (open())
        self._swept = 0.0  # time.time() of the last orphan sweep handed to the uploader

    # -- lifecycle -------------------------------------------------------------------------
    def open(self, lower: tuple, upper: tuple) -> HistoryState:
        """Create the log (``since = lower``) or recover an existing one: truncate the current
        segment's tail beyond the committed offset, remove segment files past it. Returns the
        :class:`HistoryState` (its ``lower``/``upper``: where a restarted publisher resumes)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            store = None if self.uploader is None else self.uploader.store.uri
            state = self.catalog.history_begin(self.topic, self.partition, str(self.dir),
                                               lower, upper, store=store)
            path = segment_path(self.dir, state.segment)
            size = path.stat().st_size if path.exists() else 0
            if size > state.committed:
                log.warning("epoch log %s/%s: truncating %d bytes of %s beyond the last indexed "
                            "frontier %s (epochs that never completed, or a record cut by a "
                            "crash)", self.topic, self.partition, size - state.committed, path,
                            list(state.lower))
            elif size < state.committed:
                self._fetch(path, size, state)
            self._file = open(path, "ab")
            self._file.truncate(state.committed)
            self._file.seek(state.committed)
            for p in self.dir.glob("*.eslog"):
                try:
                    seq = int(p.stem)
                except ValueError:
                    continue
                if seq > state.segment or seq < state.segments[0].seq:  # (trimmed meanwhile)
                    log.warning("epoch log %s/%s: removing %s (not among the indexed segments "
                                "%d..%d)", self.topic, self.partition, p,
                                state.segments[0].seq, state.segment)
                    p.unlink()
        except (OSError, CatalogError) as e:
            raise HistoryWriteError(f"cannot open the epoch log of {self.topic!r} partition "
                                    f"{self.partition} in {self.dir}: {e}") from e
        self.state = state
        self.lease = RetentionLease(self.catalog, self.topic, self.partition,
                                    holder=f"publisher:{self.incarnation or uuid.uuid4().hex}")
        self._record_limits()
        self._segment, self._offset = state.segment, state.committed
        self._committed = state.committed
        if self.uploader is not None:  # (the chain of the segment being written, cut there)
            from .tails import TailChain
            chain = self.tails or TailChain(self.uploader.store, self.catalog, self.topic,
                                            self.partition, self.incarnation or "")
            chain.resume(next((g.object for g in state.segments if g.seq == state.segment),
                              None), state.committed, state.segment)
        self._upload_sealed(state)
        self._segments = list(state.segments)
        self._lower = Antichain(self.order, state.lower)
        self._frontiers = (tuple(state.lower), tuple(state.upper))
        last = self._segments[-1] if self._segments else None
        if last is not None and last.seq == self._segment and last.epochs:
            self._oldest = last.last_completed  # (its newest: the segment closes no earlier)
        self._apply_retention(_time.time())  # a log reopened after a while: limits apply now
        return state

    def _fetch(self, path: Path, size: int, state: HistoryState) -> None:
        """The segment being written has fewer bytes here than the index covers (a publisher
        on another host, or a lost disk): take them from its object in the store, else raise
        :class:`~epochstream.errors.HistoryCorrupt`."""
        seg = next((g for g in state.segments if g.seq == state.segment), None)
        if self.uploader is None or seg is None or not seg.object \
                or (seg.object_bytes or 0) < state.committed:
            raise HistoryCorrupt(f"segment {path} has {size} bytes but the index covers "
                                 f"{state.committed}, and no object store holds them: the log "
                                 f"was damaged", path=str(path))
        log.info("epoch log %s/%s: taking %d bytes of segment %d from %s", self.topic,
                 self.partition, state.committed, state.segment,
                 self.uploader.store.where(seg.object))
        self.uploader.store.download(seg.object, state.committed, path)

    def _record_limits(self) -> None:
        """Record the limits in the catalog (what ``epochstream retention run`` applies once
        no publisher runs); a failure is only logged."""
        r = self.retention
        try:
            self.catalog.retention_record(self.topic, dict(
                max_bytes=r.max_bytes, max_age=r.max_age, max_epochs=r.max_epochs))
        except CatalogError as e:
            log.warning("epoch log %s/%s: could not record the retention limits: %s",
                        self.topic, self.partition, e)

    def close(self, uploads: bool = False) -> None:
        """Close the segment file (uncommitted records stay, to be truncated on recovery).
        With a store: the committed part of the segment being written is handed to the
        uploader too (a closed publisher's epochs are all in the store), and ``uploads=True``
        waits up to :data:`UPLOADS_AT_CLOSE` seconds for the uploads, then stops the
        uploader."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
            if self.uploader is not None and self._failed is None:
                self._upload_tail()
        if uploads and self.uploader is not None:
            self.uploader.close(UPLOADS_AT_CLOSE)
        if self.lease is not None:
            self.lease.release()

    # -- the object store (Retention.store; log/uploader.py) ---------------------------------
    def _upload_sealed(self, state: HistoryState) -> None:
        """At :meth:`open`: hand the uploader every sealed segment the index has no whole
        object for (a predecessor killed mid-upload, or the store down when it closed)."""
        if self.uploader is None:
            return
        self.uploader.pending = self._not_uploaded
        for job in self._not_uploaded(state):
            self.uploader.sealed(*job)

    def _not_uploaded(self, state: HistoryState | None = None) -> list[tuple]:
        """``[(seq, path, nbytes), ...]`` of the sealed segments with epochs that the index
        (``state``, or read now) has no whole object for, oldest first."""
        if state is None:
            state = self.catalog.history_state(self.topic, self.partition)
        return [(g.seq, str(segment_path(self.dir, g.seq)), g.nbytes)
                for g in (state.segments if state else ())
                if g.seq < state.segment and g.epochs and (g.object_bytes or 0) < g.nbytes]

    def _upload_tail(self) -> None:
        """At a close: upload the committed bytes of the segment being written (the next
        publisher continues the segment; its longer object replaces this one when sealed)."""
        last = self._segments[-1] if self._segments else None
        if last is not None and last.epochs and self._committed > self._tail_sent:
            self._tail_sent = self._committed
            self.uploader.sealed(self._segment, str(segment_path(self.dir, self._segment)),
                                 self._committed)

    def _sealed(self, seq: int, nbytes: int) -> None:
        """Segment ``seq`` was closed with ``nbytes`` bytes: upload it (never blocks)."""
        if self.uploader is not None and nbytes > 0:
            self.uploader.sealed(seq, str(segment_path(self.dir, seq)), nbytes)

    # -- writing ---------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failed is not None:
            raise HistoryWriteError(f"the epoch log of {self.topic!r} partition {self.partition} "
                                    f"failed earlier ({self._failed}); nothing more is logged")

    def _fail(self, what: str, e: BaseException) -> HistoryWriteError:
        self._failed = e
        return HistoryWriteError(f"epoch log of {self.topic!r} partition {self.partition} "
                                 f"({self.dir}): could not {what}: {e}")

    def _append(self, kind: bytes, prefix: bytes, payload=b"") -> tuple[int, int]:
        """Append one record whose body is ``prefix`` + ``payload``; return its total length
        and its CRC-32 (two CRC calls and two writes, whatever the record)."""
        body_len = len(prefix) + len(payload)
        crc = zlib.crc32(payload, zlib.crc32(prefix, zlib.crc32(kind)))
        f = self._file
        f.write(RECORD_HEADER.pack(body_len, crc, kind) + prefix)
        if payload:
            f.write(payload)
        return RECORD_HEADER.size + body_len, crc

    def data(self, time, header: bytes, payload) -> None:
        """Log a data message at ``time`` (normalised) with its wire header and payload."""
        self._check()
        try:
            start = self._offset
            n, crc = self._append(_D, _HLEN.pack(len(header)) + header, payload)
            if self.retention.fsync == "every":
                self._file.flush()
                os.fsync(self._file.fileno())
        except OSError as e:
            raise self._fail("write a data record", e) from e
        self._offset = start + n
        entry = self._open.get(time)
        if entry is None:
            entry = self._open[time] = _Open()
        if entry.extents and entry.extents[-1][0] + entry.extents[-1][1] == start:
            entry.extents[-1][1] += n
        else:
            entry.extents.append([start, n])
        entry.nbytes += len(payload)
        entry.messages += 1
        entry.crc = zlib.crc32(_U32.pack(crc), entry.crc)  # the chain of the records' CRCs

    def frontier(self, lower: tuple, upper: tuple, header: bytes) -> None:
        """Log a lower frontier change to ``lower`` (elements after it; ``header`` its wire
        ``F`` header; ``upper`` the upper frontier then) and index the epochs it completes:
        :meth:`frontier_write` then :meth:`commit`."""
        self.frontier_write(lower, upper, header)
        self.commit()

    def frontier_write(self, lower: tuple, upper: tuple, header: bytes) -> None:
        """Append the ``F`` record of a lower frontier change to ``lower``; the epochs it
        completes are indexed by the next :meth:`commit` (several changes share one commit: a
        group commit, one ``fsync`` and one catalog transaction)."""
        self._check()
        try:
            self._offset += self._append(_F, bytes(header))[0]
        except OSError as e:
            raise self._fail("write a frontier record", e) from e
        self._pending = (tuple(lower), tuple(upper))

    @property
    def full(self) -> bool:
        """True iff the segment being written reached ``segment_bytes``: commit now, so that
        it can roll at this epoch boundary (a group commit never makes a segment much bigger
        than ``segment_bytes``)."""
        return self._offset >= self.retention.segment_bytes

    @property
    def uncommitted(self) -> bool:
        """True iff a frontier change was written but not committed yet."""
        return self._pending is not None

    def commit(self) -> None:
        """Make the frontier changes written since the last commit durable: flush, ``fsync``
        the segment if they complete epochs (policy ``Retention.fsync``), then index the
        completed epochs and the new frontiers in one catalog transaction, roll the segment if
        it is full, apply retention. The caller sends the changes only after this returns."""
        self._check()
        if self._pending is None:
            return
        lower, upper = self._pending
        new_lower = Antichain(self.order, lower)
        done = [t for t in self._open if not new_lower.less_equal(t)]
        try:
            self._file.flush()
            if done and self.retention.fsync != "none":  # their data must be on disk first;
                os.fsync(self._file.fileno())             # the lower frontier is in the index
        except OSError as e:
            raise self._fail("write the frontier records", e) from e
        if self.tails is not None:  # upload="frontier": in the store before it is indexed
            try:
                self.tails.upload(segment_path(self.dir, self._segment), self._segment,
                                  self._offset)
            except (Fenced, HistoryWriteError) as e:
                self._failed = e
                raise
        now = _time.time()
        epochs = [EpochRecord(self.partition, t, self._segment,
                              tuple(tuple(x) for x in self._open[t].extents),
                              self._open[t].nbytes, self._open[t].messages, self._open[t].crc,
                              now) for t in done]
        roll_to, new_file = self._next_segment(len(done) == len(self._open), now)
        self._index(epochs, lower, upper, roll_to, new_file)
        self._pending = None
        self._frontiers = (lower, upper)
        for t in done:
            del self._open[t]
        self._lower = new_lower
        if epochs and self._oldest is None:
            self._oldest = now
        last = self._segments[-1]
        self._segments[-1] = SegmentStat(last.seq, self._offset, last.epochs + len(epochs),
                                         now if epochs else last.last_completed)
        self._committed = self._offset
        if roll_to is not None:
            self._file.close()
            self._file = new_file
            self._sealed(self._segment, self._offset)
            self._segment, self._offset, self._committed = roll_to, 0, 0
            self._segments.append(SegmentStat(roll_to, 0, 0, None))
            self._oldest = None
            self._tail_sent = 0
            if self.tails is not None:
                self.tails.reset()
        self._apply_retention(now)

    def _next_segment(self, boundary: bool, now: float) -> tuple:
        """``(seq, open file)`` of the segment to roll to at this commit (at an epoch
        boundary — ``boundary``: no open epoch has records in the current one — once it is full
        or aged), or ``(None, None)``. Created before the commit: a failure leaves these epochs
        incomplete."""
        if not boundary or (self._offset < self.retention.segment_bytes
                            and not segment_aged(self._oldest, self.retention, now)):
            return None, None
        roll_to = self._segment + 1
        try:
            return roll_to, open(segment_path(self.dir, roll_to), "wb")
        except OSError as e:
            raise self._fail(f"start segment {roll_to}", e) from e

    def _index(self, epochs: list, lower, upper, roll_to, new_file) -> None:
        """Index ``epochs`` and the new frontiers in one catalog transaction."""
        try:
            self.catalog.history_commit(self.topic, self.partition, epochs=epochs, lower=lower,
                                        upper=upper, segment=self._segment,
                                        committed=self._offset, roll_to=roll_to,
                                        durable=self.retention.fsync != "none",
                                        incarnation=self.incarnation)
        except CatalogError as e:
            if new_file is not None:
                new_file.close()
            failed = self._fail("index the completed epochs in the catalog", e)
            if isinstance(e, Fenced):
                raise  # a newer generation holds the partition: this writer stops as it is
            raise failed from e

    def expire(self, now: float) -> None:
        """Apply the age limit while nothing is being committed (``now``: ``time.time()``,
        seconds): close the segment being written if its oldest epoch aged
        (:func:`~epochstream.retention.segment_aged`) and no epoch is open in it, then delete
        the segments the limits allow. Called by the publisher's loop every
        :func:`~epochstream.retention.check_interval` (:meth:`open` and every commit apply
        the limits too). A failure here is
        logged and retried at the next call; it never fails the writer (no epoch is at stake)."""
        if self._failed is not None or self._file is None:
            return
        if not self._open and self._pending is None and self._frontiers[0] and \
                segment_aged(self._oldest, self.retention, now):
            self._roll_idle()  # (not at an empty lower frontier: the next segment's ``since``)
        self._apply_retention(now)

    def _roll_idle(self) -> None:
        """Close the segment being written at this epoch boundary and start the next one, with
        no epoch to index (an idle log whose segment aged)."""
        roll_to = self._segment + 1
        path = segment_path(self.dir, roll_to)
        try:
            self._file.flush()
            new_file = open(path, "wb")
        except OSError as e:
            log.warning("epoch log %s/%s: could not start segment %d (retried later): %s",
                        self.topic, self.partition, roll_to, e)
            return
        lower, upper = self._frontiers
        try:
            self.catalog.history_commit(self.topic, self.partition, epochs=[], lower=lower,
                                        upper=upper, segment=self._segment,
                                        committed=self._offset, roll_to=roll_to,
                                        durable=self.retention.fsync != "none",
                                        incarnation=self.incarnation)
        except CatalogError as e:
            if isinstance(e, Fenced):
                new_file.close()
                path.unlink(missing_ok=True)
                raise self._fail("roll to a new segment", e) from e
            new_file.close()
            path.unlink(missing_ok=True)
            log.warning("epoch log %s/%s: could not index segment %d (retried later): %s",
                        self.topic, self.partition, roll_to, e)
            return
        self._file.close()
        self._file = new_file
        if self._segments[-1].epochs:
            self._sealed(self._segment, self._offset)
        self._segment, self._offset, self._committed = roll_to, 0, 0
        self._segments.append(SegmentStat(roll_to, 0, 0, None))
        self._oldest = None
        self._tail_sent = 0
        if self.tails is not None:
            self.tails.reset()

    def _objects_before(self, keep_from: int) -> list[str]:
        """The objects in the store of the segments numbered below ``keep_from`` (read from the
        index: some were uploaded by predecessors)."""
        if self.uploader is None:
            return []
        state = self.catalog.history_state(self.topic, self.partition)
        return [g.object for g in (state.segments if state else ())
                if g.seq < keep_from and g.object]

    def _apply_retention(self, now: float) -> None:
        n = segments_to_delete(self._segments, self.retention, now)
        held = self.lease is not None and self.lease.held()  # (renewed every third of it)
        if held and self.uploader is not None and now - self._swept > ORPHAN_SWEEP:
            self._swept = now  # (objects a crash left unindexed: deleted once old enough)
            self.uploader.sweep()
        if n == 0 or not held:  # (not held: a runner applies the same recorded limits)
            return
        keep_from = self._segments[n].seq
        try:
            objects = self._objects_before(keep_from)
            since, expired = self.catalog.history_trim(self.topic, self.partition, keep_from,
                                                       self.lease.holder)
        except CatalogError as e:  # retried at the next commit (Fenced: the lease lapsed)
            log.warning("epoch log %s/%s: retention could not update the index: %s",
                        self.topic, self.partition, e)
            return
        gone, self._segments = self._segments[:n], self._segments[n:]
        for s in gone:
            try:
                segment_path(self.dir, s.seq).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("epoch log %s/%s: could not delete %s: %s", self.topic,
                            self.partition, segment_path(self.dir, s.seq), e)
        if objects:  # their index rows are gone: now the objects
            self.uploader.delete(objects)
        log.info("epoch log %s/%s: retention deleted %d segment(s); retained since %s",
                 self.topic, self.partition, n, list(since))
        for name in expired:
            if name.startswith("group:"):
                log.warning("consumer group %r of %r stopped: retention of partition %s "
                            "deleted epochs at or beyond its position", name[6:], self.topic,
                            self.partition)
            else:
                log.warning("durable subscription %r of %r expired: retention of partition %s "
                            "deleted epochs at or beyond its position", name, self.topic,
                            self.partition)
