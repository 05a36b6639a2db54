"""A publisher with retention, or a durable subscriber, in its own process: fault tests of durable
history (kill -9, RLIMIT_FSIZE, read-only directories, two holders of a durable name).

    python tests/history/history_peer.py publish CATALOG TOPIC [options]
        Publisher(TOPIC, 0, catalog=CATALOG, retention=Retention(...)) (WARNING log lines go to
        stderr). Prints "ready <incarnation> <lower json> <upper json>", then publishes epochs
        FIRST..LAST-1 (``--resume``: FIRST is the logged lower frontier the publisher resumed
        at), each ``--msgs`` messages of ``records(t, m, --recs, --pad)`` then advance_to(t + 1),
        printing "epoch <t>" after each (``--pad-from K --pad2 P``: epochs from K on use pad P). ``--pause-at K``: before epoch K print "paused K" and
        wait for a line on stdin. ``--fsize-at K``: before epoch K set RLIMIT_FSIZE to the
        current segment size + ``--fsize-slack`` bytes (SIGXFSZ ignored, so write() fails with
        EFBIG).
        ``--open-msgs N``: then send N messages of epoch LAST (never completed), print
        "sent N" and hang. Otherwise ``--end close`` (default: close, print "closed"; with
        ``--pause-end`` first print "paused end" and wait for a stdin line) or ``hang``. A HistoryWriteError prints "HistoryWriteError <call> <t>" and the process
        exits (code 3; the interpreter waits until the publisher delivered its abort).
        Remote history (tests/history/test_remote_history.py): ``--partition P --partitions N``
        (each record then ends with P if ``--tag-partition``); ``--order product(2)``: step t
        sends at the times (t, 0) .. (t, K-1) (``--inner K``, default 2) the messages above, of
        ``records([t, j], ...)``, then advance_to((t + 1, 0)); ``--no-retention``;
        ``--interval S`` / ``--msg-interval S``: sleep after each epoch / each message;
        ``--heartbeat S`` (default 0.2), ``--sndhwm N``, ``--max-queue-messages N``;
        ``--stats``: while paused, a stdin line "stats" prints "stats <json>" (pub.stats and
        the history server's high-water marks: reads outstanding in all and per connection,
        replies waiting, requests queued) and waits on; "stats <json>" is printed before
        "closed" too.
    python tests/history/history_peer.py durable CATALOG TOPIC NAME [options]
        Subscriber(TOPIC, CATALOG, durable=NAME, start=--start, takeover=--takeover); prints
        "held <position json>" (or "SubscriptionHeld" / "SubscriptionExpired" and exits 2),
        then for every epoch "got <t> <n records> <digest of the records>", then acks it if
        ``--ack`` lists it ("acked <t>"); ``--stop-at T``: after printing "got T" (before any
        ack) it prints "stopped T" and hangs until killed. ``--interactive``: after each
        "got", wait for a stdin line: "ack" acks it ("acked <t>", or "fenced" if the ack raised
        SubscriptionHeld), anything else skips. Prints "done <position json>" at the end.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import time
import zlib

from epochstream import Catalog, Publisher, Retention, Subscriber
from epochstream.log import segment_path
from epochstream.errors import HistoryWriteError, SubscriptionExpired, SubscriptionHeld


def records(t: int, m: int, recs: int, pad: int = 0, part: int | None = None) -> list:
    """The records of message ``m`` of epoch ``t`` (tests rebuild them to compare); ``part``:
    a partition tag appended to each record (``--tag-partition``)."""
    s = "x" * pad
    if part is not None:
        return [[t, m, i, s, part] for i in range(recs)]
    return [[t, m, i, s] for i in range(recs)]


def epoch_records(t: int, msgs: int, recs: int, pad: int = 0, part: int | None = None) -> list:
    """Every record of epoch ``t``, in the order sent."""
    return [r for m in range(msgs) for r in records(t, m, recs, pad, part)]


def peer_times(order: str, t: int, inner: int = 2) -> list:
    """The times the publisher sends at in step ``t`` of its loop (``--order``, ``--inner``)."""
    return [t] if order == "total" else [(t, j) for j in range(inner)]


class _Watch:
    """``--stats``: samples the publisher's history server every millisecond and keeps the
    high-water marks of its queues (reads outstanding over all connections and for one
    connection, replies waiting, requests queued)."""

    def __init__(self, pub):
        import threading
        self.pub, self.high = pub, {"outstanding": 0, "per_peer": 0, "replies": 0, "queued": 0}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            logs = getattr(getattr(self.pub, "_loop", None), "_logs", None)
            server = getattr(logs, "history", None)
            if server is not None:
                out = dict(server._outstanding)
                now = {"outstanding": sum(out.values()), "per_peer": max(out.values(), default=0),
                       "replies": len(server._replies), "queued": server._requests.qsize()}
                for k, v in now.items():
                    self.high[k] = max(self.high[k], v)
            time.sleep(0.001)

    def line(self) -> str:
        stats = {k: v for k, v in self.pub.stats.items() if isinstance(v, int)}
        return "stats " + json.dumps({**stats, "high": self.high})


def _wait_line(watch) -> None:
    """Wait for a stdin line; with ``--stats`` a "stats" line is answered and waited past."""
    while True:
        line = sys.stdin.readline()
        if watch is not None and line.strip() == "stats":
            print(watch.line(), flush=True)
            continue
        return


def digest(recs) -> int:
    """A checksum of an epoch's records (lists, as decoded by msgpack), order-sensitive."""
    return zlib.crc32(json.dumps([list(r) for r in recs]).encode())


def _hang():
    while True:
        time.sleep(1)


def publish(a) -> None:
    cat = Catalog(a.catalog)
    ret = None if a.no_retention else Retention(
        dir=a.dir, segment_bytes=a.segment_bytes, max_epochs=a.max_epochs, max_bytes=None,
        max_age=None)
    # coalesce_bytes=0: every send is one message and one log record (the faults test flips
    # bits in a chosen record of an epoch)
    extra = {k: v for k, v in (("sndhwm", a.sndhwm), ("max_queue_messages", a.max_queue_messages))
             if v is not None}
    pub = Publisher(a.topic, a.partition, catalog=cat, retention=ret,
                    heartbeat_interval=a.heartbeat, coalesce_bytes=0, order=a.order,
                    partitions=a.partitions, **extra)
    watch = _Watch(pub) if a.stats else None
    part = a.partition if a.tag_partition else None
    print("ready", pub.incarnation, json.dumps(list(pub.lower)), json.dumps(list(pub.upper)),
          flush=True)
    first = pub.lower[0] if a.resume else a.first
    if isinstance(first, (list, tuple)):  # a product order resumed: its first component
        first = first[0]
    t = first
    call = "send"
    try:
        for t in range(first, a.last):
            if t in a.pause_at:
                print("paused", t, flush=True)
                _wait_line(watch)
            if t == a.fsize_at:
                st = cat.history_state(a.topic, 0)  # after an advance: all of it on disk
                limit = os.path.getsize(segment_path(st.dir, st.segment)) + a.fsize_slack
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
                print("limited", limit, flush=True)
            call = "send"
            pad = a.pad if a.pad_from is None or t < a.pad_from else a.pad2
            for time_ in peer_times(a.order, t, a.inner):
                label = list(time_) if isinstance(time_, tuple) else time_
                for m in range(a.msgs):
                    pub.send(time_, records(label, m, a.recs, pad, part))
                    if a.msg_interval:
                        time.sleep(a.msg_interval)
            call = "advance_to"
            pub.advance_to(t + 1 if a.order == "total" else (t + 1, 0))
            pub.flush()
            print("epoch", t, flush=True)
            if a.interval:
                time.sleep(a.interval)
        if a.open_msgs:
            t = a.last
            call = "send"
            for m in range(a.open_msgs):
                pub.send(t, records(t, m, a.recs, a.pad))
            pub.flush()
            print("sent", a.open_msgs, flush=True)
            _hang()
        if a.end == "hang":
            print("hanging", flush=True)
            _hang()
        if a.pause_end:
            print("paused end", flush=True)
            _wait_line(watch)
        if watch is not None:
            print(watch.line(), flush=True)
        call = "close"
        pub.close(linger=5, wait=True)
        print("closed", flush=True)
    except HistoryWriteError as e:
        print("HistoryWriteError", call, t, flush=True)
        print(f"HistoryWriteError: {e}", file=sys.stderr, flush=True)
        sys.exit(3)  # the interpreter waits for the abort to be delivered (non-daemon closer)


def durable(a) -> None:
    start = a.start if a.start in ("earliest", "latest") else int(a.start)
    try:
        sub = Subscriber(a.topic, Catalog(a.catalog), durable=a.name, start=start,
                         takeover=a.takeover, timeout=10)
    except SubscriptionHeld:
        print("SubscriptionHeld", flush=True)
        sys.exit(2)
    except SubscriptionExpired:
        print("SubscriptionExpired", flush=True)
        sys.exit(2)
    print("held", json.dumps(sub.position), flush=True)
    for e in sub.epochs(timeout=20):
        print("got", e.time, len(e.records), digest(e.records), flush=True)
        if e.time == a.stop_at:
            print("stopped", e.time, flush=True)
            _hang()
        if a.interactive:
            if sys.stdin.readline().strip() == "ack":
                try:
                    sub.ack(e)
                except SubscriptionHeld:
                    print("fenced", e.time, flush=True)
                    continue
                print("acked", e.time, flush=True)
        elif e.time in a.ack:
            sub.ack(e)
            print("acked", e.time, flush=True)
    print("done", json.dumps(sub.position), flush=True)
    sub.close()


def main(argv) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s %(message)s")
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="cmd", required=True)
    pp = sp.add_parser("publish")
    pp.add_argument("catalog")
    pp.add_argument("topic")
    pp.add_argument("--dir", default=None)
    pp.add_argument("--first", type=int, default=0)
    pp.add_argument("--last", type=int, default=5)
    pp.add_argument("--resume", action="store_true")
    pp.add_argument("--msgs", type=int, default=2)
    pp.add_argument("--recs", type=int, default=3)
    pp.add_argument("--pad", type=int, default=0)
    pp.add_argument("--pad2", type=int, default=0)
    pp.add_argument("--pad-from", type=int, default=None)
    pp.add_argument("--segment-bytes", type=int, default=64 << 20)
    pp.add_argument("--max-epochs", type=int, default=None)
    pp.add_argument("--pause-at", type=int, action="append", default=[])
    pp.add_argument("--fsize-at", type=int, default=None)
    pp.add_argument("--fsize-slack", type=int, default=64)
    pp.add_argument("--open-msgs", type=int, default=0)
    pp.add_argument("--pause-end", action="store_true")
    pp.add_argument("--end", choices=("close", "hang"), default="close")
    pp.add_argument("--partition", type=int, default=0)
    pp.add_argument("--partitions", type=int, default=1)
    pp.add_argument("--tag-partition", action="store_true")
    pp.add_argument("--order", default="total")
    pp.add_argument("--inner", type=int, default=2)
    pp.add_argument("--no-retention", action="store_true")
    pp.add_argument("--interval", type=float, default=0.0)
    pp.add_argument("--msg-interval", type=float, default=0.0)
    pp.add_argument("--heartbeat", type=float, default=0.2)
    pp.add_argument("--sndhwm", type=int, default=None)
    pp.add_argument("--max-queue-messages", type=int, default=None)
    pp.add_argument("--stats", action="store_true")
    dp = sp.add_parser("durable")
    dp.add_argument("catalog")
    dp.add_argument("topic")
    dp.add_argument("name")
    dp.add_argument("--start", default="earliest")
    dp.add_argument("--takeover", action="store_true")
    dp.add_argument("--ack", type=lambda s: {int(x) for x in s.split(",") if x}, default=set())
    dp.add_argument("--stop-at", type=int, default=None)
    dp.add_argument("--interactive", action="store_true")
    a = p.parse_args(argv)
    {"publish": publish, "durable": durable}[a.cmd](a)


if __name__ == "__main__":
    # a print writes each part on its own under PYTHONUNBUFFERED=1 (CI sets it): a peer
    # killed between two parts left a cut line (a CI failure); buffered, a line is one write
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    main(sys.argv[1:])
