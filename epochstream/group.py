"""Consumer groups: workers that share the epochs of a topic, with leases, acks and redelivery
at epoch granularity (docs/consumers.md).

RavenDB's concurrent subscriptions (several workers on one subscription, a failed batch
redelivered, never two workers on the same item at once) and NATS JetStream's pull consumers
(ADR-13: ``fetch``, ``ack``/``nak``/``in_progress``, ``max_deliver``, ``ack_wait``) set the
expectations; the unit here is the whole epoch, and times may be partially ordered.

A group reads its epochs from the topic's durable history (the publishers need
``retention=Retention(...)``): an epoch can be leased once it is complete in every partition's
log. Its state (leases with fencing tokens, acks, delivery counts, its position) lives in the
catalog, and every claim, ack and release is one ``BEGIN IMMEDIATE`` transaction, so workers in
several processes coordinate without a server. The lease rules are the pure
:func:`~epochstream.leases.plan`.

>>> import tempfile
>>> from epochstream import Catalog, Publisher, Retention, EpochGroup
>>> cat = Catalog(tempfile.mkdtemp())
>>> with Publisher("jobs", catalog=cat, retention=Retention()) as pub:
...     for t in range(3):
...         pub.send(t, [["job", t]])
...         _ = pub.advance_to(t + 1)
>>> group = EpochGroup("jobs", "workers", catalog=cat)
>>> done = []
>>> for lease in group.leases():
...     done.append(lease.epoch.time)
...     lease.ack()
>>> done, group.position
([0, 1, 2], (3,))
"""

from __future__ import annotations

import logging
import math
import zlib
import os
import time as _time
import uuid
from typing import Any, Callable, Iterator

import msgpack

from .catalog import Catalog
from .catalog.groups import Claimed, GroupInfo
from .catalog.holders import HOST
from .errors import GroupStopped, HistoryUnavailable
from .events import Epoch
from .frontier import Antichain, join
from .log.reader import History
from .leases import MODES, WHOLE, Plan, group_position, plan

__all__ = ["EpochGroup", "Lease"]

log = logging.getLogger("epochstream.group")


def p_left(candidates, position, order) -> bool:
    """True iff some candidate is at or beyond ``position`` (not settled yet)."""
    pos = Antichain(order, position or ())
    return any(pos.less_equal(t) for t in candidates)


class Lease:
    """One epoch leased to this worker: ``epoch`` (the whole :class:`~epochstream.events.Epoch`),
    ``deliveries`` (how many times it was handed out, this one included), ``token`` (the
    fencing token), ``deadline`` (seconds since the epoch, on the catalog's clock, when the lease ends unless extended),
    ``history`` (``((worker, time.time()), ...)`` per delivery); in ``key_shared`` mode
    ``bucket`` (the epoch holds only that bucket's records), else ``None``.

    :meth:`ack`, :meth:`nak` and :meth:`in_progress` raise
    :class:`~epochstream.errors.LeaseExpired` when the lease is no longer held (deadline passed,
    leased again, settled already): an epoch is never completed twice."""

    __slots__ = ("group", "epoch", "bucket", "deliveries", "token", "deadline", "history")

    def __init__(self, group: "EpochGroup", epoch: Epoch, claimed: Claimed):
        self.group = group
        self.epoch = epoch
        self.bucket = claimed.unit[1] if claimed.unit[1] != WHOLE else None
        self.deliveries = claimed.deliveries
        self.token = claimed.token
        self.deadline = claimed.deadline
        self.history = claimed.history

    def ack(self) -> None:
        """The epoch is processed: it is never leased again."""
        self.group._settle(self, "ack")

    def nak(self, delay: float = 0.0) -> None:
        """Give the epoch back: it may be leased again after ``delay`` seconds."""
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0 \
                or not math.isfinite(delay):
            raise ValueError(f"delay must be seconds >= 0, got {delay!r}")
        self.group._settle(self, "nak", float(delay))

    def in_progress(self) -> float:
        """Still working: extend the lease by ``ack_wait`` from now; returns the new deadline
        (``time.time()`` seconds)."""
        self.deadline = self.group._settle(self, "extend")
        return self.deadline

    def __repr__(self) -> str:
        bucket = "" if self.bucket is None else f", bucket={self.bucket}"
        return (f"Lease(epoch={self.epoch.time!r}{bucket}, deliveries={self.deliveries}, "
                f"token={self.token})")


class EpochGroup:
    """A consumer group on ``topic`` named ``name`` (created on first use; later workers must
    give the same definition).

    - ``catalog``: a :class:`~epochstream.catalog.Catalog`, a path, or ``None`` (the default);
    - ``mode``: ``"shared"`` (any free epoch to any worker), ``"ordered"`` (one epoch at a
      time, in order), ``"partial"`` (an epoch once every epoch ``<`` it is acked:
      incomparable epochs in parallel) or ``"key_shared"`` (per-key order: buckets of epochs)
      — see :mod:`epochstream.leases`;
    - ``ack_wait``: seconds a lease holds before the epoch is offered again (extend it with
      :meth:`Lease.in_progress`); a lease of a worker whose process ended is released at once;
    - ``max_deliver``: deliveries without an ack after which the epoch goes to ``dead_letter``
      (a topic: the epoch, whole, with its delivery history, as one msgpack record
      ``{"topic", "group", "time", "deliveries", "codec", "payloads": [[partition, bytes]...]}``
      per dead epoch) or, without one, the group stops with
      :class:`~epochstream.errors.GroupStopped` — never a silent drop;
    - ``worker``: this worker's name (default ``host:pid:random``);
    - ``key`` and ``buckets`` (``key_shared`` mode only): the record key — a column name (Arrow
      topics), a map key or a tuple index (msgpack records), or a function ``record -> key`` —
      and the number of buckets (default 16). A record goes to bucket
      ``crc32(msgpack(key)) % buckets`` (stable across processes); a lease is one bucket of one
      epoch, whole, and the buckets of an epoch are acked separately (the epoch is settled once
      all its non-empty buckets are).

    Raises ``ValueError`` for bad arguments, :class:`~epochstream.errors.TopicNotFound` for an
    unknown topic, :class:`~epochstream.errors.CatalogError` if the group exists with another
    definition; reading raises :class:`~epochstream.errors.HistoryUnavailable` when the topic's
    partitions keep no epoch log.
    """

    def __init__(self, topic: str, name: str, catalog: Any = None, *, mode: str = "shared",
                 ack_wait: float = 30.0, max_deliver: int = 5, dead_letter: str | None = None,
                 worker: str | None = None, poll_interval: float = 0.05,
                 key: str | int | Callable[[Any], Any] | None = None, buckets: int = 16):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(ack_wait, bool) or not isinstance(ack_wait, (int, float)) or \
                not math.isfinite(ack_wait) or ack_wait <= 0:
            raise ValueError(f"ack_wait must be seconds > 0, got {ack_wait!r}")
        if isinstance(max_deliver, bool) or not isinstance(max_deliver, int) or max_deliver < 1:
            raise ValueError(f"max_deliver must be an int >= 1, got {max_deliver!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if (mode == "key_shared") != (key is not None):
            raise ValueError("key= is required in key_shared mode, and only there")
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 4096:
            raise ValueError(f"buckets must be an int in 1..4096, got {buckets!r}")
        self.key, self.buckets = key, buckets
        self._split: dict = {}  # time -> {bucket: records} (key_shared), for leased epochs
        self.topic, self.name, self.mode = topic, name, mode
        self.ack_wait, self.max_deliver, self.dead_letter = float(ack_wait), max_deliver, dead_letter
        self.catalog = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        self.history = History(topic, self.catalog)
        self.order = self.history.order
        self.worker = worker or f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.poll_interval = float(poll_interval)
        info = self.catalog.group_open(topic, name, mode=mode, ack_wait=ack_wait,
                                       max_deliver=max_deliver, dead_letter=dead_letter)
        self._position: tuple | None = info.position
        self._finished = False

    # -- queries ---------------------------------------------------------------------------
    @property
    def position(self) -> tuple | None:
        """The group's acked frontier as of this worker's last fetch (a tuple of times: every
        epoch not at or beyond it is acked or dead-lettered). Once a total-order topic's logs
        finished and everything is settled it is ``(upper + 1,)``, where a continued stream
        starts; for other orders ``()``."""
        return self._position

    def info(self) -> GroupInfo:
        """The group as stored in the catalog now."""
        return self.catalog.group_info(self.topic, self.name)

    # -- leasing ---------------------------------------------------------------------------
    def fetch(self, max_epochs: int = 1, expires: float | None = None) -> list[Lease]:
        """Lease up to ``max_epochs`` epochs. Waits up to ``expires`` seconds for at least one
        (``None``: until one is free or the topic ended and every epoch is settled); returns
        ``[]`` on timeout or at the end — never raises for "nothing yet". Raises
        :class:`~epochstream.errors.GroupStopped` (an epoch exhausted ``max_deliver`` without a
        dead-letter topic), :class:`~epochstream.errors.HistoryUnavailable`,
        :class:`~epochstream.errors.HistoryCorrupt`."""
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"max_epochs must be an int >= 1, got {max_epochs!r}")
        deadline = None if expires is None else _time.monotonic() + float(expires)
        while True:
            leases = self._try(max_epochs)
            if leases:
                return leases
            if self._finished:
                return []
            if deadline is not None:
                left = deadline - _time.monotonic()
                if left <= 0:
                    return []
                _time.sleep(min(self.poll_interval, left))
            else:
                _time.sleep(self.poll_interval)

    def leases(self, expires: float | None = None) -> Iterator[Lease]:
        """Yield leases one by one until the topic ended and every epoch is settled (or, with
        ``expires``, until no epoch was free for that many seconds). Ack each one."""
        while True:
            got = self.fetch(1, expires)
            if not got:
                return
            yield from got

    def _try(self, max_epochs: int) -> list[Lease]:
        order = self.order
        states = self.history.states()  # read once for the whole fetch (with the lookup)
        info = self.catalog.lookup(self.topic)
        lower = Antichain(order)
        uppers = []
        for s in states.values():  # epochs at or beyond any partition's lower are incomplete
            lower.extend(s.lower)
            uppers.extend(s.upper)
        try:
            recs = self.history.records(since=list(self._position) if self._position else None,
                                        states=states, info=info)
        except HistoryUnavailable:
            info = self.catalog.group_info(self.topic, self.name)
            if info.state == "stopped":
                raise GroupStopped(f"consumer group {self.name!r} of topic {self.topic!r} "
                                   f"stopped: {info.reason}") from None
            raise
        by_time = dict(recs)
        if self.mode == "key_shared":
            candidates = [(t, b) for t, r in recs for b in sorted(self._buckets(t, r))]
        else:
            candidates = [(t, WHOLE) for t, _ in recs]
        total = getattr(order, "name", None) == "total"

        def decide(epoch_states: dict, now: float, stored: tuple | None):
            cands = candidates
            if stored is not None:  # another worker moved the position past some of them
                at = Antichain(order, stored)
                cands = [u for u in candidates if at.less_equal(u[0])]
            p = plan(order, self.mode, cands, epoch_states, now=now, max_epochs=max_epochs,
                     max_deliver=self.max_deliver)
            pos = group_position(order, cands, epoch_states, lower.elements)
            if not pos and total and uppers:  # all settled and the logs finished: a stream
                pos = (max(uppers) + 1,)      # that continues them starts after their upper
            if stored and pos:  # never backwards (this worker's view may be older than
                pos = join(order, stored, pos)  # another's); () is past everything already
            if p.exhausted and self.dead_letter is None:  # the group stops: lease nothing
                p = Plan((), p.exhausted[:1])
            return p, pos

        claimed, exhausted, position = self.catalog.group_claim(self.topic, self.name,
                                                                self.worker, decide)
        if position is not None:
            self._position = position
        self._finished = not lower and not p_left([u[0] for u in candidates], position, order)
        if len(self._split) > 1024:
            self._split.clear()
        for c in exhausted:
            self._dead_letter(c, by_time[c.unit[0]])
        return [Lease(self, self._epoch(c.unit, by_time[c.unit[0]], states, info), c)
                for c in claimed]

    def _epoch(self, unit, recs, states=None, info=None) -> Epoch:
        t, bucket = unit
        codec = self.history.codec
        chunks = [codec.decode(p) for _, p in self.history.payloads(recs, states=states,
                                                                    info=info)]
        records = codec.combine(chunks)
        if bucket != WHOLE:
            records = self._split_records(records)[bucket]
        return Epoch(t, records, len(chunks), sum(r.nbytes for r in recs),
                     max(r.completed_at for r in recs), _time.time())

    # -- key_shared ------------------------------------------------------------------------
    def _bucket_of(self, k) -> int:
        return zlib.crc32(msgpack.packb(k, use_bin_type=True, default=str)) % self.buckets

    def _split_records(self, records) -> dict:
        """``{bucket: records of that bucket}`` (a list, or a ``pyarrow.Table`` for Arrow)."""
        key = self.key
        if self.history.codec.name == "arrow":
            import pyarrow as pa
            import pyarrow.compute as pc

            if not isinstance(key, str):
                raise ValueError("key_shared on an Arrow topic needs key= a column name")
            values = records.column(key).to_pylist()
            ids = [self._bucket_of(v) for v in values]
            arr = pa.array(ids, pa.int32())
            return {b: records.filter(pc.equal(arr, b)) for b in sorted(set(ids))}
        out: dict = {}
        for r in records:
            k = key(r) if callable(key) else r[key]
            out.setdefault(self._bucket_of(k), []).append(r)
        return out

    def _buckets(self, t, recs) -> set:
        """The non-empty buckets of epoch ``t`` (decoded once per worker, then cached)."""
        got = self._split.get(t)
        if got is None:
            codec = self.history.codec
            chunks = [codec.decode(p) for _, p in self.history.payloads(recs)]
            got = self._split[t] = set(self._split_records(codec.combine(chunks)))
        return got

    def _dead_letter(self, claimed: Claimed, recs) -> None:
        t, bucket = claimed.unit
        if self.dead_letter is None:
            reason = (f"epoch {t!r} was delivered {claimed.deliveries} times without an ack "
                      f"(max_deliver={self.max_deliver}) and the group has no dead_letter topic")
            self.catalog.group_settle(self.topic, self.name, claimed.unit, claimed.token,
                                      outcome="nak")  # free again: a reset leases it anew
            self.catalog.group_stop(self.topic, self.name, reason)
            raise GroupStopped(f"consumer group {self.name!r} of topic {self.topic!r} stopped: "
                               f"{reason}")
        from .retention import Retention
        from .transport import Publisher

        record = {"topic": self.topic, "group": self.name,
                  "time": list(t) if isinstance(t, tuple) else t,
                  "bucket": None if bucket == WHOLE else bucket,
                  "deliveries": [list(h) for h in claimed.history],
                  "codec": self.history.codec.name,
                  "payloads": [[p, bytes(b)] for p, b in self.history.payloads(recs)]}
        deadline = _time.monotonic() + 10.0
        while True:
            try:
                with Publisher(self.dead_letter, catalog=self.catalog,
                               retention=Retention()) as pub:
                    t0 = pub.lower[0]
                    pub.send(t0, [record])
                    pub.advance_to(t0 + 1)
                break
            except Exception as e:  # another worker dead-letters at the same moment
                if _time.monotonic() > deadline:
                    raise
                log.debug("dead-letter publish retry: %r", e)
                _time.sleep(0.05)
        self.catalog.group_settle(self.topic, self.name, claimed.unit, claimed.token,
                                  outcome="dead")
        log.warning("consumer group %r of %r: epoch %r dead-lettered to %r after %d deliveries",
                    self.name, self.topic, t, self.dead_letter, claimed.deliveries)

    def _settle(self, lease: Lease, outcome: str, delay: float = 0.0) -> float:
        unit = (lease.epoch.time, WHOLE if lease.bucket is None else lease.bucket)
        return self.catalog.group_settle(self.topic, self.name, unit, lease.token,
                                         outcome=outcome, delay=delay)

    def reset(self) -> None:
        """Re-activate a stopped group: its exhausted epochs are leased again with fresh
        delivery counts."""
        self.catalog.group_reset(self.topic, self.name)

    def __repr__(self) -> str:
        return (f"EpochGroup({self.topic!r}, {self.name!r}, mode={self.mode!r}, "
                f"worker={self.worker!r}, position={self._position!r})")
