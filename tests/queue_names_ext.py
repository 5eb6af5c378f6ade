"""Test-only extensions whose queues differ by one character only: tools.a-b and tools.a_b."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, Tool


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Dash(Tool):
    """Say which extension answered."""

    name = "dash"
    arguments_model = NoArguments

    def call(self, arguments: NoArguments, context: ExtensionContext) -> str:
        return context.slug


class Underscore(Dash):
    """Say which extension answered."""

    name = "underscore"


dash = Extension(slug="a-b", version="1.0.0", tools=[Dash])
underscore = Extension(slug="a_b", version="1.0.0", tools=[Underscore])
