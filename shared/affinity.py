"""Session affinity across producers: a conversation's route lives in Redis.

A tool with session affinity (``Tool.affinity = "conversation"``, e.g. the ``python``
tool's interpreter) keeps a conversation's state in the worker process that served it.
That process names, in each result's ``route``, a queue only its slot consumes
(:func:`toolfleet.shared.naming.affinity_queue_for`), and records the conversation's
:class:`Route` in Redis (:func:`toolfleet.shared.naming.route_key`, per account,
conversation and function) before it posts the reply, so that any producer process and
the MCP gateway send the next call there. The record lives ``affinity_ttl_s`` seconds
after the conversation's last call to the function (the producer's read refreshes it).

A producer that reads a route tells the worker which process held the session
(``ToolCallRequest.session_holder``). When the route's slot has no live worker the call
goes to the tool's own queue; the process that takes it, or the replacement of a
process that died in the same slot, is not the holder, and the tool is told why its
state is gone (:func:`session_lost_reason`, ``ExtensionContext.session_lost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Route", "decode_route", "encode_route", "session_lost_reason"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a conversation's session lives.

    Attributes:
        queue: the slot queue only the holding process's slot consumes.
        worker: the holding process, ``host:pid``.
    """

    queue: str
    worker: str


def encode_route(route: Route) -> bytes:
    """The record's value: ``{"queue": ..., "worker": ...}`` as JSON."""
    return orjson.dumps({"queue": route.queue, "worker": route.worker})


def decode_route(raw: Any) -> Route | None:
    """The route a record holds; ``None`` for none, or for a value that is not a route."""
    if raw is None:
        return None
    try:
        data = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    queue, worker = data.get("queue"), data.get("worker")
    if not isinstance(queue, str) or not isinstance(worker, str) or not queue or not worker:
        return None
    return Route(queue, worker)


def session_lost_reason(holder: str | None, worker_id: str) -> str | None:
    """Why a call starts fresh state: the process ``holder`` that held it is not this one.

    Args:
        holder: the request's ``session_holder`` (``None``: no earlier session known).
        worker_id: this process, ``host:pid``.

    Returns:
        A sentence a tool passes on to the model, or ``None`` when this process is the
        holder (or none is known).
    """
    if not holder or holder == worker_id:
        return None
    return f"the worker process that held it ({holder}) is gone"
