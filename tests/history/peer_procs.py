"""Helpers shared by the history tests that run ``history_peer.py publish`` processes and read
subscribers in threads: :class:`PublishPeer` (one publisher process), :class:`EpochReader`
(``sub.epochs()`` iterated in a thread) and :func:`say` (a line to a process's stdin)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from peer_processes import kill, read_until

HISTORY_PEER = str(Path(__file__).with_name("history_peer.py"))


def say(proc: subprocess.Popen, line: str = "go") -> None:
    """Write ``line`` to ``proc``'s stdin and flush it."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


class PublishPeer:
    """A ``history_peer.py publish CAT TOPIC *args`` process: stdout lines read with
    :meth:`until`, commands written with :meth:`say`, stderr to a file in ``log_dir`` (default:
    the catalog's parent) so that a flood of WARNING lines never blocks it on a full pipe."""

    def __init__(self, cat, topic, *args, log_dir=None):
        self.cat, self.topic = Path(cat), topic
        log_dir = Path(log_dir or self.cat.parent)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.err_path = log_dir / f"history-peer-{topic}-{uuid.uuid4().hex[:8]}.err"
        self._err = open(self.err_path, "w")
        self.proc = subprocess.Popen([sys.executable, HISTORY_PEER, "publish", str(cat), topic,
                                      *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     bufsize=1)

    def until(self, prefix, timeout=30.0) -> list:
        """Read stdout up to a line starting with ``prefix``; return its words."""
        return read_until(self.proc, prefix, timeout)

    def say(self, line="go"):
        """Write ``line`` to the peer's stdin (``go`` ends a pause)."""
        say(self.proc, line)

    def stats(self) -> dict:
        """pub.stats and the history server's high-water marks (``--stats``, while paused)."""
        self.say("stats")
        return json.loads(" ".join(self.until("stats ")[1:]))

    def wait(self, timeout=20.0) -> str:
        """Wait for the peer to exit by itself; assert it exited with 0; return the rest of its
        stdout."""
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, (self.proc.returncode, out, self.stderr())
        return out

    def finish(self, timeout=20.0):
        """Let a peer paused at its end close; return its last stats line (``--stats``)."""
        self.say()
        out = self.wait(timeout)
        assert "closed" in out, out
        lines = [ln for ln in out.splitlines() if ln.startswith("stats ")]
        return json.loads(lines[-1][len("stats "):]) if lines else None

    def stderr(self) -> str:
        """What the peer wrote to stderr so far."""
        if not self._err.closed:
            self._err.flush()
        return self.err_path.read_text()

    def kill(self):
        """SIGKILL the peer (unless it ended) and reap it."""
        kill(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        """Kill the peer if it still runs; close its stderr file."""
        kill(self.proc)
        self._err.close()


class EpochReader:
    """Iterates ``sub.epochs(timeout=timeout)`` in a thread: ``items`` (epochs and Gaps),
    ``error`` (what it raised, or None). ``delay``: sleep after each item (a slow reader);
    ``stop_at``: stop after the epoch of that time."""

    def __init__(self, sub, timeout=15.0, delay=0.0, stop_at=None):
        self.sub, self.items, self.error = sub, [], None
        self.delay, self.stop_at = delay, stop_at
        self._th = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._th.start()

    def _run(self, timeout):
        try:
            for item in self.sub.epochs(timeout=timeout):
                self.items.append(item)
                if self.stop_at is not None and getattr(item, "time", None) == self.stop_at:
                    return
                if self.delay:
                    time.sleep(self.delay)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            self.error = e

    def times(self) -> list:
        """The times of the items so far (a Gap as itself)."""
        return [getattr(i, "time", i) for i in list(self.items)]

    def wait_for(self, t, timeout=15.0):
        """Return once epoch ``t`` was received or the iteration raised; else AssertionError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None or any(getattr(i, "time", None) == t
                                             for i in list(self.items)):
                return
            time.sleep(0.01)
        raise AssertionError(f"epoch {t!r} not received in {timeout} s: {self.times()}")

    def join(self, timeout=25.0):
        """Wait for the iteration to end; AssertionError if it goes on past ``timeout``."""
        self._th.join(timeout)
        assert not self._th.is_alive(), f"the subscriber did not finish: {self.times()}"
