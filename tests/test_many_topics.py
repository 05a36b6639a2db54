"""One process holds more topics than libzmq's default socket limit allows (issue 28, the
curve of topics per process): ``zmq.Context.instance()`` opens at most 1,023 sockets, three per
publisher, so the 342nd publisher of a process failed with ``ZMQError: Too many open files``.
epochstream's :func:`~epochstream.zmq_context.default_context` raises the limit to the
file-descriptor limit. Run in a fresh interpreter: the limit is read when the context opens its
first socket."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, sys
    from epochstream import Publisher, Subscriber
    n = int(sys.argv[1])
    pubs = [Publisher(f"many-{i}", codec="msgpack") for i in range(n)]
    subs = [Subscriber(f"many-{i}", endpoints=[p.endpoint], codec="msgpack") for i, p in
            enumerate(pubs[:20])]
    print(len(pubs), len(subs), flush=True)
    os._exit(0)
""")


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 4096,
                    reason="needs a file-descriptor limit of at least 4096")
def test_one_process_holds_400_publishers_with_the_default_context():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT, "400"], capture_output=True, text=True,
                         timeout=50, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["400", "20"]


def test_socket_limit_follows_the_descriptor_limit():
    import zmq

    from epochstream.zmq_context import socket_limit
    ctx = zmq.Context()
    try:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = socket_limit(ctx)
        assert limit >= 1023 and limit <= ctx.get(zmq.SOCKET_LIMIT)
        if 1023 <= nofile <= ctx.get(zmq.SOCKET_LIMIT):
            assert limit == nofile
    finally:
        ctx.term()
