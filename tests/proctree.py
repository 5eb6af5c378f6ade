"""Test helpers that read process trees from /proc (Linux): descendants, liveness, sandbox pids,
cgroups."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of ``pid``, or ``None`` when it is gone."""
    try:
        after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return after[0], int(after[1])


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    found = _stat(pid)
    return found is not None and found[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children, their children, ...), not ``root``."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        found = _stat(pid)
        if found is not None and found[0] not in ("Z", "X"):
            children.setdefault(found[1], []).append(pid)
    found_set: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found_set:
                found_set.add(child)
                todo.append(child)
    return found_set


def tree(root: int) -> set[int]:
    """``root`` and its live descendants."""
    return ({root} if alive(root) else set()) | descendants(root)


def all_gone(pids: set[int], within_s: float) -> set[int]:
    """Wait up to ``within_s`` for every pid to end; return the ones still alive."""
    deadline = time.monotonic() + within_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return left


def cmdline(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces ("" when gone)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except (FileNotFoundError, ProcessLookupError):
        return ""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds used by ``pid`` so far (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_pid(inner_pid: int, roots: set[int]) -> int:
    """The host pid of the process that ``roots``' PID namespace calls ``inner_pid``.

    Searches ``roots`` and their descendants; a process outside any PID namespace
    matches its own pid.

    Raises:
        LookupError: no such process.
    """
    for pid in sorted(set().union(*(tree(r) for r in roots)) if roots else set()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == inner_pid:
                return pid
    raise LookupError(f"no process {inner_pid} below {sorted(roots)}")


def _cgroup_mounts() -> list[tuple[str, Path, str, set[str]]]:
    """``(fstype, mount point, mounted root, super options)`` of each cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, tails = fields.split(), tail.split()
        if tails and tails[0] in ("cgroup", "cgroup2"):
            found.append((tails[0], Path(parts[4]), parts[3], set(tails[2].split(","))))
    return found


def cgroup_dirs(pid: int) -> list[str]:
    """The folders (under /sys/fs/cgroup) of every cgroup ``pid`` is in, root ones left out."""
    folders: list[str] = []
    mounts = _cgroup_mounts()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path == "/":
            continue
        names = set(controllers.split(",")) if controllers else set()
        for fstype, point, root, options in mounts:
            if (fstype == "cgroup2") if not names else bool(names & options):
                relative = path[len(root) :] if root != "/" and path.startswith(root) else path
                folders.append(str(point / relative.lstrip("/")))
                break
    return folders


def session_cgroup_dirs(pid: int) -> list[str]:
    """The cgroup folders of ``pid`` that are python-tool sessions (named toolfleet-python-*)."""
    return [f for f in cgroup_dirs(pid) if Path(f).name.startswith("toolfleet-python-")]
