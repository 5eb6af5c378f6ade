"""Tools that never finish on their own, one per isolation (``--extension stuck_tools:...``).

Each has a 1 s limit; ``bench/stuck_timeouts.py`` measures how long after that limit the
``timeout`` reply arrives.
"""

from __future__ import annotations

import math
import time

from pydantic import BaseModel, ConfigDict

from toolfleet.extensions.python import PythonToolConfig, make_extension
from toolfleet.shared import Extension, ExtensionContext, Tool

#: The limit of every tool here, seconds.
LIMIT_S = 1.0


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ThreadSleep(Tool):
    """time.sleep(30) in a worker thread (cannot be interrupted)."""

    name = "thread_sleep"
    arguments_model = Nothing
    timeout_s = LIMIT_S

    def call(self, arguments: Nothing, context: ExtensionContext) -> None:
        time.sleep(30)


class ProcessSpin(Tool):
    """A pure-Python busy loop for 30 s, in a child process."""

    name = "process_spin"
    arguments_model = Nothing
    timeout_s = LIMIT_S
    isolation = "process"

    def call(self, arguments: Nothing, context: ExtensionContext) -> int:
        end, n = time.monotonic() + 30, 0
        while time.monotonic() < end:
            n += 1
        return n


class ProcessGilHold(Tool):
    """math.factorial(3 * 10**6): seconds inside one C call holding the GIL, in a child
    process."""

    name = "process_gil_hold"
    arguments_model = Nothing
    timeout_s = LIMIT_S
    isolation = "process"

    def call(self, arguments: Nothing, context: ExtensionContext) -> int:
        return math.factorial(3 * 10**6).bit_length()


class Ready(Tool):
    """Answer at once (the bench waits for it before measuring)."""

    name = "ready"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        return "ready"


extension = Extension(
    slug="stuck",
    version="1.0.0",
    tools=[ThreadSleep, ProcessSpin, ProcessGilHold, Ready],
)

#: ``ext_python_stuck_run``: the python tool with the same limit.
python_extension = make_extension(PythonToolConfig(), slug="python-stuck", timeout_s=LIMIT_S)
