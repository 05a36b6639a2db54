"""Filtering at the source (docs/filters.md), in the publisher's loop thread: each subscriber
connection's filter program (its :class:`~epochstream.transport.interest.Interest`), the bound
on distinct programs, and the broadcast of a data message with each peer sent what it selects
(each distinct selection filtered and encoded once).

:class:`SourceFilters` is composed into the :class:`~epochstream.transport.loop.PublisherLoop`
(its own state: the topic's key, the bound, whether some peer has an Interest —
:attr:`SourceFilters.active`, then data goes through :meth:`SourceFilters.broadcast`). The
Interests themselves live on the fan-out's peers.
"""

from __future__ import annotations

from typing import Callable

from .. import wire
from ..filters import Filter, FilterError, FilterSchedule, union_arrow, union_records
from ..order import check_time
from .fanout import Fanout, Peer, Transmit
from .interest import ALL, Interest, sent_filter

__all__ = ["SourceFilters"]


class SourceFilters:
    """The filters of the subscribers of ``topic`` (of ``order``, payloads in ``codec``):
    ``key`` the topic's key (a column name, a function, or ``None``), ``max_filter_classes``
    the bound on distinct programs served filtered; ``fanout``/``transmit``/``stats``: the
    loop's; ``warn(fmt, *args)``: the loop's rate-limited peer warning."""

    def __init__(self, topic: str, order, codec, key, max_filter_classes: int, fanout: Fanout,
                 transmit: Transmit, stats, warn: Callable[..., None]):
        self.topic, self.order, self.codec = topic, order, codec
        self.key, self.max_filter_classes = key, max_filter_classes
        self._fanout, self._transmit, self._stats, self._warn = fanout, transmit, stats, warn
        self.active = False  # some peer has an Interest

    def program(self, obj) -> FilterSchedule | None:
        """The decoded filter program of a hello or update (``None``: none). Raises
        :class:`~epochstream.filters.FilterError`."""
        if obj is None:
            return None
        program = FilterSchedule.from_wire(self.order, obj, lambda t: check_time(self.order, t))
        for _, f in program.entries:
            if f.keys is not None and self.key is None:
                raise FilterError(f"keys= needs a topic key, and the publisher of "
                                  f"{self.topic!r} declares none (Publisher(..., key=...))")
        return program

    def _over_bound(self, program: FilterSchedule) -> bool:
        """True if serving ``program`` would make more distinct programs than the bound
        (a key function's filters are never left to the subscriber: it cannot re-check them)."""
        if callable(self.key) and any(f.keys is not None for _, f in program.entries):
            return False
        programs = {p.interest.program for p in self._fanout.peers.values()
                    if p.interest is not None and p.interest.program is not None
                    and not p.interest.unfiltered}
        return program not in programs and len(programs) >= self.max_filter_classes

    def joining(self, program: FilterSchedule | None, upper: tuple) -> Interest:
        """The Interest of a peer joining with ``program`` at the upper frontier ``upper``
        (served unfiltered beyond the bound)."""
        return Interest(self.order, upper, program,
                        unfiltered=program is not None and self._over_bound(program))

    def joined(self, peer: Peer, interest: Interest) -> None:
        """``peer`` was sent its snapshot: it is served under ``interest`` from now on."""
        if not interest.trivial:
            peer.interest = interest
            self.active = True

    def update(self, peer: Peer, program: FilterSchedule | None, lower: tuple) -> None:
        """Replace ``peer``'s program (a ``u``) at the lower frontier ``lower``."""
        interest = peer.interest
        if interest is None:
            interest = Interest(self.order, (), program,
                                unfiltered=program is not None and self._over_bound(program))
        else:  # a peer served unfiltered stays so (the subscriber knows what it receives)
            interest.program = program
        interest.frontier(lower)
        peer.interest = None if interest.trivial else interest
        self.active = self.active or peer.interest is not None

    def advance(self, lower: tuple) -> None:
        """The lower frontier moved to ``lower``: retire skips and prune programs; stop
        filtering when no peer needs it."""
        any_left = False
        for peer in self._fanout.peers.values():
            interest = peer.interest
            if interest is None:
                continue
            interest.frontier(lower)
            if interest.trivial:
                peer.interest = None
            else:
                any_left = True
        self.active = any_left

    def live(self) -> list:
        """Every filter the subscribers served need (``Filter()`` for one served unfiltered)."""
        out = []
        for peer in self._fanout.peers.values():
            interest = peer.interest
            if interest is None or interest.program is None or interest.unfiltered:
                out.append(Filter())
            else:
                out.extend(f for _, f in interest.program.entries)
        return out

    def broadcast(self, t, frames: list, now: float, render=None) -> None:
        """Broadcast a data message, each peer with an Interest sent what it selects; each
        distinct selection is filtered and encoded once (and rendered by ``render`` once for
        the peers served data-message version 2). A filter the data cannot be filtered by (a
        column it lacks) refuses that peer with ``X error``."""
        cache: dict = {}
        decoded: list = []
        refused: dict = {}
        stats = self._stats

        def variant(peer):
            sel = peer.interest.select(t)
            if sel is None or sel is ALL:
                return None if sel is None else frames
            if sel in cache:
                got = cache[sel]
            else:
                got = cache[sel] = self._encode(sel, frames, decoded)
                stats["filter_encodings"] += 1
            if isinstance(got, FilterError):
                refused[peer.ident] = got
                return None
            if got is None:
                stats["filtered_messages"] += 1
            return got

        self._fanout.broadcast(frames, self._transmit, now, variant=variant, render=render)
        for ident, e in refused.items():
            self._warn("subscriber %r: its filter does not fit the data: %s", ident, e)
            self._fanout.leave(ident)
            self._transmit(ident, wire.encode_notice("error", f"filter does not fit the data "
                                                              f"of {self.topic!r}: {e}"))

    def _encode(self, sel, frames: list, decoded: list):
        """The message ``frames`` as the selection ``sel`` (filters) sends it: its frames,
        ``None`` (nothing selected) or the :class:`~epochstream.filters.FilterError` that
        refuses the peer. ``decoded``: the payload decoded once per message (filled here)."""
        codec, key = self.codec, self.key
        try:
            if not decoded:
                decoded.append(codec.decode(frames[2]))
            sent = tuple(sent_filter(f, key) for f in sel)
            if codec.name == "arrow":
                out = union_arrow(sent, decoded[0], key)
                n = out.num_rows
            else:
                out = union_records(sent, decoded[0], key)
                n = len(out)
            if not n:
                return None
            if n == codec.count(decoded[0]) and all(f.columns is None for f in sent):
                return frames  # every record matched, none cut: the payload as it is
            return [frames[0], frames[1], codec.encode(out)]
        except FilterError as e:
            return e
        except Exception as e:  # noqa: BLE001 - e.g. a key function that raises:
            return FilterError(f"{type(e).__name__}: {e}")  # refuse them, not everyone
