"""A call whose run kills its worker process is re-run a bounded number of times.

Real Redis, a real ``toolfleet worker`` fleet: an idempotent tool that SIGKILLs its own
process is run ``crash_reruns + 1`` times at most, then answered ``crashed`` with the
cause, dead-lettered and counted, while the calls beside it are served.
"""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status

QUEUE = "tools.crashloop"
KILLER = "ext_crashloop_self_kill"
ECHO = "ext_crashloop_echo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str, labels: dict[str, str]) -> float:
    """The value of sample ``name`` with ``labels`` on ``/metrics`` (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


@pytest.fixture
def crash_fleet(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    """Two worker processes serving tests/crash_loop_tools.py, /metrics on a free port."""
    ns = f"{namespace}-crash-{uuid.uuid4().hex[:6]}"
    port = _free_port()
    fleet = start_fleet(
        redis_url, ns, tmp_path / "worker.log", processes=2, threads=4,
        extra=["--extension", "crash_loop_tools:extension"], ready_queue=QUEUE,
        env={"TOOLFLEET_METRICS_PORT": str(port)},
    )  # fmt: skip
    fleet.metrics_port = port  # type: ignore[attr-defined]
    try:
        yield fleet
    finally:
        fleet.stop()


def test_a_call_that_kills_its_process_is_rerun_twice_then_answered_crashed(
    crash_fleet: Fleet, r: redis.Redis
) -> None:
    """Three runs (the default ``crash_reruns`` is 2), then ``crashed`` naming the cause,
    dead-lettered and counted; 20 calls sent beside it while it kills processes are ok."""
    ns = crash_fleet.namespace
    runs_key = f"{ns}:test:runs"
    with ToolClient(crash_fleet.redis_url, namespace=ns) as client:
        killer = client.submit(KILLER, {"key": runs_key}, timeout_s=30)
        innocents = []
        for i in range(20):  # one every 0.3 s: sent while processes die and restart
            innocents.append(client.submit(ECHO, {"text": f"n{i}"}, timeout_s=30))
            time.sleep(0.3)
        result = killer.result(timeout=60)
        answers = [f.result(timeout=60) for f in innocents]
    assert result.status is Status.CRASHED, result
    assert "died 3 times" in result.content["error"], result.content
    assert int(r.get(runs_key) or 0) == 3
    assert [(a.status, a.content) for a in answers] == [(Status.OK, f"n{i}") for i in range(20)]
    letters = r.zrange(f"{ns}:{QUEUE}.XQ", 0, -1)
    bodies = [r.hget(f"{ns}:{QUEUE}.XQ.msgs", m) or b"" for m in letters]
    assert [b for b in bodies if result.id.encode() in b], letters  # dead-lettered
    port = crash_fleet.metrics_port  # type: ignore[attr-defined]
    assert _metric(port, "toolfleet_crash_loops_total", {"function": KILLER}) == 1.0
