"""The Arrow schema on the wire (issue 28: "the Arrow schema once per connection"), measured in
process before building it: what a schema sent once per connection would save per message
against today's payload (a one-batch IPC stream that repeats its schema), on the harness's
38 KB Arrow message of 1000 records.

- decode: today's ``ArrowCodec.decode`` (the schema's bytes looked up in a cache, the batch read
  against the cached schema) against reading the batch message alone with a known schema
  (``pyarrow.ipc.read_record_batch``: what a schema-once wire would do);
- encode: pyarrow's stream writer per batch (the encoder before 2026-11-27) against today's
  ``ArrowCodec.encode`` (the serialised schema and batch messages joined: identical bytes).

CPU seconds of this thread per call, 7 interleaved rounds of 1 s per variant; ratios paired
within a round. ``python -m benchmarks.arrow_schema`` writes ``results/arrow_schema.json``."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from . import payloads


def _per_call(f, arg, seconds: float) -> float:
    n, t0, end = 0, time.thread_time(), time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(200):
            f(arg)
        n += 200
    return (time.thread_time() - t0) / n * 1e6


def _summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def run(rounds: int = 7, seconds: float = 1.0) -> dict:
    import pyarrow as pa

    from epochstream.codecs import ArrowCodec
    codec = ArrowCodec()
    payload = payloads.encoded("arrow", 1000)[0]
    batch = codec.decode(payload)
    schema = batch.schema
    message = batch.serialize()

    def writer(records):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, records.schema) as w:
            w.write_batch(records)
        return sink.getvalue().to_pybytes()

    assert writer(batch) == codec.encode(batch) == payload
    variants = {"decode_today": (codec.decode, payload),
                "decode_batch_only": (lambda m: pa.ipc.read_record_batch(m, schema), message),
                "encode_writer": (writer, batch), "encode_today": (codec.encode, batch)}
    rows = []
    for r in range(rounds):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        rows.append({k: _per_call(*variants[k], seconds) for k in names})
    return {
        "payload_bytes": len(payload), "schema_message_bytes": len(schema.serialize()),
        "batch_message_bytes": message.size, "rounds": rows,
        "us_per_call": {k: _summary([r[k] for r in rows]) for k in variants},
        "decode_batch_only_over_today": _summary([r["decode_batch_only"] / r["decode_today"] for r in rows]),
        "encode_today_over_writer": _summary([r["encode_today"] / r["encode_writer"] for r in rows]),
        "loadavg_at_start": list(os.getloadavg()),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


if __name__ == "__main__":
    out = run()
    path = Path(__file__).resolve().parent / "results" / "arrow_schema.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("us_per_call", "decode_batch_only_over_today",
                                           "encode_today_over_writer")}, indent=1))
