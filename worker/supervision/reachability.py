"""Wait for Redis before serving: a worker started while Redis is down waits with backoff."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from toolfleet.shared.urls import redacted_url
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = ["BACKOFF_S", "wait_until_reachable"]

log = logging.getLogger("toolfleet.worker.reachability")

#: Seconds between connection attempts (the last one repeats).
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)


#: Most seconds between two calls of ``on_wait`` while waiting (heartbeats stay fresh).
BEAT_S = 1.0


def wait_until_reachable(
    url: str,
    stop: threading.Event,
    *,
    factory: str | None = None,
    timeout_s: float = 2.0,
    on_wait: Callable[[], None] | None = None,
) -> bool:
    """Block until Redis at ``url`` answers ``PING``, or until ``stop`` is set.

    Logs one line per failed attempt (no traceback; the URL without its password) and one
    when Redis answers after a failure.

    Args:
        url: Redis URL.
        stop: set to give up (e.g. by a SIGTERM handler); checked between attempts.
        factory: ``MODULE:ATTR`` of the operator's client factory, used instead of ``url``
            (see :mod:`toolfleet.worker.supervision.redis_factory`).
        timeout_s: connect and read timeout of one attempt, seconds (URL clients only).
        on_wait: called before each attempt and at least every :data:`BEAT_S` seconds
            between two (the caller's liveness heartbeat: waiting is not a failure).

    Returns:
        True when Redis answered, False when ``stop`` was set first.

    Raises:
        ConfigurationError: the factory cannot be loaded or returns no ``redis.Redis``.
    """
    where = f"--redis-client {factory}" if factory else redacted_url(url)
    attempt = 0
    while not stop.is_set():
        if on_wait is not None:
            on_wait()
        options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
        client = redis_client(url, factory=factory, **options)
        try:
            client.ping()
        except redis.RedisError as exc:
            delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
            attempt += 1
            log.warning("Redis at %s unreachable (%s); attempt %d, next in %.1f s",
                        where, exc, attempt, delay)  # fmt: skip
            _pause(stop, delay, on_wait)
            continue
        finally:
            client.close()
        if attempt:
            log.info("Redis at %s answers; starting", where)
        return True
    return False


def _pause(stop: threading.Event, delay_s: float, on_wait: Callable[[], None] | None) -> None:
    """Wait ``delay_s`` seconds (or until ``stop``), calling ``on_wait`` every :data:`BEAT_S`."""
    until = time.monotonic() + delay_s
    while not stop.is_set():
        left = until - time.monotonic()
        if left <= 0 or stop.wait(min(left, BEAT_S)):
            return
        if on_wait is not None and until - time.monotonic() > 0:
            on_wait()
