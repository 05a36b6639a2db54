"""A publisher in its own process (``multiprocessing`` spawn) with a scripted send pattern, for
the ``latejoin``, ``latency``, ``memory`` and ``scale`` cases. Public API only: ``Publisher``
(``send_encoded``, ``advance_to``, ``progress``, ``flush``, ``close``, ``stats``) and, in the
callers, ``Subscriber`` (``wait_ready``, ``epochs``, ``events``, ``stats``).

Patterns (``cfg["pattern"]``):

- ``steady`` — epochs of ``messages_per_epoch`` payloads at ``rate`` epochs/s until ``stop`` is
  set (late join);
- ``paced`` — ``epochs`` epochs at ``rate`` epochs/s, open loop (a late epoch is sent at once,
  the schedule is not shifted); ``time.time()`` just before the last send of epoch ``e`` goes
  to ``t_send[e]`` (latency under load);
- ``idle`` — nothing but heartbeats until ``stop`` (memory per subscriber);
- ``backlog`` — after ``go``, ``messages`` payloads in epochs of ``messages_per_epoch``, then
  idle until ``stop`` (memory per queued message);
- ``antichain`` — ``product(2)`` order, ``width`` incomparable capabilities held at once:
  each step sends ``messages_per_step`` payloads round-robin over the ``width`` times, then one
  ``progress`` call downgrades every capability by (1, 1); time-based (``duration``) or
  ``steps``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback

from . import payloads


def antichain_times(width: int, step: int) -> list[tuple]:
    """``width`` mutually incomparable product(2) times; step k+1's times are all beyond, and
    none ``<=``, any of step k's, so every step completes all of step k's epochs."""
    return [(2 * i + step, 2 * (width - 1 - i) + step) for i in range(width)]


def _pub_main(cfg, q, go, stop, t_send):
    try:
        _pub(cfg, q, go, stop, t_send)
    except BaseException as exc:
        q.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _pub(cfg, q, go, stop, t_send):
    import gc

    from epochstream import Publisher
    kind, rpm = cfg.get("kind", "tuples"), cfg.get("per_message", 100)
    bodies = payloads.encoded(kind, rpm)
    nb = len(bodies)
    pattern = cfg["pattern"]
    kw = dict(codec=payloads.codec_name(kind), sndhwm=cfg.get("sndhwm", 100_000),
              max_queue_messages=cfg.get("max_queue_messages", 10_000_000),
              max_queue_bytes=cfg.get("max_queue_bytes", 8 << 30), heartbeat_interval=1.0)
    if cfg.get("coalesce_bytes") is not None:
        kw["coalesce_bytes"] = cfg["coalesce_bytes"]
    if pattern == "antichain":
        kw["order"] = "product(2)"
    pub = Publisher(cfg["topic"], 0, **kw)
    q.put(("endpoint", pub.endpoint, os.getpid()))
    if not go.wait(120):
        raise TimeoutError("never started")
    send, advance = pub.send_encoded, pub.advance_to
    mpe = cfg.get("messages_per_epoch", 1)
    sent = msgs = 0
    cpu0 = time.process_time()
    gc0 = [g["collections"] for g in gc.get_stats()]
    t0 = time.time()
    extra = {}
    if pattern in ("steady", "paced"):
        rate = float(cfg["rate"])
        n_epochs = cfg.get("epochs") or 1 << 62
        late = 0
        e = 0
        while e < n_epochs:
            if pattern == "steady" and stop.is_set():
                break
            due = t0 + e / rate
            now = time.time()
            if now < due:
                time.sleep(due - now)
            elif now - due > 1.0 / rate:
                late += 1
            for j in range(mpe):
                if j == mpe - 1 and t_send is not None:
                    t_send[e] = time.time()
                send(e, bodies[msgs % nb])
                msgs += 1
            sent += mpe * rpm
            advance(e + 1)
            e += 1
        extra = {"epochs": e, "late_epochs": late, "rate": rate,
                 "achieved_epochs_per_s": e / max(1e-9, time.time() - t0)}
    elif pattern == "idle":
        stop.wait(600)
    elif pattern == "backlog":
        n = cfg["messages"]
        for i in range(n):
            # a distinct bytes object per message, as an application's payloads are (the
            # backlog holds references: one shared object would be counted once)
            send(i // mpe, bytes(bytearray(bodies[i % nb])))
            if i % mpe == mpe - 1:
                advance(i // mpe + 1)
        sent, msgs = n * rpm, n
        q.put(("sent", n, None))
        stop.wait(600)
    elif pattern == "antichain":
        w, per_step = cfg["width"], cfg["messages_per_step"]
        times = antichain_times(w, 0)
        pub.progress([(t, +1) for t in times] + [((0, 0), -1)])
        deadline = time.time() + cfg["duration"] if cfg.get("duration") else None
        steps = cfg.get("steps") or 1 << 62
        k = 0
        while k < steps:
            for j in range(per_step):
                send(times[j % w], bodies[msgs % nb])
                msgs += 1
            sent += per_step * rpm
            nxt = antichain_times(w, k + 1)
            pub.progress([(t, +1) for t in nxt] + [(t, -1) for t in times])
            times = nxt
            k += 1
            if deadline is not None and time.time() >= deadline:
                break
        extra = {"steps": k, "epochs": k * w}
    pub.flush(60)
    cpu = time.process_time() - cpu0
    stats = dict(pub.stats)
    pub.close(linger=30)
    q.put(("published", {"records": sent, "messages": msgs, "cpu_s": cpu, "stats": stats,
                         "gc": [g["collections"] - c for g, c in zip(gc.get_stats(), gc0)], **extra}))


_ids = iter(range(1, 1 << 30))


class PublisherProcess:
    """Start with ``PublisherProcess(cfg)``; ``endpoint``/``pid`` once it is bound; ``start()``
    releases it; ``result()`` waits for its report; ``stop()`` ends idle/steady/backlog patterns."""

    def __init__(self, cfg: dict, t_send_len: int = 0, timeout: float = 60.0):
        ctx = mp.get_context("spawn")
        self.cfg = dict(cfg)
        self.cfg.setdefault("topic", f"bench-{os.getpid()}-{next(_ids)}")
        self.topic = self.cfg["topic"]
        self.q = ctx.Queue()
        self.go = ctx.Event()
        self.stop_evt = ctx.Event()
        self.t_send = ctx.RawArray("d", t_send_len) if t_send_len else None
        self.proc = ctx.Process(target=_pub_main, daemon=True,
                                args=(self.cfg, self.q, self.go, self.stop_evt, self.t_send))
        self.proc.start()
        kind, self.endpoint, self.pid = self.get(timeout)
        if kind != "endpoint":
            raise RuntimeError(f"publisher: unexpected {kind}")

    def get(self, timeout: float):
        msg = self.q.get(timeout=timeout)
        if msg[0] == "error":
            raise RuntimeError(f"publisher process: {msg[1]}")
        return msg

    def start(self) -> None:
        self.go.set()

    def stop(self) -> None:
        self.stop_evt.set()

    def result(self, timeout: float = 120.0) -> dict:
        while True:
            msg = self.get(timeout)
            if msg[0] == "published":
                return msg[1]

    def kill(self) -> None:
        self.go.set()
        self.stop_evt.set()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)


def percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[i]
