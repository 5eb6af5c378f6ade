"""Test-only extension whose tools log from a ``process``-isolation child, and print."""

from __future__ import annotations

import logging
import sys

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


class Say(Tool):
    """Print the text to stdout and to stderr (model-written text, as a tool might echo it)."""

    name = "say"
    arguments_model = Said
    timeout_s = 10.0

    def call(self, arguments: Said, context: ExtensionContext) -> str:
        print(arguments.text)
        print(arguments.text, file=sys.stderr, flush=True)
        return "said"


extension = Extension(slug="log-test", version="1.0.0", tools=[LogInChild, Say], timeout_s=10.0)
