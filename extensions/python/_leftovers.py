"""Removing what killed worker processes left behind: session folders and cgroups.

A worker process that exits cleanly removes its interpreters' folders and cgroups
itself (``_interpreter.py``); one killed outright cannot. Every worker process sweeps
at start (the extension's preflight) and then at most every :data:`SWEEP_EVERY_S`
when it starts an interpreter: folders in the temporary directory and cgroups whose
owner (see :mod:`._owner`) no longer runs are removed. A sandbox under bubblewrap has
no host folder at all (its files live in a private tmpfs that ends with it), so only
``isolation="unsafe-none"`` leaves folders.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from toolfleet.extensions.python._cgroups import sweep_stale as sweep_cgroups
from toolfleet.extensions.python._owner import PREFIX, is_stale

__all__ = ["SWEEP_EVERY_S", "sweep", "sweep_if_due"]

#: Seconds between two sweeps of one worker process.
SWEEP_EVERY_S = 60.0
_last_sweep = [float("-inf")]


def sweep() -> int:
    """Remove the session folders and cgroups of dead worker processes; how many went."""
    _last_sweep[0] = time.monotonic()
    removed = sweep_cgroups()
    parent = tempfile.gettempdir()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        owned = entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False)
        if owned and is_stale(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def sweep_if_due() -> None:
    """:func:`sweep` unless this process swept less than :data:`SWEEP_EVERY_S` ago."""
    if time.monotonic() - _last_sweep[0] >= SWEEP_EVERY_S:
        sweep()
