"""Driving the production protocol through a generated stream and checking it against the
oracle: :func:`replay` runs :class:`~epochstream.protocol.PublisherProtocol` per partition and
one :class:`~epochstream.protocol.SubscriberProtocol` with an
:class:`~epochstream.protocol.EpochAssembler`; :class:`AtomicityChecker` compares the
subscriber with :func:`~epochstream.testing.model.oracle` after every message it receives;
:func:`assert_epoch_atomic` does both.

This is the toolkit's only module that uses the production protocol, and it imports it inside
:func:`_protocol`, not at the top: importing :mod:`epochstream.testing` (and so the oracle and
the strategies) never loads :mod:`epochstream.protocol` or :mod:`epochstream.frontier`, which
``tests/test_testing_toolkit.py`` checks by importing the toolkit with both made unimportable.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..events import DataMessage
from .model import Expected, lower_after, minimal, oracle
from .strategies import EventStream

__all__ = ["apply_event", "Replay", "replay", "AtomicityChecker", "assert_epoch_atomic"]


def _protocol():
    """The production :mod:`epochstream.protocol` module, imported on first use.

    Imported here, not at the top: the toolkit's top level (and so the oracle) stays provably
    independent of the production frontier/protocol code (see test_testing_toolkit)."""
    from .. import protocol

    return protocol


@dataclass
class Replay:
    """Result of :func:`replay`: ``epochs`` released (in order), the subscriber and the
    per-partition messages it received (``sent[p]``: ``(message, state_index)`` pairs —
    the partition's event count after which the message was produced)."""

    epochs: list
    subscriber: Any
    sent: list
    received: list = field(default_factory=list)


def apply_event(pub, event):
    """Apply one generated event (``("data", t, records)``, ``("progress", updates)`` or
    ``("close",)``) to a :class:`~epochstream.protocol.PublisherProtocol`; return the message it
    produces (or ``None``)."""
    if event[0] == "data":
        return pub.data(event[1], list(event[2]))
    if event[0] == "progress":
        return pub.progress(event[1])
    return pub.close()


def _publish(order, evs, j) -> list:
    """Run one partition's events ``evs`` through a fresh ``PublisherProtocol``: the snapshot
    taken before ``evs[j]`` and every message produced from then on, as ``(message, state)``
    pairs (``state``: the partition's event count the message reflects)."""
    pub = _protocol().PublisherProtocol(order)
    msgs = []
    snapshot = None
    for i, e in enumerate(evs):
        if i == j:
            snapshot = pub.snapshot()
        m = apply_event(pub, e)
        if m is not None and i >= j:
            msgs.append((m, i + 1))
    if snapshot is None:
        snapshot = pub.snapshot()
    return [(snapshot, j)] + msgs


def replay(order, events: Sequence[Sequence], joins: Sequence[int],
           schedule: Sequence[int] = (), on_receive: Callable | None = None) -> Replay:
    """Run :class:`~epochstream.protocol.PublisherProtocol` per partition over ``events``,
    attach one :class:`~epochstream.protocol.SubscriberProtocol` (snapshot of partition ``p``
    taken before ``events[p][joins[p]]``) and feed it every message after the snapshot, the
    partitions interleaved by ``schedule`` (step ``k`` takes the next message of the
    ``schedule[k] % len(non-empty queues)``-th partition that has one; then round-robin).
    Released epochs are assembled with :class:`~epochstream.protocol.EpochAssembler`.

    ``on_receive(subscriber, partition, message, outputs, released, state)`` is called after
    every message (``state[p]``: partition ``p``'s event count reflected in what the subscriber
    has; ``released``: the epochs this message completed)."""
    protocol = _protocol()
    n = len(events)
    queues = [collections.deque(_publish(order, evs, j)) for evs, j in zip(events, joins)]
    sent = [list(q) for q in queues]
    sub = protocol.SubscriberProtocol(order, n)
    asm = protocol.EpochAssembler(order)
    epochs: list = []
    state = [None] * n
    received = []
    steps = iter(schedule)
    while True:
        live = [p for p in range(n) if queues[p]]
        if not live:
            break
        s = next(steps, None)
        p = live[(s if s is not None else len(received)) % len(live)]
        msg, idx = queues[p].popleft()
        state[p] = idx
        outs = sub.receive(p, msg)
        released = []
        for o in outs:
            if isinstance(o, DataMessage):
                asm.data(o)
            else:
                released.extend(asm.frontier_changed(o))
        epochs.extend(released)
        received.append((p, msg))
        if on_receive is not None:
            on_receive(sub, p, msg, outs, released, tuple(state))
    return Replay(epochs, sub, sent, received)


class AtomicityChecker:
    """Checks one subscriber's outputs against the :func:`oracle`, message by message.

    ``AtomicityChecker(order, events, joins)``; call :meth:`after` after every message the
    subscriber receives (same arguments as :func:`replay`'s ``on_receive``) and :meth:`finish`
    once everything was received. See :func:`assert_epoch_atomic` for what is checked."""

    def __init__(self, order, events, joins):
        self.order = order
        self.events = events
        self.joins = tuple(joins)
        self.expected = oracle(order, events, joins)
        self._lowers = [[lower_after(order, e, i) for i in range(len(e) + 1)] for e in events]
        self.released: dict = {}
        self.messages = 0

    def merged_lower(self, state) -> frozenset:
        """Brute force: minimal elements of the union of partition ``p``'s lower frontier after
        ``state[p]`` events, over all partitions."""
        return minimal(self.order, [t for q, i in enumerate(state) for t in self._lowers[q][i]])

    def after(self, sub, p, msg, outs, new, state) -> None:
        le = self.order.le
        exp = self.expected
        released = self.released
        self.messages += 1
        ctx = f"after partition {p} sent {msg!r} (state {state}, joins {self.joins})"
        if not sub.ready:
            assert outs == [] and sub.lower == (), f"output before every snapshot is in {ctx}: {outs!r}"
            assert not new, f"epochs released before every snapshot is in {ctx}"
            return
        merged = self.merged_lower(state)
        assert set(sub.lower) == set(merged), \
            f"merged lower {sub.lower!r} != {sorted(merged, key=repr)!r} {ctx}"
        want_filter = {f for f in exp.filter if any(le(e, f) for e in merged)}
        assert set(sub.filter) == want_filter, \
            f"filter {sub.filter!r} != {sorted(want_filter, key=repr)!r} {ctx}"
        for ep in new:
            assert ep.time not in released, f"epoch {ep.time!r} released twice {ctx}"
            assert ep.time in exp.delivered, (
                f"epoch {ep.time!r} released but the oracle says it is "
                f"{'dropped (not latent at join)' if ep.time in exp.dropped else 'incomplete'} {ctx}")
            got = sorted(ep.records, key=repr)
            assert got == exp.delivered[ep.time], \
                f"partial epoch {ep.time!r}: got {got!r}, want {exp.delivered[ep.time]!r} {ctx}"
            released[ep.time] = got
        due = {t for t in exp.delivered if not any(le(e, t) for e in merged)}
        assert set(released) == due, (
            f"released {sorted(released, key=repr)!r} but the frontier {sorted(merged, key=repr)!r} "
            f"has passed {sorted(due, key=repr)!r} {ctx}")

    def finish(self, sub) -> "Expected":
        exp = self.expected
        assert sub.ready, "subscriber never became ready"
        assert set(self.released) == set(exp.delivered), (
            f"delivered {sorted(self.released, key=repr)!r}, oracle wants "
            f"{sorted(exp.delivered, key=repr)!r}")
        assert set(sub.lower) == set(exp.final_frontier), \
            f"final merged frontier {sub.lower!r} != {sorted(exp.final_frontier, key=repr)!r}"
        return exp


def assert_epoch_atomic(stream_or_order, events=None, joins=None, schedule: Sequence[int] = ()):
    """Check the production protocol against the :func:`oracle` after every message.

    Call as ``assert_epoch_atomic(stream, joins)`` (an :class:`EventStream`) or
    ``assert_epoch_atomic(order, events, joins)``; ``schedule`` interleaves the partitions at the
    subscriber (see :func:`replay`). After each message the subscriber receives:

    - before every snapshot is in, nothing is passed on and the merged lower frontier is empty
      (timely-dataflow #81/#84);
    - the merged lower frontier equals the minimal elements of the union of the partitions'
      lower frontiers as of the messages received (brute force);
    - the filter holds exactly the snapshot-upper maxima that some merged lower element is
      still ``<=`` (retired no earlier than safe, and as soon as it is);
    - every released epoch is whole (records equal the union over partitions of all data at its
      time) and latent at join; an epoch is released exactly when the merged frontier passes it.

    At the end: released epochs == ``oracle(...).delivered``, final merged frontier ==
    ``final_frontier``. Returns the :class:`Expected`. Raises ``AssertionError``."""
    if isinstance(stream_or_order, EventStream):
        order, evs = stream_or_order.order, stream_or_order.events
        joins = events if joins is None else joins
    else:
        order, evs = stream_or_order, events
    checker = AtomicityChecker(order, evs, joins)
    rep = replay(order, evs, joins, schedule, checker.after)
    return checker.finish(rep.subscriber)
