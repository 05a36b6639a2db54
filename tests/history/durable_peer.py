"""A durable subscriber in its own process, driven line by line on stdin (adversarial tests of
durable subscriptions: tests/history/test_adversarial_durable.py).

    python tests/history/durable_peer.py CATALOG TOPIC NAME [--start JSON] [--takeover]
        [--auto [--idle S] [--ack-delay S]]

On start: ``Subscriber(TOPIC, Catalog(CATALOG), durable=NAME, start=..., takeover=...)``, then
prints ``held <position json>``, or ``SubscriptionHeld`` / ``SubscriptionExpired`` /
``error <type>`` and exits with status 2. ``--start``: JSON, ``"earliest"``, an int, a list
``[a, b]`` (a product time) or ``{"times": [...]}`` (a list of times).

Interactive (default), one command per stdin line, one answer line each:

- ``next S``: ``sub.fetch(max_epochs=1, expires=S)``: ``got <time json> <records json>`` or
  ``none <status>``;
- ``ack <json>``: ``sub.ack(time)`` (a JSON list becomes a tuple): ``acked <time json>``, or
  ``fenced <message>`` (SubscriptionHeld), or ``error <type> <message>``;
- ``ackpy <python expr>``: ``sub.ack(eval(expr))`` (garbage values of any type), same answers;
- ``ackepoch``: ``sub.ack(<the last Epoch object received>)``, same answers;
- ``pos``: ``pos <position json>``;
- ``close``: ``sub.close()``, ``closed``, exit 0.

``--auto``: fetch epochs one at a time, print ``got ...`` for each, ack it (``acked ...`` or
``fenced ...``; after ``fenced`` it stops acking), until ``--idle`` seconds pass without an epoch
or the stream finishes; then ``done <position json>``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from epochstream import Catalog, Subscriber
from epochstream.errors import SubscriptionExpired, SubscriptionHeld


def jt(t):
    """A time or a tuple of times as JSON (tuples as lists)."""
    if isinstance(t, tuple):
        return [jt(x) for x in t]
    return t


def pt(v):
    """A JSON time back as a Python time."""
    return tuple(v) if isinstance(v, list) else v


def dumps(v) -> str:
    return json.dumps(v, separators=(",", ":"))


def main(argv) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("catalog")
    p.add_argument("topic")
    p.add_argument("name")
    p.add_argument("--start", default='"earliest"')
    p.add_argument("--takeover", action="store_true")
    p.add_argument("--auto", action="store_true")
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--ack-delay", type=float, default=0.0)
    a = p.parse_args(argv)
    start = json.loads(a.start)
    if isinstance(start, list):
        start = tuple(start)
    elif isinstance(start, dict):
        start = [pt(t) for t in start["times"]]
    try:
        sub = Subscriber(a.topic, Catalog(a.catalog), durable=a.name, start=start,
                         takeover=a.takeover, timeout=10)
    except (SubscriptionHeld, SubscriptionExpired) as e:
        print(type(e).__name__, str(e).replace("\n", " "), flush=True)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)
        sys.exit(2)
    print("held", dumps(jt(sub.position)), flush=True)
    if a.auto:
        fenced = False
        while True:
            r = sub.fetch(max_epochs=1, expires=a.idle)
            if not r.epochs:
                break
            e = r.epochs[0]
            print("got", dumps(jt(e.time)), dumps(e.records), flush=True)
            if fenced:
                continue
            if a.ack_delay:
                time.sleep(a.ack_delay)
            try:
                sub.ack(e)
            except SubscriptionHeld as ex:
                fenced = True
                print("fenced", dumps(jt(e.time)), str(ex).replace("\n", " "), flush=True)
                continue
            print("acked", dumps(jt(e.time)), flush=True)
        print("done", dumps(jt(sub.position)), flush=True)
        sub.close()
        return
    last = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "next":
            r = sub.fetch(max_epochs=1, expires=float(arg))
            if r.epochs:
                last = r.epochs[0]
                print("got", dumps(jt(last.time)), dumps(last.records), flush=True)
            else:
                print("none", r.status, flush=True)
        elif cmd in ("ack", "ackpy", "ackepoch"):
            if cmd == "ack":
                value = pt(json.loads(arg))
            elif cmd == "ackpy":
                value = eval(arg)  # noqa: S307 - test input
            else:
                value = last
            try:
                sub.ack(value)
            except SubscriptionHeld as ex:
                print("fenced", str(ex).replace("\n", " "), flush=True)
            except Exception as ex:  # noqa: BLE001 - reported to the test
                print("error", type(ex).__name__, str(ex).replace("\n", " "), flush=True)
            else:
                t = value.time if cmd == "ackepoch" else value
                print("acked", dumps(jt(t)), flush=True)
        elif cmd == "pos":
            print("pos", dumps(jt(sub.position)), flush=True)
        elif cmd == "close":
            sub.close()
            print("closed", flush=True)
            return
        else:
            print("error", "unknown-command", cmd, flush=True)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    main(sys.argv[1:])
