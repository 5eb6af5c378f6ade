"""Every terminal status is counted once, wherever the fleet counts calls."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_fleet_metrics import ALERTS, _promtool

from conftest import Fleet, delete_namespace, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.aggregates import read_window
from toolfleet.shared.failures import search
from toolfleet.shared.naming import events_key
from toolfleet.ui.snapshot import read_snapshot

HOG = "ext_promise_hog"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _calls_samples(port: int) -> list[Any]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "toolfleet_tool_calls_total"
    ]


def _metrics_fleet(
    redis_url: str, prefix: str, tmp: Path, processes: int, extra: list[str] | None = None
) -> Iterator[tuple[Fleet, int]]:
    """A fleet of ``processes`` worker processes of two threads serving /metrics on a free
    port, in a fresh namespace under ``prefix``; stopped and its keys deleted after."""
    port = _free_port()
    saved = os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    try:
        fleet = start_fleet(
            redis_url, ns, tmp / "worker.log", processes=processes, threads=2, extra=extra,
            env={"TOOLFLEET_METRICS_PORT": str(port), "TMPDIR": str(tmp)},
        )  # fmt: skip
    finally:
        if saved is not None:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    yield fleet, port
    fleet.stop()
    delete_namespace(redis_url, ns)


@pytest.fixture
def hog_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fleet, int]]:
    """One worker process of two threads serving the promise tools, with /metrics."""
    yield from _metrics_fleet(
        redis_url, f"{namespace}-hc", tmp_path_factory.mktemp("hogcount"), processes=1,
        extra=["--extension", "promise_tools:extension"],
    )  # fmt: skip


def _until(check: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} within {timeout_s} s")


def test_a_call_the_watchdog_answers_is_counted_once_everywhere(
    hog_fleet: tuple[Fleet, int], tmp_path: Path
) -> None:
    """A thread tool holding the GIL for 3 s past its 1 s limit is answered timeout by the
    watchdog; its process's late result is discarded. The call is counted once, as
    ``timeout``, in ``toolfleet_tool_calls_total``, the aggregates (``toolfleet quality``,
    the ops page), the events stream and the failures index; and the error-ratio alert,
    fed the series the fleet exposed, fires for the tool."""
    fleet, port = hog_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call(HOG, {"seconds": 3}, timeout_s=30)
    assert result.status is Status.TIMEOUT, result
    time.sleep(4)  # the GIL is back: the process's own late answer came and was discarded
    r = redis.Redis.from_url(fleet.redis_url)

    def counted() -> list[Any]:
        return [s for s in _calls_samples(port) if s.labels["function"] == HOG]

    samples = _until(counted, "the watchdog's timeout reached /metrics")
    assert [(s.labels["status"], s.value) for s in samples] == [("timeout", 1.0)], samples

    def aggregated() -> dict[str, int]:
        cells = read_window(r, fleet.namespace, since_s=time.time() - 600).totals(function=HOG)
        return cells[0].statuses if cells else {}

    assert _until(aggregated, "the aggregates counted the call") == {"timeout": 1}
    snapshot = read_snapshot(r, fleet.namespace, worker_ttl_s=3600)
    tool = snapshot.tool(HOG)
    assert tool is not None and tool.by_status.get("timeout") == 1 and tool.total == 1
    assert [f.id for f in snapshot.failures] == [result.id]
    out = subprocess.run(
        [toolfleet_command(), "quality", "--since", "10m", "--format", "json", "--tool", HOG],
        env={**os.environ, "TOOLFLEET_REDIS_URL": fleet.redis_url,
             "TOOLFLEET_NAMESPACE": fleet.namespace},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (row,) = json.loads(out.stdout)["rows"]
    assert row["calls"] == 1, row

    events = [
        json.loads(fields[b"event"])
        for _, fields in r.xrange(events_key(fleet.namespace))
        if json.loads(fields[b"event"]).get("id") == result.id
    ]
    assert [(e["kind"], e["status"]) for e in events] == [("tool_responded", "timeout")]
    assert [f["status"] for f in search(r, [fleet.namespace], result.id)] == ["timeout"]

    # the alert, fed the fleet's own series of the hanging tool, growing by one a minute
    promtool = _promtool()
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    series = []
    for s in samples:
        labels = {**s.labels, "job": "toolfleet-worker", "namespace": "toolfleet"}
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        series.append({"series": f"toolfleet_tool_calls_total{{{text}}}", "values": "1+1x30"})
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{
                "eval_time": "20m", "alertname": "ToolfleetErrorRatioHigh",
                "exp_alerts": [{
                    "exp_labels": {"severity": "page"},
                    "exp_annotations": {
                        "summary": "More than 5% of tool calls end crashed, timeout, expired "
                                   "or rejected.",
                        "description": "100% of calls failed for reasons the model cannot fix.",
                    },
                }],
            }],
        }],
    }  # fmt: skip
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


ECHO = "ext_fleet_test_echo"


@pytest.fixture
def refusing_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    ns = f"{namespace}-rf-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(redis_url, ns, tmp_path_factory.mktemp("refusing") / "worker.log",
                        processes=1, threads=2)  # fmt: skip
    yield fleet
    fleet.stop()
    delete_namespace(redis_url, ns)


def _producer_calls(**labels: str) -> float:
    from toolfleet.producer import metrics

    value = metrics.REGISTRY.get_sample_value(
        "toolfleet_tool_calls_total", {"extension": "", "model": "none", **labels}
    )
    return value or 0.0


def test_refusals_the_producer_answers_are_counted_once_everywhere(
    refusing_fleet: Fleet,
) -> None:
    """3 calls to an unknown function and 4 calls over an account's quota, answered by the
    producer itself (nothing published): each is counted once in the producer's
    ``toolfleet_tool_calls_total``, the aggregates (``toolfleet quality``, the ops page's
    refusals table), the events stream and the failures index, without a write per call."""
    from toolfleet.shared.tenancy.quotas import Quota, limits_key

    fleet = refusing_fleet
    r = redis.Redis.from_url(fleet.redis_url)
    r.hset(limits_key(fleet.namespace), "tenant-slow",
           Quota(per_s=0.01, burst=1).model_dump_json(exclude_none=True))  # fmt: skip
    unknown_before = _producer_calls(function="unknown", status="unknown_function")
    rejected_before = _producer_calls(function=ECHO, status="rejected")
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        unknown = [client.call("ext_fleet_test_nope", {}, timeout_s=10) for _ in range(3)]
        quota = [
            client.call(ECHO, {"text": "x"}, context={"account": "tenant-slow"}, timeout_s=10)
            for _ in range(5)
        ]
        assert [u.status for u in unknown] == [Status.UNKNOWN_FUNCTION] * 3
        assert [q.status for q in quota] == [Status.OK] + [Status.REJECTED] * 4, quota
        refused = unknown + quota[1:]
        assert _producer_calls(function="unknown", status="unknown_function") == (
            unknown_before + 3
        )
        assert _producer_calls(function=ECHO, status="rejected") == rejected_before + 4

    def aggregated() -> dict[str, dict[str, int]]:
        window = read_window(r, fleet.namespace, since_s=time.time() - 600)
        found = {c.function: c.statuses for c in window.totals()}
        done = found.get(ECHO, {}).get("ok") and found.get(ECHO, {}).get("rejected")
        return found if done and found.get("unknown") else {}

    found = _until(aggregated, "the refusals reached the aggregates")
    assert found == {"unknown": {"unknown_function": 3}, ECHO: {"ok": 1, "rejected": 4}}
    tool = read_snapshot(r, fleet.namespace, worker_ttl_s=3600).tool(ECHO)
    assert tool is not None and tool.by_status.get("rejected") == 4

    events = [json.loads(fields[b"event"]) for _, fields in r.xrange(events_key(fleet.namespace))]
    for result in refused:
        mine = [e for e in events if e.get("id") == result.id]
        assert [(e["kind"], e["status"], e["worker"]) for e in mine] == [
            ("tool_responded", result.status.value, "producer")
        ], mine
        assert [f["status"] for f in search(r, [fleet.namespace], result.id)] == [
            result.status.value
        ]
    out = subprocess.run(
        [toolfleet_command(), "quality", "--since", "10m", "--format", "json"],
        env={**os.environ, "TOOLFLEET_REDIS_URL": fleet.redis_url,
             "TOOLFLEET_NAMESPACE": fleet.namespace},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = {row["function"]: row["calls"] for row in json.loads(out.stdout)["rows"]}
    assert rows == {"unknown": 3, ECHO: 5}, rows


def test_an_async_client_that_only_refuses_writes_its_refusals_within_seconds(
    refusing_fleet: Fleet,
) -> None:
    """An AsyncToolClient whose calls all go to an unknown function publishes nothing: its
    refusals are written by its periodic flush (one pipeline), while it stays open."""
    import asyncio

    from toolfleet.producer import AsyncToolClient

    fleet = refusing_fleet
    r = redis.Redis.from_url(fleet.redis_url)

    async def run() -> list[str]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            results = [await client.call("ext_fleet_test_nowhere", {}) for _ in range(4)]
            assert {res.status for res in results} == {Status.UNKNOWN_FUNCTION}
            await asyncio.sleep(3)  # the client stays open: nothing rides along, the timer writes
            found = [f["id"] for f in search(r, [fleet.namespace], "ext_fleet_test_nowhere")]
            assert sorted(found) == sorted(res.id for res in results)
            return found

    asyncio.run(run())
    window = read_window(r, fleet.namespace, since_s=time.time() - 600)
    assert {c.function: c.statuses for c in window.totals()} == {"unknown": {"unknown_function": 4}}


@pytest.fixture
def two_process_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fleet, int]]:
    """Two worker processes of the test tools, with /metrics."""
    yield from _metrics_fleet(
        redis_url, f"{namespace}-cc", tmp_path_factory.mktemp("crashcount"), processes=2
    )


def test_a_call_whose_process_died_is_counted_once_as_crashed(
    two_process_fleet: tuple[Fleet, int], tmp_path: Path
) -> None:
    """A call running when its worker process is killed is answered ``crashed`` once, and
    counted once: ``toolfleet_tool_calls_total``, the aggregates, the events stream and
    the failures index."""
    import signal

    fleet, port = two_process_fleet
    pid_file = tmp_path / "pid"
    function = "ext_fleet_test_pid_sleep"
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        future = client.submit(function, {"path": str(pid_file), "seconds": 30}, timeout_s=60)
        _until(lambda: pid_file.exists() and pid_file.read_text(), "the tool started")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        result = future.result(timeout=90)
    assert result.status is Status.CRASHED, result
    r = redis.Redis.from_url(fleet.redis_url)

    def counted() -> list[Any]:
        return [s for s in _calls_samples(port) if s.labels["function"] == function]

    samples = _until(counted, "the crash reached /metrics")
    assert [(s.labels["status"], s.value) for s in samples] == [("crashed", 1.0)], samples

    def aggregated() -> dict[str, int]:
        window = read_window(r, fleet.namespace, since_s=time.time() - 600)
        cells = window.totals(function=function)
        return cells[0].statuses if cells else {}

    assert _until(aggregated, "the aggregates counted the crash") == {"crashed": 1}
    events = [json.loads(fields[b"event"]) for _, fields in r.xrange(events_key(fleet.namespace))]
    mine = [(e["kind"], e["status"]) for e in events if e.get("id") == result.id]
    assert mine == [("tool_responded", "crashed")]
    assert [f["status"] for f in search(r, [fleet.namespace], result.id)] == ["crashed"]


def test_producer_refusals_are_written_in_batches_not_per_call(counting_server: Any) -> None:
    """200 calls refused by a producer (no fleet: ``not_available``) cost one ZADD of the
    failures index and a few HINCRBY of the aggregates per write (a write a second at
    most, when nothing is published), not a write per call."""
    from private_redis import command_counts

    client = redis.Redis.from_url(counting_server.url)
    client.config_resetstat()
    with ToolClient(counting_server.url, namespace="batched") as calls:
        futures = [calls.submit("ext_nobody_serves", {}, timeout_s=10) for _ in range(200)]
        assert {f.result(timeout=30).status for f in futures} == {Status.NOT_AVAILABLE}
        time.sleep(2.5)  # the periodic flush (nothing was published to ride along)
    counts = command_counts(client)
    assert client.zcard("batched:failures") == 200
    assert client.xlen("batched:events") == 200
    print("\ncommands for 200 refusals:", sorted(counts.items()))
    writes = counts.get("zadd", 0)
    assert 1 <= writes <= 10, counts  # one per second of submitting, at most
    assert counts.get("hincrby", 0) <= 3 * writes, counts
    assert counts.get("multi", 0) == 0 and counts.get("exec", 0) == 0
