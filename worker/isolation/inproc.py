"""Run tools inside the worker process, under a hard reply time.

- ``async`` tools run on the process's event-loop thread; at the limit (or on cancel)
  their task is cancelled.
- Sync tools (isolation ``thread``) run on a fresh daemon thread; at the limit the caller
  gets ``timeout`` at once and the thread is abandoned: Python cannot interrupt it from
  outside. A canceled thread tool sees ``context.canceled`` become true. Abandoned threads
  still running are counted (:attr:`InProcessRunner.stuck_threads`); a process with too
  many is drained and replaced by the supervisor. GIL-holding or CPU-bound code belongs
  in ``process`` isolation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from toolfleet.worker.isolation.base import CallHandle, Outcome, wait_first

__all__ = ["InProcessRunner", "ToolExit"]

#: Seconds past the limit the worker thread waits for an ``async`` tool's cancellation to
#: land; a tool that blocks the event loop is answered ``timeout`` then anyway.
LOOP_MARGIN_S = 0.1


class InProcessRunner:
    """Runs tool callables on threads or the event loop; one per worker process."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._abandoned: list[threading.Thread] = []
        self._loop_started = False
        self.abandoned_total = 0

    @property
    def stuck_threads(self) -> int:
        """Abandoned tool threads that are still running."""
        with self._lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            return len(self._abandoned)

    def run_sync(
        self, func: Callable[[], Any], limit_s: float, handle: CallHandle | None = None
    ) -> Outcome:
        """Run ``func()`` on its own thread; stop waiting at ``limit_s`` s or a cancel."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(func())
            except (SystemExit, KeyboardInterrupt) as exc:
                future.set_exception(ToolExit(f"the tool raised {type(exc).__name__}"))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        started = time.monotonic()
        thread = threading.Thread(target=target, name="toolfleet-tool", daemon=True)
        thread.start()
        how = wait_first(future, handle, limit_s)
        elapsed = time.monotonic() - started
        if how != "done":
            with self._lock:
                self._abandoned.append(thread)
                self.abandoned_total += 1
            return Outcome(timed_out=how == "timeout", canceled=how == "canceled", run_s=elapsed)
        error = future.exception()
        if error is not None:
            return Outcome(error=error, run_s=elapsed)
        return Outcome(value=future.result(), run_s=elapsed)

    def run_async(
        self,
        make_coro: Callable[[], Coroutine[Any, Any, Any]],
        limit_s: float,
        handle: CallHandle | None = None,
    ) -> Outcome:
        """Run the coroutine on the event-loop thread; cancel it at ``limit_s`` s or a cancel."""
        loop = self._event_loop()
        started = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(_with_limit(make_coro, limit_s), loop)
        if handle is not None:
            handle.on_cancel(future.cancel)
        how = wait_first(future, handle, limit_s + LOOP_MARGIN_S)
        elapsed = time.monotonic() - started
        if how == "canceled" or (how == "done" and future.cancelled()):
            return Outcome(canceled=True, run_s=elapsed)
        if how == "timeout":  # the coroutine ignored its cancellation: answer anyway
            future.cancel()
            return Outcome(timed_out=True, run_s=elapsed)
        error = future.exception()
        if error is not None:
            return Outcome(error=error, run_s=elapsed)
        timed_out, value = future.result()
        return Outcome(value=value, timed_out=timed_out, run_s=elapsed)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and not self._loop.is_running() and self._loop_started:
                self._loop = None  # the loop thread died; start a new one
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="toolfleet-event-loop", daemon=True
                )
                thread.start()
                self._loop = loop
                self._loop_started = True
            return self._loop

    def loop_lag_s(self, timeout_s: float = 1.0) -> float:
        """Seconds the event loop took to run a no-op.

        ``timeout_s`` when it did not run in time (an ``async`` tool is blocking the loop);
        0.0 when no loop runs.
        """
        with self._lock:
            loop = self._loop
        if loop is None:
            return 0.0
        ran = threading.Event()
        started = time.monotonic()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:
            return 0.0
        if not ran.wait(timeout_s):
            return timeout_s
        return time.monotonic() - started

    def close(self) -> None:
        """Stop the event-loop thread (running coroutines are abandoned)."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


class ToolExit(Exception):  # noqa: N818 - names what the tool did
    """A tool raised ``SystemExit`` or ``KeyboardInterrupt``.

    Contained as an ordinary exception so that it cannot stop the process's event loop.
    """


async def _guarded(make_coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        return await make_coro()
    except (SystemExit, KeyboardInterrupt) as exc:
        raise ToolExit(f"the tool raised {type(exc).__name__}") from None


async def _with_limit(
    make_coro: Callable[[], Coroutine[Any, Any, Any]], limit_s: float
) -> tuple[bool, Any]:
    task = asyncio.ensure_future(_guarded(make_coro))
    try:
        done, _ = await asyncio.wait({task}, timeout=max(limit_s, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        return True, None
    return False, task.result()
