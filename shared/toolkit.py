"""Tools built at run time: a :class:`Toolkit` of ``deftool`` handlers, and delegates.

::

    kit = Toolkit()

    @kit.tool("add", "Add two integers.", {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
    def add(a: int, b: int) -> int:
        return a + b

A **delegate** is any object with ``get_tools()`` (a list of ``{name, description,
parameters}`` JSON function definitions) and ``execute(name, arguments, context)``; it
serves tools that exist only at run time, e.g. loaded from a file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from toolfleet.shared.errors import ConfigurationError

__all__ = ["Delegate", "DynamicTool", "Toolkit"]


@dataclass(frozen=True)
class DynamicTool:
    """One tool of a :class:`Toolkit`.

    Attributes:
        name: tool name.
        description: what the model reads.
        parameters: JSON Schema object of the arguments.
        handler: called with the validated arguments as keyword arguments, plus
            ``context=`` when it accepts a parameter of that name; sync or async.
        timeout_s: time limit in seconds, ``None`` for the extension's.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., Any]
    timeout_s: float | None = None

    @property
    def wants_context(self) -> bool:
        """True when the handler takes a ``context`` argument."""
        return "context" in inspect.signature(self.handler).parameters


class Toolkit:
    """A set of tools defined at run time with :meth:`deftool`."""

    def __init__(self) -> None:
        self._tools: dict[str, DynamicTool] = {}

    def deftool(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        handler: Callable[..., Any],
        *,
        timeout_s: float | None = None,
    ) -> DynamicTool:
        """Define a tool.

        Raises:
            ConfigurationError: a tool of that name exists already.
        """
        if name in self._tools:
            raise ConfigurationError(f"toolkit already has a tool named {name!r}")
        tool = DynamicTool(name, description, parameters, handler, timeout_s)
        self._tools[name] = tool
        return tool

    def tool(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`deftool`."""

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.deftool(name, description, parameters, handler)
            return handler

        return register

    def tools(self) -> list[DynamicTool]:
        """Every tool, in definition order."""
        return list(self._tools.values())

    def match(self, name: str) -> DynamicTool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def export(self, format: str = "openai", *, slug: str | None = None) -> list[dict[str, Any]]:  # noqa: A002
        """The toolkit's tools as a model API tool list.

        Args:
            format: one of :data:`toolfleet.shared.export.FORMATS` (``openai``,
                ``openai-strict``, ``responses``, ``anthropic``, ``mcp``, ``display``).
            slug: name the tools as the fleet serves them in the extension ``slug``
                (``ext_<slug>_<tool>``); ``None`` keeps the tools' own names.

        Returns:
            One tool per ``deftool``, in definition order.

        Raises:
            ValueError: unknown format.
        """
        from toolfleet.shared.export import export_tools
        from toolfleet.shared.naming import function_name

        entries = [
            {
                "name": function_name(slug, tool.name) if slug is not None else tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            }
            for tool in self._tools.values()
        ]
        return export_tools(entries, format)


@runtime_checkable
class Delegate(Protocol):
    """An object that lists and executes tools known only at run time."""

    def get_tools(self) -> list[dict[str, Any]]:
        """JSON function definitions: ``[{name, description, parameters}, ...]``."""
        ...

    def execute(self, name: str, arguments: dict[str, Any], context: Any) -> Any:
        """Run tool ``name`` with validated ``arguments``; sync or async."""
        ...
