"""Session affinity: a conversation's next calls go to the worker process that holds its state.

Some tools keep state in the worker process that served a conversation (the ``python``
tool's interpreter holds the model's variables). Their catalog entry says
``"affinity": "conversation"``. The worker that serves such a call names, in the
result's ``route``, a queue only that worker slot consumes (``<queue>.slot.<slot>``,
see :func:`toolfleet.shared.naming.affinity_queue_for`). :class:`Routes` remembers it
per account and conversation, and :meth:`Routes.route` sends the conversation's next
calls there while a live worker serves that queue (its heartbeats are read with the
catalog, :meth:`Routes.queues`). When none does (the process stopped, its pod went
away), the call goes to the tool's own queue and any worker takes it: it starts fresh
state and says so (the ``python`` tool notes a fresh interpreter). A supervised process
that dies is replaced in the same slot, and its replacement serves the slot's queue, so
calls already routed there are answered, not stranded.

Calls without ``context.conversation`` are never routed. The memory is a bounded LRU
(:data:`MAX_CONVERSATIONS`); thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from toolfleet.producer.catalog import Catalog
from toolfleet.shared.wire import ToolCallRequest, ToolCallResult

__all__ = ["MAX_CONVERSATIONS", "Routes", "learn_route"]

#: Conversations whose route one client remembers (least recently used forgotten first).
MAX_CONVERSATIONS = 10_000

_Key = tuple[str | None, str, str]


class Routes:
    """Where each conversation's affinity calls go (one per client)."""

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS) -> None:
        self._routes: OrderedDict[_Key, str] = OrderedDict()
        self._max = max_conversations
        self._lock = threading.Lock()

    def route(self, request: ToolCallRequest, catalog: Catalog, queue: str) -> str:
        """The queue to publish ``request`` on: its conversation's route, or ``queue``.

        Args:
            request: the call.
            catalog: the snapshot the call was admitted with.
            queue: the function's own queue.

        Returns:
            The remembered route while a worker serves it (or while the snapshot has not
            checked it yet: it was learned from a reply moments ago); ``queue`` otherwise,
            and the route is forgotten.
        """
        key = _key(request)
        if key is None or not _has_affinity(catalog.entries.get(request.function)):
            return queue
        with self._lock:
            route = self._routes.get(key)
            if route is None:
                return queue
            if route in catalog.queue_lengths and route not in catalog.live_queues:
                del self._routes[key]  # its worker is gone: any worker starts afresh
                return queue
            self._routes.move_to_end(key)
            return route

    def learn(self, request: ToolCallRequest, result: ToolCallResult) -> None:
        """Remember the route a result names for its conversation and function.

        A result without a route that a worker sent (it ran elsewhere, or the tool has no
        affinity) forgets the old one; a result the producer made itself (``worker`` is
        empty: timeout, cancel) leaves it.
        """
        key = _key(request)
        if key is None:
            return
        with self._lock:
            if result.route:
                self._routes[key] = result.route
                self._routes.move_to_end(key)
                while len(self._routes) > self._max:
                    self._routes.popitem(last=False)
            elif result.worker:
                self._routes.pop(key, None)

    def queues(self) -> set[str]:
        """Every route remembered now (their liveness is read with the catalog)."""
        with self._lock:
            return set(self._routes.values())


def _key(request: ToolCallRequest) -> _Key | None:
    conversation = request.context.conversation
    if not conversation:
        return None
    return (request.context.account, conversation, request.function)


def _has_affinity(entry: dict[str, Any] | None) -> bool:
    return entry is not None and entry.get("affinity") == "conversation"


def learn_route(routes: Routes, request: ToolCallRequest, future: Any) -> None:
    """Done-callback of a conversation's call: learn the route its result names."""
    if future.cancelled():
        return
    try:
        result = future.result()
    except Exception:  # noqa: BLE001 - a failed future names no route
        return
    if isinstance(result, ToolCallResult):
        routes.learn(request, result)
