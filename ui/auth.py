"""Who may look and who may act: tokens with roles, session cookies, CSRF tokens.

Tokens live in a TOML file the operator writes (``--tokens-file``); only their SHA-256
is stored::

    [[tokens]]
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    role = "operator"   # or "viewer"

``POST /login`` with the form field ``token`` exchanges a token for a session cookie: a
value signed with HMAC-SHA256 under a per-process secret (or ``session_secret``, so that
sessions survive restarts and replicas), holding the role, an expiry and a random
session id. The cookie is ``HttpOnly`` and ``SameSite=Strict``, and ``Secure`` when the
request came over HTTPS. Every state-changing request must carry the session's CSRF
token (an HMAC of its session id, in the form field ``csrf``): the OWASP "synchronizer
token" pattern, stateless. The login form itself carries a token bound to a pre-session
cookie (double submit), so that a page elsewhere cannot log a browser in.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from toolfleet.shared.tokens import find_by_token

__all__ = [
    "SESSION_COOKIE",
    "AuthCallback",
    "Principal",
    "Role",
    "Sessions",
    "TokenEntry",
    "TokensFileError",
    "load_tokens",
]

#: The session cookie's name.
SESSION_COOKIE = "toolfleet_session"
#: The pre-session cookie the login form's CSRF token is bound to.
LOGIN_COOKIE = "toolfleet_login"


class Role(enum.StrEnum):
    """What a principal may do.

    ``viewer`` looks; ``operator`` also flips switches and retries or deletes dead letters.
    """

    VIEWER = "viewer"
    OPERATOR = "operator"


class TokenEntry(BaseModel):
    """One ``[[tokens]]`` table: a token's SHA-256 (64 hex digits) and its role."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    role: Role


class _TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry] = Field(min_length=1)


class TokensFileError(ValueError):
    """The tokens file is missing, not TOML, or not ``[[tokens]]`` with ``sha256``/``role``."""


def load_tokens(path: Path) -> tuple[TokenEntry, ...]:
    """Read a tokens file (format in the module docstring).

    Raises:
        TokensFileError: the file cannot be read or does not have that shape.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return tuple(_TokensFile.model_validate(data).tokens)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TokensFileError(f"tokens file {path}: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise TokensFileError(f"tokens file {path}: {where}: {first['msg']}") from exc


@dataclass(frozen=True)
class Principal:
    """Who is asking: their role and the id their CSRF token is bound to."""

    role: Role
    session_id: str

    @property
    def may_act(self) -> bool:
        """Whether this principal may change the fleet (an operator)."""
        return self.role is Role.OPERATOR


#: A host application's decision when the app is mounted: the request's principal, or
#: None to refuse it. Sync or async.
AuthCallback = Callable[[Request], "Principal | None | Awaitable[Principal | None]"]


class Sessions:
    """Sign and check session cookies and CSRF tokens.

    Args:
        tokens: the accepted tokens.
        secret: the HMAC key (default: 32 random bytes, so sessions end with the process).
        max_age_s: seconds a session lasts.
    """

    def __init__(
        self, tokens: tuple[TokenEntry, ...], secret: bytes | None = None, max_age_s: int = 43200
    ) -> None:
        self._tokens = {entry.sha256.lower(): entry.role for entry in tokens}
        self._secret = secret or secrets.token_bytes(32)
        self.max_age_s = max_age_s

    def role_of_token(self, token: str) -> Role | None:
        """The role of a presented token (compared by SHA-256, in constant time)."""
        return find_by_token(self._tokens, token)

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._secret, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def issue(self, role: Role) -> str:
        """A session cookie value for ``role``."""
        payload = f"{role.value}.{int(time.time()) + self.max_age_s}.{secrets.token_hex(16)}"
        return f"{payload}.{self._sign(payload)}"

    def check(self, cookie: str | None) -> Principal | None:
        """The principal of a session cookie value, or None (absent, forged or expired)."""
        if not cookie or cookie.count(".") != 3:
            return None
        payload, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._sign(payload)):
            return None
        role, expires, session_id = payload.split(".")
        if not expires.isdigit() or int(expires) < time.time():
            return None
        try:
            return Principal(Role(role), session_id)
        except ValueError:
            return None

    def csrf_token(self, session_id: str) -> str:
        """The CSRF token of session (or pre-session) ``session_id``."""
        return self._sign(f"csrf.{session_id}")

    def csrf_ok(self, session_id: str, presented: str | None) -> bool:
        """Whether ``presented`` is the CSRF token of ``session_id``."""
        return bool(presented) and hmac.compare_digest(str(presented), self.csrf_token(session_id))
