"""Metric series describe the live fleet: none of dead processes, none of tool children."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from conftest import TEST_QUEUE, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, new_call_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(port: int, name: str) -> list[Any]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_process_children_export_no_series_alive_or_dead(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """With process-isolation children running and three killed at their limit, /metrics has
    one toolfleet_worker_up series (value 1) and one toolfleet_stuck_threads series per worker
    process; an oversize result and oversize arguments are counted."""
    port = _free_port()
    fleet = start_fleet(
        redis_url, f"{namespace}-series-{uuid.uuid4().hex[:6]}", tmp_path / "worker.log",
        processes=1, threads=2, extra=["--extension", "guarantee_tools:extension"],
        env={"TOOLFLEET_METRICS_PORT": str(port),
             "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
    )  # fmt: skip
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            assert client.call("ext_guarantee_process_quick", {}).ok
            for _ in range(3):
                spun = client.call("ext_guarantee_spin", {"seconds": 30}, timeout_s=10)
                assert spun.status is Status.TIMEOUT
            assert client.call("ext_guarantee_process_quick", {}).ok
            big = client.call("ext_fleet_test_echo", {"text": "x", "times": 2_000_000})
            assert big.status is Status.TOOL_ERROR and "over the limit" in str(big.content)
            reply_to = f"{fleet.namespace}:reply:big-{uuid.uuid4().hex}"
            request = ToolCallRequest(
                id=new_call_id(), function="ext_fleet_test_echo",
                arguments={"text": "y" * 1_100_000}, reply_to=reply_to,
                deadline=time.time() + 10, timeout_s=10,
            )  # fmt: skip
            r = redis.Redis.from_url(fleet.redis_url)
            Publisher(r, fleet.namespace).publish(TEST_QUEUE, request)
            item = r.blpop([reply_to], timeout=10)
            r.close()
            assert item is not None
            assert ReplyEnvelope.decode(item[1]).result.status is Status.REJECTED  # type: ignore[union-attr]
        time.sleep(0.5)
        oversize = {s.labels["kind"]: s.value for s in _samples(port, "toolfleet_oversize_total")}
        assert oversize == {"result": 1.0, "arguments": 1.0}, oversize
        up = _samples(port, "toolfleet_worker_up")
        stuck = _samples(port, "toolfleet_stuck_threads")
        assert [s.value for s in up] == [1.0], up
        assert len(stuck) == 1, stuck
        assert len(list((tmp_path / "metrics").glob("gauge_liveall_*.db"))) == 1
    finally:
        fleet.stop()


def test_invalid_arguments_log_line_carries_the_raw_arguments(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """An invalid_arguments call logs the arguments string the model sent."""
    fleet = start_fleet(redis_url, f"{namespace}-badargs-{uuid.uuid4().hex[:6]}",
                        tmp_path / "worker.log", processes=1, threads=2)  # fmt: skip
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            result = client.call("ext_fleet_test_add", '{"a": "seven", "b": 2}')
            assert result.status is Status.INVALID_ARGUMENTS
        time.sleep(0.5)
        assert 'the model sent: {"a": "seven", "b": 2}' in fleet.log()
    finally:
        fleet.stop()
