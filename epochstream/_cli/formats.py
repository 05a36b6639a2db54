"""How the command line writes values: logical times, byte counts, durations and timestamps."""

from __future__ import annotations

import time
from typing import Any, Optional

__all__ = ["fmt_time", "fmt_bytes", "fmt_seconds", "fmt_when"]


def fmt_time(t: Any) -> str:
    """A logical time: ``3``, or ``(3, 1)`` for a product time."""
    if isinstance(t, tuple):
        return "(" + ", ".join(str(x) for x in t) + ")"
    return str(t)


def fmt_bytes(n: Any) -> str:
    """``512 B``, ``1.5 KiB`` ... ``2.0 GiB``; ``-`` for what is not a number."""
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def fmt_seconds(s: Optional[float]) -> str:
    """``12.5 ms`` below a second, else ``1.25 s``; ``-`` for None."""
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.2f} s"


def fmt_when(ts: Optional[float]) -> str:
    """A Unix timestamp as local ``YYYY-MM-DD HH:MM:SS``; ``an unknown time`` for None."""
    if ts is None:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
