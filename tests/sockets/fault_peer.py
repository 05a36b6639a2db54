"""A publisher or subscriber in its own process, for fault-injection tests (kill -9, restart).

    python tests/sockets/fault_peer.py publisher CATALOG TOPIC START EPOCHS RATE [PAYLOAD]
        registers partition 0 of TOPIC in CATALOG, prints "READY <incarnation>", then publishes
        epochs START.. START+EPOCHS-1 (one message of PAYLOAD ints each, then advance_to) at RATE
        epochs/s, prints "EPOCH <t>" after each, and then idles (heartbeats) until killed.
    python tests/sockets/fault_peer.py burst TOPIC MESSAGES SIZE
        prints "READY <endpoint>", waits for a line on stdin, publishes MESSAGES epochs of one
        message of SIZE ints each, closes, prints "CLOSED" and exits right away.
    python tests/sockets/fault_peer.py subscriber ENDPOINT TOPIC
        subscribes, prints "READY" once its snapshot arrived, then stops reading (stalls).
"""
import sys
import time

from epochstream.catalog import Catalog
from epochstream.transport import Publisher, Subscriber


def publisher(catalog, topic, start, epochs, rate, payload=10):
    pub = Publisher(topic, 0, catalog=Catalog(catalog), start=int(start), heartbeat_interval=0.2)
    print("READY", pub.incarnation, pub.endpoint, flush=True)
    records = list(range(int(payload)))
    for t in range(int(start), int(start) + int(epochs)):
        pub.send(t, records)
        pub.advance_to(t + 1)
        pub.flush()
        print("EPOCH", t, flush=True)
        time.sleep(1.0 / float(rate))
    while True:
        time.sleep(1)


def burst(topic, messages, size):
    """Publish MESSAGES messages of SIZE ints at once, close and exit immediately."""
    pub = Publisher(topic, 0, sndhwm=100_000)
    print("READY", pub.endpoint, flush=True)
    sys.stdin.readline()  # go
    records = list(range(int(size)))
    n = int(messages)
    for t in range(n):
        pub.send(t, records)
        pub.advance_to(t + 1)
    pub.close(linger=30)
    print("CLOSED", flush=True)  # the process exits now; the interpreter waits for delivery


def subscriber(endpoint, topic):
    sub = Subscriber(topic, endpoints=[endpoint])
    assert sub.wait_ready(10)
    print("READY", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    # a print writes each part on its own under PYTHONUNBUFFERED=1 (CI sets it): a peer
    # killed between two parts left a cut line (a CI failure); buffered, a line is one write
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    {"publisher": publisher, "subscriber": subscriber, "burst": burst}[sys.argv[1]](*sys.argv[2:])
