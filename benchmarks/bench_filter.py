"""Case ``filter``: the subscriber-side filter path, in process, on pre-built frames.

A subscriber that joins a running stream drops data at times ``<=`` some element of its filter
(the publishers' upper frontiers at subscription). Because the time travels in a header ahead
of the payload, it can drop a message after decoding only the header. This case measures, per
data message pre-built as a subscriber receives it (wire version 2, the default: one frame, a
struct header; runs before 2026-11-27 used version 1's ``[b"D", msgpack time, payload]``; no
sockets):

- ``header_drop`` — the header decoded (``wire.data_decoder``) + ``SubscriberProtocol.passes(t)`` + payload
  decode only for passing messages (the path the protocol allows);
- ``transport`` — a user's loop over the actual :class:`epochstream.Subscriber`:
  ``for item in sub.events(): ...`` touching every delivered record, with the socket read
  replaced by the pre-built frames (``Subscriber._handle`` with its per-header verdict cache
  and the lazy decode in ``_outputs`` run as in production);
- ``decode_all`` — decode the header and every payload, then filter (the baseline).

Every method decodes what passes and touches each delivered record (``for rec in records``),
as a user's loop would; the records counted are checked against the frames.

Grid: pass rate 0 / 50 / 100 %, filter antichains of 1 element (int times; a total order has no
larger antichain) and 1, 2, 4, 8 elements (``product(2)`` times), 1 / 100 / 1000 msgpack dict
records per message. Reported: messages/s and records/s consumed, records/s delivered.
"""

from __future__ import annotations

import time

from epochstream import wire
from epochstream.order import TOTAL, product
from epochstream.protocol import InitialFrontierSnapshot, SubscriberProtocol

from . import payloads

METHODS = ("header_drop", "transport", "decode_all")
EPOCHS = 100  # distinct times per frame list


def _filter_elements(order_name: str, k: int):
    if order_name == "total":
        return (1_000_000,)
    # an antichain of k product(2) times: (i*1000, (k-1-i)*1000 + 1_000_000)
    return tuple((i * 1000, (k - 1 - i) * 1000 + 1_000_000) for i in range(k))


def _times(order_name: str, k: int, n_epochs: int, pass_rate: float) -> list:
    """``n_epochs`` times: the first ``(1-pass_rate)`` share are <= some filter element (spread over
    the elements), the rest pass (and are compared with every element)."""
    drop = round(n_epochs * (1.0 - pass_rate))
    filt = _filter_elements(order_name, k)
    out = []
    for e in range(n_epochs):
        if order_name == "total":
            out.append(e if e < drop else 2_000_000 + e)
        elif e < drop:
            f = filt[e % k]
            out.append((max(0, f[0] - e), f[1] - e))
        else:
            out.append((k * 1000 + e, 2_000_000 + e))
    return out


def _frames(order_name, k, per_message, pass_rate, n_messages, kind="dicts", wire_version=2):
    """Data messages as a subscriber receives them: wire version 2 (the default since issue 28:
    one frame, a struct header; a header frame and the payload from 16 KiB) or version 1
    (``[b"D", msgpack time, payload]``)."""
    times = _times(order_name, k, EPOCHS, pass_rate)
    bodies = payloads.encoded(kind, per_message)
    per_epoch = max(1, n_messages // EPOCHS)
    frames = []
    for i in range(per_epoch * EPOCHS):
        t = times[i // per_epoch]
        body = bodies[i % len(bodies)]
        if wire_version == 2:
            frames.append(wire.encode_data2(wire.data_header2(t), body))
            continue
        header = bytes(bytearray(wire.encode_time(list(t) if isinstance(t, tuple) else t)))
        frames.append([wire.DATA, header, body])
    return frames


def _time_decoder(order_name: str, wire_version: int):
    """``frames -> (time, payload)`` for one data message of ``_frames``."""
    if wire_version == 2:
        return wire.data_decoder(0 if order_name == "total" else 2)
    decode_time = wire.decode_time
    return lambda frames: (decode_time(frames[1]), frames[2])


def _protocol(order, filt):
    proto = SubscriberProtocol(order, 1)
    proto.receive(0, InitialFrontierSnapshot((order.minimum,), filt))
    assert proto.ready and len(proto.filter) == len(filt), proto.filter
    return proto


def _subscriber(order, codec_name, filt):
    """A Subscriber whose partition 0 snapshot is injected by hand (its socket goes nowhere)."""
    from epochstream.transport import Subscriber
    sub = Subscriber("bench-filter", endpoints=["tcp://127.0.0.1:9"], order=order, codec=codec_name)
    snap = InitialFrontierSnapshot((order.minimum,), filt)
    eng = _engine(sub)
    if hasattr(eng, "_accept_snapshot"):  # transport before the package split
        eng._accept_snapshot(0, snap)
    else:
        eng._snapshot(0, snap)
    (eng.parked if hasattr(eng, "parked") else eng._parked).clear()
    assert sub.ready and len(sub.filter) == len(filt)
    return sub


def _engine(sub):
    """What receives for ``sub``: its composed TopicJoin (issue 22), or the subscriber itself
    (older transports)."""
    j = getattr(sub, "_join", None)
    return j if j is not None and not callable(j) else sub


def _touch(records) -> int:
    """What a user's loop does at least: visit every record."""
    n = 0
    for _rec in records:
        n += 1
    return n


def _loop_header_drop(frames, proto, codec, deadline_check, head):
    passes, decode = proto.passes, codec.decode
    consumed = delivered = records = 0
    while True:
        for f in frames:
            t, payload = head(f)
            if passes(t):
                records += _touch(decode(payload))
                delivered += 1
        consumed += len(frames)
        if deadline_check():
            return consumed, delivered, records


def _loop_decode_all(frames, proto, codec, deadline_check, head):
    passes, decode = proto.passes, codec.decode
    consumed = delivered = records = 0
    while True:
        for f in frames:
            t, payload = head(f)
            d = decode(payload)
            if passes(t):
                records += _touch(d)
                delivered += 1
        consumed += len(frames)
        if deadline_check():
            return consumed, delivered, records


_CHUNK = 64  # messages handed to the subscriber per simulated poll


def _loop_transport(frames, sub, deadline_check):
    """``for item in sub.events()`` with ``_poll`` fed from ``frames`` instead of sockets."""
    from epochstream.protocol import DataMessage
    eng = _engine(sub)
    handle = eng._handle
    queue = getattr(eng, "_queue", None)
    decoded = getattr(sub, "_decoded", None) or (lambda m: m)  # older transport: (m, nbytes)
    state = {"i": 0, "consumed": 0, "stop": False}
    n_frames = len(frames)

    def fake_poll(_timeout):
        if state["stop"]:
            raise StopIteration  # ends the events() generator below
        out = []
        i = state["i"]
        for _ in range(_CHUNK):
            got = handle(0, frames[i])
            if queue is not None:  # as TopicJoin._read: outputs (if any) to the parked events
                if got:
                    queue(got)
            else:
                out.extend(decoded(m) for m in got)
            i += 1
            if i == n_frames:
                i = 0
                state["consumed"] += n_frames
                if deadline_check():
                    state["stop"] = True
                    break
        state["i"] = i
        if queue is not None:  # as TopicJoin.poll: hand over what was parked
            out, eng.parked = eng.parked, []
        return out

    if eng is sub:
        sub._poll = fake_poll
    else:
        eng.poll = fake_poll
    delivered = records = 0
    try:
        for item in sub.events(timeout=60):
            if type(item) is tuple:  # older transport yields (event, nbytes)
                item = item[0]
            if type(item) is DataMessage:
                delivered += 1
                records += _touch(item.data)
    except (StopIteration, RuntimeError):  # PEP 479 turns StopIteration into RuntimeError
        pass
    return state["consumed"], delivered, records


def measure(method, order_name, k, per_message, pass_rate, min_time=0.25, kind="dicts",
            wire_version=2) -> dict:
    order = TOTAL if order_name == "total" else product(2)
    filt = _filter_elements(order_name, k)
    n_messages = 1000 if per_message <= 100 else 100
    frames = _frames(order_name, k, per_message, pass_rate, n_messages, kind, wire_version)
    head = _time_decoder(order_name, wire_version)
    codec = wire.codec(payloads.codec_name(kind))
    sub = _subscriber(order, payloads.codec_name(kind), filt) if method == "transport" else None
    start = time.perf_counter()  # set-up (the Subscriber, its socket) is not timed
    deadline = start + min_time
    check = lambda: time.perf_counter() >= deadline  # noqa: E731
    if method == "header_drop":
        consumed, delivered, records = _loop_header_drop(frames, _protocol(order, filt), codec, check,
                                                         head)
    elif method == "decode_all":
        consumed, delivered, records = _loop_decode_all(frames, _protocol(order, filt), codec, check,
                                                        head)
    elif method == "transport":
        try:
            consumed, delivered, records = _loop_transport(frames, sub, check)
        finally:
            sub.close()
    else:
        raise ValueError(method)
    elapsed = time.perf_counter() - start
    expected = round(consumed * pass_rate)
    return {
        "method": method, "order": order_name, "filter_size": k, "records_per_message": per_message,
        "pass_rate": pass_rate, "payload": kind, "wire": wire_version, "messages": consumed, "delivered_messages": delivered,
        "seconds": round(elapsed, 4),
        "messages_per_s": consumed / elapsed,
        "records_per_s_consumed": consumed * per_message / elapsed,
        "records_per_s_delivered": delivered * per_message / elapsed,
        "delivered_records": records,
        "ok": delivered == expected and records == delivered * per_message,
    }


def grid(quick: bool):
    # product(2) k=2 and k=4 cut for the 20-minute budget: k=1 and k=8 bracket them
    filters = [("total", 1), ("product(2)", 1), ("product(2)", 8)]
    if quick:
        filters = [("total", 1), ("product(2)", 8)]
    for per_message in (1, 100, 1000):
        for order_name, k in filters:
            for pass_rate in (0.0, 0.5, 1.0):
                yield order_name, k, per_message, pass_rate


def run(quick: bool = False, log=print) -> dict:
    from . import median, paired
    # in process and CPU-bound: short measurements, but paired and interleaved (each round runs
    # every method once, in turn; ratios are taken within a round)
    min_time = (0.05 if quick else 0.1) * paired.scale()
    rounds = paired.repeats(quick)
    rows = []
    ratios = []
    for order_name, k, per_message, pass_rate in grid(quick):
        per_round = []
        for rnd in range(rounds):
            got = {}
            for method in METHODS:
                r = measure(method, order_name, k, per_message, pass_rate, min_time=min_time)
                r["round"] = rnd
                got[method] = r
                rows.append(r)
            per_round.append(got)
        for method in ("header_drop", "transport"):
            rs = [g[method]["records_per_s_consumed"] / g["decode_all"]["records_per_s_consumed"]
                  for g in per_round]
            ratios.append({"method": method, "order": order_name, "filter_size": k,
                           "records_per_message": per_message, "pass_rate": pass_rate,
                           "ratio_vs_decode_all": median(rs), "paired": paired.summary(rs)})
        log(f"  filter {order_name:10s} k={k} R={per_message:4d} pass={pass_rate:.0%}: "
            + "  ".join(f"{m}={median(g[m]['records_per_s_consumed'] for g in per_round) / 1e6:7.2f}M"
                        for m in METHODS) + " rec/s consumed (median)")
    return {"quick": quick, "min_time_s": min_time, "rounds": rounds, "rows": rows, "ratios": ratios,
            "ok": all(r["ok"] for r in rows)}
