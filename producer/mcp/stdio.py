"""Serve the gateway over stdio (desktop MCP clients start ``toolfleet mcp serve``)."""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from toolfleet.producer.async_client import AsyncToolClient
from toolfleet.producer.mcp.gateway import Gateway, GatewayConfig

__all__ = ["serve_stdio"]


async def serve_stdio(client: AsyncToolClient, config: GatewayConfig) -> None:
    """Serve one MCP client on this process's stdin/stdout until it closes them.

    Every call is made as ``config.default_caller`` (there is no token on stdio: whoever
    can start the process is the caller). Nothing but MCP messages is written to stdout.

    Args:
        client: the producer client (opened and closed by the caller).
        config: see :class:`GatewayConfig`.
    """
    async with Gateway(client, config) as gateway, stdio_server() as (read, write):
        await gateway.server.run(read, write, gateway.initialization_options())
