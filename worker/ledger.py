"""Exactly one terminal reply per call id, across redeliveries: claims and outcomes in Redis.

Dramatiq delivers at least once: a message comes back when its worker died or stalled.
Before running a call the worker claims its id; after, it records the outcome in the
same round trip that posts the reply. A redelivered message whose outcome exists gets
that reply again and never re-runs. One whose claim exists without an outcome (its
worker died mid-run) re-runs only when the tool is idempotent; otherwise it is answered
``crashed`` ("not retried because the tool may have side effects"). A claim held by a
worker that is still alive (fresh heartbeat) means the call is running there: the
duplicate message is dropped.

While Redis is unreachable (a restart, a dropped connection) claiming and answering are
retried with backoff until the call's deadline: the worker holds the message in memory,
so a call that ran during a short outage is still answered once Redis is back, instead
of failing its message and losing a result nobody could read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from toolfleet.shared import codec
from toolfleet.shared.naming import (
    cancel_key,
    claim_key,
    events_key,
    outcome_key,
    switches_key,
    workers_key,
)
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult, ToolEvent

__all__ = ["Claim", "Ledger"]

log = logging.getLogger("toolfleet.worker.ledger")

T = TypeVar("T")

#: Seconds between attempts while Redis is unreachable (the last one repeats).
RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class Claim:
    """What :meth:`Ledger.claim` found.

    Attributes:
        acquired: this worker now owns the call.
        outcome: the recorded terminal result (bytes of a result envelope), if any.
        canceled: the call was canceled before it ran.
        owner: the worker holding the claim when not acquired.
        owner_alive: whether that worker still heartbeats.
        switches: the switch states read in the same round trip (the ``<ns>:switches``
            hash as Redis returned it), so a switch change applies to the next call.
    """

    acquired: bool
    outcome: bytes | None = None
    canceled: bool = False
    owner: str | None = None
    owner_alive: bool = False
    switches: dict[Any, Any] | None = None


class Ledger:
    """Claims, outcomes and replies for one worker process.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_id: this process's id.
        reply_ttl_s: seconds replies, claims and outcomes outlive a call's deadline.
        worker_ttl_s: a worker heartbeat older than this is dead.
        events_maxlen: the events stream is capped at about this many entries.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        worker_id: str,
        reply_ttl_s: int,
        worker_ttl_s: float,
        events_maxlen: int = 100_000,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.worker_id = worker_id
        self.reply_ttl_s = reply_ttl_s
        self.worker_ttl_s = worker_ttl_s
        self.events_maxlen = events_maxlen

    def _ttl(self, request: ToolCallRequest) -> int:
        return int(max(0.0, request.deadline - time.time())) + self.reply_ttl_s

    @staticmethod
    def _retrying(request: ToolCallRequest, what: str, operation: Callable[[], T]) -> T:
        """Run ``operation``; while Redis is unreachable, retry with backoff until the deadline.

        Raises:
            redis.ConnectionError, redis.TimeoutError: still unreachable at the deadline.
        """
        attempt = 0
        while True:
            try:
                return operation()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                if time.time() + delay >= request.deadline:
                    raise
                if attempt == 0:
                    log.warning("%s of call %s: %s; retrying until its deadline",
                                what, request.id, exc)  # fmt: skip
                time.sleep(delay)
                attempt += 1

    def claim(self, request: ToolCallRequest, queue: str) -> Claim:
        """Try to take the call (one round trip; retried while Redis is unreachable)."""
        return self._retrying(request, "claim", lambda: self._claim(request, queue))

    def _claim(self, request: ToolCallRequest, queue: str) -> Claim:
        key = claim_key(self.namespace, request.id)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, self.worker_id, nx=True, ex=self._ttl(request))
        pipe.get(key)
        pipe.get(outcome_key(self.namespace, request.id))
        pipe.exists(cancel_key(self.namespace, request.id))
        pipe.hgetall(switches_key(self.namespace))
        acquired, owner, outcome, canceled, switches = pipe.execute()
        if outcome is not None:
            return Claim(acquired=False, outcome=outcome, switches=switches)
        if acquired:
            return Claim(acquired=True, canceled=bool(canceled), switches=switches)
        owner_id = owner.decode() if isinstance(owner, bytes) else owner
        if owner_id == self.worker_id:
            return Claim(acquired=True, canceled=bool(canceled), switches=switches)
        score = (
            self.client.zscore(workers_key(self.namespace, queue), owner_id) if owner_id else None
        )
        alive = score is not None and score >= time.time() - self.worker_ttl_s
        return Claim(
            acquired=False,
            canceled=bool(canceled),
            owner=owner_id,
            owner_alive=alive,
            switches=switches,
        )

    def take_over(self, request: ToolCallRequest) -> None:
        """Claim a call whose owner died (before re-running an idempotent tool)."""
        key = claim_key(self.namespace, request.id)
        self._retrying(
            request,
            "take-over",
            lambda: self.client.set(key, self.worker_id, ex=self._ttl(request)),
        )

    def finish(
        self,
        request: ToolCallRequest,
        result: ToolCallResult,
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record the outcome, post the reply, append lifecycle events (one round trip).

        ``events`` go to the capped ``<ns>:events`` stream. Retried while Redis is
        unreachable (a retry after a lost response may post the same reply twice; the
        producer drops the second).
        """
        data = ReplyEnvelope(type="result", result=result).encode()
        encoded = [codec.dumps(event) for event in events or []]

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for event in encoded:
                pipe.xadd(
                    events_key(self.namespace),
                    {"event": event},
                    maxlen=self.events_maxlen,
                    approximate=True,
                )
            pipe.set(outcome_key(self.namespace, request.id), data, ex=self._ttl(request))
            pipe.rpush(request.reply_to, data)
            pipe.expire(request.reply_to, self.reply_ttl_s)
            pipe.execute()

        self._retrying(request, "answer", write)

    def post_event(self, request: ToolCallRequest, event: ToolEvent) -> None:
        """Post a status event to the call's reply list (before its result)."""
        data = ReplyEnvelope(type="event", event=event).encode()
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(request.reply_to, data)
        pipe.expire(request.reply_to, self.reply_ttl_s)
        pipe.execute()

    def repost(self, request: ToolCallRequest, outcome: bytes) -> None:
        """Post a recorded outcome again (a redelivered message of a finished call)."""

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(request.reply_to, outcome)
            pipe.expire(request.reply_to, self.reply_ttl_s)
            pipe.execute()

        self._retrying(request, "re-post", write)
