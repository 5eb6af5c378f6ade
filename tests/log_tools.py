"""Test-only extension whose tool logs from a ``process``-isolation child (--extension)."""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool

#: What the child's log record says (the tests look for it in the fleet's output).
CHILD_MARKER = "hello from the tool's child process"

log = logging.getLogger("log_tools")


class Said(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="What the tool logs after the marker.")


class LogInChild(Tool):
    """Log one warning from a child process, then return its text."""

    name = "log_in_child"
    arguments_model = Said
    timeout_s = 10.0
    isolation = "process"

    def call(self, arguments: Said, context: ExtensionContext) -> str:
        log.warning("%s: %s", CHILD_MARKER, arguments.text)
        return arguments.text


extension = Extension(slug="log-test", version="1.0.0", tools=[LogInChild], timeout_s=10.0)
