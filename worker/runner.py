"""Run one tool call under a time limit.

- ``async`` tools run on the process's event-loop thread and are cancelled at the limit.
- Sync tools run on a fresh daemon thread; at the limit the caller gets ``timeout``
  at once and the thread is abandoned (it cannot be interrupted from outside; a
  stuck thread only costs memory). GIL-holding or CPU-bound code should not be a
  thread tool for that reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "Runner"]


@dataclass(frozen=True)
class Outcome:
    """What running a tool produced.

    Attributes:
        value: the return value when the tool finished normally.
        error: the exception the tool raised, if any.
        timed_out: True when the limit passed first.
        run_s: seconds from start to finish (or to the limit).
    """

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    run_s: float = 0.0


class Runner:
    """Runs tool callables with a hard reply time; one per worker process."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.abandoned_threads = 0

    def run_sync(self, func: Callable[[], Any], limit_s: float) -> Outcome:
        """Run ``func()`` on its own thread; give up waiting after ``limit_s`` seconds."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(func())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        started = time.monotonic()
        threading.Thread(target=target, name="toolfleet-tool", daemon=True).start()
        done, _ = concurrent.futures.wait([future], timeout=max(limit_s, 0.0))
        elapsed = time.monotonic() - started
        if not done:
            self.abandoned_threads += 1
            return Outcome(timed_out=True, run_s=elapsed)
        return _outcome_of(future, elapsed)

    def run_async(
        self, make_coro: Callable[[], Coroutine[Any, Any, Any]], limit_s: float
    ) -> Outcome:
        """Run the coroutine on the event-loop thread; cancel it after ``limit_s`` seconds."""
        loop = self._event_loop()
        started = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(_with_limit(make_coro, limit_s), loop)
        try:
            timed_out, value = future.result(timeout=limit_s + 1.0)
        except concurrent.futures.TimeoutError:
            # the coroutine ignored its cancellation: answer anyway, leave it behind
            future.cancel()
            return Outcome(timed_out=True, run_s=time.monotonic() - started)
        except BaseException as exc:  # noqa: BLE001 - the tool's own exception
            return Outcome(error=exc, run_s=time.monotonic() - started)
        return Outcome(value=value, timed_out=timed_out, run_s=time.monotonic() - started)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="toolfleet-event-loop", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop the event-loop thread (running coroutines are cancelled)."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


async def _with_limit(
    make_coro: Callable[[], Coroutine[Any, Any, Any]], limit_s: float
) -> tuple[bool, Any]:
    task = asyncio.ensure_future(make_coro())
    done, _ = await asyncio.wait({task}, timeout=max(limit_s, 0.0))
    if not done:
        task.cancel()
        return True, None
    return False, task.result()


def _outcome_of(future: concurrent.futures.Future[Any], elapsed: float) -> Outcome:
    error = future.exception()
    if error is not None:
        return Outcome(error=error, run_s=elapsed)
    return Outcome(value=future.result(), run_s=elapsed)
