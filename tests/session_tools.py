"""Test-only extension with session affinity: each worker process also consumes a slot queue
of its own (``tools.session-test.slot.<slot>``), as the python tool's workers do."""

from __future__ import annotations

from pydantic import BaseModel

from toolfleet.shared import Extension, ExtensionContext, Tool

#: calls answered by this process, per conversation
SEEN: dict[str, int] = {}


class CountArguments(BaseModel):
    pass


class Count(Tool):
    """How many calls this process has answered for the conversation."""

    name = "count"
    arguments_model = CountArguments
    affinity = "conversation"

    def call(self, arguments: CountArguments, context: ExtensionContext) -> int:
        key = context.conversation or ""
        SEEN[key] = SEEN.get(key, 0) + 1
        return SEEN[key]


extension = Extension(slug="session-test", version="0.0.1", tools=[Count])
