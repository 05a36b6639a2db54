"""Tests over real ZeroMQ sockets on 127.0.0.1 and real processes (the transport layer). Test
modules here import the helpers of ``tests/`` (e.g. ``hypothesis_profiles``) and of this folder
(``fault_peer``, ``adversary_peer``) as top-level modules: both folders are put on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

for _folder in (Path(__file__).parent, Path(__file__).parent.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
