"""Extension load errors as the running workers see them now.

Each worker process writes, at every heartbeat, its *current* errors into the hash
``<ns>:extension_errors`` under its own worker id (``{"at": epoch s, "errors": {source:
why}}``; ``{}`` when all its extensions loaded) and removes its field when it stops. A
reader keeps the fields refreshed within ``max_age_s`` seconds, so an error fixed and
restarted away disappears instead of lingering (Smarter's ``ExtensionToolkit.errors``,
fleet-wide). Values written by older workers (plain text) are ignored.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["WorkerErrors", "current_errors"]


class WorkerErrors(BaseModel):
    """One worker's report.

    Attributes:
        at: Unix epoch seconds of the report.
        errors: extension source -> why it was not loaded (secrets scrubbed).
    """

    at: float
    errors: dict[str, str]


def current_errors(
    fields: dict[Any, Any], max_age_s: float, now: float | None = None
) -> dict[str, str]:
    """The union of the fresh worker reports in ``fields`` (the raw hash).

    Args:
        fields: worker id -> encoded :class:`WorkerErrors` (bytes or str).
        max_age_s: reports older than this many seconds are ignored.
        now: Unix epoch seconds (default: the current time).

    Returns:
        Extension source -> why it was not loaded.
    """
    now = time.time() if now is None else now
    found: dict[str, str] = {}
    for raw in fields.values():
        try:
            report = WorkerErrors.model_validate_json(raw)
        except (ValidationError, ValueError):
            continue
        if now - report.at <= max_age_s:
            for source, why in report.errors.items():
                found.setdefault(source, why)
    return dict(sorted(found.items()))
