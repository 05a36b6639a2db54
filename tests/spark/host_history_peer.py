"""A SparkPublisherHost with retention in its own process, for kill -9 tests
(test_adversarial_host_history.py).

    host_history_peer.py TOPIC CATALOG RETENTION_DIR PARTITIONS WORKDIR MODE [ARG]

Writes ``WORKDIR/ready`` once started (JSON: next_epoch, ingest endpoints). Modes:

- ``serve``: serve until ``WORKDIR/stop`` exists, then close normally (``WORKDIR/closed``);
- ``pause P:E:STAGE``: stop partition P's COMMIT(E) at STAGE (``data``/``advanced``), write
  ``WORKDIR/hit`` and wait to be killed;
- ``staged E``: once partition 0's frontier is E and it has rows staged, ``hit``, wait;
- ``fsync E``: once partition 0 published COMMIT(E)'s data (``paused``) and ``WORKDIR/go``
  exists, trap the next ``os.fsync`` of its epoch log (the one that makes epoch E durable
  before it is indexed): ``hit``, wait;
- ``indexed E``: as ``fsync``, but the trap is right after partition 0 indexed epoch E in the
  catalog (complete and durable in its log) and before the frontier is sent: ``hit``, wait.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from epochstream import Retention
from epochstream.catalog import Catalog
from epochstream.spark import SparkPublisherHost


def main() -> None:
    topic, cat, ret, parts, workdir, mode = sys.argv[1:7]
    arg = sys.argv[7] if len(sys.argv) > 7 else ""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)

    def mark(name: str, text: str = "") -> None:
        tmp = work / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, work / name)

    armed = threading.Event()
    if mode == "fsync":
        real = os.fsync
        part0 = os.sep + os.path.join(topic, "0") + os.sep

        def fsync(fd):
            if armed.is_set():
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    path = ""
                if part0 in path:
                    mark("hit", path)
                    time.sleep(600)  # "in" the fsync until killed
            return real(fd)

        os.fsync = fsync

    if mode == "indexed":  # epoch E indexed (durable, complete in the log), not yet announced
        from epochstream.catalog import history as catalog_history

        cls = type(Catalog(cat))
        real_commit = cls.history_commit

        def history_commit(self, t, partition, *, epochs, **kw):
            out = real_commit(self, t, partition, epochs=epochs, **kw)
            if armed.is_set() and partition == 0 and any(e.time == int(arg) for e in epochs):
                mark("hit")
                time.sleep(600)  # killed before the frontier leaves the process
            return out

        cls.history_commit = history_commit
        del catalog_history

    host = SparkPublisherHost(topic, partitions=int(parts), catalog=Catalog(cat),
                              retention=Retention(dir=ret))
    pause = None
    if mode == "pause":
        p, e, stage = arg.split(":")
        pause = host.pause(int(p), int(e), stage)
    elif mode in ("fsync", "indexed"):
        pause = host.pause(0, int(arg), "data")
    host.start()
    mark("ready", json.dumps({"next_epoch": host.next_epoch(),
                              "stats": [s.next_epoch for s in host.stats()]}))
    if mode == "serve":
        while not (work / "stop").exists():
            time.sleep(0.05)
        host.close()
        mark("closed", json.dumps([s.next_epoch for s in host.stats()]))
        return
    if mode == "pause":
        pause.wait()
        mark("hit")
    elif mode == "staged":
        e = int(arg)
        while not (host.stats(0).next_epoch == e and host.staged_bytes(0) > 0):
            time.sleep(0.01)
        mark("hit", str(host.staged_bytes(0)))
    elif mode in ("fsync", "indexed"):
        pause.wait()
        mark("paused")
        while not (work / "go").exists():  # the test reads the complete epochs first
            time.sleep(0.02)
        armed.set()
        pause.resume()
    time.sleep(600)  # until killed


if __name__ == "__main__":
    main()
