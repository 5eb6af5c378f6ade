"""Calls per tool, by status and minute, with wait and run times: what the overview charts.

Read from the per-minute aggregates the workers add at heartbeat time
(:mod:`toolfleet.shared.aggregates`), never from the page's memory or the calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from toolfleet.shared.aggregates import Cell, Window, minute_of, read_window

__all__ = ["WINDOW_MINUTES", "Activity", "ToolActivity", "activity_from", "read_activity"]

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


def read_activity(client: redis.Redis, namespace: str | Sequence[str], now: float) -> Activity:
    """The last :data:`WINDOW_MINUTES` minutes of the fleet's per-minute aggregates.

    One pipelined round trip of one ``HGETALL`` per minute and key prefix
    (:func:`toolfleet.shared.aggregates.read_window`): bounded by the window, whatever
    the call volume. Models are summed per function.

    Args:
        client: a Redis client of the fleet.
        namespace: the key prefix, or several (on a cluster: each queue group's).
        now: the current time, Unix epoch seconds.

    Raises:
        redis.RedisError: Redis failed.
    """
    current = minute_of(now)
    since = current - (WINDOW_MINUTES - 1) * 60
    return activity_from(read_window(client, namespace, since_s=since, until_s=now), now)


def activity_from(window: Window, now: float) -> Activity:
    """Sum a window's cells per function: per minute, over the last two minutes, and overall.

    Args:
        window: the aggregates read.
        now: Unix epoch seconds (the last minute of the window holds it).
    """
    current = minute_of(now)
    per_minute: dict[str, list[int]] = {}
    last: dict[str, Cell] = {}
    total: dict[str, Cell] = {}
    for minute in window.minutes:
        age = (current - minute.start_s) // 60
        if age < 0 or age >= WINDOW_MINUTES:
            continue
        for function, cell in minute.by_function().items():
            counts = per_minute.setdefault(function, [0] * WINDOW_MINUTES)
            counts[WINDOW_MINUTES - 1 - age] += cell.calls
            total.setdefault(function, Cell(function, "")).add(cell)
            if age <= 1:
                last.setdefault(function, Cell(function, "")).add(cell)
    tools = {
        name: ToolActivity(
            function=name,
            per_minute=tuple(counts),
            last_minute=dict(last[name].statuses) if name in last else {},
            by_status=dict(total[name].statuses),
            wait_p50_s=total[name].wait.quantile(0.50),
            wait_p95_s=total[name].wait.quantile(0.95),
            run_p50_s=total[name].run.quantile(0.50),
            run_p95_s=total[name].run.quantile(0.95),
        )
        for name, counts in per_minute.items()
    }
    return Activity(tools, f"the per-minute aggregates in Redis (last {WINDOW_MINUTES} min)")
