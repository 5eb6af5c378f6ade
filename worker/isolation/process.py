"""Run tools in killable child processes (isolation ``process``), with ``pebble``.

A pool of children per worker process, one slot per worker thread. A call past its
limit, or canceled, has its child killed at once and the slot is refilled by the pool;
the worker is never blocked by the tool's code, whatever it does (GIL-holding C code,
busy loops, ``os._exit``). Children are forked from a ``forkserver`` that preloads
toolfleet and the extensions' modules, so a replacement child is ready in milliseconds
instead of re-importing everything.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import time
from typing import Any

import pebble

from toolfleet.worker.isolation.base import (
    KILL_MARGIN_S,
    CallHandle,
    ChildToolError,
    Outcome,
    wait_first,
)
from toolfleet.worker.isolation.child import call_in_child, init_child, ping

__all__ = ["ProcessRunner"]

log = logging.getLogger("toolfleet.worker.isolation")


class ProcessRunner:
    """A pool of tool child processes.

    Args:
        max_workers: children (one per worker thread).
        init_args: arguments of :func:`~.child.init_child` (extension specs, entry
            points flag, log level; settings travel in the environment).
        preload: module names the forkserver imports once for every child.
    """

    def __init__(self, max_workers: int, init_args: tuple[Any, ...], preload: list[str]) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(
            [
                "toolfleet.worker.isolation.forkserver_lifeline",  # first: before any import
                "toolfleet.worker.isolation.child",
                *preload,
            ]
        )
        self.pool = pebble.ProcessPool(
            max_workers=max_workers, initializer=init_child, initargs=init_args, context=context
        )
        self.max_workers = max_workers

    def warm_up(self, timeout_s: float = 60.0) -> None:
        """Start every child now, so a first call does not pay for the start-up."""
        futures = [self.pool.schedule(ping) for _ in range(self.max_workers)]
        concurrent.futures.wait(futures, timeout=timeout_s)

    def run(
        self,
        function: str,
        arguments: dict[str, Any],
        context_fields: dict[str, Any],
        switch_states: dict[str, bool],
        limit_s: float,
        handle: CallHandle | None = None,
    ) -> Outcome:
        """Run one call in a child; kill the child at ``limit_s`` seconds or on cancel."""
        started = time.monotonic()
        future = self.pool.schedule(
            call_in_child,
            args=(function, arguments, context_fields, switch_states),
            timeout=max(limit_s, 0.001),
        )
        if handle is not None:
            handle.on_cancel(future.cancel)
        how = wait_first(future, handle, limit_s + KILL_MARGIN_S)
        elapsed = time.monotonic() - started
        if how == "canceled" or (how == "done" and future.cancelled()):
            return Outcome(canceled=True, run_s=elapsed)
        if how == "timeout":
            future.cancel()  # type: ignore[no-untyped-call]
            return Outcome(timed_out=True, run_s=elapsed)
        error = future.exception()
        if isinstance(error, concurrent.futures.TimeoutError):
            return Outcome(timed_out=True, run_s=elapsed)
        if isinstance(error, pebble.ProcessExpired):
            return Outcome(
                error=ChildToolError(f"the tool's process died (exit code {error.exitcode})"),
                run_s=elapsed,
            )
        if error is not None:
            return Outcome(error=error, run_s=elapsed)
        return Outcome(value=future.result(), run_s=elapsed)

    def close(self) -> None:
        """Stop every child."""
        self.pool.stop()  # type: ignore[no-untyped-call]
        self.pool.join(timeout=5)
