"""Session affinity: a conversation's next calls go to the worker process that holds its state.

Some tools keep state in the worker process that served a conversation (the ``python``
tool's interpreter holds the model's variables); their catalog entry says
``"affinity": "conversation"``. The worker that serves such a call records the
conversation's route in Redis (:mod:`toolfleet.shared.affinity`): the queue only its
slot consumes and its own id. Every producer process, and the MCP gateway, read it
before publishing the conversation's next call, one ``GETEX`` (which also keeps the
route ``affinity_ttl_s`` longer) per call that carries a conversation and calls a tool
with affinity; no other call pays anything.

The call goes to the route's queue while a live worker serves it (the slot's heartbeats,
read with the catalog: :class:`SlotWatch` lists the slot queues this process has met,
and a slot met for the first time is checked at once, one ``ZCOUNT``). When none does
(the process stopped, its pod went away), the call goes to the tool's own queue and any
worker takes it. Either way the request names the process the route named
(``session_holder``): a process that is not it, the replacement of a process that died
in the same slot included, starts fresh state and says why (the ``python`` tool notes a
fresh interpreter whose predecessor's process is gone).

Calls without ``context.conversation`` are never routed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Set
from typing import Any

from toolfleet.producer.catalog import Catalog
from toolfleet.shared.affinity import Route
from toolfleet.shared.naming import route_key
from toolfleet.shared.wire import ToolCallRequest

__all__ = ["MAX_SLOTS", "SlotWatch", "route_key_of", "routed", "unchecked"]

#: Slot queues whose liveness one client reads with the catalog (least recent dropped).
MAX_SLOTS = 1024


class SlotWatch:
    """The slot queues this client has met in routes, whose liveness each catalog read fetches.

    Thread-safe and bounded (:data:`MAX_SLOTS`, least recently met forgotten first).
    """

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self._queues: OrderedDict[str, None] = OrderedDict()
        self._max = max_slots
        self._lock = threading.Lock()

    def add(self, queues: Iterable[str]) -> None:
        """Watch ``queues`` too."""
        with self._lock:
            for queue in queues:
                self._queues[queue] = None
                self._queues.move_to_end(queue)
            while len(self._queues) > self._max:
                self._queues.popitem(last=False)

    def queues(self) -> set[str]:
        """Every slot queue watched now (the catalog reader's ``watch``)."""
        with self._lock:
            return set(self._queues)


def route_key_of(request: ToolCallRequest, catalog: Catalog, namespace: str) -> str | None:
    """The Redis key of ``request``'s route; ``None`` when the call is not routed.

    Routed: a call with a conversation to a function whose catalog entry has affinity.
    """
    conversation = request.context.conversation
    if not conversation or not _has_affinity(catalog.entries.get(request.function)):
        return None
    return route_key(namespace, request.context.account, conversation, request.function)


def unchecked(routes: Iterable[Route | None], catalog: Catalog) -> list[str]:
    """The slot queues of ``routes`` whose liveness ``catalog`` did not read."""
    return sorted(
        {r.queue for r in routes if r is not None and r.queue not in catalog.queue_lengths}
    )


def routed(
    request: ToolCallRequest, route: Route | None, queue: str, live: Set[str]
) -> tuple[str, ToolCallRequest]:
    """Where ``request`` goes, and the request naming its session's holder.

    Args:
        request: the call, admitted.
        route: its conversation's route, or ``None``.
        queue: the function's own queue.
        live: the queues with a live worker (the catalog's, and those just checked).

    Returns:
        ``(route.queue, request with session_holder)`` while the route's slot is live;
        ``(queue, request with session_holder)`` when it is not (a fresh session, which
        says so); ``(queue, request)`` without a route.
    """
    if route is None:
        return queue, request
    named = request.model_copy(update={"session_holder": route.worker})
    return (route.queue if route.queue in live else queue), named


def _has_affinity(entry: dict[str, Any] | None) -> bool:
    return entry is not None and entry.get("affinity") == "conversation"
