"""Transient failures of a catalog operation, and its retry: :class:`Transient` (what a store
raises when trying again may help: a PostgreSQL server restarting or failing over, a connection
lost, a serialization failure or deadlock), :func:`retried` (the decorator that runs an operation
again until :data:`RETRY_DEADLINE_S` has passed), :func:`retrying` and :func:`as_retry` (whether
the running operation is a retry, so that one that must not apply twice checks for its own
effect first).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import random
import time
from typing import Any, Iterator

from ..errors import CatalogUnavailable

__all__ = ["Transient", "retried", "retrying", "as_retry", "RETRY_DEADLINE_S"]

RETRY_DEADLINE_S = 30.0
"""Seconds a catalog operation on PostgreSQL keeps retrying a transient failure (the server
restarting or failing over, a connection lost, a serialization failure or deadlock) before it
raises :class:`~epochstream.errors.CatalogUnavailable` (``Catalog(url, timeout=...)``)."""

_RETRYING: contextvars.ContextVar[int] = contextvars.ContextVar("epochstream_catalog_retry",
                                                                default=-1)


class Transient(CatalogUnavailable):
    """A failure a catalog operation may retry (see :data:`RETRY_DEADLINE_S`): raised by a
    store, caught by :func:`retried`; it reaches a caller only as the last error when the
    deadline has passed."""


def retrying() -> bool:
    """Whether the running catalog operation is a retry: its earlier attempt failed in a way
    that leaves unknown whether it committed (a connection lost at COMMIT), so an operation
    that must not apply twice checks whether it already did."""
    return _RETRYING.get() > 0


@contextlib.contextmanager
def as_retry(attempt: int) -> Iterator[None]:
    """Run the catalog operations inside as attempt ``attempt`` (0: the first) of a request
    its sender retried (the network catalog's resends): with ``attempt > 0`` they check for
    their own effect (:func:`retrying`); either way they make no retry loop of their own."""
    token = _RETRYING.set(attempt)
    try:
        yield
    finally:
        _RETRYING.reset(token)


def retried(operation: Any) -> Any:
    """Decorator of a catalog operation (a method of an object with a ``_store``): run it again
    from the start, with jittered exponential backoff (10 ms doubling to 1 s), while it raises
    :class:`Transient`, until the store's ``retry_deadline`` (seconds) has passed; then raise
    the last error. An operation called by another runs within the caller's attempt."""
    @functools.wraps(operation)
    def attempt(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _RETRYING.get() >= 0:  # inside another operation: its loop retries
            return operation(self, *args, **kwargs)
        deadline = time.monotonic() + getattr(self._store, "retry_deadline", 0.0)
        delay, tries = 0.01, 0
        while True:
            token = _RETRYING.set(tries)
            try:
                return operation(self, *args, **kwargs)
            except Transient:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
            finally:
                _RETRYING.reset(token)
            tries += 1
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 1.0)
    return attempt

