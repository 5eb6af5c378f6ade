"""Dead letters: what Dramatiq's dead-letter set of a queue holds, and an operator's retry.

Dramatiq keeps a queue's dead letters in the sorted set ``<ns>:<queue>.XQ`` (message id
-> when it died, epoch ms) and their bodies in the hash ``<ns>:<queue>.XQ.msgs``
(:func:`toolfleet.shared.naming.dead_letters_key`); its maintenance drops them after a
week. Retrying takes the message out of both (only the first of two operators clicking
at once gets it) and publishes its request again through the producer's enqueue script,
quotas included, as a *new call*: a fresh call id (the old one already has an outcome,
so a worker would only re-post it) and a fresh deadline of the request's own
``timeout_s`` from now (the old deadline has passed, and a worker answers such a call
``expired`` without running it). Its reply goes to the original ``reply_to`` list, where
no producer waits for the new id any more: the retry is for the tool's side effects and
for the operator, who finds the new call by its id on the failures page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer.publish import Publisher
from toolfleet.shared import codec
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import DEFAULT_GROUP, dead_letters_key, group_of_namespace
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.tenancy.enqueue import Refused
from toolfleet.shared.wire import ToolCallRequest, new_call_id

__all__ = ["DeadLetter", "RetryRefused", "delete_dead_letter", "parse_dead_letter", "retry"]


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message.

    Attributes:
        queue: its queue.
        redis_id: its Dramatiq Redis id (the ``.XQ`` member).
        call_id: the request id it carries ("" when the body is not a tool call).
        function: the function called ("" when unknown).
        account: the call's account.
        problem: why it cannot be retried ("" when it can).
    """

    queue: str
    redis_id: str
    call_id: str
    function: str
    account: str | None
    problem: str = ""


class RetryRefused(Exception):
    """A dead letter could not be retried; the message says why (shown to the operator)."""


def _request(body: bytes | str | None) -> ToolCallRequest:
    if body is None:
        raise RetryRefused("the message is gone (retried or deleted meanwhile)")
    try:
        message = codec.loads(body)
        return ToolCallRequest.model_validate_json(message["args"][0])
    except (codec.DecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise RetryRefused(f"not a tool call toolfleet can read: {str(exc)[:120]}") from exc


def parse_dead_letter(queue: str, redis_id: str, body: bytes | str | None) -> DeadLetter:
    """Describe one dead letter from its body (a Dramatiq message carrying a request)."""
    try:
        request = _request(body)
    except RetryRefused as exc:
        return DeadLetter(queue, redis_id, "", "", None, problem=str(exc))
    return DeadLetter(queue, redis_id, request.id, request.function, request.context.account)


def retry(
    client: redis.Redis, namespace: str, queue: str, redis_id: str, *, prefix: str | None = None
) -> str:
    """Publish dead letter ``redis_id`` of ``queue`` again as a new call; its new call id.

    Args:
        client: a Redis client of the fleet.
        namespace: the fleet's namespace.
        queue: the dead letter's queue.
        redis_id: its Dramatiq Redis id.
        prefix: the key prefix of ``queue``'s keys (on a cluster its group's; default
            ``namespace``). The new call goes to that group, its reply to the original
            ``reply_to``.

    Raises:
        RetryRefused: it is gone, or not a tool call (then it stays where it was).
        redis.RedisError: Redis failed (a message taken out is put back when possible).
    """
    prefix = prefix or namespace
    key = dead_letters_key(prefix, queue)
    pipe = pipeline(client, transaction=True)
    pipe.zscore(key, redis_id)
    pipe.hget(key + ".msgs", redis_id)
    died, body = pipe.execute()
    request = _request(body)  # a body that is not a tool call stays
    if not client.zrem(key, redis_id):
        raise RetryRefused("the message is gone (retried or deleted meanwhile)")
    client.hdel(key + ".msgs", redis_id)
    fresh = request.model_copy(
        update={"id": new_call_id(), "deadline": time.time() + request.timeout_s}
    )
    try:
        keys = _keys(client, namespace, prefix, queue, fresh)
        refused = Publisher(client, namespace, keys=keys).publish(queue, fresh)
    except redis.RedisError:
        _put_back(client, key, redis_id, body, died)
        raise
    if refused is not None:  # a quota's refusal (no idempotency key: never a duplicate)
        _put_back(client, key, redis_id, body, died)
        why = refused.message if isinstance(refused, Refused) else "a duplicate call"
        raise RetryRefused(f"refused by the fleet: {why}")
    return fresh.id


def _keys(
    client: redis.Redis, namespace: str, prefix: str, queue: str, request: ToolCallRequest
) -> KeySpace | None:
    """The key layout a retried call is published with: ``None`` on a plain Redis.

    On a cluster: ``queue`` in the group ``prefix`` names, and the reply list of the
    client that made the call (the id its ``reply_to`` names), which is in that group.
    """
    if not is_cluster(client):
        return None
    keys = KeySpace(namespace, True, request.reply_to.rpartition(":reply:")[2])
    group = group_of_namespace(prefix) or DEFAULT_GROUP
    keys.learn({request.function: {"queue": queue, "group": group}})
    return keys


def _put_back(
    client: redis.Redis, key: str, redis_id: str, body: bytes | str | None, died: float | None
) -> None:
    pipe = pipeline(client, transaction=True)
    pipe.hset(key + ".msgs", redis_id, body or b"")
    pipe.zadd(key, {redis_id: died or time.time() * 1000})
    pipe.execute()


def delete_dead_letter(
    client: redis.Redis, namespace: str, queue: str, redis_id: str, *, prefix: str | None = None
) -> bool:
    """Remove dead letter ``redis_id`` of ``queue``; False when it was already gone.

    ``prefix`` is the key prefix of ``queue``'s keys (on a cluster its group's; default
    ``namespace``).
    """
    key = dead_letters_key(prefix or namespace, queue)
    pipe = pipeline(client, transaction=True)
    pipe.zrem(key, redis_id)
    pipe.hdel(key + ".msgs", redis_id)
    removed, _ = pipe.execute()
    return bool(removed)
