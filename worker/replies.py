"""Post results to a producer's reply list."""

from __future__ import annotations

import logging

import redis

from toolfleet.shared.wire import ReplyEnvelope, ToolCallResult

__all__ = ["post_result"]

log = logging.getLogger("toolfleet.worker.replies")


def post_result(client: redis.Redis, reply_to: str, result: ToolCallResult, ttl_s: int) -> None:
    """RPUSH ``{"type": "result", "result": ...}`` to ``reply_to`` and refresh its TTL.

    One pipelined round trip. Raises redis errors to the caller (the actor logs them).
    """
    data = ReplyEnvelope(type="result", result=result).encode()
    pipe = client.pipeline(transaction=False)
    pipe.rpush(reply_to, data)
    pipe.expire(reply_to, ttl_s)
    pipe.execute()
