"""``AsyncToolClient``: the asyncio client of the fleet, on ``redis.asyncio``.

A thin I/O shell over the sans-IO core (:mod:`toolfleet.producer._core`), the same
calls as :class:`~toolfleet.producer.client.ToolClient` as coroutines. Nothing runs on a
thread. Connections, whatever the number of calls in flight: one reply connection
(``BLPOP``), and at most :data:`COMMAND_CONNECTIONS` for commands (a blocking pool),
where concurrent publishes are batched into pipelines
(:class:`~toolfleet.producer.publish.AsyncPublisher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio
from typing_extensions import override

from toolfleet.producer._core import steps as core
from toolfleet.producer._core.base import ClientBase
from toolfleet.producer._core.calls import REDIS_FAILURES, Arguments, check_budget
from toolfleet.producer._core.fleet import (
    CANCEL_QUEUED_SCRIPT,
    count_live,
    merge_foreign_cancels,
    queue_find_queued,
    queue_foreign_cancel,
    read_routes,
)
from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer._redis import (
    FORKED_GIVEN_POOL,
    async_command_pool,
    async_reply_connection,
    keep_parents,
    track_forks,
)
from toolfleet.producer.async_listener import AsyncCallFuture, AsyncReplyListener
from toolfleet.producer.backpressure import AsyncInFlightLimit
from toolfleet.producer.catalog import AsyncCatalogReader
from toolfleet.producer.events import CallEvent
from toolfleet.producer.follower import AsyncFollower
from toolfleet.producer.publish import AsyncPublisher
from toolfleet.producer.stream import TurnState, TurnStream
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.errors import ClientError
from toolfleet.shared.naming import DEFAULT_GROUP, extension_errors_key
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.enqueue import QuotaDefaults
from toolfleet.shared.wire import CallContext, ToolCallRequest, ToolCallResult

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

T = TypeVar("T")

__all__ = ["COMMAND_CONNECTIONS", "AsyncCallFuture", "AsyncToolClient"]

#: Most command connections one client opens (publishing, catalog, cancels).
COMMAND_CONNECTIONS = 4


class AsyncToolClient(ClientBase):
    """An asyncio client of the tool fleet, safe to share across the tasks of one loop.

    Same arguments, results and errors as :class:`~toolfleet.producer.client.ToolClient`,
    with ``redis.asyncio`` clients and pools. It binds to the loop it is first used on
    (another loop: :class:`ClientError`). Canceling the future of a call (or the task
    awaiting ``call``) cancels the call in the fleet. After ``os.fork()`` the child's
    client has its own identity and connections on first use; one built on a caller's
    ``redis_client``/``connection_pool`` cannot follow (redis.asyncio pools are neither
    fork- nor loop-aware) and raises :class:`ClientError` in the child: build it there.
    """

    def __init__(self, redis_url: str | None = None, *, namespace: str | None = None,
                 settings: Settings | None = None,
                 redis_client: redis.asyncio.Redis | None = None,
                 connection_pool: redis.asyncio.ConnectionPool | None = None,
                 max_in_flight: int = 10_000, submit_timeout_s: float = 30.0,
                 registry: CollectorRegistry | None = None) -> None:  # fmt: skip
        super().__init__(redis_url, namespace, settings, redis_client, connection_pool,
                         max_in_flight, submit_timeout_s, asyncio=True,
                         registry=registry)  # fmt: skip
        self._forked_with_given_pool = False
        self._per_process_state()
        track_forks(self)

    def _per_process_state(self) -> None:
        """This process's core, pool, catalog cache, slots and listener (unbound)."""
        self._new_core(AsyncInFlightLimit(self.max_in_flight))
        timeout_s, ns, settings = self.settings.redis_timeout_s, self.namespace, self.settings
        name = f"toolfleet-producer-{self.client_id}"
        self._pool = async_command_pool(self._config, name, timeout_s, COMMAND_CONNECTIONS)
        # a cluster client is its own pool (one per node) and routes every command
        cluster = is_cluster(self._pool)
        pool = self._pool
        self._redis: Any = pool if cluster else redis.asyncio.Redis(connection_pool=pool)
        self._keys = KeySpace(ns, cluster, self.client_id)
        self._core.prefix_of = self._keys.of_queue
        self._catalog = AsyncCatalogReader(self._redis, ns, settings.catalog_cache_s,
                                           settings.worker_ttl_s, self._keys)  # fmt: skip
        self._catalog.watch = self._core.slots.queues
        self._publisher = AsyncPublisher(self._redis, ns, QuotaDefaults.from_settings(settings),
                                         settings.reply_ttl_s, self._keys)  # fmt: skip
        self._follower = AsyncFollower(self._redis, self._core.following, self._core.table)
        #: on a cluster: the one client the reply listeners of every group share
        self._reply_cluster: Any = None
        self._listener = AsyncReplyListener(self._listener_connection, self.reply_to,
                                            self._core.table, self._redis, ns,
                                            settings.reply_ttl_s, self._keys)  # fmt: skip
        self._listener.on_outage = self._catalog.forget
        #: on a cluster, a listener per queue group's reply list (the first one's timer
        #: expires every call)
        self._group_listeners: dict[str, AsyncReplyListener] = {}
        self._core.refusals.attach(self._publisher, self._keys.group(DEFAULT_GROUP))

    def _after_fork(self) -> None:
        """In a forked child: a fresh identity and state, bound to the child's first loop."""
        if self._config.pool is not None:
            self._forked_with_given_pool = True
            return
        keep_parents(self._pool, self._redis, self._listener)  # never closed from here
        self._per_process_state()

    def _listener_connection(self) -> redis.asyncio.Redis:
        if self._reply_cluster is not None:
            return self._reply_cluster  # type: ignore[no-any-return]
        name = f"toolfleet-reply-{self.client_id}"
        client = async_reply_connection(self._config, name, self.settings.redis_timeout_s)
        if is_cluster(client):
            self._reply_cluster = client
        return client

    def _listen_on_groups(self) -> None:
        """On a cluster: start a listener on each group's reply list calls were sent with."""
        loop = self._listener.bind()
        for key in self._keys.reply_lists():
            if key == self.reply_to or key in self._group_listeners:
                continue
            listener = AsyncReplyListener(self._listener_connection, key, self._core.table,
                                          self._redis, self.namespace, self.settings.reply_ttl_s,
                                          self._keys, deadlines=False)  # fmt: skip
            listener.loop = loop
            listener.start()
            self._group_listeners[key] = listener

    @override
    async def submit(self, function: str, arguments: Arguments = None, *,
               tool_call_id: str | None = None, context: CallContext | dict[str, Any] | None = None,
               timeout_s: float = 30.0, schema_hash: str | None = None,
               idempotency_key: str | None = None, max_result_bytes: int | None = None,
               ) -> AsyncCallFuture:  # fmt: skip
        """As ``ToolClient.submit``, awaiting a slot; canceling the future cancels the call.

        Canceling the awaiting task cancels the call too, however far ``submit`` got: a
        call registered (being published, or published) is canceled in the fleet.
        """
        self._check_open()
        return await self._submit(
            self._request(
                function,
                arguments,
                tool_call_id,
                context,
                timeout_s,
                max_result_bytes=max_result_bytes,
                schema_hash=schema_hash,
            ),
            idempotency_key,
        )

    @override
    async def call(self, function: str, arguments: Arguments = None,
                   **options: Any) -> ToolCallResult:  # fmt: skip
        return await (await self.submit(function, arguments, **options))

    async def _call_as(self, call_id: str, function: str, arguments: Arguments, *,
                       context: dict[str, Any], timeout_s: float,
                       schema_hash: str | None = None,
                       idempotency_key: str | None = None) -> ToolCallResult:  # fmt: skip
        """``call`` under a request id the caller derived, so that any process can cancel it.

        For the MCP gateway (:mod:`toolfleet.producer.mcp.sessions`): ``call_id`` is a
        canonical UUID string, unique across every call (exactly-once keys on it).

        Raises:
            ClientError: a ``call_id`` that is not a canonical UUID string; as ``call``.
        """
        self._check_open()
        request = self._request(function, arguments, None, context, timeout_s, call_id,
                                schema_hash=schema_hash)  # fmt: skip
        return await (await self._submit(request, idempotency_key))

    async def _submit(
        self, request: ToolCallRequest, idempotency_key: str | None = None
    ) -> AsyncCallFuture:
        future = AsyncCallFuture(request.id, loop=self._listener.bind())
        try:
            await self._drive(self._core.submit(request, future, idempotency_key))
        except asyncio.CancelledError:
            future.cancel()  # a registered call is canceled in the fleet (the table's hook)
            raise
        return future

    @override
    async def dispatch(self, tool_calls: Any, *,
                       context: CallContext | dict[str, Any] | None = None, timeout_s: float = 30.0,
                       on_event: Callable[[CallEvent], object] | None = None,
                       idempotency_key: str | None = None,
                       max_result_bytes: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Run every tool call of one model turn (see ``ToolClient.dispatch``).

        ``on_event`` may be a coroutine function (awaited before the next event).
        Canceling the awaiting task cancels the turn's calls still running.
        """
        if on_event is None:
            budget = check_budget(max_result_bytes)
            state = await self._start_turn(tool_calls, context, timeout_s, None,
                                           idempotency_key, budget)  # fmt: skip
            await asyncio.gather(*(f for f in state.futures if isinstance(f, asyncio.Future)))
            return state.messages()
        async with self.stream(tool_calls, context=context, timeout_s=timeout_s,
                               idempotency_key=idempotency_key,
                               max_result_bytes=max_result_bytes) as events:  # fmt: skip
            async for event in events:
                outcome = on_event(event)
                if inspect.isawaitable(outcome):
                    await outcome
        return events.messages

    @override
    def stream(self, tool_calls: Any, **options: Any) -> TurnStream:
        """``async with client.stream(message, timeout_s=20) as events: async for ...``.

        Same events, end and ``messages`` as ``ToolClient.stream``; requests are
        published when the iteration starts.
        """
        return TurnStream(self._starter(tool_calls, options), self._cancel)

    @override
    async def tools(self, *, account: str | None = None, format: str = "openai",  # noqa: A002
                    include_unavailable: bool = False, metadata: bool = False,
                    ) -> list[dict[str, Any]]:  # fmt: skip
        self._live()
        return await self._drive(self._core.tools(account, format, include_unavailable, metadata))

    @override
    async def preparing(self, function: str, partial_arguments: str | dict[str, Any] | None = None,
                        *, tool_call_id: str | None = None, index: int = 0,
                        ) -> CallEvent:  # fmt: skip
        self._live()
        steps = self._core.preparing(function, partial_arguments, tool_call_id, index)
        return await self._drive(steps)

    @override
    async def cancel(self, call_id: str) -> bool:
        self._live()
        return await self._cancel([call_id])

    @override
    async def extension_errors(self) -> dict[str, str]:
        self._live()
        return await self._drive(self._core.extension_errors())

    @override
    async def close(self, *, wait: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._forked_with_given_pool:  # the parent's pool: nothing of it is ours here
            return
        if self._listener.loop is not None:
            self._listener.bind()
            while wait and self._core.table.in_flight:
                await asyncio.sleep(0.01)
            await self._listener.stop()
            for listener in self._group_listeners.values():
                await listener.stop()
            await self._follower.stop()
            with contextlib.suppress(*REDIS_FAILURES):
                for key in {self.reply_to, *self._group_listeners}:
                    await self._redis.delete(key)  # one by one: on a cluster, other slots
        if self._reply_cluster is not None and self._reply_cluster is not self._config.pool:
            await self._reply_cluster.aclose()
        if is_cluster(self._redis):
            if self._config.pool is None:  # a caller's cluster client is the caller's
                await self._redis.aclose()
            return
        await self._redis.aclose()
        if self._config.pool is None:  # a caller's pool is the caller's to close
            await self._pool.disconnect()

    async def __aenter__(self) -> AsyncToolClient:
        self._listener.bind()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:  # fmt: skip
        await self.close()

    def _live(self) -> None:
        if self._forked_with_given_pool:
            raise ClientError(FORKED_GIVEN_POOL)
        self._listener.bind()

    async def _start_turn(self, tool_calls: Any, context: Any, timeout_s: float,
                          emit: Callable[[CallEvent], None] | None,
                          idempotency_key: str | None = None,
                          max_result_bytes: int | None = None) -> TurnState:  # fmt: skip
        self._check_open()
        loop = self._listener.bind()
        turn = self._core.turn(tool_calls, context, timeout_s, emit,
                               lambda call_id: AsyncCallFuture(call_id, loop=loop),
                               idempotency_key, max_result_bytes)  # fmt: skip
        return await self._drive(turn)

    async def _cancel(self, call_ids: list[str]) -> bool:
        return bool(await self._drive(self._core.cancel(call_ids)))

    async def _drive(self, steps: Generator[core.Step, Any, T]) -> T:
        """Run one of the core's operations, awaiting each step it asks for."""
        step = core.advance(steps, None, None)
        while not isinstance(step, core.Done):
            try:
                answer, error = await self._perform(step), None
            except Exception as exc:  # noqa: BLE001 - handed to the operation
                answer, error = None, exc
            step = core.advance(steps, answer, error)
        value: T = step.value
        return value

    async def _perform(self, step: core.Step) -> Any:
        if isinstance(step, core.TakeSlot):
            return await self._slots.acquire(step.wait_s)
        if isinstance(step, core.MarkResolved):
            return await self._listener.mark_within(step.call_ids)
        if isinstance(step, core.ReadExtensionErrors):
            return await self._redis.hgetall(extension_errors_key(self._keys.fleet))
        if isinstance(step, core.FindQueued):
            pipe = pipeline(self._redis)
            for queue in step.queues:
                queue_find_queued(pipe, self._keys.of_queue(queue), step.call_id, [queue])
            return await pipe.execute()
        if isinstance(step, core.AnswerQueued):
            script = self._redis.register_script(CANCEL_QUEUED_SCRIPT)
            return await script(keys=step.cancel.keys, args=step.cancel.args)
        if isinstance(step, core.ReadRoutes):
            return await read_routes(pipeline(self._redis), step.keys, step.ttl_s)
        if isinstance(step, core.CheckLive):
            pipe = pipeline(self._redis)
            return await count_live(pipe, self._keys.fleet, step.queues, self.settings.worker_ttl_s)
        if isinstance(step, core.ForeignCancel):
            replies: list[Any] = []  # per group known: (finished, marked, receivers)
            for prefix in self._keys.prefixes():
                pipe = pipeline(self._redis)
                queue_foreign_cancel(pipe, prefix, step.call_id, self.settings.reply_ttl_s)
                replies.append(await pipe.execute())
            return merge_foreign_cancels(replies)
        # never past the deadline: it settles the call
        wait_s = None if step.deadline is None else step.deadline - time.time()
        if isinstance(step, core.ReadCatalog):
            return await self._catalog.get(step.functions, wait_s=wait_s)
        prepared = self._publisher.prepare(step.items, step.no_breaker, step.keys)
        if self._keys.cluster:  # a reply listener on each group these calls go to
            self._listen_on_groups()
        if step.then is not None:  # sent by the publisher's task
            self._publisher.send(prepared, step.deadline, step.then)
            # a turn of the loop for the publisher: a caller submitting in a tight loop
            # must not hold back the reply of the batch in flight past its socket timeout
            await asyncio.sleep(0)
            return None
        return await self._publisher.send_wait(prepared, wait_s)
