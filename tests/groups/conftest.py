"""Tests of consumer groups (issue 12) with real processes. ``tests/``, ``tests/sockets/`` and
this folder are put on ``sys.path`` so helper modules import as top-level modules."""

from __future__ import annotations

import sys
from pathlib import Path

_here = Path(__file__).parent
for _folder in (_here, _here.parent / "sockets", _here.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
