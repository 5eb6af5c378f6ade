"""Publish requests as Dramatiq messages without touching Dramatiq's global encoder.

The message body is built here and encoded with orjson: Dramatiq's encoder is
process-global and the host application may use Dramatiq for its own tasks, so the
producer never reads or changes it. The request itself travels as the message's one
argument, a JSON string. Enqueuing runs toolfleet's enqueue script
(:mod:`toolfleet.shared.tenancy.enqueue`): what Dramatiq's ``dispatch`` ``enqueue``
command does (``HSET <queue>.msgs id body`` + ``RPUSH``), on the account's lane, after
checking the account's quotas in the same atomic step; queue maintenance is left to the
workers. Several messages go in one pipeline (one round trip). A call over its quota
comes back as a :class:`~toolfleet.shared.tenancy.enqueue.Refused` (nothing published).

A pipeline sends ``EVALSHA`` alone: redis-py's ``Script`` on a pipeline would send
``SCRIPT EXISTS`` before every batch. The replies that come back ``NOSCRIPT`` (Redis
restarted or ran ``SCRIPT FLUSH``: the script did not run, nothing was written) are sent
again, once, after ``SCRIPT LOAD``. A reply that asks for the outcome keys of the calls
filling an in-flight quota (:func:`~toolfleet.shared.tenancy.enqueue.recheck`) is sent
again with them, in one more pipeline for all such replies of a batch.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Container, Mapping, Sequence
from typing import Any

import orjson
import redis
import redis.asyncio

from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.shared import tracing
from toolfleet.shared.idempotency import Duplicate, Idempotency
from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.tenancy.enqueue import (
    ENQUEUE_SCRIPT,
    QuotaDefaults,
    Refused,
    enqueue_call,
    recheck,
    refused,
)
from toolfleet.shared.wire import ToolCallRequest

__all__ = ["AsyncPublisher", "Outcome", "Publisher", "encode_message"]

#: Most messages sent in one pipeline.
MAX_BATCH = 1000

#: What publishing one request came to: ``None`` (enqueued), :class:`Refused` (over a
#: quota: nothing published), a :class:`~toolfleet.shared.idempotency.Duplicate` (its
#: idempotency key names an earlier call: nothing published) or the error Redis answered.
Outcome = BaseException | Refused | Duplicate | None

#: What a publish's future holds (an error is set as its exception).
_Settled = Refused | Duplicate | None

#: Per request id, the idempotency key of the calls that carry one.
Keys = Mapping[str, Idempotency]


def encode_message(
    queue: str, request: ToolCallRequest, *, redis_message_id: str | None = None
) -> tuple[str, bytes]:
    """The Dramatiq message carrying ``request``: ``(redis_message_id, body)``.

    The producer publishes each call under its call id (``redis_message_id=request.id``:
    already a unique UUID), so any client can find a queued call's message, and its
    ``reply_to``, from the id alone (:func:`toolfleet.producer._core.fleet.queue_find_queued`);
    ``None`` draws a fresh id (another delivery of the same request). The call's PRODUCER
    span (:func:`toolfleet.shared.tracing.produce`) covers this, and its context travels in
    the request.
    """
    redis_message_id = redis_message_id or str(uuid.uuid4())
    with tracing.produce(queue, request) as request:
        message: dict[str, Any] = {
            "queue_name": queue,
            "actor_name": actor_name_for(queue),
            "args": [request.encode().decode("utf-8")],
            "kwargs": {},
            "options": {"redis_message_id": redis_message_id},
            "message_id": request.id,
            "message_timestamp": int(time.time() * 1000),
        }
    return redis_message_id, orjson.dumps(message)


class _Dispatch:
    """Keys and arguments of the enqueue script for one request."""

    def __init__(
        self,
        namespace: str,
        quotas: QuotaDefaults | None,
        idempotency_ttl_s: float,
        keys: KeySpace | None = None,
    ) -> None:
        self.namespace = namespace
        self.quotas = quotas or QuotaDefaults()
        self.idempotency_ttl_s = idempotency_ttl_s
        self.keys = keys or KeySpace(namespace, False, "")

    def call(
        self,
        queue: str,
        request: ToolCallRequest,
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> tuple[list[str], list[Any]]:
        if self.keys.cluster:  # its reply comes on the client's list in the queue's group
            request = request.model_copy(update={"reply_to": self.keys.reply_to(queue)})
        redis_message_id, body = encode_message(queue, request, redis_message_id=request.id)
        return enqueue_call(
            self.keys.of_queue(queue),
            queue,
            redis_message_id=redis_message_id,
            body=body,
            call_id=request.id,
            account=request.context.account,
            function=request.function,
            deadline=request.deadline,
            defaults=self.quotas,
            now=time.time(),
            breaker=request.function not in no_breaker,
            idempotency=keys.get(request.id) if keys else None,
            idempotency_ttl_s=self.idempotency_ttl_s,
        )


def _evalsha(pipe: Any, sha: str, calls: Sequence[tuple[list[str], list[Any]]]) -> None:
    for keys, args in calls:
        pipe.evalsha(sha, len(keys), *keys, *args)


def _unloaded(replies: Sequence[Any]) -> list[int]:
    """The positions of the replies that say the script was not loaded (it did not run)."""
    return [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]


def _rechecks(
    prefixes: Sequence[str], calls: Sequence[tuple[list[str], list[Any]]], replies: Sequence[Any]
) -> dict[int, tuple[list[str], list[Any]]]:
    """The positions of the replies that ask to run again, with the call to run there.

    ``prefixes``: each call's key prefix (its queue's, :class:`KeySpace`).
    """
    again = {}
    for i, (call, reply, prefix) in enumerate(zip(calls, replies, prefixes, strict=True)):
        rerun = recheck(prefix, call, reply)
        if rerun is not None:
            again[i] = rerun
    return again


def _outcome(reply: Any) -> Outcome:
    if isinstance(reply, BaseException):
        return reply
    return refused(reply)


class Publisher:
    """Enqueue :class:`ToolCallRequest` s on their queues (thread-safe).

    Args:
        client: Redis client (shared with the rest of the producer).
        namespace: key prefix (Dramatiq's namespace).
        quotas: quotas of accounts without their own (``None``: no limit).
        idempotency_ttl_s: seconds an idempotency key's record outlives its call's
            deadline (the ``reply_ttl_s`` setting).
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        quotas: QuotaDefaults | None = None,
        idempotency_ttl_s: float = 300.0,
        keys: KeySpace | None = None,
    ) -> None:
        self._client = client
        self._dispatch = _Dispatch(namespace, quotas, idempotency_ttl_s, keys)
        self._script = client.register_script(ENQUEUE_SCRIPT)

    def publish(self, queue: str, request: ToolCallRequest) -> Refused | Duplicate | None:
        """Enqueue one request on ``queue``; a :class:`Refused` when over a quota.

        Raises:
            redis.RedisError: Redis could not be reached.
        """
        keys, args = self._dispatch.call(queue, request)
        reply = self._script(keys=keys, args=args)
        rerun = recheck(self._dispatch.keys.of_queue(queue), (keys, args), reply)
        if rerun is not None:
            reply = self._script(keys=rerun[0], args=rerun[1])
        return refused(reply)

    def publish_many(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Outcome]:
        """Enqueue several requests in one pipeline (one more when the script was flushed).

        Args:
            items: ``(queue, request)`` pairs.
            no_breaker: functions whose catalog entry declares no breaker (their breaker
                state is not read).
            keys: the idempotency keys of the requests that carry one, by request id.

        Returns:
            Per item, its :data:`Outcome`.

        Raises:
            redis.RedisError: the pipeline failed as a whole (e.g. Redis unreachable).
        """
        outcomes: list[Outcome] = []
        for start in range(0, len(items), MAX_BATCH):
            chunk = items[start : start + MAX_BATCH]
            calls = [self._dispatch.call(q, r, no_breaker, keys) for q, r in chunk]
            replies = self._execute(calls)
            if missing := _unloaded(replies):
                self._script.sha = self._client.script_load(ENQUEUE_SCRIPT)
                again = self._execute([calls[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
            prefixes = [self._dispatch.keys.of_queue(q) for q, _ in chunk]
            if reruns := _rechecks(prefixes, calls, replies):
                rerun = self._execute(list(reruns.values()))
                for i, reply in zip(reruns, rerun, strict=True):
                    replies[i] = reply
            outcomes.extend(_outcome(r) for r in replies)
        return outcomes

    def _execute(self, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        pipe = pipeline(self._client)
        _evalsha(pipe, self._script.sha, calls)
        return list(pipe.execute(raise_on_error=False))


class AsyncPublisher:
    """Enqueue requests from asyncio, batching concurrent publishes (one event loop).

    Calls published while a pipeline is in flight wait and go together in the next one
    (group commit): thousands of concurrent ``submit`` s take a few round trips and one
    connection.

    Args:
        client: asyncio Redis client.
        namespace: key prefix (Dramatiq's namespace).
        quotas: quotas of accounts without their own (``None``: no limit).
        idempotency_ttl_s: seconds an idempotency key's record outlives its call's
            deadline (the ``reply_ttl_s`` setting).
        keys: the client's key prefixes (a call's keys in its queue's group on a cluster);
            ``None``: ``namespace`` on a plain Redis.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        namespace: str,
        quotas: QuotaDefaults | None = None,
        idempotency_ttl_s: float = 300.0,
        keys: KeySpace | None = None,
    ) -> None:
        self._client = client
        self._dispatch = _Dispatch(namespace, quotas, idempotency_ttl_s, keys)
        self._script = client.register_script(ENQUEUE_SCRIPT)
        #: (enqueue call, its key prefix, its future) per request waiting for a batch
        self._waiting: list[tuple[tuple[list[str], list[Any]], str, asyncio.Future[_Settled]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def publish(
        self, queue: str, request: ToolCallRequest, *, wait_s: float | None = None
    ) -> Refused | Duplicate | None:
        """Enqueue one request on ``queue`` (next batch); a :class:`Refused` when over a quota.

        Args:
            queue: the queue.
            request: the request.
            wait_s: longest wait for Redis to confirm, seconds (``None``: no limit).

        Raises:
            redis.RedisError: Redis could not be reached, refused it, or did not confirm
                within ``wait_s`` (``redis.TimeoutError``; it may still be enqueued).
        """
        (outcome,) = await self.publish_many([(queue, request)], wait_s=wait_s)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def publish_many(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        *,
        wait_s: float | None = None,
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Outcome]:
        """Enqueue several requests (in the next batch).

        Args:
            items: ``(queue, request)`` pairs.
            no_breaker: functions whose catalog entry declares no breaker (their breaker
                state is not read).
            keys: the idempotency keys of the requests that carry one, by request id.
            wait_s: longest wait for Redis to confirm, seconds (``None``: no limit); an
                item not confirmed by then gets a ``redis.TimeoutError`` (it may still be
                enqueued: its caller's deadline settles it).

        Returns:
            Per item, its :data:`Outcome`.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[_Settled]] = []
        for queue, request in items:
            future: asyncio.Future[_Settled] = loop.create_future()
            call = self._dispatch.call(queue, request, no_breaker, keys)
            self._waiting.append((call, self._dispatch.keys.of_queue(queue), future))
            futures.append(future)
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush())
        if futures:
            await asyncio.wait(futures, timeout=None if wait_s is None else max(0.0, wait_s))
        late = redis.TimeoutError(f"Redis did not confirm the publish within {wait_s} s")
        for future in futures:
            if not future.done():  # its outcome is of no interest any more
                future.add_done_callback(_consume)
        return [_future_outcome(f, late) for f in futures]

    async def _flush(self) -> None:
        batch: list[tuple[tuple[list[str], list[Any]], str, asyncio.Future[_Settled]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                calls = [call for call, _, _ in batch]
                try:
                    replies = await self._execute(calls)
                    if missing := _unloaded(replies):
                        self._script.sha = await self._client.script_load(ENQUEUE_SCRIPT)
                        again = await self._execute([calls[i] for i in missing])
                        for i, reply in zip(missing, again, strict=True):
                            replies[i] = reply
                    prefixes = [prefix for _, prefix, _ in batch]
                    if reruns := _rechecks(prefixes, calls, replies):
                        rerun = await self._execute(list(reruns.values()))
                        for i, reply in zip(reruns, rerun, strict=True):
                            replies[i] = reply
                except Exception as exc:  # noqa: BLE001 - handed to every waiting publisher
                    replies = [exc] * len(batch)
                for (_, _, future), reply in zip(batch, replies, strict=True):
                    _settle(future, _outcome(reply))
                batch = []
        finally:
            self._flushing = None
            # interrupted (the client closed): nobody may wait forever for a batch
            interrupted = redis.ConnectionError("publishing was interrupted: the client closed")
            for _, _, future in [*batch, *self._waiting]:
                _settle(future, interrupted)
            self._waiting = []

    async def _execute(self, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        pipe = pipeline(self._client)
        _evalsha(pipe, self._script.sha, calls)
        return list(await pipe.execute(raise_on_error=False))


def _consume(future: asyncio.Future[_Settled]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning


def _future_outcome(future: asyncio.Future[_Settled], late: BaseException) -> Outcome:
    if not future.done() or future.cancelled():
        return late
    return future.exception() or future.result()


def _settle(future: asyncio.Future[_Settled], outcome: Outcome) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
