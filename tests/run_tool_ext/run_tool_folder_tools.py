"""The tools of the folder-tools extension: one that answers, one that never finishes."""

from __future__ import annotations

import threading

from pydantic import BaseModel

from toolfleet.shared import ExtensionContext, Tool


class Nothing(BaseModel):
    pass


class Answer(Tool):
    """Say the call's account."""

    name = "answer"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> dict[str, str | None]:
        return {"slug": context.slug, "account": context.account}


class Stuck(Tool):
    """Never finish (the manifest's 0.5 s limit answers it)."""

    name = "stuck"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> None:
        threading.Event().wait(60)


tools = [Answer, Stuck]
