"""One of many processes opening the same *new* catalog at the same moment (tests/test_catalog.py).

    python tests/catalog_peer.py ROOT ROUNDS PARTITIONS INDEX

For each round ``r`` in ``0..ROUNDS-1``: prints ``ready r``, reads ``go T`` from stdin (``T`` a
``time.time()`` value shared by all peers), sleeps until ``T``, then opens ``Catalog`` on the
fresh path ``ROOT/r<r>/cat.sqlite``, creates topic ``t`` with PARTITIONS partitions and registers
partition INDEX; prints ``done r ok`` or ``done r fail <error>`` (one line). Only APIs that
existed before the concurrency fix are used, so the same peer shows the defect on old code.
"""
import sys
import time
from pathlib import Path

from epochstream.catalog import Catalog


def main(root: str, rounds: str, partitions: str, index: str) -> None:
    n, i = int(partitions), int(index)
    for r in range(int(rounds)):
        print("ready", r, flush=True)
        word, start = sys.stdin.readline().split()
        assert word == "go", word
        delay = float(start) - time.time()
        if delay > 0:
            time.sleep(delay)
        try:
            cat = Catalog(Path(root) / f"r{r}" / "cat.sqlite")
            cat.create_topic("t", partitions=n)
            cat.register_partition("t", i, f"tcp://127.0.0.1:{6000 + i}")
        except Exception as e:  # reported to the test, which asserts there were none
            print("done", r, "fail", f"{type(e).__name__}: {e}".replace("\n", " "), flush=True)
        else:
            print("done", r, "ok", flush=True)


if __name__ == "__main__":
    # a print writes each part on its own under PYTHONUNBUFFERED=1 (CI sets it): a peer
    # killed between two parts left a cut line (a CI failure); buffered, a line is one write
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    main(*sys.argv[1:])
