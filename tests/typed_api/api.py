"""The documented public API as a user writes it; type-checked with mypy --strict
(tests/test_typed_api.py), never run. Each line is a usage the docs show."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolfleet.producer import AsyncToolClient, CallEvent, ToolClient
from toolfleet.shared import (
    CallContext,
    Extension,
    ExtensionContext,
    ExtensionToolError,
    Status,
    Tool,
    ToolCallError,
    ToolCallResult,
)
from toolfleet.testing import FleetFactory, RunningFleet, run_tool, start_fleet

# -- an extension ------------------------------------------------------------------------


class AddDaysArguments(BaseModel):
    date: str
    days: int = 1


class AddDays(Tool):
    """Add days to a date."""

    name = "add_days"
    arguments_model = AddDaysArguments
    timeout_s = 2.0

    def call(self, arguments: AddDaysArguments, context: ExtensionContext) -> str:
        if arguments.days > 10_000:
            raise ExtensionToolError("days: at most 10000")
        context.logger.info("adding %d days for %s", arguments.days, context.account)
        return arguments.date


extension = Extension(slug="dates", version="1.0.0", tools=[AddDays])

# -- the sync client ---------------------------------------------------------------------


def sync_usage() -> None:
    with ToolClient("redis://localhost:6379/0", namespace="toolfleet") as client:
        result: ToolCallResult = client.call(
            "ext_dates_add_days", {"date": "2024-01-01"}, context={"account": "acme"}
        )
        status: Status = result.status
        content: Any = result.content
        ok: bool = result.ok
        error: str | None = result.error
        same: ToolCallResult = result.raise_for_status()
        future: Future[ToolCallResult] = client.submit(
            "ext_dates_add_days",
            '{"date": "2024-01-01", "days": 3}',
            tool_call_id="call_0",
            context=CallContext(account="acme", conversation="c1"),
            timeout_s=10.0,
        )
        cancelled: bool = client.cancel(client.submit("ext_dates_add_days", {}).call_id)
        later: ToolCallResult = future.result(timeout=10)
        messages: list[dict[str, Any]] = client.dispatch(
            [{"id": "call_1", "function": {"name": "ext_dates_add_days", "arguments": "{}"}}],
            context={"account": "acme"},
            timeout_s=30.0,
        )
        listed: list[dict[str, Any]] = client.tools(account="acme", format="anthropic")
        with client.stream([]) as events:
            for event in events:
                kind: str = event.kind
                final: ToolCallResult | None = event.result
        print(status, content, ok, error, same, cancelled, later, messages, listed, kind, final)
    try:
        result.raise_for_status()
    except ToolCallError as exc:
        print(exc.status)


# -- the async client --------------------------------------------------------------------


async def async_usage() -> None:
    async with AsyncToolClient("redis://localhost:6379/0") as client:
        result: ToolCallResult = await client.call("ext_dates_add_days", {"date": "2024-01-01"})
        future = await client.submit("ext_dates_add_days", {"date": "2024-01-01"})
        awaited: ToolCallResult = await future
        both: tuple[ToolCallResult, ToolCallResult] = await asyncio.gather(
            client.call("ext_dates_add_days", {}), client.call("ext_dates_add_days", {})
        )
        messages: list[dict[str, Any]] = await client.dispatch([], on_event=_on_event)
        listed: list[dict[str, Any]] = await client.tools()
        async with client.stream([]) as events:
            async for event in events:
                print(event.kind)
        print(result.status, awaited, both, messages, listed)


def _on_event(event: CallEvent) -> None:
    print(event.kind, event.function)


# -- toolfleet.testing -------------------------------------------------------------------


def test_add_days() -> None:
    result: ToolCallResult = run_tool(extension, "add_days", {"date": "2024-01-01"})
    assert result.status is Status.OK
    bad = run_tool("mypkg.tools:extension", "add_days", '{"days": "x"}', timeout_s=1.0)
    assert bad.status is Status.INVALID_ARGUMENTS
    run_tool(Path("extensions/dates"), "ext_dates_add_days", None, context={"account": "a"})
    run_tool(AddDays, "add_days", {}, context=CallContext(user="u"))


def test_on_a_fleet(toolfleet_fleet: FleetFactory, toolfleet_redis: str) -> None:
    fleet: RunningFleet = toolfleet_fleet("mypkg.tools:extension", processes=1)
    url: str = fleet.url
    client: ToolClient = fleet.client
    functions: list[str] = fleet.functions
    pids: list[int] = fleet.pids
    assert client.call("ext_dates_add_days", {"date": "2024-01-01"}).ok
    print(url, functions, pids, toolfleet_redis)


def module_fleet(toolfleet_redis: str) -> None:
    with start_fleet("mypkg.tools:extension", Path("ext"), redis_url=toolfleet_redis) as fleet:
        fleet.client.call("ext_dates_add_days", {})
