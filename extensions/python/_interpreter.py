"""One sandboxed interpreter: a child process running ``_repl.py``, and the protocol to it.

Everything here runs on the worker's event loop and never blocks it: the child is
started with :func:`asyncio.create_subprocess_exec`, its pipes are read with asyncio
streams, and the working directory is removed on a thread.

Why the limits are set by the child itself and not in a ``preexec_fn``: the worker
process is multi-threaded, where ``preexec_fn`` may deadlock (see :mod:`subprocess`).
``_repl.py`` sets them first thing, before it reads any code, which is as strict.
The new process group (``start_new_session``) lets :meth:`Interpreter.kill` stop the
interpreter and every process it started with one ``killpg``; a session cgroup, where
there is one, is emptied and removed after it (:mod:`._cgroups`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from toolfleet.extensions.python._cgroups import SessionCgroup
from toolfleet.extensions.python._leftovers import sweep_if_due
from toolfleet.extensions.python._output import OutputBuffer
from toolfleet.extensions.python._owner import owned_name
from toolfleet.extensions.python._sandbox import (
    Launch,
    launch,
    sandbox_env,
    session_cgroups,
    unavailable_reason,
)
from toolfleet.extensions.python.config import PythonToolConfig

__all__ = ["CellOutput", "Interpreter", "InterpreterTimeout", "sandbox_env", "wait_tidied"]

_CHUNK = 65536
_EXIT_WAIT_S = 0.5
_TIDY_WAIT_S = 5.0
_EXIT_CLEANUP_S = 1.0

_LIVE: set[Interpreter] = set()
_TIDYING: set[asyncio.Task[None]] = set()
_warned: set[str] = set()

log = logging.getLogger("toolfleet.extensions.python")


@dataclass(frozen=True)
class CellOutput:
    """What one call produced.

    Attributes:
        stdout: the code's standard output (clipped to ``max_output_bytes``).
        stderr: its standard error (clipped likewise).
        result: ``repr`` of the last expression's value, or ``None``.
        error: ``"ExcType: message"`` and the user's traceback, or ``None``.
        lost: why the interpreter is gone after this call (it exited or was killed
            while running the code), else ``None``.
    """

    stdout: str
    stderr: str
    result: str | None
    error: str | None
    lost: str | None = None


class InterpreterTimeout(Exception):
    """The call's time limit passed while the code ran; the interpreter was killed."""


class Interpreter:
    """A running ``_repl.py`` child; use :meth:`start` to make one.

    Attributes:
        process: the asyncio child process (its pid is also its process group id).
        workdir: its host working directory (``unsafe-none`` only; under bubblewrap it
            is a tmpfs of the sandbox), removed by :meth:`kill`.
        cgroup: its session cgroup, or ``None``; removed by :meth:`kill`.
        config: the limits it was started with.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        workdir: str | None,
        config: PythonToolConfig,
        cgroup: SessionCgroup | None = None,
    ) -> None:
        self.process = process
        self.workdir = workdir
        self.cgroup = cgroup
        self.config = config
        self.loop = asyncio.get_running_loop()
        self._killed = False
        _LIVE.add(self)

    @classmethod
    async def start(cls, config: PythonToolConfig) -> Interpreter:
        """Start a sandboxed interpreter in a fresh private directory (and cgroup).

        Also sweeps, at most once a minute, what killed workers left (:mod:`._leftovers`).

        Raises:
            OSError: the interpreter could not be started (missing executable, no
                permission to switch to ``run_as_user``, out of processes, its cgroup
                could not be made).
            KeyError: ``run_as_user`` names no user.
        """
        unsafe = config.isolation == "unsafe-none"
        if unsafe and config.run_as_user is None and os.geteuid() == 0 and "root" not in _warned:
            _warned.add("root")
            log.warning(
                "the python sandbox runs as root: the code it runs can lift its own "
                "limits and read any file; run the worker unprivileged or set run_as_user"
            )
        unavailable = unavailable_reason(config)
        if unavailable:
            raise OSError(unavailable)
        await asyncio.to_thread(sweep_if_due)
        workdir = None
        if config.isolation == "unsafe-none":
            workdir = tempfile.mkdtemp(prefix=owned_name() + "-")
        cgroup: SessionCgroup | None = None
        try:
            command = launch(config, workdir, ["-I", "-B", "{repl}", "{config}"])
            kwargs: dict[str, Any] = {}
            if command.user is not None:
                uid, gid = command.user
                if workdir is not None:
                    os.chown(workdir, uid, gid)
                kwargs = {"user": uid, "group": gid, "extra_groups": []}
            child_config = json.dumps(_child_config(config, command))
            argv = [child_config if arg == "{config}" else arg for arg in command.argv]
            host = session_cgroups(config)
            if host is not None:
                cgroup = await asyncio.to_thread(
                    host.create, config.max_processes, config.memory_bytes
                )
                argv = cgroup.wrap(argv)
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=command.cwd,
                env=command.env,
                start_new_session=True,
                **kwargs,
            )
            if cgroup is not None:
                await _enter(process, cgroup)
        except BaseException:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if cgroup is not None:
                cgroup.remove()
            raise
        return cls(process, workdir, config, cgroup)

    @property
    def alive(self) -> bool:
        """True until the child exited or was killed."""
        return not self._killed and self.process.returncode is None

    async def execute(self, code: str, *, deadline: float, cpu_s: float) -> CellOutput:
        """Run ``code`` in the interpreter.

        Args:
            code: Python source.
            deadline: event-loop time (``loop.time()``) at which to give up.
            cpu_s: CPU seconds the code may use.

        Returns:
            The output; ``lost`` is set when the interpreter died meanwhile.

        Raises:
            InterpreterTimeout: ``deadline`` passed; the interpreter was killed.
            asyncio.CancelledError: the call was cancelled; the interpreter was killed.
        """
        limit = self.config.max_output_bytes
        token = secrets.token_hex(16)
        request = {"code": code, "token": token, "cpu_s": cpu_s, "max_bytes": limit}
        out, err = OutputBuffer(limit), OutputBuffer(limit)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._exchange(request, token.encode("ascii"), out, err)
        except TimeoutError:
            self.kill()
            raise InterpreterTimeout("the time limit passed while the code ran") from None
        except BaseException:
            self.kill()  # cancelled (the worker's time limit) or a bug: never leave it running
            raise

    async def _exchange(
        self, request: dict[str, Any], token: bytes, out: OutputBuffer, err: OutputBuffer
    ) -> CellOutput:
        stdin, stdout, stderr = self.process.stdin, self.process.stdout, self.process.stderr
        assert stdin is not None and stdout is not None and stderr is not None
        try:
            stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            await stdin.drain()
        except ConnectionError:
            return await self._lost(out, err)
        after = await self._collect(token, out, err)
        if after is None:
            return await self._lost(out, err)
        reply = await _read_line(stdout, after, 8 * self.config.max_output_bytes + 4096)
        if reply is None:
            garbled = "the interpreter's reply was garbled by output written as the call ended"
            return await self._lost(out, err, garbled)
        return CellOutput(
            stdout=out.text(),
            stderr=err.text(),
            result=_str_or_none(reply.get("result")),
            error=_str_or_none(reply.get("error")),
        )

    async def _collect(self, token: bytes, out: OutputBuffer, err: OutputBuffer) -> bytes | None:
        """Read stdout and stderr up to ``token``; the bytes after it on stdout, or ``None``."""
        assert self.process.stdout is not None and self.process.stderr is not None
        tasks = [
            asyncio.ensure_future(_read_until(self.process.stdout, token, out)),
            asyncio.ensure_future(_read_until(self.process.stderr, token, err)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if any(task.result() is None for task in done):
                self._signal_group()  # no process of the group may hold the pipes open
            await asyncio.wait(tasks)
            after, tail = tasks[0].result(), tasks[1].result()
            return None if after is None or tail is None else after
        finally:
            for task in tasks:
                task.cancel()

    async def _lost(
        self, out: OutputBuffer, err: OutputBuffer, why: str | None = None
    ) -> CellOutput:
        """The interpreter went away during the call (or broke the protocol): say why."""
        if why is None:
            try:
                why = describe_exit(
                    await asyncio.wait_for(self.process.wait(), _EXIT_WAIT_S), self.config
                )
            except TimeoutError:
                why = "the interpreter stopped answering (its output was closed)"
        self.kill()
        error = (
            f"InterpreterExited: {why}; its variables are lost and the next call starts "
            "a fresh interpreter"
        )
        return CellOutput(out.text(), err.text(), None, error, lost=why)

    def kill(self) -> None:
        """Kill the interpreter and its process group now; remove its directory after.

        Idempotent and synchronous (safe in a cancellation handler); the directory is
        removed on a thread once the child is reaped, or at once outside the loop.
        """
        if self._killed:
            return
        self._killed = True
        self._signal_group()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop and not running.is_closed():
            task = running.create_task(self._tidy())
            _TIDYING.add(task)
            task.add_done_callback(_TIDYING.discard)
        else:
            self._remove_workdir()

    def _signal_group(self) -> None:
        # The group outlives the interpreter while a process it started is alive, and
        # its id cannot be reused by a new process before then.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def _tidy(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), _TIDY_WAIT_S)
        # Release the pipes now rather than when the garbage collector finds them
        # (asyncio's Process has no public close; its transport does).
        transport = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()
        try:
            await asyncio.to_thread(self._remove_workdir)
        except RuntimeError:  # the worker is exiting and takes no new threads
            self._remove_workdir()

    def _remove_workdir(self, wait_s: float = 2.0) -> None:
        """Remove the host folder and the cgroup (waiting up to ``wait_s`` for the latter)."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.cgroup is not None and not self.cgroup.remove(wait_s):
            log.warning("could not remove the session cgroup %s", self.cgroup.folders[0])
        _LIVE.discard(self)


async def _enter(process: asyncio.subprocess.Process, cgroup: SessionCgroup) -> None:
    """Move the waiting launcher into ``cgroup``, then let it start the sandbox.

    Raises:
        OSError: it could not be moved (it is killed).
    """
    assert process.stdin is not None
    try:
        await asyncio.to_thread(cgroup.join, process.pid)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    process.stdin.write(b"\n")
    await process.stdin.drain()


async def wait_tidied() -> None:
    """Wait until every interpreter killed on this loop is reaped and its directory gone."""
    loop = asyncio.get_running_loop()
    tasks = [task for task in _TIDYING if task.get_loop() is loop]
    if tasks:
        await asyncio.wait(tasks)


def describe_exit(status: int, config: PythonToolConfig) -> str:
    """Say how the interpreter ended, from its exit status (negative: a signal)."""
    if status >= 0:
        return f"the interpreter exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    if -status == signal.SIGKILL:
        return (
            f"the interpreter was killed ({name}), e.g. because it used up its "
            f"{config.session_cpu_s:g} s of CPU time or the machine ran out of memory"
        )
    return f"the interpreter was killed by {name}"


async def _read_until(
    reader: asyncio.StreamReader, token: bytes, sink: OutputBuffer
) -> bytes | None:
    """Copy ``reader`` into ``sink`` up to ``token``; return what followed it (``None`` at EOF)."""
    keep = len(token) - 1
    pending = b""
    while True:
        chunk = await reader.read(_CHUNK)
        if not chunk:
            sink.write(pending)
            return None
        pending += chunk
        found = pending.find(token)
        if found >= 0:
            sink.write(pending[:found])
            return pending[found + len(token) :]
        if len(pending) > keep:
            sink.write(pending[:-keep])
            pending = pending[-keep:]


async def _read_line(
    reader: asyncio.StreamReader, start: bytes, limit: int
) -> dict[str, Any] | None:
    """Read the reply line that follows the token; ``None`` if it is missing or malformed."""
    data = start
    while b"\n" not in data:
        if len(data) > limit:
            return None
        chunk = await reader.read(_CHUNK)
        if not chunk:
            return None
        data += chunk
    try:
        reply = json.loads(data[: data.index(b"\n")])
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _child_config(config: PythonToolConfig, command: Launch) -> dict[str, Any]:
    return {
        "parent_pid": command.parent_pid,
        "lifeline": command.lifeline,
        "memory_bytes": config.memory_bytes,
        "session_cpu_s": config.session_cpu_s,
        "max_file_bytes": config.max_file_bytes,
        "max_processes": config.max_processes if command.limit_processes else None,
    }


@atexit.register
def _kill_all() -> None:
    """Leave no interpreter or directory behind when the worker process exits."""
    for interpreter in list(_LIVE):
        interpreter._signal_group()
    deadline = time.monotonic() + _EXIT_CLEANUP_S  # what is left, the next start sweeps
    for interpreter in list(_LIVE):
        interpreter._remove_workdir(wait_s=max(0.0, deadline - time.monotonic()))
