"""Paired, interleaved repeats and per-pair ratios (the measurement rules of docs/benchmarks.md).

``interleave(variants, repeats, run_one)`` runs every variant once per repeat, in the same order
(A, B, C, A, B, C, ...), so two variants of one repeat ran seconds apart under the same load.
``pair_ratios(rows, a, b)`` returns the per-repeat ratios ``a / b`` of a metric (only repeats in
which both runs succeeded) and ``summary(ratios)`` their min / median / max. A target is "met"
only when the minimum of the paired ratios meets it.
"""

from __future__ import annotations

import os

from . import median

# Run length of one throughput run (seconds) and repeats: the rules ask for >= 5 s and >= 5.
FULL_SECONDS = 5.0
FULL_REPEATS = 5
QUICK_SECONDS = 0.6
QUICK_REPEATS = 3  # quick mode is labelled: fewer repeats than the rules ask, to fit 3 minutes


def scale() -> float:
    """``BENCH_SCALE`` (env) multiplies every run length: a development aid (e.g. 0.1)."""
    try:
        return float(os.environ.get("BENCH_SCALE", "1"))
    except ValueError:
        return 1.0


def seconds(quick: bool) -> float:
    return (QUICK_SECONDS if quick else FULL_SECONDS) * scale()


def repeats(quick: bool) -> int:
    try:
        return int(os.environ["BENCH_REPEATS"])
    except (KeyError, ValueError):
        return QUICK_REPEATS if quick else FULL_REPEATS


def interleave(variants, n_repeats: int, run_one, log=print) -> list[dict]:
    """``variants``: list of labels; ``run_one(label, repeat) -> row``. Rows get ``variant`` and
    ``repeat``."""
    rows = []
    for rep in range(n_repeats):
        for label in variants:
            row = run_one(label, rep)
            row["variant"] = label
            row["repeat"] = rep
            rows.append(row)
    return rows


def pair_ratios(rows, a: str, b: str, key: str = "records_per_s", where=None) -> list[float]:
    """Per-repeat ``a / b`` of ``key`` over ``rows`` (optionally filtered by ``where(row)``)."""
    sel = [r for r in rows if where is None or where(r)]
    by = {}
    for r in sel:
        by.setdefault(r["repeat"], {})[r["variant"]] = r
    out = []
    for rep in sorted(by):
        x, y = by[rep].get(a), by[rep].get(b)
        if x and y and x.get("ok") and y.get("ok") and x.get(key) and y.get(key):
            out.append(x[key] / y[key])
    return out


def summary(ratios) -> dict | None:
    if not ratios:
        return None
    return {"n": len(ratios), "min": min(ratios), "median": median(ratios), "max": max(ratios)}


def verdict(s: dict | None, target: float, higher_is_better: bool = True) -> str:
    if not s:
        return "not measured"
    if higher_is_better:
        if s["min"] >= target:
            return "met"
        return "missed" if s["max"] < target else "not met (min below target)"
    if s["max"] <= target:
        return "met"
    return "missed" if s["min"] > target else "not met (max above target)"
