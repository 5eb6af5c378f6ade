"""The isolation boundary of the ``python`` tool: how its interpreter is launched.

``bubblewrap`` (the default): the interpreter runs under ``bwrap`` in new user, PID,
mount, network, IPC, UTS and cgroup namespaces. Inside, the file system is a fresh,
read-only ``tmpfs`` root holding only, read-only, ``/usr`` (with the ``/bin``, ``/lib*``
links), a few files of ``/etc`` (dynamic loader cache, time zone, TLS roots, name
resolution), the interpreter's installation (its prefix and, for a virtual
environment, its base), the REPL script and the lifeline module under
``/run/toolfleet``. Writable: one private ``tmpfs`` of ``disk_bytes`` holding the
session's directory ``/sandbox`` and ``/tmp`` (a link to ``/sandbox/tmp``), and a
``tmpfs`` of ``disk_bytes / 4`` on ``/dev/shm`` (POSIX semaphores and shared memory);
nothing the code writes reaches the host's disk, and it all ends with the sandbox.
``/proc`` is the sandbox's own: its processes only, so no other process's command line
or environment. The environment is :func:`sandbox_env` and nothing else. The code runs
as uid/gid 65534 of the new user namespace. There is no network unless
:attr:`PythonToolConfig.network` is true (then the host's network namespace is
shared). ``bwrap --die-with-parent`` and the PID namespace end every process of the
sandbox when the worker process dies.

The session as a whole (see :attr:`PythonToolConfig.session_limits`): where the host
lets the worker make cgroups (:mod:`._cgroups`), each interpreter runs in its own, with
``pids.max`` = ``max_processes`` and the memory limit = ``memory_bytes``. Elsewhere
``RLIMIT_NPROC`` caps the processes: the kernel counts it per user *of the sandbox's
user namespace*, so per session, except for host uid 0, which it exempts; a root worker
therefore starts the sandbox as uid 65534 then (whose folders it binds must be readable
by that user). Memory is then bounded per process only (``RLIMIT_AS``), so the session
may hold ``max_processes`` times ``memory_bytes``.

``unsafe-none``: no boundary, only the resource limits (the code runs as the worker's
user, sees every process of the machine and the network, and writes to a host folder).
An operator must ask for it by name (``PythonToolConfig(isolation="unsafe-none")``).

Where ``bubblewrap`` is asked for and the host cannot provide it (not Linux, ``bwrap``
older than 0.5 or not installed, user namespaces disabled), :func:`unavailable_reason`
says why; the extension is then not served (see
:func:`toolfleet.extensions.python.make_extension`) and ``toolfleet extensions check``
prints the reason.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfleet.extensions.python._cgroups import HostCgroups, host_cgroups
from toolfleet.extensions.python.config import PythonToolConfig
from toolfleet.shared import lifeline

__all__ = [
    "INSIDE_RUNTIME",
    "INSIDE_WORKDIR",
    "REPL_SCRIPT",
    "SANDBOX_PATH",
    "Launch",
    "launch",
    "sandbox_env",
    "session_cgroups",
    "unavailable_reason",
]

REPL_SCRIPT = Path(__file__).with_name("_repl.py")
LIFELINE = Path(lifeline.__file__)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Where the session's directory appears inside the sandbox.
INSIDE_WORKDIR = "/sandbox"
#: Where the REPL script and the lifeline module appear inside the sandbox.
INSIDE_RUNTIME = "/run/toolfleet"
#: uid and gid of the code inside the sandbox's user namespace ("nobody").
INSIDE_ID = 65534
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
)
_PROBE_TIMEOUT_S = 20.0


def sandbox_env(workdir: str) -> dict[str, str]:
    """The whole environment of the sandbox: nothing is inherited from the worker.

    ``PATH`` and ``LANG`` make ordinary programs work; ``HOME`` and ``TMPDIR`` point
    into the working directory (removed afterwards); the thread-count variables keep
    numeric libraries from reserving memory per CPU, which ``RLIMIT_AS`` would count.
    """
    return {
        "PATH": SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@dataclass(frozen=True)
class Launch:
    """How to start one interpreter.

    Attributes:
        argv: the command line (``bwrap ... python ...`` or ``python ...``).
        env: its whole environment.
        parent_pid: the pid the REPL sees as its parent (1 inside a PID namespace).
        lifeline: path of :mod:`toolfleet.shared.lifeline` as the REPL sees it.
        repl: path of the REPL script as the interpreter sees it.
        cwd: the host directory to start it in.
        user: ``(uid, gid)`` to start it as, or ``None`` for the worker's own.
        limit_processes: whether the REPL sets ``RLIMIT_NPROC`` (only where the kernel
            counts it for this session alone).
    """

    argv: list[str]
    env: dict[str, str]
    parent_pid: int
    lifeline: str
    repl: str
    cwd: str = "/"
    user: tuple[int, int] | None = None
    limit_processes: bool = False


def session_cgroups(config: PythonToolConfig) -> HostCgroups | None:
    """Where the sessions of ``config`` get their cgroups; ``None``: per-process limits."""
    if config.session_limits == "rlimit":
        return None
    host = host_cgroups()
    return None if isinstance(host, str) else host


def sandbox_user(config: PythonToolConfig) -> tuple[int, int] | None:
    """``(uid, gid)`` the sandbox is started as; ``None`` for the worker's own.

    ``run_as_user`` when set; else, for a root worker under bubblewrap whose sessions
    have no cgroup but a process cap, 65534 (the kernel does not apply ``RLIMIT_NPROC``
    to host uid 0).

    Raises:
        KeyError: ``run_as_user`` names no user.
    """
    if config.run_as_user is not None:
        entry = (
            pwd.getpwuid(config.run_as_user)
            if isinstance(config.run_as_user, int)
            else pwd.getpwnam(config.run_as_user)
        )
        return entry.pw_uid, entry.pw_gid
    if (
        config.isolation == "bubblewrap"
        and config.max_processes is not None
        and os.geteuid() == 0
        and session_cgroups(config) is None
    ):
        return INSIDE_ID, INSIDE_ID
    return None


def launch(config: PythonToolConfig, workdir: str | None, interpreter_args: list[str]) -> Launch:
    """The command that starts the interpreter of ``config``.

    Args:
        config: the tool's limits; ``isolation`` and ``network`` shape the sandbox.
        workdir: the session's directory on the host, needed by ``unsafe-none`` only
            (under bubblewrap the session's directory is a private tmpfs).
        interpreter_args: arguments after the interpreter, with ``{repl}`` standing for
            the REPL script's path.

    Raises:
        ValueError: ``unsafe-none`` without a ``workdir``.
        KeyError: ``run_as_user`` names no user.
    """
    python = config.interpreter or sys.executable
    user = sandbox_user(config)
    capped = config.max_processes is not None
    if config.isolation == "unsafe-none":
        if workdir is None:
            raise ValueError("isolation='unsafe-none' runs the interpreter in a host folder")
        argv = [python, *(a.replace("{repl}", str(REPL_SCRIPT)) for a in interpreter_args)]
        return Launch(argv, sandbox_env(workdir), os.getpid(), str(LIFELINE), str(REPL_SCRIPT),
                      workdir, user, capped and user is not None)  # fmt: skip
    repl = f"{INSIDE_RUNTIME}/repl.py"
    inside = [python, *(a.replace("{repl}", repl) for a in interpreter_args)]
    argv = [*_bwrap_prefix(config), "--", *inside]
    lifeline_inside = f"{INSIDE_RUNTIME}/lifeline.py"
    return Launch(argv, sandbox_env(INSIDE_WORKDIR), 1, lifeline_inside, repl, "/", user, capped)


def _bwrap_prefix(config: PythonToolConfig) -> list[str]:
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(INSIDE_ID),
        "--gid",
        str(INSIDE_ID),
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        # /proc, /dev and the session's tmpfs (with /tmp in it) first: bwrap mounts in
        # order, so the binds below stay visible even when the interpreter or this
        # package lives under /tmp
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(max(config.disk_bytes // 4, 2**20)),
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(config.disk_bytes),
        "--tmpfs",
        INSIDE_WORKDIR,
        "--dir",
        f"{INSIDE_WORKDIR}/tmp",
        "--symlink",
        f"{INSIDE_WORKDIR.lstrip('/')}/tmp",
        "/tmp",
    ]
    if config.network:
        argv.append("--share-net")
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    for prefix in _python_prefixes(config.interpreter or sys.executable):
        argv += ["--ro-bind", prefix, prefix]
    argv += [
        "--ro-bind",
        str(REPL_SCRIPT),
        f"{INSIDE_RUNTIME}/repl.py",
        "--ro-bind",
        str(LIFELINE),
        f"{INSIDE_RUNTIME}/lifeline.py",
        "--chdir",
        INSIDE_WORKDIR,
        # the root and /dev are tmpfs too, unbounded: no writes there
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
    ]
    return argv


def _python_prefixes(interpreter: str) -> list[str]:
    """Installation folders the interpreter needs, outside ``/usr`` (bound read-only).

    For the worker's own interpreter: ``sys.prefix`` and ``sys.base_prefix``. For
    another one: the folder above its ``bin/``, before and after resolving links (a
    virtual environment and the installation it was made from).
    """
    found: list[str] = []
    if interpreter == sys.executable:
        candidates = [Path(sys.prefix), Path(sys.base_prefix)]
    else:
        candidates = [Path(interpreter).parent.parent, Path(interpreter).resolve().parent.parent]
    for candidate in candidates:
        path = str(candidate)
        if path in ("/", "/usr") or path.startswith("/usr/") or path in found:
            continue
        if candidate.is_dir():
            found.append(path)
    return found


def unavailable_reason(config: PythonToolConfig) -> str | None:
    """Why this host cannot run the sandbox ``config`` asks for; ``None`` when it can.

    Starts the sandbox once (cached per process and configuration) with an interpreter
    that exits at once, so that a missing ``bwrap``, disabled user namespaces or an
    interpreter the sandbox cannot see are all found before any call. With
    ``session_limits="cgroup"``, a host where the worker cannot make cgroups is a
    reason too.
    """
    if config.session_limits == "cgroup":
        host = host_cgroups()
        if isinstance(host, str):
            return f"the python sandbox was asked for a cgroup per session, but {host}"
    if config.isolation == "unsafe-none":
        return None
    return _probe(config)


@functools.lru_cache(maxsize=16)
def _probe(config: PythonToolConfig) -> str | None:
    if not sys.platform.startswith("linux"):
        return f"the python sandbox needs Linux namespaces (bubblewrap); this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return (
            "the python sandbox needs bubblewrap (`bwrap`), which is not installed "
            "(Debian/Ubuntu: apt-get install bubblewrap); or opt in to running model-written "
            'code without isolation with PythonToolConfig(isolation="unsafe-none")'
        )
    try:
        command = launch(config, None, ["-I", "-S", "-c", ""])
        user = {} if command.user is None else _as_user(*command.user)
        done = subprocess.run(
            command.argv,
            env=command.env,
            cwd=command.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
            **user,
        )
    except (OSError, KeyError, subprocess.TimeoutExpired) as exc:
        return f"the python sandbox (bubblewrap) could not start: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        as_user = (
            f"; it runs as uid {command.user[0]}, which must be able to read the "
            "interpreter's folders (a root worker without a cgroup per session starts it "
            "so, or set run_as_user, or give the worker a cgroup)"
            if command.user is not None
            else ""
        )
        return (
            "the python sandbox (bubblewrap) could not start"
            + (f": {why[-1]}" if why else f" (exit status {done.returncode})")
            + " (bubblewrap's own words; user namespaces disabled on the host, or a bwrap "
            "older than 0.5 without --size, are common causes)" + as_user
        )
    return None


def _as_user(uid: int, gid: int) -> dict[str, Any]:
    """Keyword arguments of :mod:`subprocess` that start a child as ``uid``/``gid``."""
    return {"user": uid, "group": gid, "extra_groups": []}
