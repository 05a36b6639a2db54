"""A publisher or a reader of a topic whose epoch log goes to an object store, in its own
process (tests/store/test_store.py).

    python tests/store/store_peer.py publish CATALOG TOPIC STORE [options]
        Publisher(TOPIC, 0, catalog=CATALOG, retention=Retention(dir=--dir, store=STORE,
        segment_bytes=--segment-bytes, max_epochs=--max-epochs; ``--keep-all``: no max_bytes
        nor max_age)). Prints "ready <log directory>", then publishes epochs
        --first .. --last - 1, each --msgs records {"t", "i", "pad"} then advance_to(t + 1),
        printing "epoch <t>" (``--pause``: after "ready", first wait for a line on stdin).
        ``--upload frontier``: Retention(upload="frontier"); ``--first -1``: from the epoch the
        log resumes at (a successor); ``--crash-at POINT --crash-after N``: SIGKILL itself at the
        N-th frontier tail upload (1-based), at POINT: ``upload`` (mid-upload: half the bytes
        written), ``uploaded`` (uploaded, not indexed), ``indexed`` (the chain indexed, the
        epochs not committed), ``committed`` (committed, the frontier update not sent).
        ``--stop-at POINT --stop-after N``: the same moments (``uploaded``, ``indexed``,
        ``committed``), but SIGSTOP itself there, printing "stopping <POINT>" first (a zombie:
        the test SIGCONTs it). ``--lease S``: Catalog(CATALOG, lease=S) (PostgreSQL's lease).
        ``--hold-at K``: after "epoch K", print "holding" and wait for a line on stdin.
        A publisher refused on the way prints "fenced <message>" (Fenced) and exits 3, or
        "error <type> <message>" and exits 4.
        ``--flush-each``: flush() after each epoch. ``--wait-uploads``: then waits until the index has an object for
        every sealed segment holding epochs and prints "uploaded <n objects>". ``--end hang``
        (default): prints "hanging" and sleeps (to be killed); ``close``: close(wait=True),
        prints "closed".
    python tests/store/store_peer.py read CATALOG TOPIC [--source S] [--store URI] [--subscribe]
        [--durable NAME]
        History(TOPIC, catalog=CATALOG, store=URI).epochs() (``--subscribe``: Subscriber(start=0)
        instead; ``--durable``: a durable Subscriber from "earliest", acking each epoch), printing "epoch <t> <json [i...]> <ok>" per epoch (ok: every record is of
        epoch t, with its pad whole) and "done"; HistoryCorrupt prints "HistoryCorrupt <message>"
        and exits 3, HistoryUnavailable "HistoryUnavailable <message>" and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.errors import HistoryCorrupt, HistoryUnavailable


def out(*words) -> None:
    print(*words, flush=True)


def crash_at(cat, point: str, after: int, sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or ``sig``: SIGSTOP) this process at ``point`` of the ``after``-th tail upload
    (module docstring): a real kill -9 (or stop) of a real process, injected at an exact
    moment; the store is real."""
    import pyarrow.fs as pafs

    from epochstream.log.store import LogStore

    count = [0]
    upload, uploaded, commit = LogStore.upload, type(cat).history_uploaded, \
        type(cat).history_commit

    def die():
        if sig == signal.SIGSTOP:
            out("stopping", point)
            count[0] = -1 << 30  # (once: it goes on when continued)
        os.kill(os.getpid(), sig)

    def upload_(self, path, nbytes, name, start=0):
        if name.endswith(".estail"):
            count[0] += 1
            if count[0] == after and point == "upload":
                out_ = self.fs.open_output_stream(self.path(name))
                with open(path, "rb") as f:
                    f.seek(start)
                    out_.write(f.read(max(1, nbytes // 2)))
                assert isinstance(self.fs, pafs.FileSystem)
                die()
        upload(self, path, nbytes, name, start)
        if count[0] == after and point == "uploaded" and name.endswith(".estail"):
            die()

    def uploaded_(self, topic, partition, segment, name, *rest):
        r = uploaded(self, topic, partition, segment, name, *rest)
        if count[0] == after and point == "indexed" and name.startswith("tails:"):
            die()
        return r

    def commit_(self, *args, **kw):
        r = commit(self, *args, **kw)
        if count[0] == after and point == "committed":
            die()
        return r

    LogStore.upload = upload_
    type(cat).history_uploaded = uploaded_
    type(cat).history_commit = commit_


def publish(a) -> None:
    from epochstream.errors import Fenced

    try:
        _publish(a)
    except Fenced as e:
        out("fenced", " ".join(str(e).split()))
        sys.exit(3)
    except Exception as e:  # noqa: BLE001 - reported to the test
        out("error", type(e).__name__, " ".join(str(e).split()))
        sys.exit(4)


def _publish(a) -> None:
    cat = Catalog(a.catalog) if a.lease is None else Catalog(a.catalog, lease=a.lease)
    limits = {"max_epochs": a.max_epochs}
    if a.keep_all:
        limits.update(max_bytes=None, max_age=None)
    if a.crash_at:
        crash_at(cat, a.crash_at, a.crash_after)
    if a.stop_at:
        crash_at(cat, a.stop_at, a.stop_after, signal.SIGSTOP)
    pub = Publisher(a.topic, 0, catalog=cat, retention=Retention(
        dir=a.dir, store=a.store, segment_bytes=a.segment_bytes, upload=a.upload, **limits))
    state = cat.history_state(a.topic, 0)
    out("ready", state.dir)
    if a.pause:
        sys.stdin.readline()
    first = a.first if a.first >= 0 else (state.lower[0] if state.lower else a.last)
    out("first", first)
    for t in range(first, a.last):
        pub.send(t, [{"t": t, "i": i, "pad": "x" * a.pad} for i in range(a.msgs)])
        pub.advance_to(t + 1)
        if a.flush_each:  # (one commit, so one frontier upload, per epoch)
            pub.flush()
        out("epoch", t)
        if t == a.hold_at:
            out("holding")
            sys.stdin.readline()
    pub.flush()
    if a.wait_uploads:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = cat.history_state(a.topic, 0)
            sealed = [g for g in state.segments if g.seq < state.segment and g.epochs]
            if all(g.object_bytes == g.nbytes for g in sealed):
                out("uploaded", len(sealed))
                break
            time.sleep(0.05)
    if a.end == "close":
        pub.close(wait=True)
        out("closed")
        return
    out("hanging")
    time.sleep(3600)


def read(a) -> None:
    try:
        if a.durable:
            epochs = []
            with Subscriber(a.topic, catalog=a.catalog, durable=a.durable,
                            start="earliest") as sub:
                for e in sub.epochs():
                    epochs.append(e)
                    sub.ack(e)
        elif a.subscribe:
            with Subscriber(a.topic, catalog=a.catalog, start=0) as sub:
                epochs = list(sub.epochs())
        else:
            epochs = list(History(a.topic, catalog=a.catalog, source=a.source,
                                  store=a.store).epochs())
    except HistoryCorrupt as e:
        out("HistoryCorrupt", str(e))
        sys.exit(3)
    except HistoryUnavailable as e:
        out("HistoryUnavailable", str(e))
        sys.exit(2)
    for e in epochs:
        ok = all(r["t"] == e.time and r["pad"] == "x" * len(r["pad"]) for r in e.records)
        out("epoch", e.time, json.dumps([r["i"] for r in e.records], separators=(",", ":")), ok)
    out("done")


def main() -> None:
    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("epochstream.history").setLevel(logging.INFO)  # (retention's lines)
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("publish")
    pp.add_argument("catalog")
    pp.add_argument("topic")
    pp.add_argument("store")
    pp.add_argument("--dir", default=None)
    pp.add_argument("--first", type=int, default=0)
    pp.add_argument("--last", type=int, default=10)
    pp.add_argument("--msgs", type=int, default=3)
    pp.add_argument("--pad", type=int, default=2000)
    pp.add_argument("--segment-bytes", type=int, default=4096)
    pp.add_argument("--wait-uploads", action="store_true")
    pp.add_argument("--pause", action="store_true")
    pp.add_argument("--end", choices=("hang", "close"), default="hang")
    pp.add_argument("--max-epochs", type=int, default=None)
    pp.add_argument("--keep-all", action="store_true", help="no max_bytes, no max_age")
    pp.add_argument("--upload", choices=("sealed", "frontier"), default="sealed")
    pp.add_argument("--crash-at", choices=("upload", "uploaded", "indexed", "committed"),
                    default=None)
    pp.add_argument("--crash-after", type=int, default=1)
    pp.add_argument("--stop-at", choices=("uploaded", "indexed", "committed"), default=None)
    pp.add_argument("--stop-after", type=int, default=1)
    pp.add_argument("--lease", type=float, default=None)
    pp.add_argument("--hold-at", type=int, default=None)
    pp.add_argument("--flush-each", action="store_true")
    pr = sub.add_parser("read")
    pr.add_argument("catalog")
    pr.add_argument("topic")
    pr.add_argument("--source", default=None)
    pr.add_argument("--store", default=None)
    pr.add_argument("--subscribe", action="store_true")
    pr.add_argument("--durable", default=None)
    a = p.parse_args()
    publish(a) if a.cmd == "publish" else read(a)


if __name__ == "__main__":
    main()
