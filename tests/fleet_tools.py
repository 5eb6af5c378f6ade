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
