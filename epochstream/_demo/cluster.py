"""The cluster demo's command, ``python -m epochstream._demo.cluster`` (``make demo-cluster``):
``demo [DEMO OPTIONS]`` starts a throwaway PostgreSQL server
(:mod:`epochstream.testing.postgres`) and a :class:`~epochstream._demo.local_cluster.LocalCluster`,
runs :func:`epochstream.demo.main` on ``spark://...`` with the ``postgresql://`` catalog, and
stops everything, on failure and Ctrl-C too; ``start --dir DIR`` leaves a cluster running (its
master URL on stdout, its processes in ``DIR/cluster.json``) and ``stop --dir DIR`` ends it.
The cluster's processes are :mod:`epochstream._demo.local_cluster`; its names are importable
from here too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from .local_cluster import (MASTER, WORKER, CatalogService, ClusterError, LocalCluster,
                            _group_alive, spark_home, stop_group, stop_groups)

__all__ = ["LocalCluster", "CatalogService", "ClusterError", "spark_home", "stop_group",
           "stop_groups", "main"]


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Meanwhile, SIGTERM (and SIGHUP) raise ``KeyboardInterrupt`` here, so that ``finally``
    blocks stop what was started."""
    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_demo(days: int = 365, pace: float = 0.0, workers: int = 2, keep: bool = False) -> int:
    """Start PostgreSQL (the catalog, :class:`~epochstream.testing.postgres.PostgresServer`)
    and a local cluster, run the demo on them (``spark://`` master, ``postgresql://`` catalog),
    stop both; returns the demo's exit status (130 on Ctrl-C)."""
    from rich.console import Console

    from .. import demo

    from ..testing.postgres import PostgresServer

    console = Console()
    root = Path(tempfile.mkdtemp(prefix="epochstream-demo-cluster-"))
    cluster = LocalCluster(root / "spark", workers=workers)
    postgres: PostgresServer | None = None
    status = 1
    try:
        with _terminate_on_sigterm():
            with console.status("starting PostgreSQL (the catalog) and a Spark standalone "
                                f"cluster (a master and {workers} workers, 1 core each)..."):
                postgres = PostgresServer()
                cluster.start()
            console.print(f"[bold]cluster[/]: master {cluster.master_url} (web UI "
                          f"{cluster.web_url}), {workers} workers, up in "
                          f"{cluster.started_s:.1f} s; [bold]catalog[/]: PostgreSQL "
                          f"{postgres.url_of('epochstream').split('@')[-1]} (every process, "
                          f"driver and executors, talks to the database)")
            assert cluster.master_url is not None
            status = demo.main(days=days, pace=pace, catalog=postgres.url,
                               master=cluster.master_url)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        status = 130
    except ClusterError as e:
        console.print(f"[red]error:[/] {e}")
        status = 1
    finally:
        with _terminate_on_sigterm(), contextlib.suppress(KeyboardInterrupt):
            cluster.stop(remove=False)
            if postgres is not None:
                postgres.close()
        if status not in (0, 130) or keep:
            console.print(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        console.print("cluster and PostgreSQL stopped")
    return status


def _start_detached(directory: Path, workers: int) -> int:
    cluster = LocalCluster(directory, workers=workers, detached=True)
    cluster.start()
    (directory / "cluster.json").write_text(json.dumps(
        {"master": cluster.master_url, "web": cluster.web_url, "pids": cluster.pids()}))
    print(cluster.master_url, flush=True)
    return 0


def _stop_detached(directory: Path) -> int:
    """Stop the cluster ``start --dir`` left running: the process groups in ``cluster.json``
    whose leader is still a Spark daemon (a pid reused since is left alone)."""
    import psutil  # type: ignore[import-untyped, unused-ignore]

    state = json.loads((directory / "cluster.json").read_text())
    groups = []
    for pgid in state["pids"]:
        try:
            if any(c in " ".join(psutil.Process(pgid).cmdline()) for c in (MASTER, WORKER)):
                groups.append(pgid)
        except psutil.Error:
            pass
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    (directory / "cluster.json").unlink()
    print(f"stopped {len(groups)} Spark daemon(s)", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m epochstream._demo.cluster demo|start|stop`` (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m epochstream._demo.cluster",
                                     description="A Spark standalone cluster on this machine.")
    sub = parser.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="run `epochstream demo` on a local cluster with a network "
                                    "catalog, then stop both (the default)")
    d.add_argument("--days", type=int, default=365)
    d.add_argument("--pace", type=float, default=0.0)
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--keep-logs", action="store_true")
    s = sub.add_parser("start", help="start a cluster and leave it running; prints its URL")
    s.add_argument("--dir", required=True)
    s.add_argument("--workers", type=int, default=2)
    t = sub.add_parser("stop", help="stop the cluster started with `start --dir DIR`")
    t.add_argument("--dir", required=True)
    args = parser.parse_args(["demo", *(argv or [])] if not argv or argv[0].startswith("-")
                             else list(argv))
    if args.cmd == "start":
        directory = Path(args.dir).absolute()
        directory.mkdir(parents=True, exist_ok=True)
        return _start_detached(directory, args.workers)
    if args.cmd == "stop":
        return _stop_detached(Path(args.dir).absolute())
    return run_demo(days=args.days, pace=args.pace, workers=args.workers, keep=args.keep_logs)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
