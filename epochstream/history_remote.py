"""Deprecated alias of :mod:`epochstream.log.remote` (:class:`RemoteLog`), removed in the next
release: import from ``epochstream.log`` instead."""

from .log.remote import *  # noqa: F401,F403
from .log.remote import __all__  # noqa: F401
