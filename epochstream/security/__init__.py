"""Who may connect and who may subscribe or publish: CURVE encryption and authentication of the
sockets, and per-topic grants (docs/security.md). One module per job, each importing only the
ones above it:

- :mod:`~epochstream.security.keys`: key files and ``$EPOCHSTREAM_KEYS`` (:func:`load_keypair`,
  :func:`load_public`, :func:`load_allowed`);
- :mod:`~epochstream.security.grants`: :class:`Grant` and :func:`grant_matches` (pure);
- :mod:`~epochstream.security.config`: the :class:`Security` value;
- :mod:`~epochstream.security.zap`: CURVE on sockets (:func:`apply_server`,
  :func:`apply_client`) and one pyzmq ZAP handler per ZeroMQ context (:func:`authenticator`);
- :mod:`~epochstream.security.authorizer`: a secured publisher's :class:`Authorizer` (the
  peer's principal, its grants re-read on a thread of its own).

Every name is importable from here, as it was when this was one module.
"""

from .authorizer import GRANTS_REFRESH_S, NOT_AUTHORISED, Authorizer
from .config import Security, checked
from .grants import ANYONE, OPERATIONS, Grant, check_grant, grant_matches
from .keys import (ENV_KEYS, check_server_key, is_z85_key, key_dir, load_allowed, load_keypair,
                   load_public)
from .zap import _allow_list as _allow_list  # private: epochstream.catalog.server
from .zap import apply_client, apply_server, authenticator, release_authenticator

__all__ = ["Security", "checked", "Grant", "OPERATIONS", "ANYONE", "ENV_KEYS", "NOT_AUTHORISED",
           "GRANTS_REFRESH_S", "grant_matches", "check_grant", "check_server_key", "is_z85_key",
           "key_dir", "load_keypair", "load_public", "load_allowed", "authenticator",
           "apply_server", "apply_client", "release_authenticator", "Authorizer"]
