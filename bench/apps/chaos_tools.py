"""Tools of the chaos check (``--extension chaos_tools:extension``, queue ``tools.chaos``).

A sleeping tool (not idempotent: a call whose worker dies mid-run is answered ``crashed``),
an idempotent one (re-run after its worker died), one limited to 3 calls at once across
the fleet, and an echo that the fuzzed raw messages call.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool
from toolfleet.shared.manifest import ToolOptions


class Seconds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(default=0.0, ge=0, le=5, description="Seconds to sleep.")


class Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="Returned as is.")


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


class Sleep(Tool):
    """Sleep in a thread, then return the seconds slept (not idempotent)."""

    name = "sleep"
    arguments_model = Seconds
    timeout_s = 10.0

    def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        return _sleep(arguments.seconds)


class Idem(Tool):
    """Sleep, then return the seconds slept; idempotent (re-run after its worker died)."""

    name = "idem"
    arguments_model = Seconds
    timeout_s = 10.0
    idempotent = True

    def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        return _sleep(arguments.seconds)


class Limited(Tool):
    """Sleep, then return the seconds slept; at most 3 calls at once across the fleet."""

    name = "limited"
    arguments_model = Seconds
    timeout_s = 10.0

    def call(self, arguments: Seconds, context: ExtensionContext) -> float:
        return _sleep(arguments.seconds)


class Echo(Tool):
    """Return the text unchanged."""

    name = "echo"
    arguments_model = Text

    def call(self, arguments: Text, context: ExtensionContext) -> str:
        return arguments.text


extension = Extension(
    slug="chaos",
    version="1.0.0",
    tools=[Sleep, Idem, Limited, Echo],
    timeout_s=10.0,
    tool_options={"limited": ToolOptions(concurrency=3)},
)
QUEUE = extension.queue_name
