"""Test-only extension: results larger than a model's budget, cut or refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, Tool
from toolfleet.shared.manifest import ToolOptions


class CountArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int = 10_000


class Numbers(Tool):
    """Return the numbers 0 to count - 1 (10,000 by default); cut to fit (truncate)."""

    name = "numbers"
    arguments_model = CountArguments

    def call(self, arguments: CountArguments, context: ExtensionContext) -> list[int]:
        return list(range(arguments.count))


class StrictNumbers(Tool):
    """Return the numbers 0 to count - 1; a result over budget is an error."""

    name = "strict_numbers"
    arguments_model = CountArguments

    def call(self, arguments: CountArguments, context: ExtensionContext) -> list[int]:
        return list(range(arguments.count))


class Budget(Tool):
    """Return the result budget the tool was given (its context's max_result_bytes)."""

    name = "budget"
    arguments_model = CountArguments

    def call(self, arguments: CountArguments, context: ExtensionContext) -> dict[str, Any]:
        return {"max_result_bytes": context.max_result_bytes}


extension = Extension(
    slug="shaping",
    version="1.0.0",
    tools=[Numbers, StrictNumbers, Budget],
    tool_options={
        "numbers": ToolOptions(result_shaping="truncate"),
        "strict_numbers": ToolOptions(result_shaping="error"),
    },
)
