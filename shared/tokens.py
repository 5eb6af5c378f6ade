"""Secret tokens kept as their SHA-256 digests: one rule for every tokens file.

The ops page (``toolfleet ui --tokens-file``) and the MCP gateway's bearer tokens both
read a TOML file of ``[[tokens]]`` tables that hold a token's hex SHA-256, never the
token itself, so the file holds no secret. A presented token is hashed and compared with
every known digest in constant time (:func:`hmac.compare_digest`), so the time taken
does not tell how much of a digest matched, nor which entry did.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import TypeVar

__all__ = ["find_by_token", "is_digest", "token_digest"]

_HEX = frozenset("0123456789abcdef")

T = TypeVar("T")


def token_digest(token: str) -> str:
    """The lowercase hex SHA-256 (64 characters) of a token's UTF-8 bytes, as files hold it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_digest(value: str) -> bool:
    """True when ``value`` is a lowercase hex SHA-256 digest (64 hex digits)."""
    return len(value) == 64 and all(c in _HEX for c in value)


def find_by_token(by_digest: Mapping[str, T], token: str) -> T | None:
    """What ``by_digest`` (lowercase hex digest -> value) holds for a presented token.

    Every entry is compared, matched or not, so the time taken depends only on the
    number of entries. Returns ``None`` for an unknown token.
    """
    digest = token_digest(token)
    found: T | None = None
    for known, value in by_digest.items():
        if hmac.compare_digest(known, digest):
            found = value
    return found
