"""``AsyncToolClient``: the asyncio client of the fleet, on ``redis.asyncio``.

Same calls as :class:`~toolfleet.producer.client.ToolClient`, as coroutines, plus
:meth:`AsyncToolClient.stream`. Nothing runs on a thread: publishing, catalog reads and
the reply listener are ``redis.asyncio`` on the event loop. Connections, whatever the
number of calls in flight: one reply connection (``BLPOP``), and at most
:data:`COMMAND_CONNECTIONS` for commands (a blocking pool), where concurrent publishes
are batched into pipelines (see :class:`~toolfleet.producer.publish.AsyncPublisher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import redis
import redis.asyncio

from toolfleet.producer._calls import (
    Arguments,
    Refusal,
    admit,
    build_request,
    check_timeout,
    local_result,
    make_context,
    never_sent,
    prepare_turn_call,
    queue_foreign_cancel,
)
from toolfleet.producer._redis import (
    connection_failed,
    redis_source,
    tcp_options,
    track_forks,
)
from toolfleet.producer.affinity import Routes, learn_route
from toolfleet.producer.async_listener import AsyncCallFuture, AsyncReplyListener
from toolfleet.producer.backpressure import AsyncInFlightLimit, QueueLengths, backpressure_error
from toolfleet.producer.catalog import AsyncCatalogReader, Catalog
from toolfleet.producer.events import CallEvent, preparing_event
from toolfleet.producer.hooks import fire_requested
from toolfleet.producer.listener import EventSink, present
from toolfleet.producer.publish import AsyncPublisher
from toolfleet.producer.stream import TurnState, TurnStream
from toolfleet.producer.turns import parse_tool_calls
from toolfleet.shared.cancels import RESOLVED
from toolfleet.shared.errors import ClientClosedError, ClientError
from toolfleet.shared.export import export_tools
from toolfleet.shared.extension_errors import current_errors
from toolfleet.shared.naming import cancel_channel, cancel_key, extension_errors_key, reply_key
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.enqueue import QuotaDefaults, Refused
from toolfleet.shared.wire import CallContext, Status, ToolCallRequest, ToolCallResult

__all__ = ["COMMAND_CONNECTIONS", "AsyncCallFuture", "AsyncToolClient"]

log = logging.getLogger("toolfleet.producer")

#: Most command connections one client opens (publishing, catalog, cancels).
COMMAND_CONNECTIONS = 4

#: In a forked child: the parent's pools and listeners of every client (see _after_fork).
_parents_connections: list[object] = []


class AsyncToolClient:
    """An asyncio client of the tool fleet, safe to share across the tasks of one loop.

    It binds to the event loop it is first used on (``async with``, or the first
    call); using it from another loop raises :class:`ClientError`. Calls never raise
    for a wire status; they raise only for misuse (:class:`ClientError`), after
    :meth:`close` (:class:`ClientClosedError`), or when ``max_in_flight`` calls stay in
    flight for ``submit_timeout_s`` (:class:`~toolfleet.shared.errors.BackpressureError`,
    from ``submit``/``call``). Canceling the future of a call (or the task awaiting
    ``call``) cancels the call in the fleet.

    Args:
        redis_url: Redis URL (``redis://``, ``rediss://``, ``unix://``); ``None`` reads
            ``TOOLFLEET_REDIS_URL``.
        namespace: key prefix; ``None`` reads ``TOOLFLEET_NAMESPACE`` (default ``toolfleet``).
        settings: a :class:`Settings` object instead of the environment.
        redis_client: a ready-made ``redis.asyncio.Redis`` instead of a URL (Sentinel's
            ``master_for``, a credential provider, a custom TLS context...). Its pool
            serves commands and the reply listener (one of its connections in a blocking
            read of up to 1 s: a ``socket_timeout`` must be ``None`` or well above that);
            it must not decode responses. The client does not close it.
        connection_pool: a ``redis.asyncio.ConnectionPool`` instead (same rules).
        max_in_flight: most calls this client has published and not yet resolved.
        submit_timeout_s: seconds ``submit`` waits for a slot before it raises
            ``BackpressureError`` (never past the call's own deadline).

    After ``os.fork()`` the child's client has its own id, reply list, connections and
    listener, made on first use in the child's event loop. A client built on a caller's
    ``redis_client``/``connection_pool`` cannot follow (redis.asyncio pools are neither
    fork- nor loop-aware): in a child it raises :class:`ClientError` at once; build it
    after the fork (e.g. in gunicorn's ``post_fork`` hook) instead.

    Raises:
        ConfigurationError: no Redis URL was given or configured, or it is not a Redis
            URL (``redis+sentinel://`` included: pass ``redis_client=``).
        ClientError: ``max_in_flight`` below 1, a bad ``submit_timeout_s``, both
            ``redis_client`` and ``connection_pool``, or an unfit one.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        namespace: str | None = None,
        settings: Settings | None = None,
        redis_client: redis.asyncio.Redis | None = None,
        connection_pool: redis.asyncio.ConnectionPool | None = None,
        max_in_flight: int = 10_000,
        submit_timeout_s: float = 30.0,
    ) -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url, namespace=namespace)
        source = redis_source(redis_url, self.settings, redis_client, connection_pool, asyncio=True)
        self._given_pool = source.pool
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ClientError("max_in_flight must be an integer >= 1")
        self.submit_timeout_s = check_timeout(submit_timeout_s)
        self.max_in_flight = max_in_flight
        #: the Redis URL, or ``None`` for a client built on a caller's client or pool
        self.redis_url = source.url
        #: the Redis, printable (password masked)
        self.where = source.where
        self.namespace = namespace or self.settings.namespace
        self._closed = False
        self._forked_with_given_pool = False
        self._per_process_state()
        track_forks(self)

    def _per_process_state(self) -> None:
        """This process's identity, pool, catalog cache, slots and listener (unbound)."""
        self.client_id = uuid.uuid4().hex
        self.reply_to = reply_key(self.namespace, self.client_id)
        if self._given_pool is not None:
            self._pool = self._given_pool
        else:
            assert self.redis_url is not None
            timeout_s = self.settings.redis_timeout_s
            self._pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.redis_url,
                max_connections=COMMAND_CONNECTIONS,
                timeout=timeout_s,
                client_name=f"toolfleet-producer-{self.client_id}",
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
        self._redis = redis.asyncio.Redis(connection_pool=self._pool)
        self._catalog = AsyncCatalogReader(
            self._redis, self.namespace, self.settings.catalog_cache_s, self.settings.worker_ttl_s
        )
        self._publisher = AsyncPublisher(
            self._redis, self.namespace, QuotaDefaults.from_settings(self.settings)
        )
        self._slots = AsyncInFlightLimit(self.max_in_flight)
        self._lengths = QueueLengths(self.settings.max_queue_length)
        self._routes = Routes()
        self._catalog.watch = self._routes.queues
        self._listener = AsyncReplyListener(
            self._listener_connection,
            self.reply_to,
            on_timeout=self._cancel_soon,
            on_cancel=self._cancel_soon,
            on_settled=self._slots.release,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()

    def _after_fork(self) -> None:
        """In a forked child: a fresh identity and state, bound to the child's first loop."""
        if self._given_pool is not None:
            self._forked_with_given_pool = True
            return
        # the parent's connections stay referenced, never collected here: closing them
        # from the child's loop (redis.asyncio does on garbage collection) could write
        # on sockets the parent still uses
        _parents_connections.append((self._pool, self._redis, self._listener))
        self._per_process_state()

    def _listener_connection(self) -> redis.asyncio.Redis:
        if self._given_pool is not None:
            return redis.asyncio.Redis(connection_pool=self._given_pool)
        assert self.redis_url is not None
        # No socket timeout (like the sync listener), keepalive instead: a read timeout that
        # fires while the loop was busy would drop replies BLPOP had already popped, and
        # redis-py wraps timed writes in wait_for, which on Python 3.11 can swallow a
        # cancellation. Deadlines never depend on this connection (they are loop timers).
        # (redis-py's unix-socket connection takes no keepalive option.)
        return redis.asyncio.Redis.from_url(
            self.redis_url,
            client_name=f"toolfleet-reply-{self.client_id}",
            single_connection_client=True,
            socket_connect_timeout=self.settings.redis_timeout_s,
            socket_timeout=None,
            **tcp_options(self.redis_url),
        )

    # -- calls ---------------------------------------------------------------

    async def submit(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> AsyncCallFuture:
        """Publish one tool call; return a future that resolves by ``timeout_s`` at the latest.

        Same arguments, results and errors as ``ToolClient.submit``; waits (without
        blocking the loop) for an in-flight slot.

        Returns:
            An :class:`AsyncCallFuture` (an ``asyncio.Future[ToolCallResult]`` with
            ``call_id``); canceling it cancels the call.
        """
        self._check_open()
        loop = self._bind()
        timeout_s = check_timeout(timeout_s)
        request = build_request(
            function,
            arguments,
            tool_call_id=tool_call_id,
            context=make_context(context),
            timeout_s=timeout_s,
            reply_to=self.reply_to,
        )
        future = AsyncCallFuture(request.id, loop=loop)
        try:
            catalog = await self._catalog.get(function, wait_s=request.deadline - time.time())
        except redis.RedisError as exc:
            message = f"Redis unreachable: {exc}"
            return _done(future, local_result(request, Status.NOT_AVAILABLE, message))
        admitted = admit(request, catalog, self.settings, self._lengths, self._routes)
        if isinstance(admitted, Refusal):
            return _done(future, local_result(request, admitted.status, admitted.message))
        if not await self._slots.acquire():
            wait_s = min(self.submit_timeout_s, request.deadline - time.time())
            if not await self._slots.acquire(wait_s):
                raise backpressure_error(self.max_in_flight, max(0.0, wait_s))
        self._register(request, future, None)
        try:
            # never past the deadline: an unconfirmed publish is settled by the deadline
            over = await self._publisher.publish(
                admitted, request, wait_s=request.deadline - time.time()
            )
            if over is not None:  # over a quota: nothing was published
                self._over_quota(request, over)
        except redis.RedisError as exc:
            self._publish_failed(request, exc)
        return future

    async def call(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolCallResult:
        """Make one call and await its result (at most ``timeout_s`` seconds).

        Same arguments and errors as :meth:`submit`. Canceling the awaiting task cancels
        the call in the fleet.
        """
        future = await self.submit(
            function, arguments, tool_call_id=tool_call_id, context=context, timeout_s=timeout_s
        )
        return await future

    async def dispatch(
        self,
        tool_calls: Any,
        *,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
        on_event: Callable[[CallEvent], object] | None = None,
    ) -> list[dict[str, Any]]:
        """Run every tool call of one model turn; return the answers to append.

        Same arguments, result and errors as ``ToolClient.dispatch``; ``on_event`` may
        be a plain function or a coroutine function (awaited before the next event).
        Canceling the awaiting task cancels the turn's calls still running.
        """
        if on_event is None:
            state = await self._start_turn(tool_calls, context, timeout_s, None)
            await asyncio.gather(*(f for f in state.futures if isinstance(f, asyncio.Future)))
            return state.messages()
        async with self.stream(tool_calls, context=context, timeout_s=timeout_s) as events:
            async for event in events:
                outcome = on_event(event)
                if inspect.isawaitable(outcome):
                    await outcome
        return events.messages

    def stream(
        self,
        tool_calls: Any,
        *,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> TurnStream:
        """Run every tool call of one turn and yield their :class:`CallEvent` s as they happen.

        ``async for event in client.stream(message, timeout_s=20): ...`` yields, per
        call, ``queued`` → ``running`` → ``progress``… → ``result`` (calls the producer
        answers itself yield only ``result``); events of different calls interleave.
        The iteration ends after the last ``result``, by the turn's deadline at the
        latest; then ``stream.messages`` holds what :meth:`dispatch` returns. Requests
        are published (with status events on) when the iteration starts. Use it as
        ``async with client.stream(...) as events:`` to cancel the calls still running
        when the block is left early.

        Args:
            tool_calls: as for :meth:`dispatch`.
            context: the turn's :class:`CallContext` (or a dict of its fields).
            timeout_s: the turn's budget, seconds.

        Raises:
            ClientError: (on the first iteration) as for :meth:`dispatch`.
        """

        def start(emit: Callable[[CallEvent], None]) -> Awaitable[TurnState]:
            return self._start_turn(tool_calls, context, timeout_s, emit)

        return TurnStream(start, self._cancel_calls)

    async def tools(
        self,
        *,
        account: str | None = None,
        format: str = "openai",  # noqa: A002
        include_unavailable: bool = False,
    ) -> list[dict[str, Any]]:
        """The fleet's tools as a model API tool list (see ``ToolClient.tools``).

        Raises:
            ValueError: unknown format.
            ConnectionFailed: Redis unreachable or failing.
        """
        self._check_fork()
        self._bind()
        try:
            catalog = await self._catalog.get()
        except (redis.RedisError, OSError) as exc:
            raise connection_failed(exc, self.where, "reading the tool catalog") from exc
        entries = [
            e
            for name, e in sorted(catalog.entries.items())
            if include_unavailable or not catalog.refusal(name, account)
        ]
        tools = export_tools(entries, format)
        present([str(e.get("name")) for e in entries], account, format)
        return tools

    async def preparing(
        self,
        function: str,
        partial_arguments: str | dict[str, Any] | None = None,
        *,
        tool_call_id: str | None = None,
        index: int = 0,
    ) -> CallEvent:
        """The ``preparing`` event of a call still being written (see ``ToolClient.preparing``).

        Raises:
            ConnectionFailed: Redis unreachable or failing.
        """
        self._check_fork()
        self._bind()
        try:
            catalog = await self._catalog.get(function)
        except (redis.RedisError, OSError) as exc:
            raise connection_failed(exc, self.where, "reading the tool catalog") from exc
        return preparing_event(
            catalog.entries.get(function), function, partial_arguments,
            tool_call_id=tool_call_id, index=index,
        )  # fmt: skip

    async def cancel(self, call_id: str) -> bool:
        """Cancel a call by its id, made by this client or by any other (see ``ToolClient.cancel``).

        Returns:
            False when the call had already resolved.
        """
        self._check_fork()
        self._bind()
        resolved = self._resolve_canceled(call_id)
        if resolved:
            await self._cancel_in_fleet([call_id])
            return True
        pipe = self._redis.pipeline(transaction=False)
        queue_foreign_cancel(pipe, self.namespace, call_id, self.settings.reply_ttl_s)
        try:
            finished, marked, _ = await pipe.execute()
            return bool(marked) and not finished
        except (redis.RedisError, OSError) as exc:
            log.warning("could not cancel call %s: %s", call_id, exc)
            return False

    async def extension_errors(self) -> dict[str, str]:
        """Extensions the live workers could not load, and why (see ``ToolClient``).

        Raises:
            ConnectionFailed: Redis cannot be reached.
        """
        self._bind()
        try:
            fields = await self._redis.hgetall(extension_errors_key(self.namespace))
        except (redis.RedisError, OSError) as exc:
            raise connection_failed(exc, self.where, "reading extension errors") from exc
        return current_errors(fields, self.settings.worker_ttl_s)

    @property
    def in_flight(self) -> int:
        """Calls published and not yet resolved."""
        return self._listener.in_flight

    @property
    def late_replies(self) -> int:
        """Replies that came after their call was resolved (dropped)."""
        return self._listener.late_replies

    # -- lifecycle -----------------------------------------------------------

    async def close(self, *, wait: bool = True) -> None:
        """Stop the client; idempotent. No call is left unresolved.

        With ``wait``, calls in flight resolve first (each by its deadline at the
        latest); without, they resolve ``timeout`` now ("the client was closed").
        """
        if self._closed:
            return
        self._closed = True
        if self._forked_with_given_pool:  # the parent's pool: nothing of it is ours here
            return
        if self._loop is not None:
            self._bind()
            while wait and self._listener.in_flight:
                await asyncio.sleep(0.01)
            await self._listener.stop()
            if self._background:
                await asyncio.wait(self._background, timeout=self.settings.redis_timeout_s)
            with contextlib.suppress(redis.RedisError, OSError):
                await self._redis.delete(self.reply_to)
        await self._redis.aclose()
        if self._given_pool is None:  # a caller's pool is the caller's to close
            await self._pool.disconnect()

    async def __aenter__(self) -> AsyncToolClient:
        self._bind()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- helpers ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._check_fork()

    def _check_fork(self) -> None:
        if self._forked_with_given_pool:
            raise ClientError(
                "this AsyncToolClient was built on your redis.asyncio client/pool before "
                "fork(): redis.asyncio pools cannot be shared with a child process; build "
                "the client (and its pool) in the child, e.g. in gunicorn's post_fork hook"
            )

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The client's loop (the running one); starts the listener on first use."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._listener.start()
        elif self._loop is not loop:
            raise ClientError("an AsyncToolClient is bound to the event loop it was first used on")
        return loop

    def _register(
        self, request: ToolCallRequest, future: AsyncCallFuture, on_event: EventSink | None
    ) -> None:
        """Expect ``request``'s reply; the slot it holds is given back when it resolves."""
        fire_requested(request)
        if request.context.conversation:
            future.add_done_callback(lambda done: learn_route(self._routes, request, done))
        try:
            self._listener.expect(request, future, on_event)
        except RuntimeError:
            self._slots.release()
            _done(future, local_result(request, Status.REJECTED, "the client is closed"))
            raise ClientClosedError("the client is closed") from None

    def _over_quota(self, request: ToolCallRequest, refused: Refused) -> None:
        """Resolve a call the enqueue script refused (over a quota: nothing published)."""
        content = refused.result(request).content
        self._listener.resolve(request.id, Status.REJECTED, "", content=content)

    def _publish_failed(self, request: ToolCallRequest, exc: BaseException) -> None:
        """Resolve a call whose publish failed, unless it may have reached Redis."""
        if never_sent(exc):
            status, message = Status.NOT_AVAILABLE, f"Redis unreachable: {exc}"
        elif isinstance(exc, redis.ResponseError):
            status, message = Status.REJECTED, f"Redis refused the call: {exc}"
        else:
            # the request may have reached Redis: its reply may still come; the deadline
            # resolves it otherwise (never report "not sent" for a call that may run)
            log.warning("publishing call %s may have failed: %s", request.id, exc)
            return
        self._listener.resolve(request.id, status, message)

    async def _start_turn(
        self,
        tool_calls: Any,
        context: CallContext | dict[str, Any] | None,
        timeout_s: float,
        emit: Callable[[CallEvent], None] | None,
    ) -> TurnState:
        """Parse and publish a turn; return its state."""
        self._check_open()
        loop = self._bind()
        turn = parse_tool_calls(tool_calls)
        ctx = make_context(context)
        timeout_s = check_timeout(timeout_s)
        deadline = time.time() + timeout_s
        state = TurnState(turn, emit)
        catalog: Catalog | None = None
        unreachable = ""
        if turn.calls:
            try:
                functions = [c.function for c in turn.calls if c.function]
                catalog = await self._catalog.get(functions, wait_s=deadline - time.time())
            except redis.RedisError as exc:
                unreachable = str(exc)
        batch: list[tuple[int, str, ToolCallRequest]] = []
        for call in turn.calls:
            prepared = prepare_turn_call(
                call,
                context=ctx,
                timeout_s=timeout_s,
                deadline=deadline,
                events=state.streaming,
                reply_to=self.reply_to,
                catalog=catalog,
                unreachable=unreachable,
                settings=self.settings,
                lengths=self._lengths,
                routes=self._routes,
            )
            if isinstance(prepared, ToolCallResult):
                state.answer(call.index, prepared)
                continue
            queue_name, request = prepared
            if not await self._slots.acquire():
                await self._publish_batch(state, batch, loop, deadline)  # gathered calls go now
                batch = []
                wait_s = min(self.submit_timeout_s, deadline - time.time())
                if not await self._slots.acquire(wait_s):
                    error = backpressure_error(self.max_in_flight, max(0.0, wait_s))
                    state.answer(call.index, local_result(request, Status.REJECTED, str(error)))
                    continue
            batch.append((call.index, queue_name, request))
        await self._publish_batch(state, batch, loop, deadline)
        return state

    async def _publish_batch(
        self,
        state: TurnState,
        batch: Sequence[tuple[int, str, ToolCallRequest]],
        loop: asyncio.AbstractEventLoop,
        deadline: float,
    ) -> None:
        """Publish a turn's calls in one pipeline (each holds a slot already)."""
        sent: list[tuple[int, str, ToolCallRequest, AsyncCallFuture]] = []
        for index, queue_name, request in batch:
            future = AsyncCallFuture(request.id, loop=loop)
            try:
                self._register(request, future, state.sink(index))
            except ClientClosedError:  # closed mid-turn: answered ``rejected``, not sent
                state.answer(index, future.result())
                continue
            sent.append((index, queue_name, request, future))
        if not sent:
            return
        outcomes = await self._publisher.publish_many(
            [(q, r) for _, q, r, _ in sent], wait_s=deadline - time.time()
        )
        for (index, _, request, future), outcome in zip(sent, outcomes, strict=True):
            if isinstance(outcome, Refused):  # over a quota: nothing was published
                self._over_quota(request, outcome)
            elif outcome is not None:
                self._publish_failed(request, outcome)
            if future.done() and outcome is not None:
                state.answer(index, future.result())  # never published: no ``queued``
            else:
                state.published(index, request, future)

    def _resolve_canceled(self, call_id: str) -> bool:
        return self._listener.resolve(call_id, Status.CANCELED, "the call was canceled")

    async def _cancel_calls(self, call_ids: list[str]) -> None:
        canceled = [call_id for call_id in call_ids if self._resolve_canceled(call_id)]
        if canceled:
            await self._cancel_in_fleet(canceled)

    def _cancel_soon(self, call_ids: list[str]) -> None:
        """Cancel calls in the fleet from a callback (a background task)."""
        if self._loop is None or self._loop.is_closed():
            return
        task = self._loop.create_task(self._cancel_in_fleet(call_ids))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_in_fleet(self, call_ids: list[str]) -> None:
        ttl = self.settings.reply_ttl_s
        pipe = self._redis.pipeline(transaction=False)
        for call_id in call_ids:
            pipe.set(cancel_key(self.namespace, call_id), RESOLVED, ex=ttl)
            pipe.publish(cancel_channel(self.namespace), call_id)
        try:
            await pipe.execute()
        except (redis.RedisError, OSError) as exc:  # best effort: the callers have results
            log.warning("could not cancel %d call(s) in the fleet: %s", len(call_ids), exc)


def _done(future: AsyncCallFuture, result: ToolCallResult) -> AsyncCallFuture:
    if not future.done():
        future.set_result(result)
    return future
