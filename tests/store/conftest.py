"""Tests of epoch logs in an object store (issue 23). Helpers of ``tests/`` (``store_fixtures``)
and ``tests/sockets/`` (``peer_processes``) are imported as top-level modules: both folders are
put on ``sys.path``.

``weed``: ONE SeaweedFS S3 server for the session (:class:`store_fixtures.WeedS3`), started on
first use, killed at the end; its credentials are in ``os.environ`` meanwhile (pyarrow and the
child processes read them there). A missing ``weed`` binary fails the tests, never skips them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_here = Path(__file__).parent
for _folder in (_here, _here.parent / "sockets", _here.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from store_fixtures import ACCESS_KEY, SECRET_KEY, WeedS3  # noqa: E402


@pytest.fixture(scope="session")
def weed(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    server = WeedS3(tmp_path_factory.mktemp("weed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
