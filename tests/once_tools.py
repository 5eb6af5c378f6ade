"""A side-effect tool for the idempotency tests: each run appends its call id to a file."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from toolfleet.shared import Extension, ExtensionContext, Tool


class RecordArguments(BaseModel):
    path: str = Field(description="The file each run appends its call id to.")
    hold_s: float = Field(default=0.0, description="Seconds to keep running after recording.")


class Record(Tool):
    """Append this call's id to a file (the side effect), then hold for a while."""

    name = "record"
    arguments_model = RecordArguments

    def call(self, arguments: RecordArguments, context: ExtensionContext) -> dict[str, str]:
        with open(arguments.path, "a", encoding="utf-8") as f:
            f.write(context.call_id + "\n")
        time.sleep(arguments.hold_s)
        return {"ran": context.call_id}


extension = Extension(
    slug="once",
    version="0.0.1",
    description="A tool whose every run leaves a trace.",
    tools=[Record],
    timeout_s=20.0,
)
