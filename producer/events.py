"""``CallEvent``: what a caller streaming a turn sees of each call, as it happens.

One call's events come in this order, each at most once except ``progress``::

    preparing   (only from ``client.preparing(function, partial_arguments)``, which a
                caller assembling streamed arguments asks for itself, before the call
                exists) ``description`` is the tool's preparation description with the
                partial arguments filled in; ``call_id`` is ``""``
    queued      published to its queue (absent when the producer answered the call itself:
                unknown function, no live worker, malformed call, queue full)
    running     a worker started the tool; ``description`` is the tool's
                ``running_description(arguments)``, e.g. "Fetching weather for Paris…"
    progress    the tool called ``context.progress("...")`` (throttled by the worker to a
                few per second); ``description`` is its message
    result      the terminal result; ``description`` is the tool's ``completed_description``
                or ``canceled_description`` when it defines one

Exactly one ``result`` per call, always last.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from toolfleet.shared.preparing import preparation_text
from toolfleet.shared.wire import Status, ToolCallResult

__all__ = ["CallEvent", "EventKind", "preparing_event"]

#: The kinds of :class:`CallEvent`, in the order one call goes through them.
EventKind = Literal["preparing", "queued", "running", "progress", "result"]


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One status change of one call of a turn.

    Attributes:
        kind: ``preparing``, ``queued``, ``running``, ``progress`` or ``result``.
        index: the call's position among the turn's tool calls (0-based), the order of
            the messages ``dispatch`` returns; tells apart calls that share a
            ``tool_call_id`` (only the first of which runs).
        call_id: the request id (a UUID, ``ToolCallResult.id``; what ``cancel`` takes).
        tool_call_id: the model's id for the call (``""`` when the model gave none).
        function: the function name the model called.
        description: UI text: the running description, the progress message, or the
            completed/canceled description; ``None`` when the tool defines none.
        at: Unix epoch seconds when it happened (the worker's clock for ``running`` and
            ``progress``, this client's for ``queued`` and ``result``).
        received_at: Unix epoch seconds when this client received it.
        result: the terminal :class:`ToolCallResult` (``result`` events only).
        message: the ready-to-append tool message for this call in the turn's format
            (``result`` events only; ``None`` for a call whose ``tool_call_id`` an earlier
            call of the turn has, answered ``rejected``); see
            :func:`toolfleet.producer.turns.result_message`.
    """

    kind: EventKind
    index: int
    call_id: str
    tool_call_id: str
    function: str
    at: float
    received_at: float
    description: str | None = None
    result: ToolCallResult | None = None
    message: dict[str, Any] | None = None

    @property
    def status(self) -> Status | None:
        """The result's status (``result`` events), else ``None``."""
        return self.result.status if self.result is not None else None


def preparing_event(
    entry: Mapping[str, Any] | None,
    function: str,
    partial: str | Mapping[str, Any] | None,
    *,
    tool_call_id: str | None = None,
    index: int = 0,
) -> CallEvent:
    """The ``preparing`` event of a call the model is still writing.

    Args:
        entry: the function's catalog entry (``None`` when unknown: no description).
        function: the function name streamed so far.
        partial: the argument text streamed so far.
        tool_call_id: the model's id for the call, if known yet.
        index: the call's position in the turn.

    Returns:
        A :class:`CallEvent` of kind ``preparing``; ``description`` is ``None`` when the
        tool has no preparation description.
    """
    now = time.time()
    template = entry.get("preparation") if entry is not None else None
    return CallEvent(
        kind="preparing",
        index=index,
        call_id="",
        tool_call_id=tool_call_id or "",
        function=function,
        at=now,
        received_at=now,
        description=preparation_text(template if isinstance(template, str) else None, partial),
    )
