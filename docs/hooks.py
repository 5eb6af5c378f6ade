"""MkDocs hook: lay the ``toolfleet.*`` import layout out as symlinks for mkdocstrings.

The source folders (``shared/``, ``producer/``, ...) map to ``toolfleet.<part>`` through
setuptools' ``package-dir``, which griffe cannot follow; ``.ci/check`` does the same for mypy.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

PARTS = ("shared", "producer", "worker", "extensions", "testing")


@event_priority(100)  # before mkdocstrings reads its paths
def on_config(config: Any) -> Any:
    """Create ``build/docs-api/toolfleet/<part>`` → ``<part>/`` before mkdocstrings starts."""
    root = Path(config["config_file_path"]).resolve().parent
    tree = root / "build" / "docs-api" / "toolfleet"
    tree.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        link = tree / part
        if link.is_symlink() and link.resolve() == root / part:
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(root / part, target_is_directory=True)
    return config
