"""Benchmark payloads: the same 5-field records as msgpack dicts, msgpack tuples or Arrow batches.

``KINDS``: ``"dicts"`` and ``"tuples"`` use the ``msgpack`` codec, ``"arrow"`` the ``arrow`` codec.
Payloads are encoded once, before timing, with epochstream's own codecs; every system in a
comparison sends the very same bytes.
"""

from __future__ import annotations

from epochstream import wire

KINDS = ("dicts", "tuples", "arrow")
CARRIERS = ("AA", "B6", "DL", "EV", "UA", "US", "WN", "9E")
DESTS = ("ATL", "BOS", "CLT", "DEN", "LAX", "MCO", "ORD", "SFO")


def codec_name(kind: str) -> str:
    return "arrow" if kind == "arrow" else "msgpack"


def records(kind: str, n: int, start: int = 0):
    """``n`` records (id, sched_ts, carrier, delay, dest) in the shape of ``kind``."""
    rows = [(start + i, 1_356_998_400.0 + 60.0 * (start + i), CARRIERS[i % 8], (i * 7) % 120 - 20,
             DESTS[(i * 3) % 8]) for i in range(n)]
    if kind == "tuples":
        return rows
    if kind == "dicts":
        return [{"id": a, "sched_ts": b, "carrier": c, "delay": d, "dest": e} for a, b, c, d, e in rows]
    if kind == "arrow":
        import pyarrow as pa
        cols = list(zip(*rows)) if rows else [[], [], [], [], []]
        return pa.record_batch({"id": pa.array(cols[0], pa.int64()),
                                "sched_ts": pa.array(cols[1], pa.float64()),
                                "carrier": pa.array(cols[2], pa.string()),
                                "delay": pa.array(cols[3], pa.int64()),
                                "dest": pa.array(cols[4], pa.string())})
    raise ValueError(f"unknown payload kind {kind!r}; known: {KINDS}")


def encoded(kind: str, per_message: int, variants: int = 4) -> list[bytes]:
    """``variants`` distinct encoded payloads of ``per_message`` records each."""
    c = wire.codec(codec_name(kind))
    return [c.encode(records(kind, per_message, start=v * per_message)) for v in range(variants)]


def count(kind: str, decoded) -> int:
    """Records in a decoded payload (a tuple of records, or a RecordBatch)."""
    return decoded.num_rows if kind == "arrow" else len(decoded)
