"""Multi-process end-to-end harness shared by the ``e2e`` and ``peers`` cases.

One run = one publisher process per partition and ``subscribers`` subscriber processes (all
``multiprocessing`` *spawn*), over 127.0.0.1. Systems:

- ``epochstream`` — :class:`~epochstream.Publisher` ``send_encoded`` + ``advance_to(e + 1)`` per
  epoch; :class:`~epochstream.Subscriber` with the ``epochs`` or ``events`` API;
- ``zmq`` — raw pyzmq PUB/SUB in epochstream's data-message layout version 2 (since issue 28;
  before, version 1's three frames): one frame ``b"D\\x02" + arity 0 + flags 0 + int64 time +
  payload`` (``send``/``recv_multipart`` copying, as pyzmq recommends for small messages), or for
  payloads of :data:`_SPLIT` bytes or more a header frame and the payload sent and received
  without copying (pyzmq's advice for big ones) — what epochstream sends; an end-of-epoch
  marker ``[b"F\\x01", msgpack time]`` per partition, no protocol;
- ``redis`` — Redis pub/sub (redis-py + hiredis, pipelined publish; the subscriber reads with
  ``pubsub.listen()``), one binary message per batch: ``kind (1 byte) + time (8 bytes LE) +
  payload``;
- ``nats`` — NATS core (nats-py, asyncio, async subscription callback), the same single-blob
  framing.

All systems send the very same pre-encoded payload bytes, and the subscriber decodes every
delivered payload with epochstream's codec and counts its records.

Bounded: time-based (``duration``: the parent picks, under a lock, the epoch every publisher
stops at once the duration has passed) or a fixed number of epochs, and a wall-clock limit after
which every process is killed and the run reported as failed. Measured per run: records/s, CPU
seconds per million records of publishers, subscribers and (``broker_pid``) the Redis/NATS
server, wire messages per record, and ``gc.get_stats()`` collection deltas in every process. Flow control: the publisher never gets more than
``window`` records ahead of the slowest subscriber (a shared counter), so no system needs
unbounded buffers and none drops data for being outrun — which keeps the comparison about
throughput, not about buffer sizes. A run in which any subscriber counts fewer (or more)
records than were sent is reported as failed (``ok: false``), never as a number.

Two modes: ``throughput`` (publish as fast as the window allows) and ``latency`` (one epoch at a
time: the publisher waits until every subscriber has its epoch before it sends the next;
latency = the subscriber's epoch release − the moment the publisher started sending the epoch's
last batch, taking the latest partition).
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing as mp
import os
import queue as _queue
import struct
import time
import traceback

from . import payloads

SYSTEMS = ("epochstream", "zmq", "redis", "nats")

_F = b"F\x01"
_E = b"E\x01"
_P = b"P\x01"
_BLOB = struct.Struct("<q")  # time in the single-blob framing
_ZHEAD = struct.Struct("<2sBBq")  # the raw pyzmq peer's data header (epochstream's v2 layout)
_SPLIT = 16384  # payloads of this many bytes or more: header frame + payload frame, no copy


def wait_report(q, procs, timeout: float, want: str | None):
    """The next ``(kind, value)`` report from the benchmark processes' queue ``q`` (of kind
    ``want``; ``None``: any kind). Raises ``RuntimeError`` for an ``("error", text)`` report or
    a process of ``procs`` that died, ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kind, value = q.get(timeout=1.0)
        except _queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError("a benchmark process died") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {want or 'report'} within {timeout} s") from None
            continue
        if kind == "error":
            raise RuntimeError(value)
        if want is None or kind == want:
            return kind, value


def reap(procs) -> None:
    """Join the benchmark processes ``procs`` (10 s each), killing those still alive."""
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()


def messages_per_epoch(per_message: int) -> int:
    return {1: 100, 100: 10}.get(per_message, 4)


_default_mpe = messages_per_epoch  # run() has a parameter of that name


def gc_counts() -> list[int]:
    """Collections so far per generation (``gc.get_stats()``)."""
    return [g["collections"] for g in gc.get_stats()]


def gc_delta(before: list[int]) -> list[int]:
    return [a - b for a, b in zip(gc_counts(), before)]


class _Stop:
    """Time-based runs: every publisher stops at the same epoch boundary.

    ``ctl[p]`` is the next epoch of publisher ``p``; ``ctl[-1]`` the epoch count to stop at (0 =
    not yet decided). The parent decides once the run's duration has passed: ``max(ctl[:P]) + 1``,
    under the array's lock, so no publisher can already be past it."""

    def __init__(self, ctl, partition: int, partitions: int, timed: bool):
        self.ctl, self.partition, self.partitions, self.timed = ctl, partition, partitions, timed
        self.lock = ctl.get_lock()

    def after_epoch(self, e: int) -> bool:
        """Called after epoch ``e`` was sent in full; True = stop now (``e + 1`` epochs sent)."""
        if not self.timed:
            return False
        with self.lock:
            self.ctl[self.partition] = e + 1
            stop = self.ctl[self.partitions]
        return bool(stop) and e + 1 >= stop


# =============================================================================================
# publisher side

class _Flow:
    """Window flow control against the slowest subscriber (shared counters)."""

    def __init__(self, consumed, partitions: int, window: int):
        self.consumed = consumed
        self.partitions = partitions
        self.window = window

    def wait(self, sent_here: int) -> None:
        limit = sent_here * self.partitions - self.window
        consumed = self.consumed
        while min(consumed) < limit:
            time.sleep(0.0002)


def _epoch_done_wait(epochs_done, e: int, deadline: float) -> None:
    while min(epochs_done) <= e:
        if time.monotonic() > deadline:
            raise TimeoutError(f"epoch {e} not released by every subscriber in time")
        time.sleep(0.00005)


def _publisher_main(system, cfg, partition, q, start, consumed, epochs_done, t_last_send, ctl):
    try:
        runner = {"epochstream": _pub_epochstream, "zmq": _pub_zmq, "redis": _pub_redis,
                  "nats": _pub_nats}[system]
        runner(cfg, partition, q, start, consumed, epochs_done, t_last_send,
               _Stop(ctl, partition, cfg["partitions"], bool(cfg["duration"])))
    except BaseException as exc:  # report, never hang the parent
        q.put(("error", f"publisher {partition}", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _schedule(cfg, partition):
    """Yield (epoch, message index within this partition's share, is_last_of_epoch)."""
    per_part = cfg["messages_per_epoch"] // cfg["partitions"]
    for e in (itertools.count() if cfg["duration"] else range(cfg["epochs"])):
        for j in range(per_part):
            yield e, j, j == per_part - 1


def _pub_epochstream(cfg, partition, q, start, consumed, epochs_done, t_last_send, stopper):
    from epochstream.transport import Publisher
    bodies = payloads.encoded(cfg["kind"], cfg["per_message"])
    nb = len(bodies)
    pub = Publisher(cfg["topic"], partition, partitions=cfg["partitions"],
                    codec=payloads.codec_name(cfg["kind"]), sndhwm=100_000,
                    max_queue_messages=10_000_000, max_queue_bytes=8 << 30, queue_hwm=10_000,
                    heartbeat_interval=1.0,
                    **({} if cfg["coalesce_bytes"] is None else {"coalesce_bytes": cfg["coalesce_bytes"]}))
    q.put(("endpoint", partition, pub.endpoint))
    scraper = _Scraper(pub) if cfg.get("metrics") else None
    start.wait(60)
    per_message = cfg["per_message"]
    latency = cfg["mode"] == "latency"
    flow = _Flow(consumed, cfg["partitions"], cfg["window"])
    check_every = cfg["check_every"]
    deadline = time.monotonic() + cfg["time_limit"]
    send, advance = pub.send_encoded, pub.advance_to
    sent = 0
    gc0 = gc_counts()
    cpu0 = time.process_time()
    n_epochs = cfg["epochs"]
    for e, j, last in _schedule(cfg, partition):
        if not latency and j % check_every == 0:
            flow.wait(sent)
        if last and latency:
            t_last_send[partition * n_epochs + e] = time.monotonic()
        send(e, bodies[j % nb])
        sent += per_message
        if last:
            advance(e + 1)
            if latency:
                _epoch_done_wait(epochs_done, e, deadline)
            if stopper.after_epoch(e):
                break
    pub.flush(30)
    cpu = time.process_time() - cpu0
    scrapes, scrape_cpu = (0, 0.0) if scraper is None else scraper.stop()
    pub.close(linger=30)
    q.put(("published", partition, {"records": sent, "cpu_s": cpu, "gc": gc_delta(gc0),
                                    "stats": dict(pub.stats), "scrapes": scrapes,
                                    "scrape_cpu_s": scrape_cpu}))


class _Scraper:
    """The metrics of issue 24 in a publisher's process: a ``PublisherCollector`` of ``pub`` and
    a ``CatalogCollector`` of a catalog of its own (one topic), scraped every second by a
    thread, as a Prometheus server would (``stop()`` returns the number of scrapes and the CPU
    seconds the scraping thread spent: part of the publisher process's CPU time)."""

    def __init__(self, pub):
        import tempfile
        import threading

        from prometheus_client import CollectorRegistry, generate_latest

        from epochstream import Catalog
        from epochstream.metrics import CatalogCollector, PublisherCollector

        cat = Catalog(tempfile.mkdtemp(prefix="es-bench-metrics-") + "/cat")
        cat.create_topic(pub.topic, partitions=pub.partitions)
        self.registry = CollectorRegistry()
        self.registry.register(PublisherCollector(pub))
        self.registry.register(CatalogCollector(cat))
        self._generate = generate_latest
        self._stop = threading.Event()
        self.scrapes, self.cpu_s = 0, 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(1.0):
            t0 = time.thread_time()
            self._generate(self.registry)
            self.cpu_s += time.thread_time() - t0
            self.scrapes += 1

    def stop(self) -> tuple[int, float]:
        self._stop.set()
        self._thread.join(10)
        return self.scrapes, self.cpu_s


def _pub_zmq(cfg, partition, q, start, consumed, epochs_done, t_last_send, stopper):
    import msgpack
    import zmq
    bodies = payloads.encoded(cfg["kind"], cfg["per_message"])
    nb = len(bodies)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 1_000_000)
    sock.setsockopt(zmq.LINGER, 30_000)
    sock.bind("tcp://127.0.0.1:*")
    q.put(("endpoint", partition, sock.getsockopt_string(zmq.LAST_ENDPOINT)))
    while not start.wait(0.01):  # probes until every subscriber has seen one (slow joiners)
        sock.send_multipart([_P, b"\x00"])
    packb = msgpack.Packer(use_bin_type=True).pack
    per_message = cfg["per_message"]
    latency = cfg["mode"] == "latency"
    flow = _Flow(consumed, cfg["partitions"], cfg["window"])
    check_every = cfg["check_every"]
    deadline = time.monotonic() + cfg["time_limit"]
    send, send1 = sock.send_multipart, sock.send
    n_epochs = cfg["epochs"]
    sent = 0
    gc0 = gc_counts()
    cpu0 = time.process_time()
    header = None
    for e, j, last in _schedule(cfg, partition):
        if not latency and j % check_every == 0:
            flow.wait(sent)
        if j == 0:
            header, head2 = packb(e), _ZHEAD.pack(b"D\x02", 0, 0, e)
        if last and latency:
            t_last_send[partition * n_epochs + e] = time.monotonic()
        body = bodies[j % nb]
        if len(body) < _SPLIT:
            send1(head2 + body)
        else:
            send([head2, body], copy=False)
        sent += per_message
        if last:
            send([_F, header])
            if latency:
                _epoch_done_wait(epochs_done, e, deadline)
            if stopper.after_epoch(e):
                break
    send([_E, b"\x00"])
    cpu = time.process_time() - cpu0
    sock.close(30_000)
    ctx.term()
    q.put(("published", partition, {"records": sent, "cpu_s": cpu, "gc": gc_delta(gc0)}))


def _blob_messages(cfg, partition):
    """(epoch, blob, last) in the single-blob framing, blobs built per epoch on the fly."""
    bodies = payloads.encoded(cfg["kind"], cfg["per_message"])
    nb = len(bodies)
    pack = _BLOB.pack
    for e, j, last in _schedule(cfg, partition):
        yield e, b"D" + pack(e) + bodies[j % nb], last


def _pub_redis(cfg, partition, q, start, consumed, epochs_done, t_last_send, stopper):
    import redis
    r = redis.Redis(host="127.0.0.1", port=cfg["redis_port"])
    channel = cfg["topic"]
    q.put(("endpoint", partition, f"redis://127.0.0.1:{cfg['redis_port']}/{channel}"))
    while not start.wait(0.01):
        r.publish(channel, b"P")
    per_message = cfg["per_message"]
    latency = cfg["mode"] == "latency"
    flow = _Flow(consumed, cfg["partitions"], cfg["window"])
    check_every = cfg["check_every"]
    deadline = time.monotonic() + cfg["time_limit"]
    n_epochs = cfg["epochs"]
    pipe = r.pipeline(transaction=False)
    batch = cfg.get("redis_pipeline", 64)
    pending = 0
    sent = 0
    pack = _BLOB.pack
    msgs = list(_blob_messages(cfg, partition)) if cfg["prebuild"] else _blob_messages(cfg, partition)
    gc0 = gc_counts()
    cpu0 = time.process_time()
    j = 0
    for e, blob, last in msgs:
        if not latency and j % check_every == 0:
            flow.wait(sent)
        j += 1
        if last and latency:
            t_last_send[partition * n_epochs + e] = time.monotonic()
        pipe.publish(channel, blob)
        pending += 1
        sent += per_message
        if last:
            pipe.publish(channel, b"F" + pack(e))
            pending += 1
        if pending >= batch or last:
            pipe.execute()
            pending = 0
        if last and latency:
            _epoch_done_wait(epochs_done, e, deadline)
        if last and stopper.after_epoch(e):
            break
    pipe.publish(channel, b"E")
    pipe.execute()
    cpu = time.process_time() - cpu0
    r.close()
    q.put(("published", partition, {"records": sent, "cpu_s": cpu, "gc": gc_delta(gc0)}))


def _pub_nats(cfg, partition, q, start, consumed, epochs_done, t_last_send, stopper):
    import asyncio

    import nats

    async def main():
        nc = await nats.connect(f"nats://127.0.0.1:{cfg['nats_port']}", max_reconnect_attempts=0,
                                pending_size=64 << 20, flush_timeout=60)
        subject = cfg["topic"]
        q.put(("endpoint", partition, f"nats://127.0.0.1:{cfg['nats_port']}/{subject}"))
        while not start.is_set():
            await nc.publish(subject, b"P")
            await nc.flush()
            await asyncio.sleep(0.01)
        per_message = cfg["per_message"]
        latency = cfg["mode"] == "latency"
        check_every = cfg["check_every"]
        deadline = time.monotonic() + cfg["time_limit"]
        n_epochs = cfg["epochs"]
        window = cfg["window"]
        parts = cfg["partitions"]
        pack = _BLOB.pack
        sent = 0
        msgs = list(_blob_messages(cfg, partition)) if cfg["prebuild"] else _blob_messages(cfg, partition)
        gc0 = gc_counts()
        cpu0 = time.process_time()
        j = 0
        publish = nc.publish
        for e, blob, last in msgs:
            if not latency and j % check_every == 0:
                limit = sent * parts - window
                while min(consumed) < limit:
                    # asyncio.sleep(0.0002) really sleeps >= 1 ms (epoll's resolution): let the
                    # loop's flusher run, then block briefly
                    await asyncio.sleep(0)
                    time.sleep(0.0001)
            j += 1
            if last and latency:
                t_last_send[partition * n_epochs + e] = time.monotonic()
            await publish(subject, blob)
            sent += per_message
            if last:
                await publish(subject, b"F" + pack(e))
                if latency:
                    await nc.flush()
                    while min(epochs_done) <= e:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"epoch {e} not released in time")
                        await asyncio.sleep(0)
                        time.sleep(0.00005)
            if last and stopper.after_epoch(e):
                break
        await publish(subject, b"E")
        await nc.flush(timeout=60)
        cpu = time.process_time() - cpu0
        gcd = gc_delta(gc0)
        await nc.drain()
        return sent, cpu, gcd

    sent, cpu, gcd = asyncio.run(main())
    q.put(("published", partition, {"records": sent, "cpu_s": cpu, "gc": gcd}))


# =============================================================================================
# subscriber side

class _Tally:
    """What a subscriber measures."""

    def __init__(self, idx, consumed, epochs_done, n_epochs):
        self.idx = idx
        self.consumed = consumed
        self.epochs_done = epochs_done
        self.records = 0
        self.messages = 0
        self.epochs = 0
        self.t_first = None
        self.t_last = None
        self.release = {}  # epoch -> monotonic time of its release
        self.cpu0 = None
        self.gc0 = None

    def begin(self):
        self.gc0 = gc_counts()
        self.cpu0 = time.process_time()

    def result(self, extra=None) -> dict:
        cpu = time.process_time() - (self.cpu0 or 0.0)
        out = {"records": self.records, "messages": self.messages, "epochs": self.epochs,
               "t_first": self.t_first, "t_last": self.t_last, "release": self.release,
               "cpu_s": cpu, "gc": gc_delta(self.gc0 or [0, 0, 0])}
        if extra:
            out.update(extra)
        return out


def _subscriber_main(system, cfg, idx, endpoints, q, consumed, epochs_done):
    try:
        runner = {"epochstream": _sub_epochstream, "zmq": _sub_zmq, "redis": _sub_redis,
                  "nats": _sub_nats}[system]
        runner(cfg, idx, endpoints, q, consumed, epochs_done)
    except BaseException as exc:
        q.put(("error", f"subscriber {idx}", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _sub_epochstream(cfg, idx, endpoints, q, consumed, epochs_done):
    from epochstream.protocol import DataMessage
    from epochstream.transport import Subscriber
    kind = cfg["kind"]
    arrow = kind == "arrow"
    sub = Subscriber(cfg["topic"], endpoints=endpoints, codec=payloads.codec_name(kind),
                     rcvhwm=1_000_000, timeout=cfg["time_limit"])
    if not sub.wait_ready(30):
        raise TimeoutError("subscriber not ready after 30 s")
    tally = _Tally(idx, consumed, epochs_done, cfg["epochs"])
    q.put(("ready", idx, None))
    tally.begin()
    mono = time.monotonic
    n = 0
    if cfg["api"] == "epochs":
        release = tally.release
        for ep in sub.epochs(timeout=cfg["time_limit"]):
            if not hasattr(ep, "records"):  # a Gap (only with recover=True): not expected here
                continue
            now = mono()
            if tally.t_first is None:
                tally.t_first = now
            n += ep.records.num_rows if arrow else len(ep.records)
            consumed[idx] = n
            release[ep.time] = now
            tally.messages += ep.messages
            tally.epochs += 1
            epochs_done[idx] = ep.time + 1
        tally.t_last = mono()
    else:
        msgs = 0
        for item in sub.events(timeout=cfg["time_limit"]):
            if type(item) is tuple:  # older transport yields (event, nbytes)
                item = item[0]
            if type(item) is DataMessage:
                if tally.t_first is None:
                    tally.t_first = mono()
                d = item.data
                n += d.num_rows if arrow else len(d)
                msgs += 1
                consumed[idx] = n
            else:  # merged frontier change: epochs below the new frontier are complete
                now = mono()
                for t, delta in item.updates:
                    if delta > 0 and t > 0:
                        tally.release[t - 1] = now
                        tally.epochs += 1
                        epochs_done[idx] = t
        tally.t_last = mono()
        tally.messages = msgs
    tally.records = n
    sub.close()
    q.put(("done", idx, tally.result({"stats": dict(sub.stats)})))


def _sub_zmq(cfg, idx, endpoints, q, consumed, epochs_done):
    import msgpack
    import zmq
    from epochstream import wire
    codec = wire.codec(payloads.codec_name(cfg["kind"]))
    decode = codec.decode
    arrow = cfg["kind"] == "arrow"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 1_000_000)
    sock.setsockopt(zmq.RCVTIMEO, int(cfg["time_limit"] * 1000))
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    for ep in endpoints:
        sock.connect(ep)
    parts = len(endpoints)
    seen = set()
    while len(seen) < parts:  # wait for a probe from every publisher
        frames = sock.recv_multipart()
        if frames[0] == _P:
            seen.add(frames[1])
            break
    tally = _Tally(idx, consumed, epochs_done, cfg["epochs"])
    q.put(("ready", idx, None))
    tally.begin()
    unpack = msgpack.unpackb
    mono = time.monotonic
    marks = {}
    release = tally.release
    n = msgs = ends = 0
    big = max(len(b) for b in payloads.encoded(cfg["kind"], cfg["per_message"])) >= _SPLIT
    recv = sock.recv_multipart
    head = _ZHEAD.unpack_from
    size = _ZHEAD.size
    while ends < parts:
        frames = recv(copy=not big)
        k = frames[0] if not big else frames[0].bytes
        if k[:2] == b"D\x02":
            if msgs == 0:
                tally.t_first = mono()
            head(k)
            d = decode(k[size:] if len(frames) == 1 else frames[1].buffer)
            n += d.num_rows if arrow else len(d)
            msgs += 1
            consumed[idx] = n
        elif k == _F:
            e = unpack(frames[1].bytes if big else frames[1])
            marks[e] = m = marks.get(e, 0) + 1
            if m == parts:
                release[e] = mono()
                tally.epochs += 1
                epochs_done[idx] = e + 1
        elif k == _E:
            ends += 1
    tally.t_last = mono()
    tally.records, tally.messages = n, msgs
    sock.close(0)
    ctx.term()
    q.put(("done", idx, tally.result()))


class _BlobSink:
    """Shared receive logic for single-blob systems (Redis, NATS)."""

    def __init__(self, cfg, idx, consumed, epochs_done, parts):
        from epochstream import wire
        self.decode = wire.codec(payloads.codec_name(cfg["kind"])).decode
        self.arrow = cfg["kind"] == "arrow"
        self.tally = _Tally(idx, consumed, epochs_done, cfg["epochs"])
        self.marks = {}
        self.parts = parts
        self.idx = idx
        self.n = self.msgs = self.ends = 0
        self.probed = False

    def feed(self, data) -> bool:
        """Handle one blob; True once every publisher has ended."""
        k = data[0]
        if k == 68:  # b"D"
            if self.msgs == 0:
                self.tally.t_first = time.monotonic()
            _BLOB.unpack_from(data, 1)
            d = self.decode(memoryview(data)[9:])
            self.n += d.num_rows if self.arrow else len(d)
            self.msgs += 1
            self.tally.consumed[self.idx] = self.n
        elif k == 70:  # b"F"
            e = _BLOB.unpack_from(data, 1)[0]
            self.marks[e] = m = self.marks.get(e, 0) + 1
            if m == self.parts:
                self.tally.release[e] = time.monotonic()
                self.tally.epochs += 1
                self.tally.epochs_done[self.idx] = e + 1
        elif k == 69:  # b"E"
            self.ends += 1
            if self.ends == self.parts:
                self.tally.t_last = time.monotonic()
                return True
        elif k == 80:  # b"P"
            self.probed = True
        return False

    def result(self):
        self.tally.records, self.tally.messages = self.n, self.msgs
        return self.tally.result()


def _sub_redis(cfg, idx, endpoints, q, consumed, epochs_done):
    import redis
    r = redis.Redis(host="127.0.0.1", port=cfg["redis_port"])
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(cfg["topic"])
    sink = _BlobSink(cfg, idx, consumed, epochs_done, len(endpoints))
    deadline = time.monotonic() + 30
    while not sink.probed:
        m = ps.get_message(timeout=0.1)
        if m is not None:
            sink.feed(m["data"])
        if time.monotonic() > deadline:
            raise TimeoutError("no probe from the publisher in 30 s")
    q.put(("ready", idx, None))
    sink.tally.begin()
    # ``listen()``: blocking reads, as redis-py documents for a consumer loop (no per-call
    # ``get_message(timeout)`` polling); the parent kills us if the publisher never ends
    feed = sink.feed
    for m in ps.listen():
        if m["type"] == "message" and feed(m["data"]):
            break
    ps.close()
    r.close()
    q.put(("done", idx, sink.result()))


def _sub_nats(cfg, idx, endpoints, q, consumed, epochs_done):
    import asyncio

    import nats

    sink = _BlobSink(cfg, idx, consumed, epochs_done, len(endpoints))

    async def main():
        nc = await nats.connect(f"nats://127.0.0.1:{cfg['nats_port']}", max_reconnect_attempts=0)
        done = asyncio.Event()
        probed = asyncio.Event()

        async def cb(msg):
            if sink.feed(msg.data):
                done.set()
            elif sink.probed and not probed.is_set():
                probed.set()

        await nc.subscribe(cfg["topic"], cb=cb, pending_msgs_limit=10_000_000,
                           pending_bytes_limit=4 << 30)
        await nc.flush()
        await asyncio.wait_for(probed.wait(), 30)
        q.put(("ready", idx, None))
        sink.tally.begin()
        await asyncio.wait_for(done.wait(), cfg["time_limit"])
        await nc.close()

    asyncio.run(main())
    q.put(("done", idx, sink.result()))


# =============================================================================================
# orchestration

def _percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def _broker_cpu(proc):
    if proc is None:
        return None
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except Exception:
        return None


_WINDOW_MULT = 4
_topic_ids = iter(range(1, 1 << 30))


def run(system: str, *, kind: str, per_message: int, subscribers: int = 1, partitions: int = 1,
        api: str = "events", mode: str = "throughput", records: int | None = None,
        epochs: int | None = None, duration: float | None = None, time_limit: float = 60.0,
        redis_port: int | None = None, nats_port: int | None = None,
        coalesce_bytes: int | None = None, broker_pid: int | None = None,
        messages_per_epoch: int | None = None, metrics: bool = False) -> dict:
    """One bounded run; returns a result row (``ok`` false on loss, error or timeout).

    Size: ``duration`` seconds (time-based: the publishers stop together at the first epoch
    boundary after it; throughput mode only), else ``epochs``, else ``records``.
    ``coalesce_bytes``: passed to epochstream's ``Publisher`` (0 = coalescing off; None = its
    default). ``broker_pid``: a server process (Redis, NATS) whose CPU time is recorded.
    ``messages_per_epoch``: messages per epoch over all partitions (default: 100 at 1 record per
    message, 10 at 100, else 4); rounded to a multiple of ``partitions``. ``metrics``
    (epochstream): each publisher process registers a ``PublisherCollector`` of its publisher
    and a ``CatalogCollector`` of a catalog of its own (holding the topic) in a registry that a
    thread of that process scrapes (``generate_latest``) every second."""
    mpe = _default_mpe(per_message) if messages_per_epoch is None else int(messages_per_epoch)
    if mpe % partitions:
        mpe = partitions * max(1, mpe // partitions)
    if duration is not None and mode != "throughput":
        raise ValueError("duration applies to throughput runs; latency runs take epochs")
    if duration is not None:
        epochs = 0
    elif epochs is None:
        epochs = max(2, -(-int(records) // (mpe * per_message)))
    # window: several epochs and ~1000 messages' worth of records, at most ~32 MB of payload
    msg_bytes = len(payloads.encoded(kind, per_message, variants=1)[0])
    window = max(4 * mpe * per_message, 256 * per_message * _WINDOW_MULT)
    window = max(min(window, (32 << 20) // msg_bytes * per_message), 2 * mpe * per_message)
    cfg = {"kind": kind, "per_message": per_message, "partitions": partitions, "api": api,
           "mode": mode, "epochs": epochs, "messages_per_epoch": mpe, "window": window,
           "check_every": 16 if per_message == 1 else 1, "time_limit": time_limit,
           "topic": f"bench-{os.getpid()}-{next(_topic_ids)}", "redis_port": redis_port,
           "nats_port": nats_port, "prebuild": not duration and per_message > 1 and epochs * mpe <= 20_000,
           "duration": duration, "coalesce_bytes": coalesce_bytes, "metrics": bool(metrics)}
    expected = epochs * mpe * per_message
    row = {"system": system, "api": api if system == "epochstream" else "raw", "payload": kind,
           "codec": payloads.codec_name(kind), "records_per_message": per_message,
           "subscribers": subscribers, "partitions": partitions, "mode": mode, "epochs": epochs,
           "messages_per_epoch": mpe, "messages": epochs * mpe, "expected_records": expected,
           "window_records": window, "payload_bytes": msg_bytes, "duration_s": duration,
           "coalesce_bytes": coalesce_bytes if system == "epochstream" else None,
           "loadavg_before": round(os.getloadavg()[0], 2)}
    if system == "redis":
        try:
            from redis.utils import HIREDIS_AVAILABLE
            row["hiredis"] = bool(HIREDIS_AVAILABLE)
        except Exception:
            row["hiredis"] = None
    broker = None
    if broker_pid is not None and system in ("redis", "nats"):
        try:
            import psutil
            broker = psutil.Process(broker_pid)
        except Exception:
            broker = None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = ctx.Event()
    consumed = ctx.RawArray("q", subscribers)
    epochs_done = ctx.RawArray("q", subscribers)
    t_last_send = ctx.RawArray("d", max(1, partitions * epochs))
    ctl = ctx.Array("q", partitions + 1)  # time-based stop (see _Stop)
    procs = []
    errors = []
    deadline = time.monotonic() + time_limit + 60
    try:
        for p in range(partitions):
            pr = ctx.Process(target=_publisher_main, daemon=True,
                             args=(system, cfg, p, q, start, consumed, epochs_done, t_last_send, ctl))
            pr.start()
            procs.append(pr)
        endpoints = [None] * partitions
        got = 0
        while got < partitions:
            kind_, who, value = q.get(timeout=60)
            if kind_ == "error":
                raise RuntimeError(f"{who}: {value}")
            endpoints[who] = value
            got += 1
        for i in range(subscribers):
            pr = ctx.Process(target=_subscriber_main, daemon=True,
                             args=(system, cfg, i, endpoints, q, consumed, epochs_done))
            pr.start()
            procs.append(pr)
        ready = 0
        while ready < subscribers:
            kind_, who, value = q.get(timeout=60)
            if kind_ == "error":
                raise RuntimeError(f"{who}: {value}")
            ready += 1
        b_cpu0 = _broker_cpu(broker)
        t_start = time.monotonic()
        start.set()
        subs: dict[int, dict] = {}
        pubs: dict[int, dict] = {}
        stop_at = None if not duration else t_start + duration
        while len(subs) < subscribers or len(pubs) < partitions:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise TimeoutError(f"run did not finish within {time_limit} s")
            if stop_at is not None and now >= stop_at:
                with ctl.get_lock():
                    ctl[partitions] = max(ctl[:partitions]) + 1
                stop_at = None
            wait = min(left, 1.0) if stop_at is None else max(0.001, min(left, stop_at - now))
            try:
                kind_, who, value = q.get(timeout=wait)
            except _queue.Empty:
                dead = [pr for pr in procs if not pr.is_alive() and pr.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"a benchmark process died (exit code {dead[0].exitcode})")
                continue
            if kind_ == "error":
                errors.append(f"{who}: {value}")
                raise RuntimeError(errors[-1])
            if kind_ == "done":
                subs[who] = value
            elif kind_ == "published":
                pubs[who] = value
        b_cpu1 = _broker_cpu(broker)
    except Exception as exc:
        row.update(ok=False, error=str(exc).strip().splitlines()[0][:500], detail=str(exc)[-3000:])
        return row
    finally:
        for pr in procs:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.kill()
                pr.join(2)
    if duration:
        expected = sum(pubs[p]["records"] for p in range(partitions))
        epochs = expected // (mpe * per_message)
        row.update(expected_records=expected, epochs=epochs, messages=epochs * mpe)
    received = [subs[i]["records"] for i in range(subscribers)]
    ok = all(r == expected for r in received)
    row["received_records"] = received
    row["ok"] = ok
    if not ok:
        row["error"] = f"record count mismatch: expected {expected} per subscriber, got {received}"
        return row
    ends = [subs[i]["t_last"] for i in range(subscribers)]
    durations = [e - t_start for e in ends]
    rates = [expected / d for d in durations]
    row["seconds"] = round(max(durations), 4)
    row["loadavg_after"] = round(os.getloadavg()[0], 2)
    row["scrapes"] = sum(pubs[p].get("scrapes", 0) for p in range(partitions))
    row["scrape_cpu_s"] = round(sum(pubs[p].get("scrape_cpu_s", 0.0) for p in range(partitions)), 4)
    row["records_per_s"] = min(rates)          # per subscriber (the slowest one)
    row["records_per_s_total"] = sum(rates)    # delivered to all subscribers together
    row["messages_per_s"] = min(rates) / per_message
    row["sub_cpu_s"] = [round(subs[i]["cpu_s"], 3) for i in range(subscribers)]
    row["pub_cpu_s"] = [round(pubs[p]["cpu_s"], 3) for p in range(partitions)]
    mrec = expected / 1e6
    # CPU seconds per million records: publishers together (per record sent), each subscriber
    # (per record it received), the broker (per record published)
    row["pub_cpu_s_per_M"] = sum(pubs[p]["cpu_s"] for p in range(partitions)) / mrec
    row["sub_cpu_s_per_M"] = [subs[i]["cpu_s"] / mrec for i in range(subscribers)]
    if broker is not None and b_cpu0 is not None and b_cpu1 is not None:
        row["broker_cpu_s"] = round(b_cpu1 - b_cpu0, 3)
        row["broker_cpu_s_per_M"] = (b_cpu1 - b_cpu0) / mrec
    # data messages that crossed the wire per record (at subscriber 0; epochstream coalesces)
    row["wire_messages_per_record"] = subs[0]["messages"] / expected
    row["sub_gc"] = [subs[i].get("gc") for i in range(subscribers)]
    row["pub_gc"] = [pubs[p].get("gc") for p in range(partitions)]
    if system == "epochstream":
        row["pub_stats"] = [pubs[p].get("stats") for p in range(partitions)]
    if mode == "latency":
        lat = []
        for i in range(subscribers):
            rel = subs[i]["release"]
            for e in range(epochs):
                t0 = max(t_last_send[p * epochs + e] for p in range(partitions))
                if rel.get(e) and t0:
                    lat.append(rel[e] - t0)
        lat.sort()
        row["latency_samples"] = len(lat)
        row["latency_p50_ms"] = None if not lat else _percentile(lat, 50) * 1e3
        row["latency_p99_ms"] = None if not lat else _percentile(lat, 99) * 1e3
        row["latency_max_ms"] = None if not lat else lat[-1] * 1e3
    return row
