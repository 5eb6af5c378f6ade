"""Publish requests as Dramatiq messages without touching Dramatiq's global encoder.

The message body is built here and encoded with orjson: Dramatiq's encoder is
process-global and the host application may use Dramatiq for its own tasks, so the
producer never reads or changes it. The request itself travels as the message's one
argument, a JSON string. Enqueuing runs toolfleet's enqueue script
(:mod:`toolfleet.shared.tenancy.enqueue`): what Dramatiq's ``dispatch`` ``enqueue``
command does (``HSET <queue>.msgs id body`` + ``RPUSH``), on the account's lane, after
checking the account's quotas in the same atomic step; queue maintenance is left to the
workers. A call over its quota comes back as a
:class:`~toolfleet.shared.tenancy.enqueue.Refused` (nothing published).

Write-behind publishing: a client's calls wait in its outgoing batch, and one publisher
(a thread for :class:`Publisher`, a task for :class:`AsyncPublisher`) sends everything
that accumulated while its previous round trip was in flight as one run of the batch
enqueue script per key prefix (one per queue group on a cluster, one in all on a plain
Redis), in one pipeline: a lone call goes out at once, a burst costs one round trip per
batch. Each call is still decided on its own in that run (a refused or failing call
leaves the others enqueued). A call whose deadline passed before its batch was sent is
not sent (:class:`~toolfleet.producer._redis.DeadlinePassed`).

A pipeline sends ``EVALSHA`` alone: redis-py's ``Script`` on a pipeline would send
``SCRIPT EXISTS`` before every batch. A run that comes back ``NOSCRIPT`` (Redis
restarted or ran ``SCRIPT FLUSH``: the script did not run, nothing was written) is sent
again, once, after ``SCRIPT LOAD``. A call that asks for the outcome keys of the calls
filling an in-flight quota (:func:`~toolfleet.shared.tenancy.enqueue.recheck`) is sent
again with them, in one more round for all such calls of a batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Container, Generator, Mapping, Sequence
from typing import Any, TypeAlias

import orjson
import redis
import redis.asyncio

from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer._redis import DeadlinePassed
from toolfleet.producer.refusals import FLUSH_S, RefusalLog
from toolfleet.shared import tracing
from toolfleet.shared.idempotency import Duplicate, Idempotency
from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.tenancy.enqueue import (
    ENQUEUE_SCRIPT,
    Call,
    QuotaDefaults,
    Refused,
    batch_call,
    batch_replies,
    enqueue_call,
    recheck,
    refused,
)
from toolfleet.shared.wire import ToolCallRequest

__all__ = ["MAX_BATCH", "MAX_PIPELINE", "AsyncPublisher", "Outcome", "Publisher", "encode_message"]

log = logging.getLogger("toolfleet.producer")

#: Most calls in one run of the enqueue script (a run holds Redis for its length).
MAX_BATCH = 200

#: Most calls the publisher takes from its outgoing batch for one pipeline.
MAX_PIPELINE = 1000

#: What publishing one request came to: ``None`` (enqueued), :class:`Refused` (over a
#: quota: nothing published), a :class:`~toolfleet.shared.idempotency.Duplicate` (its
#: idempotency key names an earlier call: nothing published) or the error Redis answered.
Outcome: TypeAlias = BaseException | Refused | Duplicate | None

#: Per request id, the idempotency key of the calls that carry one.
Keys: TypeAlias = Mapping[str, Idempotency]


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
    if tracing.producing():
        with tracing.produce(queue, request) as request:
            return redis_message_id, _message_body(queue, request, redis_message_id)
    return redis_message_id, _message_body(queue, request, redis_message_id)


def _message_body(queue: str, request: ToolCallRequest, redis_message_id: str) -> bytes:
    message: dict[str, Any] = {
        "queue_name": queue,
        "actor_name": actor_name_for(queue),
        "args": [request.encode().decode("utf-8")],
        "kwargs": {},
        "options": {"redis_message_id": redis_message_id},
        "message_id": request.id,
        "message_timestamp": int(time.time() * 1000),
    }
    return orjson.dumps(message)


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
    ) -> Call:
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

    def prepare(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Prepared]:
        of_queue = self.keys.of_queue
        return [(of_queue(q), self.call(q, r, no_breaker, keys)) for q, r in items]


#: One call ready for the enqueue script: ``(key prefix, (keys, args))``.
Prepared: TypeAlias = tuple[str, Call]

#: What a publish's caller is handed once every call of it is decided: per call, its
#: :data:`Outcome`.
Then: TypeAlias = Callable[[list[Outcome]], None]


def _rounds(prepared: Sequence[Prepared]) -> Generator[list[Call], list[Any], list[Outcome]]:
    """Publish ``prepared`` calls: yields the script runs of a round, gets their replies.

    The same for both publishers: the first round runs every call, grouped into one run
    per key prefix (at most :data:`MAX_BATCH` calls each); a second round, only when some
    call asked to be checked again (:func:`recheck`), runs those. The driver sends each
    round in one pipeline and answers per run its reply, or the error Redis answered for
    it (``NOSCRIPT`` handled by the driver).

    Returns:
        Per call, its :data:`Outcome`.
    """
    prefixes = [prefix for prefix, _ in prepared]
    calls = [call for _, call in prepared]
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for first in (True, False):
        groups: dict[str, list[int]] = {}
        for i in todo:
            groups.setdefault(prefixes[i], []).append(i)
        runs = [
            members[start : start + MAX_BATCH]
            for members in groups.values()
            for start in range(0, len(members), MAX_BATCH)
        ]
        answers = yield [batch_call([calls[i] for i in run]) for run in runs]
        for run, answer in zip(runs, answers, strict=True):
            try:
                per_call = (
                    [answer] * len(run)
                    if isinstance(answer, BaseException)
                    else batch_replies(answer, len(run))
                )
            except redis.ResponseError as exc:
                per_call = [exc] * len(run)
            for i, reply in zip(run, per_call, strict=True):
                replies[i] = reply
        if not first:
            break
        todo = []
        for i, reply in enumerate(replies):
            rerun = recheck(prefixes[i], calls[i], reply)
            if rerun is not None:
                calls[i] = rerun
                todo.append(i)
        if not todo:
            break
    return [_outcome(reply) for reply in replies]


def _unloaded(replies: Sequence[Any]) -> list[int]:
    """The positions of the replies that say the script was not loaded (it did not run)."""
    return [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]


def _outcome(reply: Any) -> Outcome:
    if isinstance(reply, BaseException):
        return reply
    return refused(reply)


class _Collector:
    """The outcomes of calls handed to the publisher together; ``then`` gets them all."""

    __slots__ = ("left", "outcomes", "then")

    def __init__(self, size: int, then: Then) -> None:
        self.outcomes: list[Outcome] = [None] * size
        self.left = size
        self.then = then

    def settle(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0:
            self.then(self.outcomes)


class _Entry:
    """One call waiting in the outgoing batch (a plain class: one is made per call)."""

    __slots__ = ("collector", "deadline", "index", "prepared")

    def __init__(
        self, prepared: Prepared, deadline: float | None, collector: _Collector, index: int
    ) -> None:
        self.prepared = prepared
        self.deadline = deadline
        self.collector = collector
        self.index = index


def _entries(prepared: Sequence[Prepared], deadline: float | None, then: Then) -> list[_Entry]:
    collector = _Collector(len(prepared), then)
    if len(prepared) == 1:  # a lone call (every submit)
        return [_Entry(prepared[0], deadline, collector, 0)]
    return [_Entry(p, deadline, collector, i) for i, p in enumerate(prepared)]


def _due(batch: Sequence[_Entry]) -> tuple[list[_Entry], list[_Entry]]:
    """``batch`` split into the calls still to send and those whose deadline passed."""
    now = time.time()
    late = [e for e in batch if e.deadline is not None and e.deadline <= now]
    if not late:
        return list(batch), late
    live = [e for e in batch if e.deadline is None or e.deadline > now]
    return live, late


def _settle_all(entries: Sequence[_Entry], outcomes: Sequence[Outcome]) -> None:
    for entry, outcome in zip(entries, outcomes, strict=True):
        try:
            entry.collector.settle(entry.index, outcome)
        except Exception:  # a caller's hook failed: the other calls are still told
            log.exception("settling a published call failed")


#: A call not sent because its deadline came first.
def _late() -> DeadlinePassed:
    return DeadlinePassed("the call's deadline passed before Redis was asked")


class Publisher:
    """Enqueue :class:`ToolCallRequest` s on their queues (thread-safe).

    :meth:`publish` and :meth:`publish_many` send in the caller's thread;
    :meth:`send` and :meth:`send_wait` go through the outgoing batch, which one thread
    per publisher (started on first use) sends while the caller goes on.

    Args:
        client: Redis client (shared with the rest of the producer).
        namespace: key prefix (Dramatiq's namespace).
        quotas: quotas of accounts without their own (``None``: no limit).
        idempotency_ttl_s: seconds an idempotency key's record outlives its call's
            deadline (the ``reply_ttl_s`` setting).
        keys: the client's key layout (``None``: a plain Redis's, under ``namespace``).
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
        self._ready = threading.Condition()
        self._waiting: list[_Entry] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the calls the client answered itself: written with each publish, or by
        #: :meth:`flush_later` (see :mod:`toolfleet.producer.refusals`)
        self.refusals: RefusalLog | None = None

    def flush_later(self) -> None:
        """Write the refusals kept in :data:`FLUSH_S` s unless a publish takes them first."""
        timer = threading.Timer(FLUSH_S, self._flush_refusals)
        timer.daemon = True
        timer.name = "toolfleet-refusals"
        timer.start()

    def _flush_refusals(self) -> None:
        refusals = self.refusals
        if refusals is None or not refusals.pending or self._closed:
            return
        pipe = pipeline(self._client)
        drained = refusals.drain_into(pipe)
        try:
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - kept for the next write; one line
            refusals.restore(drained)
            log.warning("refused calls not counted in Redis yet: %s", exc)

    def prepare(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Prepared]:
        """Encode ``items`` (``(queue, request)``) for the enqueue script, in this thread.

        Each request is encoded once, here (its PRODUCER span is the caller's).
        """
        return self._dispatch.prepare(items, no_breaker, keys)

    def publish(self, queue: str, request: ToolCallRequest) -> Refused | Duplicate | None:
        """Enqueue one request on ``queue``; a :class:`Refused` when over a quota.

        Raises:
            redis.RedisError: Redis could not be reached, or refused the call.
        """
        (outcome,) = self.publish_many([(queue, request)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def publish_many(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Outcome]:
        """Enqueue several requests now, in this thread: one pipeline, one script run per prefix.

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
        return self._send(self.prepare(items, no_breaker, keys))

    def send(self, prepared: Sequence[Prepared], deadline: float | None, then: Then) -> None:
        """Append ``prepared`` calls to the outgoing batch; ``then(outcomes)`` once decided.

        ``then`` runs on the publisher's thread with, per call, its :data:`Outcome`: a
        call still waiting at ``deadline`` (epoch seconds; ``None``: no bound) is not sent
        (a :class:`DeadlinePassed`); after :meth:`close` a ``redis.ConnectionError``.
        """
        entries = _entries(prepared, deadline, then)
        with self._ready:
            if self._closed:
                closed = True
            else:
                closed = False
                self._waiting.extend(entries)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="toolfleet-publisher", daemon=True
                    )
                    self._thread.start()
                self._ready.notify()
        if closed:
            _settle_all(entries, [_closed()] * len(entries))

    def send_wait(self, prepared: Sequence[Prepared], deadline: float | None) -> list[Outcome]:
        """:meth:`send` and wait for the outcomes, no later than ``deadline`` (epoch s).

        Raises:
            DeadlinePassed: no answer by ``deadline`` (the calls may still be enqueued).
        """
        done = threading.Event()
        box: list[list[Outcome]] = []

        def then(outcomes: list[Outcome]) -> None:
            box.append(outcomes)
            done.set()

        self.send(prepared, deadline, then)
        wait_s = None if deadline is None else max(0.0, deadline - time.time())
        if not done.wait(wait_s):
            raise DeadlinePassed("no answer from Redis by the call's deadline")
        return box[0]

    def close(self) -> None:
        """Stop the publisher: calls still waiting get a ``redis.ConnectionError``.

        A batch under way finishes on its own (not waited for). Refusals not yet written
        are written now, in one pipeline (best effort: a failure is one log line).
        """
        self._flush_refusals()
        with self._ready:
            self._closed = True
            left, self._waiting = self._waiting, []
            self._ready.notify()
        _settle_all(left, [_closed()] * len(left))

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                batch = self._waiting[:MAX_PIPELINE]
                del self._waiting[:MAX_PIPELINE]
            live, late = _due(batch)
            _settle_all(late, [_late()] * len(late))
            if not live:
                continue
            outcomes: Sequence[Outcome]
            try:
                outcomes = self._send([entry.prepared for entry in live])
            except Exception as exc:  # noqa: BLE001 - handed to every call of the batch
                outcomes = [exc] * len(live)
            _settle_all(live, outcomes)

    def _send(self, prepared: Sequence[Prepared]) -> list[Outcome]:
        rounds = _rounds(prepared)
        try:
            runs = next(rounds)
            while True:
                runs = rounds.send(self._execute(runs))
        except StopIteration as stop:
            outcomes: list[Outcome] = stop.value
            return outcomes

    def _execute(self, runs: Sequence[Call]) -> list[Any]:
        replies = self._pipeline(runs)
        if missing := _unloaded(replies):
            self._script.sha = self._client.script_load(ENQUEUE_SCRIPT)
            again = self._pipeline([runs[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    def _pipeline(self, runs: Sequence[Call]) -> list[Any]:
        if len(runs) == 1:  # one run (one key prefix): the command alone, no pipeline
            ((keys, args),) = runs
            try:
                return [self._client.evalsha(self._script.sha, len(keys), *keys, *args)]
            except redis.ResponseError as exc:  # what a pipeline hands back, not raises
                return [exc]
        pipe = pipeline(self._client)
        for keys, args in runs:
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
        refusals = self.refusals
        drained = refusals.drain_into(pipe) if refusals is not None else None
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except BaseException:
            if refusals is not None and drained:
                refusals.restore(drained)
            raise
        return replies[: len(runs)]  # the refusals' replies ride along unread


def _closed() -> redis.ConnectionError:
    return redis.ConnectionError("publishing was interrupted: the client closed")


class AsyncPublisher:
    """Enqueue requests from asyncio, batching concurrent publishes (one event loop).

    Calls handed over while a pipeline is in flight wait and go together in the next one
    (write-behind, by one task): thousands of concurrent ``submit`` s take a few round
    trips, a few script runs and one connection.

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
        self._waiting: list[_Entry] = []
        self._flushing: asyncio.Task[None] | None = None
        #: the calls the client answered itself: written with each publish, or by
        #: :meth:`flush_later` (see :mod:`toolfleet.producer.refusals`)
        self.refusals: RefusalLog | None = None
        self._timers: set[asyncio.Task[None]] = set()

    def flush_later(self) -> None:
        """Write the refusals kept in :data:`FLUSH_S` s unless a publish takes them first.

        Called on the client's event loop (where the refusals are answered); without a
        running loop the refusals wait for the next publish.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._flush_refusals())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _flush_refusals(self) -> None:
        await asyncio.sleep(FLUSH_S)
        refusals = self.refusals
        if refusals is None or not refusals.pending:
            return
        pipe = pipeline(self._client)
        drained = refusals.drain_into(pipe)
        try:
            await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - kept for the next write; one line
            refusals.restore(drained)
            log.warning("refused calls not counted in Redis yet: %s", exc)

    def prepare(
        self,
        items: Sequence[tuple[str, ToolCallRequest]],
        no_breaker: Container[str] = (),
        keys: Keys | None = None,
    ) -> list[Prepared]:
        """Encode ``items`` (``(queue, request)``) for the enqueue script, now (once each)."""
        return self._dispatch.prepare(items, no_breaker, keys)

    def send(self, prepared: Sequence[Prepared], deadline: float | None, then: Then) -> None:
        """Append ``prepared`` calls to the outgoing batch; ``then(outcomes)`` once decided.

        Call it on the publisher's event loop; ``then`` runs there. A call still waiting
        at ``deadline`` (epoch seconds; ``None``: no bound) is not sent (a
        :class:`DeadlinePassed`); one interrupted by the client closing gets a
        ``redis.ConnectionError``.
        """
        self._waiting.extend(_entries(prepared, deadline, then))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

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
        """Enqueue several requests (in the next batch) and wait for their outcomes.

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
        return await self.send_wait(self.prepare(items, no_breaker, keys), wait_s)

    async def send_wait(self, prepared: Sequence[Prepared], wait_s: float | None) -> list[Outcome]:
        """:meth:`send` and wait for the outcomes, up to ``wait_s`` seconds (``None``: no limit).

        Returns:
            Per call, its :data:`Outcome` (a ``redis.TimeoutError`` for the calls not
            confirmed within ``wait_s``: they may still be enqueued).
        """
        if not prepared:
            return []
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Outcome]] = loop.create_future()

        def then(outcomes: list[Outcome]) -> None:
            if not done.done():
                done.set_result(outcomes)

        deadline = None if wait_s is None else time.time() + max(0.0, wait_s)
        self.send(prepared, deadline, then)
        try:
            return await asyncio.wait_for(asyncio.shield(done), wait_s)
        except TimeoutError:
            late = redis.TimeoutError(f"Redis did not confirm the publish within {wait_s} s")
            return [late] * len(prepared)

    async def _flush(self) -> None:
        batch: list[_Entry] = []
        try:
            while self._waiting:
                batch = self._waiting[:MAX_PIPELINE]
                del self._waiting[:MAX_PIPELINE]
                live, late = _due(batch)
                _settle_all(late, [_late()] * len(late))
                if live:
                    outcomes: Sequence[Outcome]
                    try:
                        outcomes = await self._send([entry.prepared for entry in live])
                    except Exception as exc:  # noqa: BLE001 - handed to every call waiting
                        outcomes = [exc] * len(live)
                    _settle_all(live, outcomes)
                batch = []
        finally:
            self._flushing = None
            # interrupted (the client closed): nobody may wait forever for a batch
            left = [*batch, *self._waiting]
            self._waiting = []
            _settle_all(left, [_closed()] * len(left))

    async def _send(self, prepared: Sequence[Prepared]) -> list[Outcome]:
        rounds = _rounds(prepared)
        try:
            runs = next(rounds)
            while True:
                runs = rounds.send(await self._execute(runs))
        except StopIteration as stop:
            outcomes: list[Outcome] = stop.value
            return outcomes

    async def _execute(self, runs: Sequence[Call]) -> list[Any]:
        replies = await self._pipeline(runs)
        if missing := _unloaded(replies):
            self._script.sha = await self._client.script_load(ENQUEUE_SCRIPT)
            again = await self._pipeline([runs[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, runs: Sequence[Call]) -> list[Any]:
        pipe = pipeline(self._client)
        for keys, args in runs:
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
        refusals = self.refusals
        drained = refusals.drain_into(pipe) if refusals is not None else None
        try:
            replies = list(await pipe.execute(raise_on_error=False))
        except BaseException:
            if refusals is not None and drained:
                refusals.restore(drained)
            raise
        return replies[: len(runs)]  # the refusals' replies ride along unread
