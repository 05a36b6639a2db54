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
from typing import Optional

import typer

from ..security import OPERATIONS, check_grant, load_public
from .catalogs import open_catalog, open_existing_catalog
from .errors import exit_on_errors
from .output import EXIT_USAGE, err, escape, fail, out
from .params import CatalogToChange, CatalogToRead, CatalogToWrite, new_app
from .tail_output import dumps

__all__ = ["app"]

app = new_app(
    "grant",
    help="Who may subscribe to which topics: grants (principal, topic pattern, operation) in "
         "the catalog, checked by publishers started with security=Security.curve(...): "
         "docs/security.md.",
    short_help="Who may subscribe to which topics: grant add|revoke|ls.")

_OPS = ", ".join(OPERATIONS)


def _principal(value: str) -> str:
    """A principal as given, or the public key of the certificate file at that path."""
    if value != "*" and Path(value).expanduser().is_file():
        with exit_on_errors(usage=(ValueError,)):
            return load_public(Path(value).expanduser(), "PRINCIPAL")
    return value


def _op(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in OPERATIONS:
        raise fail(f"--op must be one of {_OPS}, got {value!r}", EXIT_USAGE)
    return value


@app.command(
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
    catalog: CatalogToWrite = None,
) -> None:
    who = _principal(principal)
    _op(op)
    with exit_on_errors(usage=(ValueError,)):
        check_grant(who, pattern, op)
    cat = open_catalog(catalog)
    with exit_on_errors():
        g = cat.grant(who, pattern, op)
    err().print(f"granted {escape(g.op)} on {escape(g.pattern)} to {escape(g.principal)} "
                f"(catalog {escape(cat.where)})", soft_wrap=True)


@app.command(
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
    catalog: CatalogToChange = None,
) -> None:
    who = _principal(principal)
    _op(op)
    with exit_on_errors(usage=(ValueError,)):
        check_grant(who, "*" if pattern is None else pattern, op or "admin")
    cat = open_existing_catalog(catalog)
    with exit_on_errors():
        n = cat.revoke(who, pattern, op)
    out().print(f"revoked {n} grant{'' if n == 1 else 's'}", soft_wrap=True)


@app.command(
    "ls", short_help="List the grants (those that apply to TOPIC).",
    help="List the catalog's grants, or only those whose pattern matches TOPIC: principal, "
         "pattern, operation; --json writes one JSON object per line. Exit status 0, 2 for "
         "no catalog at the path.")
def grant_ls(
    topic: Optional[str] = typer.Argument(None, metavar="[TOPIC]"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per grant and line."),
    catalog: CatalogToRead = None,
) -> None:
    cat = open_existing_catalog(catalog)
    with exit_on_errors():
        grants = cat.grants(topic)
    console = out()
    if as_json:
        for g in grants:
            console.print(escape(dumps({"principal": g.principal, "pattern": g.pattern,
                                        "op": g.op})), soft_wrap=True)
        return
    if not grants:
        err().print("no grants" + (f" for topic {escape(topic)}" if topic else ""))
        return
    from rich.table import Table  # here: rich only for a command that prints

    table = Table(box=None, pad_edge=False)
    for column in ("principal", "pattern", "op"):
        table.add_column(column, no_wrap=True)
    for g in grants:
        table.add_row(escape(g.principal), escape(g.pattern), g.op)
    console.print(table)
