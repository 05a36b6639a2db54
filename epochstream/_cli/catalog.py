"""``epochstream catalog init|migrate|serve``: the catalog itself, as a typer sub-app.

- ``init [LOCATION]`` creates a catalog (a SQLite file, or the tables in a PostgreSQL
  database) at the current schema version, or says it is there already;
- ``migrate [LOCATION]`` brings an existing catalog to the current schema version in place,
  keeping every row (refusing to create one);
- ``serve`` runs the network catalog (:class:`~epochstream.catalog.server.CatalogServer`) over
  a SQLite file or a PostgreSQL database in the foreground until SIGINT or SIGTERM. It prints
  one line on stdout once it serves, ``catalog service on tcp://HOST:PORT (database PATH)``
  with a ``*`` port resolved (a wildcard host is followed by the host name clients may use),
  and a line on stderr when it stops.
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Optional

import typer

from ..catalog import ENV_VAR, is_catalog_url, location_kind
from .errors import cannot_bind, exit_on_errors
from .output import EXIT_USAGE, announce, err, escape, fail, out, until_signal
from .params import new_app

__all__ = ["app", "serve", "init"]

app = new_app(
    "catalog",
    help="The catalog itself: 'epochstream catalog init|migrate LOCATION' creates or upgrades "
         "one (a SQLite file or directory, or postgresql://USER:PASSWORD@HOST:PORT/DB); "
         "'epochstream catalog serve' answers Catalog(\"tcp://HOST:PORT\") clients "
         "(--catalog tcp://HOST:PORT, $EPOCHSTREAM_CATALOG, the Spark option catalog) on "
         "other machines, over either store.",
    short_help="The catalog: init, migrate, or serve it to other machines.")

Location = Annotated[Optional[str], typer.Argument(
    metavar="LOCATION",
    help="A catalog directory or .sqlite file, or postgresql://USER:PASSWORD@HOST:PORT/DB "
         "(libpq's PGPASSWORD etc. fill in what it leaves out); default: $EPOCHSTREAM_CATALOG, "
         "else ./.epochstream/catalog.sqlite.")]
"""The catalog ``init`` and ``migrate`` work on (default ``None``)."""


@app.command(
    "init", short_help="Create a catalog (SQLite or PostgreSQL) at the current schema.",
    help="Create the catalog at LOCATION with the current schema version, or report that it "
         "is there already (an older one is migrated in place, as 'migrate' does). Prints "
         "'catalog LOCATION: schema version N (...)'. Exit status 0, 1 if the catalog cannot be "
         "created (a wrong password, a missing database, a newer schema: one line says which), "
         "2 for a location that is not a catalog (a tcp:// service, an unknown URL scheme).")
def init_command(location: Location = None) -> None:
    init(location, create=True)


@app.command(
    "migrate", short_help="Upgrade an existing catalog to the current schema, in place.",
    help="Bring the catalog at LOCATION to the current schema version, keeping every row; "
         "refuses to create one (status 2 when there is none). Exit status 0, 1 if it cannot "
         "be opened or is newer than this version, 2 for bad usage.")
def migrate_command(location: Location = None) -> None:
    init(location, create=False)


def init(location: Optional[str], *, create: bool) -> None:
    """``catalog init`` (``create``) or ``catalog migrate`` of the catalog at ``location``."""
    from ..catalog.sqlcatalog import SqlCatalog, schema_version

    from ..catalog import default_catalog_path
    from ..catalog.api import resolve_path

    raw = location if location is not None else None
    with exit_on_errors(status=EXIT_USAGE):
        kind = location_kind(raw if raw is not None else (os.environ.get(ENV_VAR) or ""))
    if kind == "tcp":
        raise fail("a catalog service creates and migrates its own database: run 'epochstream "
                   "catalog init' where it runs, on its --db", EXIT_USAGE)
    with exit_on_errors():
        before = schema_version(raw)
    if before is None and not create:
        where = raw if raw is not None else str(default_catalog_path())
        if kind == "sqlite":
            where = str(resolve_path(where))
        raise fail(f"no catalog at {where}: nothing to migrate", EXIT_USAGE,
                   hint="create one with: epochstream catalog init LOCATION")
    with exit_on_errors():
        cat = SqlCatalog(raw)
    try:
        from ..catalog import SCHEMA_VERSION
        if before is None:
            what = "created"
        elif before == SCHEMA_VERSION:
            what = "already current"
        else:
            what = f"migrated from version {before}"
        out().print(escape(f"catalog {cat.where}: schema version {SCHEMA_VERSION} ({what})"),
                    soft_wrap=True)
    finally:
        cat.close()


@app.command(
    "serve", short_help="Serve a catalog (SQLite or PostgreSQL) to other machines.",
    help="Serve the catalog --db on --bind until SIGINT or SIGTERM. Clients open it with "
         "Catalog(\"tcp://HOST:PORT\") or --catalog tcp://HOST:PORT; their partitions are "
         "live while their lease is renewed (10 s by default). Prints 'catalog service on "
         "ENDPOINT (database PATH)' once it serves (a * port resolved). Without --key: no "
         "authentication, bind to an interface only trusted hosts reach; with --key and --allow: "
         "CURVE, only the allowed keys connect, grant/revoke need an admin grant, and every "
         "change to a topic the grant it needs: publish for a publisher's, subscribe for a "
         "consumer's, admin for a drop (docs/security.md). Exit "
         "status 0 when stopped by a signal, 1 if the database or the "
         "address cannot be used, 2 for bad usage.")
def serve_command(
    db: Optional[str] = typer.Option(
        None, "--db", metavar="LOCATION",
        help="Catalog directory or .sqlite file to serve, created if missing, or a PostgreSQL "
             "database, postgresql://USER:PASSWORD@HOST:PORT/DB (default: "
             "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite)."),
    bind: str = typer.Option(
        "tcp://127.0.0.1:7420", "--bind", metavar="tcp://HOST:PORT",
        help="Where to listen: tcp://0.0.0.0:7420 for every interface, a port * for any free "
             "one."),
    key: Optional[str] = typer.Option(
        None, "--key", metavar="SECRET",
        help="The service's CURVE key pair (a .key_secret file or a name in $EPOCHSTREAM_KEYS): "
             "serve over CURVE (docs/security.md)."),
    allow: Optional[str] = typer.Option(
        None, "--allow", metavar="DIR",
        help="With --key: the directory of the client certificates allowed to connect "
             "(default: any client key)."),
) -> None:
    serve(db, bind, key=key, allow=allow)


def serve(db: Optional[str], bind: str, key: Optional[str] = None,
          allow: Optional[str] = None) -> None:
    """Serve ``db`` (``None``: ``$EPOCHSTREAM_CATALOG`` if it is a path, else the default
    catalog file) on ``bind`` until SIGINT/SIGTERM, over CURVE with ``key`` (and the client
    certificates in ``allow``); a bad database, address or key ends the command (status 1, or
    2 for a URL given as the database or --allow without --key)."""
    import zmq

    from ..catalog.server import CatalogServer

    if db is not None and is_catalog_url(db):
        raise fail(f"--db must be a catalog file or directory or a PostgreSQL URL, not a "
                   f"catalog service's URL ({db})", EXIT_USAGE)
    if allow is not None and key is None:
        raise fail("--allow needs --key (the service's key pair)", EXIT_USAGE)
    security = None
    if key is not None:
        from ..security import Security
        with exit_on_errors(usage=(ValueError,)):
            security = Security.curve(server_secret=key, allow=allow)
    with exit_on_errors(hint=f"pass --db PATH (the environment variable {ENV_VAR} names a URL "
                             "or an unusable path)" if db is None else None):
        try:
            server = CatalogServer(db, bind, security=security)
        except zmq.ZMQError as e:
            raise cannot_bind("the catalog service", bind, e) from None
    with until_signal() as stop:
        try:
            server.start()
            where = server.endpoint
            host = where.partition("://")[2].rpartition(":")[0].strip("[]")
            also = (f"; clients use tcp://{socket.gethostname()}:{where.rpartition(':')[2]}"
                    if host in ("0.0.0.0", "::", "*") else "")
            curve = ("" if security is None else
                     f"; CURVE, server key {security.server_public}")
            announce(f"catalog service on {where} (database {server.catalog.where}){also}{curve}")
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
    err().print(escape(f"catalog service on {server.endpoint} stopped "
                       f"({server.stats['requests']} requests, {server.stats['errors']} errors)"),
                soft_wrap=True)
