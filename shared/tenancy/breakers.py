"""Circuit breakers per tool, fleet-wide: the policy a manifest declares and the answer.

A tool whose backend is down fails every call, each after burning a worker slot until
its time limit. Its breaker counts failures of the statuses its policy names (default
``timeout`` and ``crashed``) across the fleet; after ``failures`` of them in a row,
within ``window_s`` of the first, it opens for ``cooldown_s``: calls are then answered
at once, without running, ``not_available`` (the tool exists and is temporarily not
served, which is what that status means) with ``retry_after_s`` in the content. After
the cool-down one call is let through as a probe (half-open): its success closes the
breaker, its failure opens it for another cool-down. State lives in Redis, in the hash
``<ns>:breaker:<function>`` (:func:`breaker_key`), so every worker process agrees.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared.naming import breaker_key

__all__ = ["BreakerPolicy", "FailureStatus", "breaker_key", "unavailable_content"]

#: The statuses a breaker may count as failures.
FailureStatus = Literal["timeout", "crashed", "tool_error"]
DEFAULT_FAILURES: tuple[FailureStatus, ...] = ("timeout", "crashed")


class BreakerPolicy(BaseModel):
    """A tool's breaker, declared in its manifest's ``[tools.<name>]`` table as ``breaker``.

    Attributes:
        failures: failures in a row that open it.
        window_s: seconds within which those failures must fall (counted from the first).
        cooldown_s: seconds it stays open before a probe call is let through.
        on: which statuses count as failures.
    """

    model_config = ConfigDict(extra="forbid")

    failures: int = Field(default=5, ge=1)
    window_s: float = Field(default=60.0, gt=0)
    cooldown_s: float = Field(default=30.0, gt=0)
    on: list[FailureStatus] = Field(default_factory=lambda: list(DEFAULT_FAILURES))


def unavailable_content(function: str, retry_after: float) -> dict[str, Any]:
    """The content of an answer from an open breaker (``retry_after_s`` in seconds)."""
    seconds = round(max(retry_after, 0.001), 3)
    return {
        "error": (
            f"{function} is temporarily unavailable (it failed repeatedly); "
            f"retry after {seconds:g} s"
        ),
        "retry_after_s": seconds,
    }
