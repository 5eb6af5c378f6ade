"""Test-only extension of tests/test_dead_slot_route.py: a tool with session affinity."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, Tool

#: conversation -> the value remembered in this worker process
_MEMORY: dict[str, int] = {}


class ValueArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int | None = None


class Remember(Tool):
    """Remember a value for the conversation in this process; return the one held before."""

    name = "remember"
    arguments_model = ValueArguments
    affinity = "conversation"

    def call(self, arguments: ValueArguments, context: ExtensionContext) -> dict[str, Any]:
        conversation = context.conversation or ""
        before = _MEMORY.get(conversation)
        if arguments.value is not None:
            _MEMORY[conversation] = arguments.value
        return {"before": before, "session_lost": context.session_lost}


extension = Extension(slug="affinity-test", version="1.0.0", tools=[Remember], timeout_s=10.0)
