"""RAGFlow's LLM tool plugin shape, so a RAGFlow plugin file loads unchanged.

RAGFlow (``plugin/llm_tool_plugin.py``) defines plugins as subclasses of
``LLMToolPlugin`` with a ``get_metadata()`` classmethod returning ``LLMToolMetadata`` and
``invoke(**kwargs) -> str``; a plugin file imports them with
``from plugin.llm_tool_plugin import LLMToolMetadata, LLMToolPlugin``. This module offers
the same names (our own implementation of that shape), and the worker's loader makes
``plugin.llm_tool_plugin`` import this module when no package named ``plugin`` is
installed (:func:`install_import_alias`). Plugins become metadata tools
(:class:`~toolfleet.shared.plugin.MetadataPlugin`): ``displayName`` and
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

#: The module path RAGFlow plugin files import the base class from.
RAGFLOW_MODULE = "plugin.llm_tool_plugin"


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


def install_import_alias() -> bool:
    """Make ``import plugin.llm_tool_plugin`` give this module, unless ``plugin`` exists.

    Called by the worker's loader before it imports extension code. A real package named
    ``plugin`` (RAGFlow itself, or the user's own) is never shadowed: its plugins are
    still recognised by their shape (``get_metadata`` + ``invoke``).

    Returns:
        True when ``plugin.llm_tool_plugin`` now names this module.
    """
    if sys.modules.get(RAGFLOW_MODULE) is sys.modules[__name__]:
        return True
    if "plugin" in sys.modules or importlib.util.find_spec("plugin") is not None:
        return False
    package = types.ModuleType("plugin", "import alias of toolfleet.shared.ragflow")
    package.__path__ = []
    package.llm_tool_plugin = sys.modules[__name__]  # type: ignore[attr-defined]
    sys.modules["plugin"] = package
    sys.modules[RAGFLOW_MODULE] = sys.modules[__name__]
    return True
