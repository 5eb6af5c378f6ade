"""The asyncio reply listener: one connection, one task and one timer for every call in flight.

A task pops the client's reply list (``BLMPOP``, or ``BLPOP`` then ``LPOP`` where Redis
refuses it or on a cluster) and hands what it took to the
pending-call table (:class:`~toolfleet.producer._core.pending.PendingTable`). One
event-loop timer is armed for the table's earliest deadline; when it fires, the calls
due go to ``expire`` (a task that tells the fleet, then resolves them), so no caller
waits past its deadline while the loop runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import redis
import redis.asyncio

from toolfleet.producer._core.fleet import outcomes_of, queue_resolved
from toolfleet.producer._core.pending import PendingTable
from toolfleet.producer.listener import (
    DRAIN_BATCH,
    MARK_WAIT_S,
    MAX_WAIT_S,
    blmpop_refused,
    popped,
)
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.errors import ClientError
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.reconnect import OUTAGE_ERRORS, Reconnect
from toolfleet.shared.wire import ToolCallResult

__all__ = ["AsyncCallFuture", "AsyncReplyListener"]

log = logging.getLogger("toolfleet.producer.listener")


class AsyncCallFuture(asyncio.Future[ToolCallResult]):
    """The asyncio future of one call; ``call_id`` is the request id (for ``cancel``)."""

    __slots__ = ("call_id",)

    def __init__(self, call_id: str, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.call_id = call_id


class AsyncReplyListener:
    """Feed the reply list ``key`` to ``table`` and expire its calls (one event loop).

    A call resolved here (its deadline, a cancel) gets its ``RESOLVED`` marker first,
    written on ``commands`` within :data:`~toolfleet.producer.listener.MARK_WAIT_S`.

    Arguments as for :class:`~toolfleet.producer.listener.ReplyListener`, with
    ``redis.asyncio`` clients (``connect`` makes one of a single connection, or hands out
    the client's one ``redis.asyncio.cluster.RedisCluster`` for replies, which the
    listener then never closes: each group's ``BLPOP`` holds a connection of its own
    from it). On a cluster the client has one listener per queue group's reply list;
    only the first arms the deadline timer (``deadlines``).
    """

    def __init__(
        self,
        connect: Callable[[], redis.asyncio.Redis],
        key: str,
        table: PendingTable,
        commands: redis.asyncio.Redis,
        namespace: str,
        ttl_s: int,
        keys: KeyLayout | None = None,
        *,
        deadlines: bool = True,
    ) -> None:
        self._connect = connect
        self._keys = keys or KeyLayout(namespace, False)
        self._deadlines = deadlines
        self._commands, self._namespace, self._ttl_s = commands, namespace, ttl_s
        self.key = key
        self.table = table
        #: called when the listener's connection failed (the client drops its cached
        #: catalog: a Redis that restarted is republishing its own)
        self.on_outage: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping = False
        #: take replies with BLMPOP (until Redis says it may not)
        self._blmpop = True
        #: the loop it listens on (bound by the first :meth:`bind`), else ``None``
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> asyncio.AbstractEventLoop:
        """The client's loop: the running one, which the first call binds and starts on.

        Raises:
            ClientError: called on another loop than the bound one.
        """
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
            self.start()
        elif self.loop is not loop:
            raise ClientError("an AsyncToolClient is bound to the event loop it was first used on")
        return loop

    def start(self) -> None:
        """Start the listening task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="toolfleet-replies")

    def rearm(self) -> None:
        """Arm the timer for the table's earliest deadline (on the loop's thread)."""
        if self._timer is not None:
            self._timer.cancel()
        earliest = self.table.next_deadline() if self._deadlines else None
        if earliest is not None and not self._stopping:
            delay_s = max(0.0, earliest - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._fire)

    async def stop(self) -> None:
        """Stop listening; calls still pending resolve ``timeout`` now, none is dropped."""
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._background, return_exceptions=True)
        self.table.close("the client was closed before a reply came")

    async def mark_within(self, call_ids: list[str]) -> list[bytes | None] | None:
        """Write the markers of ``call_ids``; their outcomes, or ``None`` if not in time."""
        task = self._soon(self._mark(call_ids))
        done, _ = await asyncio.wait({task}, timeout=MARK_WAIT_S)
        if not done or task.cancelled() or task.exception() is not None:
            return None
        outcomes: list[bytes | None] = task.result()
        return outcomes

    def mark_soon(self, call_id: str) -> None:
        """Write the marker of a call its caller canceled (in the background)."""
        if not self._stopping:
            self._soon(self._mark([call_id]))

    async def _mark(self, call_ids: list[str]) -> list[bytes | None]:
        found: list[bytes | None] = [None] * len(call_ids)
        try:
            for prefix in self._keys.prefixes():  # one MULTI per group (one slot each)
                pipe = pipeline(self._commands, transaction=True)
                queue_resolved(pipe, prefix, call_ids, self._ttl_s)
                outcomes = outcomes_of(await pipe.execute())
                found = [mine or theirs for mine, theirs in zip(found, outcomes, strict=True)]
        except (redis.RedisError, OSError) as exc:  # best effort: the callers have results
            log.warning("could not cancel %d call(s) in the fleet: %s", len(call_ids), exc)
            raise
        return found

    async def _expire(self, call_ids: list[str]) -> None:
        self.table.expire(call_ids, await self.mark_within(call_ids))

    def _soon(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieved)
        return task

    def _deliver(self, batch: list[bytes | str]) -> None:
        self.table.deliver(batch)

    def _fire(self) -> None:
        due = self.table.due(time.time())
        if due:
            self._soon(self._expire(due))
        self.rearm()

    async def _pop_many(self, client: redis.asyncio.Redis) -> None:
        """Wait for replies and deliver up to ``DRAIN_BATCH`` of them (one ``BLMPOP``).

        When Redis refuses ``BLMPOP`` (:func:`~toolfleet.producer.listener.blmpop_refused`)
        the listener takes replies with ``BLPOP`` and ``LPOP`` from then on.
        """
        try:
            item: Any = await client.blmpop(
                MAX_WAIT_S, 1, self.key, direction="LEFT", count=DRAIN_BATCH
            )
        except redis.ResponseError as exc:
            self._blmpop = not blmpop_refused(exc, reraise=True)
            return
        self._deliver(popped(item))

    async def _run(self) -> None:
        client: redis.asyncio.Redis | None = None
        reconnect = Reconnect(log, "reply listener")
        task = asyncio.current_task()
        try:
            # cancelling(): a cancellation some library swallowed still stops the loop
            while not self._stopping and not (task is not None and task.cancelling()):
                try:
                    client = client or self._connect()
                    if self._blmpop and not is_cluster(client):
                        await self._pop_many(client)
                        reconnect.succeeded()
                        continue
                    item = await client.blpop([self.key], timeout=MAX_WAIT_S)
                    reconnect.succeeded()
                    if item is not None:
                        self._deliver([item[1]])  # resolve the first reply before draining
                        if self.table.in_flight:  # more replies due: take those already here
                            more: Any = await client.lpop(self.key, DRAIN_BATCH)
                            self._deliver(list(more or []))
                except OUTAGE_ERRORS as exc:
                    if not is_cluster(client):  # a cluster client is shared and reconnects
                        await _close(client)
                        client = None
                    if self.on_outage is not None:
                        self.on_outage()
                    await asyncio.sleep(reconnect.failed(exc))
                except Exception:  # pragma: no cover - keep the listener alive whatever happens
                    log.exception("reply listener error")
                    await asyncio.sleep(0.1)
        finally:
            if not is_cluster(client):  # the shared cluster client is closed by its owner
                await _close(client)


async def _close(client: redis.asyncio.Redis | None) -> None:
    if client is not None:
        with contextlib.suppress(Exception):
            await client.aclose()


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # logged where it happened; no "never retrieved" warning
