"""Which catalog a command opens: ``--catalog PATH``, else ``$EPOCHSTREAM_CATALOG``, else
``./.epochstream/catalog.sqlite``. The reading commands (topics, tail, drop) never create one.
A network catalog's URL (``tcp://HOST:PORT``) in either place opens that catalog service; one
that does not answer ends the command (status 1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..catalog import DEFAULT_FILE, ENV_VAR, Catalog, default_catalog_path, location_kind
from .errors import exit_on_errors
from .output import EXIT_USAGE, fail

__all__ = ["open_catalog", "catalog_file", "open_existing_catalog", "given_catalog"]


def open_catalog(path: Optional[str]) -> Catalog:
    """Open (or create) the catalog at ``path``; a catalog error ends the command (status 1)."""
    with exit_on_errors():
        return Catalog(path)


def given_catalog(path: Optional[str]) -> Optional[str]:
    """``--catalog`` if given, else ``$EPOCHSTREAM_CATALOG`` if set, else ``None``."""
    return path if path is not None else (os.environ.get(ENV_VAR) or None)


def catalog_file(path: Optional[str]) -> tuple[Path, str]:
    """The catalog file a command would open, and where that choice came from."""
    if path is not None:
        raw, source = path, "given by --catalog"
    elif os.environ.get(ENV_VAR):
        raw, source = os.environ[ENV_VAR], f"from ${ENV_VAR}"
    else:
        return (default_catalog_path().absolute(),
                "the default: ./.epochstream/catalog.sqlite in the current directory")
    if raw[:9].lower() == "sqlite://":
        raw = raw[9:]
    p = Path(raw).expanduser()
    return (p / DEFAULT_FILE if p.is_dir() else p).absolute(), source


def open_existing_catalog(path: Optional[str]) -> Catalog:
    """Open the catalog a reading command (topics, tail, drop) uses; refuse (exit 2) to create
    one where none exists: a typo in --catalog must not look like an empty catalog. A network
    catalog's URL opens that service (it has a catalog file by construction)."""
    url = given_catalog(path)
    if url is not None and _is_url(url):
        return open_catalog(url)
    file, source = catalog_file(path)
    if not file.is_file():
        if file.parent.is_dir() and file.name == DEFAULT_FILE:
            where, why = file.parent, f"the directory has no {DEFAULT_FILE}"
        else:
            where, why = file, "the path does not exist"
        raise fail(f"no catalog at {where} ({source}): {why}", EXIT_USAGE,
                   hint="publishers create their catalog when they start; pass --catalog PATH "
                        f"(or set ${ENV_VAR}) to the catalog they use")
    return open_catalog(str(file))


def _is_url(location: str) -> bool:
    """Whether ``location`` is a URL other than ``sqlite://`` (a service or a database, which
    exists or not by itself); an unknown scheme ends the command (status 2)."""
    with exit_on_errors(status=EXIT_USAGE):
        return location_kind(location) != "sqlite"
