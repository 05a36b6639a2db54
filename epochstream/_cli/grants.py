"""``epochstream grant add|revoke|ls``: the catalog's grants — who may subscribe to (publish,
administer) which topics (docs/security.md, :meth:`epochstream.catalog.Catalog.grant`).

A principal is a client's CURVE public key (Z85, as ``epochstream keys generate`` prints it),
the name of its certificate in a publisher's ``allow`` directory, or ``*`` (any authenticated
client); given as the path of a certificate file (``alice.key``), its public key is used. A
topic pattern is an ``fnmatch`` pattern (``flights.*``). ``add`` creates the catalog if needed
(and says which file it wrote); ``revoke`` and ``ls`` never create one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import EpochstreamError
from ..security import OPERATIONS, check_grant, load_public
from .catalogs import open_catalog, open_existing_catalog
from .output import EXIT_USAGE, err, fail, out
from .tail_output import dumps

__all__ = ["grant_app"]

grant_app = typer.Typer(
    name="grant",
    help="Who may subscribe to which topics: grants (principal, topic pattern, operation) in "
         "the catalog, checked by publishers started with security=Security.curve(...): "
         "docs/security.md.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_OPS = ", ".join(OPERATIONS)


def _catalog_option(what: str) -> Any:
    return typer.Option(
        None, "--catalog", "-c", metavar="PATH",
        help=f"Catalog directory or .sqlite file {what}, or a catalog service's URL "
             f"tcp://HOST:PORT (default: $EPOCHSTREAM_CATALOG, else "
             f"./.epochstream/catalog.sqlite).")


def _principal(value: str) -> str:
    """A principal as given, or the public key of the certificate file at that path."""
    if value != "*" and Path(value).expanduser().is_file():
        try:
            return load_public(Path(value).expanduser(), "PRINCIPAL")
        except ValueError as e:
            raise fail(str(e), EXIT_USAGE) from None
    return value


def _op(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in OPERATIONS:
        raise fail(f"--op must be one of {_OPS}, got {value!r}", EXIT_USAGE)
    return value


@grant_app.command(
    "add", short_help="Let PRINCIPAL subscribe to (--op) the topics matching PATTERN.",
    help="Grant PRINCIPAL (a public key in Z85, a certificate name of the publisher's allow "
         "directory, '*' for any authenticated client, or a certificate file whose public key "
         "is taken) the operation --op on every topic matching PATTERN (fnmatch: * ? [..]). "
         "Secured publishers see it within about a second. Creates the catalog if needed. "
         "Exit status 0 on success, 1 if the catalog cannot be written, 2 for bad usage.")
def grant_add(
    principal: str = typer.Argument(..., metavar="PRINCIPAL"),
    pattern: str = typer.Argument(..., metavar="PATTERN"),
    op: str = typer.Option("subscribe", "--op", metavar="OP",
                           help=f"The operation: {_OPS} (admin implies the others)."),
    catalog: Optional[str] = _catalog_option("to write"),
) -> None:
    who = _principal(principal)
    _op(op)
    try:
        check_grant(who, pattern, op)
    except ValueError as e:
        raise fail(str(e), EXIT_USAGE) from None
    cat = open_catalog(catalog)
    try:
        g = cat.grant(who, pattern, op)
    except EpochstreamError as e:
        raise fail(str(e)) from None
    err().print(f"granted {escape(g.op)} on {escape(g.pattern)} to {escape(g.principal)} "
                f"(catalog {escape(cat.where)})", soft_wrap=True)


@grant_app.command(
    "revoke", short_help="Delete PRINCIPAL's grants (all, or for PATTERN / --op).",
    help="Delete PRINCIPAL's grants: every one, or only those with exactly PATTERN and/or "
         "--op. Secured publishers drop the subscribers it no longer authorises within about "
         "a second. Prints how many grants were deleted. Exit status 0 (also when none "
         "matched), 1 if the catalog cannot be written, 2 for bad usage or no catalog at the "
         "path.")
def grant_revoke(
    principal: str = typer.Argument(..., metavar="PRINCIPAL"),
    pattern: Optional[str] = typer.Argument(None, metavar="[PATTERN]"),
    op: Optional[str] = typer.Option(None, "--op", metavar="OP",
                                     help=f"Only grants of this operation ({_OPS})."),
    catalog: Optional[str] = _catalog_option("to change"),
) -> None:
    who = _principal(principal)
    _op(op)
    try:
        check_grant(who, "*" if pattern is None else pattern, op or "admin")
    except ValueError as e:
        raise fail(str(e), EXIT_USAGE) from None
    cat = open_existing_catalog(catalog)
    try:
        n = cat.revoke(who, pattern, op)
    except EpochstreamError as e:
        raise fail(str(e)) from None
    out().print(f"revoked {n} grant{'' if n == 1 else 's'}", soft_wrap=True)


@grant_app.command(
    "ls", short_help="List the grants (those that apply to TOPIC).",
    help="List the catalog's grants, or only those whose pattern matches TOPIC: principal, "
         "pattern, operation; --json writes one JSON object per line. Exit status 0, 2 for "
         "no catalog at the path.")
def grant_ls(
    topic: Optional[str] = typer.Argument(None, metavar="[TOPIC]"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per grant and line."),
    catalog: Optional[str] = _catalog_option("to read"),
) -> None:
    cat = open_existing_catalog(catalog)
    try:
        grants = cat.grants(topic)
    except EpochstreamError as e:
        raise fail(str(e)) from None
    console = out()
    if as_json:
        for g in grants:
            console.print(escape(dumps({"principal": g.principal, "pattern": g.pattern,
                                        "op": g.op})), soft_wrap=True)
        return
    if not grants:
        err().print("no grants" + (f" for topic {escape(topic)}" if topic else ""))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("principal", "pattern", "op"):
        table.add_column(column, no_wrap=True)
    for g in grants:
        table.add_row(escape(g.principal), escape(g.pattern), g.op)
    console.print(table)
