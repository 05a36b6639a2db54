"""The pubsub protocol as pure state machines — no sockets, no clocks (in the style of h11).

Follows the Strymon pubsub protocol (strymon_job, "Protocol Messages", "Publisher Logic",
"Subscriber Logic") with the frontier algebra of timely-dataflow (``progress/frontier.rs``).

The messages (:class:`InitialFrontierSnapshot`, :class:`LowerFrontierUpdate`,
:class:`DataMessage`) and the :class:`Epoch` it releases are defined in :mod:`epochstream.events`
(importable from here too).

State machines:

- :class:`PublisherProtocol` — one partition's lower frontier (a :class:`MutableAntichain` of
  capabilities, from progress updates) and upper frontier (maximal times seen in data).
- :class:`SubscriberProtocol` — merges the snapshots and streams of ``partitions`` partitions:
  the filter, the merged lower frontier, and filter retirement.
- :class:`EpochAssembler` (:mod:`epochstream.assembler`) — turns delivered data plus merged
  frontier changes into complete :class:`Epoch` objects.

Why the filter works (Strymon "Design"): a time ``t`` with ``t <= u`` for no ``u`` in any
partition's upper frontier at subscription was *latent* in every partition — no partition had
sent data at ``t`` — so the subscriber can see all of it. Data at ``t <= u`` may have been missed
and is dropped. A filter element ``f`` is retired once no merged lower-frontier element is
``<= f``: no data at or before ``f`` can arrive any more, so keeping it filters nothing. Retiring
it earlier — e.g. when the lower frontier merely *reaches* ``f`` (Strymon's ``<=`` bug fixed in
commit e3fadf1), or when the lower frontier "dominates" the upper one (that holds already at
subscription) — lets the tail of an epoch through without its head.
"""

from __future__ import annotations

from typing import Any, Iterable

from .assembler import EpochAssembler  # re-exported: it lived here
from .errors import ProtocolError
from .events import (DataMessage, data_message, Epoch, InitialFrontierSnapshot,  # noqa: F401 (re-exported)
                     LowerFrontierUpdate)
from .frontier import Antichain, MutableAntichain, join
from .order import dual

_UNSET = object()  # PublisherProtocol's caches before their first use

__all__ = ["PublisherProtocol", "SubscriberProtocol", "EpochAssembler"]


class PublisherProtocol:
    """One partition's side of the protocol (Strymon "Publisher Logic").

    The lower frontier starts as ``{start: +1}`` — the upstream's initial capability, by default
    ``order.minimum``; a restarted publisher resumes at the first epoch it has not completed (or
    ``lower``: one capability per element of an antichain, e.g. a frontier recovered from the
    epoch log) — and
    the upper frontier as ``upper`` (default empty; a restarted publisher passes the upper
    frontier its predecessor recorded, so that subscribers joining it still filter the epochs the
    predecessor had begun). Thread-unsafe; one instance per partition.

    ``strict`` (the transport's default) follows timely's capability rules for a single upstream:

    - a :meth:`progress` batch may not leave any capability count negative (it would release a
      capability never held);
    - a batch may only mint a capability at ``t`` (a positive net delta) if a capability ``<= t``
      is held before the batch (timely mints new capabilities only from held ones, so the lower
      frontier never moves backwards and no epoch that may have completed is re-opened).

    Timely tolerates transient negative counts when updates of several workers arrive out of
    order; the pure protocol defaults to that lenient behaviour (``strict=False``).
    """

    __slots__ = ("order", "_lower", "_upper", "_check", "strict", "_valid_in", "_valid",
                 "_accepted")

    def __init__(self, order, *, start=None, upper=(), strict: bool = False, lower=None):
        self.order = order
        self._check = getattr(order, "check", None)
        if lower is None:
            lower = [order.minimum if start is None else start]
        elif start is not None:
            raise ValueError("give start (one time) or lower (an antichain), not both")
        lower = Antichain(order, [self._check(t) for t in lower] if self._check else lower)
        if self._check is not None:
            upper = [self._check(t) for t in upper]
        self._lower = MutableAntichain(order, [(t, 1) for t in lower.elements])
        self._upper = Antichain(dual(order), upper)
        self.strict = strict
        # The hot path (many sends at one time between frontier moves): the last time given to
        # check_data that passed (an int or a tuple of ints, never a mutable list) and what it
        # normalised to; forgotten whenever the lower frontier moves. And the last time
        # inserted into the upper frontier: inserting it again changes nothing (an antichain of
        # maxima only grows, so a time once dominated stays dominated).
        self._valid_in = self._valid = self._accepted = _UNSET

    @property
    def lower(self) -> tuple:
        """The lower frontier's elements (minimal times that may still appear in data)."""
        return self._lower.frontier

    @property
    def upper(self) -> tuple:
        """The upper frontier's elements (maximal times seen in data)."""
        return self._upper.elements

    @property
    def closed(self) -> bool:
        """True once the lower frontier is empty: no more data can be sent."""
        return self._lower.is_empty()

    def capabilities(self) -> dict:
        """``{time: count}`` of the capabilities held (positive counts only; a copy)."""
        return {t: c for t, c in self._lower.counts().items() if c > 0}

    def progress(self, updates: Iterable[tuple[Any, int]]) -> LowerFrontierUpdate | None:
        """Apply timely progress updates ``[(time, delta), ...]`` (capability counts).

        Returns the net change of the lower frontier as a :class:`LowerFrontierUpdate`, or
        ``None`` when the frontier did not change. Raises :class:`ProtocolError` (state
        unchanged) for updates that are not an iterable of pairs, a time of the wrong shape, a
        delta that is not an int, or — when ``strict`` — a batch that releases a capability never
        held or mints one not ``>=`` a held capability. Source: timely
        ``MutableAntichain::update_iter`` and ``Capability::delayed``."""
        try:
            items = list(updates)
        except TypeError:
            raise ProtocolError(f"progress updates must be an iterable of (time, delta) pairs, "
                                f"got {updates!r}") from None
        checked = []
        check = self._check
        for item in items:
            try:
                t, delta = item
            except (TypeError, ValueError):
                raise ProtocolError(f"progress update {item!r} is not a (time, delta) pair") from None
            if check is not None:
                t = check(t)
            if isinstance(delta, bool) or not isinstance(delta, int):
                raise ProtocolError(f"progress update {item!r}: delta must be an int")
            checked.append((t, delta))
        if self.strict:
            self._check_strict(checked)
        self._valid_in = _UNSET
        changes = self._lower.update_iter(checked)
        return LowerFrontierUpdate(tuple(changes)) if changes else None

    def _check_strict(self, checked: list) -> None:
        net: dict = {}
        for t, delta in checked:
            net[t] = net.get(t, 0) + delta
        lower = self._lower
        for t, delta in net.items():
            held = lower.count_for(t)
            if held + delta < 0:
                raise ProtocolError(
                    f"progress update releases a capability never held: time {t!r} would have "
                    f"count {held + delta} (held {held})")
            if delta > 0 and not lower.less_equal(t):
                raise ProtocolError(
                    f"progress update mints a capability at {t!r}, but no held capability is <= it "
                    f"(lower frontier {list(lower.frontier)!r}): the frontier cannot move backwards")

    def advance_to(self, time) -> LowerFrontierUpdate | None:
        """Downgrade every held capability to ``time`` (timely ``InputHandle::advance_to``):
        afterwards exactly one capability, at ``time``, is held. Returns the lower frontier's net
        change or ``None``. Raises :class:`ProtocolError` (state unchanged) if ``time`` has the
        wrong shape, no capability is held (closed), or some held capability is not ``<= time``
        (that would move the frontier backwards)."""
        if self._check is not None:
            time = self._check(time)
        held = self.capabilities()
        if not held:
            raise ProtocolError(f"advance_to({time!r}): no capability is held (closed)")
        le = self.order.le
        for c in held:
            if not le(c, time):
                raise ProtocolError(
                    f"advance_to({time!r}) would move the capability backwards from {c!r}")
        if held == {time: 1}:
            return None
        updates = [(c, -n) for c, n in held.items()]
        updates.append((time, 1))
        self._valid_in = _UNSET
        changes = self._lower.update_iter(updates)
        return LowerFrontierUpdate(tuple(changes)) if changes else None

    def check_data(self, time):
        """Validate a data time without changing state: return it normalised, or raise
        :class:`ProtocolError` when no lower-frontier element is ``<= time``."""
        last = self._valid_in
        if time is last or (type(time) is int and type(last) is int and time == last):
            return self._valid  # the time checked last, the lower frontier unchanged since
        given = time
        if self._check is not None:
            time = self._check(time)
        if not self._lower.less_equal(time):
            raise ProtocolError(
                f"data at time {time!r} is behind the lower frontier {list(self._lower.frontier)!r}: "
                "no capability held at or before it")
        if self._check is not None and (type(given) is int or type(given) is tuple):
            # checked (so a tuple holds only ints): immutable, safe to recognise again
            self._valid_in, self._valid = given, time
        return time

    def data(self, time, data) -> DataMessage:
        """Record a data batch at ``time``: updates the upper frontier and returns the
        :class:`DataMessage` to broadcast. Raises :class:`ProtocolError` (state unchanged) when the
        time has the wrong shape or no lower-frontier element is ``<= time``."""
        return DataMessage(self.accept(time), data)

    def accept(self, time):
        """:meth:`data` without building the message: validate ``time``, update the upper
        frontier, return the normalised time."""
        time = self.check_data(time)
        if time is not self._accepted:
            self._upper.insert(time)
            self._accepted = time
        return time

    def extends_upper(self, time) -> bool:
        """True iff data at ``time`` (normalised) would add an element to the upper frontier
        (no element is ``>= time`` yet). Pure query: lets a caller persist the grown upper
        frontier *before* the data leaves the process."""
        return not self._upper.less_equal(time)

    def snapshot(self) -> InitialFrontierSnapshot:
        """The :class:`InitialFrontierSnapshot` for a subscriber joining now."""
        return InitialFrontierSnapshot(self._lower.frontier, self._upper.elements)

    def close(self) -> LowerFrontierUpdate | None:
        """Release every capability (the partition will send no more data): returns the update
        that empties the lower frontier, or ``None`` if it was already empty."""
        counts = self._lower.counts()
        self._valid_in = _UNSET
        changes = self._lower.update_iter([(t, -c) for t, c in counts.items()])
        return LowerFrontierUpdate(tuple(changes)) if changes else None


class SubscriberProtocol:
    """A subscriber's side for all ``partitions`` partitions of a topic (Strymon "Subscriber
    Logic", merged across partitions like timely's replay of several streams).

    ``receive(partition, message) -> list`` returns what to pass on, in order: each
    :class:`DataMessage` that passed the filter and a :class:`LowerFrontierUpdate` with the net
    changes of the merged lower frontier. Until every partition's snapshot has arrived it buffers
    and returns ``[]`` (advancing earlier could announce a merged frontier that a later snapshot
    contradicts — timely-dataflow #81/#84). When the last snapshot arrives it returns the initial
    merged frontier as ``+1`` changes, followed by the buffered messages' results.

    - filter: the maximal antichain of all snapshots' upper elements; data at ``t`` is dropped iff
      ``t <= f`` for some filter element ``f``;
    - merged lower frontier: a :class:`MutableAntichain` that counts each partition's frontier
      elements separately;
    - retirement: filter element ``f`` is removed once no merged lower element is ``<= f``.

    ``as_of``: times (an antichain; differential dataflow's *as of*, the frontier a view is
    valid from) — data at ``t`` is also dropped unless some element is ``<= t``: a join at a
    position, or a re-join (eviction, publisher restart) at what was already seen complete, so
    no epoch is delivered twice. (``floor=``, its old name, is a deprecated alias; ``floor`` is
    still its name on the wire, docs/protocol.md.)

    Raises :class:`ProtocolError` for a partition out of range, a second snapshot from a
    partition, a message before a partition's snapshot, or delivered data behind the merged lower
    frontier. The state is unchanged by a rejected message.
    """

    def __init__(self, order, partitions: int = 1, *, as_of=None, floor=None):
        if floor is not None:  # deprecated alias, removed in the next release
            if as_of is not None:
                raise ValueError("pass as_of= (floor= is its deprecated alias), not both")
            as_of = floor
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
        self.order = order
        self.partitions = partitions
        self._snapshots: dict[int, InitialFrontierSnapshot] = {}
        self._buffer: dict[int, list] = {}
        self._ready = False
        self._lower = MutableAntichain(order)
        self._filter = Antichain(dual(order))
        self._le = order.le
        self._check = getattr(order, "check", None)
        self._as_of = None if as_of is None else Antichain(order, as_of)
        self.dropped = 0  # data messages dropped by the filter (or as_of)
        self.version = 0  # bumped whenever the filter or as_of changes (verdict caches key on it)

    # -- queries ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once every partition's snapshot has arrived."""
        return self._ready

    @property
    def lower(self) -> tuple:
        """The merged lower frontier's elements (empty until ready)."""
        return self._lower.frontier

    @property
    def filter(self) -> tuple:
        """The current filter's elements (the not yet retired upper-frontier elements)."""
        return self._filter.elements

    @property
    def snapshots(self) -> dict:
        """``{partition: InitialFrontierSnapshot}`` received so far."""
        return dict(self._snapshots)

    @property
    def finished(self) -> bool:
        """True once ready and the merged lower frontier is empty: no more data can arrive."""
        return self._ready and self._lower.is_empty()

    @property
    def filtering(self) -> bool:
        """True while some data may still be dropped (a filter element or a floor is set)."""
        return bool(self._filter) or self._as_of is not None

    def passes(self, time) -> bool:
        """True iff data at ``time`` would pass the current filter (lets the transport skip
        decoding payloads that will be dropped). Only meaningful once ``ready``."""
        if self._as_of is not None and not self._as_of.less_equal(time):
            return False
        le = self._le
        for f in self._filter:
            if le(time, f):
                return False
        return True

    def deliver(self, time, data, nbytes: int = 0) -> list:
        """Fast path for a data message at an already normalised ``time`` that the caller has
        checked with :meth:`passes` (once ready): validates it against the merged lower frontier
        and returns ``[DataMessage(time, data)]``. Raises :class:`ProtocolError` like
        :meth:`receive`."""
        return [self.deliver_message(time, data, nbytes)]

    def deliver_message(self, time, data, nbytes: int = 0) -> DataMessage:
        """:meth:`deliver` returning the one :class:`DataMessage` itself (``nbytes``: the
        encoded payload's size in bytes). Raises :class:`ProtocolError` if ``time`` is behind
        the merged lower frontier."""
        if not self._lower.less_equal(time):
            raise ProtocolError(
                f"data at time {time!r} is behind the merged lower frontier {list(self.lower)!r}")
        return data_message(time, data, nbytes)

    def advance_as_of(self, as_of) -> None:
        """Also drop data not at or beyond ``as_of`` (times, an antichain; joined with the
        ``as_of`` already set): a relay that had to widen its upstream subscription serves a
        joining subscriber only from there (docs/filters.md, "Relays"; the snapshot's ``floor``
        on the wire). Only before ``ready`` (afterwards part of an epoch could already have been
        passed on): else :class:`ProtocolError`, and for malformed times."""
        if self._ready:
            raise ProtocolError("a floor (as_of) arrived after every partition's snapshot")
        check = self._check or (lambda t: t)
        as_of = [check(t) for t in as_of]
        if not as_of:
            raise ProtocolError("an empty floor (as_of: no time at or beyond it)")
        if self._as_of is not None:
            as_of = list(join(self.order, self._as_of.elements, as_of))
        self._as_of = Antichain(self.order, as_of)
        self.version += 1

    #: deprecated alias of :meth:`advance_as_of`, removed in the next release
    raise_floor = advance_as_of

    # -- input -----------------------------------------------------------------------------
    def receive(self, partition: int, message) -> list:
        """Handle one message from ``partition``; return the list of messages to pass on."""
        if not isinstance(partition, int) or not 0 <= partition < self.partitions:
            raise ProtocolError(f"partition {partition!r} out of range 0..{self.partitions - 1}")
        if isinstance(message, InitialFrontierSnapshot):
            if partition in self._snapshots:
                raise ProtocolError(f"partition {partition} sent a second InitialFrontierSnapshot")
            snapshot = self._checked_snapshot(message)
            self._snapshots[partition] = snapshot
            if len(self._snapshots) < self.partitions:
                return []
            try:
                return self._start()
            except BaseException:
                del self._snapshots[partition]
                raise
        if not isinstance(message, (DataMessage, LowerFrontierUpdate)):
            raise ProtocolError(f"unknown message type {type(message).__name__}")
        if partition not in self._snapshots:
            raise ProtocolError(
                f"partition {partition} sent {type(message).__name__} before its InitialFrontierSnapshot")
        if not self._ready:
            # Normalise now, so a malformed time is refused from its sender, not later when
            # the last snapshot arrives.
            self._buffer.setdefault(partition, []).append(self._normalised(message))
            return []
        return self._process(message)

    def _normalised(self, message):
        check = self._check
        if check is None:
            return message
        if type(message) is DataMessage:
            t = check(message.time)
            if t != message.time or type(t) is not type(message.time):
                return DataMessage(t, message.data, message.nbytes)
            return message
        return LowerFrontierUpdate(tuple((check(t), d) for t, d in message.updates))

    def _checked_snapshot(self, s: InitialFrontierSnapshot) -> InitialFrontierSnapshot:
        check = self._check
        if check is None:
            return s
        return InitialFrontierSnapshot(tuple(check(t) for t in s.lower),
                                       tuple(check(t) for t in s.upper))

    def _start(self) -> list:
        # Before the start nothing but the snapshots and the buffer has changed: a buffered
        # message rejected here (data behind the merged lower frontier) restores exactly that.
        saved = (self._buffer, Antichain(self._filter.order, self._filter.elements), self._as_of,
                 self.version, self.dropped)
        try:
            return self._start_unguarded()
        except BaseException:
            self._buffer, self._filter, self._as_of, self.version, self.dropped = saved
            self._lower = MutableAntichain(self.order)
            self._ready = False
            raise

    def _start_unguarded(self) -> list:
        out: list = []
        ups = []
        for p in range(self.partitions):
            s = self._snapshots[p]
            ups.extend((t, 1) for t in s.lower)
            self._filter.extend(s.upper)
        changes = self._lower.update_iter(ups)
        self._ready = True
        self.version += 1
        self._retire()
        if changes:
            out.append(LowerFrontierUpdate(tuple(changes)))
        buffered, self._buffer = self._buffer, {}
        for p in sorted(buffered):
            for message in buffered[p]:
                out.extend(self._process(message))
        return out

    def _process(self, message) -> list:
        if type(message) is DataMessage:
            t = message.time
            if self._check is not None:
                t = self._check(t)
                if t != message.time or type(t) is not type(message.time):
                    message = DataMessage(t, message.data, message.nbytes)
            if self._filter:
                le = self._le
                for f in self._filter:
                    if le(t, f):
                        self.dropped += 1
                        return []
            if self._as_of is not None and not self._as_of.less_equal(t):
                self.dropped += 1
                return []
            if not self._lower.less_equal(t):
                raise ProtocolError(
                    f"data at time {t!r} is behind the merged lower frontier {list(self.lower)!r}")
            return [message]
        updates = message.updates
        if self._check is not None:
            updates = [(self._check(t), d) for t, d in updates]
        changes = self._lower.update_iter(updates)
        if self._filter or self._as_of is not None:
            self._retire()
        return [LowerFrontierUpdate(tuple(changes))] if changes else []

    def _retire(self) -> None:
        lower = self._lower
        keep = [f for f in self._filter if lower.less_equal(f)]
        if len(keep) != len(self._filter):
            self._filter = Antichain(self._filter.order, keep)
            self.version += 1
        # The floor is retired once every merged lower element is at or beyond it: all data that
        # can still arrive is then beyond the floor anyway.
        if self._as_of is not None and all(self._as_of.less_equal(t) for t in lower.frontier):
            self._as_of = None
            self.version += 1
