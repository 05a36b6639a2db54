"""The command line of durable history, as real processes (``python -m epochstream``) against
catalogs that in-process publishers with retention filled: ``tail --from`` / ``--durable``,
``history``, ``durable ls|reset|drop``, ``drop`` deleting the epoch logs; the README's
``billing.py`` (stopped and resumed) and every Python block of docs/history.md, run as written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.cli import app
from epochstream.errors import SubscriptionHeld
from epochstream.order import product

ROOT = Path(__file__).resolve().parent.parent
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def _env() -> dict:
    env = dict(os.environ, **ENV)
    env.pop("EPOCHSTREAM_CATALOG", None)
    return env


def cli(cat: Catalog, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``epochstream ARGS --catalog <cat>`` in a new process."""
    return subprocess.run([sys.executable, "-m", "epochstream", *args, "--catalog", str(cat.path)],
                          capture_output=True, text=True, env=_env(), timeout=timeout)


def records(e: int) -> list:
    return [{"e": e, "i": i} for i in range(e % 3 + 1)]


def publish_total(cat: Catalog, topic: str = "t", n: int = 10) -> None:
    """``n`` epochs (epoch e has e % 3 + 1 records), logged, then the topic is closed."""
    with Publisher(topic, catalog=cat, retention=Retention()) as pub:
        for e in range(n):
            pub.send(e, records(e))
            pub.advance_to(e + 1)


def publish_grid(cat: Catalog) -> None:
    """product(2) times (day, iteration), day < 3, iteration < 2, all complete, closed."""
    with Publisher("g", catalog=cat, order=product(2), retention=Retention()) as pub:
        for day in range(3):
            for it in range(2):
                pub.send((day, it), [[day, it]])
        pub.advance_to((3, 0))


def publish_trimmed(cat: Catalog, durable: str | None = None) -> tuple:
    """Topic 'r': 20 epochs of ~2 kB under tiny limits, so the oldest segments are deleted;
    ``durable`` is created at [0] after the first epoch and never acks (it expires). Returns
    the retained position."""
    small = Retention(max_epochs=4, segment_bytes=4096)
    with Publisher("r", catalog=cat, retention=small) as pub:
        pub.send(0, ["x" * 2000])
        pub.advance_to(1)
        if durable:
            Subscriber("r", catalog=cat, durable=durable, start="earliest").close()
        for t in range(1, 20):
            pub.send(t, ["x" * 2000])
            pub.advance_to(t + 1)
    since = History("r", catalog=cat).since
    assert since[0] > 0  # something was deleted
    return since


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Catalog:
    """A catalog the read-only tests share: 't' (total), 'g' (product(2)), 'r' (trimmed),
    'plain' (no retention)."""
    cat = Catalog(tmp_path_factory.mktemp("shared") / "catalog.sqlite")
    publish_total(cat)
    publish_grid(cat)
    publish_trimmed(cat)
    with Publisher("plain", catalog=cat) as pub:
        pub.send(0, [1])
        pub.advance_to(1)
    return cat


@pytest.fixture
def cat(tmp_path) -> Catalog:
    c = Catalog(tmp_path / "catalog.sqlite")
    publish_total(c)
    return c


def data_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()]


def first_line(stderr: str) -> str:
    return stderr.splitlines()[0]


# ---- history ------------------------------------------------------------------------------------


def test_history_lists_every_retained_epoch(shared):
    proc = cli(shared, "history", "t")
    assert proc.returncode == 0, proc.stderr
    nbytes = {e.time: e.nbytes for e in History("t", catalog=shared).epochs()}
    rows = data_rows(proc.stdout)
    assert [(int(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows] == [
        (e, e % 3 + 1, nbytes[e], "B") for e in range(10)]
    for r in rows:  # completed: a local timestamp
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", r[4]) and re.fullmatch(r"\d\d:\d\d:\d\d", r[5])
    assert proc.stderr.splitlines() == [
        f"history of 't' (total, msgpack, 1 partition(s)) from catalog {shared.path}: retained "
        f"since [0]",
        "            time     records         bytes            completed",
        f"10 epoch(s), 19 record(s), {sum(nbytes.values())} B"]


def test_history_since_until_json_and_records(shared):
    proc = cli(shared, "history", "t", "--since", "3", "--until", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(o["time"], o["records"]) for o in objs] == [(3, 1), (4, 2), (5, 3)]
    assert all(set(o) == {"time", "records", "bytes", "completed_at"} and o["bytes"] > 0
               and o["completed_at"] <= time.time() for o in objs)
    assert "epochs at or beyond [3] and not at or beyond [6]" in first_line(proc.stderr)
    assert "time" not in proc.stderr.splitlines()[1]  # no column header with --json

    proc = cli(shared, "history", "t", "--since", "8", "--records", "--json")
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"time": 8, "record": r} for r in records(8)] + [{"time": 9, "record": r}
                                                         for r in records(9)]
    proc = cli(shared, "history", "t", "--since", "9", "--records")
    assert proc.stdout.splitlines()[1:] == ['  {"e": 9, "i": 0}']


def test_history_product_positions(shared):
    proc = cli(shared, "history", "g", "--since", "[[1,1],[2,0]]")
    assert proc.returncode == 0, proc.stderr
    assert [line[:16].strip() for line in proc.stdout.splitlines()] == [
        "(1, 1)", "(2, 0)", "(2, 1)"]
    assert "epochs at or beyond [(1, 1), (2, 0)]" in first_line(proc.stderr)
    proc = cli(shared, "history", "g", "--since", "1,1", "--until", "2,1", "--json")
    assert [json.loads(line)["time"] for line in proc.stdout.splitlines()] == [[1, 1]]


def test_history_errors_exit_2_and_say_what_to_do(shared):
    since = History("r", catalog=shared).since
    proc = cli(shared, "history", "r", "--since", "0")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert (f"error: topic 'r': position [0] is older than what is retained (since "
            f"[{since[0]}])") in proc.stderr
    assert f"hint: omit --since to read everything retained (since [{since[0]}])" in proc.stderr

    proc = cli(shared, "history", "plain")
    assert proc.returncode == 2
    assert "error: topic 'plain' keeps no history" in proc.stderr
    assert "retention=Retention()" in proc.stderr

    proc = cli(shared, "history", "t", "--since", "soon")
    assert proc.returncode == 2
    assert first_line(proc.stderr).startswith("error: bad --since 'soon': not a time")
    proc = cli(shared, "history", "g", "--since", "1,2,3")
    assert proc.returncode == 2 and "wrong shape" in proc.stderr

    proc = cli(shared, "history", "nope")
    assert proc.returncode == 2
    assert f"unknown topic 'nope' in catalog {shared.path}" in proc.stderr
    assert "--wait" not in proc.stderr  # history has no --wait


# ---- tail --from --------------------------------------------------------------------------------


def test_tail_from_earliest_replays_a_closed_topic(shared):
    proc = cli(shared, "tail", "t", "--from", "earliest", "--timeout", "10")
    assert proc.returncode == 0, proc.stderr
    assert [(int(r[0]), int(r[1])) for r in data_rows(proc.stdout)] == [
        (e, e % 3 + 1) for e in range(10)]
    assert ", from earliest; Ctrl-C to stop" in first_line(proc.stderr)
    assert "10 epoch(s), 19 record(s)" in proc.stderr
    assert "the stream ended (every partition closed)" in proc.stderr
    # without --from a closed topic is reported, with the way to its history
    plain = cli(shared, "tail", "t")
    assert plain.returncode == 2 and plain.stdout == ""
    assert "is closed" in plain.stderr and "pass --from earliest" in plain.stderr


def test_tail_from_a_time_is_inclusive(shared):
    proc = cli(shared, "tail", "t", "--from", "7", "--json", "--timeout", "10")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["time"] for line in proc.stdout.splitlines()] == [7, 8, 9]
    proc = cli(shared, "tail", "g", "--from", "[[1,1],[2,0]]", "--json", "--timeout", "10")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["time"] for line in proc.stdout.splitlines()] == [
        [1, 1], [2, 0], [2, 1]]
    assert "from [(1, 1), (2, 0)]" in first_line(proc.stderr)


def test_tail_from_before_what_is_retained_exits_2(shared):
    since = History("r", catalog=shared).since[0]
    proc = cli(shared, "tail", "r", "--from", "0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[-2] == (f"error: topic 'r': cannot resume at [0]: partition 0 retains epochs "
                         f"only from [{since}] on, after the position [0]")
    assert lines[-1] == (f"hint: start at or after what is retained: --from earliest (= "
                         f"[{since}]) or a later time")
    bad = cli(shared, "tail", "t", "--from", "yesterday")
    assert bad.returncode == 2 and "error: bad --from 'yesterday'" in bad.stderr
    assert cli(shared, "tail", "t", "--takeover").returncode == 2  # needs --durable


def test_tail_from_joins_history_and_the_live_stream(tmp_path):
    """A live publisher: epochs 0-4 are in the log before the tail starts, 5-7 come live; the
    tail from 2 prints 2..7, each once."""
    cat = Catalog(tmp_path / "catalog.sqlite")
    pub = Publisher("live", catalog=cat, retention=Retention())
    try:
        for e in range(5):
            pub.send(e, records(e))
            pub.advance_to(e + 1)
        pub.send(5, ["begun before the tail joined"])  # epoch 5 is under way
        proc = subprocess.Popen(
            [sys.executable, "-m", "epochstream", "tail", "live", "--from", "2", "--json",
             "--timeout", "20", "--catalog", str(cat.path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        deadline = time.monotonic() + 20
        while pub.subscribers < 1:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.02)
        pub.send(5, ["and after"])
        for e in (6, 7):
            pub.advance_to(e)
            pub.send(e, records(e))
        pub.close()
        out, err = proc.communicate(timeout=30)
    finally:
        pub.close()
    assert proc.returncode == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    assert [(o["time"], o["records"]) for o in objs] == [
        (2, 3), (3, 1), (4, 2), (5, 2), (6, 1), (7, 2)]


# ---- tail --durable and durable ls / reset / drop ---------------------------------------------


def _ls_row(stdout: str, name: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if f" {name} " in line)
    return [c.strip() for c in re.split("[│┃]", line.strip("│┃ "))]


def test_tail_durable_acks_each_epoch_and_resumes(cat):
    proc = cli(cat, "tail", "t", "--from", "earliest", "--durable", "billing", "--max-epochs", "3")
    assert proc.returncode == 0, proc.stderr
    assert [int(r[0]) for r in data_rows(proc.stdout)] == [0, 1, 2]
    assert "new durable subscription 'billing' from earliest" in first_line(proc.stderr)
    assert proc.stderr.splitlines()[-1].endswith(
        "stopped after --max-epochs 3; durable subscription 'billing' at [3]")

    ls = cli(cat, "durable", "ls")
    assert ls.returncode == 0, ls.stderr
    assert ls.stdout.splitlines()[0] == f"durable subscriptions in catalog {cat.path}"
    header = _ls_row(ls.stdout, "name")
    assert header == ["topic", "name", "position", "acked beyond", "state", "holder", "last ack"]
    row = _ls_row(ls.stdout, "billing")
    assert row[:6] == ["t", "billing", "[3]", "-", "active", "-"]
    assert row[6].endswith(" ago")
    (obj,) = [json.loads(line) for line in cli(cat, "durable", "ls", "--json").stdout.splitlines()]
    assert obj["position"] == [3] and obj["acked"] == [] and obj["state"] == "active"
    assert obj["holder_alive"] is False and obj["acked_at"] <= time.time()

    again = cli(cat, "tail", "t", "--durable", "billing", "--from", "0", "--max-epochs", "2")
    assert again.returncode == 0, again.stderr
    assert [int(r[0]) for r in data_rows(again.stdout)] == [3, 4]  # nothing acked twice
    assert ("durable subscription 'billing' resumed at [3] (--from applies only to a new one)"
            in first_line(again.stderr))
    assert _ls_row(cli(cat, "durable", "ls", "t").stdout, "billing")[2] == "[5]"
    assert cat.durable("t", "billing").position == (5,)

    rest = cli(cat, "tail", "t", "--durable", "billing", "--timeout", "10")
    assert [int(r[0]) for r in data_rows(rest.stdout)] == [5, 6, 7, 8, 9]
    assert rest.stderr.splitlines()[-1].endswith(  # where a next run continues, not []
        "the stream ended (every partition closed); durable subscription 'billing' at [10]")


def test_durable_reset_names_what_is_skipped_and_redelivered(cat):
    assert cli(cat, "tail", "t", "--from", "3", "--durable", "billing",
               "--max-epochs", "2").returncode == 0
    assert cat.durable("t", "billing").position == (5,)

    fwd = cli(cat, "durable", "reset", "t", "billing", "--to", "8")
    assert fwd.returncode == 0, fwd.stderr
    assert fwd.stdout.splitlines() == [
        "reset 'billing' of topic 't' from [5] to [8]: epochs at or beyond [5] and not at or "
        "beyond [8] will not be delivered (3 retained epoch(s): 5, 6, 7)"]
    assert cat.durable("t", "billing").position == (8,)

    back = cli(cat, "durable", "reset", "t", "billing", "--to", "1")
    assert back.stdout.splitlines() == [
        "reset 'billing' of topic 't' from [8] to [1]: epochs at or beyond [1] and not at or "
        "beyond [8] will be delivered again (7 retained epoch(s): 1, 2, 3, …, 5, 6, 7)"]
    tail = cli(cat, "tail", "t", "--durable", "billing", "--max-epochs", "1")
    assert [int(r[0]) for r in data_rows(tail.stdout)] == [1]

    same = cli(cat, "durable", "reset", "t", "billing", "--to", "2")
    assert same.stdout.splitlines() == [
        "reset 'billing' of topic 't' from [2] to [2]: nothing is skipped or delivered again"]
    latest = cli(cat, "durable", "reset", "t", "billing", "--to", "latest")
    assert latest.stdout.startswith("reset 'billing' of topic 't' from [2] to []: epochs at or "
                                    "beyond [2] and not at or beyond [] will not be delivered "
                                    "(8 retained epoch(s): 2, 3, 4, …, 7, 8, 9)")
    earliest = cli(cat, "durable", "reset", "t", "billing")  # --to earliest is the default
    assert earliest.stdout.startswith("reset 'billing' of topic 't' from [] to [0]: epochs at "
                                      "or beyond [0] and not at or beyond [] will be delivered "
                                      "again (10 retained epoch(s)")
    assert cat.durable("t", "billing").position == (0,)
    bad = cli(cat, "durable", "reset", "t", "billing", "--to", "x")
    assert bad.returncode == 2 and "error: bad --to 'x'" in bad.stderr
    unknown = cli(cat, "durable", "reset", "t", "nobody")
    assert unknown.returncode == 2
    assert "topic 't' has no durable subscription 'nobody' (existing: billing)" in unknown.stderr


def test_durable_held_by_a_live_subscriber_and_takeover(cat):
    holder = Subscriber("t", catalog=cat, durable="held", start="earliest")
    try:
        proc = cli(cat, "tail", "t", "--durable", "held")
        assert proc.returncode == 1
        assert proc.stdout == ""
        assert proc.stderr.splitlines() == [
            f"error: durable subscription 'held' of topic 't' is held by a live subscriber "
            f"(pid {os.getpid()} on {cat.durable('t', 'held').holder_host})",
            "hint: stop that subscriber, or pass --takeover to take the subscription over (its "
            "acks are refused from then on)"]
        row = _ls_row(cli(cat, "durable", "ls").stdout, "held")
        assert row[5] == f"pid {os.getpid()} on {cat.durable('t', 'held').holder_host} (alive)"
        for command in (["durable", "reset", "t", "held"], ["durable", "drop", "t", "held"]):
            refused = cli(cat, *command)
            assert refused.returncode == 1, refused.stderr
            assert "is held by a live subscriber" in refused.stderr and "--force" in refused.stderr

        took = cli(cat, "tail", "t", "--durable", "held", "--takeover", "--max-epochs", "2")
        assert took.returncode == 0, took.stderr
        assert [int(r[0]) for r in data_rows(took.stdout)] == [0, 1]
        first = next(holder.epochs(timeout=10))
        with pytest.raises(SubscriptionHeld):  # fenced: the old holder's acks are refused
            holder.ack(first)
    finally:
        holder.close()
    assert cat.durable("t", "held").position == (2,)


def test_expired_durable_subscription_and_its_reset(tmp_path):
    cat = Catalog(tmp_path / "catalog.sqlite")
    since = publish_trimmed(cat, durable="slow")[0]
    proc = cli(cat, "tail", "r", "--durable", "slow")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: durable subscription 'slow' of topic 'r' expired: epochs at or beyond its "
        f"position [0] were deleted by retention (retained since [{since}])",
        "hint: go on from what is retained, skipping what was deleted: epochstream durable "
        "reset r slow"]
    ls = cli(cat, "durable", "ls", "r")
    assert _ls_row(ls.stdout, "slow")[2:5] == ["[0]", "-", "expired"]
    assert "to go on from what is retained: epochstream durable reset r slow" in ls.stderr

    old = cli(cat, "durable", "reset", "r", "slow", "--to", "0")
    assert old.returncode == 2
    assert f"position [0] is older than what topic 'r' retains (since [{since}])" in old.stderr
    reset = cli(cat, "durable", "reset", "r", "slow")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.splitlines() == [
        f"reset 'slow' of topic 'r' from [0] to [{since}]: epochs at or beyond [0] and not at "
        f"or beyond [{since}] will not be delivered (none of them retained now)"]
    again = cli(cat, "tail", "r", "--durable", "slow", "--timeout", "10")
    assert again.returncode == 0, again.stderr
    assert [int(r[0]) for r in data_rows(again.stdout)] == list(range(since, 20))


def test_durable_drop(cat):
    assert cli(cat, "tail", "t", "--from", "earliest", "--durable", "billing",
               "--max-epochs", "3").returncode == 0
    unknown = cli(cat, "durable", "drop", "t", "nope")
    assert unknown.returncode == 2 and "has no durable subscription 'nope'" in unknown.stderr
    proc = cli(cat, "durable", "drop", "t", "billing")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "dropped durable subscription 'billing' of topic 't' (it was at [3])"]
    assert cat.durables() == []
    ls = cli(cat, "durable", "ls")
    assert ls.stdout.splitlines() == [f"no durable subscriptions in catalog {cat.path}"]
    assert cli(cat, "durable", "ls", "nope").returncode == 2


# ---- drop deletes the epoch logs ----------------------------------------------------------------


def test_drop_deletes_the_topic_history(cat):
    publish_grid(cat)
    assert cli(cat, "tail", "t", "--from", "5", "--durable", "b", "--max-epochs", "1").returncode == 0
    (state,) = cat.history_states("t").values()
    log_dir = Path(state.dir)
    size = sum(f.stat().st_size for f in log_dir.glob("*.eslog"))
    assert size > 0
    proc = cli(cat, "drop", "t")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"dropped topic 't' (1 partition(s)) and 1 durable subscription(s) from catalog "
        f"{cat.path}",
        f"deleted the epoch log of partition 0: {log_dir} (1 segment(s), {size} B)"]
    assert not log_dir.exists() and not log_dir.parent.exists()  # <history>/t is gone too
    assert Path(cat.history_states("g")[0].dir).is_dir()  # another topic's log is kept
    assert cat.history_states("t") == {} and cat.durables("t") == []
    assert [t.name for t in cat.topics()] == ["g"]


# ---- help texts -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["history"], ["durable"], ["durable", "ls"],
                                     ["durable", "reset"], ["durable", "drop"], ["tail"]])
def test_history_help_renders_cleanly_at_80_columns(command):
    result = CliRunner(env={**ENV, "COLUMNS": "80"}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert not re.search(r"<(bool|str|int|float|text|integer|path)[^>]*>", text), text
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines()), text
    assert not re.search(r"\w\.\.\.$", text.split("\n", 1)[1], re.M), text
    description = text.split("\n", 1)[1].split("Options:")[0]
    for para in [p for p in re.split(r"\n\s*\n", description) if p.strip()]:
        lines = para.strip("\n").splitlines()
        for line, nxt in zip(lines, lines[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > 78, (line, nxt, text)
    for code in ("0", "1", "2"):
        assert re.search(rf"^\s+{code}\s+\w", text, re.M), (code, text)


def test_top_level_help_lists_the_history_commands():
    text = CliRunner(env=ENV).invoke(app, ["--help"]).output
    assert re.search(r"^\s+history\s+Print the retained epochs", text, re.M), text
    assert re.search(r"^\s+durable\s+List, reset and drop durable subscriptions", text, re.M)
    for option in ("--from", "--durable", "--takeover"):
        assert option in CliRunner(env=ENV).invoke(app, ["tail", "--help"]).output


# ---- the README's billing.py and docs/history.md, as written ------------------------------------


def _block_after(doc: str, name: str) -> str:
    text = (ROOT / doc).read_text()
    m = re.search(rf"^`{re.escape(name)}`[^\n]*\n(?:[^\n]+\n)*\n```python\n(.*?)```", text,
                  re.S | re.M)
    assert m, f"no python block after `{name}` in {doc}"
    return m.group(1)


def test_readme_billing_resumes_where_it_stopped(tmp_path):
    """billing.py from the README while publish.py runs, stopped with Ctrl-C after three epochs,
    then run again after the publisher finished: every epoch is printed, none is lost, an epoch
    is printed twice only if the stop came between its print and its ack; a third run prints
    nothing (everything acked)."""
    (tmp_path / "publish.py").write_text(_block_after("README.md", "publish.py"))
    (tmp_path / "billing.py").write_text(_block_after("README.md", "billing.py"))

    def start(script: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-u", script], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env())

    publisher = start("publish.py")
    billing = start("billing.py")
    try:
        seen = [billing.stdout.readline() for _ in range(3)]
        billing.send_signal(signal.SIGINT)
        rest, err = billing.communicate(timeout=30)
        assert publisher.wait(timeout=60) == 0, publisher.stderr.read()
    finally:
        for p in (publisher, billing):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert "KeyboardInterrupt" in err, err
    first = [int(line.split()[0]) for line in seen + rest.splitlines()]
    assert first[:3] == [0, 1, 2] and first == list(range(len(first)))
    second = subprocess.run([sys.executable, "billing.py"], cwd=tmp_path, capture_output=True,
                            text=True, env=_env(), timeout=60)
    assert second.returncode == 0, second.stderr
    resumed = [int(line.split()[0]) for line in second.stdout.splitlines()]
    assert resumed and resumed[-1] == 9 and resumed == list(range(resumed[0], 10))
    assert resumed[0] in (first[-1], first[-1] + 1)  # the last one again only if unacked
    third = subprocess.run([sys.executable, "billing.py"], cwd=tmp_path, capture_output=True,
                           text=True, env=_env(), timeout=60)
    assert third.returncode == 0 and third.stdout == "", third.stderr


def _history_doc_examples() -> list[tuple[str, str | None]]:
    """(python block, the text block right after it or None) of docs/history.md."""
    text = (ROOT / "docs" / "history.md").read_text()
    out = []
    for m in re.finditer(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", text, re.S):
        out.append((m.group(1), m.group(2)))
    return out


def test_history_doc_has_examples():
    examples = _history_doc_examples()
    assert len(examples) >= 6
    assert sum(expected is not None for _, expected in examples) >= 6


@pytest.mark.parametrize("index", range(len(_history_doc_examples())))
def test_history_doc_example_runs_as_written(tmp_path, index):
    code, expected = _history_doc_examples()[index]
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, (code, proc.stderr)
    if expected is not None:
        assert proc.stdout == expected, (code, proc.stdout)
