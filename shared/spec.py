"""One internal tool spec for every way of defining a tool.

:func:`specs_from` turns each supported form into :class:`ToolSpec` s:

1. a :class:`~toolfleet.shared.tool.Tool` subclass (class protocol);
2. a :class:`~toolfleet.shared.plugin.MetadataPlugin` subclass or instance;
3. a :class:`~toolfleet.shared.toolkit.Toolkit` (its ``deftool`` tools), or a single
   :class:`~toolfleet.shared.toolkit.DynamicTool`;
4. a :class:`~toolfleet.shared.toolkit.Delegate` (``get_tools`` / ``execute``);
5. a ready :class:`ToolSpec` (how the worker serves an MCP server's tools).

Tools given as JSON Schema get a pydantic model built from the schema, so every form is
validated the same way before it runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from toolfleet.shared.manifest import RetryPolicy
from toolfleet.shared.naming import FUNCTION_NAME_RE
from toolfleet.shared.plugin import MetadataPlugin, metadata_display, metadata_to_schema
from toolfleet.shared.schema import model_from_schema
from toolfleet.shared.tool import Tool
from toolfleet.shared.toolkit import Delegate, DynamicTool, Toolkit

__all__ = ["ToolSpec", "specs_from"]

Invoke = Callable[[BaseModel, Any], Any]
Describe = Callable[[str, BaseModel, Any], "str | None"]

#: Method or attribute names that say whether a tool is offered now (multi-llm-ts's
#: ``isEnabled()``, Python spellings); a callable is called, a value read as a bool.
_ENABLED_NAMES = ("is_enabled", "isEnabled", "enabled")
#: Names of a tool's preparation text (multi-llm-ts's ``getPreparationDescription``).
_PREPARATION_NAMES = ("preparation_description", "getPreparationDescription")


@dataclass(frozen=True)
class ToolSpec:
    """A tool, whatever form it was written in.

    Attributes:
        name: tool name inside its extension.
        description: what the model reads.
        parameters: JSON Schema object the model sees.
        arguments_model: pydantic model arguments are validated with.
        invoke: ``invoke(arguments, context)`` runs the tool (returns a value, or an
            awaitable when ``is_async``).
        is_async: True when ``invoke`` returns an awaitable.
        timeout_s: the tool's own time limit in seconds, ``None`` for the extension's.
        display_name, display_description: for user interfaces.
        kind: ``class``, ``metadata``, ``toolkit`` or ``delegate``.
        idempotent, isolation, retry: execution options (see ``Tool``).
        describe: ``describe(stage, arguments, result)`` -> UI text for ``running``,
            ``completed`` or ``canceled`` (class tools' ``*_description`` methods).
        display_parameters: ``{argument: displayDescription}`` for user interfaces.
        is_enabled: ``is_enabled()`` -> whether the tool is offered and run now
            (re-evaluated at every catalog refresh); ``None``: always.
        affinity: ``"conversation"`` for session affinity (see ``Tool.affinity``).
        preparation: ``preparation()`` -> the text a UI shows while the model is still
            writing the arguments, with ``{argument}`` placeholders filled from the
            partial arguments by :func:`toolfleet.shared.preparing.preparation_text`.
        annotations: behaviour hints for clients (MCP ``ToolAnnotations``: ``readOnlyHint``,
            ``idempotentHint``, ``destructiveHint``, ``openWorldHint``, ``title``), if known.
        output_schema: JSON Schema of the result's structured value, if known.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    arguments_model: type[BaseModel]
    invoke: Invoke
    is_async: bool
    timeout_s: float | None = None
    display_name: str | None = None
    display_description: str | None = None
    kind: str = "class"
    idempotent: bool = False
    isolation: str | None = None
    retry: RetryPolicy | None = None
    describe: Describe | None = None
    display_parameters: dict[str, str] | None = None
    is_enabled: Callable[[], bool] | None = None
    preparation: Callable[[], str | None] | None = None
    affinity: str | None = None
    annotations: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


def specs_from(obj: Any) -> tuple[list[ToolSpec], list[str]]:
    """Convert one tool definition (any supported form) into specs.

    Returns:
        ``(specs, problems)``: problems are human-readable reasons a definition is not
        a valid tool; a definition with problems yields no spec.
    """
    try:
        if isinstance(obj, ToolSpec):
            problems = _check_name(obj.name, f"tool {obj.name!r}")
            return ([], problems) if problems else ([obj], [])
        if isinstance(obj, type) and issubclass(obj, Tool):
            return _from_class(obj)
        if isinstance(obj, type) and issubclass(obj, MetadataPlugin):
            return _from_plugin(obj())
        if isinstance(obj, MetadataPlugin):
            return _from_plugin(obj)
        if isinstance(obj, Toolkit):
            return _merge(_from_dynamic(t) for t in obj.tools())
        if isinstance(obj, DynamicTool):
            return _from_dynamic(obj)
        if isinstance(obj, Delegate):
            return _from_delegate(obj)
        if _is_plugin_shaped(obj):  # e.g. a RAGFlow plugin on RAGFlow's own base class
            return _from_plugin(obj() if isinstance(obj, type) else obj)
    except Exception as exc:  # noqa: BLE001 - a broken definition is a problem, not a crash
        return [], [f"{_label(obj)}: {type(exc).__name__}: {exc}"]
    return [], [f"{_label(obj)}: not a tool (Tool subclass, MetadataPlugin, Toolkit or delegate)"]


def _is_plugin_shaped(obj: Any) -> bool:
    """A class (or instance) with ``get_metadata()`` and ``invoke(**kwargs)``."""
    return callable(getattr(obj, "get_metadata", None)) and callable(getattr(obj, "invoke", None))


def _enabled_probe(cls: type) -> Callable[[], bool] | None:
    """``is_enabled()`` of a tool class that declares one of :data:`_ENABLED_NAMES`."""
    for name in _ENABLED_NAMES:
        declared = inspect.getattr_static(cls, name, None)
        if declared is None or declared is inspect.getattr_static(Tool, name, None):
            continue

        def probe(_name: str = name) -> bool:
            value = getattr(cls(), _name)
            return bool(value() if callable(value) else value)

        return probe
    return None


def _preparation_probe(cls: type, tool_name: str) -> Callable[[], str | None] | None:
    """The preparation text of a tool class (a string, or a method given the tool's name)."""
    for name in _PREPARATION_NAMES:
        declared = inspect.getattr_static(cls, name, None)
        if declared is None:
            continue

        def probe(_name: str = name) -> str | None:
            value = getattr(cls(), _name)
            if callable(value):
                value = value(tool_name) if _takes_an_argument(value) else value()
            return None if value is None else str(value)

        return probe
    return None


def _takes_an_argument(method: Callable[..., Any]) -> bool:
    try:
        return len(inspect.signature(method).parameters) >= 1
    except (TypeError, ValueError):
        return False


def _merge(parts: Any) -> tuple[list[ToolSpec], list[str]]:
    specs: list[ToolSpec] = []
    problems: list[str] = []
    for s, p in parts:
        specs += s
        problems += p
    return specs, problems


def _label(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def _check_name(name: Any, label: str) -> list[str]:
    if not isinstance(name, str) or not name:
        return [f"{label}: no name"]
    if not FUNCTION_NAME_RE.match(name):
        return [f"{label}: name {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$"]
    return []


def _from_class(cls: type[Tool]) -> tuple[list[ToolSpec], list[str]]:
    problems = [f"{cls.__name__}: {p}" for p in cls.problems()]
    if problems:
        return [], problems
    assert cls.arguments_model is not None

    def invoke(arguments: BaseModel, context: Any) -> Any:
        return cls().call(arguments, context)

    spec = ToolSpec(
        name=cls.name,
        description=cls.tool_description(),
        parameters=cls.parameters(),
        arguments_model=cls.arguments_model,
        invoke=invoke,
        is_async=cls.is_async(),
        timeout_s=cls.timeout_s,
        display_name=getattr(cls, "display_name", None),
        display_description=getattr(cls, "display_description", None),
        kind="class",
        idempotent=cls.idempotent,
        isolation=cls.isolation,
        retry=cls.retry,
        describe=_describer(cls),
        is_enabled=_enabled_probe(cls),
        preparation=_preparation_probe(cls, cls.name),
        affinity=cls.affinity,
    )
    return [spec], []


def _describer(cls: type[Tool]) -> Describe | None:
    overridden = [
        name
        for name in ("running_description", "completed_description", "canceled_description")
        if getattr(cls, name) is not getattr(Tool, name)
    ]
    if not overridden:
        return None

    def describe(stage: str, arguments: BaseModel, result: Any) -> str | None:
        tool = cls()
        if stage == "running":
            return tool.running_description(arguments)
        if stage == "completed":
            return tool.completed_description(arguments, result)
        return tool.canceled_description(arguments)

    return describe


def _from_plugin(plugin: Any) -> tuple[list[ToolSpec], list[str]]:
    label = type(plugin).__name__
    meta = plugin.get_metadata()
    name = meta.get("name")
    problems = _check_name(name, label)
    if not meta.get("description"):
        problems.append(f"{label}: no description")
    if type(plugin).invoke is MetadataPlugin.invoke:
        problems.append(f"{label}: invoke(**kwargs) is not implemented")
    if problems:
        return [], problems
    parameters = meta.get("parameters") or {}
    schema = metadata_to_schema(parameters)
    plugin_class = type(plugin)

    def invoke(arguments: BaseModel, context: Any) -> Any:
        return plugin_class().invoke(**arguments.model_dump(by_alias=True, exclude_unset=True))

    spec = ToolSpec(
        name=str(name),
        description=str(meta["description"]),
        parameters=schema,
        arguments_model=model_from_schema(schema, f"{label}Arguments"),
        invoke=invoke,
        is_async=inspect.iscoroutinefunction(plugin_class.invoke),
        display_name=meta.get("displayName"),
        display_description=meta.get("displayDescription"),
        kind="metadata",
        display_parameters=metadata_display(parameters) or None,
        is_enabled=_enabled_probe(plugin_class),
        preparation=_preparation_probe(plugin_class, str(name)),
    )
    return [spec], []


def _from_dynamic(tool: DynamicTool) -> tuple[list[ToolSpec], list[str]]:
    problems = _check_name(tool.name, f"deftool {tool.name!r}")
    if not tool.description:
        problems.append(f"deftool {tool.name!r}: no description")
    if problems:
        return [], problems
    handler, wants_context = tool.handler, tool.wants_context

    def invoke(arguments: BaseModel, context: Any) -> Any:
        kwargs = arguments.model_dump(by_alias=True, exclude_unset=True)
        if wants_context:
            kwargs["context"] = context
        return handler(**kwargs)

    spec = ToolSpec(
        name=tool.name,
        description=tool.description,
        parameters=tool.parameters,
        arguments_model=model_from_schema(tool.parameters, f"{tool.name}_arguments"),
        invoke=invoke,
        is_async=inspect.iscoroutinefunction(handler),
        timeout_s=tool.timeout_s,
        kind="toolkit",
    )
    return [spec], []


def _from_delegate(delegate: Delegate) -> tuple[list[ToolSpec], list[str]]:
    specs: list[ToolSpec] = []
    problems: list[str] = []
    is_async = inspect.iscoroutinefunction(delegate.execute)
    for definition in delegate.get_tools():
        name = definition.get("name")
        label = f"{type(delegate).__name__} tool {name!r}"
        found = _check_name(name, label)
        if found:
            problems += found
            continue
        parameters = definition.get("parameters") or {"type": "object", "properties": {}}

        def invoke(arguments: BaseModel, context: Any, _name: str = str(name)) -> Any:
            dumped = arguments.model_dump(by_alias=True, exclude_unset=True)
            return delegate.execute(_name, dumped, context)

        try:
            model = model_from_schema(parameters, f"{name}_arguments")
        except Exception as exc:  # noqa: BLE001 - reported per tool
            problems.append(f"{label}: bad parameters schema: {exc}")
            continue
        specs.append(
            ToolSpec(
                name=str(name),
                description=str(definition.get("description") or ""),
                parameters=parameters,
                arguments_model=model,
                invoke=invoke,
                is_async=is_async,
                display_name=definition.get("displayName"),
                display_description=definition.get("displayDescription"),
                kind="delegate",
            )
        )
    return specs, problems
