"""Arms the parent-death signal in the fork server of ``process`` isolation, on import.

:class:`~toolfleet.worker.isolation.process.ProcessRunner` names this module first in the
fork server's preload list, the one hook ``multiprocessing`` offers into that process
before it forks any tool child. Imported anywhere else it does nothing, so importing it
by accident (a test that imports every module) cannot tie an unrelated process to its
parent.

With it, the kernel kills the fork server when its worker process dies, and the fork
server's children (the tool children, which arm the same signal in their initializer)
with it. A fork server whose worker died before this import ran is not caught here;
it still leaves when it reads end-of-file on its worker's pipe.
"""

from __future__ import annotations

import sys

from toolfleet.shared.lifeline import die_with_parent

__all__ = ["in_fork_server"]


def in_fork_server() -> bool:
    """True when this code runs inside ``multiprocessing.forkserver.main``."""
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if in_fork_server():
    die_with_parent()
