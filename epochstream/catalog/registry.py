"""Which implementation of :class:`~epochstream.catalog.api.Catalog` serves a kind of
location: each implementation registers itself (:func:`implementation`), the package names the
module of each kind (:func:`implemented_in`), imported by the first ``Catalog(location)`` of
that kind (:func:`implementing`). Importable from :mod:`epochstream.catalog.api` too."""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["implementation", "implemented_in", "implementing"]

_IMPLEMENTATIONS: dict[str, type] = {}
_MODULES: dict[str, str] = {}


def implemented_in(module: str, *kinds: str) -> None:
    """Declare that ``module`` (a dotted name) registers the implementation of ``kinds``: it is
    imported by the first ``Catalog(location)`` of one of them, not before."""
    for kind in kinds:
        _MODULES[kind] = module


def implementation(*kinds: str) -> Callable[[type], type]:
    """Class decorator: ``Catalog(location)`` returns an instance of the decorated class for a
    location of one of ``kinds`` (:func:`location_kind`)."""
    def register(cls: type) -> type:
        for kind in kinds:
            _IMPLEMENTATIONS[kind] = cls
        return cls
    return register


def implementing(kind: str) -> type:
    """The class registered for ``kind`` (:func:`~epochstream.catalog.locations.location_kind`),
    its module imported first if it has not registered yet."""
    if kind not in _IMPLEMENTATIONS and kind in _MODULES:
        importlib.import_module(_MODULES[kind])  # it registers itself
    return _IMPLEMENTATIONS[kind]
