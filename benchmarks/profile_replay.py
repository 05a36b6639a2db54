"""Where history replay's time goes, in one process, on the ``history`` case's stream (msgpack
tuples, 1000 records per message, 10 messages per epoch): why replay and live delivery run at
the same speed (both are bound by decoding on one core), and what a read-ahead thread would buy.

A publisher with ``Retention(fsync="none")`` writes ``EPOCHS`` epochs to a fresh log (no
subscriber); then, in paired interleaved repeats (the order rotated per repeat), each step of
the replay path is timed on the same bytes, every record decoded and counted:

- ``read``: :func:`~epochstream.epochlog.read_epoch` of every epoch (file reads, CRC-32 checks,
  copies), nothing decoded;
- ``decode``: ``msgpack.unpackb`` of every payload (already in memory), each dropped at once;
- ``decode_epoch``: the same, each epoch's payloads decoded and combined into one list (what both
  the live subscriber's assembler and replay do), so the epoch's records are alive together and
  the cyclic garbage collector runs over them;
- ``history``: ``History(topic).epochs()`` (read + decode_epoch + the ``Epoch``);
- ``history_readahead``: the same with the files read one epoch-batch ahead in a second thread
  (``concurrent.futures``, up to 32 MiB ahead; the lever the last session left: file reads and
  CRC-32 release the GIL), built here, not in the library;
- ``history_nogc``: ``history`` with ``gc.disable()`` around the run (what the collector costs).
- ``replay``: ``Subscriber(topic, start="earliest").epochs()`` (the benchmark's replay, in
  process; the publisher is alive and idle).

Writes ``benchmarks/results/profile_replay.json``: records/s and CPU s per million records per
step and repeat, medians, and the ``history`` ÷ step ratios paired per repeat.

``python -m benchmarks.profile_replay [EPOCHS] [REPEATS]``"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from . import RESULTS, median, paired, payloads
from .provenance import library as _library

EPOCHS, MESSAGES, RECORDS = 1000, 10, 1000


def _readahead_epochs(h, max_bytes=32 << 20):
    """``History.epochs()`` with the segment reads done ahead in a second thread."""
    from epochstream.log import read_epoch
    from epochstream.events import Epoch

    decode, combine = h.codec.decode, h.codec.combine
    dirs = {p: s.dir for p, s in h.states().items()}
    epochs = h.records()
    jobs = [(t, r) for t, recs in epochs for r in recs]
    pool = ThreadPoolExecutor(1)
    pending: deque = deque()
    ahead = i = 0
    try:
        for t, recs in epochs:
            chunks = []
            for _ in recs:
                while i < len(jobs) and (not pending or ahead + jobs[i][1].nbytes <= max_bytes):
                    r = jobs[i][1]
                    pending.append((r.nbytes, pool.submit(read_epoch, dirs[r.partition], r)))
                    ahead += r.nbytes
                    i += 1
                n, fut = pending.popleft()
                ahead -= n
                chunks += [decode(p) for _, p in fut.result()]
            yield Epoch(t, combine(chunks), len(chunks), sum(r.nbytes for r in recs),
                        max(r.completed_at for r in recs), time.time())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run(epochs: int = EPOCHS, repeats: int = 5) -> dict:
    import msgpack

    from epochstream import Catalog, History, Publisher, Retention, Subscriber
    from epochstream.log import read_epoch

    d = tempfile.mkdtemp(prefix="es-prof-replay-")
    bodies = payloads.encoded("tuples", RECORDS)
    total = epochs * MESSAGES * RECORDS
    pub = Publisher("replay-prof", 0, catalog=Catalog(d), codec="msgpack",
                    retention=Retention(fsync="none"), max_queue_messages=10_000_000,
                    max_queue_bytes=8 << 30)
    try:
        m = 0
        for e in range(epochs):
            for _ in range(MESSAGES):
                pub.send_encoded(e, bodies[m % len(bodies)])
                m += 1
            pub.advance_to(e + 1)
        pub.flush(120)
        cat = Catalog(d)
        h = History("replay-prof", catalog=cat)
        recs = [r for _, rs in h.records() for r in rs]
        dirs = {p: s.dir for p, s in h.states().items()}
        loaded = [[p for _, p in read_epoch(dirs[r.partition], r)] for r in recs]
        unpack = msgpack.unpackb

        def read():
            for r in recs:
                read_epoch(dirs[r.partition], r)
            return total

        def decode():
            n = 0
            for ps in loaded:
                for p in ps:
                    n += len(unpack(p, use_list=False, raw=False, strict_map_key=False))
            return n

        def decode_epoch():
            n = 0
            for ps in loaded:
                out: list = []
                for p in ps:
                    out.extend(unpack(p, use_list=False, raw=False, strict_map_key=False))
                n += len(out)
            return n

        def history():
            return sum(len(ep.records) for ep in History("replay-prof", catalog=cat).epochs())

        def history_readahead():
            return sum(len(ep.records) for ep in _readahead_epochs(History("replay-prof", catalog=cat)))

        def history_nogc():
            enabled = gc.isenabled()
            gc.disable()
            try:
                return history()
            finally:
                if enabled:
                    gc.enable()

        def replay():
            n = 0
            with Subscriber("replay-prof", cat, start="earliest", timeout=30) as sub:
                for ep in sub.epochs(timeout=30):
                    n += len(ep.records)
                    if n >= total:
                        break
            return n

        steps = {"read": read, "decode": decode, "decode_epoch": decode_epoch, "history": history,
                 "history_readahead": history_readahead, "history_nogc": history_nogc,
                 "replay": replay}
        names = list(steps)
        rows = []
        for rep in range(repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                gc.collect()
                w0, c0 = time.perf_counter(), time.process_time()
                n = steps[name]()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                assert n == total, (name, n, total)
                rows.append({"variant": name, "repeat": rep, "ok": True, "records": n, "seconds": wall,
                             "records_per_s": n / wall, "cpu_s_per_M": cpu / (n / 1e6)})
                print(f"  #{rep} {name:18s} {n / wall / 1e6:6.2f} M rec/s, CPU {cpu / (n / 1e6):.3f} s/M",
                      flush=True)
    finally:
        pub.close()
        shutil.rmtree(d, ignore_errors=True)
    summary = {}
    for name in names:
        rs = [r for r in rows if r["variant"] == name]
        summary[name] = {"records_per_s": paired.summary([r["records_per_s"] for r in rs]),
                         "cpu_s_per_M": paired.summary([r["cpu_s_per_M"] for r in rs])}
    ratios = {f"{name} ÷ history": paired.summary(paired.pair_ratios(rows, name, "history"))
              for name in names if name != "history"}
    return {"case": "profile_replay", "epochs": epochs, "messages_per_epoch": MESSAGES,
            "records_per_message": RECORDS, "payload": "tuples", "records": total,
            "repeats": repeats, "library": _library(), "loadavg": os.getloadavg()[0],
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows, "summary": summary,
            "ratios_records_per_s": ratios,
            "median_cpu_s_per_M": {n: median([r["cpu_s_per_M"] for r in rows if r["variant"] == n])
                                   for n in names}}


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    out = run(*args)
    path = RESULTS / "profile_replay.json"
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    for k, v in out["ratios_records_per_s"].items():
        print(f"  {k}: {v['median']:.3f} ({v['min']:.3f}–{v['max']:.3f})")
    print(f"-> {path}")
