"""CURVE encryption and per-topic grants (docs/security.md); the code lives in
:mod:`epochstream.security.authorizer` while it is split into one module per job."""

from .authorizer import (ANYONE, ENV_KEYS, GRANTS_REFRESH_S, NOT_AUTHORISED, OPERATIONS,
                         Authorizer, Grant, Security, apply_client, apply_server, authenticator,
                         check_grant, check_server_key, grant_matches, is_z85_key, key_dir,
                         load_allowed, load_keypair, load_public, release_authenticator)
from .authorizer import _allow_list as _allow_list  # private: epochstream.catalog.server

__all__ = ["Security", "Grant", "OPERATIONS", "ANYONE", "ENV_KEYS", "NOT_AUTHORISED",
           "GRANTS_REFRESH_S", "grant_matches", "check_grant", "check_server_key", "is_z85_key",
           "key_dir", "load_keypair", "load_public", "load_allowed", "authenticator",
           "apply_server", "apply_client", "release_authenticator", "Authorizer"]
