"""``epochstream catalog serve``: run the network catalog (:class:`~epochstream.catalog_server.
CatalogServer`) in the foreground until SIGINT or SIGTERM.

It prints one line on stdout once it serves, ``catalog service on tcp://HOST:PORT (database
PATH)`` with a ``*`` port resolved (a wildcard host is followed by the host name clients may
use), and a line on stderr when it stops.
"""

from __future__ import annotations

import socket
from typing import Optional

import zmq
from rich.markup import escape

from ..catalog import ENV_VAR, is_catalog_url
from ..catalog_server import CatalogServer
from ..errors import EpochstreamError
from .output import EXIT_USAGE, announce, err, fail, until_signal

__all__ = ["serve"]


def serve(db: Optional[str], bind: str, key: Optional[str] = None,
          allow: Optional[str] = None) -> None:
    """Serve ``db`` (``None``: ``$EPOCHSTREAM_CATALOG`` if it is a path, else the default
    catalog file) on ``bind`` until SIGINT/SIGTERM, over CURVE with ``key`` (and the client
    certificates in ``allow``); a bad database, address or key ends the command (status 1, or
    2 for a URL given as the database or --allow without --key)."""
    if db is not None and is_catalog_url(db):
        raise fail(f"--db must be a catalog file or directory, not a URL ({db})", EXIT_USAGE)
    if allow is not None and key is None:
        raise fail("--allow needs --key (the service's key pair)", EXIT_USAGE)
    security = None
    if key is not None:
        from ..security import Security
        try:
            security = Security.curve(server_secret=key, allow=allow)
        except ValueError as e:
            raise fail(str(e), EXIT_USAGE) from None
    try:
        server = CatalogServer(db, bind, security=security)
    except zmq.ZMQError as e:
        raise fail(f"cannot bind the catalog service to {bind}: {e}",
                   hint="pass --bind tcp://HOST:PORT with a free port, or PORT * for any") from None
    except EpochstreamError as e:
        raise fail(str(e), hint=f"pass --db PATH (the environment variable {ENV_VAR} names a "
                                "URL or an unusable path)" if db is None else None) from None
    with until_signal() as stop:
        try:
            server.start()
            where = server.endpoint
            host = where.partition("://")[2].rpartition(":")[0].strip("[]")
            also = (f"; clients use tcp://{socket.gethostname()}:{where.rpartition(':')[2]}"
                    if host in ("0.0.0.0", "::", "*") else "")
            curve = ("" if security is None else
                     f"; CURVE, server key {security.server_public}")
            announce(f"catalog service on {where} (database {server.catalog.path}){also}{curve}")
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
    err().print(escape(f"catalog service on {server.endpoint} stopped "
                       f"({server.stats['requests']} requests, {server.stats['errors']} errors)"),
                soft_wrap=True)
