"""How a long-lived listener rides out a Redis outage: back off, and say so once.

The clients' reply listeners and the workers' cancel listener each keep one connection.
When Redis goes away they reconnect with a doubling wait (``first_wait_s`` up to
``max_wait_s``), log one WARNING when the outage starts and one INFO line when it ends,
and log each further failed attempt at DEBUG only: an outage is two lines, never a
traceback or a warning per attempt.
"""

from __future__ import annotations

import logging

import redis
from redis.backoff import ExponentialBackoff

from toolfleet.shared.errors import ConnectionFailed

__all__ = ["FIRST_WAIT_S", "MAX_WAIT_S", "OUTAGE_ERRORS", "Reconnect"]

#: The default wait after the first failed attempt, seconds.
FIRST_WAIT_S = 0.05
#: The default longest wait between two attempts, seconds.
MAX_WAIT_S = 2.0
#: What an unreachable or failing Redis raises: redis-py's errors, and toolfleet's own when
#: a connection cannot be made (a unix socket that is gone, a cluster with no node).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, ConnectionFailed)


class Reconnect:
    """The backoff and the log lines of one listener's outages.

    The waits are redis-py's ``ExponentialBackoff``: ``first_wait_s`` doubling per failed
    attempt, up to ``max_wait_s``.

    Args:
        log: where the lines go.
        what: who is reconnecting, the start of each line (e.g. ``"reply listener"``).
        first_wait_s: the wait after the first failed attempt, seconds.
        max_wait_s: the longest wait between two attempts, seconds.
    """

    __slots__ = ("backoff", "failures", "log", "what")

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        first_wait_s: float = FIRST_WAIT_S,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self.log = log
        self.what = what
        self.backoff = ExponentialBackoff(cap=max_wait_s, base=first_wait_s)
        self.failures = 0

    def failed(self, exc: Exception) -> float:
        """Note a failed attempt; return the seconds to wait before the next one."""
        wait_s: float = self.backoff.compute(self.failures)
        self.failures += 1
        if self.failures == 1:
            self.log.warning("%s: Redis unreachable (%s); reconnecting", self.what, exc)
        else:
            self.log.debug("%s: attempt %d failed (%s)", self.what, self.failures, exc)
        return wait_s

    def succeeded(self) -> None:
        """Note a command that worked: the end of an outage, if one was under way."""
        if self.failures:
            self.log.info("%s: Redis is back after %d failed attempts", self.what, self.failures)
            self.failures = 0
