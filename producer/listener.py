"""The reply listener: one connection and one thread for every call a client has in flight.

It blocks on the client's reply list (``BLPOP``), drains what else is there in the same
wake-up, resolves the matching futures by request id, and resolves calls whose deadline
passed with a ``timeout`` result, so no caller ever waits past its deadline.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import redis

from toolfleet.shared import codec
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult

__all__ = ["ReplyListener"]

log = logging.getLogger("toolfleet.producer.listener")

#: Replies drained per wake-up after the blocking pop.
DRAIN_BATCH = 500
#: Longest single blocking wait, seconds (bounds how late close() is noticed).
MAX_WAIT_S = 1.0


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
        self._pending: dict[str, tuple[ToolCallRequest, Future[ToolCallResult]]] = {}
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

    def expect(self, request: ToolCallRequest, future: Future[ToolCallResult]) -> None:
        """Register a future to resolve when ``request.id``'s reply comes (or its deadline)."""
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError("the reply listener is stopped")
            self._pending[request.id] = (request, future)
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
        _resolve(entry[1], make_result(entry[0]))
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
        self._thread.join(timeout_s)
        self._timer.join(timeout_s)
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for request, future in pending:
            _resolve(future, _timeout_result(request, "the client was closed before a reply came"))

    def _run(self) -> None:
        client: redis.Redis | None = None
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self._connect()
                item = client.blpop([self.key], timeout=MAX_WAIT_S)
                if item is not None:
                    batch = [item[1], *(client.lpop(self.key, DRAIN_BATCH) or [])]
                    self._deliver(batch)
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
            result = envelope.result
            if envelope.type != "result" or result is None:
                continue
            with self._lock:
                entry = self._pending.pop(result.id, None)
            if entry is None:
                self.late_replies += 1
                continue
            _resolve(entry[1], result)

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
            _resolve(entry[1], ToolCallResult.failure(entry[0], Status.REJECTED, message))

    def _expire(self) -> None:
        now = time.time()
        expired: list[tuple[ToolCallRequest, Future[ToolCallResult]]] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, call_id = heapq.heappop(self._deadlines)
                entry = self._pending.pop(call_id, None)
                if entry is not None:
                    expired.append(entry)
        for request, future in expired:
            _resolve(future, _timeout_result(request, f"no reply within {request.timeout_s:.3g} s"))
        if expired and self._on_timeout is not None:
            try:
                self._on_timeout([request.id for request, _ in expired])
            except Exception:  # noqa: BLE001 - canceling is best effort; the caller has its result
                log.warning("could not cancel timed-out calls", exc_info=True)


def _timeout_result(request: ToolCallRequest, message: str) -> ToolCallResult:
    return ToolCallResult.failure(request, Status.TIMEOUT, message)


def _resolve(future: Future[ToolCallResult], result: ToolCallResult) -> None:
    if not future.done():
        future.set_result(result)
