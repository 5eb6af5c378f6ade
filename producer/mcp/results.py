"""Toolfleet results as MCP ``tools/call`` results.

The mapping (MCP specification, server features, tools, "Tool Result" and "Error
Handling"): ``ok`` → the result as JSON text in ``content`` and, where the protocol
version allows it, as ``structuredContent``; every other status → ``isError: true``
with the ``{"error": "..."}`` JSON the model reads, as text. Errors are tool results,
not JSON-RPC errors, so the model sees them and can recover (the specification's
advice for errors that originate in the tool). ``_meta["toolfleet/status"]`` carries
the toolfleet status for clients that want it.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolfleet.shared import codec
from toolfleet.shared.wire import ToolCallResult

__all__ = ["STATUS_META_KEY", "call_tool_result"]

#: ``_meta`` key of a ``CallToolResult`` holding the toolfleet status (e.g. ``timeout``).
STATUS_META_KEY = "toolfleet/status"


def call_tool_result(result: ToolCallResult, protocol_version: str) -> types.CallToolResult:
    """The MCP result of one toolfleet call.

    Args:
        result: the call's terminal result.
        protocol_version: the MCP version the client speaks. Up to 2025-11-25
            ``structuredContent`` must be a JSON object, so a non-object result (a number,
            a list) is sent as text only; from 2026-07-28 any JSON value is sent.

    Returns:
        ``isError`` is false only for ``ok``; ``content`` is one text block holding the
        JSON value (``{"error": "..."}`` for errors).
    """
    meta = {STATUS_META_KEY: result.status.value}
    if not result.ok:
        error = {"error": result.error or result.status.value}
        return types.CallToolResult(
            content=[types.TextContent(text=codec.dumps_str(error))], is_error=True, _meta=meta
        )
    structured: Any = None
    if isinstance(result.content, dict) or protocol_version in MODERN_PROTOCOL_VERSIONS:
        structured = result.content
    return types.CallToolResult(
        content=[types.TextContent(text=_text(result.content))],
        structured_content=structured,
        _meta=meta,
    )


def _text(content: Any) -> str:
    """A string result as itself (what a model expects to read), anything else as JSON."""
    return content if isinstance(content, str) else codec.dumps_str(content)
