"""Tests of the ``epochstream`` command line (typer CliRunner and real subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from epochstream.catalog import Catalog
from epochstream.cli import app

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env=ENV)


@pytest.fixture
def cat(tmp_path) -> Catalog:
    return Catalog(tmp_path / "cat.sqlite")


def _cli_env(**extra) -> dict:
    env = dict(os.environ, **ENV, **extra)
    env.pop("EPOCHSTREAM_CATALOG", None)
    return env


def test_help_lists_commands(runner):
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("topics", "tail", "demo"):
        assert command in result.output


def test_topics_empty(runner, tmp_path):
    result = runner.invoke(app, ["topics", "--catalog", str(tmp_path / "empty")])
    assert result.exit_code == 0, result.output
    assert "no topics" in result.output
    assert (tmp_path / "empty" / "catalog.sqlite").is_file()


def test_topics_shows_every_partition_state(runner, cat):
    cat.create_topic("flights", order="product(2)", codec="arrow", partitions=4)
    cat.create_topic("airports")
    inc = cat.register_partition("flights", 0, "tcp://127.0.0.1:7000")
    cat.register_partition("flights", 1, "tcp://127.0.0.1:7001", incarnation="closing")
    cat.close_partition("flights", 1, "closing", upper=[(3, 4)])
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid no longer exists
    cat.register_partition("flights", 2, "tcp://127.0.0.1:7002", pid=proc.pid)
    # partition 3 is never registered

    result = runner.invoke(app, ["topics", "--catalog", str(cat.path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("airports") < out.index("flights")  # sorted by name
    for text in ("product(2)", "arrow", "total", "msgpack", "tcp://127.0.0.1:7000",
                 "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002", "unregistered"):
        assert text in out, text
    rows = {line.split("tcp://127.0.0.1:")[1][:4]: line for line in out.splitlines()
            if "tcp://127.0.0.1:" in line}
    assert "live" in rows["7000"] and str(os.getpid()) in rows["7000"]
    assert "closed" in rows["7001"]
    assert "dead" in rows["7002"]
    assert inc  # registered by this process


def test_topics_uses_env_catalog(tmp_path, cat):
    cat.create_topic("from-env")
    result = CliRunner(env={**ENV, "EPOCHSTREAM_CATALOG": str(cat.path)}).invoke(app, ["topics"])
    assert result.exit_code == 0, result.output
    assert "from-env" in result.output


def test_topics_reports_bad_catalog(runner, tmp_path):
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"garbage" * 500)
    result = runner.invoke(app, ["topics", "--catalog", str(bogus)])
    assert result.exit_code == 1
    assert "error" in result.stderr and "bogus.sqlite" in result.stderr


def test_tail_unknown_topic_lists_existing_and_exits_2(runner, cat):
    cat.create_topic("beta")
    cat.create_topic("alpha")
    t0 = time.monotonic()
    result = runner.invoke(app, ["tail", "gamma", "--catalog", str(cat.path), "--wait", "0.1"])
    assert time.monotonic() - t0 < 3
    assert result.exit_code == 2, result.output
    assert "unknown topic 'gamma'" in result.stderr
    assert "alpha, beta" in result.stderr


def test_tail_rejects_negative_wait(runner, cat):
    result = runner.invoke(app, ["tail", "t", "--catalog", str(cat.path), "--wait", "-1"])
    assert result.exit_code == 2


def test_demo_help_shows_options(runner):
    result = runner.invoke(app, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--days", "--host", "--catalog"):
        assert option in result.output


def test_module_runs_as_subprocess(cat):
    cat.create_topic("sub-topic", partitions=2)
    proc = subprocess.run([sys.executable, "-m", "epochstream.cli", "topics", "--catalog",
                           str(cat.path)], capture_output=True, text=True, env=_cli_env(),
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "sub-topic" in proc.stdout and "unregistered" in proc.stdout


def test_tail_ctrl_c_while_waiting_exits_130(cat):
    proc = subprocess.Popen([sys.executable, "-m", "epochstream.cli", "tail", "later", "--catalog",
                             str(cat.path), "--wait", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_cli_env())
    try:
        # the CLI says on stderr that it is waiting for the topic: then it is in the polling loop
        assert "waiting up to 30 s for topic 'later'" in proc.stderr.readline()
        time.sleep(0.1)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    assert "Traceback" not in err


# ---- tail against a live publisher (in-process Publisher, CLI through CliRunner) --------------


def _publish_when_subscribed(pub, epochs, then_close=True):
    """In a thread: wait for the tail's subscriber, send ``epochs`` ([(time, records)]), advance
    past them, and close (all partitions closed ends the tail)."""
    import threading

    errors = []

    def run():
        try:
            deadline = time.monotonic() + 10
            while pub.subscribers < 1:
                assert time.monotonic() < deadline, "tail never subscribed"
                time.sleep(0.01)
            for t, records in epochs:
                pub.send(t, records)
            if then_close:
                pub.close()
        except Exception as e:  # reported by the test
            errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, errors


def test_tail_prints_each_epoch_until_publishers_close(runner, cat):
    from epochstream.transport import Publisher

    pub = Publisher("live", catalog=cat)
    try:
        th, errors = _publish_when_subscribed(pub, [(0, [1, 2, 3]), (1, ["a"]), (4, [{"k": 1}] * 5)])
        result = runner.invoke(app, ["tail", "live", "--catalog", str(cat.path), "--wait", "5",
                                     "--timeout", "10"])
        th.join(10)
    finally:
        pub.close()
    assert errors == []
    assert result.exit_code == 0, (result.output, result.exception)
    lines = [line.split() for line in result.stdout.splitlines()]
    rows = [cols for cols in lines if len(cols) == 6 and cols[0].isdigit()]
    assert [(r[0], r[1]) for r in rows] == [("0", "3"), ("1", "1"), ("4", "5")]
    for r in rows:
        assert r[3] == "B" and int(r[2]) > 0  # payload bytes
        assert r[5] in ("ms", "s")  # lag shown with a unit
    assert "3 epoch(s), 9 record(s)" in result.stdout


def test_tail_max_epochs_and_product_times(runner, cat):
    from epochstream.transport import Publisher

    pub = Publisher("grid", order="product(2)", catalog=cat)
    try:
        th, errors = _publish_when_subscribed(pub, [((0, 1), [1]), ((2, 0), [2, 2])], then_close=False)
        # epochs complete only once the capability moves past them: do it once both are sent
        import threading

        def advance():
            th.join(10)
            pub.advance_to((3, 3))

        adv = threading.Thread(target=advance, daemon=True)
        adv.start()
        result = runner.invoke(app, ["tail", "grid", "--catalog", str(cat.path), "--wait", "5",
                                     "--max-epochs", "1", "--timeout", "10"])
        adv.join(10)
    finally:
        pub.close()
    assert errors == []
    assert result.exit_code == 0, (result.output, result.exception)
    assert "1 epoch(s)" in result.stdout
    assert ("(0, 1)" in result.stdout) != ("(2, 0)" in result.stdout)  # exactly one printed


def test_tail_reports_dead_publisher(runner, cat):
    cat.create_topic("orphan")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    cat.register_partition("orphan", 0, "tcp://127.0.0.1:9", pid=proc.pid)
    result = runner.invoke(app, ["tail", "orphan", "--catalog", str(cat.path), "--wait", "0.1"])
    assert result.exit_code == 1, result.output
    assert "dead" in result.stderr and "Traceback" not in result.output


def test_tail_timeout_without_epochs_exits_1(runner, cat):
    from epochstream.transport import Publisher

    with Publisher("quiet", catalog=cat) as pub:
        result = runner.invoke(app, ["tail", "quiet", "--catalog", str(cat.path), "--wait", "1",
                                     "--timeout", "0.3"])
        assert pub.incarnation
    assert result.exit_code == 1, result.output
    assert "TimeoutError" in result.stderr and "after 0 epoch(s)" in result.stderr
