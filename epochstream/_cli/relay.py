"""``epochstream relay TOPIC``: run a :class:`~epochstream.transport.relay.Relay` in the
foreground until SIGINT/SIGTERM or until the upstream topic ends.

It prints one line on stdout once it serves, ``relay TOPIC -> TOPIC@TIER on ENDPOINT``, and a
line on stderr when it stops (how many data messages and frontier changes it forwarded).
"""

from __future__ import annotations

from typing import Optional

import zmq
from rich.markup import escape

from ..catalog import Catalog
from ..errors import EpochstreamError, TopicNotFound
from .output import EXIT_ERROR, EXIT_USAGE, announce, err, fail, until_signal

__all__ = ["run_relay"]


def run_relay(topic: str, catalog: Catalog, tier: str, bind: str, advertise: Optional[str],
              key: Optional[str], wait: float, *, client_key: Optional[str] = None,
              server_key: Optional[str] = None, allow: Optional[str] = None) -> None:
    """Relay ``topic`` of ``catalog`` (an open Catalog) as ``topic@tier`` bound on ``bind``;
    ends with status 0 when stopped by a signal or when the upstream topic ended, 1 when the
    upstream failed (the relay aborted downstream), 2 for an unknown topic or bad usage."""
    from ..transport.relay import Relay

    try:
        from ..security import Security
        if allow is not None and server_key is None:
            raise ValueError("--allow needs --server-key (the tier's key pair)")
        up = None if client_key is None else Security.curve(client_secret=client_key)
        down = None if server_key is None else Security.curve(server_secret=server_key,
                                                              allow=allow)
        relay = Relay(topic, catalog, tier=tier, endpoint=bind, advertise=advertise, key=key,
                      wait=wait, upstream_security=up, security=down)
    except TopicNotFound as e:
        raise fail(str(e), EXIT_USAGE, hint="'epochstream topics' lists the topics") from None
    except ValueError as e:
        raise fail(str(e), EXIT_USAGE) from None
    except zmq.ZMQError as e:
        raise fail(f"cannot bind the relay to {bind}: {e}",
                   hint="pass --bind tcp://HOST:PORT with a free port, or PORT * for any") from None
    except (EpochstreamError, TimeoutError) as e:
        raise fail(str(e)) from None
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
