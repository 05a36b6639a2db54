"""Case ``partitions_wide``: partitions 1 → 64 and antichain width 1 → 64, end to end (issue 28;
the ``scale`` case stops at 16 partitions with one publisher *process* per partition, which at
64 would measure process spawning on 2 cores rather than the protocol).

- **partitions** P: one publisher process holds the P ``Publisher`` objects of a P-partition
  topic (each with its own loop thread); a driver thread sends, for every epoch, one message of
  ``PER_MESSAGE`` msgpack tuples to every partition, then ``advance_to(e + 1)`` on every
  partition — so an epoch holds ``P × PER_MESSAGE`` records and completes only when all P
  partitions moved. The subscriber (this process, ``epochs()``, ``credit`` flow control against
  every partition) counts records and epochs, time-based (``paired.seconds``). Variants are
  interleaved within each repeat. Reported: records/s, epochs/s, subscriber CPU per epoch and
  per partition-message, publisher process CPU per record.
- **antichain width** w: :func:`benchmarks.bench_scale.antichain_run` (a ``product(2)`` topic
  whose publisher holds w incomparable capabilities; each step completes w epochs).

The growth stated is that of subscriber CPU per record and per epoch against P (or w). Also
``poll``: the CPU of one ``zmq.Poller.poll(0)`` over n idle sockets — a subscriber polls every
partition's socket on each read pass, so this cost per pass grows with the partitions.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

from . import curves, paired, payloads
from .bench_scale import antichain_run

PER_MESSAGE = 100
CREDIT = 256


def plan(quick: bool) -> dict:
    if quick:
        return {"partitions": (1, 8, 64), "widths": (1, 8, 64), "repeats": 1, "poll_sockets": (1, 64, 256)}
    # 128 and 256 partitions beyond the 64: where the subscriber's poll over every
    # partition's socket starts to show (see poll_cost)
    return {"partitions": (1, 2, 4, 8, 16, 32, 64, 128, 256), "widths": (1, 2, 4, 8, 16, 32, 64),
            "repeats": 2, "poll_sockets": (1, 16, 64, 256, 1000)}


def _publishers(topic, parts, seconds, q, go):
    try:
        from epochstream import Publisher
        body = payloads.encoded("tuples", PER_MESSAGE)[0]
        pubs = [Publisher(topic, p, partitions=parts, codec="msgpack", max_queue_messages=2 * CREDIT,
                          queue_hwm=CREDIT, sndhwm=100_000) for p in range(parts)]
        q.put(("endpoints", [p.endpoint for p in pubs]))
        go.wait(120)
        cpu0, t0, e = time.process_time(), time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            for p in pubs:
                p.send_encoded(e, body)
            e += 1
            for p in pubs:
                p.advance_to(e)
        for p in pubs:
            p.flush(60)
        q.put(("published", {"epochs": e, "records": e * parts * PER_MESSAGE,
                             "cpu_s": time.process_time() - cpu0}))
        for p in pubs:
            p.close(linger=10)
    except BaseException as exc:
        q.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def poll_cost(counts, seconds: float = 0.3) -> list[dict]:
    """CPU of one ``zmq.Poller.poll(0)`` over ``n`` idle DEALER sockets (what a subscriber's
    every read pass costs with ``n`` partitions: ``links.poll``), µs."""
    import zmq
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 8192)
    out = []
    try:
        for n in counts:
            socks = [ctx.socket(zmq.DEALER) for _ in range(n)]
            poller = zmq.Poller()
            for sk in socks:
                sk.connect("tcp://127.0.0.1:9")  # nothing listens: never readable
                poller.register(sk, zmq.POLLIN)
            calls, t0, c0 = 0, time.monotonic(), time.process_time()
            while time.monotonic() - t0 < seconds:
                poller.poll(0)
                calls += 1
            out.append({"sockets": n, "calls": calls, "cpu_us_per_poll": (time.process_time() - c0) / calls * 1e6})
            for sk in socks:
                sk.close(0)
    finally:
        ctx.term()
    return out


def pass_cost(counts, seconds: float = 0.5) -> list[dict]:
    """CPU of one subscriber read pass when one of ``n`` links has a message, µs: a ROUTER sends
    one message to link ``i % n``; the pass waits for it and reads that link until
    ``zmq.Again``. ``poller``: a ``zmq.Poller`` over every link (the wait before 2026-11-27);
    ``epoll``: :meth:`PartitionLinks.poll <epochstream.transport.links.PartitionLinks.poll>`
    (transport/links.py). Both wait on the same real ``PartitionLinks`` sockets, in one
    process (the ROUTER's send is in both figures), interleaved."""
    import zmq
    from epochstream.transport.links import PartitionLinks
    out = []
    for n in counts:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 8192)
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        links = PartitionLinks(ctx, rcvhwm=1000, ping_interval=1.0, security=None, credit=None)
        try:
            for k in range(n):
                links.connect(k, f"tcp://127.0.0.1:{port}", {"topic": "pass-cost"})
            idents = [router.recv_multipart()[0] for _ in range(n)]  # the hellos, in any order
            poller = zmq.Poller()
            for sk in links.partition_of:
                poller.register(sk, zmq.POLLIN)
            row = {"sockets": n}
            for rep in range(2):  # interleaved: poller, epoll, poller, epoll
                for variant in ("poller", "epoll"):
                    if variant == "poller":
                        def wait(ms, poll=poller.poll):
                            return [sk for sk, _ in poll(ms)]
                    else:
                        wait = links.poll
                    links.poll(0)  # settle every link (read until zmq.Again)
                    for sk in list(links.unsettled):
                        _read_all(links, sk)
                    passes, i, t0, c0 = 0, 0, time.monotonic(), time.process_time()
                    while time.monotonic() - t0 < seconds / 2:
                        router.send_multipart([idents[i % n], b"x" * 64])
                        i += 1
                        got = 0
                        while not got:
                            for sk in wait(1000):
                                got += _read_all(links, sk)
                            passes += 1
                    cpu = (time.process_time() - c0) / passes * 1e6
                    row[f"{variant}_us_per_pass"] = min(cpu, row.get(f"{variant}_us_per_pass", cpu))
            out.append(row)
        finally:
            for k in list(links.live()):
                links.retire(k)
            links.close()
            router.close(0)
            ctx.term()
    return out


def _read_all(links, sk) -> int:
    """Read link ``sk`` until ``zmq.Again`` (then it is settled, as the subscriber does)."""
    import zmq
    receive, n = links.receivers[sk], 0
    while True:
        try:
            receive()
        except zmq.Again:
            links.settled(sk)
            return n
        n += 1


def partitions_run(parts: int, seconds: float) -> dict:
    from epochstream import Subscriber
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    topic = f"wide-{parts}-{time.monotonic_ns()}"
    proc = ctx.Process(target=_publishers, args=(topic, parts, seconds, q, go), daemon=True)
    proc.start()
    row = {"partitions": parts, "records_per_message": PER_MESSAGE, "duration_s": seconds, "ok": False,
           "loadavg_before": curves.loadavg()}
    records = epochs = 0
    try:
        endpoints = curves.expect(q, "endpoints", 120)
        sub = Subscriber(topic, endpoints=endpoints, codec="msgpack", rcvhwm=100_000, credit=CREDIT,
                         timeout=60)
        if not sub.wait_ready(60):
            raise TimeoutError("subscriber not ready")
        cpu0, t0 = time.process_time(), time.monotonic()
        go.set()
        for ep in sub.epochs(timeout=30):  # ends when every publisher closed
            if hasattr(ep, "records"):
                records += len(ep.records)
                epochs += 1
        res = curves.expect(q, "published", 120)
        dt, cpu = time.monotonic() - t0, time.process_time() - cpu0
        sub.close()
        ok = records == res["records"]
        row.update(ok=ok, records=records, epochs=epochs, seconds=dt, records_per_s=records / dt,
                   epochs_per_s=epochs / dt, sub_cpu_us_per_epoch=cpu / epochs * 1e6,
                   sub_cpu_ns_per_record=cpu / records * 1e9,
                   sub_cpu_us_per_partition_message=cpu / (epochs * parts) * 1e6,
                   pub_cpu_ns_per_record=res["cpu_s"] / records * 1e9)
        if not ok:
            row["error"] = f"sent {res['records']}, received {records}"
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        proc.kill()
        proc.join(10)
    return row


def _summ(rows, key):
    labels = sorted({r["variant"] for r in rows}, key=int)
    med = []
    for lab in labels:
        vals = [r[key] for r in rows if r["variant"] == lab and r.get("ok") and r.get(key) is not None]
        med.append((int(lab), paired.summary(vals)))
    xs = [x for x, s in med if s]
    return {"by_value": med, "fit": curves.fit(xs, [s["median"] for _, s in med if s])}


def summarise(rows: dict, polls=None) -> dict:
    """``rows``: ``{"partitions": [...], "widths": [...]}`` (the result's ``rows``)."""
    summary = {f"partitions.{k}": _summ(rows["partitions"], k) for k in
               ("records_per_s", "epochs_per_s", "sub_cpu_us_per_epoch", "sub_cpu_ns_per_record",
                "sub_cpu_us_per_partition_message", "pub_cpu_ns_per_record")}
    summary.update({f"widths.{k}": _summ(rows["widths"], k) for k in
                    ("records_per_s", "epochs_per_s", "sub_cpu_us_per_step", "sub_cpu_us_per_epoch",
                     "sub_cpu_ns_per_record")})
    if polls:
        summary["poll_cpu_us"] = curves.fit([x["sockets"] for x in polls], [x["cpu_us_per_poll"] for x in polls])
    return summary


def run(quick: bool = False, log=print) -> dict:
    p = plan(quick)
    seconds = paired.seconds(quick)
    reps = p["repeats"]
    t0 = time.monotonic()

    def part(label, rep):
        r = partitions_run(int(label), seconds)
        log(f"  partitions={int(label):2d} #{rep}: " + (
            f"{r['records_per_s'] / 1e6:.2f}M rec/s, {r['epochs_per_s']:.0f} epochs/s, sub "
            f"{r['sub_cpu_us_per_epoch']:.0f} µs/epoch, {r['sub_cpu_ns_per_record']:.0f} ns/rec"
            if r["ok"] else f"FAILED {r.get('error')}"))
        return r

    def width(label, rep):
        r = antichain_run(int(label), seconds)
        if r.get("ok"):
            r["sub_cpu_us_per_epoch"] = r["sub_cpu_us_per_step"] / int(label)
            r["sub_cpu_ns_per_record"] = r["sub_cpu_s_per_M"] * 1e3
        log(f"  width={int(label):2d} #{rep}: " + (
            f"{r['records_per_s'] / 1e6:.2f}M rec/s, {r['epochs_per_s']:.0f} epochs/s, sub "
            f"{r['sub_cpu_us_per_step']:.0f} µs/step" if r["ok"] else f"FAILED {r.get('error')}"))
        return r

    parts = paired.interleave([str(n) for n in p["partitions"]], reps, part, log=log)
    widths = paired.interleave([str(w) for w in p["widths"]], reps, width, log=log)

    polls = poll_cost(p["poll_sockets"])
    for x in polls:
        log(f"  poll over {x['sockets']:4d} sockets: {x['cpu_us_per_poll']:.1f} µs")
    passes = pass_cost(p["poll_sockets"])
    for x in passes:
        log(f"  read pass, 1 of {x['sockets']:4d} links ready: zmq.Poller {x['poller_us_per_pass']:.1f} µs, "
            f"epoll {x['epoll_us_per_pass']:.1f} µs")
    summary = summarise({"partitions": parts, "widths": widths}, polls)
    rows = parts + widths
    return {"quick": quick, "poll": polls, "passes": passes, "repeats": reps, "seconds_per_run": seconds, "plan": p,
            "rows": {"partitions": parts, "widths": widths}, "summary": summary,
            "ok": all(r.get("ok") for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
