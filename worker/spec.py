"""The internal tool spec every way of defining a tool turns into."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from toolfleet.shared.tool import Extension, Tool

__all__ = ["ToolSpec", "specs_of"]


@dataclass(frozen=True)
class ToolSpec:
    """One callable function of the fleet.

    Attributes:
        function: wire name, ``ext_<slug>_<tool>``.
        tool: the :class:`Tool` subclass (a new instance per call).
        extension: the extension it belongs to.
        queue: the Dramatiq queue that carries its calls.
        timeout_s: its time limit in seconds.
    """

    function: str
    tool: type[Tool]
    extension: Extension
    queue: str
    timeout_s: float

    @property
    def arguments_model(self) -> type[BaseModel]:
        """The pydantic model arguments are validated with."""
        assert self.tool.arguments_model is not None
        return self.tool.arguments_model

    @property
    def is_async(self) -> bool:
        """True for an ``async def call`` tool."""
        return self.tool.is_async()

    def catalog_entry(self) -> dict[str, Any]:
        """What workers publish about this function (JSON object)."""
        return {
            "name": self.function,
            "description": self.tool.tool_description(),
            "parameters": self.tool.parameters(),
            "queue": self.queue,
            "timeout_s": self.timeout_s,
            "slug": self.extension.slug,
            "version": self.extension.version,
            "tool": self.tool.name,
        }


def specs_of(extension: Extension) -> list[ToolSpec]:
    """The specs of every tool of ``extension`` (call ``extension.validate()`` first)."""
    return [
        ToolSpec(
            function=extension.function_name(tool),
            tool=tool,
            extension=extension,
            queue=extension.queue_name,
            timeout_s=tool.timeout_s or extension.timeout_s,
        )
        for tool in extension.tools
    ]
