"""Test-only extension for the execution guarantees (loaded with --extension)."""

from __future__ import annotations

import asyncio
import math
import os
import time

import redis
from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Status, Tool
from toolfleet.shared.connect import sync_client
from toolfleet.shared.errors import ERROR_FOR_STATUS, NotAvailableError


def _redis() -> redis.Redis:
    """A client of the worker's Redis: a cluster client for a ``redis+cluster://`` URL."""
    return sync_client(os.environ["TOOLFLEET_REDIS_URL"])  # type: ignore[return-value]


class Seconds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 0.0


class KeyArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="Redis key to count runs in.")
    seconds: float = 0.0


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sleep(Tool):
    """time.sleep in a thread (cannot be interrupted)."""

    name = "sleep"
    arguments_model = Seconds
    timeout_s = 2.0

    def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        time.sleep(arguments.seconds)
        return arguments.seconds


class Quick(Tool):
    """Answer at once."""

    name = "quick"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        return "quick"


class Spin(Tool):
    """A pure-Python busy loop, in a child process."""

    name = "spin"
    arguments_model = Seconds
    timeout_s = 1.0
    isolation = "process"

    def call(self, arguments: Seconds, context: ExtensionContext) -> int:
        end, n = time.monotonic() + arguments.seconds, 0
        while time.monotonic() < end:
            n += 1
        return n


class GilHold(Tool):
    """math.factorial(10**6): seconds inside one C call holding the GIL, in a child process."""

    name = "gil_hold"
    arguments_model = Nothing
    timeout_s = 1.0
    isolation = "process"

    def call(self, arguments: Nothing, context: ExtensionContext) -> int:
        return math.factorial(10**6).bit_length()


class ProcessQuick(Tool):
    """Answer at once from a child process (shows the slot is back)."""

    name = "process_quick"
    arguments_model = Nothing
    timeout_s = 1.0
    isolation = "process"

    def call(self, arguments: Nothing, context: ExtensionContext) -> int:
        return os.getpid()


class StatusArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: str = Field(description="A non-ok status, or 'quota' for a subclass of one.")


class QuotaExhausted(NotAvailableError):
    """A tool's own subclass of a status error (it answers not_available)."""


def _raise_status(status: str) -> None:
    if status == "quota":
        raise QuotaExhausted("the daily quota is used up")
    raise ERROR_FOR_STATUS[Status(status)](f"raised {status}")


class RaiseStatus(Tool):
    """Raise the error class of the status asked for."""

    name = "raise_status"
    arguments_model = StatusArguments

    def call(self, arguments: StatusArguments, context: ExtensionContext) -> None:
        _raise_status(arguments.status)


class ProcessRaiseStatus(Tool):
    """Raise the error class of the status asked for, in a child process."""

    name = "process_raise_status"
    arguments_model = StatusArguments
    isolation = "process"

    def call(self, arguments: StatusArguments, context: ExtensionContext) -> None:
        _raise_status(arguments.status)


class Count(Tool):
    """INCR a Redis key each time it runs, then sleep (not idempotent)."""

    name = "count"
    arguments_model = KeyArguments
    timeout_s = 10.0

    def call(self, arguments: KeyArguments, context: ExtensionContext) -> int:
        runs = int(_redis().incr(arguments.key))
        time.sleep(arguments.seconds)
        return runs


class Ticks(Tool):
    """INCR a Redis key every 20 ms until stopped (async: cancellable)."""

    name = "ticks"
    arguments_model = KeyArguments
    timeout_s = 30.0

    async def call(self, arguments: KeyArguments, context: ExtensionContext) -> int:
        client = _redis()
        while True:
            client.incr(arguments.key)
            await asyncio.sleep(0.02)


class ProcessTicks(Tool):
    """INCR a Redis key every 20 ms until its child process is killed."""

    name = "process_ticks"
    arguments_model = KeyArguments
    timeout_s = 30.0
    isolation = "process"

    def call(self, arguments: KeyArguments, context: ExtensionContext) -> int:
        client = _redis()
        while True:
            client.incr(arguments.key)
            time.sleep(0.02)


class WatchCancel(Tool):
    """A thread tool that stops when context.canceled becomes true, and says so in Redis."""

    name = "watch_cancel"
    arguments_model = KeyArguments
    timeout_s = 30.0

    def call(self, arguments: KeyArguments, context: ExtensionContext) -> str:
        while not context.canceled:
            time.sleep(0.01)
        _redis().set(arguments.key, "saw cancel")
        return "stopped"


class Crash(Tool):
    """The worker process kills itself (thread isolation: the whole worker dies)."""

    name = "crash"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> None:
        os._exit(9)


extension = Extension(
    slug="guarantee",
    version="1.0.0",
    tools=[
        Sleep,
        Quick,
        Spin,
        GilHold,
        ProcessQuick,
        Count,
        Ticks,
        ProcessTicks,
        WatchCancel,
        Crash,
        RaiseStatus,
        ProcessRaiseStatus,
    ],
    timeout_s=5.0,
)


# -- argument-policy tools (tests/test_recovery.py) ----------------------------------------

from toolfleet.shared import ExtensionToolError  # noqa: E402 - appended section


class GcdArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int = 0
    b: int = 0


class Gcd(Tool):
    """gcd(a, b); every run INCRs <namespace>:ran:gcd (shows whether the tool ran at all)."""

    name = "gcd"
    arguments_model = GcdArguments

    def call(self, arguments: GcdArguments, context: ExtensionContext) -> int:
        _redis().incr(f"{os.environ['TOOLFLEET_NAMESPACE']}:ran:gcd")
        return math.gcd(arguments.a, arguments.b)


class BinomialArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    k: int
    p: float


class Binomial(Tool):
    """P(X = k) for X ~ Binomial(n, p); three required parameters."""

    name = "binomial"
    arguments_model = BinomialArguments

    def call(self, arguments: BinomialArguments, context: ExtensionContext) -> float:
        n, k, p = arguments.n, arguments.k, arguments.p
        if not (0 <= k <= n <= 1000 and 0.0 <= p <= 1.0):
            raise ExtensionToolError("need 0 <= k <= n <= 1000 and 0 <= p <= 1")
        return float(math.comb(n, k) * p**k * (1 - p) ** (n - k))


class TotalArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    values: list[float]


class Total(Tool):
    """The sum of an array of numbers (an array parameter)."""

    name = "total"
    arguments_model = TotalArguments

    def call(self, arguments: TotalArguments, context: ExtensionContext) -> float:
        try:
            total = math.fsum(arguments.values)
        except OverflowError:
            total = math.inf
        if not math.isfinite(total):
            raise ExtensionToolError("the sum is not a finite number")
        return total


extension.tools = [*extension.tools, Gcd, Binomial, Total]


#: The thread and async tools only, on queue ``tools.recovery``: a fleet loading just this
#: one starts no tool child processes, so it is up in seconds (tests/test_recovery.py).
recovery_extension = Extension(
    slug="recovery",
    version="1.0.0",
    tools=[Sleep, Quick, Count, Gcd, Binomial, Total],
    timeout_s=5.0,
)
