"""Import and start-up cost (issue 28): ``from epochstream import Publisher, Subscriber,
Catalog`` and ``epochstream --version`` load nothing a msgpack topic does not use — no pyarrow,
no PostgreSQL driver, no metrics, web or Spark stack, no catalog implementation, no epoch log;
``--version`` not even the transport or pyzmq. Each check runs in a fresh interpreter and reads
its ``sys.modules``; how fast that is is measured by benchmarks/import_time.py, never asserted
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import epochstream

ROOT = Path(__file__).resolve().parent.parent

# what neither the library's import nor --version may load
NEVER = ("pyarrow", "numpy", "pandas", "psycopg", "psycopg_pool", "prometheus_client",
         "opentelemetry", "selenium", "pyspark", "starlette", "uvicorn", "psutil",
         "epochstream.log", "epochstream.catalog.sqlcatalog",
         "epochstream.catalog.client", "epochstream.catalog.schema", "epochstream.spark",
         "epochstream.metrics", "epochstream.otel", "epochstream.web", "epochstream.report",
         "epochstream.demo", "epochstream._demo", "epochstream.group", "epochstream.aio")
# and --version none of these either (typer is its one dependency; rich only prints)
NOT_FOR_VERSION = ("zmq", "msgpack", "rich", "epochstream.transport", "epochstream.wire")
# the library's import: no command-line stack
NOT_FOR_LIBRARY = ("typer", "rich", "click")

_REPORT = "import json, sys; print('\\n' + json.dumps(sorted(sys.modules)))"


def _modules(code: str) -> set[str]:
    """The modules a fresh interpreter running ``code`` (then :data:`_REPORT`) has loaded."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("EPOCHSTREAM_CATALOG", None)
    proc = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True,
                          text=True, env=env, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules for n in names if m == n or m.startswith(n + "."))


def test_the_library_import_loads_only_what_a_msgpack_topic_uses():
    modules = _modules("from epochstream import Publisher, Subscriber, Catalog")
    assert {"zmq", "msgpack", "epochstream.transport.publisher"} <= modules  # it did import
    assert not _loaded(modules, NEVER + NOT_FOR_LIBRARY)


@pytest.mark.parametrize("how", ["python -m epochstream", "the epochstream script"])
def test_version_loads_neither_the_transport_nor_pyarrow(how):
    run = ("import runpy\ntry:\n    runpy.run_module('epochstream', run_name='__main__')\n"
           if how == "python -m epochstream" else
           "from epochstream.cli import app\ntry:\n    app()\n")  # what the script runs
    code = ("import sys\nsys.argv = ['epochstream', '--version']\n" + run +
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n")
    modules = _modules(code)
    assert "epochstream.cli" in modules
    assert not _loaded(modules, NEVER + NOT_FOR_VERSION)


def test_version_prints_the_version():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "epochstream", "--version"], capture_output=True,
                          text=True, env=env, timeout=60, cwd=ROOT)
    expected = (0, f"epochstream {epochstream.__version__}\n", "")
    assert (proc.returncode, proc.stdout, proc.stderr) == expected


def test_a_msgpack_topic_end_to_end_never_loads_pyarrow(tmp_path):
    """Publishing, logging (retention) and a filtered subscription of msgpack records: the
    Arrow codec and ``pyarrow.compute`` stay unloaded (they are for Arrow topics)."""
    modules = _modules(
        "from epochstream import Publisher, Subscriber, Catalog, Filter, Retention\n"
        f"cat = Catalog({str(tmp_path / 'cat')!r})\n"
        "pub = Publisher('t', catalog=cat, retention=Retention())\n"
        "sub = Subscriber('t', catalog=cat, record_filter=Filter(where=[('x', '>', 1)]))\n"
        "assert sub.wait_ready(30)\n"  # joined before the first epoch (a busy machine)
        "for e in range(3):\n"
        "    pub.send(e, [{'x': e}, {'x': e + 2}])\n"
        "    pub.advance_to(e + 1)\n"
        "got = [ep for _, ep in zip(range(3), sub.epochs(timeout=10))]\n"
        "assert [len(ep.records) for ep in got] == [1, 1, 2], got\n"
        "pub.close(); sub.close(); cat.close()")
    assert {"epochstream.log", "epochstream.catalog.sqlcatalog"} <= modules  # it did run
    assert not _loaded(modules, ("pyarrow", "numpy", "pandas", "psycopg", "typer", "rich"))


def test_every_lazy_name_still_imports():
    """What was made lazy still answers ``from ... import X`` for every name of ``__all__``."""
    modules = _modules("import epochstream, epochstream.catalog, epochstream.catalog.holders\n"
                       "from epochstream import *\nfrom epochstream.catalog import *\n"
                       "for m in (epochstream, epochstream.catalog):\n"
                       "    for n in m.__all__: getattr(m, n)\n"
                       "assert isinstance(epochstream.catalog.holders.HOST, str)")
    assert {"epochstream.catalog.sqlcatalog", "epochstream.catalog.client"} <= modules
