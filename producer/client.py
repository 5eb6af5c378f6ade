"""``ToolClient``: publish tool calls to the fleet and wait for their results (threads).

A thin I/O shell over the sans-IO core (:mod:`toolfleet.producer._core`): it owns the
connections, blocks where a call waits, and runs the listener threads; every decision
is the core's, shared with :class:`~toolfleet.producer.async_client.AsyncToolClient`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
    RUNNING,
)
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import redis
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
from toolfleet.producer._redis import sync_connection, track_forks
from toolfleet.producer.backpressure import InFlightLimit
from toolfleet.producer.bounded import DeadlineRunner
from toolfleet.producer.catalog import CatalogReader
from toolfleet.producer.events import CallEvent
from toolfleet.producer.follower import Follower
from toolfleet.producer.listener import ReplyListener
from toolfleet.producer.publish import Publisher
from toolfleet.producer.stream import SyncTurnStream, TurnState
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import DEFAULT_GROUP, extension_errors_key
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.enqueue import QuotaDefaults
from toolfleet.shared.wire import CallContext, ToolCallResult

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

T = TypeVar("T")

__all__ = ["CallFuture", "ToolClient"]


#: Guards the state of every :class:`CallFuture` that has no condition of its own yet, and
#: the making of that condition (held for a few attribute writes at a time).
_LAZY = threading.Lock()

_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class CallFuture(Future[ToolCallResult]):
    """The future of one call; ``call_id`` is the request id (for :meth:`ToolClient.cancel`).

    A ``concurrent.futures.Future`` (``wait``, ``as_completed``, callbacks, cancel) that
    makes its ``threading.Condition`` only when a thread has to wait on it, or when any
    method it does not take over itself runs: a call in flight holds no lock, condition or
    list of its own. Until the condition exists, the future's state changes under one lock
    shared by all futures (:data:`_LAZY`); after, under its condition, as any Future's.
    """

    __slots__ = (
        "_callbacks",
        "_cond",
        "_exception",
        "_result",
        "_state",
        "_waiter_list",
        "call_id",
    )

    def __init__(self, call_id: str) -> None:  # noqa: D107 - the class says it
        # Future.__init__ is not called: it makes the condition and two lists
        self.call_id = call_id
        self._state = PENDING
        self._result: ToolCallResult | None = None
        self._exception: BaseException | None = None
        self._cond: threading.Condition | None = None
        self._waiter_list: list[Any] | None = None
        #: None, the one callback, or a list of them
        self._callbacks: Callable[[Any], object] | list[Callable[[Any], object]] | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """The future's condition, made on first use (what Future's own methods take)."""
        cond = self._cond
        if cond is None:
            with _LAZY:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        """The waiters of ``concurrent.futures.wait`` (appended under the condition)."""
        if self._waiter_list is None:
            with self._condition:
                if self._waiter_list is None:
                    self._waiter_list = []
        return self._waiter_list

    @property
    def _done_callbacks(self) -> list[Callable[[Any], object]]:
        """The callbacks as a list (what Future's own methods append to and run)."""
        with self._condition:
            callbacks = self._callbacks
            if not isinstance(callbacks, list):
                callbacks = self._callbacks = [] if callbacks is None else [callbacks]
            return callbacks

    @override
    def done(self) -> bool:
        return self._state in _DONE

    @override
    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    @override
    def running(self) -> bool:
        return self._state == RUNNING

    @override
    def result(self, timeout: float | None = None) -> ToolCallResult:
        if self._state == FINISHED and self._exception is None:
            return self._result  # type: ignore[return-value]
        return super().result(timeout)

    @override
    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    @override
    def add_done_callback(self, fn: Callable[[Future[ToolCallResult]], object]) -> None:
        with _LAZY:
            alone = self._cond is None
            if alone and self._state not in _DONE:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = fn
                elif isinstance(callbacks, list):
                    callbacks.append(fn)
                else:
                    self._callbacks = [callbacks, fn]
                return
        if alone:  # done already: run it now, as Future does
            self._run_callback(fn)
        else:
            super().add_done_callback(fn)

    @override
    def set_result(self, result: ToolCallResult) -> None:
        if not self._finish_alone(result, None):
            super().set_result(result)

    @override
    def set_exception(self, exception: BaseException | None) -> None:
        if not self._finish_alone(None, exception):
            super().set_exception(exception)

    def _finish_alone(self, result: ToolCallResult | None, exception: BaseException | None) -> bool:
        """Finish a future nobody waits on (no condition yet); False: it has a condition.

        Raises:
            InvalidStateError: the future is done already.
        """
        with _LAZY:
            if self._cond is not None:
                return False
            state = self._state
            if state not in _DONE:
                self._result, self._exception = result, exception
                self._state = FINISHED
                callbacks = self._callbacks
        if state in _DONE:  # the message is made outside the lock (repr takes the condition)
            raise InvalidStateError(f"{state}: {self!r}")
        if isinstance(callbacks, list):
            for fn in callbacks:
                self._run_callback(fn)
        elif callbacks is not None:
            self._run_callback(callbacks)
        return True

    def _run_callback(self, fn: Callable[[Any], object]) -> None:
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)


class ToolClient(ClientBase):
    """A thread-safe client of the tool fleet: one reply connection serves every call.

    Calls never raise for a wire status (``result.raise_for_status()`` does); only for
    misuse (:class:`ClientError`), after :meth:`close` (:class:`ClientClosedError`), or
    with ``max_in_flight`` calls in flight for ``submit_timeout_s`` (``BackpressureError``).
    Calls the producer answers itself, at once and unpublished: ``unknown_function``,
    ``not_available`` (no live worker, switched off, not for the account, Redis down),
    ``rejected`` (arguments over ``max_arguments_bytes``, a full queue, over a quota).

    Args:
        redis_url: ``redis://``, ``rediss://``, ``unix://``; ``None``: ``TOOLFLEET_REDIS_URL``.
        namespace: key prefix; ``None``: ``TOOLFLEET_NAMESPACE`` (default ``toolfleet``).
        settings: a :class:`Settings` object instead of the environment.
        redis_client: a ready-made ``redis.Redis`` (Sentinel, credential provider, TLS);
            its pool serves commands and the listener (a blocking read of up to 1 s:
            ``socket_timeout`` ``None`` or above), undecoded; the client does not close it.
        connection_pool: a ``redis.ConnectionPool`` instead (same rules).
        max_in_flight: most calls published and not yet resolved.
        submit_timeout_s: seconds ``submit`` blocks for a slot (never past the deadline).
        registry: a ``prometheus_client.CollectorRegistry`` (the host application's) that
            gets the producer's metrics too (:func:`toolfleet.producer.metrics.register`);
            ``None``: they stay in their own ``toolfleet.producer.metrics.REGISTRY`` only.

    After ``os.fork()`` the child's client has its own id, reply list, connections and
    threads on first use; the parent's calls in flight resolve ``timeout`` in the child.

    Raises:
        ConfigurationError: no Redis URL given or configured, or not a Redis URL.
        ClientError: a bad ``max_in_flight``/``submit_timeout_s``, an unfit client/pool, or
            a ``registry`` holding another metric of the same name.
    """

    def __init__(self, redis_url: str | None = None, *, namespace: str | None = None,
                 settings: Settings | None = None, redis_client: redis.Redis | None = None,
                 connection_pool: redis.ConnectionPool | None = None, max_in_flight: int = 10_000,
                 submit_timeout_s: float = 30.0, registry: CollectorRegistry | None = None,
                 ) -> None:  # fmt: skip
        super().__init__(redis_url, namespace, settings, redis_client, connection_pool,
                         max_in_flight, submit_timeout_s, asyncio=False,
                         registry=registry)  # fmt: skip
        self._close_lock = threading.Lock()
        self._stale = False
        self._per_process_state()
        self._live()
        track_forks(self)

    def _per_process_state(self) -> None:
        """This process's core, connections, catalog cache, slots and listener."""
        self._new_core(InFlightLimit(self.max_in_flight))
        self._redis = self._connection("producer")
        ns, settings = self.namespace, self.settings
        self._keys = KeySpace(ns, is_cluster(self._redis), self.client_id)
        self._core.prefix_of = self._keys.of_queue
        self._catalog = CatalogReader(self._redis, ns, settings.catalog_cache_s,
                                      settings.worker_ttl_s, self._keys)  # fmt: skip
        self._catalog.watch = self._core.slots.queues
        self._publisher = Publisher(self._redis, ns, QuotaDefaults.from_settings(settings),
                                    settings.reply_ttl_s, self._keys)  # fmt: skip
        self._core.refusals.attach(self._publisher, self._keys.group(DEFAULT_GROUP))
        self._follower = Follower(self._redis, self._core.following, self._core.table)
        self._listener = ReplyListener(lambda: self._connection("reply"), self.reply_to,
                                       self._core.table, self._redis, ns,
                                       settings.reply_ttl_s, self._keys)  # fmt: skip
        self._listener.on_outage = self._catalog.forget
        #: on a cluster, a listener per queue group's reply list (the first one's deadline
        #: thread expires every call)
        self._group_listeners: dict[str, ReplyListener] = {}
        self._bounded = DeadlineRunner(f"toolfleet-io-{self.client_id}")
        self._start_lock = threading.Lock()
        self._started = False

    def _after_fork(self) -> None:
        """In a forked child: a fresh identity and state; threads start on first use.

        A cluster client connects as it is made; when the child cannot reach the cluster
        yet, the state is made again on the client's first use (:meth:`_live`).
        """
        orphaned = self._core.table
        self._close_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._started = False
        self._stale = True
        orphaned.orphan("no reply in this process: the call was made before fork()")
        self._per_process_state()
        self._stale = False

    def _live(self) -> None:
        """Start the listener threads if this process has not yet (a forked child)."""
        if self._started:
            return
        with self._start_lock:
            if self._stale:  # a forked child whose state could not be made at fork()
                self._per_process_state()
                self._stale = False
            if not self._started:
                self._listener.start()
                self._started = True

    def _connection(self, role: str) -> redis.Redis:
        timeout_s = self.settings.redis_timeout_s if role == "producer" else None
        name = f"toolfleet-{role}-{self.client_id}"
        return sync_connection(self._config, name, timeout_s, single=role == "reply")

    # -- calls -----------------------------------------------------------------------------

    @override
    def submit(self, function: str, arguments: Arguments = None, *,
               tool_call_id: str | None = None, context: CallContext | dict[str, Any] | None = None,
               timeout_s: float = 30.0, schema_hash: str | None = None,
               idempotency_key: str | None = None,
               max_result_bytes: int | None = None) -> CallFuture:  # fmt: skip
        self._check_open()
        request = self._request(function, arguments, tool_call_id, context, timeout_s,
                                max_result_bytes=max_result_bytes,
                                schema_hash=schema_hash)  # fmt: skip
        future = CallFuture(request.id)
        self._drive(self._core.submit(request, future, idempotency_key))
        return future

    @override
    def call(self, function: str, arguments: Arguments = None, **options: Any) -> ToolCallResult:
        return self.submit(function, arguments, **options).result()

    @override
    def dispatch(self, tool_calls: Any, *, context: CallContext | dict[str, Any] | None = None,
                 timeout_s: float = 30.0, on_event: Callable[[CallEvent], object] | None = None,
                 idempotency_key: str | None = None,
                 max_result_bytes: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
        if on_event is None:
            budget = check_budget(max_result_bytes)
            state = self._start_turn(tool_calls, context, timeout_s, None, idempotency_key,
                                     budget)  # fmt: skip
            for future in state.futures:
                if future is not None:
                    future.result()  # resolved by the deadline at the latest
            return state.messages()
        with self.stream(tool_calls, context=context, timeout_s=timeout_s,
                         idempotency_key=idempotency_key,
                         max_result_bytes=max_result_bytes) as events:  # fmt: skip
            for event in events:
                on_event(event)
        return events.messages

    @override
    def stream(self, tool_calls: Any, **options: Any) -> SyncTurnStream:
        return SyncTurnStream(self._starter(tool_calls, options), self._cancel)

    @override
    def tools(self, *, account: str | None = None, format: str = "openai",  # noqa: A002
              include_unavailable: bool = False, metadata: bool = False,
              ) -> list[dict[str, Any]]:  # fmt: skip
        self._live()
        return self._drive(self._core.tools(account, format, include_unavailable, metadata))

    @override
    def preparing(self, function: str, partial_arguments: str | dict[str, Any] | None = None,
                  *, tool_call_id: str | None = None, index: int = 0) -> CallEvent:  # fmt: skip
        self._check_open()
        return self._drive(self._core.preparing(function, partial_arguments, tool_call_id, index))

    @override
    def cancel(self, call_id: str) -> bool:
        self._live()
        return self._cancel([call_id])

    @override
    def extension_errors(self) -> dict[str, str]:
        self._live()
        return self._drive(self._core.extension_errors())

    @override
    def close(self, *, wait: bool = True) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        while wait and self._core.table.in_flight:
            time.sleep(0.01)
        self._listener.stop()
        for listener in self._group_listeners.values():
            listener.stop()
        with contextlib.suppress(*REDIS_FAILURES):
            for key in {self.reply_to, *self._group_listeners}:
                self._redis.delete(key)  # one by one: on a cluster they are in other slots
        self._bounded.close()
        self._publisher.close()
        self._redis.close()

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    # -- the I/O the core asks for ---------------------------------------------------------

    def _start_turn(self, tool_calls: Any, context: Any, timeout_s: float,
                    emit: Callable[[CallEvent], None] | None,
                    idempotency_key: str | None = None,
                    max_result_bytes: int | None = None) -> TurnState:  # fmt: skip
        self._check_open()
        turn = self._core.turn(tool_calls, context, timeout_s, emit, CallFuture, idempotency_key,
                               max_result_bytes)  # fmt: skip
        return self._drive(turn)

    def _cancel(self, call_ids: list[str]) -> bool:
        return bool(self._drive(self._core.cancel(call_ids)))

    def _drive(self, steps: Generator[core.Step, Any, T]) -> T:
        """Run one of the core's operations, performing each step it asks for."""
        step = core.advance(steps, None, None)
        while not isinstance(step, core.Done):
            try:
                answer, error = self._perform(step), None
            except Exception as exc:  # noqa: BLE001 - handed to the operation
                answer, error = None, exc
            step = core.advance(steps, answer, error)
        value: T = step.value
        return value

    def _perform(self, step: core.Step) -> Any:
        # never past the deadline: it settles the call
        if isinstance(step, core.ReadCatalog):
            functions = step.functions
            snapshot = self._catalog.cached(functions)  # no thread hand-off for a cache hit
            if snapshot is not None:
                return snapshot
            return self._bounded.run(lambda: self._catalog.get(functions), step.deadline)
        if isinstance(step, core.TakeSlot):
            return self._slots.acquire(step.wait_s)
        if isinstance(step, core.Publish):  # encoded here, sent by the publisher's thread
            prepared = self._publisher.prepare(step.items, step.no_breaker, step.keys)
            outcomes = None
            if step.then is not None:
                self._publisher.send(prepared, step.deadline, step.then)
            else:
                outcomes = self._publisher.send_wait(prepared, step.deadline)
            self._listen_on_groups()
            return outcomes
        if isinstance(step, core.MarkResolved):
            return self._listener.mark_within(step.call_ids)
        if isinstance(step, core.ReadExtensionErrors):
            return self._redis.hgetall(extension_errors_key(self._keys.fleet))
        if isinstance(step, core.FindQueued):
            pipe = pipeline(self._redis)
            for queue in step.queues:
                queue_find_queued(pipe, self._keys.of_queue(queue), step.call_id, [queue])
            return pipe.execute()
        if isinstance(step, core.AnswerQueued):
            script = self._redis.register_script(CANCEL_QUEUED_SCRIPT)
            return script(keys=step.cancel.keys, args=step.cancel.args)
        if isinstance(step, core.ReadRoutes):
            return read_routes(pipeline(self._redis), step.keys, step.ttl_s)
        if isinstance(step, core.CheckLive):
            pipe = pipeline(self._redis)
            return count_live(pipe, self._keys.fleet, step.queues, self.settings.worker_ttl_s)
        replies: list[Any] = []  # per group known: (finished, marked, receivers)
        for prefix in self._keys.prefixes():
            pipe = pipeline(self._redis)
            queue_foreign_cancel(pipe, prefix, step.call_id, self.settings.reply_ttl_s)
            replies.append(pipe.execute())
        return merge_foreign_cancels(replies)

    def _listen_on_groups(self) -> None:
        """On a cluster: start a listener on each group's reply list calls were sent with."""
        for key in self._keys.reply_lists():
            if key == self.reply_to or key in self._group_listeners:
                continue
            listener = ReplyListener(lambda: self._connection("reply"), key, self._core.table,
                                     self._redis, self.namespace, self.settings.reply_ttl_s,
                                     self._keys, deadlines=False)  # fmt: skip
            self._group_listeners[key] = listener
            listener.start()
