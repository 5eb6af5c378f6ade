"""The Redis commands that tell the fleet about a call this client gives up on or cancels.

A call's cancel marker ``<ns>:cancel:<id>`` (:mod:`toolfleet.shared.cancels`) is read by
the worker's atomic outcome script before it posts a reply. The order matters: a call
this client resolves itself (a deadline passed, a local cancel) gets its ``RESOLVED``
marker written, in one transaction with a read of the call's recorded outcome,
*before* the caller's future is resolved. After that transaction either the worker had
recorded its outcome (its reply is already on the reply list: the caller gets that
result) or it never posts one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from toolfleet.shared import scripts
from toolfleet.shared.cancels import REQUESTED, RESOLVED
from toolfleet.shared.limits import DEADLINE_SLACK_S, MAX_TIMEOUT_S
from toolfleet.shared.naming import (
    cancel_channel,
    cancel_key,
    outcome_key,
    queue_msgs_key,
    workers_key,
)
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult

__all__ = [
    "CANCEL_QUEUED_SCRIPT",
    "count_live",
    "read_routes",
    "QueuedCancel",
    "outcomes_of",
    "merge_foreign_cancels",
    "queue_find_queued",
    "queue_foreign_cancel",
    "queue_resolved",
    "queued_cancel",
    "queued_request",
]

_PER_CALL = 3


def queue_resolved(pipe: Any, namespace: str, call_ids: Sequence[str], ttl_s: int) -> None:
    """Queue on ``pipe`` (a ``MULTI`` pipeline) the ``RESOLVED`` marker of each call.

    Per call: set the marker (``ttl_s`` seconds), read the recorded outcome, and publish
    the id on the cancel channel (a running tool stops). Sync and async pipelines alike;
    read the replies with :func:`outcomes_of`.
    """
    for call_id in call_ids:
        pipe.set(cancel_key(namespace, call_id), RESOLVED, ex=ttl_s)
        pipe.get(outcome_key(namespace, call_id))
        pipe.publish(cancel_channel(namespace), call_id)


def outcomes_of(replies: Sequence[Any]) -> list[bytes | None]:
    """Per call of :func:`queue_resolved`, its recorded outcome (a result envelope) or ``None``."""
    return [r if isinstance(r, bytes) else None for r in replies[1::_PER_CALL]]


def queue_foreign_cancel(pipe: Any, namespace: str, call_id: str, ttl_s: int) -> None:
    """Queue on ``pipe`` the cancel of a call this client does not hold (by its id).

    Three commands, whose results are ``(finished, marked, receivers)``: whether the call
    has its outcome, whether the ``REQUESTED`` cancel marker was set (only when no marker
    exists: a producer's ``RESOLVED`` marker stays), and the pub/sub message that reaches
    a running call. The cancel took effect when ``marked and not finished``. Works for
    sync and async pipelines alike.
    """
    pipe.exists(outcome_key(namespace, call_id))
    pipe.set(cancel_key(namespace, call_id), REQUESTED, ex=ttl_s, nx=True)
    pipe.publish(cancel_channel(namespace), call_id)


def merge_foreign_cancels(replies: Sequence[Sequence[Any]]) -> list[Any]:
    """One ``(finished, marked, receivers)`` of :func:`queue_foreign_cancel` run per group.

    A call's id does not name its group, so on a cluster the cancel runs in each group the
    client knows: the call finished if it finished in any, was marked if marked in any.
    """
    return [
        any(bool(r[0]) for r in replies),
        any(bool(r[1]) for r in replies),
        sum(int(r[2] or 0) for r in replies),
    ]


#: The source of ``cancel_queued.lua``. It records the outcome and posts the reply only
#: when no outcome exists (as the worker's finish script does, so the call has exactly one
#: reply) and its producer did not resolve it itself (a marker other than ``REQUESTED``:
#: nobody reads a reply).
CANCEL_QUEUED_SCRIPT = scripts.source(
    "cancel_queued", REQUESTED=REQUESTED.decode(), RESOLVED=RESOLVED.decode()
)


def queue_find_queued(pipe: Any, namespace: str, call_id: str, queues: Iterable[str]) -> None:
    """Queue on ``pipe`` the read of the call's Dramatiq message in each of ``queues``.

    The producer stores a call's message under its call id (``HSET <queue>.msgs <id>``,
    :func:`toolfleet.producer.publish.encode_message`) until a worker acknowledges it, so
    a queued (or prefetched, or running) call is found by its id alone: one ``HGET`` per
    queue, no key written per call. Read the replies with :func:`queued_request`.
    """
    for queue in queues:
        pipe.hget(queue_msgs_key(namespace, queue), call_id)


def queued_request(replies: Sequence[Any]) -> ToolCallRequest | None:
    """The request of the first message :func:`queue_find_queued` found (``None``: none).

    A body that does not decode is skipped (the worker answers it ``rejected``).
    """
    for body in replies:
        if not isinstance(body, bytes):
            continue
        try:
            return ToolCallRequest.decode(orjson.loads(body)["args"][0])
        except Exception:  # noqa: BLE001, S112 - not a toolfleet request: not ours to answer
            continue
    return None


class QueuedCancel:
    """The ``keys`` and ``args`` of :data:`CANCEL_QUEUED_SCRIPT` for one queued request."""

    __slots__ = ("args", "keys")

    def __init__(self, keys: list[str], args: list[Any]) -> None:
        self.keys = keys
        self.args = args


def queued_cancel(namespace: str, request: ToolCallRequest, reply_ttl_s: int) -> QueuedCancel:
    """Answer ``request`` ``canceled`` from any client: the script's keys and arguments.

    The outcome is kept as long as a worker keeps one (the time to the deadline, plus
    ``reply_ttl_s``), so a worker that dequeues the call later finds it and neither runs
    nor answers it.
    """
    now = time.time()
    result = ToolCallResult.failure(
        request, Status.CANCELED, "the call was canceled", queued_s=max(0.0, now - request.sent_at)
    )
    envelope = ReplyEnvelope(type="result", result=result).encode()
    ahead = min(max(0.0, request.deadline - now), MAX_TIMEOUT_S + DEADLINE_SLACK_S)
    keys = [
        outcome_key(namespace, request.id),
        request.reply_to,
        cancel_key(namespace, request.id),
    ]
    args: list[Any] = [
        envelope,
        int(ahead) + reply_ttl_s,
        reply_ttl_s,
        cancel_channel(namespace),
        request.id,
    ]
    return QueuedCancel(keys, args)


def read_routes(pipe: Any, keys: Sequence[str], ttl_s: int) -> Any:
    """Read conversation route records on ``pipe``, each kept ``ttl_s`` seconds longer.

    One ``GETEX ... EX`` per key, one round trip (:mod:`toolfleet.producer.affinity`).
    Returns what ``pipe.execute()`` returns (awaitable for an asyncio pipeline): per key,
    the record or ``None``.
    """
    for key in keys:
        pipe.getex(key, ex=ttl_s)
    return pipe.execute()


def count_live(pipe: Any, namespace: str, queues: Sequence[str], worker_ttl_s: float) -> Any:
    """Count each queue's workers that beat within ``worker_ttl_s`` seconds, on ``pipe``.

    Returns what ``pipe.execute()`` returns (awaitable for an asyncio pipeline).
    """
    since = time.time() - worker_ttl_s
    for queue in queues:
        pipe.zcount(workers_key(namespace, queue), since, "+inf")
    return pipe.execute()
