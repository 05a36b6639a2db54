"""Tests of the ``epochstream`` command line (typer CliRunner and real subprocesses), the demo's
command-line facing parts (catalog choice, pacing, the ready-to-paste tail line, keeping the
JVM's output off the terminal), packaging metadata and the typed public API (mypy --strict).

``tests/test_cli_pty.py`` drives ``tail`` through a real pseudo-terminal and a closed pipe."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from epochstream.catalog import Catalog, PartitionInfo, TopicInfo
from epochstream.cli import app

ROOT = Path(__file__).resolve().parent.parent
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={**ENV, "EPOCHSTREAM_CATALOG": None})


@pytest.fixture
def cat(tmp_path) -> Catalog:
    return Catalog(tmp_path / "cat.sqlite")


def _cli_env(**extra) -> dict:
    env = dict(os.environ, **ENV, **extra)
    env.pop("EPOCHSTREAM_CATALOG", None)
    return env


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid no longer exists
    return proc.pid


def _closed_topic(cat: Catalog, topic: str, partitions: int = 1) -> list[str]:
    """A topic an earlier run left behind: every partition published epoch 0 and closed."""
    from epochstream.transport import Publisher

    incarnations = []
    for p in range(partitions):
        with Publisher(topic, p, partitions=partitions, catalog=cat) as pub:
            pub.send(0, [p])
            pub.advance_to(1)
            incarnations.append(pub.incarnation)
    return incarnations


# ---- help, version, entry points ----------------------------------------------------------------


def test_help_lists_commands_and_exit_statuses(runner):
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("topics", "tail", "drop", "demo", "--version"):
        assert command in result.output
    for code, meaning in (("0", "stream ended"), ("1", "lost"), ("2", "unknown topic"),
                          ("130", "interrupted")):
        assert re.search(rf"^\s+{code}\s+.*{meaning}", result.output, re.M), (code, result.output)


@pytest.mark.parametrize("command", [[], ["topics"], ["tail"], ["drop"], ["demo"]])
def test_help_renders_cleanly_at_80_columns(command):
    result = CliRunner(env={**ENV, "COLUMNS": "80"}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert not re.search(r"<(bool|str|int|float|text|integer|path)[^>]*>", text), text
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    usage, rest = text.split("\n", 1)
    assert usage.startswith("Usage: ")
    # no short help cut off in the command list ("List the catalog's topics and its...")
    assert not re.search(r"\w\.\.\.$", rest, re.M), text
    # the description's paragraphs are re-flowed, never broken mid-sentence: every line of a
    # paragraph but the last is full (the next word would not have fitted in 78 columns)
    description = rest.split("Options:")[0]
    paragraphs = [p for p in re.split(r"\n\s*\n", description) if p.strip()]
    assert paragraphs, text
    for para in paragraphs:
        lines = para.strip("\n").splitlines()
        for line, nxt in zip(lines, lines[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > 78, (line, nxt, text)


def test_help_sources_have_no_hard_line_breaks():
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert command.help and not re.search(r"[^\n]\n[^\n]", command.help), name
        for param in command.params:
            assert "\n" not in (getattr(param, "help", None) or ""), (name, param.name)


def test_tail_help_documents_exit_statuses(runner):
    out = runner.invoke(app, ["tail", "--help"]).output
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^\s+{code}\s+\w", out, re.M), code
    for option in ("--records", "--json", "--wait", "--max-epochs", "--timeout", "--catalog"):
        assert option in out


def test_version(runner):
    from epochstream import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"epochstream {__version__}"


def test_python_dash_m_epochstream(cat):
    cat.create_topic("via-m", partitions=2)
    proc = subprocess.run([sys.executable, "-m", "epochstream", "topics", "--catalog",
                           str(cat.path)], capture_output=True, text=True, env=_cli_env(),
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "via-m" in proc.stdout and "unregistered" in proc.stdout
    version = subprocess.run([sys.executable, "-m", "epochstream", "--version"],
                             capture_output=True, text=True, env=_cli_env(), timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("epochstream ")
    assert "Usage: epochstream" in subprocess.run(
        [sys.executable, "-m", "epochstream", "--help"], capture_output=True, text=True,
        env=_cli_env(), timeout=30).stdout


def test_module_runs_as_subprocess(cat):
    cat.create_topic("sub-topic", partitions=2)
    proc = subprocess.run([sys.executable, "-m", "epochstream.cli", "topics", "--catalog",
                           str(cat.path)], capture_output=True, text=True, env=_cli_env(),
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "sub-topic" in proc.stdout and "unregistered" in proc.stdout


# ---- the catalog: never created by a reading command ---------------------------------------------


def test_topics_empty_catalog(runner, cat):
    result = runner.invoke(app, ["topics", "--catalog", str(cat.path)])
    assert result.exit_code == 0, result.output
    assert "no topics" in result.output


@pytest.mark.parametrize("command", [["topics"], ["tail", "t"], ["drop", "t"]])
def test_missing_catalog_path_is_refused_not_created(runner, tmp_path, command):
    missing = tmp_path / "nope"
    result = runner.invoke(app, [*command, "--catalog", str(missing)])
    assert result.exit_code == 2, result.output
    assert f"no catalog at {missing}" in result.stderr and "--catalog" in result.stderr
    assert "does not exist" in result.stderr
    assert not missing.exists()
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    result = runner.invoke(app, [*command, "--catalog", str(empty_dir)])
    assert result.exit_code == 2
    assert "has no catalog.sqlite" in result.stderr
    assert list(empty_dir.iterdir()) == []


def test_missing_default_and_env_catalogs_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner(env={**ENV, "EPOCHSTREAM_CATALOG": None}).invoke(app, ["topics"])
    assert result.exit_code == 2
    assert "./.epochstream/catalog.sqlite in the current directory" in result.stderr
    assert not (tmp_path / ".epochstream").exists()
    env_path = tmp_path / "env-cat"
    result = CliRunner(env={**ENV, "EPOCHSTREAM_CATALOG": str(env_path)}).invoke(
        app, ["tail", "x"])
    assert result.exit_code == 2
    assert "$EPOCHSTREAM_CATALOG" in result.stderr and not env_path.exists()


def test_topics_shows_every_partition_state(runner, cat):
    from epochstream.transport import Publisher

    cat.create_topic("flights", order="product(2)", codec="arrow", partitions=5)
    cat.create_topic("airports")
    inc = cat.register_partition("flights", 0, "tcp://127.0.0.1:7000")
    cat.register_partition("flights", 1, "tcp://127.0.0.1:7001", incarnation="closing")
    cat.close_partition("flights", 1, "closing", upper=[(3, 4)])
    cat.register_partition("flights", 2, "tcp://127.0.0.1:7002", pid=_dead_pid())
    cat.register_partition("flights", 3, "tcp://127.0.0.1:7003", incarnation="failing")
    cat.close_partition("flights", 3, "failing", upper=[(1, 1)], aborted=True)
    # partition 4 is never registered
    pub = Publisher("broken", catalog=cat)
    pub.abort("boom")

    result = runner.invoke(app, ["topics", "--catalog", str(cat.path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("airports") < out.index("broken") < out.index("flights")  # sorted by name
    for text in ("product(2)", "arrow", "total", "msgpack", "unregistered"):
        assert text in out, text
    rows = {line.split("tcp://127.0.0.1:")[1][:4]: line for line in out.splitlines()
            if "tcp://127.0.0.1:" in line}
    assert "live" in rows["7000"] and str(os.getpid()) in rows["7000"]
    assert "closed" in rows["7001"]
    assert "dead" in rows["7002"]
    assert "aborted" in rows["7003"]
    broken = next(line for line in out.splitlines() if line.strip("│ ").startswith("broken"))
    assert "aborted" in broken
    assert inc  # registered by this process


def test_topics_table_styles_every_state():
    from rich.console import Console

    from epochstream._cli.topics import topics_table as _topics_table

    parts = tuple(PartitionInfo(i, f"tcp://h:{i}", None, state, "inc", 1, (), 0.0)
                  for i, state in enumerate(["live", "closed", "aborted", "dead", "[weird]"]))
    info = TopicInfo("t", "total", "msgpack", 6, None, parts)
    console = Console(file=io.StringIO(), record=True, width=200, force_terminal=True,
                      color_system="standard")
    console.print(_topics_table([info]))
    text = console.export_text(clear=False)
    for state in ("live", "closed", "aborted", "dead", "unregistered", "[weird]"):
        assert state in text, state
    styled = console.export_text(styles=True)
    assert "\x1b[35maborted" in styled  # magenta, like the other states in a colour of its own


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


# ---- tail: unknown, closed, dead, aborted topics -----------------------------------------------


def test_tail_unknown_topic_names_the_catalog_and_exits_2(runner, cat):
    cat.create_topic("beta")
    cat.create_topic("alpha")
    t0 = time.monotonic()
    result = runner.invoke(app, ["tail", "gamma", "--catalog", str(cat.path)])
    assert time.monotonic() - t0 < 3
    assert result.exit_code == 2, result.output
    assert f"unknown topic 'gamma' in catalog {cat.path}" in result.stderr
    assert "alpha, beta" in result.stderr
    assert "--catalog PATH" in result.stderr and "--wait SECONDS" in result.stderr
    waited = runner.invoke(app, ["tail", "gamma", "--catalog", str(cat.path), "--wait", "0.2"])
    assert waited.exit_code == 2 and "waited 0.2 s" in waited.stderr


def test_tail_rejects_negative_wait(runner, cat):
    result = runner.invoke(app, ["tail", "t", "--catalog", str(cat.path), "--wait", "-1"])
    assert result.exit_code == 2


def test_tail_closed_topic_says_so_and_exits_2(runner, cat):
    _closed_topic(cat, "done", partitions=2)
    t0 = time.monotonic()
    result = runner.invoke(app, ["tail", "done", "--catalog", str(cat.path)])
    assert time.monotonic() - t0 < 3
    assert result.exit_code == 2, (result.output, result.exception)
    line = result.stderr.splitlines()[0]
    assert re.fullmatch(rf"error: topic 'done' is closed \(publisher pid {os.getpid()} of "
                        r"partitions 0, 1 ended at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)", line), line
    assert "--wait" in result.stderr
    assert result.stdout == "" and "epoch(s)" not in result.stderr


def test_tail_closed_topic_with_wait_gives_up_after_wait(runner, cat):
    _closed_topic(cat, "done")
    t0 = time.monotonic()
    result = runner.invoke(app, ["tail", "done", "--catalog", str(cat.path), "--wait", "0.5"])
    assert 0.4 < time.monotonic() - t0 < 4
    assert result.exit_code == 2
    assert "waiting up to 0.5 s for a new publisher" in result.stderr
    assert "no new publisher within 0.5 s" in result.stderr


def test_tail_closed_topic_with_wait_attaches_to_the_next_run(runner, cat):
    from epochstream.transport import Publisher

    _closed_topic(cat, "again")
    errors: list[BaseException] = []

    def next_run() -> None:
        try:
            time.sleep(0.5)  # the tail is waiting by then
            with Publisher("again", catalog=cat) as pub:
                deadline = time.monotonic() + 10
                while pub.subscribers < 1:
                    assert time.monotonic() < deadline, "tail never subscribed"
                    time.sleep(0.01)
                pub.send(0, ["x", "y"])
                pub.send(1, ["z"])
        except BaseException as e:  # reported by the test
            errors.append(e)

    th = threading.Thread(target=next_run, daemon=True)
    th.start()
    result = runner.invoke(app, ["tail", "again", "--catalog", str(cat.path), "--wait", "10",
                                 "--timeout", "10"])
    th.join(10)
    assert errors == []
    assert result.exit_code == 0, (result.output, result.exception)
    assert "is closed" in result.stderr
    assert "waiting up to 10 s for a new publisher" in result.stderr
    rows = [line.split()[:2] for line in result.stdout.splitlines()]
    assert rows == [["0", "2"], ["1", "1"]]


def test_tail_waits_for_every_partition_of_a_closed_topic_to_restart(runner, cat):
    """A new run of partition 0 alone is not enough: partition 1 is still the old, closed one
    (its final frontier would filter the new run's epochs)."""
    _closed_topic(cat, "pair", partitions=2)
    timer = threading.Timer(0.2, cat.register_partition, ("pair", 0, "tcp://127.0.0.1:9"))
    timer.start()
    result = runner.invoke(app, ["tail", "pair", "--catalog", str(cat.path), "--wait", "0.8"])
    timer.join()
    assert result.exit_code == 2, result.output
    assert (f"topic 'pair' is only partly restarted (publisher pid {os.getpid()} of partition 1 "
            f"ended at") in result.stderr
    assert "no new publisher within 0.8 s" in result.stderr


def test_tail_reports_dead_publisher(runner, cat):
    cat.create_topic("orphan")
    pid = _dead_pid()
    cat.register_partition("orphan", 0, "tcp://127.0.0.1:9", pid=pid)
    result = runner.invoke(app, ["tail", "orphan", "--catalog", str(cat.path), "--wait", "0.1"])
    assert result.exit_code == 1, result.output
    assert f"topic 'orphan' is dead (publisher pid {pid} exited without closing it" in result.stderr
    assert "Traceback" not in result.output


def test_tail_reports_aborted_publisher(runner, cat):
    from epochstream.transport import Publisher

    pub = Publisher("crashed", catalog=cat)
    pub.send(0, [1])
    pub.abort("ValueError: bad row")
    result = runner.invoke(app, ["tail", "crashed", "--catalog", str(cat.path)])
    assert result.exit_code == 1, result.output
    assert re.search(rf"topic 'crashed' is aborted \(publisher pid {os.getpid()} aborted at "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d; its open epochs never complete\)",
                     result.stderr), result.stderr


def test_tail_unregistered_partition_exits_1(runner, cat):
    cat.create_topic("half", partitions=2)
    cat.register_partition("half", 0, "tcp://127.0.0.1:9")
    result = runner.invoke(app, ["tail", "half", "--catalog", str(cat.path)])
    assert result.exit_code == 1
    assert "partition(s) 1 of 2 not registered" in result.stderr


def test_tail_ctrl_c_while_waiting_exits_130(cat):
    proc = subprocess.Popen([sys.executable, "-m", "epochstream", "tail", "later", "--catalog",
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


def _tail_live(runner, cat, epochs, *args, topic="live", order="total"):
    from epochstream.transport import Publisher

    pub = Publisher(topic, order=order, catalog=cat)
    try:
        th, errors = _publish_when_subscribed(pub, epochs)
        result = runner.invoke(app, ["tail", topic, "--catalog", str(cat.path), "--wait", "5",
                                     "--timeout", "10", *args])
        th.join(10)
    finally:
        pub.close()
    assert errors == []
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def test_tail_prints_each_epoch_until_publishers_close(runner, cat):
    result = _tail_live(runner, cat, [(0, [1, 2, 3]), (1, ["a"]), (4, [{"k": 1}] * 5)])
    lines = [line.split() for line in result.stdout.splitlines()]
    assert all(len(cols) == 6 and cols[0].isdigit() for cols in lines), result.stdout  # data only
    assert [(r[0], r[1]) for r in lines] == [("0", "3"), ("1", "1"), ("4", "5")]
    for r in lines:
        assert r[3] == "B" and int(r[2]) > 0  # payload bytes
        assert r[5] in ("ms", "s")  # lag shown with a unit
    assert "\x1b[" not in result.stdout  # not a terminal: plain text
    # headers and the summary: stderr
    assert "tailing 'live'" in result.stderr and "records" in result.stderr
    assert "3 epoch(s), 9 record(s)" in result.stderr
    assert "the stream ended (every partition closed)" in result.stderr


def test_tail_records_prints_each_record(runner, cat):
    result = _tail_live(runner, cat, [(0, [1, {"k": "v"}]), (1, ["a b"])], "--records")
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["0", "2"]
    assert lines[1:3] == ["  1", '  {"k": "v"}']
    assert lines[3].split()[:2] == ["1", "1"]
    assert lines[4] == '  "a b"'
    assert len(lines) == 5


def test_tail_json_lines_per_epoch(runner, cat):
    result = _tail_live(runner, cat, [((0, 1), [1, 2]), ((1, 0), ["x"])], "--json",
                        topic="grid", order="product(2)")
    objs = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(o["time"] for o in objs) == [[0, 1], [1, 0]]
    for o in objs:
        assert set(o) == {"time", "records", "bytes", "lag"}
        assert o["records"] == (2 if o["time"] == [0, 1] else 1)
        assert o["bytes"] > 0 and o["lag"] >= 0
    assert "time" not in result.stderr.split("tailing")[0]  # no column header with --json
    assert "2 epoch(s), 3 record(s)" in result.stderr


def test_tail_json_records_one_object_per_record(runner, cat):
    result = _tail_live(runner, cat, [(0, [{"a": 1}, {"a": 2}]), (3, [[1, 2]])],
                        "--json", "--records")
    objs = [json.loads(line) for line in result.stdout.splitlines()]
    assert objs == [{"time": 0, "record": {"a": 1}}, {"time": 0, "record": {"a": 2}},
                    {"time": 3, "record": [1, 2]}]


def test_json_handles_arrow_tables_and_odd_values():
    import datetime

    import pyarrow as pa

    from epochstream._cli.tail_output import dumps as _dumps, rows as _rows

    table = pa.table({"d": [datetime.date(2013, 1, 2)], "b": [b"\x00hi"], "n": [None]})
    rows = [json.loads(_dumps(r)) for r in _rows(table)]
    assert rows == [{"d": "2013-01-02", "b": "\x00hi", "n": None}]
    assert json.loads(_dumps({1, 2})) == [1, 2]


def test_tail_max_epochs_and_product_times(runner, cat):
    from epochstream.transport import Publisher

    pub = Publisher("grid", order="product(2)", catalog=cat)
    try:
        th, errors = _publish_when_subscribed(pub, [((0, 1), [1]), ((2, 0), [2, 2])],
                                              then_close=False)

        # epochs complete only once the capability moves past them: do it once both are sent
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
    assert "1 epoch(s)" in result.stderr and "stopped after --max-epochs 1" in result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert ("(0, 1)" in result.stdout) != ("(2, 0)" in result.stdout)  # exactly one printed


def test_tail_timeout_without_epochs_exits_1(runner, cat):
    from epochstream.transport import Publisher

    with Publisher("quiet", catalog=cat) as pub:
        result = runner.invoke(app, ["tail", "quiet", "--catalog", str(cat.path), "--wait", "1",
                                     "--timeout", "0.3"])
        assert pub.incarnation
    assert result.exit_code == 1, result.output
    assert "TimeoutError" in result.stderr and "after 0 epoch(s)" in result.stderr


def test_tail_publisher_aborting_mid_stream_exits_1(runner, cat):
    from epochstream.transport import Publisher

    pub = Publisher("mid", catalog=cat)
    errors = []

    def run():
        try:
            deadline = time.monotonic() + 10
            while pub.subscribers < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            pub.send(0, [1])
            pub.advance_to(1)
            pub.send(1, [2])
            pub.abort("RuntimeError: upstream died")
        except Exception as e:  # reported by the test
            errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    result = runner.invoke(app, ["tail", "mid", "--catalog", str(cat.path), "--timeout", "10"])
    th.join(10)
    assert errors == []
    assert result.exit_code == 1, result.output
    assert result.stdout.split()[:2] == ["0", "1"]  # the complete epoch, not the aborted one
    assert "PublisherAborted" in result.stderr and "after 1 epoch(s)" in result.stderr


# ---- drop -------------------------------------------------------------------------------------


def test_drop_closed_topic(runner, cat):
    _closed_topic(cat, "old")
    cat.create_topic("keep")
    result = runner.invoke(app, ["drop", "old", "--catalog", str(cat.path)])
    assert result.exit_code == 0, result.output
    assert f"dropped topic 'old' (1 partition(s)) from catalog {cat.path}" in result.stdout
    assert [t.name for t in cat.topics()] == ["keep"]


def test_drop_unknown_topic_exits_2(runner, cat):
    cat.create_topic("keep")
    result = runner.invoke(app, ["drop", "nope", "--catalog", str(cat.path)])
    assert result.exit_code == 2
    assert "unknown topic 'nope'" in result.stderr and "keep" in result.stderr


def test_drop_refuses_a_live_topic_unless_forced(runner, cat):
    from epochstream.transport import Publisher

    with Publisher("busy", catalog=cat):
        result = runner.invoke(app, ["drop", "busy", "--catalog", str(cat.path)])
        assert result.exit_code == 1, result.output
        assert f"topic 'busy' has a live publisher (publisher pid {os.getpid()})" in result.stderr
        assert "--force" in result.stderr
        assert cat.lookup("busy").name == "busy"
        forced = runner.invoke(app, ["drop", "busy", "--catalog", str(cat.path), "--force"])
        assert forced.exit_code == 0, forced.output
        assert [t.name for t in cat.topics()] == []


# ---- demo -------------------------------------------------------------------------------------


def test_demo_help_shows_options(runner):
    result = runner.invoke(app, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--days", "--pace", "--host", "--catalog", "--dashboard", "--no-dashboard"):
        assert option in result.output
    assert "temporary" not in result.output  # the catalog is the usual one


def test_demo_command_passes_its_options(runner, monkeypatch):
    import epochstream.demo

    calls = []

    def fake_main(**kwargs):
        calls.append(kwargs)
        return 1

    monkeypatch.setattr(epochstream.demo, "main", fake_main)
    result = runner.invoke(app, ["demo", "--days", "3", "--pace", "0.5", "-c", "somewhere"])
    assert result.exit_code == 1
    assert calls == [{"days": 3, "host": "127.0.0.1", "catalog": "somewhere", "pace": 0.5,
                      "days_per_batch": 30, "watermark": False,  # 30 days per batch
                      "dashboard": "tcp://127.0.0.1:8080"}]  # on by default in the demo
    calls.clear()
    runner.invoke(app, ["demo", "--days-per-batch", "7"])
    assert calls[0]["days_per_batch"] == 7
    calls.clear()
    runner.invoke(app, ["demo", "--one-batch-per-day"])
    assert calls[0]["days_per_batch"] is None
    calls.clear()
    runner.invoke(app, ["demo", "--watermark"])
    assert calls[0]["watermark"] is True
    assert runner.invoke(app, ["demo", "--pace", "-1"]).exit_code == 2
    result = runner.invoke(app, ["demo", "--days", "2", "--master", "spark://h:7077",
                                 "-c", "tcp://h:7420", "--no-dashboard"])
    assert result.exit_code == 1
    assert calls[-1] == {"days": 2, "host": "127.0.0.1", "catalog": "tcp://h:7420", "pace": 0.0,
                         "master": "spark://h:7077", "dashboard": None, "days_per_batch": 30,
                         "watermark": False}
    runner.invoke(app, ["demo", "--dashboard-bind", "tcp://0.0.0.0:9000"])
    assert calls[-1]["dashboard"] == "tcp://0.0.0.0:9000"


class _FakeHost:
    """Stands in for SparkPublisherHost: completes epoch 0 on both partitions (as the ingest
    threads would), then refuses to start as if another demo held the topic."""

    calls: list = []

    def __init__(self, topic, *, partitions, catalog, host, schema, on_published):
        self.catalog = catalog
        self.on_published = on_published

    def start(self):
        from epochstream.errors import PartitionHeld
        from epochstream.spark import IngestError

        for p in (0, 1):
            t0 = time.monotonic()
            self.on_published(p, 0, 10)
            _FakeHost.calls.append((p, time.monotonic() - t0))
        try:
            raise PartitionHeld("partition 0 of topic 'flights' is held by a live publisher")
        except PartitionHeld as e:
            raise IngestError("partition 0 of topic 'flights' failed to start") from e


@pytest.fixture
def demo_env(monkeypatch, tmp_path):
    """The demo without its data preparation, in a fresh directory, without a catalog variable;
    its temporary directory goes to tmp_path/tmp."""
    pytest.importorskip("pyspark")
    from epochstream._demo import flights

    days = flights.DayFiles(str(tmp_path / "days"), 2, 2, ("2013-01-01", "2013-01-02"), (1, 2))
    monkeypatch.setattr(flights, "day_files", lambda n: days)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


@pytest.fixture
def fake_demo(demo_env, monkeypatch):
    import epochstream.spark

    monkeypatch.setattr(epochstream.spark, "SparkPublisherHost", _FakeHost)
    _FakeHost.calls = []
    return demo_env


def test_demo_uses_the_default_catalog_and_explains_a_held_topic(fake_demo, capsys):
    from epochstream.demo import main

    assert main(days=2) == 1
    out = capsys.readouterr().out
    assert (fake_demo / ".epochstream" / "catalog.sqlite").is_file()  # not a temporary one
    assert f"catalog {fake_demo / '.epochstream' / 'catalog.sqlite'}" in out.replace("\n", "")
    assert "another run of the demo is publishing it" in out
    # its temporary directory (checkpoint, Spark's output) is removed
    assert list((fake_demo / "tmp").iterdir()) == []


def test_demo_explains_a_conflicting_topic(demo_env, capsys):
    from epochstream.demo import main

    Catalog(demo_env / ".epochstream").create_topic("flights", codec="msgpack")
    assert main(days=2) == 1
    out = capsys.readouterr().out.replace("\n", "")
    assert "cannot publish topic 'flights'" in out and "different definition" in out
    assert "drop flights'" in out  # the way out: epochstream drop flights


def test_demo_uses_env_catalog(fake_demo, monkeypatch):
    from epochstream.demo import main

    monkeypatch.setenv("EPOCHSTREAM_CATALOG", str(fake_demo / "env-cat"))
    assert main(days=2) == 1
    assert (fake_demo / "env-cat" / "catalog.sqlite").is_file()
    assert not (fake_demo / ".epochstream").exists()


def test_demo_pace_sleeps_once_per_complete_epoch(fake_demo):
    from epochstream.demo import main

    assert main(days=2, pace=0.4) == 1
    (p0, first), (p1, last) = _FakeHost.calls
    assert (p0, p1) == (0, 1)
    assert first < 0.2  # epoch 0 not complete everywhere yet: no pause
    assert 0.35 < last < 2  # complete on both partitions: one pause of --pace seconds
    _FakeHost.calls = []
    assert main(days=2) == 1
    assert all(took < 0.2 for _, took in _FakeHost.calls)


def test_demo_counts_connected_subscribers(cat):
    """The live display's subscriber count (and so the 'a subscriber joined' lines) comes from
    the host's publishers: a real SparkPublisherHost (no JVM needed) and real subscribers."""
    pytest.importorskip("pyspark")
    from epochstream._demo.display import connected as _connected
    from epochstream.spark import SparkPublisherHost
    from epochstream.transport import Subscriber

    with SparkPublisherHost("counted", partitions=2, catalog=cat) as h:
        assert _connected(h) == 0
        with Subscriber("counted", catalog=cat) as sub:
            assert sub.wait_ready(10)
            deadline = time.monotonic() + 10
            while _connected(h) != 1:
                assert time.monotonic() < deadline, _connected(h)
                time.sleep(0.02)
        deadline = time.monotonic() + 10
        while _connected(h) != 0:  # it said goodbye
            assert time.monotonic() < deadline, _connected(h)
            time.sleep(0.02)


def test_demo_tail_command(tmp_path, monkeypatch):
    from epochstream.demo import tail_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EPOCHSTREAM_CATALOG", raising=False)
    default = tmp_path / ".epochstream" / "catalog.sqlite"
    cmd = tail_command(default)
    assert cmd.endswith(" tail flights") and "--catalog" not in cmd
    assert cmd.split(" tail ")[0] in ("epochstream",
                                      str(Path(sys.executable).parent / "epochstream"))
    other = tail_command(tmp_path / "my cat" / "catalog.sqlite")
    assert other.endswith(f" tail flights --catalog '{tmp_path}/my cat/catalog.sqlite'")
    monkeypatch.setenv("EPOCHSTREAM_CATALOG", str(default))
    assert "--catalog" in tail_command(default)  # the other terminal may not have the variable
    # pasted as printed, it runs (here: --help, to stay quick)
    proc = subprocess.run(f"{cmd} --help", shell=True, capture_output=True, text=True,
                          env=_cli_env(PATH=os.environ.get("PATH", "")), timeout=30)
    assert proc.returncode == 0 and "Usage:" in proc.stdout, proc.stderr


def test_demo_sends_the_jvm_output_to_a_file(tmp_path, capfd):
    from epochstream._demo.terminal import fd2_to as _fd2_to

    log = tmp_path / "spark.log"
    with _fd2_to(log):
        # a child process (like the JVM pyspark starts) inherits file descriptor 2
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('WARN noise\\n')"],
                       check=True)
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('after\\n')"], check=True)
    assert log.read_text() == "WARN noise\n"
    err = capfd.readouterr().err
    assert "WARN noise" not in err and "after" in err


# ---- docs/index.md: its first publisher and subscriber run as written ---------------------------


def _doc_program(name: str, doc: str = "docs/index.md") -> str:
    """The python block that follows the paragraph starting with `name` in ``doc``."""
    text = (ROOT / doc).read_text()
    m = re.search(rf"^`{re.escape(name)}`[^\n]*\n(?:[^\n]+\n)*\n```python\n(.*?)```", text, re.S | re.M)
    assert m, f"no python block after `{name}` in {doc}"
    return m.group(1)


def test_getting_started_programs_are_the_same_in_readme_and_docs_index():
    """docs/index.md shows the README's publish.py and subscribe.py; the run below runs the
    README's (so a change to one must be made to both, or this test runs both)."""
    for name in ("publish.py", "subscribe.py"):
        assert _doc_program(name, "docs/index.md") == _doc_program(name, "README.md"), name


def test_getting_started_programs_run_as_written_in_either_order(tmp_path, doc="README.md"):
    """publish.py and subscribe.py from the README and docs/index.md, as two processes in the
    same directory (the default catalog): subscriber first, and publisher first (both scenarios
    at once); then a subscriber after the publisher finished, and a second run of the
    publisher, which goes on after the logged epochs. With retention and start="earliest"
    every subscriber prints every epoch, whichever side started first."""
    runs = {}
    for order in ("subscriber-first", "publisher-first"):
        d = tmp_path / order
        d.mkdir()
        (d / "publish.py").write_text(_doc_program("publish.py", doc))
        (d / "subscribe.py").write_text(_doc_program("subscribe.py", doc))
        runs[order] = d

    def start(d: Path, script: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, script], cwd=d, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_cli_env())

    sub_first = start(runs["subscriber-first"], "subscribe.py")
    pub_second = None
    pub_first = start(runs["publisher-first"], "publish.py")
    sub_second = None
    procs = [sub_first, pub_first]
    try:
        time.sleep(0.5)  # the first subscriber is waiting for its topic by now
        pub_second = start(runs["subscriber-first"], "publish.py")
        procs.append(pub_second)
        cat = runs["publisher-first"] / ".epochstream" / "catalog.sqlite"
        deadline = time.monotonic() + 20
        while not (cat.is_file() and any(p.alive for t in Catalog(cat).topics()
                                         for p in t.partition_info)):
            assert time.monotonic() < deadline and pub_first.poll() is None, "no publisher"
            time.sleep(0.05)
        sub_second = start(runs["publisher-first"], "subscribe.py")
        procs.append(sub_second)
        results = {id(p): p.communicate(timeout=40) for p in procs}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p in procs:
        assert p.returncode == 0, results[id(p)]

    def check(out: str, epochs: int) -> None:
        lines = out.splitlines()
        times = [int(line.split()[0]) for line in lines]
        assert times == list(range(epochs)), out  # every epoch, once, in order
        for t, line in zip(times, lines):
            assert line == (f"{t} 2 [{{'sym': 'ABC', 'px': {10.0 + t}}}, "
                            f"{{'sym': 'XYZ', 'px': 3.25}}]"), line

    for sub in (sub_first, sub_second):
        check(results[id(sub)][0], 10)
    d = runs["publisher-first"]

    def run(script: str) -> str:
        proc = subprocess.run([sys.executable, script], cwd=d, capture_output=True, text=True,
                              env=_cli_env(), timeout=60)
        assert proc.returncode == 0, (script, proc.stdout, proc.stderr)
        return proc.stdout

    check(run("subscribe.py"), 10)  # after the publisher finished: replayed from its log
    assert run("publish.py") == ""  # a second run goes on at epoch 10
    check(run("subscribe.py"), 20)


# ---- packaging and typing -----------------------------------------------------------------------


def test_pyproject_license_is_spdx_and_py_typed_ships():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert not any("License ::" in c for c in meta["project"].get("classifiers", []))
    requires = meta["build-system"]["requires"]
    m = re.fullmatch(r"setuptools>=(\d+)", requires[0])
    assert m and int(m.group(1)) >= 77, requires  # SPDX license strings need setuptools 77
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["epochstream"]
    assert (ROOT / "epochstream" / "py.typed").is_file()
    assert any(dep.startswith("mypy") for dep in meta["project"]["optional-dependencies"]["test"])


_PROBE = """\
from epochstream import Catalog, Epoch, Publisher, Subscriber
n: int = Publisher
m: int = Subscriber
c: int = Catalog
e: int = Epoch
"""


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> list[str]:
    """One ``mypy --strict`` run over the typed usage file, the CLI/demo, examples/ and a probe of
    the top-level names; epochstream's own modules are read for their signatures but not
    reported on."""
    pytest.importorskip("mypy")
    probe = tmp_path_factory.mktemp("probe") / "toplevel_probe.py"
    probe.write_text(_PROBE)
    files = ["tests/typed_usage.py", "epochstream/cli.py", "epochstream/demo.py",
             "epochstream/__main__.py", "epochstream/_cli", "epochstream/_demo", "examples",
             str(probe)]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(tmp_path_factory.mktemp("mypy-cache")), "--no-error-summary",
         "--hide-error-context", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "MYPYPATH": str(ROOT)})
    assert proc.returncode in (0, 1), proc.stderr  # 2: mypy itself failed
    return [line for line in proc.stdout.splitlines() if ": error:" in line]


def test_typed_usage_and_cli_pass_mypy_strict(mypy_errors):
    ours = [e for e in mypy_errors if e.startswith(("tests/", "epochstream/"))]
    assert ours == [], "\n".join(ours)


def test_top_level_names_are_typed(mypy_errors):
    """What the README writes, ``from epochstream import Publisher, ...``, must carry the real
    types: assigning the classes to an ``int`` has to be an error, not silently ``Any``."""
    flagged = {int(e.split(":")[1]) for e in mypy_errors if "toplevel_probe.py" in e}
    assert flagged == {2, 3, 4, 5}, mypy_errors


def test_examples_pass_mypy_strict(mypy_errors):
    ex = [e for e in mypy_errors if e.startswith("examples")]
    assert ex == [], "\n".join(ex)


def test_typed_usage_runs():
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "typed_usage.py")],
                          capture_output=True, text=True, timeout=60, env=_cli_env())
    assert proc.returncode == 0, proc.stderr
    assert "typed usage ok" in proc.stdout


def test_catalog_init_and_migrate_on_postgresql_and_sqlite(runner, pg_url, tmp_path):
    """``epochstream catalog init|migrate LOCATION`` on both stores: migrate refuses to create,
    init creates (then reports it current), an older PostgreSQL catalog (schema 6, before runs)
    is migrated in place keeping its rows, a newer one is refused in one line, and locations
    that are not a catalog's are usage errors. The password never appears in the output."""
    from epochstream.catalog import SCHEMA_VERSION
    import psycopg

    def cli(*args):
        r = runner.invoke(app, ["catalog", *args])
        return r.exit_code, " ".join((r.stdout + (r.stderr or "")).split())

    code, text = cli("migrate", pg_url)
    assert code == 2 and "nothing to migrate" in text, text
    code, text = cli("init", pg_url)
    assert code == 0 and f"schema version {SCHEMA_VERSION} (created)" in text, text
    assert ":epochstream@" not in text and ":***@" in text, text
    assert cli("init", pg_url)[1].endswith("(already current)")
    cat = Catalog(pg_url)
    cat.create_topic("t", partitions=2)
    cat.register_partition("t", 0, "tcp://127.0.0.1:1")
    cat.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as schema version 6 left it
        conn.execute("ALTER TABLE partitions DROP COLUMN run")
        conn.execute("UPDATE epochstream_schema SET version = 6")
    code, text = cli("migrate", pg_url)
    assert code == 0 and f"schema version {SCHEMA_VERSION} (migrated from version 6)" in text
    info = Catalog(pg_url).lookup("t")
    assert (info.partitions, [(p.index, p.run) for p in info.partition_info]) == (2, [(0, 1)])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE epochstream_schema SET version = %s", (SCHEMA_VERSION + 1,))
    code, text = cli("migrate", pg_url)
    assert code == 1 and f"schema version {SCHEMA_VERSION + 1}" in text, text

    db = tmp_path / "c.sqlite"
    code, text = cli("migrate", str(db))
    assert code == 2 and "nothing to migrate" in text and not db.exists(), text
    assert cli("init", str(db)) == (0, f"catalog {db}: schema version {SCHEMA_VERSION} (created)")
    assert cli("migrate", str(db))[1].endswith("(already current)")
    for location in ("tcp://127.0.0.1:7420", "mysql://u@h/db"):
        code, text = cli("init", location)
        assert code == 2, (location, text)
