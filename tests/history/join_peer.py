"""A command-driven host of publishers in its own process, for tests/history/test_adversarial_join.py:
the test decides exactly what each partition's publisher sends and when its frontier moves.

    python tests/history/join_peer.py CATALOG

Reads one JSON array per stdin line and answers each with one stdout line, in order:
"ok <json>" or "err <ExceptionType> <message>". Times are JSON (a list for a product order,
turned into a tuple). Commands (``name`` names a publisher of this process):

    ["open", name, topic, partition, partitions, order, retention|null, extra|null]
        Publisher(topic, partition, catalog=CATALOG, partitions=, order=, coalesce_bytes=0,
        heartbeat_interval=0.2, retention=Retention(**retention) if given, **extra);
        answers ok [lower, upper]
    ["send", name, time, records]           pub.send(time, records)
    ["burst", name, [[time, records], ...], [[time, delta], ...]]   sends then progress()
    ["progress", name, [[time, delta], ...]]
    ["flush", name]                         pub.flush(); answers ok <bool>
    ["state", name]                         ok [lower, upper, subscribers]
    ["close", name]                         pub.close(linger=3)
    ["abort", name]                         pub.abort("simulated crash", linger=1)
    ["exit"]

WARNING log lines go to stderr.
"""
from __future__ import annotations

import json
import logging
import sys

from epochstream import Catalog, Publisher, Retention


def _time(t):
    return tuple(t) if isinstance(t, list) else t


def _out(t):
    return list(t) if isinstance(t, tuple) else t


def main(catalog: str) -> None:
    cat = Catalog(catalog)
    pubs: dict = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd[0]
        try:
            if op == "exit":
                print("ok null", flush=True)
                break
            if op == "open":
                _, name, topic, part, parts, order, ret, extra = cmd
                pub = Publisher(topic, part, catalog=cat, partitions=parts, order=order,
                                coalesce_bytes=0, heartbeat_interval=0.2,
                                retention=None if ret is None else Retention(**ret),
                                **(extra or {}))
                pubs[name] = pub
                res = [[_out(t) for t in pub.lower], [_out(t) for t in pub.upper]]
            elif op == "send":
                pubs[cmd[1]].send(_time(cmd[2]), cmd[3])
                res = None
            elif op == "burst":
                pub = pubs[cmd[1]]
                for t, recs in cmd[2]:
                    pub.send(_time(t), recs)
                if cmd[3]:
                    pub.progress([(_time(t), d) for t, d in cmd[3]])
                res = None
            elif op == "progress":
                pubs[cmd[1]].progress([(_time(t), d) for t, d in cmd[2]])
                res = None
            elif op == "flush":
                res = pubs[cmd[1]].flush(10)
            elif op == "state":
                pub = pubs[cmd[1]]
                res = [[_out(t) for t in pub.lower], [_out(t) for t in pub.upper],
                       pub.subscribers]
            elif op == "close":
                pubs.pop(cmd[1]).close(linger=3)
                res = None
            elif op == "abort":
                pubs.pop(cmd[1]).abort("simulated crash", linger=1)
                res = None
            else:
                raise ValueError(f"unknown command {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the test
            msg = str(e).replace("\n", " ")
            print(f"err {type(e).__name__} {msg}", flush=True)
            continue
        print("ok", json.dumps(res), flush=True)
    for pub in pubs.values():
        pub.close(linger=1)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s %(message)s")
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    main(sys.argv[1])
