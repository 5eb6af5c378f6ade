"""The MCP gateway: the fleet's tools served to MCP clients (``toolfleet mcp serve``).

Needs the ``mcp`` extra (``pip install 'toolfleet[mcp]'``). Producer-side code: it
imports only ``toolfleet.shared`` and ``toolfleet.producer`` and reaches the fleet
through Redis like any producer.
"""

from toolfleet.producer.mcp.auth import Caller, StaticTokenVerifier, caller_of, token_digest
from toolfleet.producer.mcp.gateway import (
    CONVERSATION_META_KEY,
    IDEMPOTENCY_META_KEY,
    TIMEOUT_META_KEY,
    Gateway,
    GatewayConfig,
)
from toolfleet.producer.mcp.http import MCP_PATH, http_app
from toolfleet.producer.mcp.results import STATUS_META_KEY, call_tool_result
from toolfleet.producer.mcp.stdio import serve_stdio

__all__ = [
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
]
