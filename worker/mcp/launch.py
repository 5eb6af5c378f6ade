"""Start an MCP server that dies with its worker process.

``python -m toolfleet.worker.mcp.launch WORKER_PID EXECUTABLE [ARGS...]`` arms the
kernel's parent-death signal through :func:`toolfleet.shared.lifeline.die_with_parent`
(which also exits when the worker is already gone), then ``exec`` s the server in place:
the server keeps the signal (execve keeps it, except for set-user-ID programs) and the
launcher's pid. Elsewhere the server starts without it, and the SDK's shutdown at drain
is the only stop.

``lifeline.py`` is loaded from its file (``shared/`` beside ``worker/`` in the source tree
and in the wheel alike), as the python sandbox does: importing the ``toolfleet.shared``
package would load pydantic (~0.4 s) before every server start.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["main"]

LIFELINE = Path(__file__).resolve().parents[2] / "shared" / "lifeline.py"


def _lifeline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_toolfleet_lifeline", LIFELINE)
    if spec is None or spec.loader is None:  # pragma: no cover - a broken install
        raise ImportError(f"cannot load {LIFELINE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    """Set the parent-death signal and exec ``argv[1:]``; exit at once when the worker is gone."""
    parent, command = int(argv[0]), argv[1:]
    _lifeline().die_with_parent(parent)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
