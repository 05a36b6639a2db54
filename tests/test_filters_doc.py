"""Every Python block of docs/filters.md, run as written in a fresh process: it must print
exactly the ``text`` block that follows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _examples() -> list[tuple[str, str | None]]:
    text = (ROOT / "docs" / "filters.md").read_text()
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", text, re.S)]


def test_filters_doc_has_examples():
    assert sum(expected is not None for _, expected in _examples()) >= 2


@pytest.mark.parametrize("index", range(len(_examples())))
def test_filters_doc_example_runs_as_written(tmp_path, index):
    code, expected = _examples()[index]
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ)
    env.pop("EPOCHSTREAM_CATALOG", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, (code, proc.stderr)
    if expected is not None:
        assert proc.stdout == expected, (code, proc.stdout)
