"""``ToolClient``: publish tool calls to the fleet and wait for their results."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import redis

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
    track_forks,
)
from toolfleet.producer.affinity import Routes, learn_route
from toolfleet.producer.backpressure import InFlightLimit, QueueLengths, backpressure_error
from toolfleet.producer.catalog import Catalog, CatalogReader
from toolfleet.producer.events import CallEvent, preparing_event
from toolfleet.producer.hooks import fire_requested
from toolfleet.producer.listener import EventSink, ReplyListener, present
from toolfleet.producer.publish import Publisher
from toolfleet.producer.stream import TurnState
from toolfleet.producer.turns import parse_tool_calls
from toolfleet.shared.cancels import RESOLVED
from toolfleet.shared.errors import ClientClosedError, ClientError
from toolfleet.shared.export import export_tools
from toolfleet.shared.extension_errors import current_errors
from toolfleet.shared.naming import cancel_channel, cancel_key, extension_errors_key, reply_key
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.enqueue import QuotaDefaults, Refused
from toolfleet.shared.wire import CallContext, Status, ToolCallRequest, ToolCallResult

__all__ = ["CallFuture", "ToolClient"]

log = logging.getLogger("toolfleet.producer")

#: Seconds the event pump of ``dispatch(on_event=...)`` waits past the deadline before
#: it gives up on events (the calls themselves resolve by the deadline).
_PUMP_GRACE_S = 1.0


class CallFuture(Future[ToolCallResult]):
    """The future of one call; ``call_id`` is the request id (for :meth:`ToolClient.cancel`)."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id


class ToolClient:
    """A thread-safe client of the tool fleet.

    One reply connection and one listener thread serve every call in flight, however
    many. ``call``/``submit``/``dispatch`` never raise for a wire status: a result with
    ``status != "ok"`` is returned (use ``result.raise_for_status()``). They raise only
    for misuse (:class:`ClientError`), after :meth:`close` (:class:`ClientClosedError`),
    or when ``max_in_flight`` calls are in flight for longer than ``submit_timeout_s``
    (:class:`~toolfleet.shared.errors.BackpressureError`, from ``submit``/``call``).

    Args:
        redis_url: Redis URL (``redis://``, ``rediss://``, ``unix://``); ``None`` reads
            ``TOOLFLEET_REDIS_URL``.
        namespace: key prefix; ``None`` reads ``TOOLFLEET_NAMESPACE`` (default ``toolfleet``).
        settings: a :class:`Settings` object instead of the environment.
        redis_client: a ready-made ``redis.Redis`` instead of a URL (Sentinel's
            ``master_for``, a credential provider, a custom TLS context...). Its
            connection pool serves the commands and the reply listener (which holds one
            of its connections in a blocking read of up to 1 s, so a ``socket_timeout``
            must be ``None`` or above that); it must not decode responses. The client
            does not close it.
        connection_pool: a ``redis.ConnectionPool`` instead (same rules).
        max_in_flight: most calls this client has published and not yet resolved.
        submit_timeout_s: seconds ``submit`` blocks for a free slot before it raises
            :class:`~toolfleet.shared.errors.BackpressureError` (never past the call's
            own deadline).

    After ``os.fork()`` (gunicorn ``--preload``, Celery prefork, ``multiprocessing``),
    the child's client has its own id, reply list, connections and threads, made on
    its first use; calls the parent had in flight resolve ``timeout`` in the child (their
    replies go to the parent). redis-py's sync pools reset themselves in a child, so
    this holds for ``redis_client``/``connection_pool`` too.

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
        redis_client: redis.Redis | None = None,
        connection_pool: redis.ConnectionPool | None = None,
        max_in_flight: int = 10_000,
        submit_timeout_s: float = 30.0,
    ) -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url, namespace=namespace)
        source = redis_source(
            redis_url, self.settings, redis_client, connection_pool, asyncio=False
        )
        self._pool = source.pool
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
        self._close_lock = threading.Lock()
        self._per_process_state()
        self._listener.start()
        self._started = True
        track_forks(self)

    def _per_process_state(self) -> None:
        """This process's identity, connections, catalog cache, slots and listener."""
        self.client_id = uuid.uuid4().hex
        self.reply_to = reply_key(self.namespace, self.client_id)
        if self._pool is not None:
            self._redis = redis.Redis(connection_pool=self._pool)
        else:
            assert self.redis_url is not None
            self._redis = redis.Redis.from_url(
                self.redis_url,
                client_name=f"toolfleet-producer-{self.client_id}",
                socket_timeout=self.settings.redis_timeout_s,
                socket_connect_timeout=self.settings.redis_timeout_s,
            )
        self._catalog = CatalogReader(
            self._redis, self.namespace, self.settings.catalog_cache_s, self.settings.worker_ttl_s
        )
        self._publisher = Publisher(
            self._redis, self.namespace, QuotaDefaults.from_settings(self.settings)
        )
        self._slots = InFlightLimit(self.max_in_flight)
        self._lengths = QueueLengths(self.settings.max_queue_length)
        self._routes = Routes()
        self._catalog.watch = self._routes.queues
        self._listener = ReplyListener(
            self._listener_connection, self.reply_to, on_timeout=self._cancel_in_fleet
        )
        self._start_lock = threading.Lock()
        self._started = False

    def _after_fork(self) -> None:
        """In a forked child: a fresh identity and state; threads start on first use."""
        orphaned = self._listener
        self._close_lock = threading.Lock()
        self._per_process_state()
        orphaned.orphan("no reply in this process: the call was made before fork()")

    def _live(self) -> None:
        """Start the listener threads if this process has not yet (a forked child)."""
        if self._started:
            return
        with self._start_lock:
            if not self._started:
                self._listener.start()
                self._started = True

    def _listener_connection(self) -> redis.Redis:
        if self._pool is not None:
            return redis.Redis(connection_pool=self._pool)
        assert self.redis_url is not None
        return redis.Redis.from_url(
            self.redis_url,
            client_name=f"toolfleet-reply-{self.client_id}",
            single_connection_client=True,
        )

    # -- calls ---------------------------------------------------------------

    def submit(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> CallFuture:
        """Publish one tool call; return a future that resolves by ``timeout_s`` at the latest.

        Args:
            function: the function name, e.g. ``ext_bfcl_math_factorial``.
            arguments: a JSON object, or the raw JSON string the model produced.
            tool_call_id: the model's id for the call, carried through untouched.
            context: a :class:`CallContext` or a dict of its fields.
            timeout_s: seconds until the deadline; no reply by then → ``timeout``.

        Returns:
            A :class:`CallFuture` (a ``Future[ToolCallResult]`` with ``call_id``, the id
            :meth:`cancel` takes). The producer answers at once, publishing nothing, a
            function absent from the catalog (``unknown_function``), one without a live
            worker (``not_available``), arguments over ``max_arguments_bytes`` or a
            queue at ``max_queue_length`` (``rejected``).

        Raises:
            ClientClosedError: the client is closed.
            BackpressureError: ``max_in_flight`` calls stayed in flight for
                ``submit_timeout_s`` seconds (or until this call's deadline).
            ClientError: bad arguments to this method.
        """
        self._check_open()
        timeout_s = check_timeout(timeout_s)
        request = build_request(
            function,
            arguments,
            tool_call_id=tool_call_id,
            context=make_context(context),
            timeout_s=timeout_s,
            reply_to=self.reply_to,
        )
        future = CallFuture(request.id)
        try:
            catalog = self._catalog.get(function)
        except redis.RedisError as exc:
            return _done(
                future, local_result(request, Status.NOT_AVAILABLE, f"Redis unreachable: {exc}")
            )
        admitted = admit(request, catalog, self.settings, self._lengths, self._routes)
        if isinstance(admitted, Refusal):
            return _done(future, local_result(request, admitted.status, admitted.message))
        if not self._slots.acquire():
            wait_s = min(self.submit_timeout_s, request.deadline - time.time())
            if not self._slots.acquire(wait_s):
                raise backpressure_error(self.max_in_flight, max(0.0, wait_s))
        self._register(request, future, None)
        try:
            over = self._publisher.publish(admitted, request)
            if over is not None:  # over a quota: nothing was published
                self._listener.resolve(request.id, over.result)
        except redis.RedisError as exc:
            self._publish_failed(request, exc)
        except Exception:
            self._listener.resolve(
                request.id, lambda r: local_result(r, Status.REJECTED, "the call was not published")
            )
            if self._closed:
                raise ClientClosedError("the client is closed") from None
            raise
        return future

    def call(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolCallResult:
        """Make one tool call and wait for its result (at most ``timeout_s`` seconds).

        Same arguments and errors as :meth:`submit`.
        """
        future = self.submit(
            function, arguments, tool_call_id=tool_call_id, context=context, timeout_s=timeout_s
        )
        return future.result()

    def dispatch(
        self,
        tool_calls: Any,
        *,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
        on_event: Callable[[CallEvent], object] | None = None,
    ) -> list[dict[str, Any]]:
        """Run every tool call of one model turn; return the answers to append.

        All calls are published at once (one pipeline) under one deadline, ``timeout_s``
        from now; the method returns when every call resolved, by the deadline at the
        latest (calls still running then come back ``timeout``).

        Args:
            tool_calls: an OpenAI Chat Completions completion, assistant message or its
                ``tool_calls``; an OpenAI Responses response or its ``output`` items; an
                Anthropic assistant message or its ``content`` blocks. Plain dicts or
                the ``openai``/``anthropic`` SDK objects (see
                :mod:`toolfleet.producer.turns`).
            context: the turn's :class:`CallContext` (or a dict of its fields).
            timeout_s: the turn's budget, seconds.
            on_event: called on this thread with each :class:`CallEvent` as it happens
                (``queued``, ``running``, ``progress``, ``result``); the calls then ask
                workers for status events. If it raises, the turn's calls still running
                are canceled and the exception propagates.

        Returns:
            One message per tool call, in the model's order, in the same format:
            ``{"role": "tool", "tool_call_id", "content"}`` (Chat Completions),
            ``{"type": "function_call_output", "call_id", "output"}`` (Responses) or
            ``{"type": "tool_result", "tool_use_id", "content", "is_error"}``
            (Anthropic); ``content``/``output`` is the result's JSON text. Every call
            runs and gets its own message, calls that share a ``tool_call_id`` too
            (each in its own position). Calls the producer answers itself
            (``unknown_function``, ``not_available``, ``rejected`` for a malformed call
            or a full queue, or for want of an in-flight slot within
            ``submit_timeout_s``) are answered at once.

        Raises:
            ClientClosedError: the client is closed.
            ClientError: ``tool_calls`` is none of these formats, or a bad ``context``
                or ``timeout_s``.
        """
        events: queue.SimpleQueue[CallEvent] | None = (
            None if on_event is None else queue.SimpleQueue()
        )
        state, deadline = self._start_turn(
            tool_calls, context, timeout_s, None if events is None else events.put
        )
        if events is not None and on_event is not None:
            self._pump(state, events, on_event, deadline)
        for future in state.futures:
            if future is not None:
                future.result()  # resolved by the deadline at the latest
        return state.messages()

    def tools(
        self,
        *,
        account: str | None = None,
        format: str = "openai",  # noqa: A002
        include_unavailable: bool = False,
    ) -> list[dict[str, Any]]:
        """The fleet's tools as a model API tool list.

        Args:
            account: list only what this account may call (enabled, switched on,
                available to it); ``None`` lists what is open to every account.
            format: ``openai`` (Chat Completions), ``openai-strict``, ``responses``,
                ``anthropic`` or ``mcp``.
            include_unavailable: list every catalogued function regardless.

        Raises:
            ValueError: unknown format.
            ConnectionFailed: Redis unreachable or failing.
        """
        self._live()
        try:
            catalog = self._catalog.get()
        except redis.RedisError as exc:
            raise connection_failed(exc, self.where, "reading the tool catalog") from exc
        entries = [
            e
            for name, e in sorted(catalog.entries.items())
            if include_unavailable or not catalog.refusal(name, account)
        ]
        tools = export_tools(entries, format)
        present([str(e.get("name")) for e in entries], account, format)
        return tools

    def preparing(
        self,
        function: str,
        partial_arguments: str | dict[str, Any] | None = None,
        *,
        tool_call_id: str | None = None,
        index: int = 0,
    ) -> CallEvent:
        """The ``preparing`` event of a tool call the model is still writing.

        For a caller that streams the model's answer and assembles each tool call's
        arguments from deltas: call it as deltas arrive to show the tool's preparation
        description (multi-llm-ts's ``getPreparationDescription``) before the call can be
        made. Nothing is published; the catalog is read (cached).

        Args:
            function: the function name (complete: it comes first in a stream).
            partial_arguments: the argument text received so far (or an object).
            tool_call_id: the model's id for the call, if known.
            index: the call's position among the turn's tool calls.

        Returns:
            A :class:`CallEvent` of kind ``preparing`` whose ``description`` is the
            tool's text with the arguments received so far filled in (``None`` when the
            tool has none or the function is unknown).

        Raises:
            ClientClosedError: the client is closed.
            ConnectionFailed: Redis unreachable or failing.
        """
        self._check_open()
        try:
            catalog = self._catalog.get(function)
        except redis.RedisError as exc:
            raise connection_failed(exc, self.where, "reading the tool catalog") from exc
        return preparing_event(
            catalog.entries.get(function), function, partial_arguments,
            tool_call_id=tool_call_id, index=index,
        )  # fmt: skip

    def cancel(self, call_id: str) -> bool:
        """Cancel a call by its id, made by this client or by any other of the namespace.

        A call made by this client resolves ``canceled`` at once. A call made elsewhere
        (another replica behind a load balancer, a stateless gateway) is canceled in the
        fleet and its own caller receives ``canceled`` from the worker. In the fleet, a
        queued call never runs; a running ``async`` or ``process`` tool is stopped; a
        running ``thread`` tool sees ``context.canceled`` become true.

        Args:
            call_id: the call's ``id``: ``future.call_id`` of the future :meth:`submit`
                returned (also ``ToolCallResult.id``).

        Returns:
            False when the call had already resolved (or, for a call made elsewhere,
            already has its outcome, or Redis could not be reached).
        """
        self._live()
        resolved = self._listener.resolve(
            call_id,
            lambda request: ToolCallResult.failure(
                request, Status.CANCELED, "the call was canceled"
            ),
        )
        if resolved:
            with contextlib.suppress(redis.RedisError):
                self._cancel_in_fleet([call_id])
            return True
        pipe = self._redis.pipeline(transaction=False)
        queue_foreign_cancel(pipe, self.namespace, call_id, self.settings.reply_ttl_s)
        try:
            finished, marked, _ = pipe.execute()
            return bool(marked) and not finished
        except redis.RedisError as exc:
            log.warning("could not cancel call %s: %s", call_id, exc)
            return False

    def extension_errors(self) -> dict[str, str]:
        """Extensions the live workers could not load, and why (secrets scrubbed).

        Each worker reports its current state at every heartbeat, so a fixed extension
        drops out once the workers restart (see :mod:`toolfleet.shared.extension_errors`).

        Returns:
            Extension source (entry point, ``MODULE:ATTR`` or folder) -> the reason.

        Raises:
            ConnectionFailed: Redis cannot be reached.
        """
        self._live()
        try:
            fields = self._redis.hgetall(extension_errors_key(self.namespace))
        except redis.RedisError as exc:
            raise connection_failed(exc, self.where, "reading extension errors") from exc
        return current_errors(fields, self.settings.worker_ttl_s)

    def _cancel_in_fleet(self, call_ids: list[str]) -> None:
        ttl = self.settings.reply_ttl_s
        pipe = self._redis.pipeline(transaction=False)
        for call_id in call_ids:
            pipe.set(cancel_key(self.namespace, call_id), RESOLVED, ex=ttl)
            pipe.publish(cancel_channel(self.namespace), call_id)
        pipe.execute()

    @property
    def in_flight(self) -> int:
        """Calls published and not yet resolved."""
        return self._listener.in_flight

    @property
    def late_replies(self) -> int:
        """Replies that came after their call was resolved (dropped)."""
        return self._listener.late_replies

    # -- lifecycle -----------------------------------------------------------

    def close(self, *, wait: bool = True) -> None:
        """Stop the client; idempotent. No call is left unresolved.

        With ``wait``, calls in flight resolve first (each by its deadline at the
        latest); without, they resolve ``timeout`` now ("the client was closed").
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        while wait and self._listener.in_flight:
            time.sleep(0.01)
        self._listener.stop()
        with contextlib.suppress(redis.RedisError):
            self._redis.delete(self.reply_to)
        self._redis.close()

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._live()

    def _register(
        self, request: ToolCallRequest, future: CallFuture, on_event: EventSink | None
    ) -> None:
        """Expect ``request``'s reply; the slot it holds is given back when it resolves."""
        fire_requested(request)
        if request.context.conversation:
            future.add_done_callback(lambda done: learn_route(self._routes, request, done))
        future.add_done_callback(self._slots.release)
        try:
            self._listener.expect(request, future, on_event)
        except RuntimeError:
            _done(future, local_result(request, Status.REJECTED, "the client is closed"))
            raise ClientClosedError("the client is closed") from None

    def _publish_failed(self, request: ToolCallRequest, exc: redis.RedisError) -> None:
        """Resolve a call whose publish failed, unless it may have reached Redis."""
        if never_sent(exc):
            message = f"Redis unreachable: {exc}"
            status = Status.NOT_AVAILABLE
        elif isinstance(exc, redis.ResponseError):
            message = f"Redis refused the call: {exc}"
            status = Status.REJECTED
        else:
            # the request may have reached Redis: its reply may still come; the deadline
            # resolves it otherwise (never report "not sent" for a call that may run)
            log.warning("publishing call %s may have failed: %s", request.id, exc)
            return
        self._listener.resolve(request.id, lambda r: local_result(r, status, message))

    def _start_turn(
        self,
        tool_calls: Any,
        context: CallContext | dict[str, Any] | None,
        timeout_s: float,
        emit: Callable[[CallEvent], None] | None,
    ) -> tuple[TurnState, float]:
        """Parse and publish a turn; return its state and deadline (epoch seconds)."""
        self._check_open()
        turn = parse_tool_calls(tool_calls)
        ctx = make_context(context)
        timeout_s = check_timeout(timeout_s)
        deadline = time.time() + timeout_s
        state = TurnState(turn, emit)
        catalog: Catalog | None = None
        unreachable = ""
        if turn.calls:
            try:
                catalog = self._catalog.get([c.function for c in turn.calls if c.function])
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
            if not self._slots.acquire():
                self._publish_batch(state, batch)  # what is gathered goes now; then wait
                batch = []
                wait_s = min(self.submit_timeout_s, deadline - time.time())
                if not self._slots.acquire(wait_s):
                    error = backpressure_error(self.max_in_flight, max(0.0, wait_s))
                    state.answer(call.index, local_result(request, Status.REJECTED, str(error)))
                    continue
            batch.append((call.index, queue_name, request))
        self._publish_batch(state, batch)
        return state, deadline

    def _publish_batch(
        self, state: TurnState, batch: Sequence[tuple[int, str, ToolCallRequest]]
    ) -> None:
        """Publish a turn's calls in one pipeline (each holds a slot already)."""
        sent: list[tuple[int, str, ToolCallRequest, CallFuture]] = []
        for index, queue_name, request in batch:
            future = CallFuture(request.id)
            try:
                self._register(request, future, state.sink(index))
            except ClientClosedError:  # closed mid-turn: answered ``rejected``, not sent
                state.answer(index, future.result())
                continue
            sent.append((index, queue_name, request, future))
        if not sent:
            return
        try:
            outcomes = self._publisher.publish_many([(q, r) for _, q, r, _ in sent])
        except redis.RedisError as exc:
            outcomes = [exc] * len(sent)
        for (index, _, request, future), outcome in zip(sent, outcomes, strict=True):
            if isinstance(outcome, redis.RedisError):
                self._publish_failed(request, outcome)
            elif isinstance(outcome, Refused):  # over a quota: nothing was published
                self._listener.resolve(request.id, outcome.result)
            if future.done() and outcome is not None:
                state.answer(index, future.result())  # never published: no ``queued``
            else:
                state.published(index, request, future)

    def _pump(
        self,
        state: TurnState,
        events: queue.SimpleQueue[CallEvent],
        on_event: Callable[[CallEvent], object],
        deadline: float,
    ) -> None:
        """Hand a turn's events to ``on_event`` on this thread until every call resolved."""
        remaining = len(state.turn.calls)
        try:
            while remaining:
                try:
                    event = events.get(timeout=max(0.0, deadline - time.time()) + _PUMP_GRACE_S)
                except queue.Empty:  # pragma: no cover - the deadline thread resolves all
                    return
                if event.kind == "result":
                    remaining -= 1
                on_event(event)
        except BaseException:
            for call_id in state.pending_call_ids():
                self.cancel(call_id)
            raise


def _done(future: CallFuture, result: ToolCallResult) -> CallFuture:
    if not future.done():
        future.set_result(result)
    return future
