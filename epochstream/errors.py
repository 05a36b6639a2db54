"""Exception hierarchy of epochstream.

Every error the library raises derives from :class:`EpochstreamError`, so a caller can catch
everything of ours in one clause and still tell the cases apart:

- :class:`ProtocolError` — a message or call that violates the Strymon pubsub protocol
  (data behind the lower frontier, a time of the wrong shape for the topic's order, ...).
- :class:`WireError` — a frame sequence that cannot be decoded (a :class:`ProtocolError`
  subclass: malformed input is a protocol violation by the peer that sent it).
- :class:`TopicNotFound`, :class:`PartitionHeld`, :class:`CatalogError` — catalog lookups;
  :class:`CatalogUnavailable` — the network catalog did not answer in time;
  :class:`Fenced` — a publisher superseded by a newer generation of its partition.
- :class:`SubscriberLagged` — the publisher evicted a subscriber that fell too far behind.
- :class:`PublisherLost` — a partition's publisher stopped answering (no heartbeat in time).
- :class:`PublisherAborted` — a partition's publisher ended abnormally (an exception left its
  ``with`` block): its open epochs will never complete.
- :class:`HistoryError` and its subclasses — durable history (docs/history.md):
  :class:`HistoryUnavailable` (the requested position is older than what is retained),
  :class:`HistoryCorrupt` (a segment failed its checksum or is truncated),
  :class:`HistoryWriteError` (the publisher cannot log an epoch: it refuses to complete it),
  :class:`SubscriptionExpired` (a durable subscription fell behind retention);
  :class:`SubscriptionHeld` — a durable subscription's name is held by another live subscriber.
- :class:`LeaseExpired`, :class:`GroupStopped` — consumer groups (docs/consumers.md).
- :class:`TopicClosed` — a ``start="latest"`` subscriber found every partition closed and no new
  publisher within its ``wait``.
- :class:`NotAuthorized` — a secured publisher refused this subscriber: no ``subscribe`` grant
  for the topic, or the two sides' security does not match (docs/security.md).
"""

from __future__ import annotations

__all__ = ["EpochstreamError", "ProtocolError", "WireError", "CatalogError", "TopicNotFound",
           "PartitionHeld", "CatalogUnavailable", "SubscriberLagged", "PublisherLost",
           "PublisherAborted", "HistoryError",
           "HistoryUnavailable", "HistoryCorrupt", "HistoryWriteError", "SubscriptionExpired",
           "SubscriptionHeld", "LeaseExpired", "GroupStopped", "TopicClosed", "FilterError",
           "NotAuthorized", "Fenced"]


class EpochstreamError(Exception):
    """Base class of every exception raised by epochstream."""


class ProtocolError(EpochstreamError):
    """A message or call violates the pubsub protocol (Strymon pubsub protocol, "Protocol
    Messages"). Raised by the pure state machines in :mod:`epochstream.protocol`; the state
    machine is left unchanged, so the caller may go on with valid input."""


class WireError(ProtocolError):
    """A multipart frame sequence could not be decoded: wrong frame count, unknown kind or
    protocol version, a header that is not valid msgpack, or a payload the codec rejects."""


class CatalogError(EpochstreamError):
    """The catalog refused an operation (conflicting topic definition, bad partition index)."""


class TopicNotFound(CatalogError, LookupError):
    """``Catalog.lookup(topic)`` found no such topic. ``existing`` lists the topics that do exist."""

    def __init__(self, topic: str, existing: list[str] | tuple[str, ...] = ()):
        self.topic = topic
        self.existing = tuple(existing)
        known = ", ".join(self.existing) if self.existing else "none"
        super().__init__(f"unknown topic {topic!r}; existing topics: {known}")


class PartitionHeld(CatalogError):
    """Registering a partition that a live publisher already holds."""


class Fenced(CatalogError):
    """A publisher's write to the catalog was refused because a newer generation holds its
    partition now (another incarnation registered it after this one's lease expired, or after it
    was judged dead): Kafka's ``ProducerFencedException``. The fenced publisher aborts its own
    stream at once (its subscribers see it end; ``recover=True`` ones follow the successor) and
    never touches the partition's catalog row again. ``topic``, ``partition`` and
    ``incarnation`` (the fenced one) say which."""

    def __init__(self, message: str, *, topic: str = "", partition: int = -1,
                 incarnation: str = ""):
        self.topic = topic
        self.partition = partition
        self.incarnation = incarnation
        super().__init__(message)


class CatalogUnavailable(CatalogError):
    """The network catalog (``Catalog("tcp://host:port")``, served by ``epochstream catalog
    serve``) did not answer a request within its timeout (seconds): nothing listens there, the
    host is unreachable, or the service is overloaded. ``url`` and ``timeout`` (seconds) say
    which and how long; ``op`` names the request. Whether a write that timed out was applied is
    unknown: read the catalog again before retrying it."""

    def __init__(self, message: str, *, url: str = "", timeout: float | None = None,
                 op: str = ""):
        self.url = url
        self.timeout = timeout
        self.op = op
        super().__init__(message)


class SubscriberLagged(EpochstreamError):
    """The publisher of ``partition`` evicted this subscriber because its outgoing queue passed
    the bound (messages or bytes). ``last_epoch`` is the time of the last complete epoch this
    subscriber delivered (``None`` if none)."""

    def __init__(self, message: str, *, partition: int | None = None, last_epoch=None):
        self.partition = partition
        self.last_epoch = last_epoch
        super().__init__(message)


class PublisherLost(EpochstreamError):
    """No message (data, progress or heartbeat) arrived from ``partition`` within the timeout."""

    def __init__(self, message: str, *, partition: int | None = None):
        self.partition = partition
        super().__init__(message)


class PublisherAborted(EpochstreamError):
    """The publisher of ``partition`` aborted: an exception (including ``KeyboardInterrupt``)
    left its ``with Publisher(...)`` block, or :meth:`~epochstream.transport.Publisher.abort`
    was called. Its open epochs never complete; the catalog marks the partition ``aborted``.
    ``reason`` is the publisher's own description (e.g. the exception's repr)."""

    def __init__(self, message: str, *, partition: int | None = None, reason: str = ""):
        self.partition = partition
        self.reason = reason
        super().__init__(message)


class HistoryError(EpochstreamError):
    """Base class of the errors of durable history (:mod:`epochstream.history`)."""


class HistoryUnavailable(HistoryError):
    """The requested position is older than what is retained, or a partition that sent data
    at or beyond it keeps no history: the epochs it asks for cannot all be delivered whole, so
    nothing is delivered (never a silent skip). ``retained`` is the earliest position that could
    be served (a tuple of times, the ``since`` frontier), when known."""

    def __init__(self, message: str, *, retained: tuple | None = None):
        self.retained = retained
        super().__init__(message)


class HistoryCorrupt(HistoryError):
    """A segment of the epoch log failed its checksum, is truncated or missing: the epoch named
    in the message is never delivered as data. ``path`` is the segment file."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(message)


class HistoryWriteError(HistoryError):
    """The publisher could not write or index an epoch in its log (disk full, file size limit,
    permissions): it refuses to complete the epoch rather than lose history silently. The
    publisher is unusable afterwards (its log's tail is undefined); restart it to resume from
    the last logged frontier."""


class SubscriptionExpired(HistoryError):
    """A durable subscription fell behind the retention limits: epochs at or beyond its acked
    position were deleted. ``name``, ``acked`` (its position, a tuple of times) and
    ``retained`` (the earliest position still retained) describe it; reset it explicitly
    (``epochstream durable reset``) to go on from what is retained."""

    def __init__(self, message: str, *, name: str = "", acked: tuple = (), retained: tuple = ()):
        self.name = name
        self.acked = acked
        self.retained = retained
        super().__init__(message)


class SubscriptionHeld(CatalogError):
    """A durable subscription's name is held by another live subscriber (pass
    ``takeover=True`` to take it over), or this subscriber's hold was taken over (its acks are
    refused from then on: fencing)."""


class LeaseExpired(EpochstreamError):
    """A consumer group refused an ack, nak or extension: the lease it names is no longer held
    by that fencing token (its deadline passed, it was leased again to another worker, or it
    was settled already) — so an epoch is never completed twice."""


class GroupStopped(EpochstreamError):
    """A consumer group stopped: an epoch was delivered ``max_deliver`` times without an ack
    and the group has no ``dead_letter`` topic (never a silent drop). Reset the group
    (``EpochGroup.reset()``) after fixing the cause."""


class TopicClosed(CatalogError):
    """Every partition of the topic is closed (an earlier run ended it) and no new publisher
    started within the subscriber's ``wait``: a ``start="latest"`` subscriber would receive
    nothing, so it says so instead of succeeding silently. ``topic``; ``ended_at``: the
    ``time.time()`` its last partition closed. Replay a topic that keeps history with
    ``start="earliest"``."""

    def __init__(self, message: str, *, topic: str = "", ended_at: float | None = None):
        self.topic = topic
        self.ended_at = ended_at
        super().__init__(message)


class FilterError(EpochstreamError, ValueError):
    """A record filter (``keys``/``columns``/``where``, :mod:`epochstream.filters`) that is
    malformed — an op not in ``== != < <= > >= in``, a value that is not a scalar, too many keys
    — or that does not fit the data (a column the records lack, values of another type)."""


class NotAuthorized(EpochstreamError):
    """A secured publisher refused this subscriber (its ``X error`` with reason
    ``not_authorised``): the subscriber's key (``principal``, Z85) holds no ``subscribe`` grant
    for ``topic`` in the catalog, or its grant was revoked; nothing of the stream was delivered
    after the refusal. Also raised before connecting when the two sides cannot meet: the catalog
    records a CURVE key for ``partition`` and the subscriber has no ``security=``, or the
    reverse (docs/security.md)."""

    def __init__(self, message: str, *, topic: str = "", partition: int | None = None,
                 principal: str = ""):
        self.topic = topic
        self.partition = partition
        self.principal = principal
        super().__init__(message)
