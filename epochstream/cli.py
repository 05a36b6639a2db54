"""The ``epochstream`` command line (typer; rich for tables and colours): the app, assembled
from the command groups of :mod:`epochstream._cli`.

Commands (``epochstream COMMAND --help`` for each):

- ``epochstream topics [--catalog PATH]`` — list the catalog's topics and their partitions
  (live / closed / aborted / dead / unregistered).
- ``epochstream tail TOPIC [--records] [--json] [--wait S] [--max-epochs N] [--timeout S]
  [--from earliest|latest|TIME] [--durable NAME [--takeover]]`` — attach to a running dataflow
  (or replay its retained history from a position) and print each complete epoch (time,
  records, bytes, lag); with ``--durable`` each epoch is acked once printed. Data goes to stdout
  (plain text unless stdout is a terminal; JSON lines with ``--json``), headers and summaries to
  stderr; a closed pipe (``| head``) ends it quietly with status 0.
- ``epochstream history TOPIC [--since T] [--until T] [--records] [--json]`` — print the
  retained epochs of a topic from its epoch logs, with no live publisher.
- ``epochstream durable ls [TOPIC]``, ``durable reset TOPIC NAME [--to ...]``, ``durable drop
  TOPIC NAME`` — durable subscriptions: list (consumer groups' positions too), re-arm at a
  position (reporting what that skips), delete.
- ``epochstream group ls [TOPIC]``, ``group info TOPIC NAME``, ``group reset TOPIC NAME``,
  ``group drop TOPIC NAME`` — consumer groups (:class:`~epochstream.group.EpochGroup`): list,
  show one with every leased unit, re-activate a stopped one, delete.
- ``epochstream drop TOPIC [--force]`` — delete a topic from the catalog, its durable
  subscriptions, consumer groups and epoch logs.
- ``epochstream retention run TOPIC [--once | --interval S] [--max-age S] [--max-bytes N]
  [--max-epochs N]`` — apply a topic's retention limits (recorded by its publishers) to its
  index and object store while holding its retention lease, for a topic with no running
  publisher (:mod:`epochstream._cli.retention`).
- ``epochstream catalog serve [--db PATH] [--bind tcp://HOST:PORT]`` — run the network catalog
  (:mod:`epochstream.catalog.server`) until SIGINT/SIGTERM.
- ``epochstream keys generate DIR NAME``, ``grant add|revoke|ls`` — CURVE key pairs and the
  catalog's grants (docs/security.md; :mod:`epochstream._cli.keys`, :mod:`epochstream._cli.grants`).
- ``epochstream demo [--days N] [--pace S] [--catalog PATH] [--master URL]`` — run the bundled
  demo (``--master spark://HOST:PORT``: on a Spark cluster; ``make demo-cluster``).
- ``epochstream --version``; ``python -m epochstream`` is the same command.

``--catalog`` takes a directory, a ``.sqlite`` file or a network catalog's URL
(``tcp://HOST:PORT``, served by ``epochstream catalog serve``); without it the catalog is
``$EPOCHSTREAM_CATALOG`` or ``./.epochstream/catalog.sqlite`` (see :mod:`epochstream.catalog`).
``topics``, ``tail`` and ``drop`` never create a catalog: a path with none is refused (status 2).

Exit statuses: 0 the stream ended (or the command succeeded); 1 a publisher was lost, dead or
aborted, ``--timeout`` passed, a durable subscription is held by another live subscriber (or
was taken over), a consumer group with live leases (``group drop`` without ``--force``), a
corrupt epoch log, or another runtime error (message on stderr); 2 bad usage, no catalog at the
path, unknown topic, durable subscription or consumer group, a closed topic, a position older
than the retained history, or an expired durable subscription; 130 interrupted with Ctrl-C.

This module assembles the app: each command group is one module of :mod:`epochstream._cli`
that declares its commands (options, help texts) and does their work — a typer sub-app
(``durable``, ``group``, ``catalog``, ``keys``, ``grant``, ``metrics``: its ``app``) or commands
of the main app (``topics``, ``tail``, ``history``, ``drop``, ``health``, ``top``, ``relay``,
``demo``: its ``commands``); :mod:`epochstream._cli` says how.
"""

from __future__ import annotations

import typer

from . import __version__
from ._cli import (catalog, dashboard, demo, drop, durable, grants, groups, history, keys,
                   observe, relay, retention, tail, topics)
# EXIT_CLOSED and EXIT_UNKNOWN_TOPIC (both EXIT_USAGE) stay importable from here for callers of
# earlier versions
from ._cli.output import (EXIT_CLOSED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK,  # noqa: F401
                          EXIT_STATUS_HELP, EXIT_UNKNOWN_TOPIC, EXIT_USAGE)
from ._cli.params import new_app

__all__ = ["app", "main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED"]

app = new_app(
    "epochstream",
    help="Epoch-atomic publish/subscribe for streaming dataflows (Strymon's pubsub protocol "
         "over ZeroMQ). Every command finds topics in a catalog: --catalog PATH, else "
         "$EPOCHSTREAM_CATALOG, else ./.epochstream/catalog.sqlite in the current directory.",
    epilog=EXIT_STATUS_HELP)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"epochstream {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Epoch-atomic publish/subscribe for streaming dataflows."""


def main() -> None:
    """Entry point of ``python -m epochstream`` (the ``epochstream`` script runs :data:`app`)."""
    app(prog_name="epochstream")


def _assemble() -> None:
    """Add every command group's commands to :data:`app`, in the order the help lists them:
    first the commands of the main app (typer >= 0.15 would take ``app.add_typer(commands)``
    without a name; pyproject allows typer 0.12), then the sub-apps, each with its own name and
    short help."""
    for module in (topics, tail, history, drop, observe, dashboard, relay, demo):
        app.registered_commands.extend(module.commands.registered_commands)
    for sub_app in (durable.app, groups.app, retention.app, catalog.app, keys.app, grants.app,
                    observe.app):
        app.add_typer(sub_app)


_assemble()


if __name__ == "__main__":  # pragma: no cover
    main()
