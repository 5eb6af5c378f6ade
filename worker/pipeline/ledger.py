"""Exactly one terminal reply per call id, across redeliveries: claims and outcomes in Redis.

Dramatiq delivers at least once: a message comes back when its worker died or stalled,
and a raw duplicate may be published. Before running a call the worker claims its id
for one *delivery* (a token unique to this handling, ``<worker id>#<random>``), in one
atomic script that also reads the outcome and the cancel marker and records the call as
in flight for the supervisor's watchdog. After the run, one atomic script records the
outcome only if none exists yet and posts the reply only then (the process's
:class:`~toolfleet.worker.pipeline.completer.Completer` writes every call finished since
its last write in one such script), so a call has exactly one
reply whoever answers first (the worker, or the watchdog at the limit) and a late result
is discarded. The reply is not posted when the producer resolved the call itself (its
cancel marker says so, see :mod:`toolfleet.shared.cancels`).

Another delivery of a claimed call never runs it again: the outcome exists (nothing more
to do: the reply went out with it), or the claim's worker is alive (the call is running
there; the duplicate is dropped), or it is this process (the same check, in memory, by
:class:`~toolfleet.worker.messaging.actors.MessageHandler`). Only a claim of a dead worker
(stale heartbeat, or this worker id in a process that does not run the call: a reused
pid) leads to a re-run, and only for an idempotent tool; otherwise the call is answered
``crashed`` ("not retried because the tool may have side effects").

A claim lives on one master, which replicates asynchronously: a failover may lose it, and
a redelivered call then finds no claim and runs again. For a non-idempotent tool the
claim is therefore followed by ``WAIT numreplicas timeout`` on the same connection, in the
same round trip (:meth:`Ledger.claim` with ``durable=True``): the tool runs once the claim
reached ``claim_replicas`` replicas, or after ``claim_replicas_timeout_ms`` without them
(the claim then says how many acknowledged; the caller counts and logs the shortfall).
``claim_replicas=None`` means one replica when the master has one (its ``INFO
replication``, asked again every few seconds), else no ``WAIT``.

While Redis is unreachable (a restart, a dropped connection) claiming and answering are
retried with backoff until the call's deadline: the worker holds the message in memory,
so a call that ran during a short outage is still answered once Redis is back, instead
of failing its message and losing a result nobody could read.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from pydantic import BaseModel
from redis.exceptions import NoScriptError

from toolfleet.shared import codec, scripts
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.limits import DEADLINE_SLACK_S, MAX_TIMEOUT_S
from toolfleet.shared.naming import (
    cancel_key,
    claim_key,
    inflight_key,
    outcome_key,
    switches_key,
    workers_key,
)
from toolfleet.shared.pipelines import on_one_connection, pipeline
from toolfleet.shared.text import as_text
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult, ToolEvent
from toolfleet.worker.pipeline.completer import (
    RETRY_BACKOFF_S,
    Completer,
    InlineAck,
    Outcome,
    Posted,
    post_outcome,
)
from toolfleet.worker.pipeline.replies import push_reply
from toolfleet.worker.supervision.inflight_table import InFlightTable

__all__ = [
    "INFLIGHT_TTL_S",
    "MIN_ANSWER_S",
    "Claim",
    "InFlight",
    "RETRY_BACKOFF_S",
    "InlineAck",
    "Ledger",
    "Outcome",
    "Posted",
    "owner_of",
    "post_outcome",
]

log = logging.getLogger("toolfleet.worker.ledger")

T = TypeVar("T")

#: Seconds the in-flight hash of a process outlives its last heartbeat: the longest a call
#: may run, plus the deadline slack (each heartbeat sets it, not each claim).
INFLIGHT_TTL_S = int(MAX_TIMEOUT_S + DEADLINE_SLACK_S)
#: Seconds a worker trusts what a master said of its replicas (``claim_replicas`` unset).
REPLICAS_CHECK_S = 5.0
#: An in-flight record's ``answer_by`` is at least this many seconds after its claim: the
#: watchdog never answers a call sooner (and, idle, need not look more often).
MIN_ANSWER_S = 0.5


#: ``claim.lua`` (what it takes and returns is written at its head).
_CLAIM = scripts.source("claim")


class InFlight(BaseModel):
    """A call running in a worker process, as the watchdog sees it.

    Attributes:
        id, tool_call_id, function, reply_to: copied from the request.
        answer_by: Unix epoch seconds by which the worker answers the call itself (its
            time limit plus the isolation's margin); past it, the watchdog answers
            ``timeout``.
        limit_s: the call's time limit, seconds.
    """

    id: str
    tool_call_id: str | None = None
    function: str
    reply_to: str
    answer_by: float
    limit_s: float


@dataclass(frozen=True)
class Claim:
    """What :meth:`Ledger.claim` found.

    Attributes:
        acquired: this delivery now owns the call.
        outcome: the recorded terminal result (bytes of a result envelope), if any.
        cancel: the call's cancel marker (``b""`` when it was not canceled).
        owner: the worker id holding the claim when not acquired.
        owner_alive: whether that worker still heartbeats.
        switches: the switch states read in the same round trip (the ``<ns>:switches``
            hash as Redis returned it), so a switch change applies to the next call.
        replicas_wanted: replicas the claim was to reach before the call runs (0: no
            ``WAIT`` was made).
        replicas_acked: replicas that acknowledged it within the timeout (``WAIT``'s
            reply), or None without a ``WAIT``.
    """

    acquired: bool
    outcome: bytes | None = None
    cancel: bytes = b""
    owner: str | None = None
    owner_alive: bool = False
    switches: dict[Any, Any] | None = None
    replicas_wanted: int = 0
    replicas_acked: int | None = None

    @property
    def under_replicated(self) -> bool:
        """True when a ``WAIT`` was made and fewer replicas than wanted acknowledged."""
        return self.replicas_acked is not None and self.replicas_acked < self.replicas_wanted

    @property
    def canceled(self) -> bool:
        """True when the call was canceled (by a caller, or by the producer at its deadline)."""
        return bool(self.cancel)


def owner_of(token: str) -> str:
    """The worker id in a claim token ``<worker id>#<random>`` (a bare worker id as is)."""
    return token.rpartition("#")[0] or token


class Ledger:
    """Claims, outcomes and replies for one worker process.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_id: this process's id.
        reply_ttl_s: seconds replies, claims and outcomes outlive a call's deadline.
        worker_ttl_s: a worker heartbeat older than this is dead.
        events_maxlen: the events stream is capped at about this many entries.
        claim_replicas: replicas a durable claim waits for (``WAIT``); None: one when the
            claim's master has a replica, else none; 0: never wait.
        claim_replicas_timeout_ms: longest a durable claim waits for them, milliseconds.
        table: the process's in-flight table in shared memory, which its supervisor's
            watchdog reads (``None``: the watchdog reads Redis only).
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        worker_id: str,
        reply_ttl_s: int,
        worker_ttl_s: float,
        events_maxlen: int = 100_000,
        claim_replicas: int | None = None,
        claim_replicas_timeout_ms: int = 100,
        table: InFlightTable | None = None,
    ) -> None:
        self.client = client
        self.table = table
        self.namespace = namespace
        self.worker_id = worker_id
        self.reply_ttl_s = reply_ttl_s
        self.worker_ttl_s = worker_ttl_s
        self.events_maxlen = events_maxlen
        self.claim_replicas = claim_replicas
        self.claim_replicas_timeout_ms = claim_replicas_timeout_ms
        #: writes the outcomes of this process's calls, every finished call per write
        self.completer = Completer(client, namespace, worker_id, events_maxlen)
        self._claim_script = client.register_script(_CLAIM)
        #: claim tokens: this process's random prefix and a counter (no syscall per call)
        self._token_prefix = f"{worker_id}#{os.urandom(4).hex()}"
        self._tokens = itertools.count()
        #: master name ('' on a plain Redis) -> (replicas, monotonic time to ask again)
        self._replicas: dict[str, tuple[int, float]] = {}

    def replicas_wanted(self, key: str) -> int:
        """Replicas a durable claim of ``key`` waits for (see ``claim_replicas``).

        Unset, it asks the master that serves ``key`` (on a cluster, per the client's slot
        map) how many replicas it has (``INFO replication``'s ``connected_slaves``, capped
        at 1), once per :data:`REPLICAS_CHECK_S` per master; 0 while it cannot tell.
        """
        if self.claim_replicas is not None:
            return self.claim_replicas
        node: Any = self.client
        name = ""
        if is_cluster(self.client):
            cluster: Any = self.client
            found = cluster.get_node_from_key(key)
            node, name = cluster.get_redis_connection(found), str(found.name)
        known = self._replicas.get(name)
        now = time.monotonic()
        if known is not None and known[1] > now:
            return known[0]
        try:
            info = node.info("replication")
        except redis.RedisError:
            return 0
        count = min(1, int(info.get("connected_slaves", 0)))
        self._replicas[name] = (count, now + REPLICAS_CHECK_S)
        return count

    def _ttl(self, request: ToolCallRequest) -> int:
        ahead = min(max(0.0, request.deadline - time.time()), MAX_TIMEOUT_S + DEADLINE_SLACK_S)
        return int(ahead) + self.reply_ttl_s

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

    def new_token(self) -> str:
        """A claim token for one delivery: ``<worker id>#<random><counter>`` (hex)."""
        return f"{self._token_prefix}{next(self._tokens):x}"

    def claim(
        self,
        request: ToolCallRequest,
        queue: str,
        token: str,
        record: InFlight,
        durable: bool = False,
    ) -> Claim:
        """Try to take the call for the delivery ``token`` (retried while Redis is unreachable).

        Args:
            request: the call.
            queue: its queue (whose heartbeats tell whether an owner is alive).
            token: this delivery's claim token (:meth:`new_token`).
            record: what the watchdog needs while the call runs.
            durable: follow the claim with ``WAIT`` (for a non-idempotent tool), in the
                same round trip, when :meth:`replicas_wanted` is above 0.

        Raises:
            redis.ConnectionError, redis.TimeoutError: Redis still unreachable at the
                call's deadline.
        """
        return self._retrying(
            request, "claim", lambda: self._claim(request, queue, token, record, durable)
        )

    def _claim_and_wait(self, keys: list[str], argv: list[str | int], wanted: int) -> list[Any]:
        """The claim script then ``WAIT wanted timeout`` on one connection: both replies."""
        commands = [
            ("EVALSHA", self._claim_script.sha, len(keys), *keys, *argv),
            ("WAIT", wanted, self.claim_replicas_timeout_ms),
        ]
        replies = on_one_connection(self.client, keys[0], commands)
        if isinstance(replies[0], NoScriptError):  # a restarted or new master
            self.client.script_load(_CLAIM)
            replies = on_one_connection(self.client, keys[0], commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return list(replies)

    def _claim(
        self, request: ToolCallRequest, queue: str, token: str, record: InFlight, durable: bool
    ) -> Claim:
        keys = [
            claim_key(self.namespace, request.id),
            outcome_key(self.namespace, request.id),
            cancel_key(self.namespace, request.id),
            inflight_key(self.namespace, self.worker_id),
            switches_key(self.namespace),
        ]
        argv: list[str | int] = [token, self._ttl(request), request.id, record.model_dump_json()]
        wanted = self.replicas_wanted(keys[0]) if durable else 0
        acked: int | None = None
        if wanted > 0:
            reply, waited = self._claim_and_wait(keys, argv, wanted)
            acked = int(waited)
        else:
            reply = self._claim_script(keys, argv)
        state, value, cancel, flat = reply
        switches = dict(zip(flat[::2], flat[1::2], strict=True))
        return self._claim_of(request, queue, token, record, (state, value, cancel), switches,
                              wanted, acked)  # fmt: skip

    def fetch_claim(
        self, claimable: dict[str, tuple[float, float, int]], grace_s: float, expected: list[str]
    ) -> tuple[list[str], list[Any], list[str]]:
        """What ``fetch.lua`` takes to claim the calls it fetches (see its head).

        Args:
            claimable: function -> (time limit s, isolation margin s, 1 when retried) of
                the functions whose calls the fetch claims.
            grace_s: seconds past the deadline a call bound by it may run.
            expected: the ids the fetch expects to take (their keys go to KEYS).

        Returns:
            The keys after the rotation (switches hash, in-flight hash), the arguments
            after the lanes' count (the batch's claim tokens are ``<worker id>#<random>
            <n>.<i>``) and the claim, outcome and cancel keys of each expected id.
        """
        keys = [switches_key(self.namespace), inflight_key(self.namespace, self.worker_id)]
        argv: list[Any] = [
            time.time(), f"{self._token_prefix}{next(self._tokens):x}.", self.reply_ttl_s,
            int(MAX_TIMEOUT_S + DEADLINE_SLACK_S), grace_s, MIN_ANSWER_S, codec.dumps(claimable),
        ]  # fmt: skip
        ns = self.namespace
        per_id = [
            key
            for call_id in expected
            for key in (claim_key(ns, call_id), outcome_key(ns, call_id), cancel_key(ns, call_id))
        ]
        return keys, argv, per_id

    def fetched_claim(
        self,
        request: ToolCallRequest,
        queue: str,
        found: tuple[int, bytes, bytes],
        switches: dict[Any, Any],
        record: InFlight,
    ) -> Claim:
        """The :class:`Claim` of a call ``fetch.lua`` claimed (``found``: state, value, cancel)."""
        state, value, cancel = found
        token = as_text(value) if state == 1 else ""
        return self._claim_of(request, queue, token, record, found, switches, 0, None)

    def release(self, call_id: str) -> None:
        """Give up this process's claim of a call that goes back to its queue unrun.

        Raises:
            redis.RedisError: Redis failed.
        """
        if self.table is not None:
            self.table.clear(call_id)
        pipe = pipeline(self.client)
        pipe.delete(claim_key(self.namespace, call_id))
        pipe.hdel(inflight_key(self.namespace, self.worker_id), call_id)
        pipe.execute()

    def _claim_of(
        self,
        request: ToolCallRequest,
        queue: str,
        token: str,
        record: InFlight,
        found: tuple[int, bytes, bytes],
        switches: dict[Any, Any],
        wanted: int,
        acked: int | None,
    ) -> Claim:
        state, value, cancel = found
        if state == 0:
            return Claim(acquired=False, outcome=value, cancel=cancel, switches=switches)
        if state == 1:
            if self.table is not None:
                self.table.put(request.id, record.answer_by)
            return Claim(acquired=True, cancel=cancel, switches=switches,
                         replicas_wanted=wanted, replicas_acked=acked)  # fmt: skip
        held = as_text(value)
        if held == token:  # this delivery's own claim: a retry of a script whose reply was lost
            if self.table is not None:
                self.table.put(request.id, record.answer_by)
            return Claim(acquired=True, cancel=cancel, switches=switches,
                         replicas_wanted=wanted, replicas_acked=acked)  # fmt: skip
        owner = owner_of(held)
        if owner == self.worker_id:  # not running in this process (it checks that first)
            return Claim(acquired=False, cancel=cancel, owner=owner, switches=switches)
        score = self.client.zscore(workers_key(self.namespace, queue), owner) if owner else None
        alive = score is not None and score >= time.time() - self.worker_ttl_s
        return Claim(
            acquired=False, cancel=cancel, owner=owner, owner_alive=alive, switches=switches
        )

    def take_over(self, request: ToolCallRequest, token: str, record: InFlight) -> None:
        """Claim a call whose owner died (before re-running an idempotent tool)."""
        key = claim_key(self.namespace, request.id)

        def write() -> None:
            pipe = pipeline(self.client)
            pipe.set(key, token, ex=self._ttl(request))
            pipe.hset(inflight_key(self.namespace, self.worker_id), request.id,
                      record.model_dump_json())  # fmt: skip
            pipe.execute()

        self._retrying(request, "take-over", write)
        if self.table is not None:
            self.table.put(request.id, record.answer_by)

    def finish(
        self,
        request: ToolCallRequest,
        result: ToolCallResult,
        events: list[dict[str, Any]] | None = None,
        ack: InlineAck | None = None,
        on_posted: Callable[[int], None] | None = None,
    ) -> int:
        """Record the outcome and post the reply unless the call was answered already.

        ``on_posted``, when given, counts the call: called with the :class:`Posted` value
        by the thread that wrote its batch, before that batch's metrics go out.

        ``events`` go to the capped ``<ns>:events`` stream, only with a recorded outcome.
        ``ack``, when given, is the call's Dramatiq message, acknowledged in the same script.
        Written by the process's :attr:`completer` together with every other call finished
        meanwhile, in one atomic script; returns once written. Retried while Redis is
        unreachable, until the call's deadline (a retry after a lost response finds the
        outcome and posts nothing more).

        Returns:
            A :class:`Posted` value.

        Raises:
            codec.EncodeError: the result does not encode.
            redis.ConnectionError, redis.TimeoutError: Redis still unreachable at the deadline.
            redis.RedisError: Redis refused the write.
        """
        data = ReplyEnvelope(type="result", result=result).encode()
        encoded = [codec.dumps(event) for event in events or []]
        outcome = Outcome(
            request.id, request.reply_to, data, self._ttl(request), self.reply_ttl_s,
            encoded, ack, request.deadline, on_posted,
        )  # fmt: skip
        try:
            return self.completer.complete(outcome)
        finally:
            if self.table is not None:
                self.table.clear(request.id)

    def forget(self, request: ToolCallRequest) -> None:
        """Drop the call's in-flight record (a delivery that ends without an answer)."""
        if self.table is not None:
            self.table.clear(request.id)
        try:
            self.client.hdel(inflight_key(self.namespace, self.worker_id), request.id)
        except redis.RedisError as exc:
            log.warning("could not clear the in-flight record of %s: %s", request.id, exc)

    def postpone(self, call_id: str, waited_s: float) -> None:
        """Move the watchdog's ``answer_by`` of a call ``waited_s`` seconds later (or earlier).

        For a call that waits (for a concurrency slot) before it begins to run: the wait
        is not run time.
        """
        key = inflight_key(self.namespace, self.worker_id)
        try:
            raw = self.client.hget(key, call_id)
            if raw is None:
                return
            record = InFlight.model_validate_json(raw)
            record.answer_by += waited_s
            self.client.hset(key, call_id, record.model_dump_json())
            if self.table is not None:
                self.table.move(call_id, record.answer_by)
        except redis.RedisError as exc:
            log.warning("could not postpone the watchdog of %s: %s", call_id, exc)

    def post_event(self, request: ToolCallRequest, event: ToolEvent) -> None:
        """Post a status event to the call's reply list (before its result)."""
        envelope = ReplyEnvelope(type="event", event=event)
        push_reply(self.client, request.reply_to, envelope, self.reply_ttl_s)
