"""The one Redis script that admits a call under its quotas and enqueues it on its lane.

It does what Dramatiq's ``dispatch.lua`` ``enqueue`` command does (``HSET <queue>.msgs
id body``; ``RPUSH <queue> id``), with two differences: a call whose account is over a
quota (:mod:`.quotas`), or whose tool's breaker is open (:mod:`.breakers`: the producer
refuses fast, reading the state workers keep), is refused and nothing is written, and a
call to a queue with
lanes (:mod:`.lanes`) puts its id on the shorter of its account's two lanes and a
:data:`~.lanes.TOKEN` on the queue list (and the lane's number on the queue's lane
rotation when the lane was empty). Checking and enqueuing in one script makes the
quotas exact across any number of producer processes: no call is counted that was not
published, and none is published that was not counted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from redis.exceptions import ResponseError

from toolfleet.shared import scripts
from toolfleet.shared.idempotency import Duplicate, Idempotency, record_ttl_ms
from toolfleet.shared.naming import (
    outcome_key,
    queue_key,
    queue_msgs_key,
    quota_inflight_key,
    quota_rate_key,
)
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.breakers import breaker_key, unavailable_content
from toolfleet.shared.tenancy.lanes import TOKEN, lane_key, lanes_active_key, shard_for, uses_lanes
from toolfleet.shared.tenancy.quotas import limits_key, over_quota_content, quota_scopes
from toolfleet.shared.text import as_text
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult

__all__ = [
    "ENQUEUE_SCRIPT",
    "QuotaDefaults",
    "Refused",
    "batch_call",
    "batch_replies",
    "enqueue_call",
    "recheck",
    "refused",
]

#: One call's ``(keys, args)`` for :data:`ENQUEUE_SCRIPT` (:func:`enqueue_call`).
Call: TypeAlias = tuple[list[str], list[Any]]


#: The source of ``enqueue.lua``: what it takes and returns is written at its head. One
#: run admits and enqueues a batch of calls (:func:`batch_call`), each decided on its own
#: as if it ran alone, in order: a batch costs one round trip and one script call. What
#: it reads costs nothing when a feature is off: no breaker read for a tool without one,
#: one ``HMGET`` for all of a call's quota scopes (none without an account), and the
#: second lane's length only when the first lane is not empty. A push that makes its lane
#: non-empty appends the lane's number to the rotation (the invariant of :mod:`.lanes`).
ENQUEUE_SCRIPT = scripts.source("enqueue", TOKEN=TOKEN)


@dataclass(frozen=True, slots=True)
class QuotaDefaults:
    """The quota of an account with none of its own in Redis (``None``: no limit).

    Attributes:
        in_flight: most calls in flight at once.
        per_s: calls per second.
        burst: calls at once above the rate (``None``: ``per_s`` rounded up).
    """

    in_flight: int | None = None
    per_s: float | None = None
    burst: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> QuotaDefaults:
        """The defaults ``settings`` set (``quota_in_flight``, ``quota_per_s``, ``quota_burst``)."""
        return cls(settings.quota_in_flight, settings.quota_per_s, settings.quota_burst)


@dataclass(frozen=True, slots=True)
class Refused:
    """A call the enqueue script refused: nothing was published.

    Attributes:
        message: why, in words a model can act on.
        retry_after_s: seconds after which the call may succeed.
        reason: ``in_flight`` or ``per_s`` (a quota: ``rejected``), or ``breaker`` (the
            tool's open breaker: ``not_available``).
    """

    message: str
    retry_after_s: float
    reason: str = "in_flight"

    @property
    def breaker(self) -> bool:
        """Whether the tool's open breaker refused it (not a quota)."""
        return self.reason == "breaker"

    def result(self, request: ToolCallRequest) -> ToolCallResult:
        """The producer's own ``rejected`` answer to ``request`` (with ``retry_after_s``)."""
        if self.breaker:
            status, content = (
                Status.NOT_AVAILABLE,
                unavailable_content(request.function, self.retry_after_s),
            )
        else:
            status, content = Status.REJECTED, over_quota_content(self.message, self.retry_after_s)
        return ToolCallResult.answering(request, status, content, queued_s=0.0)


def enqueue_call(
    namespace: str,
    queue: str,
    *,
    redis_message_id: str,
    body: bytes,
    call_id: str,
    account: str | None,
    function: str,
    deadline: float,
    defaults: QuotaDefaults,
    now: float,
    breaker: bool = True,
    idempotency: Idempotency | None = None,
    idempotency_ttl_s: float = 0.0,
) -> tuple[list[str], list[Any]]:
    """The ``(keys, args)`` of :data:`ENQUEUE_SCRIPT` for one call.

    Args:
        namespace: key prefix.
        queue: the queue to publish on.
        redis_message_id: Dramatiq's id of the message (the ``.msgs`` field).
        body: the encoded Dramatiq message.
        call_id: the request id (what the in-flight quota counts).
        account: the call's account (``None``: no quota).
        function: the function called.
        deadline: the call's deadline, Unix epoch seconds.
        defaults: quotas of accounts without their own.
        now: the current Unix epoch time, seconds.
        breaker: whether the function may have a breaker (its state is read); ``False``
            only for a tool whose catalog entry declares none.
        idempotency: the call's idempotency key (``None``: none; nothing is read for it).
        idempotency_ttl_s: seconds the key's record outlives the call's deadline
            (``reply_ttl_s``: as long as the outcome it points to).
    """
    named, lanes, scopes = _call_keys(namespace, queue, account, function)
    keys = list(named)
    if idempotency is not None:
        keys.append(idempotency.record)
    args: list[Any] = [
        redis_message_id,
        body,
        int(now * 1000),
        int(deadline * 1000),
        call_id,
        defaults.in_flight or 0,
        defaults.per_s or 0,
        defaults.burst or 0,
        1 if breaker else 0,
        *lanes,
        len(scopes),
        idempotency.fingerprint if idempotency is not None else "",
        record_ttl_ms(deadline, now, idempotency_ttl_s) if idempotency is not None else 0,
        *scopes,
    ]
    return keys, args


@functools.lru_cache(maxsize=4096)
def _call_keys(
    namespace: str, queue: str, account: str | None, function: str
) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[str, ...]]:
    """A call's keys (idempotency aside), lanes and quota scopes.

    They depend only on these four, so the recent ones are remembered (a call pays a
    dict look-up).
    """
    scopes = quota_scopes(account, function)
    keys = [
        queue_key(namespace, queue),
        queue_msgs_key(namespace, queue),
        limits_key(namespace),
        breaker_key(namespace, function),
    ]
    for scope in scopes:
        keys += [quota_inflight_key(namespace, scope), quota_rate_key(namespace, scope)]
    lanes: tuple[Any, ...] = ("", "")
    if uses_lanes(queue):
        lanes = shard_for(account)
        keys += [lane_key(namespace, queue, lane) for lane in lanes]
        keys.append(lanes_active_key(namespace, queue))
    return tuple(keys), lanes, tuple(scopes)


def batch_call(calls: Sequence[Call]) -> Call:
    """The ``(keys, args)`` of one run of :data:`ENQUEUE_SCRIPT` for ``calls``, in order.

    Args:
        calls: each call's ``(keys, args)`` (:func:`enqueue_call`, or :func:`recheck`'s).

    Returns:
        ``(keys, args)``: every call's keys in turn; the number of calls, each call's
        numbers of keys and of arguments, then every call's arguments in turn. Keys of
        several slots are fine on one Redis only (on a cluster, a batch is one slot's).
    """
    keys: list[str] = []
    header: list[Any] = [len(calls)]
    args: list[Any] = []
    for call_keys, call_args in calls:
        keys += call_keys
        args += call_args
        header += [len(call_keys), len(call_args)]
    return keys, header + args


def batch_replies(reply: Any, calls: int) -> list[Any]:
    """Per call, what a run of :func:`batch_call` answered for it (an error as its exception).

    Args:
        reply: the script's reply (a list of ``calls`` replies).
        calls: how many calls the run carried.

    Raises:
        redis.ResponseError: the reply is not one reply per call (the script is not the
            batch script this module knows).
    """
    if not isinstance(reply, list) or len(reply) != calls:
        raise ResponseError(f"the enqueue script answered {reply!r} for {calls} calls")
    return reply


def recheck(
    namespace: str, call: tuple[list[str], list[Any]], reply: Any
) -> tuple[list[str], list[Any]] | None:
    """The ``(keys, args)`` to run :data:`ENQUEUE_SCRIPT` again with, or ``None``.

    The script answers ``{"check", id...}`` when a call's in-flight quota scope is full of
    calls whose outcome keys it was not given (a script names every key it touches in
    ``KEYS``, so it cannot look a member's outcome up by itself): the second run gets
    them, drops the answered calls from the scope and decides. A second run never asks
    again (members it was not given count as in flight).

    Args:
        namespace: key prefix.
        call: the ``(keys, args)`` of the run that answered ``reply``
            (:func:`enqueue_call`).
        reply: what that run returned.
    """
    if not isinstance(reply, list) or not reply or as_text(reply[0]) != "check":
        return None
    ids = [as_text(member) for member in reply[1:]]
    keys, args = call
    return [*keys, *(outcome_key(namespace, i) for i in ids)], [*args, *ids]


def refused(reply: Any) -> Refused | Duplicate | None:
    """What :data:`ENQUEUE_SCRIPT` answered: a refusal, a duplicate, ``None`` (enqueued)."""
    if isinstance(reply, list) and len(reply) == 2 and as_text(reply[0]) in ("duplicate", "misuse"):
        kind, first = (as_text(part) for part in reply)
        return Duplicate(first, misuse=kind == "misuse")
    if not isinstance(reply, list) or len(reply) != 4 or as_text(reply[0]) == "check":
        return None
    reason, scope, limit, wait_ms = (as_text(part) for part in reply)
    retry_after = max(math.ceil(float(wait_ms)) / 1000, 0.001)
    if reason == "breaker":
        return Refused("the tool's circuit breaker is open", retry_after, "breaker")
    account, _, function = scope.partition("/")
    who = f"account {account!r}" + (f" calling {function}" if function else "")
    if reason == "in_flight":
        what = f"{who} has {limit} calls in flight, its limit"
    else:
        what = f"{who} is over its limit of {float(limit):g} calls per second"
    return Refused(what, retry_after, reason)
