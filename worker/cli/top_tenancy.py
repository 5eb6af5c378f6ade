"""The tenancy part of ``toolfleet top``: lanes, breakers, concurrency slots and quotas."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis

from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.tenancy.breakers import breaker_key
from toolfleet.shared.tenancy.lanes import LANES, lane_keys, uses_lanes
from toolfleet.shared.tenancy.quotas import Quota, limits_key
from toolfleet.worker.cli.top_layout import Section
from toolfleet.worker.tenancy.concurrency import concurrency_key

__all__ = ["tenancy_sections"]

#: Most quota rows shown (``toolfleet limits list`` shows them all).
MAX_QUOTA_ROWS = 10


def tenancy_sections(
    client: redis.Redis,
    layout: KeyLayout,
    functions: list[str],
    queues: list[str],
    queue_of: Mapping[str, str] | None = None,
) -> list[Section]:
    """Tables of what is limited now; a table with nothing to show is left out.

    Args:
        client: Redis client.
        layout: where the keys are: a queue's lanes and its functions' breakers and slots
            in the queue's group, the quotas people set in the fleet's copy.
        functions: the catalogued function names.
        queues: the catalogued queues.
        queue_of: function name -> its queue (a function not in it: the default group).
    """
    laned = [q for q in queues if uses_lanes(q)]
    queue_of = queue_of or {}
    pipe = client.pipeline(transaction=False)
    for queue in laned:
        for key in lane_keys(layout.of_queue(queue), queue):
            pipe.llen(key)
    now_ms = int(time.time() * 1000)
    for function in functions:
        prefix = layout.of_queue(queue_of.get(function, ""))
        pipe.hgetall(breaker_key(prefix, function))
        pipe.zcount(concurrency_key(prefix, function), now_ms, "+inf")
    pipe.hgetall(limits_key(layout.fleet))
    values: list[Any] = pipe.execute()
    sections = [_lanes(laned, values[: LANES * len(laned)])]
    rest = values[LANES * len(laned) :]
    sections.append(_limited(functions, rest[:-1]))
    sections.append(_quotas(rest[-1]))
    return [section for section in sections if section.rows]


def _lanes(queues: list[str], depths: list[int]) -> Section:
    table = Section("account lanes", ("queue", "lanes with calls", "deepest lane"), noun="queues")
    width = len(depths) // len(queues) if queues else 0
    for i, queue in enumerate(queues):
        lanes = depths[i * width : (i + 1) * width]
        busy = [n for n in lanes if n]
        if busy:
            table.rows.append((sum(busy), [queue, str(len(busy)), str(max(busy))]))
    return table


def _limited(functions: list[str], values: list[Any]) -> Section:
    table = Section(
        "breakers and concurrency", ("function", "breaker", "retry in s", "slots held"),
        noun="functions",
    )  # fmt: skip
    now_ms = time.time() * 1000
    for i, function in enumerate(functions):
        state: dict[bytes, bytes] = values[2 * i]
        held = int(values[2 * i + 1])
        name = state.get(b"state", b"closed").decode()
        if not held and name == "closed":
            continue
        until = float(state.get(b"until", b"0"))
        wait = f"{max(0.0, (until - now_ms) / 1000):.1f}" if name != "closed" else "-"
        weight = held + (1_000_000 if name != "closed" else 0)  # an open breaker first
        table.rows.append((weight, [function, name, wait, str(held)]))
    return table


def _quotas(raw: dict[bytes, bytes]) -> Section:
    table = Section(f"quotas (first {MAX_QUOTA_ROWS})", ("scope", "in flight", "per s"),
                    noun="quotas")  # fmt: skip
    for scope, data in sorted(raw.items())[:MAX_QUOTA_ROWS]:
        try:
            quota = Quota.model_validate_json(data)
        except ValueError:
            continue
        cells = ["-" if v is None else f"{v:g}" for v in (quota.in_flight, quota.per_s)]
        table.rows.append((0.0, [scope.decode(), *cells]))
    return table
