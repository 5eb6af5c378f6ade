"""The reply listener: one connection and one thread for every call a client has in flight.

It blocks on the client's reply list (``BLPOP``), drains what else is there in the same
wake-up, resolves the matching futures by request id, and resolves calls whose deadline
passed with a ``timeout`` result, so no caller ever waits past its deadline. Event
envelopes (``running``, ``progress``) go to the event sink the call was registered
with, if any, in the order they were pushed; none comes after the call resolved.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import redis

from toolfleet.producer.hooks import fire_responded
from toolfleet.shared import codec
from toolfleet.shared.signals import tool_presented
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult, ToolEvent

__all__ = ["EventSink", "ReplyListener", "count_late_reply", "observe_call", "present"]

#: Receives the status events of one call (on the listener's thread).
EventSink = Callable[[ToolEvent], None]

log = logging.getLogger("toolfleet.producer.listener")

#: Replies drained per wake-up after the blocking pop.
DRAIN_BATCH = 500
#: Longest single blocking wait, seconds (bounds how late close() is noticed).
MAX_WAIT_S = 1.0


class _Pending:
    """One call waiting for its reply."""

    __slots__ = ("future", "on_event", "request")

    def __init__(
        self,
        request: ToolCallRequest,
        future: Future[ToolCallResult],
        on_event: EventSink | None,
    ) -> None:
        self.request = request
        self.future = future
        self.on_event = on_event


class ReplyListener:
    """Resolve futures from the reply list ``key``.

    Args:
        connect: makes the listener's own Redis connection (a client with a
            single-connection pool).
        key: the reply list.
        on_timeout: called (on the deadline thread) with the ids of calls just resolved
            ``timeout``, so that the client can cancel them in the fleet.

    Attributes:
        late_replies: replies that came for an id no longer pending (after its
            timeout, or a duplicate terminal reply): dropped and counted.
    """

    def __init__(
        self,
        connect: Callable[[], redis.Redis],
        key: str,
        on_timeout: Callable[[list[str]], None] | None = None,
    ) -> None:
        self._connect = connect
        self._on_timeout = on_timeout
        self.key = key
        self._pending: dict[str, _Pending] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._deadline_changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.late_replies = 0
        self._thread = threading.Thread(target=self._run, name="toolfleet-replies", daemon=True)
        self._timer = threading.Thread(
            target=self._run_deadlines, name="toolfleet-deadlines", daemon=True
        )

    def start(self) -> None:
        """Start the listener and deadline threads."""
        self._thread.start()
        self._timer.start()

    def expect(
        self,
        request: ToolCallRequest,
        future: Future[ToolCallResult],
        on_event: EventSink | None = None,
    ) -> None:
        """Register a future to resolve when ``request.id``'s reply comes (or its deadline).

        Args:
            request: the call.
            future: resolved with its result.
            on_event: receives its status events until it resolves (exceptions are
                logged and ignored).

        Raises:
            RuntimeError: the listener is stopped.
        """
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError("the reply listener is stopped")
            self._pending[request.id] = _Pending(request, future, on_event)
            heapq.heappush(self._deadlines, (request.deadline, request.id))
            if self._deadlines[0][1] == request.id:
                self._deadline_changed.notify()

    def forget(self, call_id: str) -> None:
        """Stop waiting for ``call_id`` (its future was resolved elsewhere)."""
        with self._lock:
            self._pending.pop(call_id, None)

    def resolve(
        self, call_id: str, make_result: Callable[[ToolCallRequest], ToolCallResult]
    ) -> bool:
        """Resolve a pending call now with ``make_result(request)``; False when not pending."""
        with self._lock:
            entry = self._pending.pop(call_id, None)
        if entry is None:
            return False
        _resolve(entry, make_result(entry.request))
        return True

    @property
    def in_flight(self) -> int:
        """Calls still waiting for a reply."""
        return len(self._pending)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; calls still pending resolve ``timeout`` now, none is dropped."""
        with self._lock:
            self._stop.set()
            self._deadline_changed.notify()
        if self._thread.ident is not None:  # started (a forked child's may not be yet)
            self._thread.join(timeout_s)
            self._timer.join(timeout_s)
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for entry in pending:
            message = "the client was closed before a reply came"
            _resolve(entry, _timeout_result(entry.request, message))

    def orphan(self, message: str) -> None:
        """In a forked child: resolve the calls copied from the parent ``timeout`` now.

        Their replies go to the parent. Runs with one thread; takes no lock (one held by
        a parent thread at the fork stays held in the child).
        """
        pending = list(self._pending.values())
        self._pending = {}
        for entry in pending:
            _resolve(entry, _timeout_result(entry.request, message))

    def _run(self) -> None:
        client: redis.Redis | None = None
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self._connect()
                item: Any = client.blpop([self.key], timeout=MAX_WAIT_S)
                if item is not None:
                    self._deliver([item[1]])  # resolve the first reply before draining
                    more: Any = client.lpop(self.key, DRAIN_BATCH)
                    if more:
                        self._deliver(list(more))
                backoff = 0.05
            except redis.RedisError as exc:
                log.warning("reply listener: %s; reconnecting in %.2f s", exc, backoff)
                client = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:  # pragma: no cover - keep the listener alive whatever happens
                log.exception("reply listener error")
                self._stop.wait(0.1)
        if client is not None:
            client.close()

    def _run_deadlines(self) -> None:
        """Resolve calls whose deadline passed with ``timeout``, on time, whatever Redis does."""
        while not self._stop.is_set():
            with self._lock:
                while self._deadlines and self._deadlines[0][1] not in self._pending:
                    heapq.heappop(self._deadlines)
                wait = self._deadlines[0][0] - time.time() if self._deadlines else MAX_WAIT_S
                if wait > 0:
                    self._deadline_changed.wait(min(wait, MAX_WAIT_S))
            self._expire()

    def _deliver(self, batch: list[bytes]) -> None:
        for data in batch:
            try:
                envelope = ReplyEnvelope.decode(data)
            except Exception as exc:  # noqa: BLE001 - a bad reply is logged, not fatal
                self._undecodable(data, exc)
                continue
            if envelope.type == "event":
                self._event(envelope.event)
                continue
            result = envelope.result
            if result is None:
                continue
            with self._lock:
                entry = self._pending.pop(result.id, None)
            if entry is None:
                self.late_replies += 1
                count_late_reply()
                continue
            _resolve(entry, result)

    def _event(self, event: ToolEvent | None) -> None:
        if event is None:
            return
        with self._lock:
            entry = self._pending.get(event.id)
        if entry is None or entry.on_event is None:
            return
        try:
            entry.on_event(event)
        except Exception:  # noqa: BLE001 - a sink's failure never stops the listener
            log.exception("event sink of call %s failed", event.id)

    def _undecodable(self, data: bytes, exc: Exception) -> None:
        """Resolve ``rejected`` a call whose reply cannot be decoded but names its id."""
        log.error("undecodable reply: %s", str(exc)[:300])
        try:
            loose = codec.loads(data)
            call_id = loose["result"]["id"]
        except Exception:  # noqa: BLE001 - nothing to resolve
            return
        with self._lock:
            entry = self._pending.pop(call_id, None) if isinstance(call_id, str) else None
        if entry is not None:
            message = f"the worker's reply could not be read: {str(exc)[:200]}"
            _resolve(entry, ToolCallResult.failure(entry.request, Status.REJECTED, message))

    def _expire(self) -> None:
        now = time.time()
        expired: list[_Pending] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, call_id = heapq.heappop(self._deadlines)
                entry = self._pending.pop(call_id, None)
                if entry is not None:
                    expired.append(entry)
        for entry in expired:
            request = entry.request
            _resolve(entry, _timeout_result(request, f"no reply within {request.timeout_s:.3g} s"))
        if expired and self._on_timeout is not None:
            try:
                self._on_timeout([entry.request.id for entry in expired])
            except Exception:  # noqa: BLE001 - canceling is best effort; the caller has its result
                log.warning("could not cancel timed-out calls", exc_info=True)


def _timeout_result(request: ToolCallRequest, message: str) -> ToolCallResult:
    return ToolCallResult.failure(request, Status.TIMEOUT, message)


def _resolve(entry: _Pending, result: ToolCallResult) -> None:
    if not entry.future.done():
        observe_call(entry.request.function, result.status, entry.request.sent_at)
        entry.future.set_result(result)
        fire_responded(result, entry.request.context.account)


def present(functions: list[str], account: str | None, format: str) -> None:  # noqa: A002
    """Fire ``tool_presented`` (a subscriber's failure is logged, never raised)."""
    try:
        tool_presented.send("toolfleet", functions=functions, account=account, format=format)
    except Exception:  # noqa: BLE001 - a hook never breaks tools()
        log.exception("a tool_presented subscriber failed")


def observe_call(function: str, status: str, sent_at: float) -> None:
    """Record a published call's end-to-end time (``toolfleet_client_call_duration_seconds``)."""
    from toolfleet.producer import metrics  # lazily: no metric files for a mere import

    metrics.CALL_DURATION.labels(function, str(status)).observe(max(0.0, time.time() - sent_at))


def count_late_reply() -> None:
    """Count a reply that came after its call resolved (``toolfleet_client_late_replies``)."""
    from toolfleet.producer import metrics

    metrics.LATE_REPLIES.inc()
