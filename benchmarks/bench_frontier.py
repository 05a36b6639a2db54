"""Frontier operations: cost of Antichain and MutableAntichain for total and product orders.

For antichain sizes ``w`` in 1, 4, 16, 64 and each order it measures (ns per operation):

- ``antichain_less_equal`` — ``Antichain.less_equal`` of random probes against a width-``w``
  antichain (for TOTAL the antichain has one element whatever ``w``: a total order's antichains
  are singletons);
- ``antichain_insert`` — rebuilding a width-``w`` antichain by ``insert`` of random times;
- ``mutable_beyond`` — ``MutableAntichain.update_iter`` of ``+1``/``-1`` updates at times
  strictly beyond the frontier (no rebuild: timely's ``rebuild_required`` fast path) with
  ``w`` frontier elements;
- ``mutable_advance`` — each update batch downgrades one of ``w`` outstanding capabilities
  ``[(new, +1), (old, -1)]`` so the frontier changes every time (worst case: a rebuild per
  batch, O(n·w) comparisons for product orders, O(log n) for TOTAL).

Each case runs ``--updates`` operations (default 10^5) or until its share of ``--budget``
seconds is used, whichever comes first; the count run is recorded. Writes
``benchmarks/results/frontier.json`` and prints a table.

Run: ``python -m benchmarks.bench_frontier`` (or ``python benchmarks/bench_frontier.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from epochstream.frontier import Antichain, MutableAntichain  # noqa: E402
from epochstream.order import TOTAL, product  # noqa: E402

SIZES = (1, 4, 16, 64)
ORDERS = {"total": TOTAL, "product(2)": product(2), "product(3)": product(3)}
RESULTS = os.path.join(os.environ.get("BENCH_RESULTS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "results"), "frontier.json")


def antichain_of(order, w: int, base: int = 0) -> list:
    """``w`` mutually incomparable times (for TOTAL: one time), spaced so that advancing them
    round-robin by ``(1, 1, ...)`` keeps them incomparable."""
    if order is TOTAL:
        return [base]
    n = order.width
    out = []
    for i in range(w):
        t = [base] * n
        t[0] += 2 * i
        t[1] += 2 * (w - 1 - i)
        out.append(tuple(t))
    return out


def _timed(fn, n: int, budget: float) -> tuple[int, float]:
    """Call ``fn(k)`` for k = 0.. in chunks until ``n`` calls or ``budget`` seconds."""
    done, start = 0, time.perf_counter()
    chunk = 1000
    while done < n:
        k = min(chunk, n - done)
        fn(done, k)
        done += k
        if time.perf_counter() - start > budget:
            break
    return done, time.perf_counter() - start


def bench_case(name: str, order, w: int, n: int, budget: float) -> list[dict]:
    rng = random.Random(42)
    rows = []
    elems = antichain_of(order, w)
    hi = 4 * w + 4

    def rand_time():
        if order is TOTAL:
            return rng.randrange(hi)
        return tuple(rng.randrange(hi) for _ in range(order.width))

    # Antichain.less_equal
    a = Antichain(order, elems)
    probes = [rand_time() for _ in range(4096)]

    def le(start, k):
        f = a.less_equal
        for i in range(start, start + k):
            f(probes[i & 4095])

    rows.append(("antichain_less_equal", *_timed(le, n, budget)))

    # Antichain.insert: build a fresh width-w antichain, then insert random times
    def ins(start, k):
        b = Antichain(order, elems)
        for i in range(start, start + k):
            b.insert(probes[i & 4095])
            if (i & 63) == 63:
                b = Antichain(order, elems)

    rows.append(("antichain_insert", *_timed(ins, n, budget)))

    # MutableAntichain: updates strictly beyond the frontier (no rebuild)
    m = MutableAntichain(order, [(t, 1) for t in elems])
    far = [(t + hi) if order is TOTAL else tuple(x + hi for x in t) for t in probes]

    def beyond(start, k):
        u = m.update_iter
        for i in range(start, start + k):
            t = far[i & 4095]
            u(((t, 1),))
            u(((t, -1),))

    cnt, secs = _timed(beyond, n // 2, budget)
    rows.append(("mutable_beyond", cnt * 2, secs))

    # MutableAntichain: downgrade one of w outstanding capabilities each batch (rebuilds)
    caps = list(elems) if order is not TOTAL else list(range(w))
    m2 = MutableAntichain(order, [(t, 1) for t in caps])
    state = {"caps": caps, "step": 0}

    def advance(start, k):
        u = m2.update_iter
        cs = state["caps"]
        for i in range(start, start + k):
            j = i % len(cs)
            old = cs[j]
            if order is TOTAL:
                new = old + len(cs)  # the minimum moves up: the frontier changes every time
                j = i % len(cs)
            else:
                new = tuple(x + 1 for x in old)  # stays incomparable with the others
            cs[j] = new
            u(((new, 1), (old, -1)))

    cnt, secs = _timed(advance, n, budget)
    rows.append(("mutable_advance", cnt, secs))
    assert len(m2.frontier) == (1 if order is TOTAL else w)
    return [{"order": name, "size": w, "op": op, "ops": c,
             "ns_per_op": round(s / c * 1e9, 1) if c else None} for op, c, s in rows]


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "processor": platform.processor() or platform.machine()}


def run(quick: bool = False, log=None, n: int | None = None, budget: float | None = None,
        out: str | None = RESULTS) -> dict:
    """Run every case; write ``out`` (json) unless it is None; return the result dict (also what
    ``python -m benchmarks --case frontier`` saves). ``quick``: 2·10^4 updates, 10 s budget."""
    n = n or (20_000 if quick else 100_000)
    budget = budget or (10.0 if quick else 40.0)
    cases = [(name, o, w) for name, o in ORDERS.items() for w in SIZES]
    per = budget / (len(cases) * 4)
    rows = []
    t0 = time.perf_counter()
    for name, o, w in cases:
        rows.extend(bench_case(name, o, w, n, per))
    result = {"benchmark": "frontier", "updates": n, "machine": machine(),
              "elapsed_s": round(time.perf_counter() - t0, 2), "rows": rows, "ok": True}
    result["table_markdown"] = table(result)
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    if log:
        log(result["table_markdown"])
    return result


def table(result: dict) -> str:
    ops = ["antichain_less_equal", "antichain_insert", "mutable_beyond", "mutable_advance"]
    lines = ["| order | size w | " + " | ".join(f"{o} (ns)" for o in ops) + " |",
             "|---|---:|" + "---:|" * len(ops)]
    by = {(r["order"], r["size"], r["op"]): r for r in result["rows"]}
    for name in ORDERS:
        for w in SIZES:
            cells = []
            for o in ops:
                r = by[(name, w, o)]
                cell = f"{r['ns_per_op']:,.0f}"
                if r["ops"] < result["updates"] - 1:
                    cell += f" ({r['ops']:,} ops)"
                cells.append(cell)
            lines.append(f"| {name} | {w} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Antichain / MutableAntichain cost")
    ap.add_argument("--updates", type=int, default=None, help="per case (default 10^5)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for all cases (default 40)")
    ap.add_argument("--quick", action="store_true", help="2*10^4 updates, 10 s budget")
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args(argv)
    result = run(a.quick, None, a.updates, a.budget, a.out)
    print(table(result))
    print(f"\n{result['machine']['cpus']} CPUs, Python {result['machine']['python']}; "
          f"{result['elapsed_s']} s; written to {a.out}")
    return result


if __name__ == "__main__":
    main()
