"""The python sandbox bounds a whole session: its processes, its memory and its disk,
and what a killed worker leaves behind is removed.

Unit tests call the tool class on an event loop of their own, with real bubblewrap; the
clean-up test SIGKILLs a real worker process of a fleet started through the CLI. The
fleet also loads ``unsafe_extension`` below from this module.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from conftest import Fleet, start_fleet, unavailable
from proctree import descendants, session_cgroup_dirs
from toolfleet.extensions.python import PythonToolConfig, RunArguments, RunOutput, make_extension
from toolfleet.extensions.python._sandbox import unavailable_reason
from toolfleet.shared.tool import ExtensionContext
from toolfleet.shared.wire import Status

MiB = 2**20
#: Loaded by the fleet below: an interpreter in a host folder, to see the folder swept.
unsafe_extension = make_extension(PythonToolConfig(isolation="unsafe-none"), slug="python-unsafe")


def _config(session_limits: str, **limits: Any) -> PythonToolConfig:
    """A config for ``session_limits`` (``"auto"``: the defaults); a root worker without a
    cgroup starts the sandbox as uid 65534, which needs an interpreter that user can read
    (the system's)."""
    config = PythonToolConfig(**limits)
    if session_limits == "rlimit" and os.geteuid() == 0 and Path("/usr/bin/python3").exists():
        config = PythonToolConfig(session_limits="rlimit", interpreter="/usr/bin/python3", **limits)
    elif session_limits == "rlimit":
        config = PythonToolConfig(session_limits="rlimit", **limits)
    reason = unavailable_reason(config)
    if shutil.which("bwrap") is None or reason:
        unavailable(reason or "bubblewrap is not installed here (CI installs it)")
    return config


class Box:
    """One tool class with its own session pool, called on one long-lived event loop."""

    def __init__(self, config: PythonToolConfig) -> None:
        self.tool = make_extension(config, timeout_s=60).tools[0]
        self.loop = asyncio.new_event_loop()

    def run(self, code: str) -> RunOutput:
        context = ExtensionContext(
            call_id=uuid.uuid4().hex, function="ext_python_run", slug="python",
            version="test", deadline=time.time() + 60, account="acme", conversation="c",
        )  # fmt: skip
        result = self.loop.run_until_complete(self.tool().call(RunArguments(code=code), context))
        assert isinstance(result, RunOutput)
        return result

    def close(self) -> None:
        self.loop.run_until_complete(self.tool.pool().aclose())
        self.loop.close()


@pytest.fixture
def boxes() -> Iterator[list[Box]]:
    made: list[Box] = []
    yield made
    for box in made:
        box.close()


FORK_150 = """
import os
hold_r, hold_w = os.pipe()
children, refused = [], None
for _ in range(150):
    try:
        pid = os.fork()
    except OSError as exc:
        refused = exc.errno
        break
    if pid == 0:
        os.close(hold_w)
        os.read(hold_r, 1)
        os._exit(0)
    children.append(pid)
os.close(hold_w)
for pid in children:
    os.waitpid(pid, 0)
(len(children), refused)
"""


@pytest.mark.parametrize("session_limits", ["auto", "rlimit"])
def test_forking_past_the_process_cap_is_refused(boxes: list[Box], session_limits: str) -> None:
    """Code forking 150 processes gets EAGAIN at the session's process cap; the call answers
    and the interpreter serves the next call."""
    boxes.append(Box(_config(session_limits, max_processes=32)))
    out = boxes[-1].run(FORK_150)
    assert out.error is None, out.error
    forked, refused = eval(out.result or "")
    assert refused == 11 and 0 < forked < 32, out.result  # EAGAIN
    assert boxes[-1].run("6 * 7").result == "42"


ALLOCATE_5_X_400 = """
import os
hold_r, hold_w = os.pipe()
reports = []
for _ in range(5):
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)
        os.close(report_r)
        try:
            block = b"x" * (400 * 2**20)
            os.write(report_w, b"y")
        except MemoryError:
            pass
        os.read(hold_r, 1)
        os._exit(0)
    os.close(report_w)
    reports.append((pid, report_r))
reported = [len(os.read(r, 1)) for _, r in reports]
os.close(hold_w)
statuses = [os.waitpid(pid, 0)[1] for pid, _ in reports]
# held to the end: reported its block and exited by itself (an OOM-killed child may have
# reported before a later child's allocation had it killed)
sum(1 for got, status in zip(reported, statuses) if got and os.waitstatus_to_exitcode(status) == 0)
"""


def test_five_children_cannot_hold_400_mib_each(boxes: list[Box]) -> None:
    """With a cgroup the session's 512 MiB hold across processes: of five children each
    allocating 400 MiB at the same time at most one holds its block to the end (the others
    fail or are killed); the interpreter lives on."""
    from toolfleet.extensions.python._cgroups import host_cgroups

    if isinstance(host_cgroups(), str):
        unavailable(f"session cgroups: {host_cgroups()}")
    boxes.append(Box(_config("auto", memory_bytes=512 * MiB)))
    out = boxes[-1].run(ALLOCATE_5_X_400)
    assert out.error is None, out.error
    assert out.result is not None and int(out.result) <= 1, out.result
    assert boxes[-1].run("6 * 7").result == "42"


WRITE_300_MIB = """
import os, tempfile
written, failed = 0, None
for i in range(30):
    folder = "/tmp" if i % 2 else tempfile.gettempdir()
    try:
        with open(os.path.join(folder, f"{MARKER}-{i}"), "wb") as out:
            out.write(b"x" * (10 * 2**20))
        written += 10
    except OSError as exc:
        failed = exc.errno
        break
(written, failed)
"""


@pytest.mark.parametrize("session_limits", ["auto", "rlimit"])
def test_300_mib_into_tmp_hits_enospc_and_nothing_reaches_the_hosts_tmp(
    boxes: list[Box], session_limits: str
) -> None:
    """Writing 300 MiB to /tmp and TMPDIR in the sandbox fails with ENOSPC at the session's
    disk size, and no file of it appears in the host's /tmp."""
    marker = f"fill-{uuid.uuid4().hex}"
    boxes.append(Box(_config(session_limits)))  # 128 MiB by default
    out = boxes[-1].run(f"MARKER = {marker!r}\n{WRITE_300_MIB}")
    assert out.error is None, out.error
    written, failed = eval(out.result or "")
    assert failed == 28 and written <= 128, out.result  # ENOSPC
    leaked = [
        os.path.join(folder, name)
        for folder, _, names in os.walk("/tmp", onerror=lambda _: None)
        for name in names
        if name.startswith(marker)
    ]
    assert leaked == []


# --- a real fleet: a SIGKILLed worker's sessions ------------------------------------------


def _load_python() -> list[str]:
    registered = any(ep.name == "python" for ep in entry_points(group="toolfleet.extensions"))
    return [] if registered else ["--extension", "toolfleet.extensions.python:extension"]


@pytest.fixture
def python_fleet(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    """One worker process serving the python extension and its unsafe-none twin."""
    if unavailable_reason(PythonToolConfig()):
        unavailable(str(unavailable_reason(PythonToolConfig())))
    fleet = start_fleet(
        redis_url, f"{namespace}-pyk-{uuid.uuid4().hex[:6]}", tmp_path / "worker.log",
        processes=1, threads=2,
        extra=[*_load_python(), "--extension", "test_python_session_limits:unsafe_extension"],
    )  # fmt: skip
    yield fleet
    fleet.stop()


def _launchers(worker: int) -> list[int]:
    """Host pids of the worker's sandbox launchers (bwrap processes)."""
    found = []
    for pid in descendants(worker):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0.endswith(b"bwrap"):
            found.append(pid)
    return found


def test_sigkilled_workers_session_folders_and_cgroups_are_removed(python_fleet: Fleet) -> None:
    """After a worker process is SIGKILLed with live sessions, its replacement removes their
    host folders and cgroups."""
    from toolfleet.producer import ToolClient

    context = {"account": "acme", "conversation": f"conv-{uuid.uuid4().hex[:8]}"}
    (worker,) = python_fleet.worker_pids()
    with ToolClient(python_fleet.redis_url, namespace=python_fleet.namespace) as client:
        kept = client.call("ext_python_run", {"code": "x = 1"}, context=context, timeout_s=30)
        assert kept.status is Status.OK, kept
        code = "import os\nopen('notes.txt', 'w').write('hi')\nos.getcwd()"
        unsafe = client.call("ext_python_unsafe_run", {"code": code}, context=context)
        assert unsafe.status is Status.OK, unsafe
    folder = Path(unsafe.content["result"].strip("'"))
    cgroups = [f for pid in _launchers(worker) for f in session_cgroup_dirs(pid)]
    assert (folder / "notes.txt").exists()
    assert all(Path(f).is_dir() for f in cgroups)

    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and python_fleet.worker_pids() in ([], [worker]):
        time.sleep(0.1)
    python_fleet.wait_ready(timeout_s=30)
    while time.monotonic() < deadline and (folder.exists() or any(map(os.path.isdir, cgroups))):
        time.sleep(0.1)
    assert not folder.exists()
    assert [f for f in cgroups if os.path.isdir(f)] == []
    from toolfleet.extensions.python._cgroups import host_cgroups

    assert cgroups or isinstance(host_cgroups(), str), "the sessions had no cgroup to remove"
