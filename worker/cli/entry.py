"""The ``toolfleet`` console script: the command line, or a one-line hint without it.

The command line (``toolfleet.worker.cli.main``) needs the ``worker`` extra (click, rich,
pebble). A producer-only install has the script too, so a missing extra must read
as what to install, not as an import traceback.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["main"]

# Top-level modules of the ``worker`` extra (pyproject.toml) that the command line imports.
WORKER_EXTRA_MODULES = frozenset({"click", "pebble", "rich"})


def missing_extra_hint(error: ModuleNotFoundError) -> str | None:
    """The hint to print when ``error`` means the ``worker`` extra is not installed.

    Args:
        error: raised while importing the command line.

    Returns:
        One line naming the missing module and the install command, or ``None`` when the
        missing module is not one of the extra's (a real bug: let it raise).
    """
    top = (error.name or "").partition(".")[0]
    if top not in WORKER_EXTRA_MODULES:
        return None
    return (
        f"toolfleet: the command line needs the worker extra ({top} is not installed): "
        "pip install 'toolfleet[worker]'"
    )


def main() -> None:
    """Run the command line; exit 1 with a one-line hint when the worker extra is missing."""
    try:
        from toolfleet.worker.cli.main import main as cli_main
    except ModuleNotFoundError as error:
        hint = missing_extra_hint(error)
        if hint is None:
            raise
        sys.exit(hint)
    # Everything imported so far lives until exit: move it out of the collector's sight, so
    # neither a full collection while a command runs nor the interpreter's last collection
    # at exit walks it (Python's gc.freeze(); the last one took seconds on a loaded machine,
    # which a Ctrl-C'd `toolfleet top` spent before exiting).
    gc.freeze()
    cli_main()
