"""``AsyncToolClient``: the asyncio face of :class:`~toolfleet.producer.client.ToolClient`."""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from typing import Any

from toolfleet.producer.client import Arguments, ToolClient
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import CallContext, ToolCallResult

__all__ = ["AsyncToolClient"]


class AsyncToolClient:
    """Awaitable ``call``/``submit`` with the same arguments and results as ``ToolClient``.

    It shares ``ToolClient``'s single reply connection and listener; publishing runs on
    the default executor so the event loop never blocks on Redis.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        namespace: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._sync = ToolClient(redis_url, namespace=namespace, settings=settings)

    async def submit(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> asyncio.Future[ToolCallResult]:
        """Publish a call; return an asyncio future of its result (see ``ToolClient.submit``)."""
        loop = asyncio.get_running_loop()
        submit = functools.partial(
            self._sync.submit,
            function,
            arguments,
            tool_call_id=tool_call_id,
            context=context,
            timeout_s=timeout_s,
        )
        future = await loop.run_in_executor(None, submit)
        return asyncio.wrap_future(future, loop=loop)

    async def call(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolCallResult:
        """Make one call and await its result (see ``ToolClient.call``)."""
        future = await self.submit(
            function, arguments, tool_call_id=tool_call_id, context=context, timeout_s=timeout_s
        )
        return await future

    async def tools(self, *, format: str = "openai") -> list[dict[str, Any]]:  # noqa: A002
        """The fleet's tools (see ``ToolClient.tools``)."""
        return await asyncio.to_thread(self._sync.tools, format=format)

    async def close(self) -> None:
        """Close; calls in flight resolve first."""
        await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> AsyncToolClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
