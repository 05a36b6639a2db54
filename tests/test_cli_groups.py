"""The command line of consumer groups, as real processes (``python -m epochstream``) against
catalogs where in-process workers (``EpochGroup``) leased, acked and nak'd epochs: ``group
ls|info|reset|drop``, the groups' rows of ``durable ls``, ``drop`` of a topic with groups; the
README's ``workers.py`` (two copies sharing ``publish.py``'s topic) and every Python block of
the "Consumer groups" section of docs/consumers.md, run as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from epochstream import (Catalog, EpochGroup, GroupStopped, LeaseExpired, Publisher, Retention,
                         Subscriber, product)
from epochstream.catalog.holders import HOST
from epochstream.cli import app

ROOT = Path(__file__).resolve().parent.parent
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
PID = os.getpid()


def _env() -> dict:
    env = dict(os.environ, **ENV)
    env.pop("EPOCHSTREAM_CATALOG", None)
    return env


def cli(cat: Catalog, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``epochstream ARGS --catalog <cat>`` in a new process."""
    return subprocess.run([sys.executable, "-m", "epochstream", *args, "--catalog", str(cat.path)],
                          capture_output=True, text=True, env=_env(), timeout=timeout)


def publish(cat: Catalog, topic: str = "jobs", n: int = 10) -> None:
    """``n`` epochs of two records ``{"job": t, "k": i}``, logged; the topic is closed."""
    with Publisher(topic, catalog=cat, retention=Retention()) as pub:
        for t in range(n):
            pub.send(t, [{"job": t, "k": i} for i in range(2)])
            pub.advance_to(t + 1)


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split("[│┃]", line.strip("│┃ "))]


def table(stdout: str) -> list[list[str]]:
    """The header and rows of the (one) table in ``stdout``, as cells."""
    return [cells(line) for line in stdout.splitlines() if line[:1] in ("│", "┃")]


def others(stdout: str) -> list[str]:
    """The lines of ``stdout`` that are not part of a table."""
    return [line for line in stdout.splitlines() if line[:1] not in ("│", "┃", "┏", "┡", "└")]


@pytest.fixture
def cat(tmp_path) -> Catalog:
    c = Catalog(tmp_path / "catalog.sqlite")
    publish(c)
    return c


def busy_group(cat: Catalog) -> tuple[EpochGroup, EpochGroup, list, list]:
    """Group 'workers' of 'jobs': worker a leases 0, 1, 2 (acks 0 and 2), b leases 3, 4 (acks
    4), a leases 5: position [1], live leases 1 (a), 3 (b), 5 (a), acked beyond 2 and 4."""
    a = EpochGroup("jobs", "workers", catalog=cat, worker="a")
    b = EpochGroup("jobs", "workers", catalog=cat, worker="b")
    la = a.fetch(3)
    lb = b.fetch(2)
    assert [x.epoch.time for x in la + lb] == [0, 1, 2, 3, 4]
    la[0].ack()
    la[2].ack()
    lb[1].ack()
    la += a.fetch()
    assert la[-1].epoch.time == 5 and a.position == (1,)
    return a, b, la, lb


# ---- group ls -----------------------------------------------------------------------------------


def test_group_ls_lists_every_group_with_its_counts(cat):
    busy_group(cat)
    keys = EpochGroup("jobs", "keys", catalog=cat, mode="key_shared", key="k", buckets=3,
                      worker="k")
    assert [(x.epoch.time, x.bucket) for x in keys.fetch(8)] == [(0, 0), (0, 1)]
    proc = cli(cat, "group", "ls")
    assert proc.returncode == 0, proc.stderr
    assert others(proc.stdout) == [f"consumer groups in catalog {cat.path}"]
    assert table(proc.stdout) == [
        ["topic", "name", "mode", "position", "leased", "acked beyond", "dead beyond", "state",
         "reason"],
        ["jobs", "keys", "key_shared", "[0]", "2", "0", "0", "active", "-"],
        ["jobs", "workers", "shared", "[1]", "3", "2", "0", "active", "-"]]
    assert proc.stderr == ""

    objs = [json.loads(line) for line in cli(cat, "group", "ls", "jobs", "--json").stdout
            .splitlines()]
    assert objs == [
        {"topic": "jobs", "name": "keys", "mode": "key_shared", "ack_wait": 30.0,
         "max_deliver": 5, "dead_letter": None, "position": [0], "state": "active",
         "reason": None, "leased": 2, "expired": 0, "acked": 0, "dead": 0},
        {"topic": "jobs", "name": "workers", "mode": "shared", "ack_wait": 30.0,
         "max_deliver": 5, "dead_letter": None, "position": [1], "state": "active",
         "reason": None, "leased": 3, "expired": 0, "acked": 2, "dead": 0}]


def test_group_ls_empty_unknown_topic_and_no_catalog(cat, tmp_path):
    proc = cli(cat, "group", "ls")
    assert proc.returncode == 0 and proc.stdout.splitlines() == [
        f"no consumer groups in catalog {cat.path}"]
    proc = cli(cat, "group", "ls", "jobs")
    assert proc.stdout.splitlines() == [
        f"no consumer groups in topic 'jobs' in catalog {cat.path}"]
    proc = cli(cat, "group", "ls", "nope")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: unknown topic 'nope' in catalog {cat.path} (existing topics: jobs)",
        "hint: if its publisher uses another catalog, pass --catalog PATH (or set "
        "$EPOCHSTREAM_CATALOG)"]
    missing = subprocess.run([sys.executable, "-m", "epochstream", "group", "ls", "--catalog",
                              str(tmp_path / "none")], capture_output=True, text=True,
                             env=_env(), timeout=60)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no catalog at ")


def test_a_dead_workers_leases_show_as_expired_and_gone(cat):
    code = (f"from epochstream import EpochGroup\n"
            f"g = EpochGroup('jobs', 'workers', catalog={str(cat.path)!r}, worker='doomed')\n"
            f"print([x.epoch.time for x in g.fetch(2)])\n"
            f"import os; print(os.getpid(), flush=True); os._exit(1)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert run.stdout.splitlines()[0] == "[0, 1]", run.stderr
    pid = int(run.stdout.splitlines()[1])
    ls = cli(cat, "group", "ls")
    assert table(ls.stdout)[1] == ["jobs", "workers", "shared", "[0]", "0 (+2 expired)", "0",
                                   "0", "active", "-"]
    info = cli(cat, "group", "info", "jobs", "workers")
    assert table(info.stdout)[1:] == [
        [str(t), "doomed", f"pid {pid} on {HOST} (gone)", "1", "released: its worker is gone"]
        for t in (0, 1)]
    # the next fetch of any worker gets them again at once (ack_wait is 30 s)
    again = EpochGroup("jobs", "workers", catalog=cat, worker="next").fetch(3, expires=0)
    assert [(x.epoch.time, x.deliveries) for x in again] == [(0, 2), (1, 2), (2, 1)]


# ---- group info ---------------------------------------------------------------------------------


def test_group_info_shows_each_lease_and_what_is_acked(cat):
    a, b, la, lb = busy_group(cat)
    lb[0].nak(delay=60)  # 3 is given back, not before a minute
    proc = cli(cat, "group", "info", "jobs", "workers")
    assert proc.returncode == 0, proc.stderr
    lines = others(proc.stdout)
    assert lines[:8] == [
        f"consumer group 'workers' of topic 'jobs' in catalog {cat.path}",
        "  mode         shared",
        "  ack_wait     30 s",
        "  max_deliver  5",
        "  dead_letter  -",
        "  position     [1]",
        "  state        active",
        "leased: 2 unit(s)"]
    rows = table(proc.stdout)
    assert rows[0] == ["time", "worker", "process", "deliveries", "deadline"]
    assert [r[:4] for r in rows[1:]] == [["1", "a", f"pid {PID} on {HOST} (alive)", "1"],
                                          ["5", "a", f"pid {PID} on {HOST} (alive)", "1"]]
    for r in rows[1:]:
        m = re.fullmatch(r"in (\d+\.\d) s", r[4])
        assert m and 25 < float(m.group(1)) <= 30, r
    assert lines[8:10] == ["acked beyond the position: 2, 4",
                           "dead-lettered beyond the position: -"]
    m = re.fullmatch(r"given back, to be delivered again: 3 \(delivered 1 time\(s\), not before "
                     r"(\d+\.\d) s\)", lines[10])
    assert m and 50 < float(m.group(1)) <= 60, lines[10]
    assert len(lines) == 11 and proc.stderr == ""

    obj = json.loads(cli(cat, "group", "info", "jobs", "workers", "--json").stdout)
    assert {k: obj[k] for k in ("topic", "name", "mode", "ack_wait", "max_deliver",
                                "dead_letter", "position", "state", "reason")} == {
        "topic": "jobs", "name": "workers", "mode": "shared", "ack_wait": 30.0,
        "max_deliver": 5, "dead_letter": None, "position": [1], "state": "active",
        "reason": None}
    assert [(u["time"], u["worker"], u["pid"], u["host"], u["worker_alive"], u["live"],
             u["deliveries"], u["token"]) for u in obj["leased"]] == [
        (1, "a", PID, HOST, True, True, 1, 2), (5, "a", PID, HOST, True, True, 1, 6)]
    assert all(25 < u["seconds_left"] <= 30 and u["bucket"] is None for u in obj["leased"])
    assert obj["acked"] == [{"time": 2, "bucket": None, "deliveries": 1},
                            {"time": 4, "bucket": None, "deliveries": 1}]
    assert obj["dead"] == []
    (waiting,) = obj["waiting"]
    assert waiting["time"] == 3 and waiting["deliveries"] == 1
    assert time.time() + 50 < waiting["not_before"] <= time.time() + 60


def test_group_info_key_shared_and_product_times(tmp_path):
    cat = Catalog(tmp_path / "catalog.sqlite")
    with Publisher("g", catalog=cat, order=product(2),
                   retention=Retention()) as pub:
        for day in range(2):
            for it in range(2):
                pub.send((day, it), [{"day": day, "k": k} for k in ("x", "y")])
        pub.advance_to((2, 0))
    g = EpochGroup("g", "by-key", catalog=cat, mode="key_shared", key="k", buckets=4,
                   worker="w")
    got = g.fetch(8)
    assert [(x.epoch.time, x.bucket) for x in got] == [((0, 0), 1), ((0, 0), 3)]
    got[0].ack()
    proc = cli(cat, "group", "info", "g", "by-key")
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    assert rows[0] == ["time", "bucket", "worker", "process", "deliveries", "deadline"]
    assert [r[:5] for r in rows[1:]] == [["(0, 0)", "3", "w", f"pid {PID} on {HOST} (alive)",
                                          "1"]]
    assert others(proc.stdout)[5:] == [
        "  position     [(0, 0)]", "  state        active", "leased: 1 unit(s)",
        "acked beyond the position: (0, 0) (bucket 1)", "dead-lettered beyond the position: -"]
    obj = json.loads(cli(cat, "group", "info", "g", "by-key", "--json").stdout)
    assert obj["position"] == [[0, 0]]
    assert obj["acked"] == [{"time": [0, 0], "bucket": 1, "deliveries": 1}]


def test_group_info_unknown_group_or_topic(cat):
    busy_group(cat)
    proc = cli(cat, "group", "info", "jobs", "nobody")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: topic 'jobs' has no consumer group 'nobody' (existing: workers)",
        "hint: list them with: epochstream group ls jobs"]
    proc = cli(cat, "group", "info", "nope", "workers")
    assert proc.returncode == 2 and "error: unknown topic 'nope'" in proc.stderr


def test_dead_lettered_epochs_show_in_info(cat):
    g = EpochGroup("jobs", "strict", catalog=cat, max_deliver=1, dead_letter="jobs.dead",
                   worker="w")
    (lease,) = g.fetch()
    lease.nak()
    assert [x.epoch.time for x in g.fetch(2)] == [1, 2]  # 0 went to jobs.dead
    proc = cli(cat, "group", "info", "jobs", "strict")
    assert proc.returncode == 0, proc.stderr
    assert others(proc.stdout)[4] == "  dead_letter  jobs.dead"
    assert others(proc.stdout)[-1] == "dead-lettered beyond the position: 0"
    assert table(cli(cat, "group", "ls").stdout)[1] == [
        "jobs", "strict", "shared", "[0]", "2", "0", "1", "active", "-"]
    obj = json.loads(cli(cat, "group", "info", "jobs", "strict", "--json").stdout)
    assert obj["dead"] == [{"time": 0, "bucket": None, "deliveries": 1}]


# ---- durable ls shows the groups' positions -----------------------------------------------------


def test_durable_ls_lists_groups_as_group_rows(cat):
    busy_group(cat)
    Subscriber("jobs", catalog=cat, durable="billing", start=3).close()
    proc = cli(cat, "durable", "ls")
    assert proc.returncode == 0, proc.stderr
    assert others(proc.stdout) == [
        f"durable subscriptions and consumer groups in catalog {cat.path}"]
    rows = table(proc.stdout)
    assert rows[0] == ["topic", "name", "position", "acked beyond", "state", "holder",
                       "last ack"]
    assert rows[1][:6] == ["jobs", "billing", "[3]", "-", "active", "-"]
    assert rows[2] == ["jobs", "group:workers", "[1]", "2, 4", "active",
                       "3 lease(s), 2 worker(s)", "-"]
    objs = [json.loads(line) for line in cli(cat, "durable", "ls", "--json").stdout.splitlines()]
    assert [o["name"] for o in objs] == ["billing", "workers"]
    assert objs[1] == {"kind": "group", "topic": "jobs", "name": "workers", "mode": "shared",
                       "position": [1], "acked": [2, 4], "state": "active", "reason": None,
                       "leased": 3}
    assert cli(cat, "durable", "ls", "jobs").stdout.splitlines()[0] == (
        f"durable subscriptions and consumer groups in topic 'jobs' in catalog {cat.path}")


def test_durable_ls_with_only_a_group(cat):
    busy_group(cat)
    proc = cli(cat, "durable", "ls")
    assert table(proc.stdout)[1:] == [["jobs", "group:workers", "[1]", "2, 4", "active",
                                       "3 lease(s), 2 worker(s)", "-"]]


# ---- group reset --------------------------------------------------------------------------------


def stop(cat: Catalog) -> EpochGroup:
    """Group 'strict' of 'jobs' (max_deliver=1, no dead letter) stopped by epoch 0."""
    g = EpochGroup("jobs", "strict", catalog=cat, max_deliver=1, worker="w")
    (lease,) = g.fetch()
    lease.nak()
    with pytest.raises(GroupStopped):
        g.fetch()
    return g


REASON = ("epoch 0 was delivered 1 times without an ack (max_deliver=1) and the group has no "
          "dead_letter topic")


def test_group_reset_reactivates_a_stopped_group(cat):
    stop(cat)
    ls = cli(cat, "group", "ls")
    assert table(ls.stdout)[1][4:] == ["0", "0", "0", "stopped", REASON]
    notice = (f"consumer group 'strict' of 'jobs' stopped: {REASON}; once the cause is fixed: "
              f"epochstream group reset jobs strict")
    assert ls.stderr.splitlines() == [notice]
    info = cli(cat, "group", "info", "jobs", "strict")
    assert others(info.stdout)[6] == f"  state        stopped: {REASON}"
    # only 0: the fetch that stops a group leases nothing else
    assert others(info.stdout)[-1] == "delivered max_deliver=1 time(s) without an ack: 0"
    assert info.stderr.splitlines() == [notice]
    assert cli(cat, "durable", "ls").stderr.splitlines() == [notice]

    proc = cli(cat, "group", "reset", "jobs", "strict")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"reset consumer group 'strict' of topic 'jobs' at [0]: active again (it had stopped: "
        f"{REASON})"]
    assert cat.group_info("jobs", "strict").state == "active"
    assert table(cli(cat, "group", "ls").stdout)[1][7:] == ["active", "-"]
    again = cli(cat, "group", "reset", "jobs", "strict")
    assert again.returncode == 0
    assert again.stdout.splitlines() == [
        "consumer group 'strict' of topic 'jobs' is active (at [0]): nothing to reset"]
    unknown = cli(cat, "group", "reset", "jobs", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        "error: topic 'jobs' has no consumer group 'nope' (existing: strict)",
        "hint: list them with: epochstream group ls jobs"]


def test_after_a_reset_the_exhausted_epoch_is_delivered_again(cat):
    stop(cat)
    assert cli(cat, "group", "reset", "jobs", "strict").returncode == 0
    g = EpochGroup("jobs", "strict", catalog=cat, max_deliver=1, worker="w2")
    got = g.fetch(expires=2)
    assert [(x.epoch.time, x.deliveries) for x in got] == [(0, 1)]


def test_reset_of_a_group_behind_retention_is_refused(tmp_path):
    cat = Catalog(tmp_path / "catalog.sqlite")
    small = Retention(max_epochs=4, segment_bytes=4096)
    with Publisher("r", catalog=cat, retention=small) as pub:
        pub.send(0, ["x" * 2000])
        pub.advance_to(1)
        assert len(EpochGroup("r", "slow", catalog=cat).fetch()) == 1
        for t in range(1, 20):
            pub.send(t, ["x" * 2000])
            pub.advance_to(t + 1)
    info = cat.group_info("r", "slow")
    assert info.state == "stopped" and info.reason.startswith("retention of partition 0")
    since = cat.history_states("r")[0].since[0]
    proc = cli(cat, "group", "reset", "r", "slow")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: consumer group 'slow' of topic 'r' is at [0], older than what topic 'r' "
        f"retains (since [{since}]): a reset does not move a group's position",
        "hint: drop it (epochstream group drop r slow); the next worker creates it again at "
        "the earliest retained epoch"]
    assert cat.group_info("r", "slow").state == "stopped"
    # the lease of epoch 0 is this process's and live: --force
    assert cli(cat, "group", "drop", "r", "slow").returncode == 1
    assert cli(cat, "group", "drop", "r", "slow", "--force").returncode == 0
    fresh = EpochGroup("r", "slow", catalog=cat)
    assert [x.epoch.time for x in fresh.fetch()] == [since]


# ---- group drop ---------------------------------------------------------------------------------


def test_group_drop_refuses_live_leases_unless_forced(cat):
    a, b, la, lb = busy_group(cat)
    proc = cli(cat, "group", "drop", "jobs", "workers")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: consumer group 'workers' of topic 'jobs' has 3 live lease(s), held by a (pid "
        f"{PID} on {HOST} (alive)), b (pid {PID} on {HOST} (alive))",
        "hint: stop its workers first, or pass --force to drop it anyway"]
    forced = cli(cat, "group", "drop", "jobs", "workers", "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines() == [
        "dropped consumer group 'workers' of topic 'jobs' (it was at [1])"]
    assert cat.groups() == []
    with pytest.raises(LeaseExpired, match="the group forgot it"):
        la[1].ack()
    assert cli(cat, "group", "ls").stdout.splitlines() == [
        f"no consumer groups in catalog {cat.path}"]
    unknown = cli(cat, "group", "drop", "jobs", "workers")
    assert unknown.returncode == 2
    assert "topic 'jobs' has no consumer group 'workers' (existing: none)" in unknown.stderr


def test_group_drop_without_live_leases(cat):
    g = EpochGroup("jobs", "done", catalog=cat)
    for lease in g.fetch(3):
        lease.ack()
    g.fetch()  # moves the position to [3] (and leases 3)
    cat_leases = cli(cat, "group", "drop", "jobs", "done")
    assert cat_leases.returncode == 1  # epoch 3 is leased
    g2 = EpochGroup("jobs", "idle", catalog=cat)
    g2.fetch()[0].ack()
    g2.fetch(expires=0)[0].nak()
    proc = cli(cat, "group", "drop", "jobs", "idle")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "dropped consumer group 'idle' of topic 'jobs' (it was at [1])"]


def test_drop_topic_reports_its_groups(cat):
    busy_group(cat)
    proc = cli(cat, "drop", "jobs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"dropped topic 'jobs' (1 partition(s)) and 1 consumer group(s) from catalog {cat.path}")
    assert cat.groups() == []


def test_position_after_every_epoch_of_a_finished_topic_is_acked(cat):
    g = EpochGroup("jobs", "all", catalog=cat)
    for lease in g.fetch(10):
        lease.ack()
    assert g.fetch(expires=0.2) == []
    assert table(cli(cat, "group", "ls").stdout)[1][3] == "[10]"


# ---- help texts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["group"], ["group", "ls"], ["group", "info"],
                                     ["group", "reset"], ["group", "drop"], ["durable", "ls"]])
def test_group_help_renders_cleanly_at_80_columns(command):
    result = CliRunner(env={**ENV, "COLUMNS": "80"}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert not re.search(r"<(bool|str|int|float|text|integer|path)[^>]*>", text), text
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines()), text
    description = text.split("\n", 1)[1].split("Options:")[0]
    for para in [p for p in re.split(r"\n\s*\n", description) if p.strip()]:
        lines = para.strip("\n").splitlines()
        for line, nxt in zip(lines, lines[1:]):
            assert len(line) + 1 + len(nxt.split()[0]) > 78, (line, nxt, text)
    for code in ("0", "1", "2"):
        assert re.search(rf"^\s+{code}\s+\w", text, re.M), (code, text)


def test_top_level_help_lists_the_group_command():
    text = CliRunner(env=ENV).invoke(app, ["--help"]).output
    assert re.search(r"^\s+group\s+List, inspect, reset and drop consumer groups", text, re.M)


# ---- the README's workers.py and docs/consumers.md, as written ---------------------------------


def _block_after(doc: str, name: str) -> str:
    text = (ROOT / doc).read_text()
    m = re.search(rf"^`{re.escape(name)}`[^\n]*\n(?:[^\n]+\n)*\n```python\n(.*?)```", text,
                  re.S | re.M)
    assert m, f"no python block after `{name}` in {doc}"
    return m.group(1)


def _readme_workers() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Sharing the work", 1)[1].split("\n## ", 1)[0]
    assert "`workers.py`" in section
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_readme_workers_share_the_topic(tmp_path):
    """publish.py from the README, and two copies of workers.py started while it runs: between
    them they print every epoch exactly once, each whole (2 records), delivered once."""
    (tmp_path / "publish.py").write_text(_block_after("README.md", "publish.py"))
    (tmp_path / "workers.py").write_text(_readme_workers())

    def start(script: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-u", script], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env())

    publisher = start("publish.py")
    procs = [publisher]
    try:
        cat_file = tmp_path / ".epochstream" / "catalog.sqlite"
        deadline = time.monotonic() + 30
        while not (cat_file.is_file() and Catalog(cat_file).topics()):
            assert time.monotonic() < deadline and publisher.poll() is None, "no topic"
            time.sleep(0.05)
        workers = [start("workers.py") for _ in range(2)]
        procs += workers
        outs = [w.communicate(timeout=90) for w in workers]
        assert publisher.wait(timeout=60) == 0, publisher.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = [line.split() for out, err in outs for line in out.splitlines()]
    for w, (out, err) in zip(workers, outs):
        assert w.returncode == 0, err
    assert sorted(int(x[0]) for x in lines) == list(range(10))
    assert all(x[1:] == ["2", "1"] for x in lines), lines


def _group_doc_examples() -> list[tuple[str, str | None]]:
    """(python block, the text block right after it or None) of the "Consumer groups" section
    of docs/consumers.md."""
    text = (ROOT / "docs" / "consumers.md").read_text()
    section = text.split("\n## Consumer groups\n", 1)[1].split("\n## ", 1)[0]
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", section, re.S)]


def test_group_doc_has_examples():
    examples = _group_doc_examples()
    assert len(examples) >= 8 and all(expected is not None for _, expected in examples)
    for word in ('mode="ordered"', 'mode="partial"', 'mode="key_shared"', "dead_letter=",
                 "GroupStopped", "nak(delay=", "in_progress()", "os._exit"):
        assert any(word in code for code, _ in examples), word


@pytest.mark.parametrize("index", range(len(_group_doc_examples())))
def test_group_doc_example_runs_as_written(tmp_path, index):
    code, expected = _group_doc_examples()[index]
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, (code, proc.stderr)
    assert proc.stdout == expected, (code, proc.stdout)
