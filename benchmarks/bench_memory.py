"""Case ``memory``: the publisher's resident memory per subscriber and per queued message.

RSS of the publisher process is read with psutil once it has settled (unchanged for 0.3 s, at
most 5 s).

- **Per subscriber**: an idle publisher (heartbeats only); a subscriber process opens 1
  ``Subscriber`` (``wait_ready``), then 31 more (32 in all). Per subscriber =
  (RSS with 32 − RSS with 1) ÷ 31. A fresh publisher per repeat.
- **Per queued message**: a subscriber process opens a ``Subscriber(rcvhwm=10)`` and then never
  reads (a stalled consumer); the publisher (``sndhwm=10``, coalescing off, backlog bounds above
  the test size) sends ``N`` msgpack payloads of known size (100 tuples, 1,903 bytes each),
  which end up in its per-subscriber backlog (and a few in ZeroMQ pipes and socket buffers).
  Per queued message = (RSS after − RSS before) ÷ N, compared with the payload size. Each
  payload is a distinct ``bytes`` object (as an application's are). Bytes held by the kernel in
  the TCP socket queues (``/proc/net/tcp``) are not in any RSS; they are recorded beside.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

from . import paired, payloads
from .streams import PublisherProcess


def _rss(pid: int) -> int:
    import psutil
    return psutil.Process(pid).memory_info().rss


def _settled_rss(pid: int, limit: float = 5.0) -> int:
    last, t_stable, deadline = _rss(pid), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _rss(pid)
        if now != last:
            last, t_stable = now, time.monotonic()
        elif time.monotonic() - t_stable >= 0.3:
            break
    return last


def kernel_queued_bytes(endpoint: str) -> int | None:
    """Bytes in the kernel's send and receive queues of every TCP socket on the endpoint's port
    (``/proc/net/tcp`` ``tx_queue``/``rx_queue``): memory outside any process's RSS."""
    try:
        port = int(endpoint.rsplit(":", 1)[1])
        total = 0
        for line in open("/proc/net/tcp").read().splitlines()[1:]:
            f = line.split()
            lp, rp = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
            if port in (lp, rp):
                tx, rx = f[4].split(":")
                total += int(tx, 16) + int(rx, 16)
        return total
    except Exception:
        return None


def _subs_main(endpoint, topic, counts, q, proceed, rcvhwm):
    """Child: open subscribers in steps (``counts``), report after each step, wait for
    ``proceed`` before the next; never read data after ``wait_ready``."""
    try:
        from epochstream import Subscriber
        subs = []
        for c in counts:
            while len(subs) < c:
                s = Subscriber(topic, endpoints=[endpoint], codec="msgpack", rcvhwm=rcvhwm, timeout=600)
                if not s.wait_ready(30):
                    raise TimeoutError("subscriber not ready")
                subs.append(s)
            q.put(("ready", c))
            proceed.wait(300)
            proceed.clear()
        for s in subs:
            s.close()
    except BaseException as exc:
        q.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _subs(endpoint, topic, counts, rcvhwm=1000):
    ctx = mp.get_context("spawn")
    q, proceed = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_subs_main, args=(endpoint, topic, counts, q, proceed, rcvhwm), daemon=True)
    p.start()
    return p, q, proceed


def _wait(q, what, timeout=120):
    msg = q.get(timeout=timeout)
    if msg[0] == "error":
        raise RuntimeError(f"subscriber process: {msg[1]}")
    return msg


def per_subscriber(n_max: int = 32) -> dict:
    pub = PublisherProcess({"pattern": "idle"})
    p = None
    try:
        pub.start()
        base = _settled_rss(pub.pid)
        p, q, proceed = _subs(pub.endpoint, pub.topic, (1, n_max))
        _wait(q, "1")
        one = _settled_rss(pub.pid)
        proceed.set()
        _wait(q, str(n_max))
        many = _settled_rss(pub.pid)
        proceed.set()
        p.join(30)
        pub.stop()
        res = pub.result()
    finally:
        if p is not None and p.is_alive():
            p.kill()
        pub.kill()
    return {"ok": res["stats"].get("subscribers_joined") == n_max, "rss_0": base, "rss_1": one,
            f"rss_{n_max}": many, "subscribers": n_max,
            "bytes_per_subscriber": (many - one) / (n_max - 1), "first_subscriber_bytes": one - base,
            "pub_stats": res["stats"]}


def per_queued_message(n: int) -> dict:
    kind, rpm = "tuples", 100
    size = len(payloads.encoded(kind, rpm, variants=1)[0])
    pub = PublisherProcess({"pattern": "backlog", "messages": n, "messages_per_epoch": 100, "kind": kind,
                            "per_message": rpm, "sndhwm": 10, "coalesce_bytes": 0,
                            "max_queue_messages": n + 1000, "max_queue_bytes": 4 << 30})
    p = None
    try:
        p, q, proceed = _subs(pub.endpoint, pub.topic, (1,), rcvhwm=10)
        _wait(q, "1")
        before = _settled_rss(pub.pid)
        pub.start()
        kind_, sent, _ = pub.get(120)
        after = _settled_rss(pub.pid, limit=10)
        kernel = kernel_queued_bytes(pub.endpoint)
        proceed.set()
        p.kill()
        pub.stop()
        res = pub.result()
    finally:
        if p is not None and p.is_alive():
            p.kill()
        pub.kill()
    delta = after - before
    return {"ok": kind_ == "sent" and not res["stats"].get("subscribers_evicted"), "messages": n,
            "payload_bytes": size, "rss_before": before, "rss_after": after,
            "bytes_per_message": delta / n, "overhead_bytes_per_message": delta / n - size,
            "ratio_to_payload": delta / n / size, "kernel_queued_bytes": kernel,
            # messages in the kernel's socket queues are in no RSS: per message held in process
            "bytes_per_message_in_process": (delta / (n - kernel / size)) if kernel is not None else None,
            "pub_stats": res["stats"]}


def run(quick: bool = False, log=print) -> dict:
    t0 = time.monotonic()
    reps = 2 if quick else paired.repeats(False)  # 5 in full: the rules' paired repeats
    n = 10_000 if quick else 40_000
    n = max(2000, int(n * min(1.0, paired.scale())))
    subs, queued = [], []
    for rep in range(reps):  # interleaved: one of each per repeat
        r = per_subscriber()
        r["repeat"] = rep
        subs.append(r)
        log(f"  memory #{rep}: {r['bytes_per_subscriber'] / 1024:.1f} KiB per subscriber "
            f"(first one {r['first_subscriber_bytes'] / 1024:.0f} KiB)")
        r = per_queued_message(n)
        r["repeat"] = rep
        queued.append(r)
        log(f"  memory #{rep}: {r['bytes_per_message']:.0f} B per queued {r['payload_bytes']} B message "
            f"({r['ratio_to_payload']:.2f}×), {n} queued")
    ok_s = [r for r in subs if r["ok"]]
    ok_q = [r for r in queued if r["ok"]]
    return {"quick": quick, "repeats": reps, "queued_messages": n, "per_subscriber": subs, "per_queued": queued,
            "summary": {"bytes_per_subscriber": paired.summary([r["bytes_per_subscriber"] for r in ok_s]),
                        "first_subscriber_bytes": paired.summary([r["first_subscriber_bytes"] for r in ok_s]),
                        "bytes_per_queued_message": paired.summary([r["bytes_per_message"] for r in ok_q]),
                        "ratio_to_payload": paired.summary([r["ratio_to_payload"] for r in ok_q]),
                        "bytes_per_message_in_process": paired.summary(
                            [r["bytes_per_message_in_process"] for r in ok_q if r["bytes_per_message_in_process"]]),
                        "kernel_queued_bytes": paired.summary(
                            [r["kernel_queued_bytes"] for r in ok_q if r["kernel_queued_bytes"] is not None]),
                        "payload_bytes": queued[0]["payload_bytes"] if queued else None},
            "ok": len(ok_s) == len(subs) and len(ok_q) == len(queued),
            "wall_s": round(time.monotonic() - t0, 1)}
