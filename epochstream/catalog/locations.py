"""Where a catalog is: a path or a URL. Which kind of catalog a location names
(:func:`location_kind`: ``"sqlite"``, ``"postgresql"`` or ``"tcp"``; an unknown ``scheme://`` is
refused with :class:`~epochstream.errors.CatalogError` naming the ones this version knows, never
taken for a directory name), the SQLite file of a path (:func:`resolve_path`,
:func:`default_catalog_path`), a catalog's URL (:class:`CatalogURL`) and the local directory
standing for a catalog given by URL (:func:`local_home`).

Pure functions of their arguments and the environment (``$EPOCHSTREAM_CATALOG``,
``$EPOCHSTREAM_HOME``); which implementation serves each kind is :mod:`epochstream.catalog.api`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import CatalogError

__all__ = ["ENV_VAR", "DEFAULT_DIR", "DEFAULT_FILE", "URL_SCHEME", "SCHEMES", "HOME_VAR",
           "location_kind", "is_catalog_url", "resolve_path", "default_catalog_path",
           "local_home", "CatalogURL"]

ENV_VAR = "EPOCHSTREAM_CATALOG"
"""The environment variable naming the default catalog (a path or a URL)."""
DEFAULT_DIR = ".epochstream"
DEFAULT_FILE = "catalog.sqlite"
URL_SCHEME = "tcp://"
"""A catalog given as a string starting with this is the network catalog at that address."""
SCHEMES = {"sqlite": "sqlite", "postgresql": "postgresql", "postgres": "postgresql",
           "tcp": "tcp"}
"""URL scheme (lower case) -> the kind of catalog it names."""

_FILE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def location_kind(location: Any) -> str:
    """``"sqlite"``, ``"postgresql"`` or ``"tcp"``: which kind of catalog ``location`` names
    (module docstring). Raises :class:`CatalogError` for a URL scheme this version does not
    know, naming the ones it does."""
    if not isinstance(location, str):
        return "sqlite"
    m = _SCHEME.match(location)
    if m is None:
        return "sqlite"
    kind = SCHEMES.get(m.group(1).lower())
    if kind is None:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise CatalogError(f"unknown catalog URL scheme {m.group(1)!r} in {location.split('@')[-1]!r}"
                           f": a catalog is a path, or a URL starting with one of {known}")
    return kind


def is_catalog_url(path: Any) -> bool:
    """Whether ``path`` names a network catalog: a string ``"tcp://host:port"`` (any case)."""
    return isinstance(path, str) and path[:len(URL_SCHEME)].lower() == URL_SCHEME


def resolve_path(path: str | os.PathLike) -> Path:
    """The SQLite file for ``path``: ``<dir>/catalog.sqlite`` for a directory (existing, or not
    existing and without a catalog file suffix), else ``path`` itself; ``sqlite:///abs/path``
    and ``sqlite://rel/path`` name the path after the scheme."""
    if isinstance(path, str) and path[:9].lower() == "sqlite://":
        path = path[9:]
    p = Path(path).expanduser()
    if p.is_dir():
        return p / DEFAULT_FILE
    if p.suffix.lower() in _FILE_SUFFIXES or p.is_file():
        return p
    return p / DEFAULT_FILE  # a directory that does not exist yet


def default_catalog_path() -> Path:
    """``$EPOCHSTREAM_CATALOG`` if set (a directory or a ``.sqlite`` file), else
    ``./.epochstream/catalog.sqlite`` under the current working directory. (For a
    ``$EPOCHSTREAM_CATALOG`` that is a URL this is meaningless: :class:`Catalog` opens the
    URL.)"""
    env = os.environ.get(ENV_VAR)
    if env:
        return resolve_path(env)
    return Path.cwd() / DEFAULT_DIR / DEFAULT_FILE


HOME_VAR = "EPOCHSTREAM_HOME"
"""Environment variable naming the local directory that stands for a catalog given by URL
(default ``~/.epochstream``)."""


def local_home() -> Path:
    """``$EPOCHSTREAM_HOME``, else ``~/.epochstream`` (absolute)."""
    return Path(os.environ.get(HOME_VAR) or "~/.epochstream").expanduser().absolute()


class CatalogURL(str):
    """A catalog's URL as :attr:`Catalog.path` (``str(path)`` is the URL, passwords included,
    for passing the catalog on, e.g. to Spark executors; messages use the catalog's ``repr``,
    which hides them). ``parent`` is the local directory standing for the catalog's directory,
    ``$EPOCHSTREAM_HOME/<host>_<port>`` for ``tcp://`` and ``$EPOCHSTREAM_HOME/<host>_<port>_<db>``
    for PostgreSQL (:func:`local_home`): the default home of epoch logs
    (``Retention(dir=None)``)."""

    @property
    def parent(self) -> Path:
        parts = urlsplit(str(self))
        host = (parts.hostname or "localhost").replace(":", "_")
        port = parts.port or (5432 if parts.scheme != "tcp" else 0)
        db = parts.path.strip("/")
        return local_home() / (f"{host}_{port}" + (f"_{db}" if db else ""))

    @property
    def name(self) -> str:
        return str(self)

