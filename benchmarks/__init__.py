"""epochstream benchmarks (``python -m benchmarks [--quick] [--case NAME ...]``).

Cases (one module each, each with ``run(quick: bool) -> dict``):

- ``filter`` (:mod:`benchmarks.bench_filter`) — subscriber-side filter path, in process, on
  pre-built frames: header decode + ``passes`` + payload decode only for passing messages, vs.
  decoding every payload and filtering afterwards.
- ``e2e`` (:mod:`benchmarks.bench_e2e`) — publisher → 1 subscriber over tcp in separate
  processes, 1/2 partitions, 1/100/1000 records per message, three payload kinds, both APIs,
  time-based; plus idle epoch latency (send of an epoch's last batch → the subscriber's ``Epoch``).
- ``peers`` (:mod:`benchmarks.bench_peers`) — the same payloads with the same batching through
  epochstream (coalescing off, and on — labelled), raw pyzmq (same framing, no protocol), Redis
  pub/sub and NATS core; paired, interleaved repeats (:mod:`benchmarks.paired`).
- ``fanout`` (:mod:`benchmarks.bench_fanout`) — one publisher → 1..64 subscriber processes:
  publisher CPU per message per subscriber, delivered records/s.
- ``spark`` (:mod:`benchmarks.bench_spark`) — a PySpark query over the flights data written with
  ``format("epochstream")`` vs. Spark's ``noop`` sink.
- ``limits`` (:mod:`benchmarks.bench_limits`) — this machine's ceilings: memcpy, libzmq through
  pyzmq (PUSH/PULL, 1/2/3 frames), decode-only loops; the report divides epochstream by them.
- ``latejoin`` (:mod:`benchmarks.bench_latejoin`) — ``Subscriber(...)`` to its first complete
  epoch while a publisher streams steadily.
- ``latency`` (:mod:`benchmarks.bench_latency`) — epoch latency p50/p99/p99.9 at 10/50/90 % of
  the peak measured in the same run.
- ``memory`` (:mod:`benchmarks.bench_memory`) — publisher RSS per subscriber and per queued
  message.
- ``scale`` (:mod:`benchmarks.bench_scale`) — partitions 1..16, antichain width 1..64
  (product(2)), epoch size vs records per message.
- ``history`` (:mod:`benchmarks.bench_history`) — durable history (issue 11): what retention
  costs a live stream (fsync policies), catch-up from the log, resume latency of a durable
  subscription in a new process, fsync on this machine, a profile of the log's calls.
- ``groups`` (:mod:`benchmarks.bench_groups`) — consumer groups (issue 12): epochs/s of 1, 2 and
  4 worker processes against the ideal linear speed-up (shared mode, fixed sleep per epoch; and
  partial mode over independent product(2) chains), fetch and ack latency, the delay of a
  redelivery after a lease expiry or a SIGKILL, fetch cost against the backlog, a profile.
- ``store`` (:mod:`benchmarks.bench_store`) — epoch logs in an object store (issue 23, a local
  SeaweedFS): replay from the store vs the local log vs live delivery, publisher throughput with
  ``upload="sealed"``/``"frontier"`` vs no store, time from a seal or an advance to readable.

Every case writes ``benchmarks/results/<case>.json``; :mod:`benchmarks.report` turns all result
files into ``docs/benchmarks.md`` (tables) and ``docs/img/*.png`` (plots).

``BENCH_SCALE=0.1`` (run lengths × 0.1) and ``BENCH_REPEATS=2`` are development aids; the
results then say how long and how many runs they were.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
"""Where result files go: ``benchmarks/results``, or ``$BENCH_RESULTS`` for a trial run."""
DOCS = ROOT / "docs"
IMG = DOCS / "img"

__all__ = ["ROOT", "RESULTS", "DOCS", "IMG", "machine_info", "save_result", "load_result", "median"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return None


def _server_version(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except Exception:
        return None


def machine_info() -> dict:
    """Machine, OS and library versions, recorded with every result file."""
    import zmq
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "libzmq": zmq.zmq_version(),
        "versions": {d: _version(d) for d in
                     ("epochstream", "pyzmq", "msgpack", "pyarrow", "redis", "hiredis", "nats-py",
                      "pyspark", "pandas", "numpy")},
    }
    return info


def save_result(case: str, result: dict) -> Path:
    """Write ``benchmarks/results/<case>.json`` (with machine info and a timestamp)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = dict(result)
    result.setdefault("case", case)
    result.setdefault("machine", machine_info())
    result.setdefault("finished", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    path = RESULTS / f"{case}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def load_result(case: str) -> dict | None:
    path = RESULTS / f"{case}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def median(values):
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
