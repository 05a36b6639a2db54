"""Import and start-up time (issue 28), before and after: ``python -m benchmarks.import_time
[--before REF] [--rounds N] [--repeats N] [--no-docs]``.

Times, in fresh interpreters, ``from epochstream import Publisher, Subscriber, Catalog``,
``python -m epochstream --version`` and the ``epochstream`` script's own code (``from
epochstream.cli import app; app()``) with ``--version``, each beside a bare ``python -c pass``.
*Before* is a ``git archive`` of ``REF`` (default: where this branch left ``main``, ``git
merge-base HEAD main``) unpacked in a temporary directory, *after* this work tree; each is put
first on ``PYTHONPATH``. The runs are interleaved: every round runs each command once against
each tree, in the same order, and a run's cost *over a bare interpreter* is its time minus the
bare run of the same round and tree. As issue 28 states its targets (the median of 15, the
worst of at least 5 repeats), a repeat is 15 rounds and its figure the median of its 15
over-bare costs; a target is met if the worst of the 5 repeats meets it. Two conditions:

- ``bytecode``: compiled modules cached (each tree's own ``PYTHONPYCACHEPREFIX``, warmed up
  first), as an installed package runs;
- ``source``: ``PYTHONDONTWRITEBYTECODE=1`` and no bytecode for epochstream's own modules, as a
  source checkout runs when nothing may write ``__pycache__`` (this machine's default
  environment; third-party packages keep their installed bytecode).

Also records which heavy modules each command loads (``-X importtime``). Writes
``benchmarks/results/import_time.json`` and, unless ``--no-docs``, the section of
``docs/benchmarks.md`` (:func:`section`; ``python -m benchmarks.report`` writes it too).
Nothing is asserted: speed is shown here, never tested.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from . import DOCS, ROOT, load_result, median, save_result

COMMANDS = {
    "bare": ["-c", "pass"],
    "import": ["-c", "from epochstream import Publisher, Subscriber, Catalog"],
    "version_m": ["-m", "epochstream", "--version"],
    "version_script": ["-c", "import sys\nfrom epochstream.cli import app\nsys.exit(app())",
                       "--version"],
}
LABELS = {"import": "`from epochstream import Publisher, Subscriber, Catalog`",
          "version_m": "`python -m epochstream --version`",
          "version_script": "`epochstream --version` (the script's code)"}
TARGET_MS = {"import": 60.0, "version_m": 100.0, "version_script": 100.0}
"""Issue 28's targets: milliseconds over a bare interpreter."""
HEAVY = ("pyarrow", "numpy", "pandas", "psycopg", "prometheus_client", "opentelemetry",
         "pyspark", "starlette", "uvicorn", "psutil", "typer", "rich", "zmq", "msgpack",
         "epochstream.transport", "epochstream.log", "epochstream.catalog.sqlcatalog",
         "epochstream.catalog.client", "epochstream.demo")
SECTION = "## Import and start-up (issue 28)"


def _tree(ref: str, into: Path) -> tuple[Path, str]:
    """``git archive`` of ``ref`` unpacked under ``into``; returns (its directory, commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True,
                            text=True, check=True).stdout.strip()
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "epochstream"],
                          capture_output=True, check=True).stdout
    out = into / f"before-{commit[:12]}"
    out.mkdir()
    tar = out / "tree.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as t:
        t.extractall(out)
    tar.unlink()
    return out, commit


def _env(tree: Path, condition: str, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))  # first on sys.path after the cwd (a tmp dir)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("EPOCHSTREAM_CATALOG", None)
    if condition == "bytecode":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args: list[str], env: dict, importtime: bool = False) -> tuple[float, str, float]:
    """One run of ``python ARGS`` in ``env``: (wall milliseconds, stderr, CPU milliseconds
    of the child, user + system). The working directory is neither tree (``-c`` and ``-m``
    put it first on ``sys.path``)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *(["-X", "importtime"] if importtime else []), *args],
                          env=env, capture_output=True, text=True, timeout=120,
                          cwd=env["IMPORT_TIME_CWD"])
    ms = (time.perf_counter() - t0) * 1000
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return ms, proc.stderr, cpu


def _modules(stderr: str) -> list[str]:
    return [line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line][1:]


def _stats(values: list[float], rounds: int) -> dict:
    """Median, min and max of ``values`` (every run), and the median of each repeat (each
    consecutive ``rounds`` runs) with the median, best and worst of those."""
    reps = [median(values[i:i + rounds]) for i in range(0, len(values), rounds)]
    return {"median_ms": round(median(values), 1), "min_ms": round(min(values), 1),
            "max_ms": round(max(values), 1), "repeat_medians_ms": [round(v, 1) for v in reps],
            "median_of_repeats_ms": round(median(reps), 1), "best_repeat_ms": round(min(reps), 1),
            "worst_repeat_ms": round(max(reps), 1), "runs_ms": [round(v, 1) for v in values]}


def measure(trees: dict[str, Path], rounds: int, repeats: int, tmp: Path) -> dict:
    """``{condition: {command: {tree: stats, tree + "_over_bare": stats}}}`` and the modules."""
    out: dict = {"conditions": {}, "modules": {}}
    (tmp / "cwd").mkdir(exist_ok=True)
    for condition in ("bytecode", "source"):
        envs = {name: _env(tree, condition, tmp / f"pyc-{name}") for name, tree in trees.items()}
        for env in envs.values():
            env["IMPORT_TIME_CWD"] = str(tmp / "cwd")
        for name, env in envs.items():  # warm-up (bytecode: writes the cache) and check
            where = _run(["-c", "import sys, epochstream; print(epochstream.__file__, "
                          "file=sys.stderr)"], env)[1].strip()
            if not Path(where).resolve().is_relative_to(trees[name].resolve()):
                raise RuntimeError(f"{name}: epochstream imported from {where}")
            for args in COMMANDS.values():
                _run(args, env)
        times: dict = {(c, t): [] for c in COMMANDS for t in trees}
        cpus: dict = {(c, t): [] for c in COMMANDS for t in trees}
        for _ in range(rounds * repeats):
            for c, args in COMMANDS.items():
                for t in trees:
                    wall, _, cpu = _run(args, envs[t])
                    times[c, t].append(wall)
                    cpus[c, t].append(cpu)
        res: dict = {}
        for c in COMMANDS:
            res[c] = {}
            for t in trees:
                res[c][t] = _stats(times[c, t], rounds)
                res[c][f"{t}_cpu"] = _stats(cpus[c, t], rounds)
                if c != "bare":
                    res[c][f"{t}_over_bare"] = _stats(
                        [a - b for a, b in zip(times[c, t], times["bare", t])], rounds)
                    res[c][f"{t}_cpu_over_bare"] = _stats(
                        [a - b for a, b in zip(cpus[c, t], cpus["bare", t])], rounds)
        out["conditions"][condition] = res
        if condition == "bytecode":
            for c, args in COMMANDS.items():
                for t in trees:
                    mods = _modules(_run(args, envs[t], importtime=True)[1])
                    out["modules"].setdefault(c, {})[t] = {
                        "count": len(mods),
                        "heavy": sorted(h for h in HEAVY
                                        if any(m == h or m.startswith(h + ".") for m in mods))}
    return out


def _verdict(over: dict, target: float) -> str:
    """The project's rule: met only if the worst repeat meets it."""
    if over["worst_repeat_ms"] <= target:
        return "met"
    return "not met" if over["median_of_repeats_ms"] <= target else "missed"


def section(result: dict | None) -> list[str]:
    """The ``docs/benchmarks.md`` section of ``import_time.json`` (empty without one)."""
    if not result or not result.get("conditions"):
        return []
    b, a = result["before"], result["after"]
    la = result.get("loadavg_at_start")
    out = [SECTION + "\n",
           f"Fresh interpreters, {result['repeats']} repeats of {result['rounds']} interleaved "
           f"rounds (`python -m benchmarks.import_time`; finished {result.get('finished')}"
           + (f", load average at start {la[0]:.2f}" if la else "") + "). *Before*: "
           f"`{b['ref']}` at {b['commit'][:10]}; *after*: {a['commit'][:10]}"
           + (" with uncommitted changes" if a.get("dirty") else "") + ". Wall milliseconds, "
           "median (min–max) of every run; *over bare*: a run minus the bare `python -c pass` "
           "of the same round, the median of the repeats' medians (best–worst repeat); *CPU*: "
           "the child's user + system time, the same way. *Bytecode cached*: each tree's "
           "compiled modules in a cache of its own, warmed up, as an installed package runs; "
           "*no bytecode*: `PYTHONDONTWRITEBYTECODE=1` "
           "and no `__pycache__` in the tree (this machine's sessions run so), every epochstream "
           "module compiled at each start. The targets are issue 28's, over bare; met only if "
           "the worst repeat meets it.\n"]
    rows = []
    for cond, name in (("bytecode", "bytecode cached"), ("source", "no bytecode (source)")):
        res = result["conditions"].get(cond)
        if not res:
            continue
        rows.append(["bare `python -c pass`", name, _ms(res["bare"]["before"]),
                     _ms(res["bare"]["after"]), "", "", "", ""])
        for c, label in LABELS.items():
            over = res[c]["after_over_bare"]
            rows.append([label, name, _ms(res[c]["before"]), _ms(res[c]["after"]),
                         f"{_reps(res[c]['before_over_bare'])} → {_reps(over)}",
                         f"{_reps(res[c]['before_cpu_over_bare'])} → "
                         f"{_reps(res[c]['after_cpu_over_bare'])}",
                         f"≤ {TARGET_MS[c]:g}", _verdict(over, TARGET_MS[c])])
    out.append(_table(["command", "condition", "before", "after", "over bare: before → after",
                       "CPU over bare: before → after", "target", "verdict"], rows))
    mods = result.get("modules", {})
    lines = []
    for c, label in LABELS.items():
        m = mods.get(c)
        if m:
            lines.append(f"- {label}: {m['before']['count']} → {m['after']['count']} modules; "
                         f"before {', '.join(m['before']['heavy']) or 'none'}; after "
                         f"{', '.join(m['after']['heavy']) or 'none'}.")
    if lines:
        out.append("Modules loaded (bytecode cached), and which of the heavy ones (`HEAVY` in "
                   "the script) among them:\n\n" + "\n".join(lines) + "\n")
    return out


def _reps(s: dict) -> str:
    return (f"{s['median_of_repeats_ms']:.0f} ({s['best_repeat_ms']:.0f}–"
            f"{s['worst_repeat_ms']:.0f})")


def _ms(s: dict) -> str:
    return f"{s['median_ms']:.0f} ({s['min_ms']:.0f}–{s['max_ms']:.0f})"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_docs(result: dict) -> Path:
    """Put :func:`section` into ``docs/benchmarks.md`` in place of an earlier one (or before
    "## Not measured yet"), leaving the rest of the page as it is."""
    path = DOCS / "benchmarks.md"
    text = path.read_text()
    new = "\n".join(s.rstrip("\n") + "\n" for s in section(result)) + "\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        tail = rest[rest.index("\n## "):] if "\n## " in rest else ""
        text = head + new + tail.lstrip("\n")
    elif "## Not measured yet" in text:
        head, tail = text.split("## Not measured yet", 1)
        text = head + new + "## Not measured yet" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + new
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None,
                    help="git ref of the tree to compare with (default: merge-base HEAD main)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per repeat")
    ap.add_argument("--repeats", type=int, default=5, help="repeats (>= 5)")
    ap.add_argument("--no-docs", action="store_true", help="write the JSON only")
    args = ap.parse_args(argv)
    start, la = time.time(), os.getloadavg()
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,  # noqa: E731
                                    text=True).stdout.strip()
    ref = args.before or git("merge-base", "HEAD", "main")
    with tempfile.TemporaryDirectory(prefix="import-time-") as tmp:
        before, commit = _tree(ref, Path(tmp))
        trees = {"before": before, "after": ROOT}
        stray = [str(p) for p in (ROOT / "epochstream").rglob("__pycache__")]
        result = measure(trees, args.rounds, max(args.repeats, 5), Path(tmp))
    result.update({
        "rounds": args.rounds, "repeats": max(args.repeats, 5), "wall_s": round(time.time() - start, 1),
        "loadavg_at_start": list(la),
        "before": {"ref": args.before or "merge-base HEAD main", "commit": commit},
        "after": {"commit": git("rev-parse", "HEAD"),
                  "dirty": bool(git("status", "--porcelain", "epochstream")),
                  "pycache_dirs_in_tree": stray},
        "targets_ms_over_bare": TARGET_MS})
    save_result("import_time", result)
    if not args.no_docs:
        write_docs(load_result("import_time") or result)
    return result


if __name__ == "__main__":
    main()
