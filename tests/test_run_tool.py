"""toolfleet.testing.run_tool: one call answered by the worker's pipeline, no Redis."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from conftest import TESTS, unavailable
from toolfleet.shared import (
    CallContext,
    ClientError,
    ConfigurationError,
    Extension,
    ExtensionContext,
    ExtensionToolError,
    Status,
    Tool,
)
from toolfleet.testing import run_tool
from toolfleet.worker.pipeline.calls import CRASH_MESSAGE

FOLDER = TESTS / "run_tool_ext"


class AddArguments(BaseModel):
    a: int = Field(description="First term.")
    b: int = Field(default=1, description="Second term.")


class Add(Tool):
    """Add two integers; refuse negative ones."""

    name = "add"
    arguments_model = AddArguments

    def call(self, arguments: AddArguments, context: ExtensionContext) -> int:
        if arguments.a < 0:
            raise ExtensionToolError("a: must not be negative")
        return arguments.a + arguments.b


class Seconds(BaseModel):
    seconds: float


class Sleep(Tool):
    """Block the thread (a stuck tool)."""

    name = "sleep"
    arguments_model = Seconds
    timeout_s = 0.5

    def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        threading.Event().wait(arguments.seconds)
        return arguments.seconds


class AsyncSleep(Tool):
    """Sleep on the event loop."""

    name = "async_sleep"
    arguments_model = Seconds
    timeout_s = 0.5

    async def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        await asyncio.sleep(arguments.seconds)
        return arguments.seconds


class Boom(Tool):
    """Fail with an unexpected exception."""

    name = "boom"
    arguments_model = Seconds

    def call(self, arguments: Seconds, context: ExtensionContext) -> None:
        raise RuntimeError("internal detail the model must not read")


EXTENSION = Extension(slug="calc", version="1", tools=[Add, Sleep, AsyncSleep, Boom])


def test_an_ok_call_returns_the_tools_value_and_the_wire_fields() -> None:
    """A valid call is ok, its content the tool's value, under the wire function name."""
    result = run_tool(EXTENSION, "add", {"a": 2, "b": 3})
    assert (result.status, result.content) == (Status.OK, 5)
    assert result.function == "ext_calc_add"
    assert result.worker == "toolfleet.testing" and result.run_s is not None


def test_the_model_s_json_text_is_parsed_as_a_worker_parses_it() -> None:
    """Arguments as the JSON string a model wrote, lax integers included, reach the tool."""
    result = run_tool(EXTENSION, "ext_calc_add", '{"a": "20"}')
    assert (result.status, result.content) == (Status.OK, 21)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({}, "a: field required"),
        ({"a": "x"}, "a: input should be a valid integer, unable to parse string as an integer"),
        ({"a": 1, "c": 2}, "unexpected argument: c"),
        ('{"a": 1,', "arguments are not valid JSON: "),
        ("[1, 2]", "arguments must be a JSON object, got an array"),
    ],
)
def test_bad_arguments_are_invalid_arguments_with_the_reason(arguments: Any, error: str) -> None:
    """Missing, mistyped, undeclared and unparsable arguments are invalid_arguments, and the
    model reads which argument and why."""
    result = run_tool(EXTENSION, "add", arguments)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.content["error"].startswith(error), result.content


def test_extension_tool_error_is_a_tool_error_with_its_message() -> None:
    """ExtensionToolError("why") reaches the model as {"error": "why"}, status tool_error."""
    result = run_tool(EXTENSION, "add", {"a": -1})
    assert (result.status, result.content) == (
        Status.TOOL_ERROR,
        {"error": "a: must not be negative"},
    )


def test_an_unexpected_exception_is_crashed_without_its_message() -> None:
    """Any other exception is crashed with the generic message (traceback only in the log)."""
    result = run_tool(EXTENSION, "boom", {"seconds": 0})
    assert result.status is Status.CRASHED
    assert result.content == {"error": CRASH_MESSAGE.format(ref=result.id)}


@pytest.mark.parametrize("tool", ["sleep", "async_sleep"])
def test_a_call_past_the_tools_limit_is_a_timeout_at_the_limit(tool: str) -> None:
    """A sync tool stuck in its thread and an async one are both answered timeout at their
    0.5 s limit, long before they would finish."""
    started = time.monotonic()
    result = run_tool(EXTENSION, tool, {"seconds": 30})
    waited = time.monotonic() - started
    assert result.status is Status.TIMEOUT, result.content
    assert result.content == {"error": "the tool did not finish within 0.5 s"}
    assert 0.5 <= waited < 20, waited


def test_timeout_s_is_the_callers_budget_below_the_tools_limit() -> None:
    """timeout_s=0.1 bounds a tool whose own limit is larger (limit: budget + the 0.5 s grace)."""
    result = run_tool(EXTENSION, "boom", {"seconds": 0}, timeout_s=0.1)
    assert result.status is Status.CRASHED  # answered: quicker than the budget
    stuck = run_tool(EXTENSION, "sleep", {"seconds": 30}, timeout_s=0.1)
    assert (stuck.status, stuck.content) == (
        Status.TIMEOUT,
        {"error": "the tool did not finish within 0.5 s"},
    )
    long = Extension(slug="long", version="1", tools=[Sleep], timeout_s=60)
    started = time.monotonic()
    bounded = run_tool(long, "sleep", {"seconds": 30}, timeout_s=0.2)
    assert bounded.status is Status.TIMEOUT, bounded.content
    assert time.monotonic() - started < 20


def test_a_folder_and_a_module_attr_name_the_extension_as_a_worker_loads_it() -> None:
    """An extension folder (its manifest's entry and timeout) and a MODULE:ATTR string load
    as a worker loads them; the context carries the caller's account."""
    answer = run_tool(FOLDER, "answer", None, context={"account": "acme"})
    assert (answer.status, answer.content) == (
        Status.OK,
        {"slug": "folder-tools", "account": "acme"},
    )
    by_text = run_tool(str(FOLDER), "ext_folder_tools_answer", "", context=CallContext(account="b"))
    assert by_text.content == {"slug": "folder-tools", "account": "b"}
    stuck = run_tool(FOLDER, "stuck", {})
    assert (stuck.status, stuck.content) == (
        Status.TIMEOUT,
        {"error": "the tool did not finish within 0.5 s"},
    )
    dash = run_tool("queue_names_ext:dash", "dash", {})
    assert (dash.status, dash.content) == (Status.OK, "a-b")


def test_a_bare_tool_class_is_an_extension_named_after_its_module() -> None:
    """A single Tool class is served as a worker serves one named alone."""
    result = run_tool(Add, "add", {"a": 1})
    assert (result.status, result.content) == (Status.OK, 2)
    assert result.function == "ext_test_run_tool_add"


def test_a_name_the_extension_does_not_serve_is_unknown_function() -> None:
    """What the model reads for a tool that does not exist."""
    result = run_tool(EXTENSION, "subtract", {})
    assert (result.status, result.content) == (
        Status.UNKNOWN_FUNCTION,
        {"error": "unknown function 'subtract'"},
    )


def test_misuse_raises_as_the_client_does() -> None:
    """Bad argument types and an extension that does not load raise, as ToolClient.call and
    a worker's loader refuse them."""
    with pytest.raises(ClientError):
        run_tool(EXTENSION, "add", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ClientError):
        run_tool(EXTENSION, "add", {"a": 1}, context={"acount": "typo"})
    with pytest.raises(ClientError, match="not JSON"):
        run_tool(EXTENSION, "add", {"a": float("nan")})
    with pytest.raises(ConfigurationError, match="not_there"):
        run_tool(TESTS / "broken_extensions" / "not_there", "x", {})
    with pytest.raises(ConfigurationError, match="slug"):
        run_tool(Extension(slug="bad slug", version="1", tools=[Add]), "add", {"a": 1})


class Pid(Tool):
    """Say the process the tool runs in."""

    name = "pid"
    arguments_model = Seconds
    isolation = "process"
    timeout_s = 0.5

    def call(self, arguments: Seconds, context: ExtensionContext) -> int:
        threading.Event().wait(arguments.seconds)
        return os.getpid()


def test_a_process_isolation_tool_runs_in_this_process_under_its_limit() -> None:
    """run_tool runs a process-isolation tool on a thread of the test process (no child
    processes), still answered timeout at its limit."""
    isolated = Extension(slug="isolated", version="1", tools=[Pid])
    result = run_tool(isolated, "pid", {"seconds": 0})
    assert (result.status, result.content) == (Status.OK, os.getpid())
    stuck = run_tool(isolated, "pid", {"seconds": 30})
    assert stuck.status is Status.TIMEOUT, stuck.content


def test_an_mcp_server_extension_folder_is_served_as_a_worker_serves_it(tmp_path: Path) -> None:
    """A manifest declaring the reference mcp-server-time: run_tool starts the server, calls
    its tool with arguments validated against its inputSchema, and stops it."""
    server = Path(sys.executable).parent / "mcp-server-time"
    if not server.exists():
        unavailable("mcp-server-time is not installed (pip install -e '.[dev]')")
    (tmp_path / "extension.toml").write_text(
        f'slug = "time"\nversion = "1.0.0"\n[mcp]\ncommand = "{server}"\n'
    )
    arguments = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    result = run_tool(tmp_path, "convert_time", arguments, timeout_s=30)
    assert result.status is Status.OK, result.content
    assert result.content["target"]["datetime"][11:16] == "21:00"
    bad = run_tool(tmp_path, "convert_time", {"time": "12:00"}, timeout_s=30)
    assert bad.status is Status.INVALID_ARGUMENTS, bad.content
    assert "source_timezone" in bad.content["error"]
