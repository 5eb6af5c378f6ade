"""The limits and knobs of the ``python`` tool, as one value object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolfleet.shared.errors import ConfigurationError

__all__ = ["PythonToolConfig"]

MiB = 2**20
#: The isolation modes of the sandbox; the second must be asked for by name.
ISOLATION_MODES = ("bubblewrap", "unsafe-none")
#: How a session's processes and memory are bounded together (see ``session_limits``).
SESSION_LIMITS = ("auto", "cgroup", "rlimit")


@dataclass(frozen=True)
class PythonToolConfig:
    """Sandbox limits and session policy of the ``python`` tool.

    Pass one to :func:`toolfleet.extensions.python.make_extension`; the default
    extension uses the defaults below. The wall-clock limit is not here: it is the
    tool's ``timeout_s`` (and the call's deadline), enforced by the worker.

    Attributes:
        cpu_s: CPU seconds one call may use (``RLIMIT_CPU`` soft limit, re-armed per
            call; 1 s granularity). Past it the code gets ``CPUTimeLimitExceeded``.
        session_cpu_s: CPU seconds one interpreter may use over its whole life
            (``RLIMIT_CPU`` hard limit); past it the kernel kills it (``SIGKILL``).
        memory_bytes: memory of the whole session, bytes. With a cgroup: the group's
            memory limit (every process the code starts and the files it writes
            count; past it the kernel's OOM killer ends the biggest process). Always
            also each process's address-space limit (``RLIMIT_AS``), so one bigger
            allocation raises ``MemoryError`` in the code. Without a cgroup only the
            latter applies: the session's bound is then ``max_processes`` times this.
        max_file_bytes: largest file the code may write (``RLIMIT_FSIZE``); a bigger
            write fails with ``OSError`` (``EFBIG``).
        disk_bytes: size of the session's private tmpfs, bytes, which holds both its
            working directory (``/sandbox``) and ``/tmp``; past it writes fail with
            ``OSError`` (``ENOSPC``). Nothing is written to the host's disk
            (``bubblewrap`` only; ``unsafe-none`` writes to a host folder).
        max_processes: processes (and threads) of the whole session, or ``None`` for no
            cap: the cgroup's ``pids.max``, and ``RLIMIT_NPROC`` inside the sandbox,
            which counts per user of the sandbox's own user namespace, so per session.
            Under ``unsafe-none`` without a cgroup the kernel counts every process of
            the user, so ``RLIMIT_NPROC`` is then set only together with ``run_as_user``.
        session_limits: ``"auto"`` (default): a cgroup per session where the host lets
            the worker make one (see :mod:`toolfleet.extensions.python._cgroups`), else
            per-process limits; ``"cgroup"``: a cgroup or the tool is not served;
            ``"rlimit"``: per-process limits only. Without a cgroup a root worker
            starts the sandbox as uid 65534 unless ``run_as_user`` says otherwise, as
            the kernel does not apply ``RLIMIT_NPROC`` to host uid 0.
        max_output_bytes: bytes kept of each of ``stdout``, ``stderr``, ``result`` and
            ``error``; longer text keeps its first and last halves around a marker.
        max_sessions: interpreters kept alive per worker process (least recently used
            one stopped first).
        idle_timeout_s: an interpreter unused for this many seconds is stopped.
        interpreter: the Python executable of the sandbox; ``None`` for the worker's
            own (``sys.executable``). Its site-packages are what the code can import.
        run_as_user: user name or uid to run the sandbox as (needs a root worker);
            ``None`` runs it as the worker's user. A separate user cannot read the
            worker's ``/proc/<pid>/environ`` nor lift the resource limits.
        isolation: ``"bubblewrap"`` (default): the interpreter runs in its own user,
            PID, mount and network namespaces with a minimal read-only file system (see
            :mod:`toolfleet.extensions.python._sandbox`); where the host cannot do
            that, the tool is not served. ``"unsafe-none"``: only the resource limits;
            the code can read whatever the worker's user can (other processes' command
            lines, files) and use the network. Named so on purpose.
        network: give the sandbox the host's network (off by default).

    Raises:
        ConfigurationError: a limit is zero or negative, or ``isolation`` or
            ``session_limits`` is unknown.
    """

    cpu_s: float = 30.0
    session_cpu_s: float = 600.0
    memory_bytes: int = 512 * MiB
    max_file_bytes: int = 64 * MiB
    disk_bytes: int = 128 * MiB
    max_processes: int | None = 64
    max_output_bytes: int = 16_384
    max_sessions: int = 32
    idle_timeout_s: float = 600.0
    interpreter: str | None = None
    run_as_user: str | int | None = None
    isolation: Literal["bubblewrap", "unsafe-none"] = "bubblewrap"
    network: bool = False
    session_limits: Literal["auto", "cgroup", "rlimit"] = "auto"

    def __post_init__(self) -> None:
        positive = {
            "cpu_s": self.cpu_s,
            "session_cpu_s": self.session_cpu_s,
            "memory_bytes": self.memory_bytes,
            "max_file_bytes": self.max_file_bytes,
            "disk_bytes": self.disk_bytes,
            "max_output_bytes": self.max_output_bytes,
            "max_sessions": self.max_sessions,
            "idle_timeout_s": self.idle_timeout_s,
        }
        bad = [name for name, value in positive.items() if not value > 0]
        if self.max_processes is not None and self.max_processes < 1:
            bad.append("max_processes")
        if self.isolation not in ISOLATION_MODES:
            raise ConfigurationError(
                f"PythonToolConfig: isolation must be one of {', '.join(ISOLATION_MODES)}, "
                f"not {self.isolation!r}"
            )
        if self.session_limits not in SESSION_LIMITS:
            raise ConfigurationError(
                f"PythonToolConfig: session_limits must be one of {', '.join(SESSION_LIMITS)}, "
                f"not {self.session_limits!r}"
            )
        if bad:
            raise ConfigurationError(f"PythonToolConfig: must be positive: {', '.join(bad)}")
