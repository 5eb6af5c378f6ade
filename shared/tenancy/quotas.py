"""Per-account quotas: calls in flight and calls per second, set at run time.

Quotas are stored in the hash ``<ns>:limits`` (:func:`limits_key`), one field per scope,
each a JSON :class:`Quota`:

- ``<account>``: every call of that account;
- ``<account>/<function>``: that account's calls of one function (checked as well);
- ``*``: the quota of an account that has no field of its own.

An account with no field and no ``*`` field gets the producer's
:class:`~toolfleet.shared.settings.Settings` defaults (``quota_in_flight``,
``quota_per_s``). Calls without an account have no quota.

Both limits are checked and taken atomically by the enqueue script
(:mod:`.enqueue`) in the same Redis call that publishes, so any number of producer
processes share them exactly. Calls per second are a GCRA (generic cell rate
algorithm: one "theoretical arrival time" per scope, ``burst`` calls at once, then one
per ``1 / per_s`` seconds). Calls in flight are a sorted set of call ids scored by their
deadline; an id leaves it at its deadline, or, when the set is full, as soon as the
call's outcome exists (the worker records one for every call it answers), so a
producer or worker that dies leaks nothing past the call's deadline.

Over quota is answered ``rejected`` (refused before running, as a full queue is), not a
new status: every client and model already handles ``rejected``, and the error tree
stays one class per status. The content says why, in words a model can act on, and
carries ``retry_after_s`` (seconds, a number) for programs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared.naming import limits_key

__all__ = [
    "DEFAULT_SCOPE",
    "Quota",
    "over_quota_content",
    "limits_key",
    "quota_scopes",
    "retry_after_s",
]

#: The scope whose quota applies to accounts without their own.
DEFAULT_SCOPE = "*"


class Quota(BaseModel):
    """One scope's quota (a field of ``<ns>:limits``); ``None`` means no limit.

    Attributes:
        in_flight: most calls published and not yet answered at once.
        per_s: calls per second, sustained.
        burst: calls allowed at once above the sustained rate (default: ``per_s``
            rounded up, at least 1).
    """

    model_config = ConfigDict(extra="forbid")

    in_flight: int | None = Field(default=None, ge=1)
    per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)


def quota_scopes(account: str | None, function: str) -> list[str]:
    """The scopes a call of ``function`` by ``account`` is checked against (none without one)."""
    if not account:
        return []
    return [account, f"{account}/{function}"]


def over_quota_content(message: str, retry_after: float) -> dict[str, Any]:
    """The content of an over-quota answer: ``{"error": ..., "retry_after_s": seconds}``."""
    seconds = round(max(retry_after, 0.001), 3)
    return {"error": f"{message}; retry after {seconds:g} s", "retry_after_s": seconds}


def retry_after_s(content: Any) -> float | None:
    """The ``retry_after_s`` of a result's content, seconds, or ``None`` when it has none."""
    if isinstance(content, dict):
        value = content.get("retry_after_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
