"""Health checks ignore heartbeat files of processes that are gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from toolfleet.worker.supervision.health import (
    WORKER_COMMAND,
    check_live,
    remove_heartbeat,
    remove_supervisor_beat,
    write_heartbeat,
    write_supervisor_beat,
)


def test_stale_file_of_a_reused_pid_does_not_count(tmp_path: Path) -> None:
    """A file named after a thread id or a non-worker process is ignored, not 'unhealthy'."""
    ids: list[int] = []
    worker = threading.Thread(
        target=lambda: (ids.append(threading.get_native_id()), time.sleep(0.5))
    )
    worker.start()
    time.sleep(0.1)
    for pid in (ids[0], os.getpid()):  # a live thread id, and a live non-worker process
        path = tmp_path / f"worker-{pid}.json"
        path.write_text(json.dumps({"pid": pid, "ready": True, "at": 0}))
        os.utime(path, (0, 0))
    worker.join()
    report = check_live(tmp_path, stale_s=3)
    assert not report.ok and "no live worker process" in report.reason


def test_heartbeat_file_is_removed(tmp_path: Path) -> None:
    """remove_heartbeat deletes this process's file (a worker does so at exit)."""
    write_heartbeat(tmp_path, True, 3)
    assert (tmp_path / f"worker-{os.getpid()}.json").exists()
    remove_heartbeat(tmp_path)
    assert not (tmp_path / f"worker-{os.getpid()}.json").exists()


def test_a_supervisor_waiting_for_redis_is_live_until_its_beat_goes_stale(tmp_path: Path) -> None:
    """With no worker process yet, a fresh beat of a running supervisor is live (it waits for
    Redis); the same beat gone stale, or removed, is not."""
    write_supervisor_beat(tmp_path)
    assert check_live(tmp_path, stale_s=3).ok
    path = tmp_path / f"supervisor-{os.getpid()}.json"
    os.utime(path, (time.time() - 10, time.time() - 10))
    assert not check_live(tmp_path, stale_s=3).ok
    write_supervisor_beat(tmp_path)
    remove_supervisor_beat(tmp_path)
    assert not path.exists() and not check_live(tmp_path, stale_s=3).ok


def _beat(directory: Path, pid: int, age_s: float = 0.0) -> None:
    """A heartbeat file for ``pid``, ``age_s`` seconds old."""
    path = directory / f"worker-{pid}.json"
    path.write_text(json.dumps({"pid": pid, "ready": True, "functions": 1, "at": time.time()}))
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def _wait_for_worker_command_line(pid: int, within_s: float = 30.0) -> None:
    """Return once ``/proc/<pid>/cmdline`` holds :data:`WORKER_COMMAND`.

    ``Popen`` returns when the child's exec has closed its close-on-exec pipe, which the
    kernel does before it lays out the new argv: for a moment the command line reads empty.

    Raises:
        AssertionError: not so within ``within_s`` seconds.
    """
    deadline = time.monotonic() + within_s
    cmdline = Path(f"/proc/{pid}/cmdline")
    while WORKER_COMMAND not in cmdline.read_bytes():
        assert time.monotonic() < deadline, f"process {pid} never read as a worker process"
        time.sleep(0.01)


def test_health_reasons_count_worker_processes_in_words(tmp_path: Path) -> None:
    """The reasons say "1 worker process healthy", "2 worker processes healthy", and name one
    stale process in the singular."""
    # stand-ins whose command lines read as worker processes'
    argv = [sys.executable, "-c", "import time; time.sleep(60)", WORKER_COMMAND.decode()]
    stand_ins = [subprocess.Popen(argv) for _ in range(2)]
    try:
        for process in stand_ins:
            _wait_for_worker_command_line(process.pid)
        _beat(tmp_path, stand_ins[0].pid)
        assert check_live(tmp_path, stale_s=3).reason == "1 worker process healthy"
        _beat(tmp_path, stand_ins[1].pid)
        assert check_live(tmp_path, stale_s=3).reason == "2 worker processes healthy"
        _beat(tmp_path, stand_ins[1].pid, age_s=10)
        report = check_live(tmp_path, stale_s=3)
        assert not report.ok
        assert report.reason == f"worker process {stand_ins[1].pid} has not been healthy for 3 s"
    finally:
        for process in stand_ins:
            process.kill()
            process.wait()
