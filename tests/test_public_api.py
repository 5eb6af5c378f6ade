"""The public API: each package's __all__ is exactly what we mean to publish."""

from __future__ import annotations

import importlib

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


def test_design_names_import() -> None:
    """The names DESIGN.md fixes import from where it says."""
    from toolfleet.producer import AsyncToolClient, ToolClient
    from toolfleet.shared import Extension, ExtensionToolError, Status, Tool, ToolCallResult

    assert all(
        (Tool, ExtensionToolError, Extension, ToolCallResult, Status, ToolClient, AsyncToolClient)
    )
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
