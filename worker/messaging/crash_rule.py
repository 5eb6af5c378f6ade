"""The crash rule of a dead process's calls: re-run a bounded number of times, then ``crashed``.

A call claimed by a worker process that died (SIGKILL, out of memory, a segfault, its own
``os.kill``) died with it. Its message goes back to its queue (:mod:`.recovery`), and the
next worker re-runs it when its tool is idempotent, else answers ``crashed`` (see
:mod:`toolfleet.worker.pipeline.ledger`). A call whose run keeps ending its process would
so be re-run until its deadline, taking a process down each time, and with it every other
call that process held, while the fleet's other calls find no live worker. So each death
of a claimed call is counted, per call id, in Redis (:func:`~toolfleet.shared.naming.crashes_key`,
expiring at the call's deadline), by the same script that gives a dead broker's messages
back (``requeue_at_head.lua``); past :attr:`CrashRule.reruns` re-runs (the setting
``crash_reruns``, default 2, for idempotent tools too) that script answers the call
``crashed`` with its cause (:func:`crash_message`), records its event, and dead-letters
its message; :func:`requeue_with_crash_rule`'s caller counts it in
``toolfleet_crash_loops_total{function}`` and logs it.

Only a call the dead process had claimed counts (its claim token starts with
``<worker id>#``): a message it had merely fetched never ran there. The bodies are read
and decoded here, client-side (the script names every key it touches in ``KEYS``), once
per recovery of a dead broker, never on a live call's path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError

from toolfleet.shared import codec, scripts
from toolfleet.shared.cancels import REQUESTED
from toolfleet.shared.limits import DEADLINE_SLACK_S, MAX_TIMEOUT_S
from toolfleet.shared.naming import (
    acks_key,
    cancel_key,
    claim_key,
    crashes_key,
    dead_letters_key,
    events_key,
    outcome_key,
    queue_key,
    queue_msgs_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.settings import Settings
from toolfleet.shared.text import as_text
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.supervision.crash_count import count_crash_loop

__all__ = ["CrashRule", "crash_message", "requeue_with_crash_rule"]

log = logging.getLogger("toolfleet.worker.recovery")

#: ``requeue_at_head.lua`` (what it takes and returns is written at its head).
_REQUEUE = scripts.script("requeue_at_head", REQUESTED=REQUESTED.decode())


def crash_message(runs: int) -> str:
    """What the model reads of a call answered ``crashed``: ``runs`` runs ended their process."""
    times = "once" if runs == 1 else f"{runs} times"
    return f"the tool's process died {times} running this call; it is not run again"


@dataclass(frozen=True)
class CrashRule:
    """How the calls of a dead process are answered.

    Attributes:
        reruns: times a call whose run ended its process is run again at most.
        reply_ttl_s: seconds a reply (and an outcome, past the deadline) is kept.
        events_maxlen: the events stream is capped at about this many entries.
    """

    reruns: int
    reply_ttl_s: int
    events_maxlen: int = 100_000

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> CrashRule:
        """The rule of ``settings`` (default: the ``TOOLFLEET_*`` environment's)."""
        chosen = Settings.from_env() if settings is None else settings
        return cls(chosen.crash_reruns, chosen.reply_ttl_s)


@dataclass(frozen=True)
class _Call:
    redis_id: str
    request: ToolCallRequest


def _request_of(body: bytes | None) -> ToolCallRequest | None:
    """The request carried by a Dramatiq message body (None: not one)."""
    if body is None:
        return None
    try:
        message = codec.loads(body)
        argument = message["args"][0]
        if isinstance(argument, (str, bytes)):
            return ToolCallRequest.decode(argument)
        return ToolCallRequest.model_validate(argument)
    except (codec.DecodeError, ValidationError, ValueError, KeyError, IndexError, TypeError):
        return None


def _fetched_calls(
    client: redis.Redis, namespace: str, broker_id: str, queues: Sequence[str]
) -> list[list[_Call]]:
    """The decodable calls in broker ``broker_id``'s acks set of each of ``queues``."""
    pipe = pipeline(client)
    for queue in queues:
        pipe.smembers(acks_key(namespace, broker_id, queue))
    members = [sorted(ids) for ids in pipe.execute()]
    pipe = pipeline(client)
    for queue, ids in zip(queues, members, strict=True):
        if ids:
            pipe.hmget(queue_msgs_key(namespace, queue), ids)
    bodies = iter(pipe.execute())
    found: list[list[_Call]] = []
    for ids in members:
        calls = []
        for redis_id, body in zip(ids, next(bodies) if ids else [], strict=True):
            request = _request_of(body)
            if request is not None:
                calls.append(_Call(as_text(redis_id), request))
        found.append(calls)
    return found


def _call_arguments(
    call: _Call, namespace: str, worker_id: str, rule: CrashRule, now: float
) -> tuple[list[str], list[Any]]:
    """The five keys and six arguments of one call in ``requeue_at_head.lua``."""
    request = call.request
    ns_keys = [claim_key, outcome_key, cancel_key, crashes_key]
    message = crash_message(rule.reruns + 1)
    result = ToolCallResult(
        id=request.id,
        tool_call_id=request.tool_call_id,
        function=request.function,
        status=Status.CRASHED,
        content={"error": message},
        worker=worker_id,
    )
    event = {
        "kind": "tool_responded", "at": now, "id": request.id, "function": request.function,
        "account": request.context.account, "worker": worker_id,
        "traceparent": request.context.traceparent, "status": Status.CRASHED.value,
        "queued_s": None, "run_s": None, "result": None, "error": message,
    }  # fmt: skip
    ahead = min(max(0.0, request.deadline - now), MAX_TIMEOUT_S + DEADLINE_SLACK_S)
    argv: list[Any] = [
        call.redis_id,
        int(request.deadline * 1000),
        ReplyEnvelope(type="result", result=result).encode(),
        int(ahead) + rule.reply_ttl_s,
        rule.reply_ttl_s,
        codec.dumps(event),
    ]
    return [*(key(namespace, request.id) for key in ns_keys), request.reply_to], argv


def requeue_with_crash_rule(
    client: redis.Redis,
    namespace: str,
    broker_id: str,
    queues: Sequence[str],
    worker_id: str | None,
    rule: CrashRule | None,
) -> int:
    """Give broker ``broker_id``'s acks sets of ``queues`` back at their queues' head.

    One ``requeue_at_head.lua`` call. With ``worker_id`` (the dead process's ``host:pid``)
    the crash rule applies to the calls that process had claimed (see the module's text);
    without it every message goes back as it is.

    Args:
        client: Redis client.
        namespace: the broker's namespace (Dramatiq's; the group's on a cluster).
        broker_id: Dramatiq's ``broker_id`` of the dead broker.
        queues: the queues whose acks sets are given back.
        worker_id: the dead process's worker id, or None when it is not known.
        rule: the crash rule (None: the environment's settings).

    Returns:
        How many messages went back to their queues.

    Raises:
        redis.RedisError: Redis failed.
    """
    if not queues:
        return 0
    chosen = CrashRule.from_settings() if rule is None else rule
    now = time.time()
    per_queue = (
        _fetched_calls(client, namespace, broker_id, queues) if worker_id else [[] for _ in queues]
    )
    keys: list[str] = [events_key(namespace)]
    argv: list[Any] = [chosen.events_maxlen, f"{worker_id}#" if worker_id else "",
                       chosen.reruns, int(now * 1000), len(queues)]  # fmt: skip
    ordered: list[ToolCallRequest] = []
    for queue, calls in zip(queues, per_queue, strict=True):
        keys += [acks_key(namespace, broker_id, queue), queue_key(namespace, queue),
                 queue_msgs_key(namespace, queue), dead_letters_key(namespace, queue),
                 queue_msgs_key(namespace, f"{queue}.XQ")]  # fmt: skip
        argv.append(len(calls))
        for call in calls:
            call_keys, call_argv = _call_arguments(call, namespace, worker_id or "", chosen, now)
            keys += call_keys
            argv += call_argv
            ordered.append(call.request)
    moved, *answered = _REQUEUE(keys=keys, args=argv, client=client)
    for index in answered:
        request = ordered[int(index) - 1]
        count_crash_loop(request.function)
        log.error(
            "call %s to %s: its process (%s) died running it %d times; answered crashed and "
            "dead-lettered", request.id, request.function, worker_id, chosen.reruns + 1,
        )  # fmt: skip
    return int(moved)
