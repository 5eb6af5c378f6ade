"""Backpressure: a cap on one client's calls in flight, and on each queue's length in Redis.

Two limits keep a burst from growing without bound:

- **Calls in flight per client** (``max_in_flight``): a published call holds a slot
  until it resolves. ``submit`` waits for a slot (the async client awaits, the sync one
  blocks) for at most ``submit_timeout_s`` seconds, then raises
  :class:`~toolfleet.shared.errors.BackpressureError`; nothing is published then.
- **Messages per queue** (``Settings.max_queue_length``, ``TOOLFLEET_MAX_QUEUE_LENGTH``):
  the number of messages a queue holds (``HLEN`` of Dramatiq's ``<queue>.msgs``: queued,
  prefetched or running) is read with each catalog refresh, and this client adds what
  it published since. A call to a queue at its limit is answered ``rejected`` at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from toolfleet.producer.catalog import Catalog
from toolfleet.shared.errors import BackpressureError

__all__ = ["AsyncInFlightLimit", "InFlightLimit", "QueueLengths", "backpressure_error"]


def backpressure_error(max_in_flight: int, waited_s: float) -> BackpressureError:
    """The error ``submit`` raises when no slot freed up in time."""
    return BackpressureError(
        f"{max_in_flight} calls are already in flight on this client (max_in_flight) and "
        f"none resolved within {waited_s:.3g} s; nothing was published. Slow down, raise "
        "max_in_flight or add workers"
    )


class _Limit:
    """At most ``limit`` calls in flight; a slot is a semaphore's (made by ``semaphore``).

    Args:
        limit: the cap, calls (>= 1).
    """

    def __init__(self, limit: int, semaphore: Callable[[int], Any]) -> None:
        if limit < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.limit = limit
        self._slots = semaphore(limit)

    def release(self, *_: object) -> None:
        """Give a slot back (usable as a future's done callback)."""
        self._slots.release()


class InFlightLimit(_Limit):
    """At most ``limit`` calls in flight (thread-safe); ``limit``: the cap, calls (>= 1)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit, threading.Semaphore)

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take a slot, blocking up to ``timeout_s`` seconds (``None``: don't block)."""
        if timeout_s is None:
            return bool(self._slots.acquire(blocking=False))
        return bool(self._slots.acquire(timeout=max(0.0, timeout_s)))


class AsyncInFlightLimit(_Limit):
    """At most ``limit`` calls in flight (one event loop); ``limit``: the cap, calls (>= 1)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit, asyncio.Semaphore)

    async def acquire(self, timeout_s: float | None = None) -> bool:
        """Take a slot, waiting up to ``timeout_s`` seconds (``None``: don't wait)."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
            return True
        if timeout_s is None or timeout_s <= 0:
            return False
        try:
            # asyncio.timeout, not wait_for: a slot acquired as the timeout fires is kept
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            return False
        return True


class QueueLengths:
    """How many messages each queue holds, to refuse calls to a full one.

    The count is the queue's length at the last catalog read plus the messages this
    client published to it since (consumed ones are not subtracted until the next read,
    so the estimate errs on the full side).

    Args:
        limit: most messages a queue may hold (``Settings.max_queue_length``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._read_at = float("-inf")
        self._added: dict[str, int] = {}
        self._lock = threading.Lock()

    def reserve(self, catalog: Catalog, queue: str) -> int | None:
        """Count one more message on ``queue``; ``None`` when it has room, else its length."""
        with self._lock:
            if catalog.read_at > self._read_at:
                self._read_at = catalog.read_at
                self._added.clear()
            held = catalog.queue_lengths.get(queue, 0) + self._added.get(queue, 0)
            if held >= self.limit:
                return held
            self._added[queue] = self._added.get(queue, 0) + 1
            return None
