"""Tools that show which thread runs a sync tool (the worker's own loop runs it inline)."""

from __future__ import annotations

import threading
import time

from pydantic import BaseModel

from toolfleet.shared import Extension, ExtensionContext, Tool


class Nothing(BaseModel):
    pass


class ThreadName(Tool):
    """Return the name of the thread running this call."""

    name = "thread_name"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        return threading.current_thread().name


class NapArguments(BaseModel):
    seconds: float


class Nap(Tool):
    """Sleep, past the 1-second limit when asked, then return the thread's name."""

    name = "nap"
    arguments_model = NapArguments
    timeout_s = 1.0

    def call(self, arguments: NapArguments, context: ExtensionContext) -> str:
        time.sleep(arguments.seconds)
        return threading.current_thread().name


extension = Extension(
    slug="inline-test",
    version="0.0.1",
    description="Which thread runs a sync tool.",
    tools=[ThreadName, Nap],
    timeout_s=10.0,
)
