"""Tie a process's life to its parent's, enforced by the kernel (Linux ``PR_SET_PDEATHSIG``).

A Python thread that watches ``os.getppid()`` cannot run while a tool holds the GIL
(a long C call such as ``math.factorial(10**7)``), and neither can a Python signal
handler. The kernel's parent-death signal needs neither: once armed, the kernel sends
``SIGKILL`` to this process when the thread that started it ends (its parent process
dies, or the thread of it that forked this one exits).

Every process a fleet starts calls :func:`die_with_parent` first thing: worker
processes, ``process``-isolation tool children and their fork server, the ``python``
sandbox. The sandbox's interpreter cannot import toolfleet, so this module imports
only the standard library and can be loaded from its file path.

The setting is cleared by ``fork()`` (each child arms its own) and kept across
``execve()`` except into a set-user-ID program.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "supported"]

#: ``prctl`` option number from ``<linux/prctl.h>``.
PR_SET_PDEATHSIG = 1
#: Exit status of a process whose parent was already gone when it armed the signal.
EXIT_ORPHANED = 70


def supported() -> bool:
    """True on Linux, where the kernel offers ``PR_SET_PDEATHSIG``."""
    return sys.platform.startswith("linux")


def die_with_parent(expected_parent_pid: int | None = None) -> bool:
    """Ask the kernel to ``SIGKILL`` this process when its parent dies.

    Then check that the parent did not die before the request took effect (the kernel
    sends nothing for a parent that is already gone): when ``os.getppid()`` is not the
    expected parent, the process exits at once with status :data:`EXIT_ORPHANED`.

    Args:
        expected_parent_pid: pid of the process that started this one, as that process
            knows it (e.g. passed on the command line); ``None`` takes ``os.getppid()``
            read just before arming, which catches a parent dying from then on.

    Returns:
        True when the kernel enforces it; False where it cannot (not Linux, or a libc
        without ``prctl``): the caller keeps only its own, weaker, watch.
    """
    parent = os.getppid() if expected_parent_pid is None else expected_parent_pid
    armed = False
    if supported():
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            armed = False
    if os.getppid() != parent:
        os._exit(EXIT_ORPHANED)
    return armed
