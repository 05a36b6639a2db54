"""``Retention(upload="frontier")``: the committed tail of the segment being written goes to the
object store at every frontier advance, *before* the advance is indexed and announced, so that a
publisher whose disk vanishes with its machine loses no epoch it announced complete.

Design (an object-store log, as Materialize persist writes immutable parts and then a
compare-and-set of its state): at each commit, the bytes the segment gained since the last one
(``[end of the chain, end of the segment)``) are uploaded as one immutable *tail object* under a
name never reused (:func:`~epochstream.log.store.tail_name`: segment, incarnation, byte range);
then the segment's index entry is set to the chain of objects holding its bytes so far
(:func:`~epochstream.log.store.tails_object`, ``Catalog.history_uploaded``); only then does the
writer's commit index the epochs and the frontier, and only after that does the publisher send
the frontier update. A sealed segment's whole object (the background
:class:`~epochstream.log.uploader.Uploader`, as with ``upload="sealed"``) supersedes its chain,
whose objects are then deleted. Readers read a chain as one segment (range reads across its
objects); a successor on another host rebuilds the segment being written from it
(``LogWriter.open``).

While the store (or the index) fails, the commit waits — retried with a growing pause (0.2 s
doubling to 5 s), one WARNING per outage: the loop thread of the publisher waits with it, so no
frontier update is announced and the caller blocks once its queue (``queue_hwm``) is full;
memory stays bounded. Closing or aborting the publisher stops the wait
(:meth:`TailChain.stop`): the writer fails with
:class:`~epochstream.errors.HistoryWriteError`, nothing more is announced.

Crash points: killed mid-upload or between upload and index, the tail object is not in the
index (no reader finds it; its successor uploads the same range under its own name); killed
between the index and the commit, the chain covers bytes the commit does not (the successor
takes only the committed bytes and drops the rest from the chain).
"""

from __future__ import annotations

import logging
import threading
import time as _time
from typing import Any

from ..errors import CatalogError, Fenced, HistoryWriteError
from .store import TAILS, LogStore, is_tails, tail_name, tail_pieces, tails_object

__all__ = ["TailChain"]

log = logging.getLogger("epochstream.history")

_PAUSE0, _PAUSE_MAX = 0.2, 5.0
_BEAT = 0.5


class TailChain:
    """The chain of objects holding the segment being written of ``partition`` of ``topic``,
    uploaded by ``incarnation`` to ``store`` and indexed in ``catalog``. :attr:`end`: bytes of
    the segment the chain holds; :attr:`stats`: ``tails`` (objects uploaded), ``tail_bytes``,
    ``tail_failures`` (attempts that failed)."""

    def __init__(self, store: LogStore, catalog, topic: str, partition: int, incarnation: str):
        self.store, self.catalog, self.topic, self.partition = store, catalog, topic, partition
        self.incarnation = incarnation
        self.names: list[str] = []
        self.end = 0
        self._stop = threading.Event()
        self.stats = dict(tails=0, tail_bytes=0, tail_failures=0)
        #: ``() -> None`` called at least every :data:`_BEAT` seconds while a commit waits for
        #: the store (the publisher's loop sends its heartbeats); exceptions are logged
        self.on_wait: Any = None

    def resume(self, entry: str | None, committed: int, segment: int | None = None) -> None:
        """Start from the index entry ``entry`` of the segment being written (``None``, one
        object or a chain), keeping the objects that hold only committed bytes (``committed``:
        what the index covers; a tail beyond was uploaded by a predecessor killed before its
        commit). ``segment``: also cut the index entry there if the chain reaches beyond
        (the bytes beyond are the predecessor's, not this writer's: never to be read for the
        epochs it will commit there). Raises :class:`~epochstream.errors.CatalogError`."""
        self.names, self.end = [], 0
        for start, end, name in tail_pieces(entry) if entry else ():
            if end > committed:
                break
            self.names.append(name)
            self.end = end
        if segment is not None and is_tails(entry) and tail_pieces(entry)[-1:] and \
                tail_pieces(entry)[-1][1] > self.end:  # (no fencing: not registered yet)
            cut = tails_object(self.names) if self.names else \
                TAILS + entry[len(TAILS):].split("|", 1)[0]
            self.catalog.history_uploaded(self.topic, self.partition, segment, cut, self.end)
        if is_tails(entry) and self.end < committed:
            log.warning("epoch log %s/%s: the chain of tail objects holds %d of %d committed "
                        "bytes; the rest is uploaded at the next commit", self.topic,
                        self.partition, self.end, committed)

    def reset(self) -> None:
        """The segment rolled: the next one starts with no object."""
        self.names, self.end = [], 0

    def stop(self) -> None:
        """Stop waiting for the store (the publisher closes or aborts): a commit waiting in
        :meth:`upload` fails with :class:`~epochstream.errors.HistoryWriteError`. Thread-safe."""
        self._stop.set()

    def upload(self, path, segment: int, end: int) -> None:
        """Upload bytes ``[self.end, end)`` of segment ``segment`` (the file ``path``, flushed)
        as a tail object and index the chain with it; wait (retrying) while the store or the
        index fails. Raises :class:`~epochstream.errors.Fenced` (another incarnation holds the
        partition) and :class:`~epochstream.errors.HistoryWriteError` once :meth:`stop` was
        called, or if the segment is no longer in the index (the topic was dropped)."""
        start = self.end
        if end <= start:
            return
        name = tail_name(self.topic, self.partition, segment, self.incarnation, start, end)
        names = [*self.names, name]
        pause, failing = _PAUSE0, False
        while True:
            try:
                self.store.upload(path, end - start, name, start=start)
                indexed, _ = self.catalog.history_uploaded(
                    self.topic, self.partition, segment, tails_object(names), end,
                    self.incarnation)
                break
            except Fenced:
                raise
            except (OSError, CatalogError) as e:
                self.stats["tail_failures"] += 1
                if not failing:
                    log.warning("epoch log %s/%s: the store %s failed; frontier advances wait "
                                "until their data is in it (retried every %g s at most): %s",
                                self.topic, self.partition, self.store.uri, _PAUSE_MAX,
                                " ".join(str(e).split())[:300])
                failing = True
                if self._wait(pause):
                    raise HistoryWriteError(f"the store {self.store.uri} did not take the data "
                                            f"of the frontier advance before the publisher "
                                            f"stopped: {e}") from e
                pause = min(pause * 2, _PAUSE_MAX)
        if failing:
            log.warning("epoch log %s/%s: the store %s answers again", self.topic,
                        self.partition, self.store.uri)
        if not indexed:  # (the topic was dropped meanwhile: waiting would not help)
            raise HistoryWriteError(f"segment {segment} of {self.topic!r} partition "
                                    f"{self.partition} is no longer in the index")
        self.names, self.end = names, end
        self.stats["tails"] += 1
        self.stats["tail_bytes"] += end - start

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds``, calling :attr:`on_wait` every :data:`_BEAT`; True if stopped."""
        end = _time.monotonic() + seconds
        while True:
            if self.on_wait is not None:
                try:
                    self.on_wait()
                except Exception as e:  # (a heartbeat that fails must not fail the commit)
                    log.warning("epoch log %s/%s: heartbeat while waiting for the store "
                                "failed: %s", self.topic, self.partition, e)
            left = end - _time.monotonic()
            if left <= 0:
                return self._stop.is_set()
            if self._stop.wait(min(left, _BEAT)):
                return True
