"""Names that say which worker process owns a session's folder or cgroup.

A worker process killed outright (``SIGKILL``, the OOM killer) runs no clean-up, so
what it made on the host (a cgroup per interpreter; a temporary folder per interpreter
in ``isolation="unsafe-none"``) stays behind. Each such name carries its owner:
``toolfleet-python-<pid>.<start>-<random>``, where ``<start>`` is the process's start
time (``/proc/<pid>/stat`` field 22, clock ticks since boot), so that a recycled pid
is not taken for the owner. :func:`is_stale` tells a leftover of a dead owner.
"""

from __future__ import annotations

import functools
import os
import re
import secrets

__all__ = ["PREFIX", "is_stale", "owned_name"]

#: The prefix of every session folder and cgroup name.
PREFIX = "toolfleet-python-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)\.(\d+)-")


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (the start time), or ``None`` when ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None


@functools.lru_cache(maxsize=4)
def _tag(pid: int) -> str:
    return f"{pid}.{_start_time(pid) or 0}"


def owned_name() -> str:
    """A fresh name owned by this process: ``toolfleet-python-<pid>.<start>-<hex>``."""
    return f"{PREFIX}{_tag(os.getpid())}-{secrets.token_hex(4)}"


def is_stale(name: str) -> bool:
    """True when ``name`` was made by a process that no longer runs.

    Names without an owner (another program's, or an older format) are never stale.
    """
    owner = _OWNED.match(name)
    if owner is None:
        return False
    return _start_time(int(owner.group(1))) != owner.group(2)
