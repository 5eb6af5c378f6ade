"""The toolkit's one hook for fleet-wide limits: breaker first, then a concurrency slot.

:meth:`Gate.guard` wraps a call's run. An open breaker answers at once (nothing runs);
a limited tool waits for a slot within the call's deadline and is answered ``timeout``
without running when none frees; after the run the slot is given back and the outcome
counted by the breaker. Redis failing here lets the call run unguarded (logged): its
reply needs Redis anyway, and a tool call is not refused for want of bookkeeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from toolfleet.shared.tenancy.breakers import unavailable_content
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.registry.served_tool import ServedTool
from toolfleet.worker.supervision import metrics
from toolfleet.worker.tenancy.breakers import Breakers
from toolfleet.worker.tenancy.concurrency import LEASE_MARGIN_S, ConcurrencyLimiter

__all__ = ["Gate", "breaker_event_poster"]

log = logging.getLogger("toolfleet.worker.tenancy.gate")

#: Seconds past the deadline a call may run (the toolkit's grace).
_GRACE_S = 0.5


class Gate:
    """Concurrency limits and circuit breakers around each run of a tool.

    Args:
        client: Redis client.
        namespace: key prefix.
        on_change: called with ``(function, state)`` when a breaker opens or closes.
        on_waited: called with ``(call id, seconds)`` to move the watchdog's deadline of a
            call waiting for a slot by that many seconds (may be negative): waiting is
            not running.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        on_change: Callable[[str, str], object] | None = None,
        on_waited: Callable[[str, float], object] | None = None,
    ) -> None:
        self.limiter = ConcurrencyLimiter(client, namespace)
        self.breakers = Breakers(client, namespace)
        self.on_change = on_change
        self.on_waited = on_waited
        #: ids of calls holding a slot taken by :meth:`hold`, not yet run by :meth:`guard`
        self._held: set[str] = set()
        self._held_lock = threading.Lock()

    def guard(
        self,
        request: ToolCallRequest,
        served: ServedTool,
        run: Callable[[], ToolCallResult],
        timings: dict[str, Any],
        canceled: threading.Event | None = None,
    ) -> ToolCallResult:
        """``run()``'s result, or the answer given without running it."""
        if served.breaker is None and served.concurrency is None:
            return run()
        function = served.function
        attempts = served.retry.attempts if served.retry else 1
        lease_s = min(served.timeout_s * attempts, request.deadline - time.time() + _GRACE_S)
        try:
            if served.breaker is not None:
                wait = self.breakers.enter(function, request.id, lease_s + LEASE_MARGIN_S)
                if wait is not None:
                    self.let_go(request, served)  # a slot taken before the claim
                    metrics.BREAKER_REFUSED.labels(function).inc()
                    metrics.BREAKER_OPEN.labels(function).set(1)
                    content = unavailable_content(function, wait)
                    return ToolCallResult.answering(
                        request, Status.NOT_AVAILABLE, content, **timings
                    )
            if served.concurrency is not None and not self._taken_before(request.id):
                started = time.monotonic()
                took = self._take_slot(request, served.concurrency, function, lease_s, canceled)
                metrics.CONCURRENCY_WAIT.labels(function).observe(time.monotonic() - started)
                if not took:
                    content = {
                        "error": (
                            f"{function} runs at most {served.concurrency} calls at once across "
                            "the fleet and no slot freed up before the call's deadline"
                        )
                    }
                    return ToolCallResult.answering(request, Status.TIMEOUT, content, **timings)
        except redis.RedisError as exc:
            log.warning("limits of %s not checked (Redis failed: %s); running", function, exc)
            return run()
        try:
            result = run()
        finally:
            if served.concurrency is not None:
                self.limiter.release(function, request.id)
        if served.breaker is not None:
            self._count(served, request, result)
        return result

    def hold(
        self, request: ToolCallRequest, served: ServedTool, canceled: threading.Event | None = None
    ) -> bool:
        """Wait for a slot of a limited tool before the call is claimed; True once held.

        A call is claimed only once it holds its slot (a call that waits has not started:
        if its process dies meanwhile, it is served again, not answered ``crashed``).
        :meth:`guard` then finds the slot held by the call and keeps it. False when no
        slot freed by the deadline (or ``canceled`` was set): :meth:`guard` answers
        ``timeout`` then. Redis failing here counts as held (:meth:`guard` decides).
        """
        if served.concurrency is None:
            return True
        attempts = served.retry.attempts if served.retry else 1
        lease_s = min(served.timeout_s * attempts, request.deadline - time.time() + _GRACE_S)
        started = time.monotonic()
        try:
            took = self.limiter.acquire(
                served.function, request.id, served.concurrency, lease_s, request.deadline,
                canceled,
            )  # fmt: skip
        except redis.RedisError as exc:
            log.warning("slot of %s not taken before the claim: %s", served.function, exc)
            return True
        metrics.CONCURRENCY_WAIT.labels(served.function).observe(time.monotonic() - started)
        if took:
            with self._held_lock:
                self._held.add(request.id)
        return took

    def let_go(self, request: ToolCallRequest, served: ServedTool | None) -> None:
        """Give back a slot :meth:`hold` took for a call that will not run here."""
        with self._held_lock:
            held = request.id in self._held
            self._held.discard(request.id)
        if held and served is not None:
            self.limiter.release(served.function, request.id)

    def _taken_before(self, call_id: str) -> bool:
        """True (once) when :meth:`hold` took the call's slot."""
        with self._held_lock:
            if call_id in self._held:
                self._held.discard(call_id)
                return True
            return False

    def _take_slot(
        self,
        request: ToolCallRequest,
        limit: int,
        function: str,
        lease_s: float,
        canceled: threading.Event | None,
    ) -> bool:
        """Take a slot, waiting until the deadline; the watchdog's limit moves with the wait.

        The wait is not run time: the watchdog's ``answer_by`` first moves by the longest
        possible wait (to the deadline), then back by what was not waited.
        """
        took = self.limiter.acquire(function, request.id, limit, lease_s, time.time())
        if took or self.on_waited is None:
            return took or self.limiter.acquire(
                function, request.id, limit, lease_s, request.deadline, canceled
            )
        most = max(0.0, request.deadline - time.time())
        self.on_waited(request.id, most)
        started = time.monotonic()
        took = self.limiter.acquire(
            function, request.id, limit, lease_s, request.deadline, canceled
        )
        self.on_waited(request.id, (time.monotonic() - started) - most)
        return took

    def _count(self, served: ServedTool, request: ToolCallRequest, result: ToolCallResult) -> None:
        assert served.breaker is not None
        failed = result.status.value in served.breaker.on
        try:
            state = self.breakers.record(served.function, request.id, failed, served.breaker)
        except redis.RedisError as exc:
            log.warning("breaker of %s not updated: %s", served.function, exc)
            return
        if state:
            metrics.BREAKER_OPEN.labels(served.function).set(1 if state == "open" else 0)
            if self.on_change is not None:
                self.on_change(served.function, state)
        elif not failed:
            metrics.BREAKER_OPEN.labels(served.function).set(0)


def breaker_event_poster(
    client: redis.Redis, namespace: str, worker_id: str
) -> Callable[[str, str], None]:
    """An ``on_change`` that adds a breaker event to the lifecycle events stream.

    The event is ``{"kind": "breaker", "at", "function", "state", "worker"}``;
    ``toolfleet events`` shows it.
    """
    from toolfleet.shared import codec
    from toolfleet.shared.naming import events_key

    def post(function: str, state: str) -> None:
        event = {"kind": "breaker", "at": time.time(), "function": function, "state": state,
                 "worker": worker_id}  # fmt: skip
        try:
            client.xadd(events_key(namespace), {"event": codec.dumps(event)}, maxlen=100_000)
        except redis.RedisError as exc:
            log.warning("breaker event not posted: %s", exc)

    return post
