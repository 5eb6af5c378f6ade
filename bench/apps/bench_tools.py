"""The no-op tool as a toolfleet extension (``--extension bench_tools:extension``).

Validation stays on: ``n`` is checked by the pydantic arguments model like any tool's.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from toolfleet.shared import Extension, ExtensionContext, Tool


class NoopArguments(BaseModel):
    n: int = Field(description="Any integer; returned as is.")


class Noop(Tool):
    """Return n unchanged (a no-op)."""

    name = "noop"
    arguments_model = NoopArguments

    def call(self, arguments: NoopArguments, context: ExtensionContext) -> int:
        return arguments.n


extension = Extension(slug="bench", version="1.0.0", tools=[Noop])
FUNCTION = "ext_bench_noop"
