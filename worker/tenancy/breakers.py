"""Circuit breakers per tool, fleet-wide, kept in Redis.

The rule is :mod:`toolfleet.shared.tenancy.breakers`.
Two scripts keep the state atomic across worker processes: :data:`_ENTER` decides
whether a call may run (closed; or the one probe after the cool-down) and
:data:`_RECORD` counts its outcome and moves the state. A probe holds its turn for a
lease (the call's time limit): a probe whose worker died lets the next call probe.
"""

from __future__ import annotations

import logging
import time

import redis

from toolfleet.shared import scripts
from toolfleet.shared.tenancy.breakers import BreakerPolicy, breaker_key
from toolfleet.shared.text import as_text

__all__ = ["Breakers"]

log = logging.getLogger("toolfleet.worker.tenancy.breakers")

#: ``breaker_enter.lua`` (what it takes and returns is written at its head).
_ENTER = scripts.source("breaker_enter")

#: ``breaker_record.lua`` (what it takes and returns is written at its head).
_RECORD = scripts.source("breaker_record")


class Breakers:
    """Ask and tell the fleet-wide breakers of tools.

    Args:
        client: Redis client.
        namespace: key prefix.
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.namespace = namespace
        self._enter = client.register_script(_ENTER)
        self._record = client.register_script(_RECORD)

    def enter(self, function: str, call_id: str, lease_s: float) -> float | None:
        """``None`` when the call may run; else seconds until the breaker lets one through.

        Args:
            function: the tool's function name.
            call_id: the request id (a probe is known by it).
            lease_s: seconds a probe holds its turn at most.

        Raises:
            redis.RedisError: Redis failed.
        """
        now = time.time()
        verdict, wait_ms = self._enter(
            keys=[breaker_key(self.namespace, function)],
            args=[call_id, int(now * 1000), int((now + lease_s) * 1000)],
        )
        if as_text(verdict) == "open":
            return max(int(wait_ms), 1) / 1000
        return None

    def record(self, function: str, call_id: str, failed: bool, policy: BreakerPolicy) -> str:
        """Count a call's outcome; return the breaker's new state if it changed, else ``""``.

        Raises:
            redis.RedisError: Redis failed.
        """
        changed = self._record(
            keys=[breaker_key(self.namespace, function)],
            args=[
                call_id,
                int(time.time() * 1000),
                1 if failed else 0,
                policy.failures,
                int(policy.window_s * 1000),
                int(policy.cooldown_s * 1000),
            ],
        )
        state = as_text(changed or "")
        if state:
            log.warning("breaker of %s is now %s", function, state)
        return state
