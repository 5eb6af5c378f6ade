"""Test-only extension for exactly-once delivery and the watchdog (loaded with --extension)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import time

import redis
from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool


class KeyArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="Redis key counting the runs.")
    seconds: float = 0.0


class Seconds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: int = Field(ge=0, le=60)


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SideEffect(Tool):
    """INCR a Redis key each time it runs, then sleep (a side effect: not idempotent)."""

    name = "side_effect"
    arguments_model = KeyArguments
    timeout_s = 20.0

    def call(self, arguments: KeyArguments, context: ExtensionContext) -> int:
        runs = int(redis.Redis.from_url(os.environ["TOOLFLEET_REDIS_URL"]).incr(arguments.key))
        time.sleep(arguments.seconds)
        return runs


class Hog(Tool):
    """C ``sleep()`` called with the GIL held: no other thread of the process runs meanwhile."""

    name = "hog"
    arguments_model = Seconds
    timeout_s = 1.0

    def call(self, arguments: Seconds, context: ExtensionContext) -> str:
        ctypes.PyDLL(None).sleep(arguments.seconds)  # PyDLL keeps the GIL during the call
        return "woke up"


class Quick(Tool):
    """Answer at once."""

    name = "quick"
    arguments_model = Nothing
    timeout_s = 5.0

    def call(self, arguments: Nothing, context: ExtensionContext) -> int:
        return os.getpid()


class Wait(Tool):
    """Wait 30 s (async: a cancel stops it)."""

    name = "wait"
    arguments_model = Nothing
    timeout_s = 30.0

    async def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        await asyncio.sleep(30)
        return "waited"


extension = Extension(
    slug="promise",
    version="1.0.0",
    description="Tools that test exactly-once delivery and the watchdog.",
    tools=[SideEffect, Hog, Quick, Wait],
)
