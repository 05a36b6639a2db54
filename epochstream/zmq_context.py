"""The process's shared ZeroMQ context, with room for many topics (issue 28).

``zmq.Context.instance()`` opens at most 1,023 sockets (libzmq's default ``ZMQ_MAX_SOCKETS``)
and a publisher holds three (its ROUTER and the two ends of its wake-up pipe), so one process
could hold only 341 publishers — the 342nd failed with ``ZMQError: Too many open files`` while
the process had thousands of file descriptors left. :func:`default_context` returns the same
``zmq.Context.instance()`` with its socket limit raised to the process's file-descriptor limit
(``RLIMIT_NOFILE``, at least libzmq's default, at most libzmq's ``ZMQ_SOCKET_LIMIT``): every
socket needs at least one descriptor, so the descriptors, not an arbitrary count, are the bound.

libzmq reads the limit when the context opens its first socket: raising it has no effect on a
context that already has sockets (an application that opened sockets on
``zmq.Context.instance()`` before epochstream did keeps libzmq's default; it can set
``ctx.set(zmq.MAX_SOCKETS, n)`` itself, or pass its own ``context=``).
"""

from __future__ import annotations

import zmq

__all__ = ["default_context", "socket_limit"]

_raised: "zmq.Context | None" = None


def socket_limit(ctx: zmq.Context) -> int:
    """The socket limit :func:`default_context` gives ``ctx``: ``RLIMIT_NOFILE``'s soft limit,
    at least the context's current limit, at most libzmq's ``ZMQ_SOCKET_LIMIT``."""
    try:
        import resource
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    except (ImportError, OSError, ValueError):  # not on POSIX: keep libzmq's default
        nofile = 0
    return max(ctx.get(zmq.MAX_SOCKETS), min(int(nofile), ctx.get(zmq.SOCKET_LIMIT)))


def default_context() -> zmq.Context:
    """``zmq.Context.instance()``, its socket limit raised once (see the module)."""
    global _raised
    ctx = zmq.Context.instance()
    if ctx is not _raised:
        ctx.set(zmq.MAX_SOCKETS, socket_limit(ctx))
        _raised = ctx
    return ctx
