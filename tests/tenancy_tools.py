"""Test-only extension of fleet-wide limits, loaded with ``--extension tenancy_tools:extension``.

Each tool records what it does in Redis (``<namespace>:test:*`` keys), so a test sees
every run across worker processes.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import redis
from pydantic import BaseModel

from toolfleet.shared import Extension, ExtensionContext, Tool
from toolfleet.shared.connect import sync_client
from toolfleet.shared.manifest import ToolOptions
from toolfleet.shared.tenancy.breakers import BreakerPolicy


@cache
def _redis() -> redis.Redis:
    """A client of the fleet's Redis: a plain one, or a cluster client for a cluster URL."""
    return sync_client(os.environ["TOOLFLEET_REDIS_URL"])  # type: ignore[return-value]


def record_key(namespace: str, name: str) -> str:
    """A key of these tools' records under ``namespace``."""
    return f"{namespace}:test:{name}"


def _key(name: str) -> str:
    return record_key(os.environ.get("TOOLFLEET_NAMESPACE", "toolfleet"), name)


class HoldArguments(BaseModel):
    seconds: float


class Limited(Tool):
    """Count the calls running at once (fleet-wide), hold a while, record the highest count."""

    name = "limited"
    arguments_model = HoldArguments
    timeout_s = 5.0

    def call(self, arguments: HoldArguments, context: ExtensionContext) -> int:
        r = _redis()
        now_running = int(r.incr(_key("running")))
        r.rpush(_key("seen"), now_running)
        try:
            time.sleep(arguments.seconds)
        finally:
            r.decr(_key("running"))
        return now_running


class Pooled(Tool):
    """Record which worker pid runs the call (by call id), then hold a while."""

    name = "pooled"
    arguments_model = HoldArguments
    timeout_s = 30.0

    def call(self, arguments: HoldArguments, context: ExtensionContext) -> int:
        _redis().hset(_key("pooled_pids"), context.call_id, os.getpid())
        time.sleep(arguments.seconds)
        return os.getpid()


class Hold(Tool):
    """Record this worker's pid, then hold the one slot for a while."""

    name = "hold"
    arguments_model = HoldArguments
    timeout_s = 3.0

    def call(self, arguments: HoldArguments, context: ExtensionContext) -> int:
        _redis().rpush(_key("hold_pids"), os.getpid())
        time.sleep(arguments.seconds)
        return os.getpid()


class Tally(Tool):
    """Record each start and each finish (by call id, with this worker's pid), holding between.

    Not idempotent: a start without a finish is a run its process did not survive.
    """

    name = "tally"
    arguments_model = HoldArguments
    timeout_s = 30.0

    def call(self, arguments: HoldArguments, context: ExtensionContext) -> int:
        _redis().hset(_key("tally_started"), context.call_id, os.getpid())
        time.sleep(arguments.seconds)
        _redis().hset(_key("tally_finished"), context.call_id, os.getpid())
        return os.getpid()


#: The cool-down of ``flaky``'s breaker, seconds.
FLAKY_COOLDOWN_S = 6.0


def wait_out_the_cooldown(client: Any, key: str) -> None:
    """Sleep until the breaker hash ``key`` (its ``until``, ms since the epoch) lets a probe
    through: what is left of the cool-down, plus 0.1 s."""
    until_ms = client.hget(key, "until")
    assert until_ms is not None, f"{key} has no cool-down"
    time.sleep(max(0.0, int(until_ms) / 1000 - time.time()) + 0.1)


class Flaky(Tool):
    """Crash while ``<ns>:test:flaky_fail`` exists, else succeed; every run is counted."""

    name = "flaky"
    arguments_model = HoldArguments
    timeout_s = 5.0

    def call(self, arguments: HoldArguments, context: ExtensionContext) -> str:
        r = _redis()
        r.incr(_key("flaky_runs"))
        time.sleep(arguments.seconds)
        if r.exists(_key("flaky_fail")):
            raise RuntimeError("the backend is down")
        return "fine"


extension = Extension(
    slug="tenancy-test",
    version="0.0.1",
    description="Tools for the fleet-wide limit tests.",
    tools=[Limited, Pooled, Hold, Flaky, Tally],
    tool_options={
        "limited": ToolOptions(concurrency=3),
        "pooled": ToolOptions(concurrency=3),
        "hold": ToolOptions(concurrency=1),
        "tally": ToolOptions(concurrency=1),
        # long enough that a loaded machine's pauses do not end it before the test has
        # seen the refusals; the tests wait out only what is left of it (wait_out_the_cooldown)
        "flaky": ToolOptions(breaker=BreakerPolicy(failures=5, cooldown_s=FLAKY_COOLDOWN_S)),
    },
)
