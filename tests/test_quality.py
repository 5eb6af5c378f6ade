"""Model-facing quality on a real fleet: `toolfleet quality` and the Prometheus series agree."""

from __future__ import annotations

import json
import os
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
from prometheus_client.parser import text_string_to_metric_families

from conftest import Fleet, delete_namespace, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared.aggregates import read_window
from toolfleet.shared.settings import Settings

ADD = "ext_fleet_test_add"
FAIL = "ext_fleet_test_fail"
MODELS = ["model-a", "model-b"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def quality_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fleet, int]]:
    """Two worker processes that count model-a and model-b by name, with a /metrics port."""
    port = _free_port()
    tmp = tmp_path_factory.mktemp("quality")
    env = {
        "TOOLFLEET_QUALITY_MODELS": json.dumps(MODELS),
        "TOOLFLEET_METRICS_PORT": str(port),
        "TMPDIR": str(tmp),  # a private Prometheus folder (the supervisor makes one)
    }
    saved = os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    ns = f"{namespace}-q-{uuid.uuid4().hex[:6]}"
    try:
        fleet = start_fleet(redis_url, ns, tmp / "worker.log", processes=2, env=env)
    finally:
        if saved is not None:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    yield fleet, port
    fleet.stop()


def _quality(fleet: Fleet, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [toolfleet_command(), "quality", "--since", "10m", "--format", "json", *args],
        env={**os.environ, "TOOLFLEET_REDIS_URL": fleet.redis_url,
             "TOOLFLEET_NAMESPACE": fleet.namespace},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _rows_when(fleet: Fleet, calls: int) -> list[dict[str, Any]]:
    """The report's rows once the heartbeats have written ``calls`` calls (30 s at most)."""
    deadline = time.monotonic() + 30
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = _quality(fleet)["rows"]
        if sum(row["calls"] for row in rows) >= calls:
            return rows
        time.sleep(0.3)
    raise AssertionError(f"the aggregates did not reach {calls} calls: {rows}")


def _samples(port: int) -> list[Any]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples: list[Any], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_rates_and_failing_fields_per_model_are_exact_in_report_and_metrics(
    quality_fleet: tuple[Fleet, int],
) -> None:
    """Known mixes of good and bad arguments under two listed models and one unlisted model
    give exact per-model rates and failing fields in `toolfleet quality --format json` and in
    the Prometheus series; the unlisted model counts as ``other``."""
    fleet, port = quality_fleet
    # Given: model-a 6 good adds, 2 without b, 1 with b of the wrong type;
    #        model-b 3 good adds, 1 with an extra argument, 2 tool errors;
    #        model-z (not listed) 1 good add and 1 without a
    plan: list[tuple[str, str, dict[str, Any], str]] = [
        *[("model-a", ADD, {"a": i, "b": 1}, "ok") for i in range(6)],
        *[("model-a", ADD, {"a": 1}, "invalid_arguments") for _ in range(2)],
        ("model-a", ADD, {"a": 1, "b": "seven"}, "invalid_arguments"),
        *[("model-b", ADD, {"a": i, "b": 2}, "ok") for i in range(3)],
        ("model-b", ADD, {"a": 1, "b": 2, "c": 3}, "invalid_arguments"),
        *[("model-b", FAIL, {"reason": "no"}, "tool_error") for _ in range(2)],
        ("model-z", ADD, {"a": 1, "b": 3}, "ok"),
        ("model-z", ADD, {"b": 3}, "invalid_arguments"),
    ]
    # When: every call is made through the producer
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        for model, function, arguments, want in plan:
            result = client.call(function, arguments, context={"llmclient": model}, timeout_s=20)
            assert result.status.value == want, result
    rows = _rows_when(fleet, len(plan))
    time.sleep(1.5)  # three more heartbeats: nothing is counted twice
    rows = _quality(fleet)["rows"]

    # Then: the report, worst first
    by_key = {(r["function"], r["model"]): r for r in rows}
    assert [(r["function"], r["model"]) for r in rows] == [
        (FAIL, "model-b"),  # 100% failed
        (ADD, "other"),  # 1 of 2
        (ADD, "model-a"),  # 3 of 9
        (ADD, "model-b"),  # 1 of 4
    ]
    a = by_key[(ADD, "model-a")]
    assert a["calls"] == 9 and a["statuses"] == {"invalid_arguments": 3, "ok": 6}
    assert a["rates"] == {"invalid_arguments": round(3 / 9, 4), "ok": round(6 / 9, 4)}
    assert a["failing_fields"] == [
        {"field": "b", "reason": "missing", "calls": 2},
        {"field": "b", "reason": "wrong_type", "calls": 1},
    ]
    assert a["run_p50_s"] is not None and a["wait_p95_s"] is not None
    b = by_key[(ADD, "model-b")]
    assert b["statuses"] == {"invalid_arguments": 1, "ok": 3}
    assert b["failing_fields"] == [{"field": "c", "reason": "extra", "calls": 1}]
    assert by_key[(FAIL, "model-b")]["rates"] == {"tool_error": 1.0}
    other = by_key[(ADD, "other")]
    assert other["statuses"] == {"invalid_arguments": 1, "ok": 1}
    assert other["failing_fields"] == [{"field": "a", "reason": "missing", "calls": 1}]
    assert [(r["function"], r["model"]) for r in _quality(fleet, "--model", "model-a")["rows"]] == [
        (ADD, "model-a")
    ]

    # And: the same numbers in the Prometheus series, under the same model bound
    samples = _samples(port)
    calls = "toolfleet_tool_calls_total"
    fields = "toolfleet_invalid_argument_fields_total"
    assert _value(samples, calls, function=ADD, model="model-a", status="ok") == 6
    assert _value(samples, calls, function=ADD, model="model-a", status="invalid_arguments") == 3
    assert _value(samples, calls, function=FAIL, model="model-b", status="tool_error") == 2
    assert _value(samples, calls, function=ADD, model="other") == 2
    assert _value(samples, calls, model="model-z") == 0
    assert _value(samples, fields, function=ADD, model="model-a", field="b", reason="missing") == 2
    assert _value(samples, fields, function=ADD, model="model-a", field="b",
                  reason="wrong_type") == 1  # fmt: skip
    assert _value(samples, fields, function=ADD, model="model-b", field="(undeclared)",
                  reason="extra") == 1  # fmt: skip
    assert _value(samples, fields, function=ADD, model="other", field="a", reason="missing") == 1


def test_quality_table_and_csv_name_the_worst_pair(quality_fleet: tuple[Fleet, int]) -> None:
    """The table and CSV formats print the rows of the same aggregates."""
    fleet, _ = quality_fleet
    env = {**os.environ, "TOOLFLEET_REDIS_URL": fleet.redis_url,
           "TOOLFLEET_NAMESPACE": fleet.namespace, "COLUMNS": "200"}  # fmt: skip
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        client.call(FAIL, {"reason": "no"}, context={"llmclient": "model-a"}, timeout_s=20)
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        text = subprocess.run(
            [toolfleet_command(), "quality", "--since", "10m", "--format", "csv",
             "--tool", FAIL, "--model", "model-a"],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        if len(text.splitlines()) > 1:
            break
        time.sleep(0.3)
    header, row = text.splitlines()
    assert header.startswith("function,model,calls,tool_error_rate,failing_fields")
    assert row.startswith(f"{FAIL},model-a,1,1.0,")
    table = subprocess.run(
        [toolfleet_command(), "quality", "--since", "10m", "--model", "model-a"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert table.index(FAIL) < table.index(ADD)  # worst first


def test_since_must_be_a_duration(tmp_path: Path) -> None:
    """`--since` refuses what is not a duration, before reading anything."""
    out = subprocess.run(
        [toolfleet_command(), "quality", "--since", "soon"],
        env={**os.environ, "TOOLFLEET_REDIS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "not a duration" in out.stderr


def _unknown_count(model: str, asked: str) -> float:
    from toolfleet.producer import metrics

    value = metrics.REGISTRY.get_sample_value(
        "toolfleet_client_unknown_functions_total", {"model": model, "asked": asked}
    )
    return value or 0.0


def test_a_misspelled_name_answers_the_nearest_tool_and_is_counted_per_model(
    quality_fleet: tuple[Fleet, int],
) -> None:
    """A call to a misspelled function is answered unknown_function naming the nearest served
    function, and the producer's counter for that model and name rose by one."""
    fleet, _ = quality_fleet
    settings = Settings.from_env(quality_models=MODELS)
    before = _unknown_count("model-a", "ext_fleet_test_ad")
    other_before = _unknown_count("other", "ext_fleet_test_ad")
    with ToolClient(fleet.redis_url, namespace=fleet.namespace, settings=settings) as client:
        result = client.call("ext_fleet_test_ad", {"a": 1, "b": 2},
                             context={"llmclient": "model-a"}, timeout_s=20)  # fmt: skip
        turn = client.dispatch(
            [{"id": "call_0", "type": "function",
              "function": {"name": "ext_fleet_test_ad", "arguments": "{}"}}],
            context={"llmclient": "model-q"}, timeout_s=20,
        )  # fmt: skip
    assert result.status.value == "unknown_function"
    assert result.error is not None
    assert result.error.startswith("unknown function 'ext_fleet_test_ad'; did you mean ")
    assert "'ext_fleet_test_add'" in result.error.split("did you mean", 1)[1]
    assert "did you mean" in str(turn)
    assert _unknown_count("model-a", "ext_fleet_test_ad") == before + 1
    assert _unknown_count("other", "ext_fleet_test_ad") == other_before + 1


def test_a_name_near_nothing_served_gets_no_suggestion(quality_fleet: tuple[Fleet, int]) -> None:
    """A name like no served function is answered with the plain message."""
    fleet, _ = quality_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call("get_weather_in_paris", {}, timeout_s=20)
    assert result.content == {"error": "unknown function 'get_weather_in_paris'"}


def test_demo_prints_the_quality_report_of_its_traffic(tmp_path: Path) -> None:
    """`toolfleet demo` ends with the quality report of what it replayed (models named by the
    sample) and the unknown functions its producer was asked for."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLFLEET_REDIS_URL"}
    env |= {"COLUMNS": "400", "TOOLFLEET_NAMESPACE": f"tfq-{uuid.uuid4().hex[:8]}"}
    out = subprocess.run(
        [toolfleet_command(), "demo"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = out.stdout.split("quality (toolfleet quality)", 1)[1]
    rows = [line for line in report.splitlines()[4:] if line.startswith("│ ") and "│ demo/" in line]
    # worst first: the calls the producer refused (names no worker serves: 100% not ok,
    # one row per model), then the worst served tool
    refused = [row for row in rows if row.split("│")[1].strip() == "unknown"]
    assert len(refused) == 2 and rows[:2] == refused
    assert all("unknown_function 100%" in row for row in refused)
    assert "ext_bfcl_math_factorial" in rows[2] and "demo/model-b" in rows[2]
    assert "verbose (extra) x1" in report and "n (missing) x1" in report
    asked = report.split("unknown functions (this producer)", 1)[1]
    assert "ext_bfcl_math_gdc" in asked and "demo/model-b" in asked


def test_calls_answered_since_the_last_heartbeat_are_written_at_drain(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """With heartbeats a minute apart, the calls of a fleet stopped before its next beat are
    in the aggregates all the same: the drain writes them."""
    ns = f"{namespace}-qd-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1,
                        env={"TOOLFLEET_HEARTBEAT_INTERVAL_S": "60",
                             "TOOLFLEET_WORKER_TTL_S": "180"})  # fmt: skip
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            for i in range(4):
                assert client.call(ADD, {"a": i, "b": 1}, timeout_s=20).ok
        before = _window_calls(redis_url, ns)
        assert fleet.stop() == 0
        after = _window_calls(redis_url, ns)
    finally:
        fleet.stop()
        delete_namespace(redis_url, ns)
    assert (before, after) == (0, 4)


def _window_calls(redis_url: str, ns: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(c.calls for c in read_window(client, ns, time.time() - 600).totals())
    finally:
        client.close()
