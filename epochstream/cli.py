"""The ``epochstream`` command line (typer + rich).

Commands:

- ``epochstream topics [--catalog PATH]`` — list the catalog's topics and their partitions.
- ``epochstream tail TOPIC [--catalog PATH] [--wait S] [--max-epochs N] [--timeout S]`` — attach
  to a running dataflow and print each complete epoch (time, records, bytes, lag).
- ``epochstream demo [--days N] [--host HOST] [--catalog PATH]`` — run the bundled demo.

``--catalog`` takes a directory or a ``.sqlite`` file; without it the catalog is
``$EPOCHSTREAM_CATALOG`` or ``./.epochstream/catalog.sqlite`` (see :mod:`epochstream.catalog`).

Exit statuses: 0 success, 1 a runtime error (message in red on stderr), 2 unknown topic or bad
usage, 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from .catalog import Catalog, TopicInfo
from .errors import EpochstreamError, TopicNotFound

app = typer.Typer(
    name="epochstream",
    help="Epoch-atomic publish/subscribe over ZeroMQ (Strymon pubsub protocol).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_ERROR = 1
EXIT_UNKNOWN_TOPIC = 2
EXIT_INTERRUPTED = 130

CatalogOption = typer.Option(
    None, "--catalog", "-c",
    help="Catalog directory or .sqlite file (default: $EPOCHSTREAM_CATALOG or "
         "./.epochstream/catalog.sqlite).")


def _out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(message: str, code: int = EXIT_ERROR) -> typer.Exit:
    _err().print(f"[red]error:[/red] {message}", markup=True, soft_wrap=True)
    return typer.Exit(code)


def _open_catalog(path: Optional[str]) -> Catalog:
    try:
        return Catalog(path)
    except EpochstreamError as e:
        raise _fail(str(e)) from None


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


_STATE_STYLE = {"live": "green", "closed": "blue", "dead": "red", "unregistered": "yellow"}


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
            head = ([info.name, info.order_name, info.codec, str(info.partitions)] if i == 0
                    else ["", "", "", ""])
            p = by_index.get(i)
            if p is None:
                state, endpoint, pid = "unregistered", "-", "-"
            else:
                state, endpoint, pid = p.state, p.endpoint, str(p.pid)
            style = _STATE_STYLE.get(state, "")
            table.add_row(*head, str(i), endpoint, f"[{style}]{state}[/{style}]", pid)
    return table


@app.command()
def topics(catalog: Optional[str] = CatalogOption) -> None:
    """List topics and the liveness of their partitions.

    For each topic: order, codec, number of partitions, and per partition its endpoint, state
    (live / closed / dead / unregistered) and publisher pid."""
    cat = _open_catalog(catalog)
    try:
        infos = cat.topics()
    except EpochstreamError as e:
        raise _fail(str(e)) from None
    out = _out()
    if not infos:
        out.print(f"no topics in catalog {cat.path}")
        return
    out.print(f"catalog {cat.path}")
    out.print(_topics_table(infos))


def _lookup_or_wait(cat: Catalog, topic: str, wait: float) -> TopicInfo:
    """Look ``topic`` up; if it is missing or incomplete, say so on stderr and wait for it."""
    try:
        info = cat.lookup(topic)
        if info.complete and all(p.state != "dead" for p in info.partition_info):
            return info
    except TopicNotFound:
        if wait <= 0:
            raise
    if wait > 0:
        _err().print(f"waiting up to {wait:g} s for topic {topic!r} and its publishers ...")
    return cat.lookup(topic, wait=wait)


@app.command()
def tail(
    topic: str = typer.Argument(..., help="Topic to attach to."),
    catalog: Optional[str] = CatalogOption,
    wait: float = typer.Option(10.0, "--wait", min=0.0,
                               help="Seconds to wait for the topic and all its partitions."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", min=1,
                                             help="Stop after this many complete epochs."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", min=0.0,
        help="Seconds to wait for the next epoch before giving up (default: forever)."),
) -> None:
    """Print every complete epoch of TOPIC as it is released.

    Attaches to the running dataflow's publishers and prints, per epoch: its time, record count,
    payload bytes and lag (now minus the arrival of the epoch's first data message). Ends when
    every partition has closed, after --max-epochs, or on Ctrl-C (exit 130)."""
    cat = _open_catalog(catalog)
    out = _out()
    try:
        # Look the topic up first so that an unknown topic is reported clearly (exit 2)
        # whatever the transport does.
        info = _lookup_or_wait(cat, topic, wait)
    except TopicNotFound as e:
        raise _fail(str(e), EXIT_UNKNOWN_TOPIC) from None
    except KeyboardInterrupt:
        _err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EpochstreamError as e:
        raise _fail(str(e)) from None

    try:
        from .transport import Subscriber
    except ImportError as e:
        raise _fail(f"the transport is not available: {e}") from None

    count = 0
    total_records = 0
    try:
        with Subscriber(topic, catalog=cat, wait=wait) as sub:
            out.print(f"tailing {topic!r} ({info.order_name}, {info.codec}, "
                      f"{info.partitions} partition(s))")
            out.print(f"{'time':>16}  {'records':>10}  {'bytes':>12}  {'lag':>10}")
            for epoch in sub.epochs(timeout=timeout):
                now = time.time()
                first_seen = getattr(epoch, "first_seen", None)
                lag = None if first_seen is None else max(0.0, now - first_seen)
                try:
                    n = len(epoch)
                except TypeError:
                    n = len(getattr(epoch, "records", ()) or ())
                total_records += n
                out.print(f"{_fmt_time(epoch.time):>16}  {n:>10}  "
                          f"{_fmt_bytes(getattr(epoch, 'nbytes', None)):>12}  "
                          f"{_fmt_seconds(lag):>10}")
                count += 1
                if max_epochs is not None and count >= max_epochs:
                    break
    except KeyboardInterrupt:
        _err().print(f"interrupted after {count} epoch(s)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TopicNotFound as e:
        raise _fail(str(e), EXIT_UNKNOWN_TOPIC) from None
    except (EpochstreamError, TimeoutError) as e:
        raise _fail(f"{type(e).__name__}: {e} (after {count} epoch(s))") from None
    out.print(f"{count} epoch(s), {total_records} record(s)")


@app.command()
def demo(
    days: int = typer.Option(365, "--days", min=1, help="Days of flight data to replay."),
    host: str = typer.Option("127.0.0.1", "--host", "--endpoint-host",
                             help="Host/interface the publishers bind to."),
    catalog: Optional[str] = CatalogOption,
) -> None:
    """Run the bundled demo dataflow (see epochstream.demo)."""
    try:
        from .demo import main
    except ImportError as e:
        raise _fail(f"the demo is not available: {e}") from None
    try:
        code = main(days=days, host=host, catalog=catalog)
    except KeyboardInterrupt:
        _err().print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(int(code or 0))


if __name__ == "__main__":  # pragma: no cover
    app()
