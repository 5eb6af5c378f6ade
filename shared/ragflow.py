"""RAGFlow's LLM tool plugin shape, so a RAGFlow plugin file loads unchanged.

RAGFlow defines plugins as subclasses of ``LLMToolPlugin`` with a ``get_metadata()``
classmethod returning ``LLMToolMetadata`` and ``invoke(**kwargs) -> str``; a plugin file
imports them with ``from agent.plugin.llm_tool_plugin import LLMToolMetadata,
LLMToolPlugin`` (RAGFlow's current layout, ``agent/plugin/llm_tool_plugin.py``) or, in
files written for its older layout, ``from plugin.llm_tool_plugin import ...``. This module
offers the same names (our own implementation of that shape), and the worker's loader
makes both module paths import this module, each unless a real package of that first
name (``agent``, ``plugin``) is installed (:func:`install_import_alias`). Plugins become
metadata tools (:class:`~toolfleet.shared.plugin.MetadataPlugin`): ``displayName`` and
``displayDescription`` of the tool and its parameters reach the catalog and the
``display`` listing (``client.tools(format="display")``), never the model.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any, TypedDict

from toolfleet.shared.plugin import MetadataPlugin, metadata_to_schema

__all__ = [
    "LLMToolMetadata",
    "LLMToolParameter",
    "LLMToolPlugin",
    "install_import_alias",
    "llm_tool_metadata_to_openai_tool",
]

#: The module paths RAGFlow plugin files import the base class from: its current layout,
#: then its older one.
RAGFLOW_MODULES = ("agent.plugin.llm_tool_plugin", "plugin.llm_tool_plugin")


class LLMToolParameter(TypedDict, total=False):
    """One parameter of a plugin.

    Keys: ``type`` (``string``, ``number``, ...), ``description`` (the model's),
    ``displayDescription`` (for people), ``required``.
    """

    type: str
    description: str
    displayDescription: str
    required: bool


class LLMToolMetadata(TypedDict, total=False):
    """A plugin's metadata.

    Keys: ``name``, ``displayName``, ``description``, ``displayDescription`` and
    ``parameters`` (name -> :class:`LLMToolParameter`).
    """

    name: str
    displayName: str
    description: str
    displayDescription: str
    parameters: dict[str, LLMToolParameter]


class LLMToolPlugin(MetadataPlugin):
    """Base class of a RAGFlow-style plugin: ``get_metadata()`` and ``invoke(**kwargs)``."""


def llm_tool_metadata_to_openai_tool(llm_tool_metadata: LLMToolMetadata) -> dict[str, Any]:
    """The OpenAI Chat Completions tool of a plugin's metadata (RAGFlow's helper of that name).

    Args:
        llm_tool_metadata: ``{name, description, parameters: {arg: {type, description,
            required}}, displayName?, displayDescription?}``.

    Returns:
        ``{"type": "function", "function": {"name", "description", "parameters"}}``; the
        display fields are not in it (they are for people, not the model).

    Raises:
        ValueError: a parameter spec is not a mapping or names an unknown type.
        KeyError: no ``name``.
    """
    meta: dict[str, Any] = dict(llm_tool_metadata)
    return {
        "type": "function",
        "function": {
            "name": meta["name"],
            "description": str(meta.get("description") or ""),
            "parameters": metadata_to_schema(meta.get("parameters") or {}),
        },
    }


def install_import_alias() -> tuple[str, ...]:
    """Make each of :data:`RAGFLOW_MODULES` import this module, unless it is a real one.

    Called by the worker's loader before it imports extension code. A module path whose
    first package exists (RAGFlow itself, or the user's own ``agent`` or ``plugin``) is
    never shadowed: plugins written against it are still recognised by their shape
    (``get_metadata`` + ``invoke``).

    Returns:
        The module paths that now name this module (e.g. both of them); empty when real
        packages hold both names.
    """
    this = sys.modules[__name__]
    named = []
    for path in RAGFLOW_MODULES:
        if sys.modules.get(path) is this or _alias(path.split("."), this):
            named.append(path)
    return tuple(named)


def _alias(parts: list[str], module: types.ModuleType) -> bool:
    """Make ``".".join(parts)`` import ``module`` through stand-in packages.

    Only when its first package is neither imported nor installed; returns whether it did.
    """
    top = parts[0]
    if top in sys.modules or importlib.util.find_spec(top) is not None:
        return False
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        package = types.ModuleType(name, "import alias of toolfleet.shared.ragflow")
        package.__path__ = []
        sys.modules[name] = package
        if depth > 1:
            setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], package)
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
    sys.modules[".".join(parts)] = module
    return True
