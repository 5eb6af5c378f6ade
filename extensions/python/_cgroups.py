"""One cgroup per interpreter: the session's processes and memory bounded together.

Where the worker may create child cgroups, each interpreter (the sandbox launcher and
every process the code starts) runs in its own, with ``pids.max`` = ``max_processes``
and the memory limit = ``memory_bytes`` (no swap), so the whole session stays within
the limits the tool states, whatever the code forks. tmpfs pages the code writes are
charged to it too.

Where the cgroup is made (found once per process by :func:`host_cgroups`):

- cgroup v2: under the worker's own cgroup, when its ``cgroup.subtree_control``
  enables ``pids`` and ``memory`` and the worker may write there (a delegated
  subtree);
- cgroup v1: under the worker's own cgroup of the ``pids`` and of the ``memory``
  hierarchy, when it may write to both (e.g. a root worker on a v1 or hybrid host).

Elsewhere (no write access, e.g. a container's read-only ``/sys/fs/cgroup``) there is
none and the sandbox falls back to per-process limits (see :mod:`._sandbox`).

The interpreter joins its cgroup before it runs: the launcher is ``/bin/sh`` waiting
for a line on its stdin; the worker writes the shell's pid to the group's
``cgroup.procs``, then sends the line, and the shell ``exec``-s the sandbox
(:meth:`SessionCgroup.wrap`, :meth:`SessionCgroup.join`). A multi-threaded worker
cannot run code between ``fork`` and ``exec``, and the worker, not the shell, has the
right to move a process there (the shell may run as another user). Each cgroup is
named by :mod:`._owner`, so :func:`sweep_stale` can remove those of a worker process
that was killed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from toolfleet.extensions.python._owner import PREFIX, is_stale, owned_name

__all__ = ["HostCgroups", "SessionCgroup", "host_cgroups", "sweep_stale"]

_CONTROLLERS = ("pids", "memory")
_REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class HostCgroups:
    """Where this process can make session cgroups.

    Attributes:
        version: 2 (one unified folder) or 1 (one folder per controller).
        bases: the parent folders: ``(unified,)`` for v2, ``(pids, memory)`` for v1.
    """

    version: int
    bases: tuple[Path, ...]

    def create(self, max_processes: int | None, memory_bytes: int) -> SessionCgroup:
        """Make a session cgroup with these limits.

        Args:
            max_processes: ``pids.max``, or ``None`` for no cap.
            memory_bytes: the memory limit of the whole group, bytes (swap: none).

        Raises:
            OSError: the folder or a limit could not be written (it is removed again).
        """
        name = owned_name()
        group = SessionCgroup(tuple(base / name for base in self.bases))
        try:
            for folder in group.folders:
                folder.mkdir()
            if self.version == 2:
                (folder,) = group.folders
                _write(folder / "memory.max", memory_bytes)
                _write_if_present(folder / "memory.swap.max", 0)
                pids = folder
            else:
                pids, memory = group.folders
                _write(memory / "memory.limit_in_bytes", memory_bytes)
                _write_if_present(memory / "memory.memsw.limit_in_bytes", memory_bytes)
            if max_processes is not None:
                _write(pids / "pids.max", max_processes)
        except OSError:
            group.remove()
            raise
        return group


@dataclass(frozen=True)
class SessionCgroup:
    """One interpreter's cgroup (one folder per hierarchy).

    Attributes:
        folders: its folders under :attr:`HostCgroups.bases`.
    """

    folders: tuple[Path, ...]

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by ``/bin/sh`` once a line arrives on its stdin (see :meth:`join`).

        The shell reads its standard input one byte at a time up to the newline, so
        what follows is left for the interpreter; at end of file it exits instead.
        """
        return ["/bin/sh", "-c", 'read -r _ && exec "$@"', "sh", *argv]

    def join(self, pid: int) -> None:
        """Move process ``pid`` (the waiting shell of :meth:`wrap`) into this cgroup.

        Raises:
            OSError: the kernel refused (no permission, the process is gone).
        """
        for folder in self.folders:
            _write(folder / "cgroup.procs", pid)

    def remove(self, wait_s: float = _REMOVE_WAIT_S) -> bool:
        """Kill what still runs in the group and remove its folders.

        Args:
            wait_s: seconds to keep retrying while exiting processes hold it.

        Returns:
            True when every folder is gone.
        """
        deadline = time.monotonic() + wait_s
        left = [f for f in self.folders if f.exists()]
        while left:
            for folder in left:
                _kill_members(folder)
                with contextlib.suppress(OSError):
                    folder.rmdir()
            left = [f for f in left if f.exists()]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return not left


def _kill_members(folder: Path) -> None:
    with contextlib.suppress(OSError):
        kill = folder / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
            return
        for pid in (folder / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))


def _write_if_present(path: Path, value: int) -> None:
    if path.exists():
        _write(path, value)


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: ``""`` for v2, controller names for v1."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _mounts() -> dict[str, tuple[Path, str]]:
    """Mount point and mounted root per hierarchy (``""``: cgroup2, else a v1 controller)."""
    found: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tails = fields.split(), tail.split()
        if len(parts) < 5 or len(tails) < 3:
            continue
        root, point, fstype = parts[3], Path(parts[4]), tails[0]
        if fstype == "cgroup2":
            found.setdefault("", (point, root))
        elif fstype == "cgroup":
            for option in tails[2].split(","):
                if option in _CONTROLLERS:
                    found.setdefault(option, (point, root))
    return found


def _folder(hierarchy: str, own: dict[str, str], mounts: dict[str, tuple[Path, str]]) -> Path:
    point, root = mounts[hierarchy]
    relative = os.path.relpath(own[hierarchy], root) if root != "/" else own[hierarchy]
    if relative.startswith(".."):
        raise LookupError(f"this process's cgroup is outside the mounted {hierarchy or 'v2'} tree")
    relative = relative.lstrip("/")
    return point if relative in ("", ".") else point / relative


def _candidates() -> list[HostCgroups]:
    try:
        own, mounts = _own_paths(), _mounts()
    except (OSError, ValueError):
        return []
    found: list[HostCgroups] = []
    with contextlib.suppress(KeyError, LookupError, OSError):
        unified = _folder("", own, mounts)
        enabled = (unified / "cgroup.subtree_control").read_text().split()
        if all(c in enabled for c in _CONTROLLERS):
            found.append(HostCgroups(2, (unified,)))
    with contextlib.suppress(KeyError, LookupError):
        found.append(HostCgroups(1, tuple(_folder(c, own, mounts) for c in _CONTROLLERS)))
    return found


@functools.lru_cache(maxsize=1)
def host_cgroups() -> HostCgroups | str:
    """Where this process can make session cgroups, or why it cannot (cached).

    Tries each place (see the module's docstring) by making, limiting and removing a
    cgroup there.
    """
    if not Path("/proc/self/cgroup").exists():
        return "this host has no cgroups"
    why = "neither a delegated cgroup v2 subtree with pids and memory nor cgroup v1 ones"
    for host in _candidates():
        try:
            host.create(max_processes=1, memory_bytes=64 * 2**20).remove()
        except OSError as exc:
            why = f"cannot make a cgroup under {host.bases[0]}: {exc.strerror or exc}"
            continue
        return host
    return f"no cgroup the worker may create: {why}"


def sweep_stale() -> int:
    """Remove the session cgroups of worker processes that no longer run.

    Only empty ones go (``rmdir`` refuses a cgroup with live processes, so a live
    session of another process is never touched). Returns how many were removed.
    """
    host = host_cgroups()
    if isinstance(host, str):
        return 0
    removed = 0
    for base in host.bases:
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                if entry.name.startswith(PREFIX) and is_stale(entry.name):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)
                        removed += 1
    return removed
