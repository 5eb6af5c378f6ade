"""A Redis broker whose consumers wait for work instead of sleeping on a poll interval.

Dramatiq's Redis consumer, finding its queue empty, sleeps with a growing backoff (up
to the worker timeout) before it polls again, so a call that arrives while a worker is
idle waits for the next poll. This consumer instead blocks in Redis with
``BLMOVE q q LEFT LEFT`` (pop the head and push it back: the list is unchanged, and
the command returns as soon as the list is non-empty), then fetches with Dramatiq's
own script. Message format, Lua script, acks, heartbeats and dead letters are
Dramatiq's. This relies on ``dramatiq.brokers.redis._RedisConsumer`` internals of the
pinned Dramatiq version; ``tests/test_dramatiq_contract.py`` fails when they change.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import dq_name, q_name
from dramatiq.errors import ConnectionClosed

__all__ = ["FleetRedisBroker", "WaitingConsumer"]

#: Seconds one blocking wait lasts before the consumer returns to Dramatiq's loop
#: (acks, heartbeats and shutdown are handled between waits).
WAIT_S = 1.0
#: Seconds to pause when the prefetch window is full (no Redis call is made).
FULL_WINDOW_PAUSE_S = 0.002


class WaitingConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer with a blocking wait instead of an idle poll."""

    def __init__(self, broker: RedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        self._queue_key = f"{broker.namespace}:{queue_name}"

    def __next__(self) -> Any:
        try:
            while True:
                if self.message_cache:
                    return super().__next__()  # type: ignore[no-untyped-call]
                if self.outstanding_message_count >= self.prefetch:
                    time.sleep(FULL_WINDOW_PAUSE_S)
                    return None
                fetched = self.broker.do_fetch(
                    self.queue_name, self.prefetch - self.outstanding_message_count
                )
                if fetched:
                    self.message_cache = fetched
                    continue
                self.broker.client.blmove(self._queue_key, self._queue_key, WAIT_S, "LEFT", "LEFT")
                return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]


class FleetRedisBroker(RedisBroker):
    """Dramatiq's ``RedisBroker`` using :class:`WaitingConsumer` for normal queues."""

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Any:
        """Create a consumer; delay queues (``.DQ``) keep Dramatiq's polling consumer."""
        if queue_name == dq_name(q_name(queue_name)):
            return super().consume(queue_name, prefetch, timeout)
        return WaitingConsumer(self, queue_name, prefetch, timeout)
