"""The sandbox side of the ``python`` tool: a small REPL server, run as a script.

The worker starts it (see ``_interpreter.py``) as ``python -I -B _repl.py CONFIG``, in a
new session and process group, with an empty environment and a fresh working
directory. It imports only the standard library, never toolfleet: in isolated mode
(``-I``) neither the script's folder nor ``PYTHON*`` variables reach ``sys.path``.

Start-up, before any user code: ask the kernel to kill it when its parent dies (with
``toolfleet.shared.lifeline``, loaded from the file the worker names), set the
resource limits (``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, no
core files), keep the request pipe on a private descriptor and put ``/dev/null`` on
descriptor 0, so that the code (and any process it starts) reads end-of-file.

Protocol, one request at a time:

- request: one JSON line on the private descriptor,
  ``{"code": str, "token": str, "cpu_s": float, "max_bytes": int}``;
- reply: after the code ran and ``sys.stdout``/``sys.stderr`` were flushed, ``token`` is
  written to descriptor 2, then ``token`` and one JSON line ``{"result", "error"}`` to
  descriptor 1. The code's output travels on the same two pipes, so the worker knows
  where one call's output ends even when the code wrote to the descriptors directly
  (``os.system``, C extensions).
- end of file on the request pipe (the worker closed it or died): remove the working
  directory and exit.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import io
import json
import linecache
import math
import os
import resource
import shutil
import signal
import sys
import traceback
import types
from typing import Any

CELL_PREFIX = "<cell "
MAX_FRAMES = 12
MARKER = "\n[... {omitted} bytes omitted ...]\n"


class CPUTimeLimitExceeded(BaseException):
    """Raised in the code when a call used up its CPU time (``SIGXCPU``)."""


class _State:
    in_cell = False
    cpu_s = 0.0
    hard_cpu = resource.RLIM_INFINITY


def main(argv: list[str]) -> int:
    """Serve requests until end of file; return the exit status."""
    config: dict[str, Any] = json.loads(argv[1])
    _die_with_parent(str(config["lifeline"]), int(config["parent_pid"]))
    _limit_resources(config)
    requests = _take_request_pipe()
    workdir = os.getcwd()
    namespace = _fresh_main(workdir)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    for cell, line in enumerate(requests, start=1):
        _serve(json.loads(line), namespace, f"{CELL_PREFIX}{cell}>")
    os.chdir("/")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _die_with_parent(lifeline_path: str, parent_pid: int) -> None:
    """Load ``toolfleet.shared.lifeline`` from its file (toolfleet is not importable here)."""
    spec = importlib.util.spec_from_file_location("toolfleet_lifeline", lifeline_path)
    if spec is None or spec.loader is None:  # pragma: no cover - the worker passes the file
        os._exit(1)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.die_with_parent(parent_pid)


def _limit_resources(config: dict[str, Any]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    memory = int(config["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    _State.hard_cpu = math.ceil(float(config["session_cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (_State.hard_cpu, _State.hard_cpu))
    size = int(config["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG
    if config.get("max_processes"):
        count = int(config["max_processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))


def _take_request_pipe() -> Any:
    private = os.dup(0)  # not inheritable: processes the code starts do not get it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return os.fdopen(private, "rb")


def _fresh_main(workdir: str) -> dict[str, Any]:
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_module  # so that pickle and friends find user classes
    sys.argv = [""]
    sys.path.insert(0, workdir)
    return main_module.__dict__


def _on_sigxcpu(signum: int, frame: types.FrameType | None) -> None:
    if _State.in_cell:
        raise CPUTimeLimitExceeded(f"the code used more than {_State.cpu_s:g} s of CPU time")


def _arm_cpu_limit(cpu_s: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    soft = max(math.floor(used) + 1, round(used + cpu_s))  # whole seconds only
    if _State.hard_cpu != resource.RLIM_INFINITY:
        soft = min(soft, _State.hard_cpu)
    _State.cpu_s = cpu_s
    resource.setrlimit(resource.RLIMIT_CPU, (soft, _State.hard_cpu))


def _serve(request: dict[str, Any], namespace: dict[str, Any], filename: str) -> None:
    limit = int(request["max_bytes"])
    try:
        _arm_cpu_limit(float(request["cpu_s"]))
        _State.in_cell = True
        try:
            result, error = run_cell(str(request["code"]), namespace, filename)
        finally:
            _State.in_cell = False
            resource.setrlimit(resource.RLIMIT_CPU, (_State.hard_cpu, _State.hard_cpu))
    except BaseException as exc:  # noqa: BLE001 - e.g. SIGXCPU right at the end of the cell
        result, error = None, describe_error(exc)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    token = str(request["token"]).encode("ascii")
    reply = {
        "result": None if result is None else clip(result, limit),
        "error": None if error is None else clip(error, limit),
    }
    _write_all(2, token)
    _write_all(1, token + json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n")


def run_cell(code: str, namespace: dict[str, Any], filename: str) -> tuple[str | None, str | None]:
    """Run ``code`` like a REPL cell.

    Returns:
        ``(repr of the last expression's value or None, error text or None)``.
    """
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
        last: ast.Expression | None = None
        final = tree.body[-1] if tree.body else None
        if isinstance(final, ast.Expr):
            tree.body.pop()
            last = ast.Expression(final.value)
        exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
        value = None
        if last is not None:
            value = eval(compile(last, filename, "eval", dont_inherit=True), namespace)
        if value is None:
            return None, None
        namespace["_"] = value
        return repr(value), None
    except BaseException as exc:  # noqa: BLE001 - the model reads every failure
        return None, describe_error(exc)


def describe_error(exc: BaseException) -> str:
    """``"ExcType: message"``, then a traceback of the user's own frames only."""
    message = _safe_str(exc)
    lines = [f"{type(exc).__name__}: {message}" if message else type(exc).__name__]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_cell(f.filename)]
    details: list[str] = []
    if frames:
        if len(frames) > MAX_FRAMES:
            details.append(f"  ... {len(frames) - MAX_FRAMES} earlier frames omitted\n")
            frames = frames[-MAX_FRAMES:]
        details = ["Traceback (most recent call last):\n", *details]
        details += traceback.StackSummary.from_list(frames).format()
    if frames or isinstance(exc, SyntaxError):
        details += traceback.format_exception_only(type(exc), exc)
    text = "\n".join(lines) + ("\n" + "".join(details).rstrip("\n") if details else "")
    return _clean(text)


def _is_cell(filename: str) -> bool:
    return filename.startswith(CELL_PREFIX)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not break the reply
        return "<exception str() failed>"


def _clean(text: str) -> str:
    """Replace lone surrogates so the text encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clip(text: str, limit: int) -> str:
    """Keep at most ``limit`` UTF-8 bytes of ``text``: its first and last halves and a marker."""
    data = _clean(text).encode("utf-8")
    if len(data) <= limit:
        return data.decode("utf-8")
    head = data[: limit - limit // 2].decode("utf-8", "ignore")
    tail = data[len(data) - limit // 2 :].decode("utf-8", "ignore")
    omitted = len(data) - limit
    return head + MARKER.format(omitted=omitted) + tail


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
