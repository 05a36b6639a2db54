"""Case ``limits``: physical ceilings of this machine, measured by the harness itself.

- ``memcpy`` — bytes/s of copying a 64 MiB buffer (numpy ``copyto`` and ``bytearray`` slice
  assignment), one core;
- ``zmq`` — libzmq's own throughput through pyzmq with nothing else in the loop, a C-free
  equivalent of libzmq's ``local_thr``/``remote_thr``: a sender process pushes messages of one
  size over PUSH/PULL on tcp://127.0.0.1 for a fixed time, the receiver (this process) counts
  them from the first to the last (``recv(copy=False)`` from 4 KiB on). Framings: 1 frame; 2
  frames (a 2-byte header + the body); 3 frames ``[kind, time, payload]`` = epochstream's data
  framing (the DEALER side of its ROUTER), at the exact payload sizes the other cases send;
- ``decode`` — a decode-only loop over pre-encoded payloads with epochstream's own codecs
  (``wire.codec(...).decode``, what the subscriber runs), counting records, in one process on
  one core: msgpack dicts and tuples and Arrow IPC at 1, 100 and 1000 records per message.

Every measurement is time-based; the rounds are interleaved (every measurement once per round)
and reported as median with min–max over the rounds. The report divides epochstream's
throughput from the ``e2e``/``peers``/``fanout`` results of the same run by these ceilings.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from . import paired, payloads

HEADER = b"\x92\x00"  # a 2-byte header frame (about the size of a msgpack time)


def plan(quick: bool):
    if quick:
        return {"rounds": 3, "memcpy_s": 0.15, "zmq_s": 0.25, "decode_s": 0.1,
                "one_frame": (16, 4096, 65536), "two_frame": (16, 4096, 65536),
                "payloads": (("dicts", 1), ("tuples", 1000), ("arrow", 1000)),
                "decode": [(k, r) for k in ("dicts", "tuples", "arrow") for r in (1, 100, 1000)]}
    return {"rounds": 5, "memcpy_s": 0.5, "zmq_s": 0.5, "decode_s": 0.3,
            "one_frame": (16, 256, 4096, 65536), "two_frame": (16, 256, 4096, 65536),
            "payloads": tuple((k, r) for k in ("dicts", "tuples", "arrow") for r in (1, 100, 1000)),
            "decode": [(k, r) for k in ("dicts", "tuples", "arrow") for r in (1, 100, 1000)]}


# ---------------------------------------------------------------------------------------------
def memcpy(kind: str, seconds: float, size: int = 64 << 20) -> dict:
    if kind == "numpy":
        import numpy as np
        src = np.ones(size, dtype=np.uint8)
        dst = np.empty_like(src)

        def op():
            np.copyto(dst, src)
    else:
        src = bytearray(b"\x01") * size
        dst = bytearray(size)

        def op():
            dst[:] = src
    op()  # fault the pages in
    n, t0 = 0, time.perf_counter()
    while True:
        op()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and n >= 2:
            break
    return {"what": f"memcpy/{kind}", "bytes": size, "copies": n, "seconds": dt, "bytes_per_s": n * size / dt}


def decode_loop(kind: str, per_message: int, seconds: float) -> dict:
    from epochstream import wire
    bodies = payloads.encoded(kind, per_message)
    decode = wire.codec(payloads.codec_name(kind)).decode
    arrow = kind == "arrow"
    nb = len(bodies)
    n = msgs = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(64):
            d = decode(bodies[msgs % nb])
            n += d.num_rows if arrow else len(d)
            msgs += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            break
    return {"what": "decode", "payload": kind, "records_per_message": per_message,
            "payload_bytes": len(bodies[0]), "records_per_s": n / dt, "messages_per_s": msgs / dt,
            "seconds": dt}


# ---------------------------------------------------------------------------------------------
def _sender(conn):
    """Child: a PUSH socket; for each command (endpoint, size, frames, seconds) send for that long,
    then an empty 1-frame end marker."""
    import zmq
    ctx = zmq.Context()
    socks = {}
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        endpoint, size, frames, seconds = cmd
        s = socks.get(endpoint)
        if s is None:
            s = socks[endpoint] = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 5000)
            s.connect(endpoint)
        body = b"x" * size
        msg = [body] if frames == 1 else [HEADER, body] if frames == 2 else [b"D\x01", HEADER, body]
        big = size >= 65536
        n = 0
        deadline = time.perf_counter() + seconds
        if frames == 1:
            send = s.send
            while True:
                for _ in range(256):
                    send(body, copy=not big)
                n += 256
                if time.perf_counter() >= deadline:
                    break
        else:
            send = s.send_multipart
            while True:
                for _ in range(256):
                    send(msg, copy=not big)
                n += 256
                if time.perf_counter() >= deadline:
                    break
        s.send(b"")
        conn.send(n)
    for s in socks.values():
        s.close()
    ctx.term()


class ZmqThroughput:
    """A PULL socket here and a PUSH sender process (spawned once)."""

    def __init__(self):
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVTIMEO, 30_000)
        self.pull.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_sender, args=(child,), daemon=True)
        self.proc.start()

    def measure(self, size: int, frames: int, seconds: float) -> dict:
        self.conn.send((self.endpoint, size, frames, seconds))
        copy = size < 4096
        n = 0
        t_first = t_last = None
        cpu0 = time.process_time()
        pull = self.pull
        if frames == 1:
            recv = pull.recv
            while True:
                m = recv(copy=copy)
                now = time.perf_counter()
                if len(m) == 0 if copy else len(m.buffer) == 0:
                    break
                if t_first is None:
                    t_first = now
                t_last = now
                n += 1
        else:
            recv = pull.recv_multipart
            while True:
                m = recv(copy=copy)
                now = time.perf_counter()
                if len(m) == 1:
                    break
                if t_first is None:
                    t_first = now
                t_last = now
                n += 1
        cpu = time.process_time() - cpu0
        sent = self.conn.recv()
        ok = sent == n
        dt = (t_last - t_first) if n > 1 else None
        rate = (n - 1) / dt if dt else None
        return {"what": "zmq", "frames": frames, "bytes": size, "messages": n, "sent": sent, "ok": ok,
                "seconds": dt, "messages_per_s": rate, "bytes_per_s": rate * size if rate else None,
                "recv_copy": copy, "receiver_cpu_s": cpu}

    def close(self):
        try:
            self.conn.send(None)
            self.proc.join(10)
        finally:
            if self.proc.is_alive():
                self.proc.kill()
            self.pull.close(0)
            self.ctx.term()


# ---------------------------------------------------------------------------------------------
def _summ(rows, key):
    return paired.summary([r[key] for r in rows if r.get(key) is not None and r.get("ok", True)])


def run(quick: bool = False, log=print) -> dict:
    p = plan(quick)
    sc = paired.scale()
    rounds = paired.repeats(quick) if "BENCH_REPEATS" in os.environ else p["rounds"]
    t0 = time.monotonic()
    sizes = {(k, r): len(payloads.encoded(k, r, variants=1)[0]) for k, r in p["payloads"]}
    zspecs = ([(s, 1, None) for s in p["one_frame"]] + [(s, 2, None) for s in p["two_frame"]]
              + [(sizes[kr], 3, kr) for kr in p["payloads"]])
    rows = []
    zt = ZmqThroughput()
    try:
        for rnd in range(rounds):
            for kind in ("numpy", "bytearray"):
                r = memcpy(kind, p["memcpy_s"] * sc)
                r["round"] = rnd
                rows.append(r)
            for size, frames, kr in zspecs:
                r = zt.measure(size, frames, p["zmq_s"] * sc)
                r["round"] = rnd
                if kr:
                    r["payload"], r["records_per_message"] = kr
                rows.append(r)
            for kind, rpm in p["decode"]:
                r = decode_loop(kind, rpm, p["decode_s"] * sc)
                r["round"] = rnd
                rows.append(r)
            log(f"  limits round {rnd}: done ({time.monotonic() - t0:.1f} s)")
    finally:
        zt.close()
    summary = {"memcpy": [], "zmq": [], "decode": []}
    for kind in ("numpy", "bytearray"):
        sel = [r for r in rows if r["what"] == f"memcpy/{kind}"]
        summary["memcpy"].append({"how": kind, "bytes": sel[0]["bytes"], "bytes_per_s": _summ(sel, "bytes_per_s")})
    for size, frames, kr in zspecs:
        sel = [r for r in rows if r["what"] == "zmq" and r["bytes"] == size and r["frames"] == frames]
        e = {"frames": frames, "bytes": size, "ok_runs": sum(1 for r in sel if r["ok"]), "runs": len(sel),
             "messages_per_s": _summ(sel, "messages_per_s"), "bytes_per_s": _summ(sel, "bytes_per_s"),
             "recv_copy": sel[0]["recv_copy"]}
        if kr:
            e["payload"], e["records_per_message"] = kr
        summary["zmq"].append(e)
        log(f"  zmq {frames} frame(s) {size:6d} B: {e['messages_per_s'] and e['messages_per_s']['median'] / 1e3:.1f}k msg/s")
    for kind, rpm in p["decode"]:
        sel = [r for r in rows if r["what"] == "decode" and r["payload"] == kind and r["records_per_message"] == rpm]
        summary["decode"].append({"payload": kind, "records_per_message": rpm, "payload_bytes": sel[0]["payload_bytes"],
                                  "records_per_s": _summ(sel, "records_per_s"),
                                  "messages_per_s": _summ(sel, "messages_per_s")})
        log(f"  decode {kind:6s} R={rpm:4d}: {summary['decode'][-1]['records_per_s']['median'] / 1e6:.2f}M rec/s")
    return {"quick": quick, "repeats": rounds, "plan": {k: v for k, v in p.items() if k != "decode"},
            "scale": sc, "rows": rows, "summary": summary,
            "ok": all(r.get("ok", True) for r in rows), "wall_s": round(time.monotonic() - t0, 1)}
