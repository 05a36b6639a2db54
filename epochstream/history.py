"""Deprecated alias of :mod:`epochstream.log.reader` (:class:`History`), removed in the next
release: import ``History`` from ``epochstream`` or ``epochstream.log``."""

from .log.reader import *  # noqa: F401,F403
from .log.reader import __all__  # noqa: F401
