"""Find extensions: the ``toolfleet.extensions`` entry points, ``MODULE:ATTR`` specs, and folders.

A folder is an extension when it holds a manifest (``extension.toml``, or a
``pyproject.toml`` with ``[tool.toolfleet]`` or its alias ``[tool.smarter]``); its
``entry = "module:attr"`` names the tools inside the folder (the folder is put on
``sys.path``), or its ``[mcp]`` table an MCP server whose tools the worker lists when it
starts the server. A RAGFlow plugin file (``from agent.plugin.llm_tool_plugin import
LLMToolPlugin``, or the older ``plugin.llm_tool_plugin``) imports unchanged: the loader
aliases both module paths to :mod:`toolfleet.shared.ragflow`, each when no package of its
first name is installed. A source that fails to
import, has an invalid manifest, or is not an extension is reported in the returned
error map and skipped; it never stops the others.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.extension import Extension
from toolfleet.shared.manifest import Manifest, find_manifest, read_manifest
from toolfleet.shared.ragflow import install_import_alias
from toolfleet.shared.spec import specs_from

__all__ = [
    "ENTRY_POINT_GROUP",
    "load_all",
    "load_entry_points",
    "load_folder",
    "load_object",
    "load_spec",
]

ENTRY_POINT_GROUP = "toolfleet.extensions"
_NOT_SLUG = re.compile(r"[^a-zA-Z0-9_-]+")
log = logging.getLogger("toolfleet.worker.loader")

Loaded = list[tuple[str, Extension]]
Errors = dict[str, str]


def _as_extension(
    obj: Any, what: str, manifest: Manifest | None = None, module: str = ""
) -> Extension:
    if isinstance(obj, Extension):
        return obj
    if manifest is not None:
        tools = list(obj) if isinstance(obj, (list, tuple)) else [obj]
        return Extension.from_manifest(manifest, tools)
    if callable(obj) and not isinstance(obj, type) and not _is_tool(obj):
        made = obj()
        if isinstance(made, Extension):
            return made
    if module and _is_tool(obj):
        return _bare_tool_extension(obj, module)
    raise TypeError(f"{what} is a {type(obj).__name__}, not a toolfleet Extension")


def _is_tool(obj: Any) -> bool:
    specs, problems = specs_from(obj)
    return bool(specs) and not problems


def _bare_tool_extension(obj: Any, module: str) -> Extension:
    """A single tool definition named without a manifest: an extension named by its module.

    E.g. ``--extension offset_adder:OffsetAdderPlugin`` (a RAGFlow plugin file) serves
    ``ext_offset_adder_<tool>``; the version is the definition's ``_version_`` (RAGFlow's
    attribute) or ``version``, else ``0``.
    """
    slug = _NOT_SLUG.sub("-", module.rsplit(".", 1)[-1]).strip("-_")[:40] or "tools"
    version = getattr(obj, "_version_", None) or getattr(obj, "version", None) or "0"
    return Extension(slug=slug, version=str(version), tools=[obj])


def _resolve(module_name: str, attr: str) -> Any:
    install_import_alias()  # RAGFlow plugin files import (agent.)plugin.llm_tool_plugin
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_spec(spec: str) -> Extension:
    """Import ``MODULE:ATTR`` (or ``MODULE``, taking its ``extension`` attribute).

    ``ATTR`` is an :class:`Extension`, a factory of one, or a single tool definition
    (a ``Tool`` class, a metadata or RAGFlow plugin, a toolkit, a delegate), which
    becomes an extension named after the module.

    Raises:
        ImportError: the module does not import.
        AttributeError: no such attribute.
        TypeError: the object is not an :class:`Extension` (or a factory of one).
    """
    module_name, _, attr = spec.partition(":")
    return _as_extension(_resolve(module_name, attr or "extension"), spec, module=module_name)


def load_object(obj: Any) -> Extension:
    """The extension ``obj`` is or makes: what ``MODULE:ATTR`` may name, as an object.

    An :class:`Extension` as it is; a factory of one, called; a single tool definition
    (a ``Tool`` class, a metadata or RAGFlow plugin, a toolkit, a delegate) as an
    extension named after the module that defines it (see :func:`load_spec`).

    Raises:
        TypeError: ``obj`` is none of these.
    """
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return _as_extension(obj, repr(obj)[:80], module=module)


def load_entry_points() -> tuple[Loaded, Errors]:
    """Load every extension registered under the ``toolfleet.extensions`` group."""
    loaded: Loaded = []
    errors: Errors = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        source = f"entry point {ep.name} ({ep.value})"
        try:
            loaded.append((source, _as_extension(ep.load(), ep.value)))
        except Exception as exc:  # noqa: BLE001 - one bad extension must not stop the rest
            _record(errors, source, exc)
    return loaded, errors


def load_folder(folder: Path) -> tuple[Loaded, Errors]:
    """Load the extension in ``folder``, or one per sub-folder holding a manifest."""
    loaded: Loaded = []
    errors: Errors = {}
    if not folder.is_dir():
        errors[str(folder)] = "extension folder not found"
        return loaded, errors
    candidates = (
        [folder] if find_manifest(folder) else sorted(p for p in folder.iterdir() if p.is_dir())
    )
    for candidate in candidates:
        manifest_path = find_manifest(candidate)
        if manifest_path is None:
            continue
        source = str(candidate)
        try:
            manifest = read_manifest(manifest_path)
            if manifest.mcp is not None:  # tools come from the server when the worker starts it
                loaded.append((source, Extension.from_manifest(manifest, [], folder=candidate)))
                continue
            module_name, _, attr = (manifest.entry or "tools:tools").partition(":")
            if str(candidate) not in sys.path:
                sys.path.insert(0, str(candidate))
            obj = _resolve(module_name, attr or "tools")
            loaded.append((source, _as_extension(obj, f"{source} {manifest.entry}", manifest)))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            _record(errors, source, exc)
    return loaded, errors


def load_all(
    specs: Sequence[str],
    *,
    folders: Sequence[Path] = (),
    entry_points_too: bool = True,
) -> tuple[Loaded, Errors]:
    """Load entry points (unless disabled), every folder, and every ``MODULE:ATTR`` spec."""
    loaded, errors = load_entry_points() if entry_points_too else ([], {})
    for folder in folders:
        more, problems = load_folder(folder)
        loaded += more
        errors.update(problems)
    for spec in specs:
        try:
            loaded.append((spec, load_spec(spec)))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            _record(errors, spec, exc)
    return loaded, errors


def _record(errors: Errors, source: str, exc: Exception) -> None:
    message = str(exc) if isinstance(exc, ConfigurationError) else f"{type(exc).__name__}: {exc}"
    errors[source] = message
    log.error("extension %s failed to load: %s", source, message)
