"""Publish requests as Dramatiq messages without touching Dramatiq's global encoder.

The message body is built here and encoded with orjson: Dramatiq's encoder is
process-global and the host application may use Dramatiq for its own tasks, so the
producer never reads or changes it. The request itself travels as the message's one
argument, a JSON string. Enqueuing uses Dramatiq's own Redis ``dispatch`` script.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import redis
from dramatiq.brokers.redis import RedisBroker

from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.wire import ToolCallRequest

__all__ = ["Publisher"]


class Publisher:
    """Enqueue :class:`ToolCallRequest` s on their queues.

    Args:
        client: Redis client (shared with the rest of the producer).
        namespace: key prefix (Dramatiq's namespace).
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        # A broker object only for its script dispatch; middleware=[] so nothing is emitted.
        self._broker = RedisBroker(  # type: ignore[no-untyped-call]
            client=client, namespace=namespace, middleware=[]
        )

    def publish(self, queue: str, request: ToolCallRequest) -> None:
        """Enqueue one request on ``queue``.

        Raises:
            redis.RedisError: Redis could not be reached.
        """
        redis_message_id = str(uuid.uuid4())
        self._broker.do_enqueue(
            queue, redis_message_id, self._encode(queue, request, redis_message_id)
        )

    @staticmethod
    def _encode(queue: str, request: ToolCallRequest, redis_message_id: str) -> bytes:
        message: dict[str, Any] = {
            "queue_name": queue,
            "actor_name": actor_name_for(queue),
            "args": [request.encode().decode("utf-8")],
            "kwargs": {},
            "options": {"redis_message_id": redis_message_id},
            "message_id": request.id,
            "message_timestamp": int(time.time() * 1000),
        }
        return orjson.dumps(message)
