"""What every runner shares: the outcome of a run and the handle that cancels it."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["KILL_MARGIN_S", "CallHandle", "ChildToolError", "Outcome", "wait_first"]

#: Seconds past the limit a ``process``-isolation call waits for pebble to report the kill
#: of its child (so its ``timeout`` reply may come that much after the limit).
KILL_MARGIN_S = 1.0


@dataclass(frozen=True)
class Outcome:
    """What running a tool produced.

    Attributes:
        value: the return value when the tool finished normally.
        error: the exception the tool raised, if any.
        timed_out: True when the time limit passed first.
        canceled: True when the call was canceled first.
        run_s: seconds from start to the end (or to the limit, or the cancellation).
    """

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    canceled: bool = False
    run_s: float = 0.0


class CallHandle:
    """Cancels one running call.

    Wakes the waiting worker thread and stops the tool where its isolation mode can
    (task cancel, child-process kill, ``context.canceled`` for a thread).
    """

    def __init__(self) -> None:
        self.canceled: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._callbacks: list[Callable[[], Any]] = []
        self._lock = threading.Lock()

    def on_cancel(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` when the call is canceled (at once if it already is)."""
        with self._lock:
            if not self.canceled.done():
                self._callbacks.append(callback)
                return
        callback()

    def cancel(self) -> bool:
        """Cancel; False when it was canceled already."""
        with self._lock:
            if self.canceled.done():
                return False
            self.canceled.set_result(True)
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        return True

    def canceled_within(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True when the call was canceled meanwhile."""
        try:
            return self.canceled.result(timeout=max(seconds, 0.0))
        except concurrent.futures.TimeoutError:
            return False

    @property
    def is_canceled(self) -> bool:
        """True once :meth:`cancel` ran."""
        return self.canceled.done()


def wait_first(
    future: concurrent.futures.Future[Any], handle: CallHandle | None, timeout_s: float
) -> str:
    """Wait for ``future``, a cancellation, or the timeout.

    Returns:
        ``"done"``, ``"canceled"`` or ``"timeout"``.
    """
    waiting: list[concurrent.futures.Future[Any]] = [future]
    if handle is not None:
        waiting.append(handle.canceled)
    done, _ = concurrent.futures.wait(
        waiting, timeout=max(timeout_s, 0.0), return_when=concurrent.futures.FIRST_COMPLETED
    )
    if future in done:
        return "done"
    if handle is not None and handle.canceled in done:
        return "canceled"
    return "timeout"


class ChildToolError(Exception):
    """An exception a tool raised inside a child process, carried back as text.

    Args:
        description: ``"ExcType: message"``.
        traceback_text: the formatted traceback from the child.
    """

    def __init__(self, description: str, traceback_text: str = "") -> None:
        super().__init__(description, traceback_text)
        self.description = description
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.description}\n{self.traceback_text}"
