"""Tests of durable history (issue 11). Test modules here import the helpers of ``tests/``
(``hypothesis_profiles``), of ``tests/sockets/`` (``peer_processes``) and of this folder
(``history_peer``) as top-level modules: all three folders are put on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

_here = Path(__file__).parent
for _folder in (_here, _here.parent / "sockets", _here.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
