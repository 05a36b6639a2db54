"""The demo's live display: a progress bar of the epochs complete on every partition, with the
number of subscribers connected to the host's publishers; lines printed meanwhile (joins,
epochs, a subscriber that is not the demo's joining or leaving) appear above it."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["connected", "LiveDisplay"]


def connected(host: Any) -> int | None:
    """Subscribers connected to the host's publishers now (the largest count over partitions;
    ``None`` if the host does not tell)."""
    try:
        return int(host.subscribers())
    except Exception:  # noqa: BLE001 - display only
        return None


class LiveDisplay:
    """The progress bar of ``days`` epochs on ``console``, used as a context manager (the bar
    shows meanwhile). ``host`` tells how many subscribers are connected."""

    def __init__(self, console: Console, days: int, host: Any) -> None:
        self.host = host
        self.others = 0  # subscribers that are not the demo's own (e.g. a tail)
        self.progress = Progress(TextColumn("[progress.description]{task.description}"),
                                 BarColumn(), MofNCompleteColumn(), TextColumn("epochs"),
                                 TimeElapsedColumn(), TextColumn("{task.fields[subs]}"),
                                 console=console, transient=False)
        self.days = days
        self.task: Any = None

    def __enter__(self) -> LiveDisplay:
        self.progress.__enter__()
        self.task = self.progress.add_task("streaming days", total=self.days, subs="")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def print(self, line: str) -> None:
        """Print ``line`` (rich markup) above the bar."""
        self.progress.console.print(line)

    def update(self, completed: int, ours: int) -> None:
        """Show ``completed`` epochs and the connected subscribers; ``ours`` of them are the
        demo's own, the others are announced as they join or leave."""
        self.progress.update(self.task, completed=completed, subs=self._subscribers(ours))

    def _subscribers(self, ours: int) -> str:
        n = connected(self.host)
        if n is None:
            return ""
        extra = max(0, n - ours)
        if extra != self.others:
            what = "joined" if extra > self.others else "left"
            self.print(f"[bold]a subscriber {what}[/] (not one of the demo's; "
                       f"{n} connected now)")
            self.others = extra
        return f"{n} subscriber(s)"
