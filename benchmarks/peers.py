"""Start and stop the peer systems (redis-server, nats-server) on 127.0.0.1 for the benchmarks.

Each server runs as a child process on a free port with settings that let a Python subscriber
keep up without being disconnected (Redis: no pubsub output-buffer limit; NATS: large
``max_pending``/``max_payload`` and a long write deadline), and is stopped (SIGTERM, then SIGKILL)
when the context manager exits. Missing servers are installed with
``apt-get install -y redis-server nats-server`` (Debian) when we are root; if that fails the
peer is reported as unavailable (``None``), never faked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time

__all__ = ["ensure_installed", "redis_server", "nats_server", "free_port", "PACKAGES"]

PACKAGES = {"redis": ("redis-server", "redis-server"), "nats": ("nats-server", "nats-server")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}")
                                       if os.path.exists(p)), None)


def ensure_installed(peer: str, log=print) -> tuple[str | None, str]:
    """Path of the server binary for ``peer`` (``"redis"``/``"nats"``), installing the Debian
    package if needed. Returns ``(path or None, note)``."""
    binary, package = PACKAGES[peer]
    path = _binary(binary)
    if path:
        return path, "installed"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, f"{binary} not found and cannot apt-get install {package} (not root / no apt)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                                timeout=60, env=env).stdout
        if "Candidate:" not in policy or "Candidate: (none)" in policy:
            log(f"  peers: {package} not in the apt lists; running apt-get update")
            subprocess.run(["apt-get", "update"], capture_output=True, timeout=300, env=env)
            policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                                    timeout=60, env=env).stdout
            if "Candidate:" not in policy or "Candidate: (none)" in policy:
                return None, f"{package} is not available from this machine's Debian repositories"
        log(f"  peers: apt-get install -y {package}")
        out = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", package],
                             capture_output=True, text=True, timeout=600, env=env)
        if out.returncode != 0:
            return None, f"apt-get install {package} failed: {out.stderr.strip()[-300:]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"installing {package} failed: {exc}"
    # Debian's postinst may start a system service; we use our own instance on a free port.
    path = _binary(binary)
    return (path, "installed by apt-get") if path else (None, f"{binary} missing after install")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"server did not listen on 127.0.0.1:{port} within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def redis_server(binary: str):
    """Yield ``(port, version, pid)`` of a fresh redis-server on 127.0.0.1."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as d:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", d, "--protected-mode", "no",
             "--client-output-buffer-limit", "pubsub 0 0 0", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, proc)
            version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
            yield port, version, proc.pid
        finally:
            _stop(proc)


@contextlib.contextmanager
def nats_server(binary: str):
    """Yield ``(port, version, pid)`` of a fresh nats-server on 127.0.0.1 (core NATS, no JetStream)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as d:
        conf = os.path.join(d, "nats.conf")
        with open(conf, "w") as f:
            f.write(f"host: 127.0.0.1\nport: {port}\nmax_payload: 8MB\nmax_pending: 1GB\n"
                    f"write_deadline: \"30s\"\n")
        proc = subprocess.Popen([binary, "-c", conf], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, proc)
            version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
            yield port, version, proc.pid
        finally:
            _stop(proc)
