"""What the commands declare alike, defined once: ``typing.Annotated`` aliases for the
parameters several commands take (TOPIC, NAME, ``--catalog``, ``--records``) and
:func:`new_app`, the settings every typer app of the command line shares.

A command takes them as ``topic: Topic`` or ``catalog: CatalogToRead = None``; the help text
comes with the alias.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

__all__ = ["new_app", "Topic", "TopicOrAll", "Name", "CatalogToRead", "CatalogToChange",
           "CatalogToWrite", "CatalogToRegisterIn", "Records"]


def new_app(name: str, help: str, short_help: Optional[str] = None,
            epilog: Optional[str] = None) -> typer.Typer:
    """A typer app (the main one, or a command group's, listed in the main help with
    ``short_help``) with plain, click-style help (wrapped paragraphs, no ``<type>`` column), no
    completion commands, no pretty tracebacks, and its help shown when it is run without a
    command."""
    return typer.Typer(name=name, help=help, short_help=short_help, epilog=epilog,
                       no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, rich_markup_mode=None)


def _catalog(what: str) -> Any:
    """The ``--catalog`` option of a command that uses the catalog ``what`` (``to read``)."""
    return typer.Option(
        "--catalog", "-c", metavar="PATH",
        help=f"Catalog directory or .sqlite file {what}, or a catalog service's URL "
             f"tcp://HOST:PORT (default: $EPOCHSTREAM_CATALOG, else "
             f"./.epochstream/catalog.sqlite).")


Topic = Annotated[str, typer.Argument(metavar="TOPIC", hidden=True)]
"""A topic's name, a command's first argument (its help text says what it is)."""

TopicOrAll = Annotated[Optional[str], typer.Argument(metavar="[TOPIC]", hidden=True)]
"""A topic's name, or none for every topic (default ``None``)."""

Name = Annotated[str, typer.Argument(metavar="NAME", hidden=True)]
"""The name of a durable subscription or consumer group, after TOPIC."""

CatalogToRead = Annotated[Optional[str], _catalog("to read")]
"""``--catalog`` of a command that reads the catalog (default ``None``)."""

CatalogToChange = Annotated[Optional[str], _catalog("to change")]
"""``--catalog`` of a command that changes the catalog (default ``None``)."""

CatalogToWrite = Annotated[Optional[str], _catalog("to write")]
"""``--catalog`` of a command that writes the catalog, created if needed (default ``None``)."""

CatalogToRegisterIn = Annotated[Optional[str], _catalog("to read and register in")]
"""``--catalog`` of ``relay``, which reads a topic and registers one (default ``None``)."""

Records = Annotated[bool, typer.Option("--records", "-r",
                                       help="Also print each epoch's records (one per line).")]
"""``--records`` of ``tail`` and ``history`` (default ``False``)."""
