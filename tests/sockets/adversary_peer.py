"""One publisher or one subscriber of a topic in its own OS process, driven by the adversarial
tests (``tests/sockets/test_adversarial.py``). Nothing of epochstream is mocked: a real
``with Publisher(...)`` block and a real ``Subscriber(...).epochs()`` loop, real sockets.

Record ids
----------
Every record carries an int id that encodes who sent it and where (see :func:`rid`)::

    rid = ((tenc * 4 + partition) * 256 + gen) * 2**24 + i

``tenc`` encodes the time (an int ``t`` itself; ``(a, b)`` as ``a * 1024 + b``), ``gen`` is the
publisher incarnation's number (0 for the first process of a partition, 1 for its first
restart, ...), ``i`` counts the records this incarnation sent at that time (0, 1, 2, ...). A
record is either the bare int or ``[rid, padding bytes]`` (bursts, to move many bytes cheaply).

Publisher mode
--------------
::

    python tests/sockets/adversary_peer.py publisher CATALOG TOPIC PARTITION PARTITIONS ORDER GEN START [key=value ...]

``ORDER``: ``total`` or ``product(2)``; ``START``: JSON time (``5`` or ``[2,1]``), the first
capability (``Publisher(..., start=START)``); options: ``heartbeat``, ``max_queue_bytes``,
``max_queue_messages``, ``sndhwm``, ``queue_hwm``, ``credit_timeout`` (passed on to
``Publisher``). Prints ``READY <incarnation> <endpoint> <rss> <caps json>`` once registered, then
reads commands from stdin, one per line, ``<seq> <verb> [args]``; for each it prints
``DO <seq>`` before executing it and ``OK <seq> <rss> [detail]`` after (or
``ERR <seq> <type> <message>`` if the library raised). Times are JSON without spaces.

- ``send T N`` — ``pub.send(T, ids)`` with the next ``N`` ids of time ``T`` (this incarnation);
- ``burst T K M PAD`` — ``K`` sends of ``M`` records ``[id, PAD bytes]`` each at ``T``;
- ``advance T`` — ``pub.advance_to(T)`` followed by ``pub.flush(None)``: once ``OK`` is printed
  the publisher's loop has handed the epoch's data and the frontier change to the sockets;
- ``flush`` — ``pub.flush(10)``; ``close`` — ``pub.close()`` (later commands get ``ERR``);
- ``raise`` — raises an exception inside the ``with Publisher(...)`` block: the block exits with
  it, the process prints ``ABORTED`` and exits with status 3 (like an application that crashed
  with a traceback, which is also printed to stderr);
- ``rss`` — just the acknowledgement (with the current RSS).

End of stdin: the block ends normally (close) and the process exits.

Subscriber mode
---------------
::

    python tests/sockets/adversary_peer.py subscriber CATALOG TOPIC RECOVER CREDIT TIMEOUT PING

``RECOVER``: 0/1; ``CREDIT``: 0 (no flow control) or ``N``; ``TIMEOUT``, ``PING``: seconds.
Prints ``READY <json>`` once every partition's snapshot arrived (json: the snapshots' lower and
upper frontiers and incarnations), then one JSON line per item of ``Subscriber.epochs()``:

- ``{"ev": "epoch", "t": T, "n": len, "groups": [[partition, gen, tenc, [[lo, hi], ...]], ...],
  "dups": d, "bad": b}`` — the records grouped by (partition, gen, tenc) with their ``i`` as
  sorted half-open ranges; ``dups``: records seen twice; ``bad``: records that are not ours;
- ``{"ev": "gap", "reason": ..., "partition": ..., "last_epoch": ..., "since": [...],
  "until": [...], "through": [...]}``;
- ``{"ev": "error", "type": name, "library": bool, "partition": ..., "last_epoch": ...,
  "msg": ...}`` (then the process exits) — ``library`` is True for epochstream's own errors;
- ``{"ev": "end"}`` when the stream finished.
"""

from __future__ import annotations

import inspect
import json
import sys
import traceback

import psutil

T_SHIFT = 1 << 24


def tenc(t) -> int:
    """The int encoding of a time (``t`` or ``a * 1024 + b``)."""
    if isinstance(t, (tuple, list)):
        a, b = t
        return a * 1024 + b
    return int(t)


def rid(t, partition: int, gen: int, i: int) -> int:
    return ((tenc(t) * 4 + partition) * 256 + gen) * T_SHIFT + i


def split_rid(r: int) -> tuple[int, int, int, int]:
    """``(tenc, partition, gen, i)`` of a record id."""
    rest, i = divmod(r, T_SHIFT)
    rest, gen = divmod(rest, 256)
    te, partition = divmod(rest, 4)
    return te, partition, gen, i


def jtime(t) -> str:
    return json.dumps(list(t) if isinstance(t, tuple) else t, separators=(",", ":"))


def ptime(text: str):
    v = json.loads(text)
    return tuple(v) if isinstance(v, list) else v


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _say(*parts) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


class InjectedFault(RuntimeError):
    """The exception the ``raise`` command throws inside the ``with Publisher`` block."""


# -- publisher ----------------------------------------------------------------------------------
_OPTIONS = {"heartbeat": ("heartbeat_interval", float), "max_queue_bytes": ("max_queue_bytes", int),
            "max_queue_messages": ("max_queue_messages", int), "sndhwm": ("sndhwm", int),
            "queue_hwm": ("queue_hwm", int), "credit_timeout": ("credit_timeout", float)}


def publisher(catalog, topic, partition, partitions, order, gen, start, *options):
    import epochstream
    from epochstream.catalog import Catalog
    from epochstream.errors import EpochstreamError
    from epochstream.order import by_name
    from epochstream.transport import Publisher

    partition, partitions, gen = int(partition), int(partitions), int(gen)
    start = ptime(start)
    kwargs = {}
    for opt in options:
        key, _, value = opt.partition("=")
        name, conv = _OPTIONS[key]
        kwargs[name] = conv(value)
    accepted = inspect.signature(Publisher.__init__).parameters
    caps = {"credit_timeout": "credit_timeout" in accepted,
            "abort": hasattr(Publisher, "abort"),
            "PublisherAborted": hasattr(epochstream.errors, "PublisherAborted")}
    # The test decides whether a missing keyword is a failure (it is told through caps); the
    # peer itself keeps running without it so that every other rule can still be exercised.
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    next_i: dict = {}
    pad_cache: dict = {}
    with Publisher(topic, partition, order=by_name(order), codec="msgpack", catalog=Catalog(catalog),
                   partitions=partitions, start=start, **kwargs) as pub:
        _say("READY", pub.incarnation, pub.endpoint, _rss(), json.dumps(caps, separators=(",", ":")))
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            seq, verb, args = words[0], words[1], words[2:]
            _say("DO", seq)
            if verb == "raise":
                raise InjectedFault(f"injected fault in partition {partition} gen {gen} (command {seq})")
            detail = ""
            try:
                if verb == "send":
                    t, n = ptime(args[0]), int(args[1])
                    first = next_i.get(t, 0)
                    next_i[t] = first + n
                    pub.send(t, [rid(t, partition, gen, i) for i in range(first, first + n)])
                    detail = f"{first}"
                elif verb == "burst":
                    t, k, m, pad = ptime(args[0]), int(args[1]), int(args[2]), int(args[3])
                    blob = pad_cache.setdefault(pad, b"\x00" * pad)
                    first = next_i.get(t, 0)
                    for j in range(k):
                        base = first + j * m
                        pub.send(t, [[rid(t, partition, gen, i), blob] for i in range(base, base + m)])
                    next_i[t] = first + k * m
                    detail = f"{first}"
                elif verb == "advance":
                    pub.advance_to(ptime(args[0]))
                    pub.flush(None)
                elif verb == "flush":
                    detail = str(pub.flush(10.0))
                elif verb == "close":
                    pub.close()
                elif verb == "rss":
                    pass
                else:
                    raise ValueError(f"unknown command {verb!r}")
            except EpochstreamError as exc:
                _say("ERR", seq, type(exc).__name__, str(exc).replace("\n", " "))
                continue
            _say("OK", seq, _rss(), detail)


def run_publisher(*argv):
    try:
        publisher(*argv)
    except InjectedFault:
        traceback.print_exc()
        _say("ABORTED")
        sys.exit(3)


# -- subscriber ---------------------------------------------------------------------------------
def _ranges(sorted_ints: list) -> list:
    out = []
    for i in sorted_ints:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def summarize(records) -> tuple[list, int, int]:
    groups: dict = {}
    bad = 0
    for r in records:
        if isinstance(r, (tuple, list)) and r:
            r = r[0]
        if type(r) is not int or r < 0:
            bad += 1
            continue
        te, p, g, i = split_rid(r)
        groups.setdefault((p, g, te), []).append(i)
    out, dups = [], 0
    for (p, g, te), ids in sorted(groups.items()):
        ids.sort()
        unique = sorted(set(ids))
        dups += len(ids) - len(unique)
        out.append([p, g, te, _ranges(unique)])
    return out, dups, bad


def _j(t):
    if isinstance(t, tuple):
        return [_j(x) for x in t]
    return t


def subscriber(catalog, topic, recover, credit, timeout, ping):
    from epochstream.catalog import Catalog
    from epochstream.errors import EpochstreamError
    from epochstream.transport import Gap, Subscriber

    def out(obj):
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    sub = None
    try:
        sub = Subscriber(topic, catalog=Catalog(catalog), wait=0.5, timeout=float(timeout),
                         recover=bool(int(recover)), credit=int(credit) or None,
                         ping_interval=float(ping))
        if not sub.wait_ready(8.0):
            out({"ev": "error", "type": "NotReady", "library": False, "partition": None,
                 "last_epoch": None, "msg": "no snapshot from every partition within 8 s"})
            return
        snaps = {str(p): {"lower": _j(s.lower), "upper": _j(s.upper)} for p, s in sub.snapshots.items()}
        _say("READY", json.dumps({"snapshots": snaps, "incarnations": sub.incarnations},
                                 separators=(",", ":")))
        for item in sub.epochs():
            if isinstance(item, Gap):
                out({"ev": "gap", "reason": item.reason, "partition": item.partition,
                     "last_epoch": _j(item.last_epoch), "since": _j(item.since),
                     "until": _j(item.until), "through": _j(item.through)})
            else:
                groups, dups, bad = summarize(item.records)
                out({"ev": "epoch", "t": _j(item.time), "n": len(item.records), "groups": groups,
                     "dups": dups, "bad": bad})
        out({"ev": "end"})
    except EpochstreamError as exc:
        out({"ev": "error", "type": type(exc).__name__, "library": True,
             "partition": getattr(exc, "partition", None),
             "last_epoch": _j(getattr(exc, "last_epoch", None)), "msg": str(exc)})
    except Exception as exc:  # anything else is a bug the test reports
        out({"ev": "error", "type": type(exc).__name__, "library": False, "partition": None,
             "last_epoch": None, "msg": f"{exc}\n{traceback.format_exc()}"})
    finally:
        if sub is not None:
            try:
                sub.close()
            except Exception:
                pass


if __name__ == "__main__":
    # a print writes each part on its own under PYTHONUNBUFFERED=1 (CI sets it): a peer
    # killed between two parts left a cut line (a CI failure); buffered, a line is one write
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode == "publisher":
        run_publisher(*argv)
    elif mode == "subscriber":
        subscriber(*argv)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    sys.stdout.flush()
