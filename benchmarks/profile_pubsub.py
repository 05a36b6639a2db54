"""Where a 1-record message's CPU goes, per thread (issue 28): one publisher (the caller's
thread and the publisher's loop thread, measured apart) and one subscriber process
(``events()``; its CPU includes libzmq's I/O thread), 1 msgpack dict per message, coalescing
off, 100 messages per epoch, as fast as it goes for ``seconds``.

``python -m benchmarks.profile_pubsub [--trees A B] [--pairs N] [--seconds S]``: each run is a
fresh interpreter importing ``epochstream`` from a tree (a directory holding the package, e.g.
``git archive REV epochstream | tar -x -C /tmp/old``; default: this checkout); with two trees
the runs alternate A,B / B,A and the ratios are paired. Writes ``results/profile_pubsub.json``.
The caller's CPU is ``time.thread_time()``; the loop thread's is read from
``/proc/self/task/TID/stat`` (Linux)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _thread_cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _subscriber(endpoint, q, seconds):
    from epochstream.protocol import DataMessage
    from epochstream.transport import Subscriber
    sub = Subscriber("t", endpoints=[endpoint], rcvhwm=1_000_000, timeout=seconds + 10)
    sub.wait_ready(30)
    q.put("ready")
    n, c0 = 0, time.process_time()
    for item in sub.events(timeout=seconds + 10):
        if type(item) is DataMessage:
            n += len(item.data)
    q.put((n, time.process_time() - c0))
    sub.close()


def one(seconds: float) -> dict:
    """One run in this interpreter (the ``epochstream`` on ``sys.path``)."""
    import multiprocessing as mp

    from epochstream.transport import Publisher

    from . import payloads
    bodies = payloads.encoded("dicts", 1)
    pub = Publisher("t", 0, sndhwm=100_000, max_queue_messages=10_000_000,
                    max_queue_bytes=8 << 30, queue_hwm=10_000, heartbeat_interval=1.0,
                    coalesce_bytes=0)
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_subscriber, args=(pub.endpoint, q, seconds))
    p.start()
    assert q.get(timeout=60) == "ready"
    tid = pub._driver.native_id
    loop0, caller0, t0 = _thread_cpu(tid), time.thread_time(), time.monotonic()
    send, advance, nb = pub.send_encoded, pub.advance_to, len(bodies)
    e = n = 0
    while time.monotonic() - t0 < seconds:
        for j in range(100):
            send(e, bodies[j % nb])
        n += 100
        e += 1
        advance(e)
    pub.flush(30)
    elapsed = time.monotonic() - t0
    caller, loop = time.thread_time() - caller0, _thread_cpu(tid) - loop0
    pub.close(linger=10)
    got, sub_cpu = q.get(timeout=120)
    p.join(30)
    assert got == n, (got, n)
    return {"records": n, "records_per_s": n / elapsed, "caller_us": caller / n * 1e6,
            "loop_us": loop / n * 1e6, "publisher_us": (caller + loop) / n * 1e6,
            "subscriber_us": sub_cpu / n * 1e6}


def _run(tree: str, seconds: float) -> dict:
    code = (f"import sys; sys.path.insert(0, {tree!r}); sys.path.insert(1, {str(ROOT)!r}); "
            "import json, epochstream; from benchmarks.profile_pubsub import one; "
            f"print('RESULT ' + json.dumps(one({seconds})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd="/")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(out.stderr[-2000:])


def _summary(xs: list) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--save", default="profile_pubsub")
    a = ap.parse_args(argv)
    labels = "AB"[:len(a.trees)]
    rows = []
    for i in range(a.pairs):
        order = list(zip(labels, a.trees))
        if i % 2:
            order.reverse()
        pair = {lab: _run(tree, a.seconds) for lab, tree in order}
        print(i, json.dumps(pair), flush=True)
        rows.append(pair)
    keys = ("records_per_s", "caller_us", "loop_us", "publisher_us", "subscriber_us")
    out = {"how": __doc__, "trees": dict(zip(labels, a.trees)), "seconds": a.seconds,
           "rows": rows, "loadavg_at_end": list(os.getloadavg()),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "summary": {lab: {k: _summary([r[lab][k] for r in rows]) for k in keys} for lab in labels}}
    if len(labels) == 2:
        out["ratios_B_over_A"] = {k: _summary([r["B"][k] / r["A"][k] for r in rows]) for k in keys}
    (ROOT / "benchmarks" / "results" / f"{a.save}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out.get("ratios_B_over_A", out["summary"]), indent=1))
    return out


if __name__ == "__main__":
    main()
