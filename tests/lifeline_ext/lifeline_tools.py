"""Test-only tools that hold the GIL for about a minute (one C call), after writing a marker.

Loaded with ``--extension lifeline_tools:extension`` (the folder on ``PYTHONPATH``) or as the
folder extension ``tests/lifeline_ext`` (``TOOLFLEET_EXTENSION_PATHS``, for ``toolfleet demo``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, Tool

#: ``math.factorial`` of this runs for about a minute on one core, holding the GIL throughout.
GIL_HOLDING_N = 3_000_000


class MarkerArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    marker: str = Field(description="File to write this process's pid to before starting.")


def _hold_gil(marker: str) -> int:
    Path(marker).write_text(str(os.getpid()))
    return math.factorial(GIL_HOLDING_N).bit_length()


class HoldGil(Tool):
    """Write the marker, then compute a huge factorial (GIL held), in a worker thread."""

    name = "hold_gil"
    arguments_model = MarkerArguments
    timeout_s = 300.0

    def call(self, arguments: MarkerArguments, context: ExtensionContext) -> int:
        return _hold_gil(arguments.marker)


class HoldGilInChild(Tool):
    """The same in a ``process``-isolation child."""

    name = "hold_gil_in_child"
    arguments_model = MarkerArguments
    timeout_s = 300.0
    isolation = "process"

    def call(self, arguments: MarkerArguments, context: ExtensionContext) -> int:
        return _hold_gil(arguments.marker)


tools = [HoldGil, HoldGilInChild]
extension = Extension(slug="lifeline", version="1.0.0", tools=tools, timeout_s=300.0)
