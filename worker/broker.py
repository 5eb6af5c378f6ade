"""Build the Dramatiq broker a worker process uses."""

from __future__ import annotations

from typing import Any

import redis
from dramatiq import Middleware
from dramatiq.middleware import CurrentMessage, ShutdownNotifications

from toolfleet.worker.consumer import FleetRedisBroker

__all__ = ["ThrowsOption", "make_broker", "redis_client"]


class ThrowsOption(Middleware):
    """Declares Dramatiq's ``throws`` actor option (normally brought by ``Retries``).

    toolfleet runs without Dramatiq's ``Retries`` (its default of 20 retries would
    run a tool with side effects again) and without its ``TimeLimit`` (it cannot
    interrupt a blocking call; the toolkit enforces limits itself).
    """

    @property
    def actor_options(self) -> set[str]:
        """The options this middleware lets actors declare."""
        return {"throws"}


def redis_client(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for ``url`` (``redis://``, ``rediss://`` or ``unix://``)."""
    return redis.Redis.from_url(url, **options)


def make_broker(
    url: str, namespace: str, middleware: list[Middleware] | None = None
) -> FleetRedisBroker:
    """A Redis broker for ``url`` with every key under ``namespace``.

    Args:
        url: Redis URL.
        namespace: key prefix (Dramatiq's ``namespace``).
        middleware: extra middleware added after toolfleet's own set.
    """
    stack: list[Middleware] = [ThrowsOption(), CurrentMessage(), ShutdownNotifications()]
    return FleetRedisBroker(  # type: ignore[no-untyped-call]
        client=redis_client(url, health_check_interval=30),
        namespace=namespace,
        middleware=stack + list(middleware or []),
    )
