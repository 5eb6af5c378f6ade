"""Cancels of handshake-era HTTP clients, across stateless replicas.

A handshake-era (2025) Streamable HTTP client gives up on a request by POSTing
``notifications/cancelled`` naming the request's JSON-RPC id, and keeps the request's own
response stream open (that era's rule: the frame is the signal, a disconnect is not).
A stateless gateway serves that POST on a fresh transport, maybe on another replica, that
does not hold the request: the SDK drops it, and the call would run to its end.

So the gateway issues an opaque ``Mcp-Session-Id`` in each ``initialize`` answer and keeps
nothing for it (any replica still serves any request); the client sends it with every
request. A call's id is derived from the caller's account, that session id and the
request id (:func:`session_call_id`; MCP forbids reusing a request id within a session),
and a ``notifications/cancelled`` POST, on any replica, cancels that id through the
producer (``AsyncToolClient.cancel``: at once while the call is queued or running, else
by its cancel marker, which the worker honours when it claims the call). No Redis command
is added per call. A GET with the session id (the client's optional server-to-client
stream) is answered 405: a stateless replica offers none.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER

from toolfleet.producer.async_client import AsyncToolClient
from toolfleet.producer.mcp.auth import Caller, caller_of

__all__ = ["LegacySessions", "caller_of_scope", "session_call_id"]

log = logging.getLogger("toolfleet.producer.mcp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The UUID namespace of derived call ids (a fixed, random one).
_CALL_IDS = uuid.UUID("5b0f7c1e-3d4a-4f0e-9a51-2f6c8e7d9b10")


def session_call_id(account: str | None, session: str, request_id: Any) -> str:
    """The call id of request ``request_id`` of ``session`` by ``account`` (a UUID5 string).

    The same on every replica; distinct per account, session (random, issued by the
    gateway) and request id (``1`` and ``"1"`` differ, as in JSON-RPC).
    """
    name = orjson.dumps([account, session, request_id]).decode()
    return str(uuid.uuid5(_CALL_IDS, name))


def caller_of_scope(scope: Scope, default: Caller) -> Caller:
    """The caller of an HTTP request: its verified bearer token's, else ``default``."""
    user = scope.get("user")
    token = user.access_token if isinstance(user, AuthenticatedUser) else None
    return caller_of(token, default)


class LegacySessions:
    """ASGI middleware in front of the SDK's stateless MCP endpoint (see the module).

    Args:
        app: the MCP endpoint.
        client: the producer client that cancels calls.
        default_caller: the caller of requests without a verified token.
    """

    def __init__(self, app: ASGIApp, client: AsyncToolClient, default_caller: Caller) -> None:
        self.app = app
        self.client = client
        self.default_caller = default_caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request (HTTP only; anything else passes through)."""
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        session = _header(scope, MCP_SESSION_ID_HEADER)
        if scope.get("method") == "GET" and session:
            await _not_allowed(send)
            return
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        messages = _messages(body)
        if any(m.get("method") == "initialize" for m in messages):
            # a fresh id for every session, even to a client that offers one: a reused id
            # whose request ids start over would derive the call ids of its old calls
            send = _issuing(send, uuid.uuid4().hex)
        elif session:
            await self._cancel(scope, session, messages)
        await self.app(scope, _replay(body, more, receive), send)

    async def _cancel(self, scope: Scope, session: str, messages: list[dict[str, Any]]) -> None:
        """Cancel the call of each ``notifications/cancelled`` among ``messages``."""
        for message in messages:
            if message.get("method") != "notifications/cancelled" or "id" in message:
                continue
            params = message.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
                continue
            account = caller_of_scope(scope, self.default_caller).account
            try:
                await self.client.cancel(session_call_id(account, session, request_id))
            except Exception:  # noqa: BLE001 - a cancel is best effort; the notification still goes on
                log.warning("could not cancel request %r of a session", request_id, exc_info=True)


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode("latin-1")
    for key, value in scope.get("headers") or []:
        if key.lower() == wanted:
            return bytes(value).decode("latin-1")
    return None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether the client went away while it was read."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _messages(body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a POST body (one, or a batch); none when it is not JSON."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    items = data if isinstance(data, list) else [data]
    return [item for item in items if isinstance(item, dict)]


def _replay(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A ``receive`` that hands the body read already once, then the client's own."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if complete:
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}
        return await receive()

    return replayed


def _issuing(send: Send, session: str) -> Send:
    """A ``send`` that sets ``Mcp-Session-Id: session`` on the response."""

    async def sending(message: Message) -> None:
        if message.get("type") == "http.response.start":
            name = MCP_SESSION_ID_HEADER.encode("latin-1")
            headers = [
                (key, value)
                for key, value in message.get("headers") or []
                if bytes(key).lower() != name
            ]
            headers.append((name, session.encode("latin-1")))
            message = {**message, "headers": headers}
        await send(message)

    return sending


async def _not_allowed(send: Send) -> None:
    body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Method Not Allowed"}}'
    headers = [
        (b"content-type", b"application/json"),
        (b"allow", b"POST, DELETE"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 405, "headers": headers})
    await send({"type": "http.response.body", "body": body})
