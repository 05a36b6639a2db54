"""Case ``filter``: the subscriber-side filter path, in process, on pre-built frames.

A subscriber that joins a running stream drops data at times ``<=`` some element of its filter
(the publishers' upper frontiers at subscription). Because the time travels in its own frame, it
can drop a message after decoding only the small header. This case measures, per message of
pre-built ``[kind, header, payload]`` frames (no sockets):

- ``header_drop`` — ``wire.decode_time(header)`` + ``SubscriberProtocol.passes(t)`` + payload
  decode only for passing messages (the path the protocol allows);
- ``transport`` — the actual :class:`epochstream.Subscriber` code path after ``recv_multipart``
  (``Subscriber._handle`` with its per-header verdict cache, then ``_decoded``);
- ``decode_all`` — decode the header and every payload, then filter (the baseline).

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


def _frames(order_name, k, per_message, pass_rate, n_messages, kind="dicts"):
    times = _times(order_name, k, EPOCHS, pass_rate)
    bodies = payloads.encoded(kind, per_message)
    per_epoch = max(1, n_messages // EPOCHS)
    frames = []
    for i in range(per_epoch * EPOCHS):
        t = times[i // per_epoch]
        header = bytes(bytearray(wire.encode_time(list(t) if isinstance(t, tuple) else t)))
        frames.append([wire.DATA, header, bodies[i % len(bodies)]])
    return frames


def _protocol(order, filt):
    proto = SubscriberProtocol(order, 1)
    proto.receive(0, InitialFrontierSnapshot((order.minimum,), filt))
    assert proto.ready and len(proto.filter) == len(filt), proto.filter
    return proto


def _subscriber(order, codec_name, filt):
    """A Subscriber whose partition 0 snapshot is injected by hand (its socket goes nowhere)."""
    from epochstream.transport import Subscriber
    sub = Subscriber("bench-filter", endpoints=["tcp://127.0.0.1:9"], order=order, codec=codec_name)
    sub._accept_snapshot(0, InitialFrontierSnapshot((order.minimum,), filt))
    sub._parked.clear()
    assert sub.ready and len(sub.filter) == len(filt)
    return sub


def _loop_header_drop(frames, proto, codec, deadline_check):
    decode_time, passes, decode = wire.decode_time, proto.passes, codec.decode
    consumed = delivered = 0
    while True:
        for _kind, header, payload in frames:
            t = decode_time(header)
            if passes(t):
                decode(payload)
                delivered += 1
        consumed += len(frames)
        if deadline_check():
            return consumed, delivered


def _loop_decode_all(frames, proto, codec, deadline_check):
    decode_time, passes, decode = wire.decode_time, proto.passes, codec.decode
    consumed = delivered = 0
    while True:
        for _kind, header, payload in frames:
            t = decode_time(header)
            decode(payload)
            if passes(t):
                delivered += 1
        consumed += len(frames)
        if deadline_check():
            return consumed, delivered


def _loop_transport(frames, sub, deadline_check):
    handle, decoded = sub._handle, sub._decoded
    consumed = delivered = 0
    while True:
        for fr in frames:
            for m in handle(0, fr):
                decoded(m)
                delivered += 1
        consumed += len(frames)
        if deadline_check():
            return consumed, delivered


def measure(method, order_name, k, per_message, pass_rate, min_time=0.25, kind="dicts") -> dict:
    order = TOTAL if order_name == "total" else product(2)
    filt = _filter_elements(order_name, k)
    n_messages = 1000 if per_message <= 100 else 200
    frames = _frames(order_name, k, per_message, pass_rate, n_messages, kind)
    codec = wire.codec(payloads.codec_name(kind))
    start = time.perf_counter()
    deadline = start + min_time
    check = lambda: time.perf_counter() >= deadline  # noqa: E731
    if method == "header_drop":
        consumed, delivered = _loop_header_drop(frames, _protocol(order, filt), codec, check)
    elif method == "decode_all":
        consumed, delivered = _loop_decode_all(frames, _protocol(order, filt), codec, check)
    elif method == "transport":
        sub = _subscriber(order, payloads.codec_name(kind), filt)
        try:
            consumed, delivered = _loop_transport(frames, sub, check)
        finally:
            sub.close()
    else:
        raise ValueError(method)
    elapsed = time.perf_counter() - start
    expected = round(consumed * pass_rate)
    return {
        "method": method, "order": order_name, "filter_size": k, "records_per_message": per_message,
        "pass_rate": pass_rate, "payload": kind, "messages": consumed, "delivered_messages": delivered,
        "seconds": round(elapsed, 4),
        "messages_per_s": consumed / elapsed,
        "records_per_s_consumed": consumed * per_message / elapsed,
        "records_per_s_delivered": delivered * per_message / elapsed,
        "ok": delivered == expected,
    }


def grid(quick: bool):
    filters = [("total", 1), ("product(2)", 1), ("product(2)", 2), ("product(2)", 4), ("product(2)", 8)]
    if quick:
        filters = [("total", 1), ("product(2)", 1), ("product(2)", 8)]
    for per_message in (1, 100, 1000):
        for order_name, k in filters:
            for pass_rate in (0.0, 0.5, 1.0):
                yield order_name, k, per_message, pass_rate


def run(quick: bool = False, log=print) -> dict:
    min_time = 0.05 if quick else 0.2
    rounds = 2 if quick else 3
    rows = []
    for order_name, k, per_message, pass_rate in grid(quick):
        # best of ``rounds`` interleaved measurements (other load on the machine only slows down)
        best: dict = {}
        for _ in range(rounds):
            for method in METHODS:
                r = measure(method, order_name, k, per_message, pass_rate, min_time=min_time)
                if method not in best or r["messages_per_s"] > best[method]["messages_per_s"]:
                    best[method] = r
        rows.extend(best[m] for m in METHODS)
        by = {r["method"]: r for r in rows[-len(METHODS):]}
        log(f"  filter {order_name:10s} k={k} R={per_message:4d} pass={pass_rate:.0%}: "
            + "  ".join(f"{m}={by[m]['records_per_s_consumed'] / 1e6:7.2f}M rec/s" for m in METHODS))
    ratios = []
    for r in rows:
        if r["method"] == "decode_all":
            continue
        base = next(b for b in rows if b["method"] == "decode_all" and all(
            b[f] == r[f] for f in ("order", "filter_size", "records_per_message", "pass_rate")))
        ratios.append({"method": r["method"], "order": r["order"], "filter_size": r["filter_size"],
                       "records_per_message": r["records_per_message"], "pass_rate": r["pass_rate"],
                       "ratio_vs_decode_all": r["records_per_s_consumed"] / base["records_per_s_consumed"]})
    return {"quick": quick, "min_time_s": min_time, "rounds": rounds, "rows": rows, "ratios": ratios,
            "ok": all(r["ok"] for r in rows)}
