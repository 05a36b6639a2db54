"""The topic catalog: where publishers announce their partitions and subscribers find them, and
the index of durable history, durable subscriptions, consumer groups and grants.

``Catalog(location)`` opens a catalog and returns the implementation for ``location``: a SQLite
file (the default, embedded), a PostgreSQL database (``postgresql://...``) or the network
catalog service (``tcp://host:port``). The package, top down:

- :mod:`~epochstream.catalog.api` — the one interface, :class:`Catalog`;
  :mod:`~epochstream.catalog.locations` — where a catalog is (a path or a URL);
- :mod:`~epochstream.catalog.sqlcatalog` — :class:`SqlCatalog`, the catalog on SQL, holding
  the tables of :mod:`~epochstream.catalog.topics` (topics, partitions, grants),
  :mod:`~epochstream.catalog.history` (the epoch log index, durable subscriptions) and
  :mod:`~epochstream.catalog.groups` (consumer groups), each on its store;
- :mod:`~epochstream.catalog.store` (SQLite), :mod:`~epochstream.catalog.store_postgres`
  (PostgreSQL), :mod:`~epochstream.catalog.store_common` — connections, transactions, the
  write lock; :mod:`~epochstream.catalog.retry` — transient failures, retried;
  :mod:`~epochstream.catalog.schema` — the tables and their migrations;
- :mod:`~epochstream.catalog.client` (over :mod:`~epochstream.catalog.channel`),
  :mod:`~epochstream.catalog.server`, :mod:`~epochstream.catalog.rpc` — the network catalog
  (``epochstream catalog serve``);
- :mod:`~epochstream.catalog.records`, :mod:`~epochstream.catalog.history_records`,
  :mod:`~epochstream.catalog.group_records`, :mod:`~epochstream.catalog.holders` — what a
  reader gets, and whether a holder is still alive.

See docs/catalog.md.
"""

from typing import TYPE_CHECKING, Any

from ..security import Grant
from .api import (DEFAULT_DIR, DEFAULT_FILE, ENV_VAR, POLL_INTERVAL_S, URL_SCHEME, Catalog,
                  CatalogURL, default_catalog_path, implemented_in, is_catalog_url,
                  location_kind)
from .holders import pid_alive
from .records import STATES, PartitionInfo, TopicInfo
from .store_common import BUSY_TIMEOUT_S

if TYPE_CHECKING:  # the lazy names below, with their real types for type checkers
    from .client import RemoteCatalog as RemoteCatalog
    from .group_records import GroupInfo as GroupInfo
    from .history_records import DurableInfo as DurableInfo, EpochRecord as EpochRecord
    from .history_records import HistoryState as HistoryState
    from .schema import SCHEMA_VERSION as SCHEMA_VERSION
    from .sqlcatalog import SqlCatalog as SqlCatalog

# The implementations (and the schema, the stores, the records of history and groups) are
# imported when first used, not with the package: Catalog(location) imports the one its kind
# needs.
implemented_in(f"{__name__}.sqlcatalog", "sqlite", "postgresql")
implemented_in(f"{__name__}.client", "tcp")
_LAZY = {"SqlCatalog": "sqlcatalog", "RemoteCatalog": "client", "SCHEMA_VERSION": "schema",
         "GroupInfo": "group_records", "DurableInfo": "history_records",
         "EpochRecord": "history_records", "HistoryState": "history_records"}

__all__ = ["Catalog", "SqlCatalog", "RemoteCatalog", "TopicInfo", "PartitionInfo",
           "default_catalog_path", "pid_alive", "ENV_VAR", "DEFAULT_DIR", "DEFAULT_FILE",
           "BUSY_TIMEOUT_S", "POLL_INTERVAL_S", "SCHEMA_VERSION", "STATES", "DurableInfo",
           "EpochRecord", "HistoryState", "GroupInfo", "is_catalog_url", "location_kind",
           "URL_SCHEME", "Grant", "CatalogURL"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
