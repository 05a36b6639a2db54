"""A relay: one subscription upstream, any number of subscribers downstream — the device of
ZeroMQ's PUB/SUB design (Martin Sústrik, "Design of PUB/SUB subsystem in ØMQ"; docs/filters.md,
"Relays").

``Relay(topic, catalog, tier="relay")`` subscribes to ``topic`` once (every partition, merged:
:class:`~epochstream.transport.subscriber.Subscriber`) and republishes it as the one-partition
topic ``f"{topic}@{tier}"`` (same order and codec) through its own
:class:`~epochstream.transport.publisher.Publisher`, registered in the catalog: a downstream
subscriber chooses the tier by name, ``Subscriber("flights@edge", ...)``, and may be a relay
again (``Relay("flights@edge", tier="far")``). Each upstream message crosses the upstream link
once, however many subscribers the relay serves; downstream subscribers' filters are applied by
the relay's publisher (``key=`` as for any publisher), and the relay's own filter
(``keys``/``columns``/``where``) by the upstream publishers.

Why downstream epochs are whole: the relay's downstream publisher starts with the relay's
merged lower frontier as its capabilities and with the relay's join filter (the merged upper
frontier of its upstream snapshots) as its upper frontier. A downstream subscriber's snapshot
therefore says every epoch the relay joined in the middle of was begun, and its Strymon filter
drops them, exactly as the relay's own filter does; every other epoch reaches the relay whole
(Strymon's guarantee) and is forwarded data first, then the merged frontier change that
completes it (the order the relay's subscriber hands them out in).

Failures: the relay does not re-join upstream. If its upstream subscription fails
(``PublisherLost``, ``PublisherAborted``, ``SubscriberLagged``, a protocol error) it *aborts*
its downstream publisher with the reason — downstream subscribers get
:class:`~epochstream.errors.PublisherAborted` (with ``recover=True`` they wait for a restarted
relay, a new incarnation of the tier) — and :attr:`Relay.error` holds the cause. When the
upstream topic ends (every partition closed) the relay closes downstream.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from ..errors import EpochstreamError
from ..events import DataMessage, Gap, LowerFrontierUpdate
from ..filters import Filter
from ..frontier import apply_changes
from .loop import UPSTREAM_CHANGED
from .publisher import Publisher
from .subscriber import Subscriber

__all__ = ["Relay"]

log = logging.getLogger("epochstream.transport")


class Relay:
    """``Relay(topic, catalog=None, *, tier="relay", endpoint="tcp://127.0.0.1:*",
    advertise=None, key=None, keys=None, columns=None, where=None, wait=10.0, timeout=10.0,
    credit=1024, security=None, upstream_security=None, **publisher_options)``: see the module
    docstring. ``upstream_security``: the relay's client key pair upstream
    (``Security.curve(client_secret=...)``, docs/security.md; it needs a ``subscribe`` grant
    on ``topic``); ``security``: its downstream publisher's (``Security.curve(server_secret=...,
    allow=...)``; grants for ``topic@tier``). ``key``: the topic's key
    for downstream ``keys=`` filters; ``keys``/``columns``/``where``: the relay's own filter
    upstream; ``credit``: flow control upstream (messages), so a relay that cannot keep up slows
    its upstream down rather than being evicted; ``publisher_options`` go to the downstream
    :class:`Publisher` (e.g. ``max_queue_messages``). Starts serving at once (a thread);
    :attr:`name` is the downstream topic, :attr:`endpoint` where it is bound. Raises what
    ``Subscriber``/``Publisher`` raise (``TopicNotFound``, ``TopicClosed``,
    ``PartitionHeld`` for a tier that another live relay serves)."""

    def __init__(self, topic: str, catalog=None, *, tier: str = "relay",
                 endpoint: str = "tcp://127.0.0.1:*", advertise: str | None = None, key=None,
                 keys=None, columns=None, where=None, wait: float = 10.0, timeout: float = 10.0,
                 credit: int = 1024, security=None, upstream_security=None,
                 **publisher_options: Any):
        if not isinstance(tier, str) or not tier or "@" in tier:
            raise ValueError(f"tier must be a non-empty name without '@', got {tier!r}")
        self.topic, self.tier, self.name = topic, tier, f"{topic}@{tier}"
        self.union = keys is None and columns is None and where is None
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # covers the loop asks for
        self._timeout = float(timeout)
        self._up = Subscriber(topic, catalog, wait=wait, timeout=timeout, credit=credit,
                              keys=keys, columns=columns, where=where,
                              security=upstream_security)
        try:
            if not self._up.wait_ready(wait):
                raise TimeoutError(f"relay of {topic!r}: not every partition's snapshot arrived "
                                   f"within {wait} s")
            up = self._up
            lower = list(up.lower)
            upper = list(up.filter)  # the merged upper frontier its join drops
            if key is None:
                key = up.key_column  # the upstream topic's key column, if it declares one
            # keys travel upstream only when they mean the same there (the same key column)
            self.key = key if isinstance(key, str) and key == up.key_column else None
            self._down = Publisher(self.name, order=up.order, codec=up.codec.name,
                                   endpoint=endpoint, advertise=advertise,
                                   catalog=up._catalog, key=key, start=lower, upper=upper,
                                   strict=False, publisher_gate=self if self.union else None,
                                   security=security, **publisher_options)
        except BaseException:
            self._up.close()
            raise
        self.endpoint = self._down.endpoint
        self.error: EpochstreamError | None = None
        self.stats = {"data": 0, "frontier": 0, "upstream_changes": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"epochstream-relay-{self.name}")
        self._thread.start()

    @property
    def upstream_filter(self) -> Filter:
        """The filter the relay's upstream subscription has now (``Filter()``: everything)."""
        return self._up.record_filter

    def request(self, target: Filter) -> None:
        """Called by the downstream publisher's loop (any thread): change the upstream
        subscription to ``target``; the relay's thread does it and reports back (``UPSTREAM_CHANGED``)."""
        self._requests.put(target)

    def _change_upstream(self) -> None:
        """Make the upstream changes asked for (the relay's thread), each reported to the
        downstream loop with its boundary, or with the error that prevented it."""
        while True:
            try:
                target = self._requests.get_nowait()
            except queue.Empty:
                return
            up = self._up
            try:
                b = up.update_filter(target.keys, target.columns, target.where,
                                     timeout=self._timeout)
                result = (target, b, None)
                self.stats["upstream_changes"] += 1
                log.info("relay %s: upstream filter now %r from %s on", self.name, target,
                         list(b))
            except (EpochstreamError, TimeoutError, NotImplementedError) as e:
                result = (target, None, f"{type(e).__name__}: {e}")
                log.warning("relay %s: could not change the upstream filter to %r: %s",
                            self.name, target, e)
            self._down._handoff.put_final((UPSTREAM_CHANGED, result, None))

    @property
    def publisher(self) -> Publisher:
        """The downstream publisher (its ``stats``, ``subscribers``, ``lower``)."""
        return self._down

    def _run(self) -> None:
        up, down = self._up, self._down
        encode = up.codec.encode
        handed: dict = {}  # the merged lower frontier as the subscriber hands it out
        try:
            while not self._stop.is_set():
                if self.union:
                    self._change_upstream()
                for m in up.poll_encoded(0.1):
                    kind = type(m)
                    if kind is DataMessage:
                        if up.filtering:  # re-checked: re-encoded
                            m = up.hand_out(m)
                            if m is None:
                                continue
                            down.send_encoded(m.time, encode(m.data))
                        else:
                            down.send_encoded(m.time, m.data)
                        self.stats["data"] += 1
                    elif kind is LowerFrontierUpdate:  # announced from empty at the join:
                        apply_changes(handed, m.updates)  # downstream moves to what it says
                        now = set(down.lower)
                        want = set(handed)
                        if want != now:
                            down.progress([*((t, 1) for t in want - now),
                                           *((t, -1) for t in now - want)])
                            self.stats["frontier"] += 1
                    elif kind is Gap:  # not with recover=False; never forward a partial epoch
                        raise EpochstreamError(f"relay of {self.topic!r}: upstream gap {m}")
                if up.drained:
                    down.close()
                    return
        except EpochstreamError as exc:
            self.error = exc
            log.warning("relay %s: upstream failed, aborting downstream: %s", self.name, exc)
            down.abort(f"relay upstream failed: {exc}")
        except BaseException as exc:  # a bug: abort rather than leave subscribers hanging
            self.error = EpochstreamError(f"relay {self.name} failed: {exc!r}")
            log.exception("relay %s died", self.name)
            down.abort(f"relay failed: {exc!r}")
            raise
        finally:
            up.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the relay ended (upstream finished or failed); True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop relaying: downstream is *aborted* if the upstream topic has not ended (its
        open epochs never complete), closed if it has."""
        self._stop.set()
        self._thread.join(30)
        if not self._down._closed:
            if self._up.finished:
                self._down.close()
            else:
                self._down.abort(f"relay {self.name} stopped")
        self._up.close()

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Relay({self.topic!r} -> {self.name!r} at {self.endpoint})"
