"""Find extensions: the ``toolfleet.extensions`` entry-point group and ``MODULE:ATTR`` specs.

A source that fails to import, or whose object is not an :class:`Extension`, is
reported in the returned error map and skipped; it never stops the others.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from toolfleet.shared.tool import Extension

__all__ = ["ENTRY_POINT_GROUP", "load_entry_points", "load_spec", "load_all"]

ENTRY_POINT_GROUP = "toolfleet.extensions"
log = logging.getLogger("toolfleet.worker.loader")


def load_spec(spec: str) -> Extension:
    """Import ``MODULE:ATTR`` (or ``MODULE``, taking its ``extension`` attribute).

    Raises:
        ImportError: the module does not import.
        AttributeError: no such attribute.
        TypeError: the object is not an :class:`Extension`.
    """
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in (attr or "extension").split("."):
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Extension):
        obj = obj()
    if not isinstance(obj, Extension):
        raise TypeError(f"{spec} is a {type(obj).__name__}, not a toolfleet Extension")
    return obj


def load_entry_points() -> tuple[list[tuple[str, Extension]], dict[str, str]]:
    """Load every extension registered under the ``toolfleet.extensions`` group.

    Returns:
        ``([(source, extension), ...], {source: error message})``.
    """
    loaded: list[tuple[str, Extension]] = []
    errors: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        source = f"entry point {ep.name} ({ep.value})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, Extension):
                obj = obj()
            if not isinstance(obj, Extension):
                raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a toolfleet Extension")
            loaded.append((source, obj))
        except Exception as exc:  # noqa: BLE001 - one bad extension must not stop the rest
            errors[source] = f"{type(exc).__name__}: {exc}"
            log.error("extension %s failed to load: %s", source, errors[source], exc_info=True)
    return loaded, errors


def load_all(
    specs: list[str], *, entry_points_too: bool = True
) -> tuple[list[tuple[str, Extension]], dict[str, str]]:
    """Load the entry-point extensions (unless disabled) and every ``MODULE:ATTR`` spec."""
    loaded, errors = load_entry_points() if entry_points_too else ([], {})
    for spec in specs:
        try:
            loaded.append((spec, load_spec(spec)))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            errors[spec] = f"{type(exc).__name__}: {exc}"
            log.error("extension %s failed to load: %s", spec, errors[spec], exc_info=True)
    return loaded, errors
