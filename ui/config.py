"""How an ops page application is set up: :class:`UiConfig`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from toolfleet.ui.auth import AuthCallback, Sessions

__all__ = ["UiConfig"]


@dataclass(frozen=True)
class UiConfig:
    """Everything :func:`toolfleet.ui.create_app` needs.

    Exactly one way of deciding who may look is used: ``sessions`` (tokens with roles, a
    login form), ``auth`` (a host application's callback, when mounted), or neither,
    which means no authentication at all (every visitor is an operator; ``toolfleet ui``
    allows that only on a loopback host).

    Attributes:
        redis_client: returns the Redis client of the fleet (called once, at start).
        namespace: the fleet's key prefix.
        worker_ttl_s: a worker silent for this many seconds is not live (the fleet's
            ``TOOLFLEET_WORKER_TTL_S``).
        interval_s: seconds between snapshots while a page streams live updates.
        sessions: the token sessions, or None.
        auth: the host application's callback, or None.
        read_only: no page offers or accepts a change, whoever asks.
    """

    redis_client: Callable[[], redis.Redis]
    namespace: str = "toolfleet"
    worker_ttl_s: float = 10.0
    interval_s: float = 2.0
    sessions: Sessions | None = None
    auth: AuthCallback | None = None
    read_only: bool = False

    def __post_init__(self) -> None:
        if self.sessions is not None and self.auth is not None:
            raise ValueError("pass sessions or auth, not both")
        if self.interval_s <= 0:
            raise ValueError("interval_s must be positive")
