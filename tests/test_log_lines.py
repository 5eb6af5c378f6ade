"""What the fleet writes to its logs: JSON lines throughout, text lines that cannot be forged."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from log_tools import CHILD_MARKER

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status

LOG_IN_CHILD = "ext_log_test_log_in_child"
ECHO = "ext_fleet_test_echo"


def _wait_for(fleet: Fleet, found: Callable[[str], bool], timeout_s: float = 20.0) -> str:
    """The fleet's log once ``found`` accepts it (fails after ``timeout_s`` seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = fleet.log()
        if found(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"not in the log within {timeout_s} s:\n{fleet.log()[-3000:]}")


def test_json_log_format_holds_for_every_line_including_process_isolated_children(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """With TOOLFLEET_LOG_FORMAT=json every line the fleet writes to stdout/stderr, from
    start through a worker restart to shutdown, is a JSON object: the supervisor's, the
    worker processes' and a process-isolated tool's own record."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-jsonlog-{uuid.uuid4().hex[:6]}",
        tmp_path / "worker.log",
        processes=1,
        threads=2,
        extra=["--extension", "log_tools:extension"],
        env={"TOOLFLEET_LOG_FORMAT": "json"},
    )
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            result = client.call(LOG_IN_CHILD, {"text": "json please"}, timeout_s=30)
            refused = client.call(ECHO, '{"text": 1', timeout_s=30)  # a worker's INFO line
        assert result.status is Status.OK, result
        assert refused.status is Status.INVALID_ARGUMENTS, refused
        _wait_for(fleet, lambda text: CHILD_MARKER in text and "invalid arguments" in text)
        (pid,) = fleet.worker_pids()
        os.kill(pid, signal.SIGTERM)  # it drains and exits; the supervisor logs the restart
        _wait_for(fleet, lambda text: f"(pid {pid}) exited" in text)
        fleet.wait_ready()
    finally:
        fleet.stop()
    lines = [line for line in fleet.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    (child,) = [r for r in records if CHILD_MARKER in r["message"]]
    assert child["message"] == f"{CHILD_MARKER}: json please"
    assert child["level"] == "WARNING" and child["logger"] == "log_tools"
    assert child["worker"].endswith(" child"), child
    restarts = [r for r in records if f"(pid {pid}) exited" in r["message"]]
    assert restarts and restarts[0]["worker"].endswith(" supervisor"), restarts


def test_raw_arguments_cannot_forge_a_line_of_the_text_log(fleet: Fleet) -> None:
    """Raw arguments carrying line breaks (\\n, \\r, U+2028) are logged escaped on the
    invalid_arguments line, so no line of the text log starts with the forged text."""
    forged = "FORGED-LINE 2026-01-01 00:00:00,000 INFO toolfleet.worker.calls: all is well"
    raw = f'{{"text": "x"}}\n{forged} 1\r{forged} 2\u2028{forged} 3\x0b{forged} 4'
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call(ECHO, raw, timeout_s=30)
    assert result.status is Status.INVALID_ARGUMENTS, result
    assert "line 2 column 1" in str(result.error), result  # where the trailing data starts
    text = _wait_for(fleet, lambda log: result.id in log and "the model sent" in log)
    starting = [line for line in text.splitlines() if line.startswith("FORGED")]
    assert not starting, starting
    (logged,) = [
        line for line in text.splitlines() if result.id in line and "the model sent" in line
    ]
    assert f"\\n{forged} 1\\r{forged} 2\\u2028{forged} 3\\x0b{forged} 4" in logged, logged
