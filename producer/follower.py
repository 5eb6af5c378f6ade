"""The pollers that answer duplicates with their first call's outcome (thread and task).

Each reads the outcome keys of :class:`~toolfleet.producer._core.follow.Following` in
one ``MGET`` every :data:`~toolfleet.producer._core.follow.POLL_S` seconds, only while
duplicates wait (none: no thread or task runs, no command is sent). A Redis failure is
logged and retried at the next poll; a duplicate still unanswered at its deadline is
resolved ``timeout`` by the client's own expiry, as any call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import redis
import redis.asyncio

from toolfleet.producer._core.follow import POLL_S, Following
from toolfleet.producer._core.pending import PendingTable
from toolfleet.shared.connect import is_cluster

__all__ = ["AsyncFollower", "Follower"]

log = logging.getLogger("toolfleet.producer")


def _mget(client: Any, keys: list[str]) -> Any:
    """``MGET keys``; on a cluster one ``MGET`` per slot (the duplicates' groups differ)."""
    return client.mget_nonatomic(keys) if is_cluster(client) else client.mget(keys)


def _answer(following: Following, table: PendingTable, ids: list[str], raws: Any) -> None:
    holding = {own for own in ids if table.holds(own)}
    for result in following.settle(ids, list(raws), holding):
        table.answer(result.id, result)


def _forget_resolved(following: Following, table: PendingTable, ids: list[str]) -> bool:
    """Forget the duplicates resolved otherwise (deadline, close); True when none is left."""
    holding = {own for own in ids if table.holds(own)}
    following.settle(ids, [None] * len(ids), holding)
    return not holding


class Follower:
    """Polls on a daemon thread while duplicates wait (:class:`ToolClient`).

    Args:
        client: Redis client.
        following: the duplicates waiting.
        table: the client's pending calls (answered through it).
    """

    def __init__(self, client: redis.Redis, following: Following, table: PendingTable) -> None:
        self.client = client
        self.following = following
        self.table = table
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Make sure the poller runs (a duplicate was added)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="toolfleet-duplicates", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not len(self.following):
                    self._thread = None
                    return
            ids, keys = self.following.keys()
            if _forget_resolved(self.following, self.table, ids):
                continue
            try:
                _answer(self.following, self.table, ids, _mget(self.client, keys))
            except (redis.RedisError, OSError) as exc:
                log.warning("could not read the outcomes duplicates wait for: %s", exc)
            threading.Event().wait(POLL_S)


class AsyncFollower:
    """Polls in a task of the client's loop while duplicates wait (:class:`AsyncToolClient`).

    Args:
        client: asyncio Redis client.
        following: the duplicates waiting.
        table: the client's pending calls (answered through it).
    """

    def __init__(
        self, client: redis.asyncio.Redis, following: Following, table: PendingTable
    ) -> None:
        self.client = client
        self.following = following
        self.table = table
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Make sure the poller runs (call on the client's loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling (the client closes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while len(self.following):
            ids, keys = self.following.keys()
            if _forget_resolved(self.following, self.table, ids):
                continue
            try:
                _answer(self.following, self.table, ids, await _mget(self.client, keys))
            except (redis.RedisError, OSError) as exc:
                log.warning("could not read the outcomes duplicates wait for: %s", exc)
            await asyncio.sleep(POLL_S)
