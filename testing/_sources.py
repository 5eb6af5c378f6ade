"""What names an extension in a test: an object, a ``MODULE:ATTR`` string, or a folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeAlias, TypeGuard

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.extension import Extension
from toolfleet.worker.registry.loader import load_folder, load_object, load_spec

__all__ = ["ExtensionSource", "is_folder", "load_source"]

#: An :class:`Extension` or a tool definition, ``"MODULE:ATTR"`` (or ``"MODULE"``), or the
#: path of an extension folder (one holding ``extension.toml`` or a ``pyproject.toml`` with
#: ``[tool.toolfleet]``).
ExtensionSource: TypeAlias = Extension | str | os.PathLike[str] | object


def is_folder(source: ExtensionSource) -> TypeGuard[str | os.PathLike[str]]:
    """True when ``source`` names an extension folder, False for a ``MODULE[:ATTR]`` spec.

    A folder is a path object, or a string naming a directory that exists.
    """
    if isinstance(source, os.PathLike):
        return True
    return isinstance(source, str) and Path(source).is_dir()


def load_source(source: ExtensionSource) -> Extension:
    """Load the one extension ``source`` names, as a worker loads it.

    Folders go through the worker's folder loader (the folder is put on ``sys.path``),
    strings through ``--extension MODULE:ATTR``'s, objects through the same rules
    (:func:`~toolfleet.worker.registry.loader.load_object`).

    Raises:
        ConfigurationError: a folder that holds no extension, more than one, or one that
            does not load (the message is the loader's).
        ImportError, AttributeError, TypeError: a spec or object that is not an extension.
    """
    if is_folder(source):
        folder = Path(source)
        loaded, errors = load_folder(folder)
        if errors:
            raise ConfigurationError("; ".join(f"{where}: {why}" for where, why in errors.items()))
        if len(loaded) != 1:
            raise ConfigurationError(
                f"{folder} holds {len(loaded)} extensions; name the folder of one "
                "(the one holding extension.toml)"
            )
        return loaded[0][1]
    if isinstance(source, str):
        return load_spec(source)
    return load_object(source)
