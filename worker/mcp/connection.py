"""One MCP client session to one server, kept alive on the MCP loop: start, call, restart, close.

States: ``starting`` (an attempt is under way: calls wait for it), ``ready``, ``down``
(the last attempt failed: calls fail at once with the reason while the next attempt
waits out its backoff), ``closed``.

A stdio server's death is seen at once: its stdout ends, the session's pending requests
fail with ``CONNECTION_CLOSED`` (their calls answer ``tool_error``), and a new server is
started, at once when the old one had served for :data:`HEALTHY_S`, else after a backoff
of 0.5 s doubling to :data:`MAX_BACKOFF_S`. A Streamable HTTP session is re-opened when a
call finds its connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from toolfleet.shared.errors import ExtensionToolError

__all__ = [
    "HEALTHY_S",
    "MAX_BACKOFF_S",
    "HttpTarget",
    "McpConnection",
    "McpStartError",
    "StdioTarget",
    "progress_text",
]

log = logging.getLogger("toolfleet.worker.mcp")

#: A server that served this long (seconds) before dying is restarted without delay.
HEALTHY_S = 10.0
#: Longest wait between two start attempts, seconds.
MAX_BACKOFF_S = 30.0
#: Pages of ``tools/list`` followed at most (a server that keeps paging is broken).
MAX_PAGES = 100

_CLIENT_INFO = types.Implementation(name="toolfleet", version="1")


@dataclass(frozen=True)
class StdioTarget:
    """A stdio server: ``argv`` (absolute executable first), its whole environment, its cwd."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None


@dataclass(frozen=True)
class HttpTarget:
    """A Streamable HTTP server: its URL and the headers of every request."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)


Target = StdioTarget | HttpTarget
_Item = SessionMessage | Exception
OnTools = Callable[[list[types.Tool]], None]
Progress = Callable[[str], None]


class McpConnection:
    """A supervised MCP client session; every coroutine runs on the MCP loop.

    Args:
        slug: the extension's slug (for messages).
        target: where the server is.
        start_timeout_s: seconds for one start: spawn or connect, ``initialize`` and
            every page of ``tools/list``.
        on_tools: called on the MCP loop with the full tool list after each start and
            after each ``notifications/tools/list_changed``.

    Attributes:
        state: ``starting``, ``ready``, ``down`` or ``closed``.
        restarts: start attempts after the first.
        last_error: why the last attempt or session ended (no secret: messages of
            the SDK and the OS, scrubbed by the worker before they travel).
        tools: the last tool list.
    """

    def __init__(
        self, slug: str, target: Target, start_timeout_s: float, on_tools: OnTools
    ) -> None:
        self.slug = slug
        self.target = target
        self.start_timeout_s = start_timeout_s
        self.on_tools = on_tools
        self.state = "starting"
        self.restarts = 0
        self.last_error = ""
        self.tools: list[types.Tool] = []
        self._session: ClientSession | None = None
        self._changed = asyncio.Event()  # set (and replaced) at every state change
        self._wake = asyncio.Event()
        self._dead = False
        self._refresh = False
        self._closing = False
        self._first: asyncio.Future[list[types.Tool]] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if isinstance(self.target, StdioTarget) else "http"

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> list[types.Tool]:
        """Start the session and return its tools; a failed first start is not retried.

        Raises:
            Exception: why the server could not be started, initialized or listed.
        """
        self._first = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._supervise())
        return await self._first

    async def close(self) -> None:
        """End the session and stop the server (bounded: the SDK's stdio shutdown waits)."""
        self._closing = True
        self._set_state("closed")
        self._wake.set()
        if self._task is not None:
            with anyio.move_on_after(10):
                await asyncio.shield(self._task)

    async def _supervise(self) -> None:
        delay = 0.0
        while not self._closing:
            started = time.monotonic()
            try:
                await self._serve_once()
            except Exception as exc:  # noqa: BLE001 - any failure ends this session only
                self.last_error = _describe(exc)
            if self._first is not None and not self._first.done():
                self._first.set_exception(McpStartError(self.last_error or "no session"))
                self._set_state("down")
                return
            if self._closing:
                break
            self._set_state("down")
            healthy = time.monotonic() - started >= HEALTHY_S
            delay = 0.0 if healthy else min(MAX_BACKOFF_S, max(0.5, delay * 2))
            log.warning(
                "MCP server of %s ended (%s); restarting in %.1f s",
                self.slug, self.last_error or "no reason given", delay,
            )  # fmt: skip
            if delay:
                await self._sleep_unless_closing(delay)
            if self._closing:
                break
            self.restarts += 1
            self._set_state("starting")

    async def _sleep_unless_closing(self, seconds: float) -> None:
        self._wake = asyncio.Event()
        with anyio.move_on_after(seconds):
            await self._wake.wait()

    async def _serve_once(self) -> None:
        self._dead = self._refresh = False
        self._wake = asyncio.Event()
        async with self._streams() as (read, write), anyio.create_task_group() as group:
            inner_send, inner_read = anyio.create_memory_object_stream[_Item](0)
            group.start_soon(self._pump, read, inner_send)
            try:
                async with ClientSession(
                    inner_read, write, message_handler=self._on_message, client_info=_CLIENT_INFO
                ) as session:
                    with anyio.fail_after(self.start_timeout_s):
                        await session.initialize()
                        tools = await _list_tools(session)
                    self._session = session
                    self._publish_tools(tools)
                    self._set_state("ready")
                    if self._first is not None and not self._first.done():
                        self._first.set_result(tools)
                    await self._serve_until_done(session)
            finally:
                self._session = None
                group.cancel_scope.cancel()

    async def _serve_until_done(self, session: ClientSession) -> None:
        while True:
            await self._wake.wait()
            self._wake = asyncio.Event()
            if self._closing or self._dead:
                return
            if self._refresh:
                self._refresh = False
                try:
                    with anyio.fail_after(self.start_timeout_s):
                        tools = await _list_tools(session)
                except Exception as exc:  # noqa: BLE001 - keep the old list, log why
                    log.warning("MCP server of %s: tools/list failed: %s", self.slug, exc)
                    continue
                self._publish_tools(tools)

    @asynccontextmanager
    async def _streams(
        self,
    ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[Any]]]:
        if isinstance(self.target, StdioTarget):
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=self.target.argv[0],
                args=self.target.argv[1:],
                env=self.target.env,
                cwd=self.target.cwd,
            )
            async with stdio_client(params, errlog=sys.stderr) as (read, write):
                yield read, write  # type: ignore[misc]
            return
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        timeout = httpx2.Timeout(30.0, read=300.0)
        async with (
            httpx2.AsyncClient(headers=self.target.headers, timeout=timeout) as http,
            streamable_http_client(self.target.url, http_client=http) as streams,
        ):
            yield streams[0], streams[1]  # type: ignore[misc]

    async def _pump(
        self,
        read: MemoryObjectReceiveStream[SessionMessage | Exception],
        inner: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        """Forward the transport's messages to the session; its end means the server is gone."""
        try:
            async with inner:
                async for item in read:
                    await inner.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            if isinstance(self.target, StdioTarget):
                self.last_error = "the server process exited"
                self._mark_dead()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._refresh = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.warning("MCP server of %s: transport error: %s", self.slug, message)

    def _mark_dead(self) -> None:
        self._dead = True
        self._wake.set()

    def _set_state(self, state: str) -> None:
        if self.state == "closed" and state != "closed":
            return
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _publish_tools(self, tools: list[types.Tool]) -> None:
        self.tools = tools
        try:
            self.on_tools(tools)
        except Exception:  # noqa: BLE001 - the session stays up; the old catalog stays
            log.exception("MCP server of %s: could not apply its tool list", self.slug)

    # -- calls -----------------------------------------------------------------

    async def call(
        self, name: str, arguments: dict[str, Any], progress: Progress | None = None
    ) -> types.CallToolResult:
        """Call tool ``name``; cancelling this coroutine sends ``notifications/cancelled``.

        Raises:
            ExtensionToolError: the server is down or closed, refused the request, or
                stopped during the call.
        """
        session = await self._ready_session()
        callback = _progress_callback(progress) if progress is not None else None
        try:
            return await session.call_tool(name, arguments, progress_callback=callback)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._mark_dead()
                raise ExtensionToolError(
                    f"the MCP server of {self.slug} stopped during the call (it is being "
                    "restarted; the call may or may not have taken effect)"
                ) from None
            raise ExtensionToolError(f"the MCP server refused the call: {exc.message}") from None

    async def _ready_session(self) -> ClientSession:
        while True:
            if self.state == "ready" and self._session is not None and not self._dead:
                return self._session
            if self.state in ("down", "closed"):
                why = f": {self.last_error}" if self.last_error else ""
                raise ExtensionToolError(f"the MCP server of {self.slug} is unavailable{why}")
            await self._changed.wait()

    def status(self) -> dict[str, Any]:
        """State, transport, live server processes (0 or 1), restarts, tools, last error."""
        return {
            "state": self.state,
            "transport": self.transport,
            "processes": int(self.transport == "stdio" and self.state == "ready"),
            "restarts": self.restarts,
            "tools": len(self.tools),
            "last_error": self.last_error,
        }


class McpStartError(Exception):
    """The first start of an MCP server failed (the message says why)."""


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool of the server, following ``nextCursor``."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise RuntimeError(f"tools/list still paging after {MAX_PAGES} pages")


def _progress_callback(progress: Progress) -> Any:
    loop = asyncio.get_running_loop()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        text = progress_text(value, total, message)
        # the sink posts to Redis: keep that round trip off the MCP loop
        loop.run_in_executor(None, progress, text)

    return on_progress


def progress_text(value: float, total: float | None, message: str | None) -> str:
    """A progress event's text: the server's message, then ``value/total`` (or ``value``)."""
    amount = f"{value:g}/{total:g}" if total else f"{value:g}"
    return f"{message} ({amount})" if message else amount


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer to initialize or tools/list within the start timeout"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
        return "the server closed the connection (exited?) before it was ready"
    return f"{type(exc).__name__}: {exc}"
