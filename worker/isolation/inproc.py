"""Run tools inside the worker process, under a hard reply time.

- ``async`` tools run on the process's event-loop thread; at the limit (or on cancel)
  their task is cancelled.
- Sync tools (isolation ``thread``) run on a daemon tool thread (reused when idle); at the
  limit the caller
  gets ``timeout`` at once and the thread is abandoned: Python cannot interrupt it from
  outside. A canceled thread tool sees ``context.canceled`` become true. Abandoned threads
  still running are counted (:attr:`InProcessRunner.stuck_threads`); a process with too
  many is drained and replaced by the supervisor. GIL-holding or CPU-bound code belongs
  in ``process`` isolation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from toolfleet.worker.isolation.base import CallHandle, Outcome, wait_first

__all__ = ["InProcessRunner", "ToolExit"]

#: Seconds an idle tool thread waits for another call before it exits.
IDLE_THREAD_S = 60.0

#: Seconds past the limit the worker thread waits for an ``async`` tool's cancellation to
#: land; a tool that blocks the event loop is answered ``timeout`` then anyway.
LOOP_MARGIN_S = 0.1


class InProcessRunner:
    """Runs tool callables on threads or the event loop; one per worker process."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._threads = _ToolThreads()
        self._loop_started = False

    @property
    def stuck_threads(self) -> int:
        """Tool threads still running a call whose caller gave up on it."""
        return self._threads.stuck

    def run_sync(
        self, func: Callable[[], Any], limit_s: float, handle: CallHandle | None = None
    ) -> Outcome:
        """Run ``func()`` on a tool thread; stop waiting at ``limit_s`` s or a cancel."""
        task = _Task(func)
        started = time.monotonic()
        self._threads.submit(task)
        how = wait_first(task.future, handle, limit_s)
        elapsed = time.monotonic() - started
        if how != "done":
            self._threads.abandon(task)
            return Outcome(timed_out=how == "timeout", canceled=how == "canceled", run_s=elapsed)
        error = task.future.exception()
        if error is not None:
            return Outcome(error=error, run_s=elapsed)
        return Outcome(value=task.future.result(), run_s=elapsed)

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


class _Task:
    """One sync tool call handed to a tool thread.

    It runs in the caller's context: the call's log fields and trace span, as an ``async``
    tool's task gets them on the loop.
    """

    __slots__ = ("abandoned", "context", "func", "future")

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func
        self.context = contextvars.copy_context()
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.abandoned = False

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.context.run(self.func))
        except (SystemExit, KeyboardInterrupt) as exc:
            self.future.set_exception(ToolExit(f"the tool raised {type(exc).__name__}"))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.future.set_exception(exc)


class _ToolThreads:
    """Daemon threads for sync tools, reused when idle.

    A call whose caller gave up (time limit, cancel) keeps its thread until the tool
    returns, if ever; it counts as stuck meanwhile and new calls get other threads.
    Threads idle for ``IDLE_THREAD_S`` exit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._idle = 0
        self._stuck: set[int] = set()

    @property
    def stuck(self) -> int:
        with self._lock:
            return len(self._stuck)

    def submit(self, task: _Task) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._tasks.put(task)
                return
        threading.Thread(
            target=self._work, args=(task,), name="toolfleet-tool", daemon=True
        ).start()

    def abandon(self, task: _Task) -> None:
        with self._lock:
            task.abandoned = True
            if not task.future.done():
                self._stuck.add(id(task))

    def _work(self, task: _Task) -> None:
        while True:
            task.run()
            with self._lock:
                self._stuck.discard(id(task))
                self._idle += 1
            try:
                task = self._tasks.get(timeout=IDLE_THREAD_S)
            except queue.Empty:
                with self._lock:
                    try:
                        task = self._tasks.get_nowait()  # handed over as the wait ended
                    except queue.Empty:
                        self._idle -= 1
                        return


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
