"""The S3 server itself killed -9 in the middle of a PUT of the epoch log, then restarted on the
same data directory and port (SeaweedFS ``weed mini``, :class:`store_fixtures.WeedS3`), in both
upload modes. The PUT is provably in flight when the kill lands: the server is stopped first
(SIGSTOP) while the publisher uploads objects larger than the socket buffers, and the kill waits
until a connection to its S3 port holds request bytes it has not taken (/proc/net/tcp).

The publisher opens the store by its URI (the S3 client's own retries may ride out the outage)
or as a FileSystem with one attempt per request and short timeouts (the epoch log's own retry
loop must: readers are then given the store's URI, ``History(store=)``).

Promise: the publisher waits and retries (``"frontier"``: no epoch announced meanwhile;
``"sealed"``: the live stream goes on), nothing the index names is ever a partial object, and
once the server is back every epoch is read whole, once, in order, from the store by a reader in
another process — while the publisher runs, and with its log directory gone after it closed."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from epochstream import Catalog, Publisher, Retention
from epochstream.log.store import is_tails, object_bytes, open_store, tail_pieces
from store_fixtures import WeedS3
from test_store import read_in_process, wait_until, whole
from test_store_frontier import live_subscriber

PAD = 300_000  # bytes of each of an epoch's 3 records: ~900 KB a PUT, more than a stopped
#                server's socket takes (the rest waits in the publisher's send queue)
EPOCHS = 10


def requests_in_flight(port: int) -> list[tuple[int, int]]:
    """``(client's unsent or unacknowledged bytes, server's unread bytes)`` of each established
    TCP connection to 127.0.0.1:``port`` that has request bytes the server has not taken."""
    conns: dict = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        (lhost, lport), (rhost, rport) = (x.split(":") for x in f[1:3])
        tx, rx = (int(x, 16) for x in f[4].split(":"))
        if f[3] != "01":  # ESTABLISHED
            continue
        if int(rport, 16) == port:  # the client's end
            conns.setdefault(int(lport, 16), [0, 0])[0] = tx
        elif int(lport, 16) == port:  # the server's end
            conns.setdefault(int(rport, 16), [0, 0])[1] = rx
    return [tuple(c) for c in conns.values() if c[0] or c[1]]


def indexed_objects_whole(cat, topic, store: str) -> list[str]:
    """The objects the index names (whole objects and every piece of a chain) that are not in
    the store with exactly the bytes their names say: ``[]`` when all are whole."""
    listed = {name: size for name, _, size in open_store(store, write=False)
              .segment_objects(topic, 0)}
    bad = []
    for g in cat.history_state(topic, 0).segments:
        if not g.object:
            continue
        if is_tails(g.object):
            pieces = [(name, end - start) for start, end, name in tail_pieces(g.object)]
        else:
            pieces = [(g.object, object_bytes(g.object))]
        bad += [f"{name}: {listed.get(name)} bytes, not {n}" for name, n in pieces
                if listed.get(name) != n]
    return bad


@pytest.mark.heavy  # (~40 s for the four: the S3 server stopped, killed -9 and restarted)
@pytest.mark.parametrize("client", ["uri", "one-attempt"])
@pytest.mark.parametrize("mode", ["sealed", "frontier"])
def test_store_killed_mid_put_and_restarted(tmp_path, monkeypatch, mode, client):
    own = WeedS3(tmp_path / "weed")
    own.start()
    for k, v in own.env().items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)  # (the readers in other processes inherit them)
    topic, cat = f"kp-{uuid.uuid4().hex[:6]}", Catalog(tmp_path / "cat")
    prefix = f"kp/{uuid.uuid4().hex[:8]}"
    uri = store = own.uri(prefix)
    given = ()  # (what a reader is told of the store: the catalog's record of a URI suffices)
    if client == "one-attempt":
        store = pafs.SubTreeFileSystem(f"{own.bucket}/{prefix}", own.filesystem(
            connect_timeout=0.5, request_timeout=1.0, allow_delayed_open=True,  # (one PUT an
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1)))  # object, as a URI)
        given = ("--store", uri)
    pub = sub = None
    try:
        pub = Publisher(topic, catalog=cat, retention=Retention(
            dir=tmp_path / "logs", store=store, upload=mode, segment_bytes=1 << 20,
            max_bytes=None, max_age=None))
        sub, seen, reader = live_subscriber(cat, topic, timeout=30.0)

        def epochs(first, last):
            for t in range(first, last):
                pub.send(t, [{"t": t, "i": i, "pad": "x" * PAD} for i in range(3)])
                pub.advance_to(t + 1)

        epochs(0, 2)
        pub.flush()
        wait_until(lambda: len(seen) == 2, what="epochs 0-1 delivered")
        os.killpg(own.proc.pid, signal.SIGSTOP)  # uploads from now on hang mid-request...
        caller = threading.Thread(target=epochs, args=(2, EPOCHS), daemon=True)
        caller.start()
        announced = len(seen)
        wait_until(lambda: any(tx for tx, _ in requests_in_flight(own.port)), timeout=10,
                   what="a PUT body stuck in the publisher's send queue")
        own.stop()  # ... and the server dies with them at once: SIGKILL, its data as it is
        time.sleep(1.0)
        if mode == "frontier":  # nothing announced whose data is not in the store
            assert len(seen) == announced == 2, seen
        else:  # the live stream does not wait for the store
            wait_until(lambda: len(seen) == EPOCHS, what="live delivery while the store is down")
        own.start()  # the same data directory and ports
        assert indexed_objects_whole(cat, topic, uri) == []  # (before any retry: what the
        #                     index named when the server died was whole in it, and still is)
        caller.join(60)
        pub.flush(30)
        wait_until(lambda: len(seen) == EPOCHS, timeout=30, what="every epoch announced")
        state = cat.history_state(topic, 0)
        if mode == "sealed":  # the uploader retried: every sealed segment is in the store
            wait_until(lambda: all(g.object_bytes == g.nbytes for g in cat.history_state(
                topic, 0).segments if g.seq < state.segment and g.epochs), timeout=30,
                what="every sealed segment uploaded")
        else:  # the chain of the segment being written holds every committed byte
            assert state.committed == 0 or state.segments[-1].object_bytes >= state.committed
        failed = pub._log.tails.stats["tail_failures"] if mode == "frontier" else \
            pub._log.uploader.stats["failures"]
        assert failed > 0 or client == "uri"  # (one attempt a request: the log's loop retried)
        assert indexed_objects_whole(cat, topic, uri) == []
        rc, got, text = read_in_process(tmp_path / "cat", topic, "--source", "store", *given)
        assert rc == 0, text
        assert got == whole(range(EPOCHS)), text
        pub.close(wait=True)
        reader.join(30)
        assert seen == [(t, True) for t in range(EPOCHS)]  # live: whole, once, in order
        assert indexed_objects_whole(cat, topic, uri) == []
        shutil.rmtree(tmp_path / "logs")  # the publisher's disk is gone: the store serves
        rc, got, text = read_in_process(tmp_path / "cat", topic, *given)
        assert rc == 0, text
        assert got == whole(range(EPOCHS)), text
    finally:
        if sub is not None:
            sub.close()
        if pub is not None:
            pub.abort("the test ends", linger=0)  # (nothing after a close)
        own.stop()
