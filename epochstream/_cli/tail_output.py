"""The lines ``epochstream tail`` writes to stdout: one per epoch (time, records, bytes, lag) in
plain text, highlighted on a terminal, or JSON lines with ``--json``; with ``--records`` also
the records themselves."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable, Optional

from .formats import fmt_bytes, fmt_seconds, fmt_time

if TYPE_CHECKING:  # rich is imported when a terminal is written to
    from rich.console import Console
    from rich.text import Text

__all__ = ["json_default", "dumps", "rows", "TailWriter", "stdout_to_devnull"]


def json_default(o: Any) -> Any:
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


def dumps(obj: Any) -> str:
    """One JSON line (non-ASCII kept as is; see :func:`json_default` for other types)."""
    return json.dumps(obj, default=json_default, ensure_ascii=False, separators=(", ", ": "))


def rows(records: Any) -> Iterable[Any]:
    """The records of an epoch one by one (a ``pyarrow.Table`` as dicts)."""
    if records is None:
        return ()
    to_pylist = getattr(records, "to_pylist", None)
    result: Iterable[Any] = to_pylist() if callable(to_pylist) else records
    return result


class TailWriter:
    """Writes ``tail``'s data to stdout: one flushed line at a time, plain text unless stdout
    is a terminal (then the time is highlighted), JSON lines with ``--json``."""

    HEADER = f"{'time':>16}  {'records':>10}  {'bytes':>12}  {'lag':>10}"

    def __init__(self, as_json: bool, records: bool) -> None:
        self.as_json = as_json
        self.records = records
        self.console: Optional[Console] = None
        if sys.stdout.isatty() and not as_json:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=True)

    def _line(self, text: str | Text) -> None:
        if self.console is not None:
            self.console.print(text)
        else:
            sys.stdout.write(f"{text}\n")
            sys.stdout.flush()

    def epoch(self, time_: Any, records: Any, n: int, nbytes: Any, lag: Optional[float]) -> None:
        """Write one complete epoch: its line (or JSON object), then its records if asked."""
        self.write(time_, records,
                   {"records": n, "bytes": nbytes, "lag": None if lag is None else round(lag, 6)},
                   f"  {n:>10}  {fmt_bytes(nbytes):>12}  {fmt_seconds(lag):>10}")

    def write(self, time_: Any, records: Any, fields: dict[str, Any], rest: str) -> None:
        """Write the epoch at ``time_``: with ``--json`` the object ``{time, **fields}`` (with
        ``--records`` one ``{time, record}`` per record instead), else its time and ``rest``
        (the other columns) on one line, then with ``--records`` its records."""
        if self.as_json:
            if self.records:
                for r in rows(records):
                    self._line(dumps({"time": time_, "record": r}))
            else:
                self._line(dumps({"time": time_, **fields}))
            return
        t = f"{fmt_time(time_):>16}"
        if self.console is not None:
            from rich.text import Text

            self._line(Text.assemble((t, "bold cyan"), rest))
        else:
            self._line(t + rest)
        if self.records:
            for r in rows(records):
                self._line(f"  {dumps(r)}")


def stdout_to_devnull() -> None:
    """After EPIPE: point stdout at /dev/null so that nothing (the interpreter's final flush
    included) writes to the closed pipe again (see the Python docs on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (e.g. captured in a test)
        pass
