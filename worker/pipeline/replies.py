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
from toolfleet.shared.limits import MAX_ID_CHARS, MAX_NAME_CHARS, MAX_REPLY_TO_CHARS
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallResult
from toolfleet.worker.pipeline.scan import top_level_strings
from toolfleet.worker.pipeline.surrogates import has_lone_surrogate, replace_lone_surrogates

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
    pipe = pipeline(client)
    pipe.rpush(reply_to, data)
    pipe.expire(reply_to, ttl_s)
    pipe.execute()


def post_rejection(client: redis.Redis, ttl_s: int, raw: Any, why: str, worker: str) -> bool:
    """Answer ``rejected`` to a request that could not be decoded (or named: its id).

    The one place such a reply is built (a decoded request's ``rejected`` comes from
    :meth:`~toolfleet.worker.pipeline.calls.CallPipeline.admit`). Only possible when its
    ``reply_to`` can be read, from the loose JSON or, when even that does not decode (e.g.
    nested deeper than :data:`~toolfleet.shared.limits.MAX_DEPTH`), by a scan of its
    top-level members (:func:`~toolfleet.worker.pipeline.scan.top_level_strings`), and
    names a Redis list (no lone surrogate, within ``MAX_REPLY_TO_CHARS``).

    The reply is short whatever the request holds: ``id``, ``tool_call_id`` and
    ``function`` are echoed cut to their bounds (``MAX_ID_CHARS``, ``MAX_NAME_CHARS``),
    each lone surrogate replaced by U+FFFD, so that the reply encodes and any caller can
    decode it.

    Args:
        client: Redis client.
        ttl_s: seconds the reply list is kept.
        raw: the message's one argument as received (text, bytes or decoded JSON).
        why: what could not be decoded (at most 300 characters are kept).
        worker: ``host:pid`` written into the result.

    Returns:
        True when a reply was posted.
    """
    loose = _loose(raw)
    reply_to = loose.get("reply_to")
    if not isinstance(reply_to, str) or len(reply_to) > MAX_REPLY_TO_CHARS:
        return False
    if has_lone_surrogate(reply_to):  # no Redis list can be named with it
        return False
    tool_call_id = loose.get("tool_call_id")
    tool_call_id = tool_call_id[:MAX_NAME_CHARS] if isinstance(tool_call_id, str) else None
    result = ToolCallResult(
        id=replace_lone_surrogates(_echo(loose.get("id"), MAX_ID_CHARS)),
        tool_call_id=replace_lone_surrogates(tool_call_id),
        function=replace_lone_surrogates(_echo(loose.get("function"), MAX_NAME_CHARS)),
        status=Status.REJECTED,
        content={"error": f"the request could not be decoded: {why[:300]}"},
        worker=worker,
    )
    try:
        push_reply(client, reply_to, ReplyEnvelope(type="result", result=result), ttl_s)
    except (redis.RedisError, codec.EncodeError) as post_error:
        log.error("could not post the rejection: %s", str(post_error)[:300])
        return False
    return True


#: The members of a request a rejection reads.
_ECHOED = frozenset({"reply_to", "id", "tool_call_id", "function"})


def _loose(raw: Any) -> dict[str, Any]:
    """The request as loose JSON, or what a scan of its text can read ({} for nothing)."""
    if not isinstance(raw, (str, bytes)):
        return raw if isinstance(raw, dict) else {}
    try:
        loose = codec.loads(raw)
    except codec.DecodeError:
        return dict(top_level_strings(raw, _ECHOED))
    return loose if isinstance(loose, dict) else {}


def _echo(value: Any, bound: int) -> str:
    """A scalar field as text cut to ``bound`` characters ("" for none or a container)."""
    if not value or isinstance(value, (dict, list)):
        return ""
    try:
        return str(value)[:bound]
    except ValueError:  # an integer past Python's digit limit
        return ""
