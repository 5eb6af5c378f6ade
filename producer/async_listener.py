"""The asyncio reply listener: one connection and one task for every call in flight.

Like :class:`~toolfleet.producer.listener.ReplyListener`: ``BLPOP`` on the client's reply
list, drain what else is there, resolve futures by request id, route event envelopes to
the call's event sink. Each call's deadline is an event-loop timer (``loop.call_later``)
that resolves it ``timeout``, so no caller waits past its deadline while the loop runs.
A future the caller cancels (``future.cancel()``, or the task awaiting it canceled) is
forgotten and reported to ``on_cancel`` so the client cancels the call in the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from toolfleet.producer.hooks import fire_responded
from toolfleet.producer.listener import (
    DRAIN_BATCH,
    MAX_WAIT_S,
    EventSink,
    count_late_reply,
    observe_call,
)
from toolfleet.shared import codec
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult

__all__ = ["AsyncCallFuture", "AsyncReplyListener"]

log = logging.getLogger("toolfleet.producer.listener")


class AsyncCallFuture(asyncio.Future[ToolCallResult]):
    """The asyncio future of one call; ``call_id`` is the request id (for ``cancel``)."""

    def __init__(self, call_id: str, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.call_id = call_id


class _Pending:
    """One call waiting for its reply: what a result needs, not the whole request."""

    __slots__ = (
        "account",
        "call_id",
        "function",
        "future",
        "on_event",
        "sent_at",
        "timeout_s",
        "timer",
        "tool_call_id",
    )

    def __init__(
        self,
        request: ToolCallRequest,
        future: AsyncCallFuture,
        on_event: EventSink | None,
        timer: asyncio.TimerHandle,
    ) -> None:
        self.call_id = request.id
        self.account = request.context.account
        self.tool_call_id = request.tool_call_id
        self.function = request.function
        self.timeout_s = request.timeout_s
        self.sent_at = request.sent_at
        self.future = future
        self.on_event = on_event
        self.timer = timer

    def failure(self, status: Status, message: str) -> ToolCallResult:
        """A non-``ok`` result of this call."""
        return ToolCallResult(
            id=self.call_id,
            tool_call_id=self.tool_call_id,
            function=self.function,
            status=status,
            content={"error": message},
        )


class AsyncReplyListener:
    """Resolve asyncio futures from the reply list ``key`` (one event loop).

    Args:
        connect: makes the listener's own connection (a single-connection client).
        key: the reply list.
        on_timeout: called with the ids of calls just resolved ``timeout``.
        on_cancel: called with the ids of calls whose future the caller canceled.
        on_settled: called once per registered call when its future is done (however).

    Attributes:
        late_replies: replies for an id no longer pending (dropped and counted).
    """

    def __init__(
        self,
        connect: Callable[[], redis.asyncio.Redis],
        key: str,
        on_timeout: Callable[[list[str]], None],
        on_cancel: Callable[[list[str]], None],
        on_settled: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._on_timeout = on_timeout
        self._on_cancel = on_cancel
        self._on_settled = on_settled
        self.key = key
        self._pending: dict[str, _Pending] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._expired: list[str] = []
        self.late_replies = 0

    def start(self) -> None:
        """Start the listening task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="toolfleet-replies")

    def expect(
        self, request: ToolCallRequest, future: AsyncCallFuture, on_event: EventSink | None = None
    ) -> None:
        """Register a future to resolve when ``request.id``'s reply comes (or its deadline).

        Raises:
            RuntimeError: the listener is stopped.
        """
        if self._stopping:
            raise RuntimeError("the reply listener is stopped")
        delay = max(0.0, request.deadline - time.time())
        timer = future.get_loop().call_later(delay, self._expire, request.id)
        self._pending[request.id] = _Pending(request, future, on_event, timer)
        future.add_done_callback(self._settled)

    def resolve(
        self,
        call_id: str,
        status: Status,
        message: str,
        *,
        content: dict[str, Any] | None = None,
    ) -> bool:
        """Resolve a pending call now with a ``status`` result; False when not pending.

        Its content is ``{"error": message}``, or ``content`` when given.
        """
        entry = self._pending.pop(call_id, None)
        if entry is None:
            return False
        result = entry.failure(status, message)
        if content is not None:
            result = result.model_copy(update={"content": content})
        _resolve(entry, result)
        return True

    @property
    def in_flight(self) -> int:
        """Calls still waiting for a reply."""
        return len(self._pending)

    async def stop(self) -> None:
        """Stop listening; calls still pending resolve ``timeout`` now, none is dropped."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        pending = list(self._pending.values())
        self._pending.clear()
        for entry in pending:
            _resolve(
                entry, entry.failure(Status.TIMEOUT, "the client was closed before a reply came")
            )

    async def _run(self) -> None:
        client: redis.asyncio.Redis | None = None
        backoff = 0.05
        task = asyncio.current_task()
        try:
            # cancelling(): a cancellation some library swallowed still stops the loop
            while not self._stopping and not (task is not None and task.cancelling()):
                try:
                    if client is None:
                        client = self._connect()
                    item = await client.blpop([self.key], timeout=MAX_WAIT_S)
                    if item is not None:
                        self._deliver([item[1]])  # resolve the first reply before draining
                        more: Any = await client.lpop(self.key, DRAIN_BATCH)
                        if more:
                            self._deliver(list(more))
                    backoff = 0.05
                except redis.RedisError as exc:
                    log.warning("reply listener: %s; reconnecting in %.2f s", exc, backoff)
                    if client is not None:
                        with contextlib.suppress(Exception):
                            await client.aclose()
                    client = None
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                except Exception:  # pragma: no cover - keep the listener alive whatever happens
                    log.exception("reply listener error")
                    await asyncio.sleep(0.1)
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def _deliver(self, batch: list[bytes | str]) -> None:
        for data in batch:
            try:
                envelope = ReplyEnvelope.decode(data)
            except Exception as exc:  # noqa: BLE001 - a bad reply is logged, not fatal
                self._undecodable(data, exc)
                continue
            if envelope.type == "event":
                event = envelope.event
                entry = self._pending.get(event.id) if event is not None else None
                if event is not None and entry is not None and entry.on_event is not None:
                    try:
                        entry.on_event(event)
                    except Exception:  # noqa: BLE001 - a sink's failure never stops the listener
                        log.exception("event sink of call %s failed", event.id)
                continue
            result = envelope.result
            if result is None:
                continue
            entry = self._pending.pop(result.id, None)
            if entry is None:
                self.late_replies += 1
                count_late_reply()
                continue
            _resolve(entry, result)

    def _undecodable(self, data: bytes | str, exc: Exception) -> None:
        """Resolve ``rejected`` a call whose reply cannot be decoded but names its id."""
        log.error("undecodable reply: %s", str(exc)[:300])
        try:
            call_id = codec.loads(data)["result"]["id"]
        except Exception:  # noqa: BLE001 - nothing to resolve
            return
        entry = self._pending.pop(call_id, None) if isinstance(call_id, str) else None
        if entry is not None:
            message = f"the worker's reply could not be read: {str(exc)[:200]}"
            _resolve(entry, entry.failure(Status.REJECTED, message))

    def _expire(self, call_id: str) -> None:
        entry = self._pending.pop(call_id, None)
        if entry is None:
            return
        _resolve(entry, entry.failure(Status.TIMEOUT, f"no reply within {entry.timeout_s:.3g} s"))
        if not self._expired:  # one fleet cancel for all calls expiring in this loop turn
            asyncio.get_running_loop().call_soon(self._report_expired)
        self._expired.append(call_id)

    def _report_expired(self) -> None:
        expired, self._expired = self._expired, []
        try:
            self._on_timeout(expired)
        except Exception:  # noqa: BLE001 - canceling is best effort; the caller has its result
            log.warning("could not cancel timed-out calls", exc_info=True)

    def _settled(self, future: asyncio.Future[ToolCallResult]) -> None:
        try:
            self._on_settled()
        except Exception:  # noqa: BLE001 - a hook's failure never breaks resolution
            log.exception("on_settled failed")
        if not future.cancelled():
            return
        call_id = future.call_id  # type: ignore[attr-defined]
        entry = self._pending.pop(call_id, None)
        if entry is None:
            return
        entry.timer.cancel()
        try:
            self._on_cancel([call_id])
        except Exception:  # noqa: BLE001 - canceling is best effort
            log.warning("could not cancel call %s in the fleet", call_id, exc_info=True)


def _resolve(entry: _Pending, result: ToolCallResult) -> None:
    entry.timer.cancel()
    if not entry.future.done():
        observe_call(entry.function, result.status, entry.sent_at)
        entry.future.set_result(result)
        fire_responded(result, entry.account)
