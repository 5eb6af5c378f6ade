"""Run tools inside the worker process, under a hard reply time.

- ``async`` tools run on the process's event-loop thread; at the limit (or on cancel)
  their task is cancelled.
- Sync tools (isolation ``thread``) run on the worker's slot thread that took the call
  (:meth:`InProcessRunner.run_inline`, no hand-off) when the worker's loop can replace
  that thread: at the limit (or on cancel) the process's timer has a fresh thread answer
  ``timeout`` (``canceled``) and take the slot; the abandoned thread's late result is
  dropped and the thread ends (:class:`Abandoned`). Elsewhere (a caller that is no slot
  thread, a tool with retries, limits or a breaker) they run on a daemon tool thread
  (reused when idle); at the limit the caller gets ``timeout`` at once and the thread is
  abandoned. Python cannot interrupt a thread from outside. A canceled thread tool sees
  ``context.canceled`` become true. Abandoned threads still running are counted
  (:attr:`InProcessRunner.stuck_threads`); a process with too many is drained and
  replaced by the supervisor. GIL-holding or CPU-bound code belongs in ``process``
  isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from toolfleet.worker.isolation.base import CallHandle, Outcome, wait_first

__all__ = ["Abandoned", "InProcessRunner", "ToolExit", "mark_slot_thread"]

log = logging.getLogger("toolfleet.worker.inproc")

#: Seconds an idle tool thread waits for another call before it exits.
IDLE_THREAD_S = 60.0

#: Seconds past the limit the worker thread waits for an ``async`` tool's cancellation to
#: land; a tool that blocks the event loop is answered ``timeout`` then anyway.
LOOP_MARGIN_S = 0.1


class Abandoned(BaseException):  # noqa: N818 - what happened to the thread, not an error
    """Raised in a slot thread whose call was answered without it (it overran or was canceled).

    Its tool returned at last; a fresh thread answered the call and took its slot, so the
    thread unwinds (skipping every ``except Exception``) and ends.
    """


_slot = threading.local()


def mark_slot_thread() -> None:
    """Mark the calling thread as one the worker's loop replaces when its tool overruns."""
    _slot.replaceable = True


class InProcessRunner:
    """Runs tool callables on threads or the event loop; one per worker process.

    Attributes:
        on_abandon: ``on_abandon(first, thread)`` starts a fresh slot thread that runs
            ``first()`` (the answer of an overrun or canceled call) and then serves in
            place of ``thread``; set by the worker's loop. ``None``: no sync tool runs
            inline.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._threads = _ToolThreads()
        self._loop_started = False
        self.on_abandon: Callable[[Callable[[], None], threading.Thread], None] | None = None
        self._timer: _Timer | None = None
        self._inline_stuck = 0

    @property
    def stuck_threads(self) -> int:
        """Threads still running a call whose caller gave up on it (tool or slot threads)."""
        return self._threads.stuck + self._inline_stuck

    def can_run_inline(self) -> bool:
        """True when the calling thread is a slot thread the loop can replace."""
        return self.on_abandon is not None and getattr(_slot, "replaceable", False)

    def run_inline(
        self,
        func: Callable[[], Any],
        limit_s: float,
        handle: CallHandle | None,
        answer: Callable[[Outcome], None],
    ) -> Outcome:
        """Run ``func()`` on this (slot) thread, with no hand-off.

        At ``limit_s`` seconds or a cancel, the timer has a fresh thread call
        ``answer(outcome)`` (``timed_out`` or ``canceled``) and take this thread's slot
        (:attr:`on_abandon`); once ``func`` returns, this thread raises :class:`Abandoned`.

        Raises:
            Abandoned: the call was answered without this thread.
        """
        on_abandon = self.on_abandon
        if on_abandon is None:
            raise RuntimeError("no loop replaces this thread")
        run = _InlineRun(threading.current_thread())
        timer = self._timer_started()

        def fire() -> None:  # on the timer thread
            if not run.abandon():
                return  # it finished first
            with self._lock:
                self._inline_stuck += 1
            canceled = handle is not None and handle.is_canceled
            outcome = Outcome(
                timed_out=not canceled, canceled=canceled, run_s=time.monotonic() - run.started
            )
            on_abandon(lambda: answer(outcome), run.thread)

        timer.add(run, run.started + max(limit_s, 0.0), fire)
        if handle is not None:
            handle.on_cancel(lambda: timer.now(run))
        value: Any = None
        error: BaseException | None = None
        try:
            value = func()
        except (SystemExit, KeyboardInterrupt) as exc:
            error = ToolExit(f"the tool raised {type(exc).__name__}")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error = exc
        if not run.finish():
            with self._lock:
                self._inline_stuck -= 1
            raise Abandoned
        timer.discard(run)
        return Outcome(value=value, error=error, run_s=time.monotonic() - run.started)

    def _timer_started(self) -> _Timer:
        timer = self._timer
        if timer is None:
            with self._lock:
                if self._timer is None:
                    self._timer = _Timer()
                timer = self._timer
        return timer

    def run_sync(
        self, func: Callable[[], Any], limit_s: float, handle: CallHandle | None = None
    ) -> Outcome:
        """Run ``func()`` on a tool thread; stop waiting at ``limit_s`` s or a cancel."""
        task = _Task(func)
        started = time.monotonic()
        if handle is not None:
            handle.on_cancel(task.wake)
        self._threads.submit(task)
        task.signal.acquire(timeout=max(limit_s, 0.0))  # woken by the end or a cancel
        elapsed = time.monotonic() - started
        if not task.finished:
            self._threads.abandon(task)
            canceled = handle is not None and handle.is_canceled
            return Outcome(timed_out=not canceled, canceled=canceled, run_s=elapsed)
        if task.error is not None:
            return Outcome(error=task.error, run_s=elapsed)
        return Outcome(value=task.value, run_s=elapsed)

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
    tool's task gets them on the loop. ``signal`` is a lock held until the tool ends or
    the call is canceled (:meth:`wake`): the caller waits by acquiring it, a cheaper
    rendezvous than a future and ``concurrent.futures.wait``.
    """

    __slots__ = ("abandoned", "context", "error", "finished", "func", "signal", "value")

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func
        self.context = contextvars.copy_context()
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.abandoned = False
        self.signal = threading.Lock()
        self.signal.acquire()

    def wake(self) -> None:
        """Wake the caller (the tool ended, or the call was canceled); idempotent."""
        with contextlib.suppress(RuntimeError):  # released already
            self.signal.release()

    def run(self) -> None:
        try:
            self.value = self.context.run(self.func)
        except (SystemExit, KeyboardInterrupt) as exc:
            self.error = ToolExit(f"the tool raised {type(exc).__name__}")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        self.finished = True
        self.wake()


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
            if not task.finished:
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


class _InlineRun:
    """One inline run: finished by its thread or abandoned by the timer, whichever is first."""

    __slots__ = ("_lock", "_state", "started", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._state = 0  # 0 running, 1 finished, 2 abandoned

    def _settle(self, state: int) -> bool:
        with self._lock:
            if self._state:
                return False
            self._state = state
            return True

    def finish(self) -> bool:
        """The tool returned; False when the timer abandoned the run first."""
        return self._settle(1)

    def abandon(self) -> bool:
        """The limit passed or the call was canceled; False when the run finished first."""
        return self._settle(2)


class _Timer:
    """The process's timer of inline runs: one thread, a heap of limits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _InlineRun]] = []
        self._due: dict[_InlineRun, tuple[float, Callable[[], None]]] = {}
        self._order = itertools.count()
        threading.Thread(target=self._run, name="toolfleet-timer", daemon=True).start()

    def add(self, key: _InlineRun, when: float, fire: Callable[[], None]) -> None:
        """Call ``fire()`` at ``when`` (monotonic seconds) unless discarded first."""
        with self._cond:
            self._due[key] = (when, fire)
            heapq.heappush(self._heap, (when, next(self._order), key))
            if len(self._heap) > 2 * len(self._due) + 64:  # drop the discarded ones
                self._heap = [(w, next(self._order), k) for k, (w, _) in self._due.items()]
                heapq.heapify(self._heap)
            if self._heap[0][2] is key:
                self._cond.notify()

    def now(self, key: _InlineRun) -> None:
        """Fire ``key`` now (a cancel), if it is still due."""
        with self._cond:
            found = self._due.get(key)
            if found is None:
                return
            when = time.monotonic()
            self._due[key] = (when, found[1])
            heapq.heappush(self._heap, (when, next(self._order), key))
            self._cond.notify()

    def discard(self, key: _InlineRun) -> None:
        """Forget ``key`` (its run finished)."""
        with self._cond:
            self._due.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                fire = self._next()
            try:
                fire()
            except Exception:  # noqa: BLE001 - the timer outlives any one answer
                log.exception("could not answer an overrun call")

    def _next(self) -> Callable[[], None]:
        """Wait for the next due entry; return its ``fire`` (called with the lock held)."""
        while True:
            if not self._heap:
                self._cond.wait()
                continue
            when, _, key = self._heap[0]
            found = self._due.get(key)
            if found is None or found[0] != when:
                heapq.heappop(self._heap)  # discarded, or moved earlier
                continue
            delay = when - time.monotonic()
            if delay > 0:
                self._cond.wait(delay)
                continue
            heapq.heappop(self._heap)
            del self._due[key]
            return found[1]


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
