"""The terminal status of a tool call: a leaf module (it imports nothing of toolfleet).

Wire models (:mod:`toolfleet.shared.wire`) carry it in every result; each error class
of :mod:`toolfleet.shared.errors` names the one status it stands for.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Status"]


class Status(StrEnum):
    """Terminal status of a tool call (the ``status`` field of a result)."""

    OK = "ok"
    TOOL_ERROR = "tool_error"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_FUNCTION = "unknown_function"
    NOT_AVAILABLE = "not_available"
    TIMEOUT = "timeout"
    CANCELED = "canceled"
    EXPIRED = "expired"
    CRASHED = "crashed"
    REJECTED = "rejected"
