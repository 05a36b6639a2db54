"""Grants, pure: who may do what on which topics, and the one decision (docs/security.md).

A grant (:class:`Grant`, stored by the catalog: ``Catalog.grant``/``revoke``/``grants``) is
``(principal, topic pattern, operation)``: the principal a client's public key (Z85), a
certificate name of a publisher's ``allow`` directory, or ``"*"`` (:data:`ANYONE`, every
authenticated peer); the pattern an ``fnmatch`` pattern over topic names (``fnmatchcase``:
``*``, ``?``, ``[seq]``; case-sensitive); the operation one of :data:`OPERATIONS`, ``admin``
implying the others. :func:`grant_matches` is the one decision; :func:`check_grant` checks a
grant's fields.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Grant", "OPERATIONS", "ANYONE", "check_grant", "grant_matches"]

OPERATIONS = ("subscribe", "publish", "admin")
"""What a grant allows; ``admin`` implies the others."""

ANYONE = "*"
"""The principal of a grant that every authenticated peer holds."""

_MAX_TEXT = 256  # the longest principal or pattern a grant holds


@dataclass(frozen=True)
class Grant:
    """One grant: ``principal`` (a client's public key in Z85, a certificate name of the
    publisher's ``allow`` directory, or ``"*"``: any authenticated peer) may do ``op``
    (:data:`OPERATIONS`) on the topics matching ``pattern`` (``fnmatch``)."""

    principal: str
    pattern: str
    op: str


def check_grant(principal: Any, pattern: Any, op: Any) -> Grant:
    """The :class:`Grant` for these arguments, checked: non-empty strings of at most 256
    characters without whitespace for ``principal``, a non-empty string of at most 256
    characters for ``pattern``, an op of :data:`OPERATIONS`. Raises ``ValueError``."""
    if not isinstance(principal, str) or not principal or len(principal) > _MAX_TEXT or \
            any(c.isspace() for c in principal):
        raise ValueError(f"a grant's principal is a public key (Z85), a certificate name or "
                         f"'*' (a non-empty string without spaces), got {principal!r:.80}")
    if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_TEXT:
        raise ValueError(f"a grant's topic pattern is a non-empty string (fnmatch: * ? [..]) "
                         f"of at most {_MAX_TEXT} characters, got {pattern!r:.80}")
    if op not in OPERATIONS:
        raise ValueError(f"a grant's operation is one of {', '.join(OPERATIONS)}, got {op!r:.40}")
    return Grant(principal, pattern, op)


def grant_matches(grants: Iterable[Grant], principal: str | Iterable[str], topic: str,
                  op: str) -> bool:
    """Whether ``grants`` let ``principal`` (one principal, or the several of one peer: its key
    and certificate name) do ``op`` on ``topic``: some grant names one of them (or ``"*"``),
    its pattern matches ``topic`` (``fnmatch.fnmatchcase``) and its op is ``op`` or
    ``admin``. Raises ``ValueError`` for an op not in :data:`OPERATIONS`."""
    if op not in OPERATIONS:
        raise ValueError(f"op must be one of {', '.join(OPERATIONS)}, got {op!r}")
    who = {principal} if isinstance(principal, str) else set(principal)
    who.discard(None)
    if not who:
        return False
    return any((g.principal in who or g.principal == ANYONE) and (g.op == op or g.op == "admin")
               and fnmatch.fnmatchcase(topic, g.pattern) for g in grants)
