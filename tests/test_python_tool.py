"""The built-in ``python`` extension: a sandboxed, persistent Python REPL tool.

Unit tests call the tool class directly on an event loop that lives for the test (as
the worker's does); fleet tests go through real worker processes started with the
CLI. The fleet also loads ``quick_extension`` below (a 1 s limit) from this module.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from conftest import LATE_S, Fleet, require_sandbox, start_fleet
from proctree import host_pid
from toolfleet.extensions.python import (
    PythonToolConfig,
    Run,
    RunArguments,
    RunOutput,
    extension,
    make_extension,
)
from toolfleet.extensions.python.tool import CANCEL_GRACE_S
from toolfleet.shared import codec
from toolfleet.shared.errors import ToolTimeoutError
from toolfleet.shared.tool import ExtensionContext
from toolfleet.shared.wire import Status
from toolfleet.worker.isolation import InProcessRunner

FUNCTION = "ext_python_run"
QUICK = "ext_python_quick_run"
QUICK_LIMIT_S = 1.0

#: Loaded by the test fleet (``--extension test_python_tool:quick_extension``).
quick_extension = make_extension(
    PythonToolConfig(max_output_bytes=1000), slug="python-quick", timeout_s=QUICK_LIMIT_S
)


def context(
    conversation: str | None = "conv-1", account: str | None = "acme", timeout_s: float = 10.0
) -> ExtensionContext:
    return ExtensionContext(
        call_id=uuid.uuid4().hex,
        function=FUNCTION,
        slug="python",
        version="test",
        deadline=time.time() + timeout_s,
        account=account,
        conversation=conversation,
    )


class Sandbox:
    """One tool class with its own session pool, called on one long-lived event loop."""

    def __init__(self, config: PythonToolConfig | None, timeout_s: float) -> None:
        self.tool: type[Run] = make_extension(config, timeout_s=timeout_s).tools[0]
        self.loop = asyncio.new_event_loop()

    def run(self, code: str, **kwargs: Any) -> RunOutput:
        call = self.tool().call(RunArguments(code=code), context(**kwargs))
        return self.loop.run_until_complete(call)

    def pid(self, **kwargs: Any) -> int:
        """The host pid of the conversation's interpreter (its code sees a namespace pid)."""
        return self.host_pid(int(self.run("import os; os.getpid()", **kwargs).result or 0))

    def host_pid(self, inner_pid: int) -> int:
        """The host pid of a process the sandboxed code knows as ``inner_pid``."""
        return host_pid(inner_pid, self.roots())

    def roots(self) -> set[int]:
        """Host pids of the live interpreters' launchers (bwrap, or the interpreter)."""
        sessions = self.tool.pool()._sessions.values()
        return {s.interpreter.process.pid for s in sessions if s.interpreter is not None}

    def workdir(self) -> Path:
        """The host folder of the (one) live interpreter's working directory."""
        (session,) = self.tool.pool()._sessions.values()
        assert session.interpreter is not None
        return Path(session.interpreter.workdir)

    def close(self) -> None:
        self.loop.run_until_complete(self.tool.pool().aclose())
        self.loop.run_until_complete(asyncio.sleep(0.01))  # let closed pipes report it
        self.loop.close()


@pytest.fixture
def sandbox() -> Iterator[Callable[..., Sandbox]]:
    made: list[Sandbox] = []

    def make(config: PythonToolConfig | None = None, timeout_s: float = 10.0) -> Sandbox:
        if config is None or config.isolation != "unsafe-none":
            require_sandbox(config)
        made.append(Sandbox(config, timeout_s))
        return made[-1]

    yield make
    for box in made:
        box.close()


def gone(pid: int, within_s: float = 1.0) -> bool:
    """True when process ``pid`` no longer exists (or is a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.01)
    return False


# --- unit level: the tool class called directly ------------------------------------------


def test_extension_offers_ext_python_run() -> None:
    """The default extension validates and serves one async tool, ext_python_run."""
    extension.validate()
    (tool,) = extension.tools
    assert extension.function_name(tool) == FUNCTION
    assert tool.is_async() and tool.problems() == []
    assert "code" in tool.parameters()["required"]
    assert "persist" in tool.tool_description()


def test_stdout_stderr_and_last_expression(sandbox: Callable[..., Sandbox]) -> None:
    """print goes to stdout, sys.stderr to stderr, and the last expression's repr to result."""
    out = sandbox().run("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n6 * 7")
    assert out == RunOutput(stdout="hello\n", stderr="oops\n", result="42", error=None)


def test_no_final_expression_or_none_gives_null_result(sandbox: Callable[..., Sandbox]) -> None:
    """A statement, or an expression whose value is None, gives result null."""
    box = sandbox()
    assert box.run("y = [1, 'a']").result is None
    assert box.run("print('x')").result is None
    assert box.run("y").result == "[1, 'a']"


def test_exception_is_an_ok_result_with_the_users_traceback(
    sandbox: Callable[..., Sandbox],
) -> None:
    """An exception in the code comes back in error: type, message, user frames only."""
    box = sandbox()
    box.run("def inverse(x):\n    return 1 / x\n")
    out = box.run("print('before')\ninverse(0)")
    assert out.stdout == "before\n" and out.result is None
    assert out.error is not None
    assert out.error.startswith("ZeroDivisionError: division by zero\nTraceback")
    assert "return 1 / x" in out.error and "inverse(0)" in out.error
    assert "_repl.py" not in out.error and "toolfleet" not in out.error


def test_syntax_error_is_reported(sandbox: Callable[..., Sandbox]) -> None:
    """Code that does not parse comes back as a SyntaxError pointing at the line."""
    out = sandbox().run("x = 1\nif (:\n    pass")
    assert out.error is not None and out.error.startswith("SyntaxError:")
    assert "line 2" in out.error


def test_variables_persist_per_conversation(sandbox: Callable[..., Sandbox]) -> None:
    """x = 41 then x + 1 gives 42 in one conversation; another one does not see x."""
    box = sandbox()
    assert box.run("x = 41", conversation="a").error is None
    assert box.run("x + 1", conversation="a").result == "42"
    other = box.run("x", conversation="b")
    assert other.error is not None and other.error.startswith("NameError")
    same_id_other_account = box.run("x", conversation="a", account="globex")
    assert same_id_other_account.error is not None


def test_no_conversation_means_no_persistence(sandbox: Callable[..., Sandbox]) -> None:
    """Without a conversation every call gets a throw-away interpreter."""
    box = sandbox()
    box.run("x = 1", conversation=None)
    out = box.run("x", conversation=None)
    assert out.error is not None and out.error.startswith("NameError")
    assert len(box.tool.pool()) == 0


def test_environment_is_empty(
    sandbox: Callable[..., Sandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code sees none of the worker's environment, only a minimal PATH and LANG."""
    monkeypatch.setenv("TOOLFLEET_TEST_SECRET", "s3cr3t")
    box = sandbox()
    assert box.run("import os\nos.environ.get('TOOLFLEET_TEST_SECRET')").result is None
    names = box.run("sorted(os.environ)").result or ""
    assert "'PATH'" in names and "'LANG'" in names and "TOOLFLEET" not in names
    assert "s3cr3t" not in (box.run("open('/proc/self/environ').read()").result or "")


def test_fd_level_output_and_closed_stdin(sandbox: Callable[..., Sandbox]) -> None:
    """Output of child processes and raw writes is captured; reading stdin hits end of file."""
    box = sandbox()
    out = box.run("import os\nos.system('echo from-a-shell')\nos.write(2, b'raw\\n')\n")
    assert out.stdout == "from-a-shell\n" and out.stderr == "raw\n"
    out = box.run("input()")
    assert out.error is not None and out.error.startswith("EOFError")


def test_memory_limit_raises_memory_error_in_the_sandbox(
    sandbox: Callable[..., Sandbox],
) -> None:
    """Allocating 10 GiB fails with MemoryError in the code; the interpreter lives on."""
    box = sandbox()
    box.run("kept = 'still here'")
    out = box.run("b = bytearray(10 * 2**30)")
    assert out.error is not None and out.error.startswith("MemoryError")
    assert box.run("kept").result == "'still here'"


def test_output_is_truncated_with_a_marker(sandbox: Callable[..., Sandbox]) -> None:
    """Each field keeps at most max_output_bytes: its first and last halves around a marker."""
    box = sandbox(PythonToolConfig(max_output_bytes=100))
    out = box.run("import sys\nprint('A' * 5000 + 'END')\nsys.stderr.write('e' * 500)\n'r' * 999")
    assert out.stdout.startswith("A" * 50) and out.stdout.endswith("END\n")
    assert "[... 4904 bytes omitted ...]" in out.stdout
    assert "bytes omitted" in out.stderr and "bytes omitted" in (out.result or "")
    for text in (out.stdout, out.stderr, out.result or ""):
        assert len(text.encode()) < 100 + 40
    short = box.run("print('fits')")
    assert short.stdout == "fits\n"


def test_reply_is_valid_json_even_for_lone_surrogates(sandbox: Callable[..., Sandbox]) -> None:
    """Text that is not valid Unicode is escaped, so the reply always encodes."""
    out = sandbox().run("print('\\ud800')\nraise ValueError('\\udcff')")
    codec.dumps(out.model_dump(mode="json"))
    assert out.stdout == "\\ud800\n" and out.error is not None


def test_cpu_limit_interrupts_the_code_and_keeps_the_session(
    sandbox: Callable[..., Sandbox],
) -> None:
    """Past cpu_s the code gets CPUTimeLimitExceeded; variables survive."""
    box = sandbox(PythonToolConfig(cpu_s=1), timeout_s=10)
    box.run("kept = 1")
    started = time.monotonic()
    out = box.run("while True: pass")
    assert out.error is not None and out.error.startswith("CPUTimeLimitExceeded")
    assert time.monotonic() - started < 2.5 + LATE_S
    assert box.run("kept").result == "1"


def test_own_deadline_kills_the_interpreter(sandbox: Callable[..., Sandbox]) -> None:
    """Called without the worker, the tool kills the code at the deadline itself."""
    box = sandbox()
    pid = box.pid()
    box.run("x = 1")
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        box.run("while True: pass", timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + CANCEL_GRACE_S + LATE_S
    assert gone(pid, within_s=0.1 + LATE_S)
    out = box.run("x")
    assert "fresh Python interpreter" in out.stderr and "time limit" in out.stderr
    assert out.error is not None and "fresh interpreter" in out.error


def test_worker_cancellation_kills_the_process_group_at_the_limit(
    sandbox: Callable[..., Sandbox],
) -> None:
    """Under the worker's runner the call times out at the limit and its processes die."""
    box = sandbox()
    runner = InProcessRunner()

    def call(code: str, limit_s: float = 5.0) -> Any:
        return runner.run_async(
            lambda: box.tool().call(RunArguments(code=code), context()), limit_s
        )

    try:
        pid = box.host_pid(int(call("import os; os.getpid()").value.result))
        inner = int(call("import subprocess\nsubprocess.Popen(['sleep', '60']).pid").value.result)
        sleeper = box.host_pid(inner)
        started = time.monotonic()
        outcome = call("while True: pass", limit_s=0.5)
        elapsed = time.monotonic() - started
        assert outcome.timed_out and elapsed < 0.5 + LATE_S, elapsed
        assert gone(pid, within_s=0.2 + LATE_S) and gone(sleeper, within_s=0.2 + LATE_S)
        after = call("1 + 1").value
        assert after.result == "2" and "time limit" in after.stderr
        runner.run_async(box.tool.pool().aclose, 10)
    finally:
        runner.close()


@pytest.mark.parametrize("isolation", ["bubblewrap", "unsafe-none"])
def test_worker_exit_removes_interpreters_and_directories(tmp_path: Path, isolation: str) -> None:
    """A process that exits with live interpreters kills them and removes their directories
    and cgroups."""
    if isolation == "bubblewrap":
        require_sandbox()
    script = tmp_path / "leave.py"
    script.write_text(
        "import asyncio, time\n"
        "from toolfleet.extensions.python import PythonToolConfig, RunArguments, make_extension\n"
        "from toolfleet.shared.tool import ExtensionContext\n"
        "ctx = ExtensionContext(call_id='1', function='f', slug='python', version='1',\n"
        "                       deadline=time.time() + 10, conversation='c')\n"
        f"tool = make_extension(PythonToolConfig(isolation={isolation!r})).tools[0]\n"
        "out = asyncio.run(tool().call(RunArguments(code='x = 1'), ctx))\n"
        "(session,) = tool.pool()._sessions.values()\n"
        "from proctree import session_cgroup_dirs, tree\n"
        "pids = tree(session.interpreter.process.pid)\n"
        "folders = session_cgroup_dirs(session.interpreter.process.pid)\n"
        "print(session.interpreter.workdir or '-', ','.join(folders) or '-', *pids)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    workdir, cgroups, *pids = done.stdout.split()
    assert pids and all(gone(int(pid)) for pid in pids), done.stderr
    assert (workdir == "-") is (isolation == "bubblewrap"), done.stdout
    assert not Path(workdir).exists(), done.stderr
    assert all(not Path(folder).exists() for folder in cgroups.split(",") if folder != "-")


def test_crash_is_reported_and_next_call_is_fresh(sandbox: Callable[..., Sandbox]) -> None:
    """An interpreter that dies mid-call gives an error; the next call says it is fresh."""
    box = sandbox()
    box.run("x = 1")
    out = box.run("print('last words', flush=True)\nimport os\nos._exit(3)")
    assert out.stdout == "last words\n"
    assert out.error is not None and "exited with status 3" in out.error
    after = box.run("x")
    assert "exited with status 3" in after.stderr and after.error is not None


def test_idle_interpreter_is_stopped(sandbox: Callable[..., Sandbox]) -> None:
    """An interpreter idle for idle_timeout_s is stopped; the next call is told why."""
    box = sandbox(PythonToolConfig(idle_timeout_s=0.2))
    pid = box.pid()
    box.loop.run_until_complete(asyncio.sleep(0.4))
    assert gone(pid)
    out = box.run("1")
    assert "idle" in out.stderr and out.result == "1"


def test_least_recently_used_session_is_evicted(sandbox: Callable[..., Sandbox]) -> None:
    """With max_sessions=1 a second conversation evicts the first, which is told so."""
    box = sandbox(PythonToolConfig(max_sessions=1))
    box.run("x = 1", conversation="a")
    box.run("y = 2", conversation="b")
    assert len(box.tool.pool()) == 1
    out = box.run("x", conversation="a")
    assert "room" in out.stderr and out.error is not None


def test_working_directory_is_private_and_removed(sandbox: Callable[..., Sandbox]) -> None:
    """Unsandboxed, files persist between calls in a private host folder removed at the end."""
    box = sandbox(PythonToolConfig(isolation="unsafe-none"))
    box.run("open('notes.txt', 'w').write('hi')")
    path = box.workdir()
    assert path.name.startswith("toolfleet-python-") and (path / "notes.txt").exists()
    assert box.run("open('notes.txt').read()").result == "'hi'"
    box.tool.pool().close()
    box.loop.run_until_complete(asyncio.sleep(0.3))
    assert not path.exists()


def test_calls_of_one_conversation_run_one_at_a_time(sandbox: Callable[..., Sandbox]) -> None:
    """Parallel calls of one conversation are serialized in arrival order."""
    box = sandbox()

    async def both() -> list[RunOutput]:
        first = box.tool().call(RunArguments(code="import time\ntime.sleep(0.2)\nx = 1"), context())
        second = box.tool().call(RunArguments(code="x + 1"), context())
        return list(await asyncio.gather(first, second))

    _, second = box.loop.run_until_complete(both())
    assert second.result == "2"


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root")
def test_run_as_user_cannot_read_the_workers_environment(
    sandbox: Callable[..., Sandbox],
) -> None:
    """With run_as_user the code runs as that user and cannot read /proc/<worker>/environ."""
    config = PythonToolConfig(
        run_as_user="nobody", interpreter="/usr/bin/python3", isolation="unsafe-none"
    )
    out = sandbox(config).run(
        "import os\nprint(os.getuid())\nopen(f'/proc/{os.getppid()}/environ').read()"
    )
    assert out.stdout == "65534\n"
    assert out.error is not None and out.error.startswith("PermissionError")


# --- through a real fleet -----------------------------------------------------------------


def _load_python() -> list[str]:
    """Load the python extension by path unless it is registered as an entry point."""
    registered = any(ep.name == "python" for ep in entry_points(group="toolfleet.extensions"))
    return [] if registered else ["--extension", "toolfleet.extensions.python:extension"]


@pytest.fixture(scope="module")
def python_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process serving the python extensions, with a secret in its environment."""
    require_sandbox()
    ns = f"{namespace}-py-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(
        redis_url,
        ns,
        tmp_path_factory.mktemp("python-fleet") / "worker.log",
        processes=1,
        threads=4,
        extra=[*_load_python(), "--extension", "test_python_tool:quick_extension"],
        env={"TOOLFLEET_TEST_SECRET": "s3cr3t"},
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def py_client(python_fleet: Fleet) -> Iterator[Any]:
    from toolfleet.producer import ToolClient

    with ToolClient(python_fleet.redis_url, namespace=python_fleet.namespace) as c:
        yield c


def _conversation() -> dict[str, str]:
    return {"account": "acme", "conversation": f"conv-{uuid.uuid4().hex[:8]}"}


def test_fleet_infinite_loop_times_out_on_time_and_worker_answers_next(
    py_client: Any, python_fleet: Fleet
) -> None:
    """An endless loop is answered timeout by the worker by the limit (plus ``LATE_S``); it
    serves on."""
    ctx = _conversation()
    inner = int(
        py_client.call(QUICK, {"code": "import os; os.getpid()"}, context=ctx).content["result"]
    )
    pid = host_pid(inner, set(python_fleet.worker_pids()))
    started = time.monotonic()
    result = py_client.call(QUICK, {"code": "while True: pass"}, context=ctx, timeout_s=10)
    elapsed = time.monotonic() - started
    assert result.status is Status.TIMEOUT, result
    assert result.worker, "the worker answered, not the producer's deadline"
    assert elapsed < QUICK_LIMIT_S + LATE_S, elapsed
    assert gone(pid, within_s=0.5 + LATE_S)
    after = py_client.call(QUICK, {"code": "6 * 7"}, context=ctx)
    assert after.status is Status.OK and after.content["result"] == "42"
    assert "time limit" in after.content["stderr"]
    assert python_fleet.worker_pids() and python_fleet.process.poll() is None


def test_fleet_worker_environment_is_invisible(py_client: Any) -> None:
    """A variable set in the worker's environment reads as nothing in the sandbox."""
    code = "import os\nprint(sorted(os.environ))\nos.environ.get('TOOLFLEET_TEST_SECRET')"
    result = py_client.call(FUNCTION, {"code": code}, context=_conversation())
    assert result.status is Status.OK
    assert result.content["result"] is None and result.content["error"] is None
    assert "TOOLFLEET" not in result.content["stdout"] and "s3cr3t" not in str(result.content)


def test_fleet_memory_error_stays_in_the_sandbox(py_client: Any) -> None:
    """Allocating 10 GiB is a MemoryError in the code's error; the worker keeps answering."""
    ctx = _conversation()
    first = py_client.call(FUNCTION, {"code": "b = bytearray(10 * 2**30)"}, context=ctx)
    assert first.status is Status.OK
    assert first.content["error"].startswith("MemoryError")
    again = py_client.call(FUNCTION, {"code": "len(bytearray(2**20))"}, context=ctx)
    assert again.status is Status.OK and again.content["result"] == str(2**20)
    assert again.worker == first.worker


def test_fleet_session_persists_per_conversation(py_client: Any) -> None:
    """x = 41 then x + 1 is 42 in one conversation; another conversation has no x."""
    ctx = _conversation()
    assert py_client.call(FUNCTION, {"code": "x = 41"}, context=ctx).status is Status.OK
    assert py_client.call(FUNCTION, {"code": "x + 1"}, context=ctx).content["result"] == "42"
    other = py_client.call(FUNCTION, {"code": "x"}, context=_conversation())
    assert other.status is Status.OK and other.content["error"].startswith("NameError")


def test_fleet_output_is_captured_and_truncated(py_client: Any) -> None:
    """stdout and stderr come back; output past the limit is cut with a marker."""
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nprint('z' * 5000)"
    result = py_client.call(QUICK, {"code": code}, context=_conversation())
    assert result.status is Status.OK
    assert result.content["stdout"].startswith("out\nzzz")
    assert "bytes omitted" in result.content["stdout"]
    assert result.content["stderr"] == "err\n"
    assert result.content["result"] is None and result.content["error"] is None


def test_tool_past_its_own_limit_is_answered_timeout() -> None:
    """Its own limit passing before the worker's, ext_python_run answers timeout (not crashed)."""
    require_sandbox()
    from toolfleet.shared.manifest import ToolOptions
    from toolfleet.shared.wire import ToolCallRequest, new_call_id
    from toolfleet.worker.pipeline.calls import CallPipeline
    from toolfleet.worker.registry.registry import Registry

    own_limit_s = 0.5
    built = make_extension(slug="python-own-limit", timeout_s=own_limit_s)
    registry = Registry("own-limit")
    pipeline = CallPipeline(registry, worker_id="test:1")
    # The operator gave the worker a longer limit than the tool's own (a manifest override).
    registry.add_extension(replace(built, tool_options={"run": ToolOptions(timeout=10.0)}))
    request = ToolCallRequest(
        id=new_call_id(),
        function="ext_python_own_limit_run",
        arguments={"code": "while True: pass"},
        reply_to="own-limit:reply:x",
        deadline=time.time() + 10,
        timeout_s=10,
    )
    try:
        started = time.monotonic()
        result = pipeline.call(request)
        elapsed = time.monotonic() - started
    finally:
        pipeline.close()
    assert result.status is Status.TIMEOUT, result
    assert elapsed < 5, elapsed  # the tool's own limit, not the worker's 10 s
    assert "did not finish within" in result.content["error"]
