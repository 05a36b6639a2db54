"""A process that uses the network catalog with nothing but its URL (tests/test_catalog_server.py).

    python tests/catalog_server_peer.py publish URL TOPIC PARTITIONS EPOCHS PACE [retention]
        a Publisher per partition (one process), registered through Catalog(URL); prints
        ``registered``, then per epoch e in 0..EPOCHS-1 sends records ``[e, p, k]`` (k < 3) on
        each partition p and advances to e + 1, sleeping PACE seconds in between; closes and
        prints ``done``. With ``retention``: Retention() (logs under $EPOCHSTREAM_HOME).
    python tests/catalog_server_peer.py hold URL TOPIC DURABLE
        registers partition 0 of TOPIC (an endpoint of its own, not a Publisher) and claims the
        durable subscription DURABLE, both with the client's lease; prints ``held INCARNATION``
        and sleeps until killed.
    python tests/catalog_server_peer.py race URL TOPIC
        opens Catalog(URL), prints ``ready``, reads ``go T`` from stdin, sleeps until
        time.time() == T, registers partition 0 of TOPIC; prints ``won INC`` or ``held MESSAGE``
        and waits for its stdin to close.
"""
import sys
import time

from epochstream import Catalog, Publisher, Retention
from epochstream.errors import PartitionHeld


def publish(url: str, topic: str, partitions: str, epochs: str, pace: str, *flags: str) -> None:
    cat = Catalog(url)
    n = int(partitions)
    kw = {"retention": Retention()} if "retention" in flags else {}
    pubs = [Publisher(topic, p, catalog=cat, partitions=n, **kw) for p in range(n)]
    print("registered", flush=True)
    for e in range(int(epochs)):
        for p, pub in enumerate(pubs):
            pub.send(e, [[e, p, k] for k in range(3)])
            pub.advance_to(e + 1)
        time.sleep(float(pace))
    for pub in pubs:
        pub.close()
    print("done", flush=True)


def hold(url: str, topic: str, durable: str) -> None:
    cat = Catalog(url)
    cat.create_topic(topic)
    inc = cat.register_partition(topic, 0, "tcp://127.0.0.1:1")
    cat.durable_claim(topic, durable, f"holder-{inc}")
    print("held", inc, flush=True)
    while True:
        time.sleep(60)


def race(url: str, topic: str) -> None:
    cat = Catalog(url)
    print("ready", flush=True)
    word, start = sys.stdin.readline().split()
    assert word == "go", word
    delay = float(start) - time.time()
    if delay > 0:
        time.sleep(delay)
    try:
        inc = cat.register_partition(topic, 0, "tcp://127.0.0.1:2")
        print("won", inc, flush=True)
    except PartitionHeld as e:
        print("held", str(e).replace("\n", " "), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    # a print writes each part on its own under PYTHONUNBUFFERED=1 (CI sets it): a peer
    # killed between two parts left a cut line (a CI failure); buffered, a line is one write
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    {"publish": publish, "hold": hold, "race": race}[sys.argv[1]](*sys.argv[2:])
