"""Deprecated alias of :mod:`epochstream.transport.log_server`, removed in the next release."""

from .log_server import *  # noqa: F401,F403
from .log_server import __all__  # noqa: F401
