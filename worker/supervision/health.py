"""Liveness and readiness of a worker pod, for Kubernetes exec probes.

Each worker process rewrites ``<health_dir>/worker-<pid>.json`` every second from its
main loop, but only while it is healthy: its tool threads are not stuck past the limit
and its event loop is not blocked. Liveness needs no Redis: every live worker process
has a fresh file. Readiness also needs Redis to answer and every process to have loaded
its extensions and started consuming.

Waiting for Redis is not a failure of the process (restarting it would not bring Redis
back): a worker process waiting for Redis keeps its file fresh with ``ready`` false, and
the supervisor, which waits for Redis before it starts any worker process, keeps
``<health_dir>/supervisor-<pid>.json`` fresh meanwhile. The pod is then live, not ready.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.urls import check_redis_url
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = [
    "HealthReport",
    "check_live",
    "check_ready",
    "remove_heartbeat",
    "remove_supervisor_beat",
    "write_heartbeat",
    "write_supervisor_beat",
]

#: The file name prefix of the supervisor's beat while it waits for Redis.
SUPERVISOR = "supervisor"


def write_heartbeat(directory: Path, ready: bool, functions: int) -> None:
    """Atomically (re)write this process's heartbeat file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"worker-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"pid": os.getpid(), "ready": ready, "functions": functions, "at": time.time()})
    )
    tmp.replace(path)


def write_supervisor_beat(directory: Path) -> None:
    """Atomically (re)write the supervisor's beat: it runs, waiting for Redis to answer."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{SUPERVISOR}-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "waiting": "redis", "at": time.time()}))
    tmp.replace(path)


def remove_supervisor_beat(directory: Path) -> None:
    """Delete the supervisor's beat (it stopped waiting for Redis, or exits)."""
    (directory / f"{SUPERVISOR}-{os.getpid()}.json").unlink(missing_ok=True)


@dataclass(frozen=True)
class HealthReport:
    """The outcome of a check.

    Attributes:
        ok: whether the check passed.
        reason: why not, or a summary when it passed.
    """

    ok: bool
    reason: str


#: What a worker process's command line holds (a reused pid's does not).
WORKER_COMMAND = b"toolfleet.worker.supervision.worker_process"


def _pid_alive(pid: int, command: bytes | None = WORKER_COMMAND) -> bool:
    """True when ``pid`` is a running process whose command line holds ``command``.

    Not a thread id, nor another program that reused the number (checked in ``/proc``);
    ``command`` ``None``: any process.
    """
    if pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            return False
        tgid = next(
            (line.split()[1] for line in status.splitlines() if line.startswith("Tgid:")), ""
        )
        return tgid == str(pid) and (command is None or command in cmdline)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_heartbeat(directory: Path, pid: int | None = None) -> None:
    """Delete a process's heartbeat file (its own at exit; a dead child's by the supervisor)."""
    (directory / f"worker-{pid or os.getpid()}.json").unlink(missing_ok=True)


def _live_beats(directory: Path) -> list[dict[str, float]]:
    beats = []
    for path in sorted(directory.glob("worker-*.json")) if directory.is_dir() else []:
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(int(beat.get("pid", 0))):
            beat["mtime"] = path.stat().st_mtime
            beats.append(beat)
    return beats


def _waiting_supervisor(directory: Path, stale_s: float) -> bool:
    """True when a running supervisor has a fresh beat: it waits for Redis."""
    now = time.time()
    for path in directory.glob(f"{SUPERVISOR}-*.json") if directory.is_dir() else []:
        try:
            pid = int(json.loads(path.read_text()).get("pid", 0))
            fresh = now - path.stat().st_mtime <= stale_s
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if fresh and _pid_alive(pid, None):
            return True
    return False


def check_live(directory: Path, stale_s: float) -> HealthReport:
    """Live when every worker process has a fresh heartbeat, and one runs or the supervisor waits.

    A supervisor waiting for Redis is live: a dependency's outage is not the process's
    failure (readiness says it, :func:`check_ready`).
    """
    beats = _live_beats(directory)
    if not beats and _waiting_supervisor(directory, stale_s):
        return HealthReport(True, "waiting for Redis before starting the worker processes")
    if not beats:
        return HealthReport(False, f"no live worker process has a heartbeat in {directory}")
    now = time.time()
    stale = [int(b["pid"]) for b in beats if now - b["mtime"] > stale_s]
    if stale:
        which = (
            f"worker process {stale[0]} has"
            if len(stale) == 1
            else f"worker processes {stale} have"
        )
        return HealthReport(False, f"{which} not been healthy for {stale_s:.0f} s")
    return HealthReport(True, f"{_processes(len(beats))} healthy")


def _processes(count: int) -> str:
    """``"1 worker process"``, ``"3 worker processes"``."""
    return f"{count} worker process" + ("" if count == 1 else "es")


def check_ready(
    directory: Path, stale_s: float, redis_url: str | None, *, factory: str | None = None
) -> HealthReport:
    """Ready when live, every process has loaded its extensions, and Redis answers.

    ``factory`` (``MODULE:ATTR``, ``TOOLFLEET_REDIS_CLIENT``) makes the client to ping
    instead of ``redis_url``.
    """
    live = check_live(directory, stale_s)
    if not live.ok:
        return live
    if not all(b.get("ready") for b in _live_beats(directory)):
        return HealthReport(False, "a worker process is still starting")
    if not redis_url and not factory:
        return HealthReport(False, "no Redis URL configured")
    try:
        if not factory:
            check_redis_url(redis_url or "")  # a malformed URL is the one-line reason
        options = {"socket_timeout": 2, "socket_connect_timeout": 2}
        redis_client(redis_url or "", factory=factory, **options).ping()
    except ConfigurationError as exc:
        return HealthReport(False, str(exc))
    except redis.RedisError as exc:
        return HealthReport(False, f"Redis unreachable: {exc}")
    return HealthReport(True, live.reason + ", Redis reachable")
