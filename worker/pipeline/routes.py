"""Record a conversation's route in Redis before its reply goes out (session affinity).

The worker that serves a conversation's call to a tool with session affinity names its
slot queue in the result's ``route`` and records the route
(:mod:`toolfleet.shared.affinity`), so that the next call, from any producer process or
the MCP gateway, reaches this process. The record is written only when it changes: the
request's ``session_holder`` (what the producer read) is another process, or none. A
follow-up that found this process costs no command here; the producer's read refreshes
the record's lifetime.
"""

from __future__ import annotations

import logging

import redis

from toolfleet.shared.affinity import Route, encode_route
from toolfleet.shared.naming import route_key
from toolfleet.shared.wire import ToolCallRequest, ToolCallResult

__all__ = ["RouteRecorder"]

log = logging.getLogger("toolfleet.worker.routes")


class RouteRecorder:
    """Writes conversation routes for one worker process.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_id: this process, ``host:pid``.
        ttl_s: seconds a route is kept after its last call (``affinity_ttl_s``).
    """

    def __init__(self, client: redis.Redis, namespace: str, worker_id: str, ttl_s: int) -> None:
        self.client = client
        self.namespace = namespace
        self.worker_id = worker_id
        self.ttl_s = ttl_s

    def record(self, request: ToolCallRequest, result: ToolCallResult) -> bool:
        """Record the route ``result`` names for ``request``'s conversation, if it changed.

        One ``SET ... EX`` when the producer named another holder or none; nothing when
        the result names no route or this process was the holder already. A Redis failure
        is logged: the reply still goes out (the next call may start fresh, and says so).

        Returns:
            True when a record was written.
        """
        conversation = request.context.conversation
        if not result.route or not conversation or request.session_holder == self.worker_id:
            return False
        key = route_key(self.namespace, request.context.account, conversation, request.function)
        try:
            self.client.set(key, encode_route(Route(result.route, self.worker_id)), ex=self.ttl_s)
        except redis.RedisError as exc:
            log.warning("could not record the route of call %s: %s", request.id, exc)
            return False
        return True
