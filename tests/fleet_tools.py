"""Test-only extension loaded by workers with ``--extension fleet_tools:extension``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, ExtensionToolError, Tool


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EchoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="What to echo.")
    times: int = Field(default=1, description="How many times.")


class Echo(Tool):
    """Echo the text back, repeated."""

    name = "echo"
    arguments_model = EchoArguments

    def call(self, arguments: EchoArguments, context: ExtensionContext) -> dict[str, Any]:
        return {"text": arguments.text * arguments.times, "account": context.account}


class AddArguments(BaseModel):
    a: int
    b: int


class Add(Tool):
    """Add two integers (exact, any size)."""

    name = "add"
    arguments_model = AddArguments

    def call(self, arguments: AddArguments, context: ExtensionContext) -> int:
        return arguments.a + arguments.b


class FailArguments(BaseModel):
    reason: str


class Fail(Tool):
    """Fail with an error the model should read."""

    name = "fail"
    arguments_model = FailArguments

    def call(self, arguments: FailArguments, context: ExtensionContext) -> None:
        raise ExtensionToolError(arguments.reason)


class Boom(Tool):
    """Raise an unexpected exception."""

    name = "boom"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> None:
        raise RuntimeError("secret internal detail 0xDEADBEEF")


class SleepArguments(BaseModel):
    seconds: float


class AsyncSleep(Tool):
    """Sleep asynchronously, then return the seconds slept."""

    name = "async_sleep"
    arguments_model = SleepArguments
    timeout_s = 1.0

    async def call(self, arguments: SleepArguments, context: ExtensionContext) -> float:
        await asyncio.sleep(arguments.seconds)
        return arguments.seconds


class Sleep(Tool):
    """Block the thread with time.sleep, then return the seconds slept."""

    name = "sleep"
    arguments_model = SleepArguments
    timeout_s = 1.0

    def call(self, arguments: SleepArguments, context: ExtensionContext) -> float:
        time.sleep(arguments.seconds)
        return arguments.seconds


extension = Extension(
    slug="fleet-test",
    version="0.0.1",
    description="Tools for toolfleet's own tests.",
    tools=[Echo, Add, Fail, Boom, AsyncSleep, Sleep],
    timeout_s=10.0,
)


class MarkArguments(BaseModel):
    path: str = Field(description="A file to create when the tool runs.")


class Mark(Tool):
    """Create a file, proving the tool ran."""

    name = "mark"
    arguments_model = MarkArguments

    def call(self, arguments: MarkArguments, context: ExtensionContext) -> str:
        with open(arguments.path, "a", encoding="utf-8") as f:
            f.write(context.call_id + "\n")
        return arguments.path


extension.tools = [*extension.tools, Mark]


class PidSleepArguments(BaseModel):
    path: str
    seconds: float


class PidSleep(Tool):
    """Write the worker's pid to a file, then sleep (to find and kill the worker running it)."""

    name = "pid_sleep"
    arguments_model = PidSleepArguments
    timeout_s = 30.0

    def call(self, arguments: PidSleepArguments, context: ExtensionContext) -> int:
        import os

        with open(arguments.path, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
        time.sleep(arguments.seconds)
        return os.getpid()


class BlockLoop(Tool):
    """An async tool that blocks its event loop with time.sleep (a bug health checks catch)."""

    name = "block_loop"
    arguments_model = SleepArguments
    timeout_s = 30.0

    async def call(self, arguments: SleepArguments, context: ExtensionContext) -> float:
        time.sleep(arguments.seconds)
        return arguments.seconds


extension.tools = [*extension.tools, PidSleep, BlockLoop]


class ProgressArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(description="How many steps to take.")
    pause_s: float = Field(default=0.3, description="Seconds each step takes.")


class Progress(Tool):
    """Count steps, reporting progress after each one."""

    name = "progress"
    arguments_model = ProgressArguments
    timeout_s = 20.0

    def call(self, arguments: ProgressArguments, context: ExtensionContext) -> int:
        for step in range(1, arguments.steps + 1):
            time.sleep(arguments.pause_s)
            if context.canceled:
                raise ExtensionToolError(f"canceled after {step} steps")
            context.progress(f"step {step} of {arguments.steps}")
        return arguments.steps

    def running_description(self, arguments: ProgressArguments) -> str:
        return f"Counting to {arguments.steps}…"

    def completed_description(self, arguments: ProgressArguments, result: Any) -> str:
        return f"Counted to {result}"

    def canceled_description(self, arguments: ProgressArguments) -> str:
        return f"Stopped counting to {arguments.steps}"


class Slow(Tool):
    """Sleep asynchronously for up to 30 s (past a turn's deadline), then return the seconds."""

    name = "slow"
    arguments_model = SleepArguments
    timeout_s = 30.0

    async def call(self, arguments: SleepArguments, context: ExtensionContext) -> float:
        await asyncio.sleep(arguments.seconds)
        return arguments.seconds


extension.tools = [*extension.tools, Progress, Slow]
