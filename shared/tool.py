"""The tool protocol: how an extension author writes a tool and groups tools.

A tool is a class::

    class AddDays(Tool):
        \"\"\"Add a number of days to an ISO date.\"\"\"      # the description the model reads

        name = "add_days"
        arguments_model = AddDaysArguments                  # a pydantic model

        def call(self, arguments: AddDaysArguments, context: ExtensionContext) -> str:
            ...                                             # or ``async def call``

and an :class:`Extension` groups tools under a slug; each tool's function name is
``ext_<slug>_<name>`` (see :func:`toolfleet.shared.naming.function_name`). A new tool
instance is made for every call. Raise :class:`ExtensionToolError` for a failure the
model should read; any other exception becomes ``crashed`` with a generic message.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from toolfleet.shared.errors import ConfigurationError, ExtensionToolError
from toolfleet.shared.naming import FUNCTION_NAME_RE, default_queue_for, function_name

__all__ = ["Extension", "ExtensionContext", "ExtensionToolError", "Tool"]


@dataclass
class ExtensionContext:
    """What a tool learns about the call it serves.

    Attributes:
        call_id: the request id (UUID).
        tool_call_id: the model's id for the call, if any.
        function: the function name being called.
        slug: the extension's slug; ``version`` its version.
        account, user, llmclient, conversation, traceparent: from the request context.
        metadata: the request context's free metadata.
        deadline: Unix epoch seconds; the tool is stopped or abandoned by then.
        logger: a logger named ``toolfleet.extensions.<slug>``.
    """

    call_id: str
    function: str
    slug: str
    version: str
    deadline: float
    tool_call_id: str | None = None
    account: str | None = None
    user: str | None = None
    llmclient: str | None = None
    conversation: str | None = None
    traceparent: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("toolfleet.tool"))


class Tool:
    """Base class of a tool (the class protocol).

    Class attributes:
        name: the tool's name inside its extension, ``^[a-zA-Z0-9_-]{1,64}$``.
        arguments_model: a pydantic model of the arguments; its JSON schema is what
            the model sees as ``parameters``.
        description: what the model reads; defaults to the class docstring.
        timeout_s: time limit in seconds; ``None`` takes the extension's.

    Subclasses implement ``call(self, arguments, context)``, plain or ``async``, and
    return any JSON value (or a pydantic model).
    """

    name: ClassVar[str] = ""
    arguments_model: ClassVar[type[BaseModel] | None] = None
    description: ClassVar[str | None] = None
    timeout_s: ClassVar[float | None] = None

    def call(self, arguments: Any, context: ExtensionContext) -> Any:
        """Run the tool. Override in a subclass (sync or ``async def``)."""
        raise NotImplementedError

    @classmethod
    def tool_description(cls) -> str:
        """The description the model reads: ``description``, else the cleaned docstring."""
        if cls.description:
            return cls.description
        doc = cls.__doc__ if "__doc__" in cls.__dict__ else None
        return inspect.cleandoc(doc) if doc else ""

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """The JSON schema of ``arguments_model`` (``{"type": "object", ...}``)."""
        if cls.arguments_model is None:
            return {"type": "object", "properties": {}}
        return cls.arguments_model.model_json_schema()

    @classmethod
    def is_async(cls) -> bool:
        """True when ``call`` is a coroutine function."""
        return inspect.iscoroutinefunction(cls.call)

    @classmethod
    def problems(cls) -> list[str]:
        """Reasons this class is not a valid tool (empty when valid)."""
        found: list[str] = []
        if not cls.name:
            found.append("no name")
        elif not FUNCTION_NAME_RE.match(cls.name):
            found.append(f"name {cls.name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
        model = cls.arguments_model
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            found.append("arguments_model is not a pydantic model")
        if cls.call is Tool.call:
            found.append("call(arguments, context) is not implemented")
        elif len(inspect.signature(cls.call).parameters) != 3:
            found.append("call must take (self, arguments, context)")
        if not cls.tool_description():
            found.append("no description (docstring or description attribute)")
        return found


@dataclass
class Extension:
    """A package of tools under one slug.

    Args:
        slug: short name, e.g. ``date-calculator``; function names are
            ``ext_<slug>_<tool>`` with hyphens turned into underscores.
        version: the extension's version string.
        tools: the :class:`Tool` subclasses.
        description: what the extension is for.
        timeout_s: default time limit of its tools, seconds.
        queue: the Dramatiq queue its calls go to; default ``tools.<slug>``.

    Raises:
        ConfigurationError: from :meth:`validate` when a tool has problems or two tools
            share a function name.
    """

    slug: str
    version: str
    tools: Sequence[type[Tool]] = ()
    description: str = ""
    timeout_s: float = 30.0
    queue: str | None = None

    @property
    def queue_name(self) -> str:
        """The queue this extension's calls go to."""
        return self.queue or default_queue_for(self.slug)

    def function_name(self, tool: type[Tool]) -> str:
        """The wire function name of one of this extension's tools."""
        return function_name(self.slug, tool.name)

    def validate(self) -> None:
        """Check every tool; raise :class:`ConfigurationError` listing all problems."""
        found: list[str] = []
        seen: set[str] = set()
        for tool in self.tools:
            found += [f"{getattr(tool, '__name__', tool)}: {p}" for p in tool.problems()]
            fname = self.function_name(tool) if tool.name else ""
            if fname and fname in seen:
                found.append(f"{tool.__name__}: duplicate function name {fname}")
            seen.add(fname)
        if found:
            raise ConfigurationError(f"extension {self.slug!r}: " + "; ".join(found))
