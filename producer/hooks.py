"""Lifecycle signals in the calling application's process (``toolfleet.shared.signals``).

Workers fire ``tool_requested`` and ``tool_responded`` where the tool runs; a producer
fires them too, in the host application's process, so a chat platform can hook a call's
life without reading the event stream (like Smarter's ``llm_tool_requested`` /
``llm_tool_responded``):

- ``tool_requested`` when a call is handed to the fleet (before it is published);
- ``tool_responded`` when its result arrives (or the producer resolves it itself:
  timeout, cancel, closed client).

A call the producer answers itself before publishing (``unknown_function``,
``not_available``, ``rejected``: :mod:`toolfleet.producer._core.calls`) fires both, at
once, ``tool_responded`` with that status, so a host sees every call it made.

Both carry ``side="producer"`` (worker events carry no ``side``), ``id``, ``function``,
``account``, ``tool_call_id``; ``tool_responded`` adds ``status``, ``queued_s``,
``run_s``, ``worker`` and ``error``. Arguments and results read ``[redacted]``: the
producer does not know which extensions opt in to payloads. A subscriber that raises
is logged, never propagated.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from blinker import NamedSignal

from toolfleet.shared.signals import REDACTED, tool_requested, tool_responded
from toolfleet.shared.wire import CallContext, ToolCallRequest, ToolCallResult

__all__ = ["fire_refused", "fire_requested", "fire_responded"]

log = logging.getLogger("toolfleet.producer.hooks")


def fire_requested(request: ToolCallRequest) -> None:
    """Fire ``tool_requested`` for a call about to be published."""
    if not tool_requested.receivers:  # nobody listens: the event is not even built
        return
    _fire(
        tool_requested,
        request.function,
        id=request.id,
        tool_call_id=request.tool_call_id,
        account=request.context.account,
        traceparent=request.context.traceparent,
        arguments=REDACTED,
    )


def fire_refused(result: ToolCallResult, context: CallContext) -> ToolCallResult:
    """Fire ``tool_requested`` then ``tool_responded`` for a call answered before publishing.

    Args:
        result: the producer's own answer (its ``status`` is what ``tool_responded`` says).
        context: the call's context (its ``account`` and ``traceparent``).

    Returns:
        ``result``, to settle the call's future with.
    """
    _fire(
        tool_requested,
        result.function,
        id=result.id,
        tool_call_id=result.tool_call_id,
        account=context.account,
        traceparent=context.traceparent,
        arguments=REDACTED,
    )
    fire_responded(result, context.account)
    return result


def fire_responded(result: ToolCallResult, account: str | None) -> None:
    """Fire ``tool_responded`` for a call whose result just resolved its future."""
    if not tool_responded.receivers:
        return
    _fire(
        tool_responded,
        result.function,
        id=result.id,
        tool_call_id=result.tool_call_id,
        account=account,
        status=result.status.value,
        queued_s=result.queued_s,
        run_s=result.run_s,
        worker=result.worker,
        result=REDACTED if result.ok else None,
        error=None if result.ok else result.error,
    )


def _fire(signal: NamedSignal, function: str, **event: Any) -> None:
    if not signal.receivers:
        return
    try:
        signal.send(
            function, kind=signal.name, side="producer", at=time.time(), function=function, **event
        )
    except Exception:  # noqa: BLE001 - a hook never breaks a call
        log.exception("a %s subscriber failed", signal.name)
