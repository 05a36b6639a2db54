"""``epochstream tail`` as a person runs it: in a real terminal (a pseudo-terminal that is the
process' controlling tty, so Ctrl-C goes through the line discipline) and into a pipe whose
reader goes away (``| head -1``). The publisher runs in this test process; the tail is a real
``python -m epochstream`` subprocess."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import threading
import time

import pytest

from epochstream.catalog import Catalog
from epochstream.transport import Publisher

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX terminals and pipes")


@pytest.fixture
def cat(tmp_path) -> Catalog:
    return Catalog(tmp_path / "cat.sqlite")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    for var in ("EPOCHSTREAM_CATALOG", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                "TTY_INTERACTIVE"):
        env.pop(var, None)
    return env


def _controlling_tty() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A subprocess whose stdin, stdout and stderr are one pseudo-terminal."""

    def __init__(self, args: list[str], env: dict[str, str], cols: int = 100) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, bytes([24, 0, cols, 0, 0, 0, 0, 0]))
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     preexec_fn=_controlling_tty, close_fds=True)
        os.close(slave)
        self.output = b""

    def read_until(self, needle: bytes, timeout: float = 15.0) -> bytes:
        """Read until the output (colours removed) matches the regular expression ``needle``."""
        deadline = time.monotonic() + timeout
        while not re.search(needle, re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", self.output), re.M):
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{needle!r} not seen; output so far: {self.output!r}")
        return self.output

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], min(timeout, 0.5))
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.output += chunk
        return bool(chunk)

    def finish(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        while self._read(0.05) and select.select([self.master], [], [], 0)[0]:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running; output: {self.output!r}")
        os.close(self.master)
        return self.proc.returncode


def _wait_subscribed(pub: Publisher, n: int = 1, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while pub.subscribers < n:
        assert time.monotonic() < deadline, "tail never subscribed"
        time.sleep(0.01)


def _tail(cat: Catalog, *args: str) -> list[str]:
    return [sys.executable, "-m", "epochstream", "tail", "live", "--catalog", str(cat.path),
            "--wait", "10", *args]


def test_tail_in_a_terminal(cat):
    with Publisher("live", catalog=cat) as pub:
        term = Terminal(_tail(cat, "--timeout", "20"), _env(TERM="xterm-256color"))
        try:
            _wait_subscribed(pub)
            term.read_until(b"lag")  # the column header: the tail is ready
            for t in range(3):
                pub.send(t, [{"i": i} for i in range(t + 1)])
                pub.advance_to(t + 1)
            term.read_until(rb"^\s+2\s+3\s")  # epoch 2, 3 records
        finally:
            pub.close()
        code = term.finish()
    out = term.output.decode()
    assert code == 0, out
    assert "Traceback" not in out
    assert "tailing 'live'" in out and "Ctrl-C to stop" in out
    plain = _strip_ansi(out)
    rows = [line.split()[:2] for line in plain.splitlines() if line.strip()[:1].isdigit()]
    assert rows[:3] == [["0", "1"], ["1", "2"], ["2", "3"]], plain
    assert "3 epoch(s), 6 record(s)" in plain and "the stream ended" in plain
    assert "\x1b[" in out  # a terminal gets colours (stdout is not plain text here)
    assert "\r\n" in out  # written through the terminal's line discipline


def test_ctrl_c_in_a_terminal_exits_130(cat):
    with Publisher("live", catalog=cat) as pub:
        term = Terminal(_tail(cat), _env(TERM="dumb"))
        _wait_subscribed(pub)
        term.read_until(b"lag")
        pub.send(0, ["a"])
        pub.advance_to(1)
        term.read_until(rb"^\s+0\s+1\s")  # epoch 0's line
        os.write(term.master, b"\x03")  # Ctrl-C, typed
        code = term.finish()
    out = term.output.decode()
    assert code == 130, out
    assert "interrupted after 1 epoch(s)" in out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _publish_until_exit(pub: Publisher, proc: subprocess.Popen[bytes], start: int = 0,
                        limit: int = 2000) -> int:
    """Send one small epoch every 10 ms until ``proc`` exits (at most ``limit``)."""
    t = start
    while proc.poll() is None and t < limit:
        pub.send(t, [t])
        pub.advance_to(t + 1)
        t += 1
        time.sleep(0.01)
    return t


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--records"]])
def test_pipe_closed_by_reader_ends_quietly_with_0(cat, fmt):
    """``epochstream tail live | head -1``: after the first line the reader is gone; the next
    write fails with EPIPE and the tail ends at once, status 0, nothing on stderr but its
    header."""
    with Publisher("live", catalog=cat) as pub:
        proc = subprocess.Popen(_tail(cat, *fmt), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_env(TERM="xterm-256color"))
        try:
            _wait_subscribed(pub)
            errors: list[BaseException] = []
            sent = [0]

            def publish() -> None:
                try:
                    sent[0] = _publish_until_exit(pub, proc)
                except BaseException as e:  # reported below
                    errors.append(e)

            th = threading.Thread(target=publish, daemon=True)
            th.start()
            assert proc.stdout is not None and proc.stderr is not None
            first = proc.stdout.readline()
            proc.stdout.close()  # `head -1` exits
            code = proc.wait(20)
            th.join(20)
            err = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert errors == []
    assert code == 0, err
    assert sent[0] < 2000, "the tail did not notice the closed pipe"
    for bad in ("Traceback", "BrokenPipe", "Exception ignored", "error"):
        assert bad not in err, err
    assert b"\x1b[" not in first  # not a terminal: plain text, no colours
    if fmt == ["--json"]:
        assert set(json.loads(first)) == {"time", "records", "bytes", "lag"}
    else:
        assert first.split()[:2] == [b"0", b"1"]


def test_pipe_gets_plain_complete_output(cat):
    """Into a pipe read to the end: only data lines on stdout, no colours, whatever TERM says."""
    with Publisher("live", catalog=cat) as pub:
        proc = subprocess.Popen(_tail(cat, "--records"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_env(TERM="xterm-256color"))
        _wait_subscribed(pub)
        for t in range(2):
            pub.send(t, [f"r{t}"])
            pub.advance_to(t + 1)
        pub.close()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert b"\x1b[" not in out
    lines = out.decode().splitlines()
    assert [line.split()[:2] for line in lines[::2]] == [["0", "1"], ["1", "1"]]
    assert lines[1::2] == ['  "r0"', '  "r1"']
    assert b"2 epoch(s), 2 record(s)" in err


@pytest.mark.parametrize("quit_key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_top_live_view_refreshes_sorts_and_quits_cleanly(cat, tmp_path, quit_key):
    """``epochstream top`` in a real terminal: the live view shows the topic and follows its
    upper frontier, ``s`` cycles the sort, and ``q`` or Ctrl-C (through the line discipline)
    ends it with status 0, no traceback, the terminal's mode restored."""
    with Publisher("t", catalog=cat) as pub:
        pub.send(3, [1])
        pub.flush(5)
        term = Terminal([sys.executable, "-m", "epochstream", "top", "--catalog",
                         str(tmp_path / "cat.sqlite"), "--interval", "0.2"], _env())
        try:
            term.read_until(rb"sort: lag")
            term.read_until(rb"^\s*t\s+0\s+live\s.*\[3\]")
            pub.send(7, [1])
            term.read_until(rb"^\s*t\s+0\s+live\s.*\[7\]")  # refreshed
            os.write(term.master, b"s")
            term.read_until(rb"sort: name")
            os.write(term.master, quit_key)
            deadline = time.monotonic() + 15
            while term.proc.poll() is None and time.monotonic() < deadline:
                term._read(0.1)
            assert termios.tcgetattr(term.master)[3] & termios.ECHO  # cbreak undone: echo on
            assert term.finish() == 0, term.output
            assert b"Traceback" not in term.output
        finally:
            if term.proc.poll() is None:
                term.proc.kill()
                term.proc.wait()
