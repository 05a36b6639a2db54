"""Where a benchmark's numbers come from: which epochstream was imported (a git commit, or a
``git archive`` snapshot with a ``COMMIT`` file) and which filesystem held its files. Shared by
the cases that record it in their JSON (``bench_history``, ``bench_groups``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["library", "storage"]


def library() -> dict:
    """Where ``epochstream`` is imported from (the spawned processes and the resume children
    import the same one) and, if that is a git work tree, its commit and uncommitted changes."""
    import epochstream
    d = Path(epochstream.__file__).resolve().parent.parent
    out = {"dir": str(d)}
    if (d / "COMMIT").exists():  # a snapshot (``git archive HEAD epochstream``) with its commit
        out["commit"] = (d / "COMMIT").read_text().strip()
        out["snapshot"] = True
        return out
    try:
        git = lambda *a: subprocess.run(["git", "-C", str(d), *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=10).stdout.strip()
        head = git("rev-parse", "HEAD")
        if head:
            out["commit"] = head
            out["uncommitted_in_epochstream"] = len(git("status", "--porcelain", "epochstream").splitlines())
    except Exception:
        pass
    return out


def storage(path) -> dict:
    """The filesystem under ``path`` (from /proc/mounts: the longest mount point prefix)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[0]):
                best = (mnt, dev, fstype)
    except OSError:
        pass
    return {"dir": os.path.dirname(path), "mount": best[0], "device": best[1], "fstype": best[2]}
