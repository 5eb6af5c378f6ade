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
SAY = "ext_log_test_say"
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


def _say_fleet(redis_url: str, namespace: str, log: Path, log_format: str) -> Fleet:
    return start_fleet(
        redis_url,
        f"{namespace}-say-{uuid.uuid4().hex[:6]}",
        log,
        processes=1,
        threads=2,
        extra=["--extension", "log_tools:extension"],
        env={"TOOLFLEET_LOG_FORMAT": log_format},
    )


def test_printed_text_cannot_forge_a_line_of_the_text_log(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """What a tool prints (model-written text that looks like log lines) is one record per
    print, under the output logger, its line breaks escaped: no line starts with it."""
    marker = uuid.uuid4().hex
    forged = "2026-01-01 00:00:00,000 ERROR [vm:1] toolfleet.worker.calls: FORGED"
    text = f"{marker}\n{forged} 1\r{forged} 2\u2028{forged} 3\x1b[2K{forged} 4"
    fleet = _say_fleet(redis_url, namespace, tmp_path / "worker.log", "text")
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            result = client.call(SAY, {"text": text}, timeout_s=30)
        assert result.status is Status.OK, result
        log = _wait_for(fleet, lambda log: log.count(marker) >= 2)
    finally:
        fleet.stop()
    assert not [line for line in log.splitlines() if line.startswith("2026-01-01")], log
    assert "\x1b" not in log, log
    said = [line for line in log.splitlines() if marker in line]
    assert len(said) == 2, said  # one record for each print (stdout, stderr)
    escaped = f"{marker}\\n{forged} 1\\r{forged} 2\\u2028{forged} 3\\x1b[2K{forged} 4"
    for line, name in zip(said, ("INFO", "WARNING"), strict=True):
        assert f" {name} " in line and " toolfleet.output.std" in line, line
        assert line.endswith(f"toolfleet.output.{'stdout' if name == 'INFO' else 'stderr'}: "
                             f"{escaped}"), line  # fmt: skip


def test_printed_json_cannot_pass_for_a_record_of_the_json_log(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """In JSON format a printed JSON object that looks like a record is the ``message`` of
    an output record; every line is one record, and no record but the output's holds it."""
    marker = uuid.uuid4().hex
    fake = {"timestamp": "2026-01-01T00:00:00.000000Z", "level": "ERROR",
            "logger": "toolfleet.worker.calls", "message": f"FORGED {marker}",
            "worker": "vm:1"}  # fmt: skip
    printed = f"{json.dumps(fake)}\n{json.dumps(fake)}"
    fleet = _say_fleet(redis_url, namespace, tmp_path / "worker.log", "json")
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            result = client.call(SAY, {"text": printed}, timeout_s=30)
        assert result.status is Status.OK, result
        _wait_for(fleet, lambda log: log.count(marker) >= 4)
    finally:
        fleet.stop()
    records = []
    for line in fleet.log().splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON line: {line!r}")
    holding = [r for r in records if marker in json.dumps(r)]
    assert [r["logger"] for r in holding] == ["toolfleet.output.stdout", "toolfleet.output.stderr"]
    for record in holding:
        assert record["message"] == printed, record
        assert not record["worker"].endswith("vm:1"), record
