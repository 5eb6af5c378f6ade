"""Test-only extension of tests/test_crash_loop.py: a tool that kills its own process."""

from __future__ import annotations

import os
import signal

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool
from toolfleet.shared.connect import sync_client


class KeyArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="Redis key counting the runs.")


class SelfKill(Tool):
    """Count the run in Redis, then SIGKILL the worker process running it (idempotent)."""

    name = "self_kill"
    arguments_model = KeyArguments
    idempotent = True

    def call(self, arguments: KeyArguments, context: ExtensionContext) -> None:
        client = sync_client(os.environ["TOOLFLEET_REDIS_URL"])
        client.incr(arguments.key)
        client.close()
        os.kill(os.getpid(), signal.SIGKILL)


class TextArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Echo(Tool):
    """Echo the text (idempotent: a run lost with a process another call killed is re-run;
    a non-idempotent call is answered ``crashed`` then, by design)."""

    name = "echo"
    arguments_model = TextArguments
    idempotent = True

    def call(self, arguments: TextArguments, context: ExtensionContext) -> str:
        return arguments.text


extension = Extension(
    slug="crashloop",
    version="1.0.0",
    tools=[SelfKill, Echo],
    timeout_s=10.0,
)
