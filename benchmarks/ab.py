"""Paired A/B runs of two source trees (issue 10's before/after levers; results/optimizations.json).

``python -m benchmarks.ab NAME PAIRS`` with ``AB_A=/path/to/old/tree`` (a directory holding an
``epochstream`` package, e.g. ``git archive HEAD epochstream | tar -x -C /tmp/old``) and
``AB_B`` (default: this checkout). Each run is a fresh process importing ``epochstream`` from
its tree; A and B alternate (A,B then B,A). NAME: fanout, dicts1, tuples1000, tuples1000c,
dicts1c, arrow1000, tuples100, arrow1. ``AB_SECONDS``: run length (0.6)."""
import json, os, subprocess, sys, statistics
import pathlib
PY = sys.executable
ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
A = os.environ.get("AB_A", ""); B = os.environ.get("AB_B", ROOT)
def run(tree, kw):
    out = subprocess.run([PY, __file__, "--one", tree, json.dumps(kw)], cwd="/", capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"ok": False, "error": out.stderr[-500:]}
D = float(os.environ.get("AB_SECONDS", "0.6"))
def fanout(tree):
    res = {}
    for n in (1, 4):
        r = run(tree, dict(kind="arrow", per_message=1000, subscribers=n, api="events", duration=D, time_limit=120))
        if not r["ok"]:
            print("FAIL", tree, n, r.get("error"), str(r.get("detail", ""))[-300:], flush=True); return None
        res[n] = sum(r["pub_cpu_s"]) / (r["expected_records"] / 1000) * 1e6
    return {"added_us": (res[4] - res[1]) / 3, "pub1_us": res[1], "pub4_us": res[4]}
def peers_cfg(kind, per, coalesce=0):
    def f(tree):
        r = run(tree, dict(kind=kind, per_message=per, subscribers=1, api="events", duration=D, time_limit=120, coalesce_bytes=coalesce))
        if not r["ok"]:
            print("FAIL", tree, r.get("error"), str(r.get("detail", ""))[-300:], flush=True); return None
        return {"rec_s": r["records_per_s"], "sub_cpu": r["sub_cpu_s_per_M"][0], "pub_cpu": r["pub_cpu_s_per_M"], "gc": sum(r["sub_gc"][0])}
    return f
CASES = {"fanout": fanout,
         "dicts1": peers_cfg("dicts", 1), "tuples1000": peers_cfg("tuples", 1000),
         "tuples1000c": peers_cfg("tuples", 1000, None), "dicts1c": peers_cfg("dicts", 1, None),
         "arrow1000": peers_cfg("arrow", 1000), "tuples100": peers_cfg("tuples", 100), "arrow1": peers_cfg("arrow", 1)}
def main():
  name, reps = sys.argv[1], int(sys.argv[2])
  fn = CASES[name]
  rows = []
  for i in range(reps):
      order = (("A", A), ("B", B)) if i % 2 == 0 else (("B", B), ("A", A))
      pair = {}
      for lab, tree in order:
          pair[lab] = fn(tree)
      print(i, json.dumps(pair), flush=True)
      rows.append(pair)
  ok = [p for p in rows if p["A"] and p["B"]]
  for k in ok[0]["A"]:
      a = [p["A"][k] for p in ok]; b = [p["B"][k] for p in ok]
      ratios = [p["B"][k] / p["A"][k] if p["A"][k] else float("nan") for p in ok]
      fmt = lambda xs: f"med {statistics.median(xs):.4g} (min {min(xs):.4g}, max {max(xs):.4g})"
      print(f"{name} {k}: A {fmt(a)} | B {fmt(b)} | B/A {fmt(ratios)} n={len(ok)}")

def one(tree, kwargs):
    sys.path.insert(0, tree)
    sys.path.insert(1, ROOT)
    import epochstream
    assert epochstream.__file__.startswith(tree), epochstream.__file__
    from benchmarks import harness
    kw = json.loads(kwargs)
    system = kw.pop("system", "epochstream")
    r = harness.run(system, **kw)
    print("RESULT " + json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict)) or k in ("pub_cpu_s", "sub_cpu_s_per_M", "sub_gc")}))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3])
    else:
        main()
