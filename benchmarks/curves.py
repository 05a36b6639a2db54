"""Growth of a measured curve (issue 28, "the curves of scale"): a least-squares fit of
``y = a + b·x`` and of ``y = a + b·log2(x)``, the log-log exponent of the growth above the
first point, and a verdict — ``constant``, ``logarithmic``, ``linear`` or ``superlinear``.

The verdict (:func:`growth`), over points ``x`` spanning at least a factor 8:

- ``falling`` — the fitted slope is negative and the last y below 2/3 of the first (a fixed
  cost amortised);
- ``constant`` — the largest y is within 1.5× of the smallest, or the fitted rise over the whole
  span is below half the median y (noise about a level, or a fall);
- otherwise by the log-log exponent k of ``y - y(x0)`` against ``x`` (the growth above the
  first point): ``superlinear`` for k ≥ 1.3 when the exponent of ``y`` itself is ≥ 1.3 too (a
  small first step inflates k: ``y = 29·x`` measured as 43, 56, 134, ... has k 1.6 but an
  exponent of 0.9), ``linear`` for 0.8 ≤ k < 1.3, ``sublinear`` for
  0.5 ≤ k < 0.8, ``logarithmic`` below 0.5 (a logarithm's exponent over 3 decades is ~0.2-0.4);
- without an exponent (the curve falls): ``linear`` if ``y = a + b·x`` fits at least as well (R²)
  as the logarithm, else ``logarithmic``.

Also process measurements from ``/proc`` (threads, open file descriptors, resident memory) and
CPU seconds from ``time.process_time()`` (``CLOCK_PROCESS_CPUTIME_ID``: every thread of the
process, libzmq's I/O threads included, at nanosecond resolution rather than ``os.times()``'s 10 ms ticks):
no psutil needed.
"""

from __future__ import annotations

import math
import os
import time


def _lsq(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    return a, b, (1 - ss_res / ss_tot) if ss_tot > 0 else 1.0


def fit(xs, ys) -> dict | None:
    """Linear and logarithmic least-squares fits of the points (x > 0), the log-log exponent,
    and the :func:`growth` verdict; ``None`` with fewer than 3 usable points."""
    pts = sorted((float(x), float(y)) for x, y in zip(xs, ys)
                 if x is not None and y is not None and x > 0)
    if len(pts) < 3:
        return None
    X, Y = [p[0] for p in pts], [p[1] for p in pts]
    a, b, r2 = _lsq(X, Y)
    la, lb, lr2 = _lsq([math.log2(x) for x in X], Y)
    y0 = Y[0]
    above = [(math.log(x / X[0]), math.log(y - y0)) for x, y in pts[1:] if y > y0 > 0 or (y0 <= 0 < y)]
    expo = _lsq([p[0] for p in above], [p[1] for p in above])[1] if len(above) >= 2 else None
    direct = _lsq([math.log(x) for x in X], [math.log(y) for y in Y])[1] if min(Y) > 0 else None
    out = {"points": len(pts), "x_span": [X[0], X[-1]],
           "linear": {"intercept": a, "slope": b, "r2": r2},
           "log2": {"intercept": la, "slope": lb, "r2": lr2},
           "loglog_exponent": expo, "loglog_exponent_direct": direct}
    out["growth"] = growth(out, Y)
    return out


def growth(f: dict, ys) -> str:
    lo, hi = min(ys), max(ys)
    span = f["x_span"][1] - f["x_span"][0]
    rise = f["linear"]["slope"] * span  # the fitted change over the whole span
    mid = sorted(abs(y) for y in ys)[len(ys) // 2]
    if f["linear"]["slope"] < 0 and ys[-1] < 0.67 * ys[0]:
        return "falling"
    if (lo > 0 and hi / lo < 1.5) or rise < 0.5 * mid:
        return "constant"
    k, kd = f["loglog_exponent"], f.get("loglog_exponent_direct")
    if k is not None:
        if k >= 1.3 and (kd is None or kd >= 1.3):
            return "superlinear"
        return "linear" if k >= 0.8 else "sublinear" if k >= 0.5 else "logarithmic"
    return "linear" if f["linear"]["r2"] >= f["log2"]["r2"] else "logarithmic"


def proc_status() -> dict:
    """This process's threads, open file descriptors, resident memory (KiB) and CPU seconds."""
    d = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            d[k] = v.strip()
    return {"threads": int(d["Threads"]), "fds": len(os.listdir("/proc/self/fd")),
            "rss_kib": int(d["VmRSS"].split()[0]), "cpu_s": time.process_time()}


def expect(q, kind: str, timeout: float):
    """The payload of the next ``(kind, payload)`` message on the queue ``q`` of a case's child
    processes, waiting at most ``timeout`` seconds (``queue.Empty`` beyond); a child's
    ``("error", text)``, or any other kind, raises ``RuntimeError``."""
    msg = q.get(timeout=timeout)
    if msg[0] == "error":
        raise RuntimeError(msg[1])
    if msg[0] != kind:
        raise RuntimeError(f"expected {kind}, got {msg[0]}")
    return msg[1]


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def describe(f: dict | None, unit: str, per: str = "unit", scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    """One line for the docs: the verdict with the fitted slope (``scale`` converts units)."""
    if not f:
        return "not enough points"
    lin, lg = f["linear"], f["log2"]
    if f["growth"] == "logarithmic":
        return (f"**logarithmic**: {fmt.format(lg['slope'] * scale)} {unit} per doubling of the {per} "
                f"(R² {lg['r2']:.2f}; linear R² {lin['r2']:.2f})")
    return (f"**{f['growth']}**: slope {fmt.format(lin['slope'] * scale)} {unit} per {per}, "
            f"intercept {fmt.format(lin['intercept'] * scale)} {unit} (R² {lin['r2']:.2f}"
            + (f", log-log exponent {f['loglog_exponent']:.2f}" if f["loglog_exponent"] is not None else "")
            + ")")


def resummarise(names=("topics", "subscribers", "catalog_scale", "partitions_wide", "history_scale")) -> None:
    """Recompute the ``summary`` (fits and verdicts) of result files from their rows — after a
    change of :func:`growth`, without measuring again (``python -m benchmarks.curves``)."""
    import importlib
    import json

    from . import RESULTS
    mods = {"topics": "bench_topics", "subscribers": "bench_subscribers",
            "catalog_scale": "bench_catalog_scale", "partitions_wide": "bench_partitions",
            "history_scale": "bench_history_scale"}
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        mod = importlib.import_module(f"{__package__}.{mods[name]}")
        if name == "catalog_scale":
            r["summary"] = mod.summarise(r["rows"], r["plan"]["stores"])
        elif name == "partitions_wide":
            r["summary"] = mod.summarise(r["rows"], r.get("poll"))
        elif hasattr(mod, "summarise"):
            r["summary"] = mod.summarise(r["rows"])
        path.write_text(json.dumps(r, indent=1, default=str) + "\n")


if __name__ == "__main__":
    resummarise()
