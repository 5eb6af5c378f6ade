"""Bearer tokens for the HTTP gateway: verify a token, map it to an account.

Verification is the SDK's :class:`mcp.server.auth.provider.TokenVerifier` protocol
(``async verify_token(token) -> AccessToken | None``), so any verifier plugs in (JWT,
OAuth introspection, ...). A verifier names the caller's account in the access token's
``claims["account"]``; :func:`caller_of` reads it. A token without that claim calls with
no account: it sees only tools no allow-list restricts.

:class:`StaticTokenVerifier` is the built-in one: a TOML file of SHA-256 digests of the
tokens (so the file itself holds no secret), each with its account::

    [[tokens]]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    account = "acme"
    user = "support-bot"        # optional: CallContext.user of its calls
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.tokens import find_by_token, is_digest, token_digest

__all__ = ["ACCOUNT_CLAIM", "Caller", "StaticTokenVerifier", "caller_of", "token_digest"]

#: The ``AccessToken.claims`` key naming the caller's toolfleet account.
ACCOUNT_CLAIM = "account"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls through the gateway.

    Attributes:
        account: ``CallContext.account`` of the calls (per-account availability).
        user: ``CallContext.user`` of the calls (the token's subject or client id).
    """

    account: str | None
    user: str | None = None


def caller_of(token: AccessToken | None, default: Caller) -> Caller:
    """The caller a verified token stands for; ``default`` when there is no token.

    Args:
        token: what the verifier returned for the request's bearer token.
        default: the caller of an unauthenticated connection (stdio, or HTTP run open).
    """
    if token is None:
        return default
    claims = token.claims or {}
    account = claims.get(ACCOUNT_CLAIM)
    return Caller(
        account=str(account) if account is not None else None,
        user=token.subject or token.client_id,
    )


class StaticTokenVerifier:
    """A :class:`~mcp.server.auth.provider.TokenVerifier` over a fixed set of token digests.

    Args:
        tokens: hex SHA-256 digest of each token -> (account, user or ``None``).

    Raises:
        ConfigurationError: a digest that is not 64 hex digits.
    """

    def __init__(self, tokens: dict[str, tuple[str, str | None]]) -> None:
        for digest in tokens:
            if not is_digest(digest):
                raise ConfigurationError(f"not a hex SHA-256 digest: {digest[:12]}...")
        self._tokens = dict(tokens)

    @classmethod
    def from_file(cls, path: Path) -> StaticTokenVerifier:
        """Read a tokens file (shape in the module docstring).

        Raises:
            ConfigurationError: the file is missing, not TOML, or an entry lacks
                ``sha256`` or ``account``.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read tokens file {path}: {exc}") from None
        entries: Any = data.get("tokens", [])
        if not isinstance(entries, list):
            raise ConfigurationError(f"{path}: [[tokens]] must be an array of tables")
        tokens: dict[str, tuple[str, str | None]] = {}
        for i, entry in enumerate(entries):
            digest, account = entry.get("sha256"), entry.get("account")
            if not isinstance(digest, str) or not isinstance(account, str) or not account:
                raise ConfigurationError(f"{path}: tokens[{i}] needs sha256 and account strings")
            user = entry.get("user")
            tokens[digest.lower()] = (account, str(user) if user is not None else None)
        return cls(tokens)

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access token of a known token (account in its claims), else ``None``."""
        found = find_by_token(self._tokens, token)
        if found is None:
            return None
        account, user = found
        return AccessToken(
            token="",  # never kept: nothing downstream needs the secret itself
            client_id=user or account,
            scopes=[],
            subject=user,
            claims={ACCOUNT_CLAIM: account},
        )
