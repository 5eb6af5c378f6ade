"""The public API: each package's __all__ is exactly what we mean to publish."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

PUBLIC = {
    "toolfleet.producer": {
        "AsyncCallFuture",
        "AsyncToolClient",
        "CallEvent",
        "CallFuture",
        "ToolClient",
        "TurnStream",
    },
    "toolfleet.producer.mcp": {
        "CONVERSATION_META_KEY",
        "IDEMPOTENCY_META_KEY",
        "MCP_PATH",
        "STATUS_META_KEY",
        "TIMEOUT_META_KEY",
        "Caller",
        "Gateway",
        "GatewayConfig",
        "StaticTokenVerifier",
        "call_tool_result",
        "caller_of",
        "http_app",
        "serve_stdio",
        "token_digest",
    },
    "toolfleet.testing": {
        "ExtensionSource",
        "FleetFactory",
        "RunningFleet",
        "run_tool",
        "start_fleet",
    },
    "toolfleet.shared": {
        "Extension",
        "ExtensionContext",
        "Tool",
        "CallContext",
        "Status",
        "ToolCallRequest",
        "ToolCallResult",
        "Settings",
        "BackpressureError",
        "CanceledError",
        "ClientClosedError",
        "ClientError",
        "ConfigurationError",
        "CrashedError",
        "ExpiredError",
        "ExtensionToolError",
        "IdempotencyKeyError",
        "InvalidArgumentsError",
        "NotAvailableError",
        "RejectedError",
        "ToolCallError",
        "ToolTimeoutError",
        "ToolfleetError",
        "UnknownFunctionError",
    },
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_exactly_the_public_names(module: str) -> None:
    """__all__ lists exactly the names we publish, and each of them exists."""
    imported = importlib.import_module(module)
    assert set(imported.__all__) == PUBLIC[module]
    for name in imported.__all__:
        assert hasattr(imported, name), name


def test_design_api_keeps_its_shapes() -> None:
    """The API DESIGN.md fixes keeps its shapes: client constructors and submit signatures,
    Extension(slug, version, tools=[...]), ExtensionToolError as tool_error, the statuses."""
    from toolfleet.producer import AsyncToolClient, ToolClient
    from toolfleet.shared import Extension, ExtensionToolError, Status, Tool, ToolCallResult
    from toolfleet.shared.errors import ToolCallError

    keyword_only = inspect.Parameter.KEYWORD_ONLY
    for client_class in (ToolClient, AsyncToolClient):
        init = inspect.signature(client_class.__init__).parameters
        assert list(init)[1] == "redis_url" and init["redis_url"].default is None
        assert init["namespace"].kind is keyword_only
        submit = inspect.signature(client_class.submit).parameters
        assert list(submit)[1:3] == ["function", "arguments"]
        options = {name: (submit[name].kind, submit[name].default) for name in list(submit)[3:]}
        assert options == {
            "tool_call_id": (keyword_only, None),
            "context": (keyword_only, None),
            "timeout_s": (keyword_only, 30.0),
            "schema_hash": (keyword_only, None),
            "idempotency_key": (keyword_only, None),
            "max_result_bytes": (keyword_only, None),
        }

    class Hello(Tool):
        """Say hello."""

        name = "hello"

        def call(self, arguments: Any, context: Any) -> str:
            return "hello"

    extension = Extension("demo", "1.0.0", tools=[Hello])
    assert (extension.slug, extension.version, list(extension.tools)) == ("demo", "1.0.0", [Hello])
    assert issubclass(ExtensionToolError, ToolCallError)
    assert ExtensionToolError.status is Status.TOOL_ERROR
    result = ToolCallResult(id="1", function="f", status="timeout", content={"error": "late"})
    assert result.status is Status.TIMEOUT and result.status == "timeout"
    assert {s.value for s in Status} == {
        "ok",
        "tool_error",
        "invalid_arguments",
        "unknown_function",
        "not_available",
        "timeout",
        "canceled",
        "expired",
        "crashed",
        "rejected",
    }
