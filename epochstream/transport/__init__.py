"""Publisher and Subscriber over pyzmq: a ROUTER per partition, a DEALER per partition and
subscriber. The Strymon protocol itself is in :mod:`epochstream.protocol` (pure); this package
only drives it with sockets and threads.

Modules, one concept each:

- :mod:`~epochstream.transport.publisher` — :class:`Publisher`: the calling side (validates
  each call against its :class:`~epochstream.protocol.PublisherProtocol`, records the upper
  frontier) and the loop thread that owns the ROUTER;
- :mod:`~epochstream.transport.subscriber` — :class:`Subscriber`: joins every partition,
  merges them, hands out epochs or events, re-joins (``recover=True``);
- :mod:`~epochstream.transport.fanout` — pure fan-out policy: backlogs and their bounds,
  credit, probing, eviction;
- :mod:`~epochstream.transport.liveness` — pure liveness policy of a subscriber: pings,
  suspects, lost partitions, awaited successors;
- :mod:`~epochstream.transport.handoff` — caller threads → loop thread, with back-pressure;
- :mod:`~epochstream.transport.sockets` — every socket and its options;
- :mod:`~epochstream.transport.relay` — :class:`Relay`: one subscription upstream, a publisher
  of the tier ``topic@tier`` downstream.

No silent drops: the ROUTER has ``ROUTER_MANDATORY`` set and sends without blocking; when a
subscriber's pipe is full (``sndhwm`` messages) further messages wait in that subscriber's
bounded backlog. Past the bound the subscriber is evicted with an ``X lagged`` notice
(:class:`~epochstream.errors.SubscriberLagged`), or, with flow control, the producer is held
back. Other subscribers are not slowed down. See docs/protocol.md for the full specification.
"""

from ..events import Gap
from .publisher import Publisher
from .subscriber import Subscriber
from .relay import Relay

__all__ = ["Publisher", "Subscriber", "Gap", "Relay"]
