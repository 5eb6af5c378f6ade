"""Publish requests as Dramatiq messages without touching Dramatiq's global encoder.

The message body is built here and encoded with orjson: Dramatiq's encoder is
process-global and the host application may use Dramatiq for its own tasks, so the
producer never reads or changes it. The request itself travels as the message's one
argument, a JSON string. Enqueuing runs Dramatiq's own Redis ``dispatch`` Lua script
(the ``enqueue`` command: ``HSET <queue>.msgs id body`` + ``RPUSH <queue> id``), the
one ``RedisBroker.enqueue`` runs, with queue maintenance left to the workers; several
messages go in one pipeline (one round trip).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

import orjson
import redis
import redis.asyncio

from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.wire import ToolCallRequest

__all__ = ["AsyncPublisher", "Publisher", "encode_message"]

#: Dramatiq's defaults for the dispatch script's heartbeat and dead-letter arguments, ms
#: (only read by maintenance, which a producer never asks for).
_HEARTBEAT_TIMEOUT_MS = 60_000
_DEAD_MESSAGE_TTL_MS = 86_400_000 * 7
#: Most messages sent in one pipeline.
MAX_BATCH = 1000


@cache
def _dispatch_script() -> bytes:
    """Dramatiq's ``dispatch.lua``, read from the installed package."""
    return (files("dramatiq.brokers") / "redis" / "dispatch.lua").read_bytes()


def encode_message(queue: str, request: ToolCallRequest) -> tuple[str, bytes]:
    """The Dramatiq message carrying ``request``: ``(redis_message_id, body)``."""
    redis_message_id = str(uuid.uuid4())
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
    """Arguments of Dramatiq's dispatch script for ``enqueue`` (one producer broker id)."""

    def __init__(self, namespace: str) -> None:
        self.keys = [namespace]
        self.broker_id = str(uuid.uuid4())

    def args(self, queue: str, request: ToolCallRequest) -> list[Any]:
        redis_message_id, body = encode_message(queue, request)
        # command, timestamp, queue, broker id, heartbeat timeout, dead message ttl,
        # do maintenance, max unpack size (maintenance only), then the command's own
        return [
            "enqueue",
            int(time.time() * 1000),
            queue,
            self.broker_id,
            _HEARTBEAT_TIMEOUT_MS,
            _DEAD_MESSAGE_TTL_MS,
            0,
            1,
            redis_message_id,
            body,
        ]


class Publisher:
    """Enqueue :class:`ToolCallRequest` s on their queues (thread-safe).

    Args:
        client: Redis client (shared with the rest of the producer).
        namespace: key prefix (Dramatiq's namespace).
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self._client = client
        self._dispatch = _Dispatch(namespace)
        self._script = client.register_script(_dispatch_script())

    def publish(self, queue: str, request: ToolCallRequest) -> None:
        """Enqueue one request on ``queue``.

        Raises:
            redis.RedisError: Redis could not be reached.
        """
        self._script(keys=self._dispatch.keys, args=self._dispatch.args(queue, request))

    def publish_many(
        self, items: Sequence[tuple[str, ToolCallRequest]]
    ) -> list[BaseException | None]:
        """Enqueue several requests in one pipeline.

        Args:
            items: ``(queue, request)`` pairs.

        Returns:
            Per item, ``None`` when enqueued or the error Redis answered for it.

        Raises:
            redis.RedisError: the pipeline failed as a whole (e.g. Redis unreachable).
        """
        outcomes: list[BaseException | None] = []
        for start in range(0, len(items), MAX_BATCH):
            pipe = self._client.pipeline(transaction=False)
            chunk = items[start : start + MAX_BATCH]
            for queue, request in chunk:
                self._script(
                    keys=self._dispatch.keys, args=self._dispatch.args(queue, request), client=pipe
                )
            replies = pipe.execute(raise_on_error=False)
            outcomes.extend(r if isinstance(r, BaseException) else None for r in replies)
        return outcomes


class AsyncPublisher:
    """Enqueue requests from asyncio, batching concurrent publishes (one event loop).

    Calls published while a pipeline is in flight wait and go together in the next one
    (group commit): thousands of concurrent ``submit`` s take a few round trips and one
    connection.

    Args:
        client: asyncio Redis client.
        namespace: key prefix (Dramatiq's namespace).
    """

    def __init__(self, client: redis.asyncio.Redis, namespace: str) -> None:
        self._client = client
        self._dispatch = _Dispatch(namespace)
        self._script = client.register_script(_dispatch_script())
        self._waiting: list[tuple[list[Any], asyncio.Future[None]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def publish(
        self, queue: str, request: ToolCallRequest, *, wait_s: float | None = None
    ) -> None:
        """Enqueue one request on ``queue`` (in the next batch).

        Args:
            queue: the queue.
            request: the request.
            wait_s: longest wait for Redis to confirm, seconds (``None``: no limit).

        Raises:
            redis.RedisError: Redis could not be reached, refused it, or did not confirm
                within ``wait_s`` (``redis.TimeoutError``; it may still be enqueued).
        """
        (outcome,) = await self.publish_many([(queue, request)], wait_s=wait_s)
        if outcome is not None:
            raise outcome

    async def publish_many(
        self, items: Sequence[tuple[str, ToolCallRequest]], *, wait_s: float | None = None
    ) -> list[BaseException | None]:
        """Enqueue several requests (in the next batch).

        Args:
            items: ``(queue, request)`` pairs.
            wait_s: longest wait for Redis to confirm, seconds (``None``: no limit); an
                item not confirmed by then gets a ``redis.TimeoutError`` (it may still be
                enqueued: its caller's deadline settles it).

        Returns:
            Per item, ``None`` when enqueued, else the error.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for queue, request in items:
            future: asyncio.Future[None] = loop.create_future()
            self._waiting.append((self._dispatch.args(queue, request), future))
            futures.append(future)
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush())
        if futures:
            await asyncio.wait(futures, timeout=None if wait_s is None else max(0.0, wait_s))
        late = redis.TimeoutError(f"Redis did not confirm the publish within {wait_s} s")
        for future in futures:
            if not future.done():  # its outcome is of no interest any more
                future.add_done_callback(_consume)
        return [
            late if not f.done() else (f.exception() if not f.cancelled() else late)
            for f in futures
        ]

    async def _flush(self) -> None:
        batch: list[tuple[list[Any], asyncio.Future[None]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                pipe = self._client.pipeline(transaction=False)
                for args, _ in batch:
                    await self._script(keys=self._dispatch.keys, args=args, client=pipe)
                try:
                    replies: list[Any] = await pipe.execute(raise_on_error=False)
                except Exception as exc:  # noqa: BLE001 - handed to every waiting publisher
                    replies = [exc] * len(batch)
                for (_, future), reply in zip(batch, replies, strict=True):
                    _settle(future, reply if isinstance(reply, BaseException) else None)
                batch = []
        finally:
            self._flushing = None
            # interrupted (the client closed): nobody may wait forever for a batch
            interrupted = redis.ConnectionError("publishing was interrupted: the client closed")
            for _, future in [*batch, *self._waiting]:
                _settle(future, interrupted)
            self._waiting = []


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
