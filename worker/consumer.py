"""A Redis broker whose consumers wait for work instead of sleeping on a poll interval.

Dramatiq's Redis consumer, finding its queue empty, sleeps with a growing backoff (up
to the worker timeout) before it polls again, so a call that arrives while a worker is
idle waits for the next poll. This consumer instead blocks in Redis with
``BLMOVE q q LEFT LEFT`` (pop the head and push it back: the list is unchanged, and
the command returns as soon as the list is non-empty), then fetches with Dramatiq's
own script. Message format, Lua script, acks, heartbeats and dead letters are
Dramatiq's. A message that does not decode is dead-lettered on its own instead of
failing the consumer (which would strand the messages fetched with it until Dramatiq
noticed the worker as dead). This relies on
``dramatiq.brokers.redis._RedisConsumer`` internals of the pinned Dramatiq version;
``tests/test_dramatiq_contract.py`` fails when they change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

__all__ = ["FleetRedisBroker", "WaitingConsumer"]

logger = logging.getLogger("toolfleet.worker.consumer")

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
                    data = self.message_cache.pop(0)
                    if data is None:
                        continue
                    try:
                        message = Message.decode(data)
                    except Exception as exc:  # noqa: BLE001 - a poison message, not a crash
                        self.broker.handle_poison(self.queue_name, data, exc)
                        continue
                    self.misses = 0
                    self.queued_message_ids.add(message.message_id)
                    return MessageProxy(message)
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

    def close(self) -> None:
        """Give messages fetched but not yet handed to a worker thread back to the queue.

        Dramatiq's consumer leaves them for its maintenance to find much later.
        """
        ids = []
        for data in self.message_cache:
            try:
                ids.append(Message.decode(data).options["redis_message_id"])
            except Exception:  # noqa: BLE001, S112 - undecodable: maintenance handles it
                continue
        self.message_cache = []
        if ids:
            try:
                self.broker.do_requeue(self.queue_name, *ids)
            except redis.RedisError as exc:
                logger.warning("could not requeue %d prefetched messages: %s", len(ids), exc)


class FleetRedisBroker(RedisBroker):
    """Dramatiq's ``RedisBroker`` using :class:`WaitingConsumer` for normal queues.

    Attributes:
        on_poison: called with ``(queue, data, error)`` for a message that does not decode,
            after it was dead-lettered (the worker answers ``rejected`` where it can).
        poison_messages: how many such messages this broker dead-lettered.
    """

    on_poison: Callable[[str, bytes, Exception], None] | None = None
    poison_messages = 0

    def handle_poison(self, queue_name: str, data: bytes, error: Exception) -> None:
        """Dead-letter an undecodable message this consumer fetched.

        The others fetched with it are not stranded. Its Redis id is found among this
        broker's unacked ids.
        """
        self.poison_messages += 1
        logger.error("undecodable message on %s dead-lettered: %s", queue_name, str(error)[:200])
        acks = f"{self.namespace}:__acks__.{self.broker_id}.{queue_name}"
        try:
            ids = list(self.client.smembers(acks))
            if ids:
                bodies = self.client.hmget(f"{self.namespace}:{queue_name}.msgs", ids)
                for message_id, body in zip(ids, bodies, strict=True):
                    if body == data:
                        self.do_nack(queue_name, message_id.decode())
                        break
        except redis.RedisError as exc:
            logger.error("could not dead-letter the message: %s", exc)
        if self.on_poison is not None:
            self.on_poison(queue_name, data, error)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Any:
        """Create a consumer; delay queues (``.DQ``) keep Dramatiq's polling consumer."""
        if queue_name == dq_name(q_name(queue_name)):
            return super().consume(queue_name, prefetch, timeout)
        return WaitingConsumer(self, queue_name, prefetch, timeout)
