"""The bookkeeping of one dispatched turn, and the async stream of its events.

:class:`TurnState` keeps, per call of a turn, its result or future and puts its
:class:`~toolfleet.producer.events.CallEvent` s in order: ``queued`` first (held back
until the publish returned, even when a fast worker's ``running`` came first), then
``running``/``progress`` as they arrive, ``result`` last and once; nothing after it.
Both clients use it; events are handed to ``emit`` from whichever thread or task
produced them, one at a time (a lock orders them).

:class:`TurnStream` is what ``AsyncToolClient.stream`` returns, :class:`SyncTurnStream`
what ``ToolClient.stream`` returns.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from toolfleet.producer.events import CallEvent, EventKind
from toolfleet.producer.turns import Turn, result_message
from toolfleet.shared.errors import ClientError
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult, ToolEvent

__all__ = ["SyncTurnStream", "TurnState", "TurnStream"]

#: Seconds a sync stream waits past the turn's deadline before it gives up on events
#: (the calls themselves resolve by the deadline).
_GRACE_S = 1.0

#: A future of either client: ``concurrent.futures.Future`` or ``asyncio.Future``.
AnyFuture = Future[ToolCallResult] | asyncio.Future[ToolCallResult]

_NEW, _PUBLISHED, _DONE = 0, 1, 2


class TurnState:
    """Results and event order of one turn's calls.

    Args:
        turn: the parsed turn.
        emit: receives each event (``None``: nobody streams; no events are made).
        deadline: the turn's deadline, Unix epoch seconds.
    """

    def __init__(
        self, turn: Turn, emit: Callable[[CallEvent], None] | None, deadline: float = 0.0
    ) -> None:
        n = len(turn.calls)
        self.turn = turn
        self.deadline = deadline
        self.requests: list[ToolCallRequest | None] = [None] * n
        self.futures: list[AnyFuture | None] = [None] * n
        self.results: list[ToolCallResult | None] = [None] * n
        self._emit = emit
        self._phase = [_NEW] * n
        self._held: dict[int, list[ToolEvent]] = {}
        self._canceled_descriptions: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def streaming(self) -> bool:
        """True when someone receives the events."""
        return self._emit is not None

    def answer(self, index: int, result: ToolCallResult) -> None:
        """Resolve call ``index`` without publishing it (a ``result`` event only)."""
        self.results[index] = result
        self._finish(index, result)

    def sink(self, index: int) -> Callable[[ToolEvent], None] | None:
        """The event sink to register call ``index`` with (``None`` when not streaming)."""
        if self._emit is None:
            return None
        return lambda event: self._worker_event(index, event)

    def published(self, index: int, request: ToolCallRequest, future: AnyFuture) -> None:
        """Call ``index`` is on its queue: emit ``queued``, then what arrived meanwhile."""
        self.requests[index] = request
        self.futures[index] = future
        with self._lock:
            if self._phase[index] == _NEW:
                self._phase[index] = _PUBLISHED
                self._send("queued", index, time.time())
                for event in self._held.pop(index, []):
                    self._send(event.kind, index, event.at, event.description)
        future.add_done_callback(lambda f: self._finish_future(index, f))

    def pending_call_ids(self) -> list[str]:
        """Request ids of the calls published and not yet resolved."""
        return [
            request.id
            for request, future in zip(self.requests, self.futures, strict=True)
            if request is not None and future is not None and not future.done()
        ]

    def result(self, index: int) -> ToolCallResult:
        """The result of call ``index`` (it must be resolved)."""
        local = self.results[index]
        if local is not None:
            return local
        future = self.futures[index]
        if future is None or not future.done() or future.cancelled():
            raise ClientError(f"call {index} of the turn has no result yet")
        return future.result()

    def messages(self) -> list[dict[str, Any]]:
        """The ready-to-append result messages, in the turn's order (all resolved).

        One per ``tool_call_id``: a duplicate call's ``rejected`` result has no message.
        """
        family = self.turn.family
        return [
            result_message(family, call, self.result(call.index))
            for call in self.turn.calls
            if call.duplicate_of is None
        ]

    # -- internals -----------------------------------------------------------------

    def _worker_event(self, index: int, event: ToolEvent) -> None:
        if event.canceled_description:  # shown if this client resolves a cancel itself
            self._canceled_descriptions[index] = event.canceled_description
        with self._lock:
            phase = self._phase[index]
            if phase == _NEW:
                self._held.setdefault(index, []).append(event)
            elif phase == _PUBLISHED:
                self._send(event.kind, index, event.at, event.description)

    def _finish_future(self, index: int, future: AnyFuture) -> None:
        if future.cancelled():  # the caller gave up on it; the client cancels it in the fleet
            request = self.requests[index]
            if request is None:  # pragma: no cover - published calls have their request
                return
            result = ToolCallResult.failure(request, Status.CANCELED, "the call was canceled")
            self.results[index] = result
            self._finish(index, result)
            return
        self._finish(index, future.result())

    def _finish(self, index: int, result: ToolCallResult) -> None:
        with self._lock:
            if self._phase[index] == _DONE:
                return
            self._phase[index] = _DONE
            self._held.pop(index, None)
            canceled = self._canceled_descriptions.pop(index, None)
            if result.status is Status.CANCELED and result.description is None and canceled:
                result = result.model_copy(update={"description": canceled})
                self.results[index] = result
            if self._emit is not None:
                call = self.turn.calls[index]
                message = (
                    result_message(self.turn.family, call, result)
                    if call.duplicate_of is None
                    else None  # the id's one answer is its first call's
                )
                self._send(
                    "result", index, time.time(), result.description, result, message, result.id
                )

    def _send(
        self,
        kind: EventKind,
        index: int,
        at: float,
        description: str | None = None,
        result: ToolCallResult | None = None,
        message: dict[str, Any] | None = None,
        call_id: str | None = None,
    ) -> None:
        if self._emit is None:
            return
        call = self.turn.calls[index]
        request = self.requests[index]
        self._emit(
            CallEvent(
                kind=kind,
                index=index,
                call_id=call_id or (request.id if request is not None else ""),
                tool_call_id=call.tool_call_id,
                function=call.function,
                at=at,
                received_at=time.time(),
                description=description,
                result=result,
                message=message,
            )
        )


class _Progress:
    """Where the stream of one turn is: its state, the results still to come, closed."""

    def __init__(self) -> None:
        self.state: TurnState | None = None
        self.remaining = -1
        self.closed = False

    def begin(self, state: TurnState) -> None:
        self.state = state
        self.remaining = len(state.turn.calls)

    @property
    def over(self) -> bool:
        return self.state is None or self.remaining == 0 or self.closed

    def count(self, event: CallEvent) -> CallEvent:
        if event.kind == "result":
            self.remaining -= 1
        return event

    def messages(self) -> list[dict[str, Any]]:
        if self.state is None or self.remaining != 0:
            raise ClientError("the turn's stream has not ended yet")
        return self.state.messages()

    def close(self) -> list[str]:
        """Close; the ids of the calls still running (to cancel)."""
        self.closed = True
        if self.state is None or not self.remaining:
            return []
        return self.state.pending_call_ids()


class _Events:
    """What both streams share: their progress, and the messages once it ended."""

    def __init__(self) -> None:
        self._progress = _Progress()

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The result messages in the turn's order.

        Raises:
            ClientError: the stream has not ended yet.
        """
        return self._progress.messages()


class TurnStream(_Events):
    """The events of one turn's calls as they happen (``AsyncToolClient.stream``).

    Iterate it with ``async for``; it ends after the last call's ``result`` event, by the
    turn's deadline at the latest. Nothing is published before the first iteration.
    Leaving early (``break`` inside ``async with``, or :meth:`aclose`) cancels the calls
    still running. After the end, :attr:`messages` holds the ready-to-append results.

    Args:
        start: publishes the turn, handing events to the given callback; returns its state.
        cancel: cancels calls by request id.
    """

    def __init__(
        self,
        start: Callable[[Callable[[CallEvent], None]], Awaitable[TurnState]],
        cancel: Callable[[list[str]], Awaitable[object]],
    ) -> None:
        super().__init__()
        self._start, self._cancel = start, cancel
        self._queue: asyncio.Queue[CallEvent] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[CallEvent]:
        return self

    async def __anext__(self) -> CallEvent:
        if self._progress.state is None and not self._progress.closed:
            self._progress.begin(await self._start(self._queue.put_nowait))
        if self._progress.over:
            raise StopAsyncIteration
        # every call resolves by the turn's deadline
        return self._progress.count(await self._queue.get())

    async def aclose(self) -> None:
        """Stop iterating; calls of the turn still running are canceled."""
        pending = self._progress.close()
        if pending:
            await self._cancel(pending)

    async def __aenter__(self) -> TurnStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncTurnStream(_Events):
    """The events of one turn's calls as they happen (``ToolClient.stream``).

    Iterate it with ``for``; it ends after the last call's ``result`` event, by the turn's
    deadline at the latest. Nothing is published before the first iteration. Leaving a
    ``with`` block early (``break``, an exception) or :meth:`close` cancels the calls
    still running. After the end, :attr:`messages` holds the ready-to-append results.
    Arguments as for :class:`TurnStream`, blocking instead of awaited.
    """

    def __init__(
        self,
        start: Callable[[Callable[[CallEvent], None]], TurnState],
        cancel: Callable[[list[str]], object],
    ) -> None:
        super().__init__()
        self._start, self._cancel = start, cancel
        self._queue: queue.SimpleQueue[CallEvent] = queue.SimpleQueue()

    def __iter__(self) -> Iterator[CallEvent]:
        return self

    def __next__(self) -> CallEvent:
        if self._progress.state is None and not self._progress.closed:
            self._progress.begin(self._start(self._queue.put))
        if self._progress.over or self._progress.state is None:
            raise StopIteration
        wait_s = max(0.0, self._progress.state.deadline - time.time()) + _GRACE_S
        try:
            return self._progress.count(self._queue.get(timeout=wait_s))
        except queue.Empty:  # pragma: no cover - the deadline resolves every call
            raise StopIteration from None

    def close(self) -> None:
        """Stop iterating; calls of the turn still running are canceled."""
        pending = self._progress.close()
        if pending:
            self._cancel(pending)

    def __enter__(self) -> SyncTurnStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
