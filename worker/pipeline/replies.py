"""Replies written outside the ledger's answer script: events and undecodable requests.

A call's terminal result is written by the ledger's script, atomically with its outcome
(:func:`~toolfleet.worker.pipeline.ledger.post_outcome`); every other entry of a reply
list goes through :func:`push_reply`.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from toolfleet.shared import codec
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallResult
from toolfleet.worker.pipeline.surrogates import has_lone_surrogate

__all__ = ["post_rejection", "push_reply"]

log = logging.getLogger("toolfleet.worker.actors")


def push_reply(client: redis.Redis, reply_to: str, envelope: ReplyEnvelope, ttl_s: int) -> None:
    """Append ``envelope`` to the reply list ``reply_to`` and keep the list ``ttl_s`` seconds.

    One round trip (``RPUSH`` + ``EXPIRE``, pipelined).

    Raises:
        redis.RedisError: Redis failed.
        codec.EncodeError: the envelope does not encode.
    """
    data = envelope.encode()
    pipe = client.pipeline(transaction=False)
    pipe.rpush(reply_to, data)
    pipe.expire(reply_to, ttl_s)
    pipe.execute()


def post_rejection(client: redis.Redis, ttl_s: int, raw: Any, why: str, worker: str) -> bool:
    """Answer ``rejected`` to a request that could not be decoded.

    The one place such a reply is built (a decoded request's ``rejected`` comes from
    :meth:`~toolfleet.worker.pipeline.calls.CallPipeline.admit`). Only possible when its
    ``reply_to`` can be read from the loose JSON and names a Redis list (no lone
    surrogate).

    Args:
        client: Redis client.
        ttl_s: seconds the reply list is kept.
        raw: the message's one argument as received (text, bytes or decoded JSON).
        why: what could not be decoded (at most 300 characters are kept).
        worker: ``host:pid`` written into the result.

    Returns:
        True when a reply was posted.
    """
    loose: Any = raw
    if isinstance(raw, (str, bytes)):
        try:
            loose = codec.loads(raw)
        except codec.DecodeError:
            return False
    if not isinstance(loose, dict) or not isinstance(loose.get("reply_to"), str):
        return False
    if has_lone_surrogate(loose["reply_to"]):  # no Redis list can be named with it
        return False
    tool_call_id = loose.get("tool_call_id")
    result = ToolCallResult(
        id=str(loose.get("id") or ""),
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
        function=str(loose.get("function") or ""),
        status=Status.REJECTED,
        content={"error": f"the request could not be decoded: {why[:300]}"},
        worker=worker,
    )
    try:
        push_reply(client, loose["reply_to"], ReplyEnvelope(type="result", result=result), ttl_s)
    except (redis.RedisError, codec.EncodeError) as post_error:
        log.error("could not post the rejection: %s", post_error)
        return False
    return True
