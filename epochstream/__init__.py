"""epochstream — epoch-atomic publish/subscribe for streaming dataflows.

A subscriber can attach to a running dataflow at any moment and sees every epoch (logical time,
possibly partially ordered) either whole or not at all, plus the stream's progress (frontier).
The design follows Strymon's pubsub protocol; the frontier algebra follows timely-dataflow.

Layers (imports point only downward; docs/architecture.md has one line per module):
:mod:`~epochstream.errors` → :mod:`~epochstream.order` → :mod:`~epochstream.frontier` →
:mod:`~epochstream.events` → :mod:`~epochstream.protocol` (sans-I/O) → :mod:`~epochstream.wire` →
:mod:`~epochstream.catalog` → :mod:`~epochstream.transport` (:class:`Publisher`,
:class:`Subscriber`) → :mod:`~epochstream.spark` → :mod:`~epochstream.cli`.

Heavy layers are imported lazily, so ``import epochstream.order`` needs neither pyzmq nor pyarrow.
"""

from typing import TYPE_CHECKING

from .errors import (CatalogError, CatalogUnavailable, EpochstreamError, Fenced, GroupStopped,
                     HistoryCorrupt, HistoryError, HistoryUnavailable, HistoryWriteError,
                     LeaseExpired, PartitionHeld, ProtocolError,
                     PublisherAborted, PublisherLost, SubscriberLagged, SubscriptionExpired,
                     SubscriptionHeld, TopicClosed, TopicNotFound, WireError, FilterError,
                     NotAuthorized)

__version__ = "0.1.0"

if TYPE_CHECKING:  # the lazy names below, with their real types for type checkers
    from .catalog import Catalog as Catalog
    from .events import DataMessage as DataMessage, Epoch as Epoch, Gap as Gap
    from .events import FetchResult as FetchResult
    from .events import InitialFrontierSnapshot as InitialFrontierSnapshot
    from .events import LowerFrontierUpdate as LowerFrontierUpdate
    from .frontier import Antichain as Antichain, MutableAntichain as MutableAntichain
    from .order import TOTAL as TOTAL, product as product
    from .protocol import EpochAssembler as EpochAssembler
    from .protocol import PublisherProtocol as PublisherProtocol
    from .protocol import SubscriberProtocol as SubscriberProtocol
    from .transport import Publisher as Publisher, Subscriber as Subscriber
    from .transport import Relay as Relay
    from .retention import Retention as Retention
    from .log.reader import History as History
    from .group import EpochGroup as EpochGroup, Lease as Lease
    from .filters import Filter as Filter
    from .options import Credit as Credit, Durable as Durable
    from .security import Security as Security

_LAZY = {
    "TOTAL": "order", "product": "order",
    "Antichain": "frontier", "MutableAntichain": "frontier",
    "Epoch": "events", "Gap": "events", "InitialFrontierSnapshot": "events",
    "LowerFrontierUpdate": "events", "DataMessage": "events", "FetchResult": "events",
    "EpochAssembler": "protocol", "PublisherProtocol": "protocol", "SubscriberProtocol": "protocol",
    "Publisher": "transport", "Subscriber": "transport", "Relay": "transport",
    "Catalog": "catalog",
    "Retention": "retention", "History": "log.reader", "EpochGroup": "group", "Lease": "group",
    "Filter": "filters", "Credit": "options", "Durable": "options",
    "Security": "security",
}

__all__ = ["EpochstreamError", "ProtocolError", "WireError", "CatalogError", "TopicNotFound",
           "PartitionHeld", "SubscriberLagged", "PublisherLost", "PublisherAborted", "HistoryError",
           "HistoryUnavailable", "HistoryCorrupt", "HistoryWriteError", "SubscriptionExpired",
           "SubscriptionHeld", "LeaseExpired", "GroupStopped", "TopicClosed",
           "CatalogUnavailable", "Fenced", "FilterError", "NotAuthorized", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epochstream' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
