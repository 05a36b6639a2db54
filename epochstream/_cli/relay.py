"""``epochstream relay TOPIC``: run a :class:`~epochstream.transport.relay.Relay` in the
foreground until SIGINT/SIGTERM or until the upstream topic ends.

It prints one line on stdout once it serves, ``relay TOPIC -> TOPIC@TIER on ENDPOINT``, and a
line on stderr when it stops (how many data messages and frontier changes it forwarded).
"""

from __future__ import annotations

from typing import Optional

import typer

from ..catalog import Catalog
from ..errors import TopicNotFound
from .catalogs import open_existing_catalog
from .errors import cannot_bind, exit_on_errors
from .output import EXIT_ERROR, EXIT_USAGE, announce, err, escape, fail, until_signal
from .params import CatalogToRegisterIn, Topic

__all__ = ["commands", "relay", "run_relay"]

commands = typer.Typer()
"""The command this module adds to the main app."""


@commands.command(
    short_help="Republish a topic as TOPIC@TIER: one subscription upstream, many downstream.",
    help="Subscribe to TOPIC once and republish it as the topic TOPIC@TIER, registered in the "
         "catalog, for any number of subscribers (Subscriber(\"TOPIC@TIER\", ...), or "
         "'epochstream tail TOPIC@TIER'); a relay of a relay makes a chain. Epochs stay whole; "
         "subscribers' filters are applied here (--key names the topic's key column). Prints "
         "'relay TOPIC -> TOPIC@TIER on ENDPOINT' once it serves and runs until SIGINT/SIGTERM "
         "or until TOPIC ends. Exit status 0 when stopped or when TOPIC ended, 1 if the "
         "upstream failed (the relay aborts TOPIC@TIER: its subscribers raise "
         "PublisherAborted), 2 for an unknown topic or bad usage.")
def relay(
    topic: Topic,
    catalog: CatalogToRegisterIn = None,
    tier: str = typer.Option("relay", "--tier", metavar="NAME",
                             help="The tier's name: the relay serves TOPIC@NAME."),
    bind: str = typer.Option("tcp://127.0.0.1:*", "--bind", metavar="tcp://HOST:PORT",
                             help="Where subscribers connect: tcp://0.0.0.0:* for every "
                                  "interface, a port * for any free one."),
    advertise: Optional[str] = typer.Option(
        None, "--advertise", metavar="HOST",
        help="The address registered in the catalog (default: the bound one; a wildcard bind "
             "registers this machine's host name)."),
    key: Optional[str] = typer.Option(None, "--key", metavar="COLUMN",
                                      help="The topic's key column, for subscribers' keys=."),
    wait: float = typer.Option(10.0, "--wait", metavar="SECONDS",
                               help="How long to wait for TOPIC and its publishers."),
    client_key: Optional[str] = typer.Option(
        None, "--client-key", metavar="SECRET",
        help="The relay's CURVE key pair upstream (a .key_secret file or a name in "
             "$EPOCHSTREAM_KEYS), for a secured TOPIC (docs/security.md)."),
    server_key: Optional[str] = typer.Option(
        None, "--server-key", metavar="SECRET",
        help="Serve TOPIC@NAME over CURVE with this key pair (grants on TOPIC@NAME)."),
    allow: Optional[str] = typer.Option(
        None, "--allow", metavar="DIR",
        help="With --server-key: the client certificates allowed to connect."),
) -> None:
    run_relay(topic, open_existing_catalog(catalog), tier, bind, advertise, key, wait,
              client_key=client_key, server_key=server_key, allow=allow)


def run_relay(topic: str, catalog: Catalog, tier: str, bind: str, advertise: Optional[str],
              key: Optional[str], wait: float, *, client_key: Optional[str] = None,
              server_key: Optional[str] = None, allow: Optional[str] = None) -> None:
    """Relay ``topic`` of ``catalog`` (an open Catalog) as ``topic@tier`` bound on ``bind`` (the
    options of ``relay``); ends with status 0 when stopped by a signal or when the upstream
    topic ended, 1 when the upstream failed (the relay aborted downstream), 2 for an unknown
    topic or bad usage."""
    import zmq

    from ..transport.relay import Relay

    with exit_on_errors(usage=(ValueError,), others=(TimeoutError,)):
        try:
            from ..security import Security
            if allow is not None and server_key is None:
                raise ValueError("--allow needs --server-key (the tier's key pair)")
            up = None if client_key is None else Security.curve(client_secret=client_key)
            down = None if server_key is None else Security.curve(server_secret=server_key,
                                                                  allow=allow)
            relay = Relay(topic, catalog, tier=tier, endpoint=bind, advertise=advertise,
                          key=key, wait=wait, upstream_security=up, security=down)
        except TopicNotFound as e:
            raise fail(str(e), EXIT_USAGE, hint="'epochstream topics' lists the topics") from None
        except zmq.ZMQError as e:
            raise cannot_bind("the relay", bind, e) from None
    with until_signal() as stop:
        try:
            announce(f"relay {topic} -> {relay.name} on {relay.publisher.advertised}")
            while not stop.is_set() and not relay.join(0.5):
                pass
        finally:
            relay.close()
    err().print(escape(f"relay {relay.name} stopped ({relay.stats['data']} data messages, "
                       f"{relay.stats['frontier']} frontier changes forwarded)"), soft_wrap=True)
    if relay.error is not None:
        raise fail(f"the upstream subscription failed, so the relay aborted {relay.name}: "
                   f"{relay.error}", EXIT_ERROR)
