"""Deprecated alias of :mod:`epochstream.catalog.holders`, removed in the next release."""

from .holders import *  # noqa: F401,F403
from .holders import __all__  # noqa: F401
