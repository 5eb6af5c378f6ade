"""Serve the gateway over Streamable HTTP, stateless, behind bearer-token authentication.

Stateless (the SDK's ``StreamableHTTPSessionManager(stateless=True)``): no session is
kept between requests, so any number of replicas can run behind a load balancer with
no affinity; every state the calls need is in Redis. Routes:

- ``/mcp``: the MCP endpoint. With a token verifier, a request without a valid
  ``Authorization: Bearer`` token is answered 401 (the SDK's ``RequireAuthMiddleware``);
  without one (the operator chose to run open) every request calls as the default caller.
  A handshake-era client gets an opaque session id so that its ``notifications/cancelled``
  cancels the call on whichever replica it lands (:mod:`toolfleet.producer.mcp.sessions`).
- ``/livez``: 200 while the process serves.
- ``/readyz``: 200 when the fleet's catalog can be read from Redis, else 503.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import TokenVerifier
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from toolfleet.producer.async_client import AsyncToolClient
from toolfleet.producer.mcp.gateway import Gateway, GatewayConfig
from toolfleet.producer.mcp.sessions import LegacySessions
from toolfleet.shared.errors import ConnectionFailed

__all__ = ["MCP_PATH", "http_app"]

#: The MCP endpoint's path.
MCP_PATH = "/mcp"

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def http_app(
    client: AsyncToolClient,
    config: GatewayConfig,
    *,
    token_verifier: TokenVerifier | None,
    host: str = "127.0.0.1",
) -> Starlette:
    """The gateway as an ASGI application (run it with uvicorn or any ASGI server).

    Args:
        client: the producer client; bound to the server's event loop on first use and
            closed when the application shuts down.
        config: see :class:`GatewayConfig`.
        token_verifier: verifies bearer tokens and names their account
            (:mod:`toolfleet.producer.mcp.auth`); ``None`` runs open — every request is
            ``config.default_caller``.
        host: the address served; on a loopback address DNS-rebinding protection is on
            (Host and Origin must be loopback), as the SDK does for its own apps.
    """
    gateway = Gateway(client, config)
    security = None
    if host in _LOOPBACK:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(
        app=gateway.server, stateless=True, security_settings=security
    )
    endpoint: Any = LegacySessions(StreamableHTTPASGIApp(manager), client, config.default_caller)
    middleware: list[Middleware] = []
    if token_verifier is not None:
        endpoint = RequireAuthMiddleware(endpoint, required_scopes=[])
        middleware = [
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(token_verifier)),
            Middleware(AuthContextMiddleware),
        ]

    async def livez(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> JSONResponse:
        try:
            await client.tools(include_unavailable=True)
        except ConnectionFailed as exc:
            return JSONResponse({"ready": False, "error": str(exc)}, 503)
        return JSONResponse({"ready": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with client, gateway, manager.run():
            yield

    return Starlette(
        routes=[
            Route(MCP_PATH, endpoint=endpoint),
            Route("/livez", livez, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        middleware=middleware,
        lifespan=lifespan,
    )
