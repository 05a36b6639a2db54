"""Property-testing toolkit for epochstream and for your own timestamps (needs ``hypothesis``:
``pip install 'epochstream[test]'``). See ``docs/testing.md``.

Every name below is importable from ``epochstream.testing``; each lives in one module:

Strategies (:mod:`epochstream.testing.strategies`)
    :func:`times`, :func:`antichains`, :func:`orders` and :func:`event_streams` — the last one
    generates valid timely-style publisher event sequences for several partitions plus random
    subscribe points (:class:`EventStream`); :func:`universe` is the small set of times they
    draw from.

Oracle (:mod:`epochstream.testing.model`)
    :func:`oracle` — a brute-force model (plain sets, O(n²) minimal elements; it never touches
    :mod:`epochstream.frontier` or :mod:`epochstream.protocol`) of what a subscriber that joined
    each partition at a given event index must deliver: the epochs it delivers whole, those it
    must never deliver, the filter and the final merged frontier (:class:`Expected`);
    :func:`minimal`, :func:`maximal` and :func:`lower_after` are its brute-force helpers.

Checks
    :func:`check_order` (:mod:`epochstream.testing.order_laws`) — validates a user-defined order
    object (``le``/``lt``/``minimum`` and an optional ``key``) on a list of times, raising
    :class:`OrderViolation`; :func:`assert_epoch_atomic` (:mod:`epochstream.testing.checker`) —
    drives the production protocol (:class:`~epochstream.protocol.PublisherProtocol`,
    :class:`~epochstream.protocol.SubscriberProtocol`,
    :class:`~epochstream.protocol.EpochAssembler`) through an event stream with :func:`replay`,
    checking against the oracle after *every* message the subscriber receives
    (:class:`AtomicityChecker`).

Events (one list per partition, in that partition's order):

- ``("progress", [(time, delta), ...])`` — one batch of timely capability-count updates;
- ``("data", time, records)`` — a batch of records (a list) at ``time``;
- ``("close",)`` — the partition releases every capability (``PublisherProtocol.close``);
  :func:`apply_event` applies one to a ``PublisherProtocol``.

Every partition starts holding one capability at ``order.minimum`` (count 1).

Importing this package loads neither :mod:`epochstream.frontier` nor :mod:`epochstream.protocol`
(the checker imports the protocol on first use), so the oracle and the strategies are provably
independent of the code they test.
"""

from .checker import AtomicityChecker, Replay, apply_event, assert_epoch_atomic, replay
from .model import Expected, lower_after, maximal, minimal, oracle
from .order_laws import OrderViolation, check_order
from .strategies import EventStream, antichains, event_streams, orders, times, universe

__all__ = ["OrderViolation", "check_order", "apply_event", "universe", "orders", "times", "antichains",
           "EventStream", "event_streams", "Expected", "oracle", "minimal", "maximal",
           "lower_after", "Replay", "replay", "AtomicityChecker", "assert_epoch_atomic"]
