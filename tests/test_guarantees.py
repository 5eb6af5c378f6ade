"""Execution guarantees through real workers: hard time limits, cancellation, bad input."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conftest import LATE_S, Fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status

G = "ext_guarantee_"


@pytest.fixture
def gclient(small_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(small_fleet.redis_url, namespace=small_fleet.namespace) as c:
        yield c


@pytest.mark.parametrize("tool,arguments", [("gil_hold", {}), ("spin", {"seconds": 60})])
def test_process_tool_is_killed_at_its_limit(
    gclient: ToolClient, tool: str, arguments: dict[str, float]
) -> None:
    """GIL-holding C code and a busy loop in process isolation answer timeout at their 1 s
    limit (plus ``LATE_S``), and the next call runs normally."""
    started = time.monotonic()
    result = gclient.call(G + tool, arguments, timeout_s=30)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started < 1.0 + LATE_S
    after = gclient.call(G + "process_quick", {}, timeout_s=5)
    assert after.status is Status.OK and isinstance(after.content, int)


@pytest.mark.parametrize("tool", ["raise_status", "process_raise_status"])
def test_a_tool_raising_a_status_error_is_answered_that_status(
    gclient: ToolClient, tool: str
) -> None:
    """Every ToolCallError subclass a tool raises, its own subclasses included, is answered
    with its status and message (not crashed), in thread and process isolation."""
    for status in (s for s in Status if s is not Status.OK):
        result = gclient.call(G + tool, {"status": status.value}, timeout_s=30)
        assert (result.status, result.content) == (status, {"error": f"raised {status}"})
        assert result.worker is not None  # answered by the worker, not the producer
    result = gclient.call(G + tool, {"status": "quota"}, timeout_s=30)
    assert result.status is Status.NOT_AVAILABLE
    assert result.content == {"error": "the daily quota is used up"}
