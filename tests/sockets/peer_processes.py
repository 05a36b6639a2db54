"""Driving peer processes in fault tests: wait for a line they print, kill them with SIGKILL."""
import signal
import subprocess
import time


def read_until(proc: subprocess.Popen, prefix: str, timeout: float = 30.0) -> list:
    """Read ``proc``'s stdout until a line starting with ``prefix``; return its words. Raises
    AssertionError if the process exits first or nothing matches within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"peer exited (rc={proc.poll()}) before printing {prefix!r}")
        if line.startswith(prefix):
            return line.split()
    raise AssertionError(f"peer did not print {prefix!r} in {timeout} s")


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` unless it has ended, and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)
