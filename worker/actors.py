"""One generic Dramatiq actor per queue: decode the request, run it, post the reply."""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from pydantic import ValidationError

from toolfleet.shared import codec
from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.replies import post_result
from toolfleet.worker.toolkit import Toolkit

__all__ = ["RejectedMessage", "declare_actors", "handle_message"]

log = logging.getLogger("toolfleet.worker.actors")


class RejectedMessage(Exception):  # noqa: N818 - Dramatiq "throws" exception, not an error of ours
    """The message was not a request.

    It is answered ``rejected`` where a reply address can be read, and dead-lettered
    (Dramatiq nacks a message whose actor raised).
    """


def handle_message(toolkit: Toolkit, client: redis.Redis, reply_ttl_s: int, raw: Any) -> None:
    """Answer one message body (the orjson-encoded :class:`ToolCallRequest`).

    Raises:
        RejectedMessage: the body is not a request (after answering ``rejected`` when a
            reply address can be read), so that Dramatiq dead-letters it.
    """
    try:
        request = ToolCallRequest.decode(raw if isinstance(raw, (str, bytes)) else codec.dumps(raw))
    except (codec.DecodeError, ValidationError, codec.EncodeError) as exc:
        _reject(client, reply_ttl_s, raw, exc, toolkit.worker_id)
        raise RejectedMessage(str(exc)[:500]) from None
    result = toolkit.call(request)
    try:
        post_result(client, request.reply_to, result, reply_ttl_s)
    except codec.EncodeError as exc:
        log.error("result of %s could not be encoded: %s", request.id, exc)
        fallback = ToolCallResult.failure(
            request, Status.CRASHED, "the tool's result could not be encoded as JSON"
        )
        post_result(client, request.reply_to, fallback, reply_ttl_s)
    log.debug("answered %s %s: %s", request.function, request.id, result.status.value)


def _reject(client: redis.Redis, ttl_s: int, raw: Any, exc: Exception, worker: str) -> None:
    log.warning("rejected an undecodable request: %s", str(exc)[:300])
    loose: Any = raw
    if isinstance(raw, (str, bytes)):
        try:
            loose = codec.loads(raw)
        except codec.DecodeError:
            return
    if not isinstance(loose, dict) or not isinstance(loose.get("reply_to"), str):
        return
    result = ToolCallResult(
        id=str(loose.get("id") or ""),
        tool_call_id=loose.get("tool_call_id")
        if isinstance(loose.get("tool_call_id"), str)
        else None,
        function=str(loose.get("function") or ""),
        status=Status.REJECTED,
        content={"error": f"the request could not be decoded: {str(exc)[:300]}"},
        worker=worker,
    )
    try:
        post_result(client, loose["reply_to"], result, ttl_s)
    except redis.RedisError as post_error:
        log.error("could not post the rejection: %s", post_error)


def declare_actors(
    broker: RedisBroker, toolkit: Toolkit, queues: set[str], reply_ttl_s: int
) -> list[dramatiq.Actor[Any, Any]]:
    """Declare the generic actor of each queue on ``broker``."""
    client = broker.client
    actors = []
    for queue in sorted(queues):

        def call_tool(raw: Any) -> None:
            handle_message(toolkit, client, reply_ttl_s, raw)

        declare = dramatiq.actor(
            actor_name=actor_name_for(queue),
            queue_name=queue,
            broker=broker,
            throws=(RejectedMessage,),
        )
        actors.append(declare(call_tool))
    return actors
