"""Case ``history_scale``: retained history 1 GB → 20 GB — time to the first epoch from
``earliest`` and from a mid position, and the replay rate (issue 28).

A publisher process (``Retention(max_bytes=None, max_age=None, fsync="none")``: keep
everything, no fsync, default 64 MiB segments; a SQLite catalog) writes epochs of
``MESSAGES_PER_EPOCH`` messages of ``RECORDS_PER_MESSAGE`` msgpack tuples until the topic's log
directory holds the next size of the plan, then idles while it is measured (it stays live), and
grows the same log to the next size — so every size is the same log, longer.

At each size (after one unrecorded warm-up subscriber at the first size: the process's first
``Subscriber`` pays imports that are not the log's), each measurement in a new subscriber after
dropping the log's pages from the OS
page cache (``posix_fadvise(DONTNEED)`` on every segment file: the reads come from the disk, as
for a log written long ago):

- ``first_earliest_s`` — ``Subscriber(topic, catalog, start="earliest")`` constructed and its
  first epoch handed out (``epochs()``);
- ``first_mid_s`` — the same with ``start=E // 2`` (E = epochs in the log): the catalog's epoch
  index finds the segment and offset, nothing before it is read;
- ``replay`` — from ``earliest`` for ``replay_s`` seconds, decoding and counting every record:
  records/s and MB/s of log.

The growth stated is that of each time against the log's size; a scan from the start would
show ``first_mid_s`` growing linearly.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback

from . import curves, payloads

RECORDS_PER_MESSAGE = 1000
MESSAGES_PER_EPOCH = 10
TOPIC = "hist-scale"
GB = 1_000_000_000


def plan(quick: bool) -> dict:
    if quick:
        return {"sizes_bytes": (20_000_000, 60_000_000, 150_000_000), "replay_s": 0.5}
    return {"sizes_bytes": (1 * GB, 2 * GB, 5 * GB, 10 * GB, 20 * GB), "replay_s": 3.0}


def log_bytes(d: str) -> tuple[int, list[str]]:
    total, files = 0, []
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            try:
                total += os.path.getsize(p)
                files.append(p)
            except OSError:
                pass
    return total, files


def drop_cache(d: str) -> None:
    for p in log_bytes(d)[1]:
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError:
            pass


def _writer(catalog, logdir, q, cmd):
    try:
        from epochstream import Publisher, Retention
        bodies = payloads.encoded("tuples", RECORDS_PER_MESSAGE)
        pub = Publisher(TOPIC, catalog=catalog, codec="msgpack",
                        retention=Retention(dir=logdir, max_bytes=None, max_age=None, fsync="none"),
                        max_queue_messages=1_000_000, max_queue_bytes=8 << 30)
        q.put(("ready", pub.endpoint))
        e = msgs = 0
        while True:
            target = cmd.get()
            if target is None:
                break
            t0, cpu0, e0 = time.monotonic(), time.process_time(), e
            while log_bytes(logdir)[0] < target:
                for _ in range(100):
                    for _ in range(MESSAGES_PER_EPOCH):
                        pub.send_encoded(e, bodies[msgs % len(bodies)])
                        msgs += 1
                    e += 1
                    pub.advance_to(e)
                pub.flush(120)
            pub.flush(120)
            q.put(("at", {"epochs": e, "bytes": log_bytes(logdir)[0], "write_s": time.monotonic() - t0,
                          "write_cpu_s": time.process_time() - cpu0, "epochs_written": e - e0}))
        pub.close(linger=10)
        q.put(("closed", e))
    except BaseException as exc:
        q.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def first_epoch(catalog, start) -> dict:
    from epochstream import Subscriber
    t0 = time.monotonic()
    sub = Subscriber(TOPIC, catalog, start=start, timeout=120)
    t1 = time.monotonic()
    ep = next(x for x in sub.epochs(timeout=120) if hasattr(x, "records"))
    t2 = time.monotonic()
    sub.close()
    return {"seconds": t2 - t0, "constructor_s": t1 - t0, "time": ep.time, "records": len(ep.records)}


def replay(catalog, seconds: float, total_epochs: int | None = None) -> dict:
    """Read from ``earliest`` for ``seconds``, or to the end of the log (``total_epochs``: a
    small log is read whole sooner, and then the idle publisher sends nothing more)."""
    from epochstream import Subscriber
    t0, cpu0 = time.monotonic(), time.process_time()
    sub = Subscriber(TOPIC, catalog, start="earliest", timeout=120)
    records = epochs = 0
    for ep in sub.epochs(timeout=120):
        if hasattr(ep, "records"):
            records += len(ep.records)
            epochs += 1
        if time.monotonic() - t0 >= seconds or (total_epochs is not None and epochs >= total_epochs):
            break
    dt, cpu = time.monotonic() - t0, time.process_time() - cpu0
    sub.close()
    return {"seconds": dt, "records": records, "epochs": epochs, "records_per_s": records / dt,
            "read_to_the_end": total_epochs is not None and epochs >= total_epochs,
            "sub_cpu_fraction": cpu / dt}


def summarise(rows) -> dict:
    xs = [r["log_bytes"] / GB for r in rows]
    return {
        "first_earliest_s": curves.fit(xs, [r["first_earliest"]["seconds"] for r in rows]),
        "first_mid_s": curves.fit(xs, [r["first_mid"]["seconds"] for r in rows]),
        "replay_records_per_s": curves.fit(xs, [r["replay"]["records_per_s"] for r in rows]),
    }


def run(quick: bool = False, log=print, sizes=None, replay_s=None) -> dict:
    p = plan(quick)
    if sizes is not None:
        p["sizes_bytes"] = tuple(int(s) for s in sizes)
    if replay_s is not None:
        p["replay_s"] = float(replay_s)
    t_all = time.monotonic()
    base = tempfile.mkdtemp(prefix="es-histscale-", dir=os.environ.get("BENCH_HISTORY_DIR"))
    catalog, logdir = os.path.join(base, "catalog.db"), os.path.join(base, "logs")
    ctx = mp.get_context("spawn")
    q, cmd = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_writer, args=(catalog, logdir, q, cmd), daemon=True)
    proc.start()
    rows, error = [], None
    try:
        curves.expect(q, "ready", 120)
        for size in p["sizes_bytes"]:
            cmd.put(size)
            at = curves.expect(q, "at", 3600)
            bytes_per_epoch = at["bytes"] / at["epochs"]
            row = {"target_bytes": size, "log_bytes": at["bytes"], "epochs": at["epochs"],
                   "write_s": at["write_s"], "write_MB_per_s": (at["epochs_written"] * bytes_per_epoch) / at["write_s"] / 1e6,
                   "loadavg": curves.loadavg()}
            if not rows:  # the process's first subscriber pays its imports: not the log's size
                first_epoch(catalog, "earliest")
            drop_cache(logdir)
            row["first_earliest"] = first_epoch(catalog, "earliest")
            drop_cache(logdir)
            row["first_mid"] = first_epoch(catalog, at["epochs"] // 2)
            drop_cache(logdir)
            rp = replay(catalog, p["replay_s"], at["epochs"])
            rp["MB_per_s"] = rp["records"] / RECORDS_PER_MESSAGE / MESSAGES_PER_EPOCH * bytes_per_epoch / rp["seconds"] / 1e6
            row["replay"] = rp
            rows.append(row)
            log(f"  history_scale {at['bytes'] / 1e9:6.2f} GB ({at['epochs']} epochs, written at "
                f"{row['write_MB_per_s']:.0f} MB/s): first epoch from earliest {row['first_earliest']['seconds'] * 1e3:.0f} ms, "
                f"from the middle {row['first_mid']['seconds'] * 1e3:.0f} ms, replay {rp['records_per_s'] / 1e6:.2f}M rec/s "
                f"({rp['MB_per_s']:.0f} MB/s)")
        cmd.put(None)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"  history_scale: FAILED {error}")
    finally:
        proc.kill()
        proc.join(10)
        shutil.rmtree(base, ignore_errors=True)
    summary = summarise(rows)
    return {"quick": quick, "plan": p, "rows": rows, "summary": summary, "error": error,
            "records_per_message": RECORDS_PER_MESSAGE, "messages_per_epoch": MESSAGES_PER_EPOCH,
            "ok": error is None, "wall_s": round(time.monotonic() - t_all, 1)}
