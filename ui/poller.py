"""One poller per ``ui`` process: every open page and stream shares its snapshots.

A page asks for :meth:`Poller.current` (a snapshot no older than the interval, read at
most once however many pages ask at the same moment); a live stream iterates
:meth:`Poller.updates`. While at least one stream is open the poller reads Redis once
per interval; with none open it reads only when a page is requested. So the Redis
load of the ops page is one snapshot per interval per ``ui`` process, whatever the
number of viewers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import anyio.to_thread
import redis

from toolfleet.ui.snapshot import Snapshot

__all__ = ["Poller"]

log = logging.getLogger("toolfleet.ui")


class Poller:
    """Reads snapshots with ``read`` (a blocking function, run in a thread).

    Args:
        read: reads one :class:`Snapshot` from Redis; may raise ``redis.RedisError``.
        interval_s: seconds between reads while a stream is open; a snapshot younger
            than this is served as is.

    Attributes:
        reads: snapshots read since start (for tests and the docs' measurements).
        error: the last read's Redis error ("" after a successful read).
    """

    def __init__(self, read: Callable[[], Snapshot], interval_s: float = 2.0) -> None:
        self._read = read
        self.interval_s = interval_s
        self._latest: Snapshot | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._streams = 0
        self._task: asyncio.Task[None] | None = None
        self.reads = 0
        self.error = ""

    @property
    def streams(self) -> int:
        """Live streams open now."""
        return self._streams

    async def current(self) -> Snapshot:
        """A snapshot at most ``interval_s`` old, read now if the last one is older.

        Raises:
            redis.RedisError: Redis failed and no snapshot was ever read.
        """
        if self._latest is None or time.monotonic() - self._read_at >= self.interval_s:
            await self._refresh()
        if self._latest is None:
            raise redis.ConnectionError(self.error or "no snapshot read yet")
        return self._latest

    async def _refresh(self) -> None:
        async with self._lock:
            if self._latest is not None and time.monotonic() - self._read_at < self.interval_s:
                return  # another caller read it while this one waited
            try:
                snapshot = await anyio.to_thread.run_sync(self._read)
            except redis.RedisError as exc:
                self.error = f"Redis: {exc}"
                log.warning("ops page could not read the fleet: %s", exc)
                self._read_at = time.monotonic()
                if self._latest is None:
                    return
                snapshot = self._latest
            else:
                self.error = ""
                self.reads += 1
            self._latest = snapshot
            self._read_at = time.monotonic()
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        while self._streams:
            await self._refresh()
            await asyncio.sleep(self.interval_s)
        self._task = None

    async def updates(self) -> AsyncIterator[Snapshot]:
        """Each new snapshot, as the poller reads it, until the consumer stops."""
        self._streams += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            seen: list[Snapshot | None] = [None]
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda: self._latest is not seen[0])
                seen[0] = self._latest
                if seen[0] is not None:
                    yield seen[0]
        finally:
            self._streams -= 1

    async def close(self) -> None:
        """Stop the polling task (on application shutdown)."""
        self._streams = 0
        if self._task is not None:
            self._task.cancel()
            self._task = None
