"""What the producer tells the host application as calls are listed and resolve."""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from typing import Any

from toolfleet.shared.metric_labels import AskedNames, model_label
from toolfleet.shared.signals import tool_presented

__all__ = ["count_late_reply", "count_unknown", "observe_call", "present"]

#: The names asked for that label ``toolfleet_client_unknown_functions`` in this process.
_ASKED = AskedNames()

log = logging.getLogger("toolfleet.producer")


def present(functions: list[str], account: str | None, format: str) -> None:  # noqa: A002
    """Fire ``tool_presented`` (a subscriber's failure is logged, never raised)."""
    try:
        tool_presented.send("toolfleet", functions=functions, account=account, format=format)
    except Exception:  # noqa: BLE001 - a hook never breaks tools()
        log.exception("a tool_presented subscriber failed")


#: (function label, status) -> its series of ``toolfleet_client_call_duration_seconds``
#: (``labels()`` takes a lock and checks its arguments on every call; a series, once
#: made, stays the metric's).
_DURATIONS: dict[tuple[str, str], Any] = {}


def observe_call(function: str, status: str, sent_at: float) -> None:
    """Record a published call's end-to-end time (``toolfleet_client_call_duration_seconds``)."""
    series = _DURATIONS.get((function, status))
    if series is None:
        from toolfleet.producer import metrics  # lazily: no metric files for a mere import

        series = metrics.CALL_DURATION.labels(function, str(status))
        _DURATIONS[(function, status)] = series
    series.observe(max(0.0, time.time() - sent_at))


def count_late_reply() -> None:
    """Count a reply that came after its call resolved (``toolfleet_client_late_replies``)."""
    from toolfleet.producer import metrics

    metrics.LATE_REPLIES.inc()


def count_refused(function: str, reason: str) -> None:
    """Count a call refused at publish (``toolfleet_client_refused_total``).

    Labelled by function and reason (``in_flight``, ``per_s``, ``breaker``), never by
    account: the catalog bounds functions; nothing bounds accounts.
    """
    from toolfleet.producer import metrics

    metrics.REFUSED.labels(function, reason).inc()


def count_unknown(function: str, llmclient: str | None, models: Container[str]) -> None:
    """Count a call to a function the catalog does not hold (``unknown_function``).

    ``toolfleet_client_unknown_functions{model, asked}``: the model under the
    ``quality_models`` bound, the name asked for under :class:`AskedNames`' bound.
    """
    from toolfleet.producer import metrics

    metrics.UNKNOWN_FUNCTIONS.labels(model_label(llmclient, models), _ASKED.label(function)).inc()
