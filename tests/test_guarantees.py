"""Execution guarantees through real workers: hard time limits, cancellation, bad input."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status

G = "ext_guarantee_"


@pytest.fixture(scope="module")
def small_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with two threads, serving the guarantee tools."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-g-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("g") / "worker.log",
        processes=1,
        threads=2,
        extra=["--extension", "guarantee_tools:extension"],
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def gclient(small_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(small_fleet.redis_url, namespace=small_fleet.namespace) as c:
        yield c


@pytest.fixture
def r(small_fleet: Fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(small_fleet.redis_url)
    yield client
    client.close()


def test_stuck_thread_tool_times_out_on_time_and_capacity_recovers(gclient: ToolClient) -> None:
    """sleep(3600) as a thread tool with a 2 s limit answers timeout within 2.3 s; three of
    them on a 2-thread worker do not block a quick call beyond the first limit; capacity
    recovers."""
    started = time.monotonic()
    sleeps = [gclient.submit(G + "sleep", {"seconds": 3600}, timeout_s=30) for _ in range(3)]
    quick = gclient.submit(G + "quick", {}, timeout_s=30)
    done_at: dict[int, float] = {}
    for i, future in enumerate([*sleeps, quick]):
        future.add_done_callback(lambda _f, i=i: done_at.setdefault(i, time.monotonic() - started))
    results = [f.result() for f in sleeps]
    assert [r.status for r in results] == [Status.TIMEOUT] * 3
    assert all(r.run_s is not None and r.run_s < 2.3 for r in results)
    assert sorted(done_at[i] for i in range(3))[:2] < [2.3, 2.3]
    assert quick.result().status is Status.OK and done_at[3] < 2.3 + 0.3
    t = time.monotonic()
    assert gclient.call(G + "quick", {}).status is Status.OK
    assert time.monotonic() - t < 0.5


@pytest.mark.parametrize("tool,arguments", [("gil_hold", {}), ("spin", {"seconds": 60})])
def test_process_tool_is_killed_at_its_limit(
    gclient: ToolClient, tool: str, arguments: dict[str, float]
) -> None:
    """GIL-holding C code and a busy loop in process isolation answer timeout within 1.3 s,
    and the next call runs normally."""
    started = time.monotonic()
    result = gclient.call(G + tool, arguments, timeout_s=30)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started < 1.3
    after = gclient.call(G + "process_quick", {}, timeout_s=5)
    assert after.status is Status.OK and isinstance(after.content, int)


def test_cancel_while_queued_never_runs(gclient: ToolClient, r: redis.Redis) -> None:
    """A call canceled while it waits in the queue resolves canceled and never runs."""
    blockers = [gclient.submit(G + "sleep", {"seconds": 1.0}, timeout_s=10) for _ in range(2)]
    time.sleep(0.2)
    key = f"count-{uuid.uuid4().hex}"
    queued = gclient.submit(G + "count", {"key": key}, timeout_s=10)
    assert gclient.cancel(queued.call_id)
    assert queued.result().status is Status.CANCELED
    assert [b.result().status for b in blockers] == [Status.OK, Status.OK]
    time.sleep(0.5)
    assert r.get(key) is None
    assert not gclient.cancel(queued.call_id)


@pytest.mark.parametrize("tool", ["ticks", "process_ticks"])
def test_cancel_while_running_stops_the_tool(
    gclient: ToolClient, r: redis.Redis, tool: str
) -> None:
    """A running async or process tool stops within 0.3 s of cancel; the call is canceled."""
    key = f"ticks-{uuid.uuid4().hex}"
    future = gclient.submit(G + tool, {"key": key}, timeout_s=20)
    deadline = time.monotonic() + 5
    while int(r.get(key) or 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert int(r.get(key) or 0) >= 3, "the tool never started"
    assert gclient.cancel(future.call_id)
    assert future.result().status is Status.CANCELED
    time.sleep(0.3)
    settled = int(r.get(key) or 0)
    time.sleep(0.5)
    assert int(r.get(key) or 0) == settled, "the tool kept running after cancel"


def test_cancel_reaches_a_running_thread_tool(gclient: ToolClient, r: redis.Redis) -> None:
    """A running thread tool sees context.canceled become true."""
    key = f"watch-{uuid.uuid4().hex}"
    future = gclient.submit(G + "watch_cancel", {"key": key}, timeout_s=20)
    time.sleep(0.3)
    assert gclient.cancel(future.call_id)
    assert future.result().status is Status.CANCELED
    deadline = time.monotonic() + 2
    while r.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.get(key) == b"saw cancel"


def test_producer_refuses_oversize_arguments(gclient: ToolClient) -> None:
    """Arguments over the size limit are rejected before anything is published."""
    result = gclient.call(G + "count", {"key": "x" * 2_000_000})
    assert result.status is Status.REJECTED and "over the limit" in str(result.content)


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
