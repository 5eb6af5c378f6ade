"""The fleet as an MCP server: ``tools/list`` and ``tools/call`` through the producer library.

One :class:`Gateway` serves every connection of one process (stdio, or any number of
Streamable HTTP requests) on the official SDK's low-level
:class:`mcp.server.lowlevel.Server`. It keeps no state of its own between requests:
the catalog, the calls and their results live in Redis, so HTTP replicas are
interchangeable (stateless mode).

- ``tools/list``: the caller's catalog, ``AsyncToolClient.tools(account=..., format="mcp")``
  (the same availability, switches and enablement rules as any producer), with
  ``annotations`` and ``outputSchema`` where the catalog knows them.
- ``tools/call``: ``AsyncToolClient.call`` with the request's own time budget
  (``_meta["toolfleet/timeout_s"]``, seconds, at most ``max_timeout_s``), else
  ``default_timeout_s``; ``_meta["toolfleet/schema_hash"]`` (as ``tools/list`` gave it in
  each tool's ``_meta``) pins the call to that schema; the result is mapped by
  :func:`~toolfleet.producer.mcp.results.call_tool_result`. The call's conversation
  (session affinity: the ``python`` tool's interpreter) is ``_meta["toolfleet/conversation"]``
  when the request names one, else the MCP session: the ``Mcp-Session-Id`` the gateway
  issued (handshake-era HTTP), or the connection (stdio); a 2026-era stateless request
  without it has none. ``_meta["toolfleet/idempotency_key"]`` is the call's idempotency
  key (:mod:`toolfleet.shared.idempotency`). With a ``progressToken``
  the call is streamed and its ``running``/``progress`` events become
  ``notifications/progress``. When the client cancels (``notifications/cancelled``, or
  closing the request's HTTP stream) the SDK cancels the handler, and the producer
  cancels the call in the fleet; a handshake-era HTTP client's ``notifications/cancelled``,
  which reaches a fresh stateless transport, cancels by the derived call id instead
  (:mod:`toolfleet.producer.mcp.sessions`; not for a streamed call, whose id the turn draws).
- Catalog changes: a watcher re-reads the catalog of the accounts with an open
  subscription every ``watch_interval_s`` and, when their tool list changed, sends
  ``notifications/tools/list_changed`` — on the connection's own channel for
  handshake-era stdio clients that listed tools, and on ``subscriptions/listen``
  streams for 2026-07-28 clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolfleet.producer.async_client import AsyncToolClient
from toolfleet.producer.events import CallEvent
from toolfleet.producer.mcp.auth import Caller
from toolfleet.producer.mcp.results import call_tool_result
from toolfleet.producer.mcp.sessions import caller_of_scope, session_call_id
from toolfleet.shared import codec
from toolfleet.shared.errors import ClientError, ConnectionFailed
from toolfleet.shared.export import SCHEMA_HASH_KEY
from toolfleet.shared.wire import Status, ToolCallResult

__all__ = [
    "CONVERSATION_META_KEY",
    "IDEMPOTENCY_META_KEY",
    "TIMEOUT_META_KEY",
    "Gateway",
    "GatewayConfig",
]

log = logging.getLogger("toolfleet.producer.mcp")

#: Request ``_meta`` key: the call's time budget in seconds (a JSON number).
TIMEOUT_META_KEY = "toolfleet/timeout_s"
#: Request ``_meta`` key: the conversation the call belongs to (a string; else the session's).
CONVERSATION_META_KEY = "toolfleet/conversation"
#: Request ``_meta`` key: the call's idempotency key (a string).
IDEMPOTENCY_META_KEY = "toolfleet/idempotency_key"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """How the gateway calls the fleet.

    Attributes:
        default_timeout_s: a call's budget when the request names none, seconds.
        max_timeout_s: the largest budget a request may ask for, seconds.
        watch_interval_s: seconds between catalog checks for ``list_changed``.
        default_caller: the caller of unauthenticated connections (stdio, HTTP run open).
        name: the server name in ``serverInfo``.
    """

    default_timeout_s: float = 30.0
    max_timeout_s: float = 300.0
    watch_interval_s: float = 2.0
    default_caller: Caller = field(default_factory=lambda: Caller(None))
    name: str = "toolfleet"


class Gateway:
    """An MCP server backed by one :class:`AsyncToolClient`.

    Use it as ``async with Gateway(client, config) as gateway:`` (starts and stops the
    catalog watcher) and serve ``gateway.server`` over any SDK transport.

    Args:
        client: the producer client the calls go through (the caller closes it).
        config: see :class:`GatewayConfig`.
    """

    def __init__(self, client: AsyncToolClient, config: GatewayConfig | None = None) -> None:
        self.client = client
        self.config = config or GatewayConfig()
        self.server: Server[Any] = Server(
            self.config.name,
            version=_version(),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
        )
        self._buses: dict[str | None, InMemorySubscriptionBus] = {}
        self._handlers: dict[str | None, ListenHandler] = {}
        self._listening: dict[str | None, int] = {}
        self._sessions: dict[str | None, ServerSession] = {}
        self._fingerprints: dict[str | None, str] = {}
        self._connections: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
        self._watcher: asyncio.Task[None] | None = None

    def initialization_options(self) -> InitializationOptions:
        """The ``initialize`` answer: tools with ``listChanged``."""
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    async def __aenter__(self) -> Gateway:
        self._watcher = asyncio.create_task(self._watch(), name="toolfleet-mcp-watch")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for handler in self._handlers.values():
            handler.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    # -- handlers ------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller = self._caller(ctx)
        tools = await self._tools(caller.account)
        if ctx.request is None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # a handshake-era duplex connection (stdio): it can take list_changed
            self._sessions[caller.account] = ctx.session
            self._fingerprints.setdefault(caller.account, _fingerprint(tools))
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in tools])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self._caller(ctx)
        timeout_s = self._timeout_s(ctx.meta)
        context = {"account": caller.account, "user": caller.user, "llmclient": "mcp",
                   "conversation": self._conversation(ctx)}  # fmt: skip
        key: Any = (ctx.meta or {}).get(IDEMPOTENCY_META_KEY)
        arguments = params.arguments or {}
        pin = _schema_hash(ctx.meta)
        try:
            call_id = self._call_id(ctx, caller)
            if _progress_token(ctx.meta) is None and call_id is not None:
                result = await self.client._call_as(  # noqa: SLF001 - the producer's own gateway
                    call_id, params.name, arguments, context=context, timeout_s=timeout_s,
                    schema_hash=pin,
                    idempotency_key=key,
                )  # fmt: skip
            elif _progress_token(ctx.meta) is None:
                result = await self.client.call(
                    params.name, arguments, context=context, timeout_s=timeout_s,
                    schema_hash=pin,
                    idempotency_key=key,
                )  # fmt: skip
            else:
                result = await self._streamed_call(
                    ctx, params.name, arguments, context, timeout_s, key
                )
        except ClientError as exc:  # backpressure, or a call the client refuses outright
            result = ToolCallResult(
                id="", function=params.name, status=Status.REJECTED, content={"error": str(exc)}
            )
        return call_tool_result(result, ctx.protocol_version)

    async def _streamed_call(
        self,
        ctx: ServerRequestContext[Any, Any],
        function: str,
        arguments: dict[str, Any],
        context: dict[str, Any],
        timeout_s: float,
        idempotency_key: Any = None,
    ) -> ToolCallResult:
        """One call as a one-call turn, its events relayed as ``notifications/progress``."""
        call = {
            "id": "mcp",
            "type": "function",
            "function": {"name": function, "arguments": codec.dumps_str(arguments)},
        }
        steps = 0
        async with self.client.stream(
            [call], context=context, timeout_s=timeout_s, idempotency_key=idempotency_key
        ) as events:
            async for event in events:
                if event.kind == "result" and event.result is not None:
                    return event.result
                if event.kind in ("running", "progress"):
                    steps += 1
                    await ctx.session.report_progress(steps, None, _progress_message(event))
        raise RuntimeError("the turn's stream ended without a result")  # pragma: no cover

    async def _listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        account = self._caller(ctx).account
        handler = self._handlers.get(account)
        if handler is None:
            bus = self._buses[account] = InMemorySubscriptionBus()
            handler = self._handlers[account] = ListenHandler(bus)
        if account not in self._fingerprints:
            self._fingerprints[account] = _fingerprint(await self._tools(account))
        self._listening[account] = self._listening.get(account, 0) + 1
        try:
            return await handler(ctx, params)
        finally:
            self._listening[account] -= 1

    # -- catalog watch ---------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.watch_interval_s)
            accounts = {a for a, n in self._listening.items() if n > 0} | set(self._sessions)
            for account in accounts:
                try:
                    await self._check(account)
                except MCPError as exc:
                    log.warning("catalog check failed: %s", exc.error.message)
                except Exception:  # noqa: BLE001 - the watcher must outlive any one failure
                    log.exception("catalog check failed")

    async def _check(self, account: str | None) -> None:
        """Notify ``account``'s subscribers when its tool list changed."""
        fingerprint = _fingerprint(await self._tools(account))
        if self._fingerprints.get(account) == fingerprint:
            return
        self._fingerprints[account] = fingerprint
        bus = self._buses.get(account)
        if bus is not None:
            await bus.publish(ToolsListChanged())
        session = self._sessions.get(account)
        if session is not None:
            try:
                await session.send_tool_list_changed()
            except Exception:  # noqa: BLE001 - a closed connection: forget it
                self._sessions.pop(account, None)

    # -- helpers ---------------------------------------------------------------

    async def _tools(self, account: str | None) -> list[dict[str, Any]]:
        """The account's MCP tool list.

        Raises:
            MCPError: Redis unreachable (a JSON-RPC internal error saying so, one line).
        """
        try:
            return await self.client.tools(account=account, format="mcp")
        except ConnectionFailed as exc:
            raise MCPError(INTERNAL_ERROR, f"the fleet's catalog is unreachable: {exc}") from None

    def _caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """The request's caller: its verified bearer token over HTTP, else the default."""
        scope = getattr(ctx.request, "scope", None) if ctx.request is not None else None
        return caller_of_scope(scope or {}, self.config.default_caller)

    def _conversation(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The call's conversation: ``_meta["toolfleet/conversation"]``, else the session's.

        The MCP session is the ``Mcp-Session-Id`` the gateway issued (a handshake-era HTTP
        client sends it with every request, to any replica), or the connection itself
        (stdio: one id per connection, for its life); ``None`` for a 2026-era stateless
        request that names none (it has no session).
        """
        asked = (ctx.meta or {}).get(CONVERSATION_META_KEY)
        if isinstance(asked, str) and asked:
            return asked
        headers = getattr(ctx.request, "headers", None)
        session = headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None
        if session and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return f"mcp-session:{session}"
        if ctx.request is None:
            # the SDK builds a ServerSession per request; the connection under it is the
            # stdio client's for its life (not public API: without it, this gateway's)
            connection = getattr(ctx.session, "_connection", self)
            return self._connections.setdefault(connection, f"mcp-connection:{uuid.uuid4().hex}")
        return None

    def _call_id(self, ctx: ServerRequestContext[Any, Any], caller: Caller) -> str | None:
        """The call id a handshake-era HTTP request's cancel finds on any replica, else None.

        Derived from the session id the gateway issued (:mod:`.sessions`) and the request
        id; ``None`` (a fresh id) over stdio, without a session, or in the 2026 era (closing
        the request's stream cancels it there).
        """
        headers = getattr(ctx.request, "headers", None)
        session = headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None
        if not session or ctx.request_id is None:
            return None
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        return session_call_id(caller.account, session, ctx.request_id)

    def _timeout_s(self, meta: Mapping[str, Any] | None) -> float:
        """The request's ``toolfleet/timeout_s`` within ``(0, max_timeout_s]``, else the default."""
        asked = (meta or {}).get(TIMEOUT_META_KEY)
        if isinstance(asked, bool) or not isinstance(asked, (int, float)):
            return self.config.default_timeout_s
        try:
            asked = float(asked)
        except OverflowError:  # an int too large for a float: far past the cap, or below 0
            return self.config.default_timeout_s if asked < 0 else self.config.max_timeout_s
        if not math.isfinite(asked) or asked <= 0:
            return self.config.default_timeout_s
        return float(min(asked, self.config.max_timeout_s))


def _schema_hash(meta: Mapping[str, Any] | None) -> str | None:
    """The request's ``_meta["toolfleet/schema_hash"]``, when it is a string."""
    pin = (meta or {}).get(SCHEMA_HASH_KEY)
    return pin if isinstance(pin, str) else None


def _progress_token(meta: Mapping[str, Any] | None) -> Any:
    if not meta:
        return None
    return meta.get("progressToken", meta.get("progress_token"))


def _progress_message(event: CallEvent) -> str | None:
    if event.description:
        return event.description
    return "running" if event.kind == "running" else None


def _fingerprint(tools: list[dict[str, Any]]) -> str:
    return hashlib.sha256(codec.dumps(tools)).hexdigest()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolfleet")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
