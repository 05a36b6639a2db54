"""Deprecated alias of :mod:`epochstream.transport.discovery`, removed in the next release."""

from .discovery import *  # noqa: F401,F403
from .discovery import __all__  # noqa: F401
