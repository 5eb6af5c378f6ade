"""Per-tool concurrency limits, fleet-wide: leased slots in a Redis sorted set.

Why not Dramatiq's ``ConcurrentRateLimiter``: its Redis backend keeps one counter per
key whose TTL every acquire and release renews, so a slot held by a worker that was
SIGKILLed is never given back while the tool stays busy (the key never goes idle long
enough to expire): the limit shrinks for good. Here each slot is a member of
``<ns>:concurrency:<function>`` scored by its lease's end (the call's own time limit
plus a margin, :data:`LEASE_MARGIN_S`); acquiring first drops expired leases, so a
dead holder's slot comes back when its lease ends, and a live holder never outlives its
lease (the toolkit stops the call at its time limit). The lease's end is the backstop:
a holder whose death is known gives its slot back then, by the supervisor's recovery of
its process (:func:`toolfleet.worker.messaging.recovery.forget_calls`) or by the worker
that finds its claim dead on redelivery (:meth:`CallPipeline.release_slot
<toolfleet.worker.pipeline.calls.CallPipeline.release_slot>`).

A call that finds no slot free waits, polling every :data:`POLL_S`, until one frees or
its deadline passes (then it is answered ``timeout`` without running). It waits in the
worker thread that took it: put a limited tool on a queue of its own (the manifest's
``queue``) so that its waiting calls do not hold threads other tools need.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

import redis

from toolfleet.shared import scripts
from toolfleet.shared.naming import concurrency_key

__all__ = ["LEASE_MARGIN_S", "POLL_S", "ConcurrencyLimiter", "concurrency_key"]

#: Seconds a slot's lease lasts beyond the call's time limit.
LEASE_MARGIN_S = 2.0
#: Seconds between attempts to take a slot (with up to 50% jitter).
POLL_S = 0.02

#: ``acquire_slot.lua`` (what it takes and returns is written at its head).
_ACQUIRE = scripts.source("acquire_slot")


class ConcurrencyLimiter:
    """Take and give back fleet-wide slots of limited tools.

    Args:
        client: Redis client.
        namespace: key prefix.
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._acquire = client.register_script(_ACQUIRE)

    def acquire(
        self,
        function: str,
        holder: str,
        limit: int,
        lease_s: float,
        deadline: float,
        canceled: threading.Event | None = None,
    ) -> bool:
        """Wait for a slot of ``function`` until ``deadline``; True once taken.

        Args:
            function: the tool's function name.
            holder: a unique holder id (the call id).
            limit: slots fleet-wide.
            lease_s: seconds the slot is held at most once taken.
            deadline: Unix epoch seconds after which to stop waiting.
            canceled: stop waiting when set.

        Raises:
            redis.RedisError: Redis failed.
        """
        key = concurrency_key(self.namespace, function)
        while True:
            now = time.time()
            lease_end = int((now + lease_s + LEASE_MARGIN_S) * 1000)
            if self._acquire(keys=[key], args=[holder, int(now * 1000), lease_end, limit]):
                return True
            wait = POLL_S * (1 + random.random() / 2)  # noqa: S311 - jitter, not security
            if time.time() + wait >= deadline:
                return False
            if canceled is not None and canceled.wait(wait):
                return False
            if canceled is None:
                time.sleep(wait)

    def release(self, function: str, holder: str) -> None:
        """Give back ``holder``'s slot (a lost release is repaired by the lease's end)."""
        with contextlib.suppress(redis.RedisError):
            self.client.zrem(concurrency_key(self.namespace, function), holder)
