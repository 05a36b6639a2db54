"""Uploading one partition's sealed segments to its object store, off the publisher's path.

:class:`Uploader` is a thread of its own with a bounded backlog. The publisher's loop thread
only hands it work (:meth:`Uploader.sealed`, :meth:`Uploader.delete`: a deque append, never
blocking, never I/O). For each sealed segment it **uploads, then indexes**: the whole object is
written under a name never reused (:func:`~epochstream.log.store.object_name`), its size checked,
and only then ``Catalog.history_uploaded`` records it — a reader, which finds objects only
through the index, never sees one that is not whole. An object the index does not take (the
segment was trimmed meanwhile) is deleted again; a shorter object it replaces too (index first,
then the object).

Faults: while the store (or the catalog) fails, the job at the head is retried with a growing
pause (0.2 s doubling to 5 s) and one WARNING per outage; the publisher goes on serving. An
index write refused as :class:`~epochstream.errors.Fenced` (another incarnation holds the
partition) is retried the same way: a superseded publisher aborts at its next commit and stops
its uploader; a publisher that opened its log before registering is let through once it did. The
backlog holds at most ``limit`` sealed segments: past it the oldest is dropped with a WARNING —
it stays on local disk only for now (the documented choice); once the backlog drained (the
store is back) the uploader reads the index for sealed segments without an object and queues
them again, up to the bound, and a publisher opening the log later does the same. A process killed mid-upload leaves at most
an unindexed object that no reader ever sees; its successor uploads under its own name.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time as _time

from ..errors import CatalogError, Fenced
from .store import LogStore, object_name

__all__ = ["Uploader"]

log = logging.getLogger("epochstream.history")

_PAUSE0, _PAUSE_MAX = 0.2, 5.0


class Uploader:
    """Uploads the sealed segments of ``partition`` of ``topic`` to ``store`` (a
    :class:`~epochstream.log.store.LogStore`) and indexes them in ``catalog``, as
    ``incarnation``; at most ``limit`` (>= 1) segments wait. :attr:`stats`: ``uploaded``
    (objects), ``upload_bytes``, ``dropped`` (segments left local-only past the bound),
    ``failures`` (attempts that failed), ``deleted`` (objects). Call :meth:`close` at the end."""

    def __init__(self, store: LogStore, catalog, topic: str, partition: int, incarnation: str,
                 limit: int):
        self.store, self.catalog, self.topic, self.partition = store, catalog, topic, partition
        self.incarnation, self.limit = incarnation, limit
        self._jobs: collections.deque = collections.deque()  # ("up", seq, path, n) | ("rm", name)
        #                                                        | ("sweep",)
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._behind = False  # segments were dropped past the bound: look for them again
        self._fenced = False  # the last attempt was refused: another incarnation holds it
        #: ``() -> [(seq, path, nbytes), ...]``: the sealed segments the index has no whole
        #: object for (set by the writer); called once the backlog drained after drops
        self.pending = None
        self.stats = dict(uploaded=0, upload_bytes=0, dropped=0, failures=0, deleted=0)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"epochstream-upload-{topic}/{partition}")
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Sealed segments waiting for (or in) their upload."""
        with self._cv:
            return sum(1 for j in self._jobs if j[0] == "up")

    def sealed(self, seq: int, path: str, nbytes: int) -> None:
        """Upload the first ``nbytes`` bytes of segment ``seq`` (the file ``path``, whose bytes
        up to ``nbytes`` never change again). Never blocks; past the bound the oldest waiting
        segment is dropped (kept only locally until the backlog drained), with a WARNING."""
        with self._cv:
            self._jobs.append(("up", seq, str(path), nbytes))
            ups = [j for j in self._jobs if j[0] == "up"]
            if len(ups) > self.limit:
                victim = ups[1] if self._busy and len(ups) > 1 else ups[0]
                self._jobs.remove(victim)
                self.stats["dropped"] += 1
                self._behind = True
                log.warning("epoch log %s/%s: %d sealed segments wait for the store %s; segment "
                            "%d is kept only locally for now (found again in the index and "
                            "uploaded once the backlog drained)", self.topic, self.partition,
                            len(ups), self.store.uri, victim[1])
            self._cv.notify()

    def delete(self, names) -> None:
        """Delete the objects ``names`` (their index rows are gone already)."""
        with self._cv:
            self._jobs.extend(("rm", n) for n in names)
            self._cv.notify()

    def sweep(self) -> None:
        """Delete the objects no index entry names that are older than
        :data:`~epochstream.log.retainer.ORPHAN_GRACE` (called by the holder of the retention
        lease; :func:`~epochstream.log.retainer.sweep_orphans`), on this thread."""
        with self._cv:
            if ("sweep",) not in self._jobs:
                self._jobs.append(("sweep",))
                self._cv.notify()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every job handed over so far; True if done
        (False at once once an index write was refused as ``Fenced``)."""
        deadline = _time.monotonic() + timeout
        with self._cv:
            while self._jobs or self._busy:
                left = deadline - _time.monotonic()
                if left <= 0 or self._fenced:  # (a superseded publisher: nothing to wait for)
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def close(self, timeout: float = 0.0) -> bool:
        """Finish the jobs handed over for up to ``timeout`` seconds, then stop the thread
        (jobs left are not done: sealed segments a later publisher uploads, objects left in the
        store). True if every job was done."""
        done = self.drain(timeout) if timeout > 0 else not (self._jobs or self._busy)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=max(1.0, timeout))
        if not done:
            log.warning("epoch log %s/%s: %d upload(s) to %s not done at close (the sealed "
                        "segments stay local; the next publisher uploads them)", self.topic,
                        self.partition, self.backlog, self.store.uri)
        return done

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        pause, failing = _PAUSE0, False
        while True:
            with self._cv:
                rescan = not self._jobs and self._behind and self.pending is not None
                self._behind = self._behind and not rescan
            if rescan:
                self._rescan()  # (a catalog read: never under the lock sealed() takes)
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                job = self._jobs[0]
                self._busy = True
            try:
                self._do(job)
            except (OSError, CatalogError) as e:  # (Fenced too: retried until the publisher,
                self.stats["failures"] += 1     # refused at its next commit, closes this)
                self._fenced = isinstance(e, Fenced)
                if not failing:
                    log.warning("epoch log %s/%s: the store %s failed (retried every %g s at "
                                "most until it answers): %s", self.topic, self.partition,
                                self.store.uri, _PAUSE_MAX, " ".join(str(e).split())[:300])
                failing = True
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
                    self._cv.wait_for(lambda: self._stop, timeout=pause)
                pause = min(pause * 2, _PAUSE_MAX)
                continue
            if failing:
                log.warning("epoch log %s/%s: the store %s answers again", self.topic,
                            self.partition, self.store.uri)
            pause, failing, self._fenced = _PAUSE0, False, False
            with self._cv:
                if self._jobs and self._jobs[0] is job:
                    self._jobs.popleft()
                self._busy = False
                self._cv.notify_all()

    def _rescan(self) -> None:
        """(The backlog was empty.) Queue again, up to the bound, the sealed segments dropped
        past it (read from the index, without the lock: the store is back)."""
        try:
            found = self.pending()
        except CatalogError as e:
            log.warning("epoch log %s/%s: could not read the index for segments to upload "
                        "(tried again after the next drop): %s", self.topic, self.partition, e)
            return
        with self._cv:
            queued = {j[1] for j in self._jobs if j[0] == "up"}
            room = self.limit - len(queued)
            again = [f for f in found if f[0] not in queued]
            for seq, path, nbytes in again[:max(0, room)]:
                self._jobs.append(("up", seq, path, nbytes))
            self._behind = self._behind or len(again) > room

    def _do(self, job: tuple) -> None:
        if job[0] == "rm":
            self.store.delete(job[1])
            self.stats["deleted"] += 1
            return
        if job[0] == "sweep":
            from .retainer import sweep_orphans
            n = sweep_orphans(self.store, self.catalog, self.topic, self.partition)
            self.stats["deleted"] += n
            if n:
                log.info("epoch log %s/%s: deleted %d object(s) no index entry names (left by "
                         "a crash mid-upload)", self.topic, self.partition, n)
            return
        _, seq, path, nbytes = job
        name = object_name(self.topic, self.partition, seq, self.incarnation, nbytes)
        if not os.path.exists(path):  # retention deleted the segment before its upload
            log.info("epoch log %s/%s: segment %d was deleted before its upload", self.topic,
                     self.partition, seq)
            return
        self.store.upload(path, nbytes, name)
        indexed, replaced = self.catalog.history_uploaded(self.topic, self.partition, seq, name,
                                                          nbytes, self.incarnation)
        if not indexed:
            if replaced != name:  # (the same upload done twice: that object is the indexed one)
                self.store.delete(name)
            return
        self.stats["uploaded"] += 1
        self.stats["upload_bytes"] += nbytes
        if replaced is not None and replaced != name:
            self.store.delete(replaced)
