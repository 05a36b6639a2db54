"""Pull-based consumption of a subscriber: :meth:`Pull.fetch` hands out whole epochs on request,
in batches bounded in epochs and bytes, with a status instead of an exception for "nothing yet"
(docs/consumers.md, "Pull").

A mixin of :class:`~epochstream.transport.subscriber.Subscriber`. There is one stream of
released epochs per subscriber: the subscriber's ``_released`` generator (epoch assembly, the
history fill, durable hand-out accounting) runs as a single instance that both
:meth:`~epochstream.transport.subscriber.Subscriber.epochs` and :meth:`Pull.fetch` draw from,
so the two may be mixed: each epoch is handed out once, by one of them, in the stream's order.
An epoch a fetch has taken from the stream but not returned (it would overflow ``max_bytes``)
waits in a one-slot buffer that both read first.

Waiting is done in short poll slices (:data:`_SLICE`) under a lock, so that a newer
:meth:`Pull.fetch` from another thread supersedes a waiting one within about a slice (no
orphaned pulls), ``expires`` is kept to about a slice, and, between slices, the publishers'
heartbeats are checked: a partition silent for more than two of its publisher's heartbeat
intervals (plus :data:`_GRACE`) ends the pull with :class:`~epochstream.errors.PublisherLost`.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time as _time
from typing import Iterator

from ..errors import PublisherLost
from ..events import FetchResult, Gap

__all__ = ["Pull"]

#: seconds: the longest a waiting fetch waits on its sockets before it looks at supersession,
#: its ``expires`` and the heartbeats again
_SLICE = 0.05
#: seconds of processing a fetch that need not wait (``no_wait=True``, or one that already holds
#: an epoch and has no ``expires``) spends on messages that have already arrived before it returns
#: (the rest stays queued for the next call)
_BUDGET = 0.1
#: seconds added to two heartbeat intervals before a silent partition is lost (scheduling slack)
_GRACE = 0.5

_END = object()  # the shared stream ended (every partition finished)
_STATE_LOCK = threading.Lock()  # creates the per-subscriber state once


class _PullState:
    """Per-subscriber state of the shared stream (created on first use)."""

    def __init__(self):
        self.lock = threading.Lock()  # held around every step of the shared stream
        self.tickets = itertools.count(1)
        self.current = 0  # the ticket of the newest fetch
        self.source: Iterator | None = None  # the shared generator (None: not started, ended)
        self.held: collections.deque = collections.deque()  # taken from the stream, not handed out
        self.error: BaseException | None = None  # raised by the next call (failure after a batch)
        self.read_at: float | None = None  # monotonic time of the last poll that read the sockets


class Pull:
    """``fetch()`` and the stream it shares with ``epochs()``, for the Subscriber."""

    _poll_slice = 0.1  # seconds each poll of the shared stream may wait (fetch sets its own)
    _pull_idle = False  # the last poll read no message and released nothing
    _pull_st: _PullState | None = None

    def _pull(self) -> _PullState:
        st = self._pull_st
        if st is None:
            with _STATE_LOCK:
                st = self._pull_st
                if st is None:
                    st = self._pull_st = _PullState()
        return st

    # -- the shared stream -------------------------------------------------------------------
    def _pull_outputs(self) -> Iterator:
        """The input of the shared stream: like ``Subscriber._outputs`` (events with data
        decoded; ends when finished) but each poll waits ``self._poll_slice`` seconds and is
        followed by a ``None`` tick, busy or idle (``self._pull_idle`` tells which), so that a
        caller regains control after every poll even while data keeps arriving."""
        hand_out = self._hand_out
        stats = self.stats
        st = self._pull_st
        while True:
            reads = not self._parked and self._failure is None  # else _poll does not read
            n = stats["messages"]
            got = self._poll(self._poll_slice)
            if reads:
                st.read_at = _time.monotonic()
            for m in got:
                m = hand_out(m)
                if m is not None:
                    yield m
            if not got and self._protocol.finished and not self._parked:
                return
            self._pull_idle = not got and stats["messages"] == n
            yield None

    def _pull_next(self, st: _PullState, slice_s: float):
        """The next item of the shared stream (an Epoch, a Gap, ``None`` after a poll, or
        ``_END``), waiting at most ``slice_s`` seconds per poll. Call with ``st.lock`` held."""
        if st.held:
            return st.held.popleft()
        if st.error is not None:
            exc, st.error = st.error, None
            raise exc
        if st.source is None:
            st.source = self._released(self._pull_outputs())
        self._poll_slice = slice_s
        try:
            return next(st.source)
        except StopIteration:
            st.source = None
            return _END
        except BaseException:
            st.source = None  # a failure stays in self._failure: a new source raises it again
            raise

    def _pulled(self, timeout: float | None) -> Iterator:
        """``epochs()``: the shared stream without its ticks; ``TimeoutError`` after
        ``timeout`` seconds of idle polls without an epoch (or gap)."""
        st = self._pull()
        last = _time.monotonic()
        while True:
            with st.lock:
                item = self._pull_next(st, Pull._poll_slice)
            if item is _END:
                return
            if item is None:
                if timeout is not None and self._pull_idle and _time.monotonic() - last > timeout:
                    raise TimeoutError(f"no complete epoch for {timeout} s from topic "
                                       f"{self.topic!r}")
                continue
            last = _time.monotonic()
            yield item

    def _pull_heartbeats(self, st: _PullState) -> None:
        """After a poll that read the sockets: a partition silent for more than two heartbeat
        intervals of its publisher (announced in its snapshot) plus ``_GRACE`` is lost. Not with
        ``recover=True`` (a restarted publisher is re-joined; the ``timeout`` applies)."""
        now, st.read_at = st.read_at, None
        if now is None or self.recover or self._failure is not None:
            return
        beats = self._heartbeats
        for partition, heard in self._liveness.last_heard.items():
            hb = beats.get(partition)
            silent = now - heard
            if hb and silent > 2 * hb + _GRACE:
                self._failure = PublisherLost(
                    f"topic {self.topic!r}: no message from partition {partition} for "
                    f"{silent:.2f} s during a fetch: two heartbeats missed (its publisher sends "
                    f"one every {hb} s when idle)", partition=partition)
                return

    # -- the API -----------------------------------------------------------------------------
    def fetch(self, max_epochs: int = 1, max_bytes: int | None = None,
              expires: float | None = None, no_wait: bool = False) -> FetchResult:
        """Pull up to ``max_epochs`` whole epochs: a :class:`~epochstream.events.FetchResult`
        (a sequence of :class:`~epochstream.events.Epoch`, in the order :meth:`epochs` yields
        them, plus ``status``, ``gaps``, ``finished``, ``superseded``). Never raises for "no
        epoch yet"; never splits an epoch.

        - ``max_epochs`` (int >= 1): at most this many epochs.
        - ``max_bytes`` (int >= 1 or ``None``): the epochs' ``nbytes`` (encoded payload bytes)
          sum to at most this. An epoch that does not fit stays buffered for the next call
          (nothing is lost or reordered); an epoch larger than ``max_bytes`` on its own is
          returned alone with status ``"epoch_too_large"`` (it can never fit; holding it back
          would block the stream for good).
        - ``expires`` (seconds >= 0, or ``None``): wait at most about this long (to within a
          poll slice, 0.05 s) for ``max_epochs`` epochs, then return those there are
          (``"ok"``) or none (``"timeout"``). ``None``: block until at least one epoch is
          there, then return it with those that have already arrived (up to ``max_epochs``,
          without waiting for more).
        - ``no_wait``: never wait for the network: process what has already arrived (up to
          about 0.1 s of processing; the rest is processed by the next call) and return the
          complete epochs (``"ok"``) or none (``"no_data"``). ``expires`` is then ignored.

        Statuses: ``"ok"`` (at least one epoch); ``"timeout"`` (none within ``expires``);
        ``"no_data"`` (none, without waiting out an ``expires``: ``no_wait``, the stream ended
        — ``finished=True`` — , superseded — ``superseded=True`` — , or a failure pending);
        ``"epoch_too_large"`` (see ``max_bytes``). With ``recover=True``, the
        :class:`~epochstream.events.Gap` events met are in ``gaps`` (a gap alone does not end
        a pull). When every partition finished and every epoch was handed out: ``"no_data"``
        with ``finished=True``, at once, on every later call.

        Epochs returned count as handed out exactly as with :meth:`epochs`: with
        ``durable=``, ``sub.ack(epoch)`` acknowledges them. :meth:`epochs` and :meth:`fetch`
        draw from one stream and may be mixed; :meth:`events` may not be mixed with them.

        Threads: a fetch called while another is waiting (from another thread) supersedes it:
        the waiting one returns within about 0.05 s with the epochs it already had (status as
        above, ``superseded=True``) and the new one proceeds. Otherwise a subscriber is used
        from one thread at a time.

        Liveness: a waiting fetch is kept alive by every message, including the publishers'
        idle heartbeats. A partition silent for more than two of its publisher's heartbeat
        intervals (``Publisher(heartbeat_interval=)``, announced in the snapshot) plus 0.5 s
        ends it with :class:`~epochstream.errors.PublisherLost` (with ``recover=True``, or
        before the partition's snapshot arrived, the subscriber's ``timeout`` applies instead:
        a restarted publisher is re-joined).

        Raises, like :meth:`epochs`, only after every epoch that arrived before the failure was
        handed out (a fetch that holds epochs returns them; the next call raises):
        :class:`~epochstream.errors.PublisherLost`,
        :class:`~epochstream.errors.PublisherAborted`,
        :class:`~epochstream.errors.SubscriberLagged`,
        :class:`~epochstream.errors.ProtocolError`,
        :class:`~epochstream.errors.HistoryUnavailable` /
        :class:`~epochstream.errors.SubscriptionExpired` (joining at a position); once raised,
        the failure is raised again by every later call. ``ValueError`` for invalid arguments or
        a closed subscriber.
        """
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"max_epochs must be an int >= 1, got {max_epochs!r}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                      or max_bytes < 1):
            raise ValueError(f"max_bytes must be an int >= 1 (bytes) or None, got {max_bytes!r}")
        if expires is not None:
            if isinstance(expires, bool) or not isinstance(expires, (int, float)) or \
                    math.isnan(expires) or expires < 0:
                raise ValueError(f"expires must be seconds >= 0 or None, got {expires!r}")
        if self._closed:
            raise ValueError(f"fetch() on a closed Subscriber of topic {self.topic!r}")
        st = self._pull()
        me = next(st.tickets)
        st.current = me  # supersedes a waiting fetch: it sees this between two slices
        deadline = None if no_wait or expires is None else _time.monotonic() + expires
        hurry = _time.monotonic() + _BUDGET if no_wait else None  # stop at a tick after this
        epochs: list = []
        gaps: list = []
        nbytes = 0
        status = None
        finished = superseded = False
        while True:
            if deadline is not None:
                slice_s = max(0.0, min(_SLICE, deadline - _time.monotonic()))
            else:
                slice_s = 0.0 if hurry is not None else _SLICE
            with st.lock:
                if st.current != me:
                    superseded = True
                    break
                try:
                    item = self._pull_next(st, slice_s)
                except Exception as exc:
                    if not epochs and not gaps:
                        raise
                    if exc is not self._failure:  # not raised again by a new source: keep it
                        st.error = exc
                    break
                if item is None:
                    self._pull_heartbeats(st)
                elif item is _END:
                    finished = not st.held
                    break
                elif type(item) is Gap:
                    gaps.append(item)
                elif max_bytes is not None and nbytes + item.nbytes > max_bytes:
                    if epochs:
                        st.held.appendleft(item)  # next call's first epoch
                    else:
                        epochs.append(item)
                        status = "epoch_too_large"
                    break
                else:
                    epochs.append(item)
                    nbytes += item.nbytes
                    if len(epochs) >= max_epochs:
                        break
                    if deadline is None and hurry is None:
                        hurry = _time.monotonic() + _BUDGET  # holds one: take what arrived
            now = _time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if item is None and hurry is not None and (self._pull_idle or now >= hurry):
                break
        if status is None:
            status = ("ok" if epochs else
                      "timeout" if (deadline is not None and not superseded and not finished
                                    and _time.monotonic() >= deadline) else
                      "no_data")
        return FetchResult(tuple(epochs), status, tuple(gaps), finished, superseded)
