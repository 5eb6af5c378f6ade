"""The limits and knobs of the ``python`` tool, as one value object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolfleet.shared.errors import ConfigurationError

__all__ = ["PythonToolConfig"]

MiB = 2**20
#: The isolation modes of the sandbox; the second must be asked for by name.
ISOLATION_MODES = ("bubblewrap", "unsafe-none")


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
        memory_bytes: address-space limit of the interpreter (``RLIMIT_AS``); a bigger
            allocation raises ``MemoryError`` in the code.
        max_file_bytes: largest file the code may write (``RLIMIT_FSIZE``); a bigger
            write fails with ``OSError`` (``EFBIG``).
        max_processes: ``RLIMIT_NPROC``, or ``None`` for no limit. The kernel counts
            every process of the user, so set it only together with ``run_as_user``.
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
        ConfigurationError: a limit is zero or negative, or ``isolation`` is unknown.
    """

    cpu_s: float = 30.0
    session_cpu_s: float = 600.0
    memory_bytes: int = 512 * MiB
    max_file_bytes: int = 64 * MiB
    max_processes: int | None = None
    max_output_bytes: int = 16_384
    max_sessions: int = 32
    idle_timeout_s: float = 600.0
    interpreter: str | None = None
    run_as_user: str | int | None = None
    isolation: Literal["bubblewrap", "unsafe-none"] = "bubblewrap"
    network: bool = False

    def __post_init__(self) -> None:
        positive = {
            "cpu_s": self.cpu_s,
            "session_cpu_s": self.session_cpu_s,
            "memory_bytes": self.memory_bytes,
            "max_file_bytes": self.max_file_bytes,
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
        if bad:
            raise ConfigurationError(f"PythonToolConfig: must be positive: {', '.join(bad)}")
