"""Start an MCP server that dies with its worker process.

``python -m toolfleet.worker.mcp.launch WORKER_PID EXECUTABLE [ARGS...]`` asks the kernel
for ``SIGKILL`` when its parent (the worker thread that spawned it) ends
(``PR_SET_PDEATHSIG``, Linux), checks that the worker is still its parent, then
``exec`` s the server in place: the server keeps the parent-death signal (execve keeps
it, except for set-user-ID programs) and the launcher's pid. Elsewhere the server starts
without it, and the SDK's shutdown at drain is the only stop.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        pass


def main(argv: list[str]) -> None:
    """Set the parent-death signal and exec ``argv[1:]``; exit 1 when the worker is gone."""
    parent, command = int(argv[0]), argv[1:]
    _die_with_parent()
    if os.getppid() != parent:  # the worker died before the signal was armed
        os._exit(1)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
