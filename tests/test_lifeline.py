"""A fleet's processes never outlive it, even while a tool holds the GIL in one C call.

Each test starts a real fleet (``toolfleet worker`` or ``toolfleet demo``), runs a tool that
holds the GIL for about a minute (``math.factorial`` of 3,000,000: in a worker thread, in a
``process``-isolation child, or in the python sandbox), records the whole process tree
below the supervisor, stops or kills the supervisor, and checks that every recorded
process ended in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import TESTS, Fleet, start_fleet, toolfleet_command, unavailable
from proctree import alive, all_gone, cmdline, cpu_s, descendants, tree
from toolfleet.extensions.python._sandbox import unavailable_reason
from toolfleet.extensions.python.config import PythonToolConfig
from toolfleet.producer import ToolClient

LIFELINE_EXT = TESTS / "lifeline_ext"
GRACE_S = 5.0  # TOOLFLEET_SHUTDOWN_GRACE_S of start_fleet
PYTHON_CODE = "import math\nmath.factorial(3_000_000).bit_length()"


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(TESTS), str(LIFELINE_EXT)])}


@pytest.fixture
def lifeline_fleet(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    """One worker process serving the GIL-holding tools and the python tool."""
    ns = f"{namespace}-life-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(
        redis_url,
        ns,
        tmp_path / "worker.log",
        processes=1,
        threads=2,
        extra=["--extension", "lifeline_tools:extension"],
        env=_env(),
    )
    pids = tree(fleet.process.pid)
    yield fleet
    for pid in pids | tree(fleet.process.pid):  # never leave a CPU-burning orphan behind
        _kill(pid)
    fleet.stop()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s} s")


def _start_holding(fleet: Fleet, how: str, tmp_path: Path) -> None:
    """Submit the GIL-holding call and return once the tool is inside its C call."""
    client = ToolClient(fleet.redis_url, namespace=fleet.namespace)
    marker = tmp_path / f"holding-{uuid.uuid4().hex[:6]}"
    if how == "python":
        reason = unavailable_reason(PythonToolConfig())
        if reason:
            unavailable(reason)
        client.submit("ext_python_run", {"code": PYTHON_CODE}, timeout_s=120)

        def sandbox_busy() -> bool:
            sandboxes = [p for p in descendants(fleet.process.pid) if "repl.py" in cmdline(p)]
            return any(cpu_s(p) >= 1.0 for p in sandboxes)

        _wait_for(sandbox_busy, 60, "the sandboxed code was not running")
    else:
        function = "ext_lifeline_hold_gil" if how == "thread" else "ext_lifeline_hold_gil_in_child"
        client.submit(function, {"marker": str(marker)}, timeout_s=120)
        _wait_for(
            lambda: marker.exists() and bool(marker.read_text()), 60, "the tool did not start"
        )
        time.sleep(0.3)  # from the marker to inside math.factorial
        assert alive(int(marker.read_text())), "the tool's process is not running"
    client.close(wait=False)  # the call stays in the fleet, still holding the GIL


def _describe(pids: set[int]) -> str:
    return "; ".join(f"{pid}: {cmdline(pid)[:120]}" for pid in sorted(pids))


@pytest.mark.parametrize("how", ["thread", "process", "python"])
def test_killed_supervisor_leaves_no_process(
    lifeline_fleet: Fleet, how: str, tmp_path: Path
) -> None:
    """SIGKILL to `toolfleet worker` while a tool holds the GIL: its tree is gone 2 s later."""
    _start_holding(lifeline_fleet, how, tmp_path)
    pids = descendants(lifeline_fleet.process.pid)
    assert len(pids) >= 2, "expected a worker process and its children"
    lifeline_fleet.process.send_signal(signal.SIGKILL)
    lifeline_fleet.process.wait()
    left = all_gone(pids, within_s=2.0)
    assert not left, f"still alive 2 s after the supervisor was killed: {_describe(left)}"


@pytest.mark.parametrize("how", ["thread", "process"])
def test_sigterm_ends_the_fleet_within_the_grace(
    lifeline_fleet: Fleet, how: str, tmp_path: Path
) -> None:
    """SIGTERM to the supervisor with a GIL-holding tool: every process ends by grace + 2 s."""
    _start_holding(lifeline_fleet, how, tmp_path)
    pids = tree(lifeline_fleet.process.pid)
    started = time.monotonic()
    lifeline_fleet.process.send_signal(signal.SIGTERM)
    left = all_gone(pids, within_s=GRACE_S + 2.0)
    elapsed = time.monotonic() - started
    assert not left, f"still alive {elapsed:.1f} s after SIGTERM: {_describe(left)}"


def test_killed_demo_leaves_no_process(tmp_path: Path) -> None:
    """SIGKILL to `toolfleet demo` while a tool holds the GIL: none of its processes is left."""
    # the demo's own temporary folders (its server's socket, its metrics) stay behind when it
    # is killed outright; a short one of the test's keeps them out of /tmp (a socket's path
    # under pytest's tmp_path would be too long)
    scratch = Path(tempfile.mkdtemp(prefix="tf-demo-", dir="/tmp"))
    marker = tmp_path / "holding"
    calls = tmp_path / "calls.jsonl"
    call = {"function": "ext_lifeline_hold_gil", "arguments": {"marker": str(marker)}}
    calls.write_text(json.dumps(call) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(
        _env(),
        TOOLFLEET_EXTENSION_PATHS=str(LIFELINE_EXT),
        TOOLFLEET_HEALTH_DIR=str(tmp_path / "health"),
        TMPDIR=str(scratch),
    )
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen(
        [toolfleet_command(), "demo", "-p", "1", str(calls)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    pids: set[int] = set()
    try:
        _wait_for(marker.exists, 120, "the demo did not start the tool")
        time.sleep(0.3)
        pids = descendants(demo.pid)
        assert any("toolfleet.worker.supervision.worker_process" in cmdline(p) for p in pids), (
            _describe(pids)
        )
        demo.send_signal(signal.SIGKILL)
        demo.wait()
        left = all_gone(pids, within_s=2.0)
        assert not left, f"still alive 2 s after the demo was killed: {_describe(left)}"
    finally:
        for pid in pids | tree(demo.pid):
            _kill(pid)
        demo.wait()
        log.close()
        shutil.rmtree(scratch, ignore_errors=True)
