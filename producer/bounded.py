"""Hold the sync client's blocking Redis I/O to a call's deadline.

``ToolClient``'s connections time out after ``redis_timeout_s``, longer than what is left
of a short call. :class:`DeadlineRunner` runs a catalog read on a few threads of its
own (publishing has a thread of its own: :class:`~toolfleet.producer.publish.Publisher`)
and stops waiting for it when the deadline comes: the caller gets a
:class:`~toolfleet.producer._redis.DeadlinePassed` (a ``redis.TimeoutError``) then,
while the I/O keeps its connection until redis-py's socket timeout ends it (redis-py
disconnects a timed-out connection, so the pool never hands out one with a reply still
due). Work whose deadline passed before a thread took it is not started. The work runs
in a copy of the caller's context (``contextvars``), so what the caller has current (an
OpenTelemetry span, log fields) is current for it too.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

import redis

from toolfleet.producer._redis import DeadlinePassed

__all__ = ["BOUNDED_THREADS", "DeadlineRunner"]

T = TypeVar("T")

#: Threads one client runs its bounded Redis I/O on.
BOUNDED_THREADS = 8


class DeadlineRunner:
    """Run blocking Redis I/O, waiting for it no later than a deadline.

    Args:
        name: thread name prefix.
    """

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(BOUNDED_THREADS, thread_name_prefix=name)

    def run(self, work: Callable[[], T], deadline: float | None) -> T:
        """``work()``'s value, or its error, by ``deadline`` (epoch seconds; ``None``: no bound).

        The work runs in a copy of the caller's ``contextvars`` context.

        Raises:
            DeadlinePassed: no answer by ``deadline`` (the work may still complete).
            redis.ConnectionError: the runner was closed before the work ran.
            Exception: whatever ``work`` raised.
        """
        if deadline is None:
            return work()

        def bounded() -> T:
            if time.time() >= deadline:
                raise DeadlinePassed("the call's deadline passed before Redis was asked")
            return work()

        closed = redis.ConnectionError("the client closed before Redis was asked")
        try:
            future = self._pool.submit(contextvars.copy_context().run, bounded)
        except RuntimeError:  # shut down
            raise closed from None
        try:
            return future.result(max(0.0, deadline - time.time()))
        except FutureTimeout:
            future.cancel()
            raise DeadlinePassed("no answer from Redis by the call's deadline") from None
        except CancelledError:  # dropped unstarted by close()
            raise closed from None

    def close(self) -> None:
        """Stop taking work; I/O under way finishes on its own (not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
