"""Calls per tool, by status and minute, with wait and run times: what the overview charts.

:func:`queue_activity_reads` queues this read on a snapshot's pipeline and
:func:`activity_from` turns the replies into an :class:`Activity`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from toolfleet.shared import codec

__all__ = ["WINDOW_MINUTES", "Activity", "ToolActivity", "activity_from", "queue_activity_reads"]

#: Minutes the overview charts (the last hour).
WINDOW_MINUTES = 60


@dataclass(frozen=True)
class ToolActivity:
    """One function over the window.

    Attributes:
        function: the function name.
        per_minute: calls answered per minute, oldest minute first, the current minute last
            (:data:`WINDOW_MINUTES` values).
        last_minute: calls by status over the last full minute and the current one.
        by_status: calls by status over the whole window.
        wait_p50_s, wait_p95_s, run_p50_s, run_p95_s: seconds queued before running and
            running, over the window (None: no call measured).
    """

    function: str
    per_minute: tuple[int, ...]
    last_minute: dict[str, int]
    by_status: dict[str, int]
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    run_p50_s: float | None = None
    run_p95_s: float | None = None

    @property
    def total(self) -> int:
        """Calls over the window."""
        return sum(self.by_status.values())


@dataclass(frozen=True)
class Activity:
    """Every function's activity, and where the numbers come from.

    Attributes:
        tools: function name -> its activity (functions that answered no call are absent).
        source: a sentence naming where the numbers come from (shown on the page).
    """

    tools: dict[str, ToolActivity] = field(default_factory=dict)
    source: str = ""


def queue_activity_reads(
    pipe: redis.client.Pipeline, namespace: str, functions: list[str], now: float
) -> None:
    """Queue on ``pipe`` the reads :func:`activity_from` needs (none for the events tail)."""


def activity_from(
    values: list[Any], events: list[Any], functions: list[str], now: float
) -> Activity:
    """The activity from the replies of :func:`queue_activity_reads` and the events tail.

    Args:
        values: the replies to what :func:`queue_activity_reads` queued.
        events: ``XREVRANGE`` rows of the events stream (newest first).
        functions: the catalogued function names.
        now: Unix epoch seconds.
    """
    per_minute: dict[str, list[int]] = {}
    last: dict[str, Counter[str]] = {}
    total: dict[str, Counter[str]] = {}
    waits: dict[str, list[float]] = {}
    runs: dict[str, list[float]] = {}
    current = int(now // 60)
    for _id, fields in events:
        try:
            event = codec.loads(fields[b"event"])
        except (KeyError, codec.DecodeError):
            continue
        if not isinstance(event, dict) or event.get("kind") != "tool_responded":
            continue
        minute = int(float(event.get("at") or 0) // 60)
        age = current - minute
        if age < 0 or age >= WINDOW_MINUTES:
            continue
        function = str(event.get("function"))
        status = str(event.get("status"))
        per_minute.setdefault(function, [0] * WINDOW_MINUTES)[WINDOW_MINUTES - 1 - age] += 1
        total.setdefault(function, Counter())[status] += 1
        if age <= 1:
            last.setdefault(function, Counter())[status] += 1
        if event.get("queued_s") is not None:
            waits.setdefault(function, []).append(float(event["queued_s"]))
        if event.get("run_s") is not None:
            runs.setdefault(function, []).append(float(event["run_s"]))
    tools = {
        name: ToolActivity(
            function=name,
            per_minute=tuple(counts),
            last_minute=dict(last.get(name, {})),
            by_status=dict(total[name]),
            wait_p50_s=_quantile(waits.get(name, []), 0.50),
            wait_p95_s=_quantile(waits.get(name, []), 0.95),
            run_p50_s=_quantile(runs.get(name, []), 0.50),
            run_p95_s=_quantile(runs.get(name, []), 0.95),
        )
        for name, counts in per_minute.items()
    }
    return Activity(tools, f"the newest {len(events)} entries of the events stream")


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]
