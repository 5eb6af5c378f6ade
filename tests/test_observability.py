"""Observability: metrics across processes, lifecycle signals and events, top, health."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import TESTS, Fleet, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status, ToolCallRequest
from toolfleet.shared.naming import cancel_key, events_key
from toolfleet.shared.wire import new_call_id

ROOT = TESTS.parent
F = "ext_fleet_test_"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, list[Any]]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _publish_direct(fleet: Fleet, function: str, arguments: Any, **overrides: Any) -> None:
    client = redis.Redis.from_url(fleet.redis_url)
    request = ToolCallRequest(
        id=overrides.pop("id", new_call_id()),
        function=function,
        arguments=arguments,
        reply_to=f"{fleet.namespace}:reply:direct",
        deadline=overrides.pop("deadline", time.time() + 10),
        timeout_s=10,
    )
    Publisher(client, fleet.namespace).publish("tools.fleet-test", request)
    client.close()


@pytest.fixture(scope="module")
def metrics_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Four worker processes with /metrics on a free port and a private health folder."""
    tmp = tmp_path_factory.mktemp("obs")
    port = _free_port()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-obs-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        processes=4,
        threads=4,
        env={
            "TOOLFLEET_METRICS_PORT": str(port),
            "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
            "TOOLFLEET_HEALTH_DIR": str(tmp / "health"),
            "TOOLFLEET_MAX_ARGUMENTS_BYTES": "2048",
        },
    )
    fleet.metrics_port = port  # type: ignore[attr-defined]
    fleet.health_dir = tmp / "health"  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


def test_metrics_count_every_status_exactly_across_processes(
    metrics_fleet: Fleet, tmp_path: Path
) -> None:
    """Calls of every status, one worker SIGKILLed mid-call: the scraped counts are exact, the
    in-flight gauge is back to 0, and the dead process's series are gone."""
    fleet = metrics_fleet
    expected: dict[str, int] = {}

    def expect(status: str, n: int = 1) -> None:
        expected[status] = expected.get(status, 0) + n

    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        pid_file = tmp_path / "pid"
        victim = client.submit(
            F + "pid_sleep", {"path": str(pid_file), "seconds": 20}, timeout_s=30
        )
        calls = [(F + "add", {"a": i, "b": 1}, "ok") for i in range(40)]
        calls += [(F + "fail", {"reason": "no"}, "tool_error")] * 3
        calls += [(F + "add", '{"a": 1', "invalid_arguments")] * 4
        calls += [(F + "boom", {}, "crashed")] * 2
        calls += [(F + "async_sleep", {"seconds": 5}, "timeout")]
        futures = [(client.submit(f, a, timeout_s=20), s) for f, a, s in calls]
        for future, status in futures:
            assert future.result().status.value == status
            expect(status)
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        # the gauge goes out with the process's next metrics flush (each second at most)
        deadline = time.monotonic() + 10
        while True:
            during = _scrape(fleet.metrics_port)  # type: ignore[attr-defined]
            running = any(
                s.value == 1
                for s in during.get("toolfleet_calls_in_flight", [])
                if s.labels["function"] == F + "pid_sleep"
            )
            if running or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert running
        dead_pid = int(pid_file.read_text())
        os.kill(dead_pid, signal.SIGKILL)
        assert victim.result().status is Status.CRASHED  # requeued, answered by another worker
        expect("crashed")
    _publish_direct(fleet, "ext_fleet_test_nothing", {})
    expect("unknown_function")
    _publish_direct(fleet, F + "add", {"a": 1, "b": 2}, deadline=time.time() - 1)
    expect("expired")
    _publish_direct(fleet, F + "add", {"a": 1, "b": 2, "pad": "x" * 4000})
    expect("rejected")
    canceled_id = new_call_id()
    redis.Redis.from_url(fleet.redis_url).set(cancel_key(fleet.namespace, canceled_id), b"1", ex=60)
    _publish_direct(fleet, F + "add", {"a": 1, "b": 2}, id=canceled_id)
    expect("canceled")

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        samples = _scrape(fleet.metrics_port)  # type: ignore[attr-defined]
        counts: dict[str, float] = {}
        for s in samples.get("toolfleet_tool_calls_total", []):
            counts[s.labels["status"]] = counts.get(s.labels["status"], 0) + s.value
        pids = {s.labels["pid"] for s in samples.get("toolfleet_worker_up", [])}
        if counts == {k: float(v) for k, v in expected.items()} and len(pids) == 4:
            break
        time.sleep(0.5)
    assert counts == {k: float(v) for k, v in expected.items()}
    in_flight = [s.value for s in samples["toolfleet_calls_in_flight"]]
    assert in_flight and all(v == 0 for v in in_flight)
    pids = {s.labels["pid"] for s in samples["toolfleet_worker_up"]}
    assert str(dead_pid) not in pids and len(pids) == 4
    invalid = sum(s.value for s in samples["toolfleet_invalid_arguments_total"])
    assert invalid == expected["invalid_arguments"]
    assert not {"toolfleet_queue_depth", "toolfleet_queue_workers"} & set(samples), (
        "fleet-wide gauges come from `toolfleet exporter` only"
    )


def test_top_renders_a_frame(metrics_fleet: Fleet) -> None:
    """`toolfleet top --once` prints queues, workers and per-function statistics."""
    with ToolClient(metrics_fleet.redis_url, namespace=metrics_fleet.namespace) as client:
        for i in range(5):
            client.call(F + "add", {"a": i, "b": 1})
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": metrics_fleet.redis_url,
        "TOOLFLEET_NAMESPACE": metrics_fleet.namespace,
        "COLUMNS": "200",
    }
    out = subprocess.run(
        [toolfleet_command(), "top", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for needle in ("queues", "workers", "functions", "tools.fleet-test", F + "add", "p99 ms"):
        assert needle in out.stdout, needle


def test_health_live_fails_when_the_event_loop_is_stuck_and_ready_when_redis_is_down(
    metrics_fleet: Fleet,
) -> None:
    """`health --live` passes, then fails while an async tool blocks its process's loop;
    `--ready` fails when Redis is down."""
    base = {
        **os.environ,
        "TOOLFLEET_HEALTH_DIR": str(metrics_fleet.health_dir),  # type: ignore[attr-defined]
        "TOOLFLEET_HEALTH_STALE_S": "3",
        "TOOLFLEET_REDIS_URL": metrics_fleet.redis_url,
    }

    def health(mode: str, **env: str) -> int:
        return subprocess.run(
            [toolfleet_command(), "health", f"--{mode}"],
            env={**base, **env},
            capture_output=True,
            timeout=60,
            check=False,
        ).returncode

    assert health("live") == 0 and health("ready") == 0
    closed = f"redis://127.0.0.1:{_free_port()}/0"
    assert health("ready", TOOLFLEET_REDIS_URL=closed) == 1
    assert health("live", TOOLFLEET_REDIS_URL=closed) == 0
    with ToolClient(metrics_fleet.redis_url, namespace=metrics_fleet.namespace) as client:
        futures = [client.submit(F + "block_loop", {"seconds": 8}, timeout_s=20) for _ in range(8)]
        deadline = time.monotonic() + 8
        failed = False
        while time.monotonic() < deadline and not failed:
            failed = health("live") == 1
            time.sleep(0.5)
        assert failed, "health --live never failed while event loops were blocked"
        for future in futures:
            future.result()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and health("live") != 0:
        time.sleep(0.5)
    assert health("live") == 0


def test_signals_and_events_one_of_each_kind_per_call_without_secrets_or_arguments(
    r: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process subscribers and the events stream see tool_presented, tool_requested and
    tool_responded once per call, with the planted secret and the arguments absent."""
    from toolfleet.shared.signals import tool_presented, tool_requested, tool_responded
    from toolfleet.worker.pipeline.calls import CallPipeline
    from toolfleet.worker.pipeline.handler import CallHandler
    from toolfleet.worker.pipeline.ledger import Ledger
    from toolfleet.worker.pipeline.observe import Observer
    from toolfleet.worker.registry.loader import load_spec
    from toolfleet.worker.registry.registry import Registry

    secret = "sk-signal-" + uuid.uuid4().hex
    monkeypatch.setenv("TFTEST_GUARDED_API_KEY", secret)
    ns = f"{namespace}-sig-{uuid.uuid4().hex[:6]}"
    registry = Registry(ns)
    registry.add_extension(load_spec("guarded_ext:extension"))
    pipeline = CallPipeline(registry, worker_id="test:1", max_arguments_bytes=10_000)
    ledger = Ledger(r, ns, "test:1", 60, 10)
    worker = CallHandler(pipeline, ledger, Observer(registry, "test:1"))
    seen: dict[str, list[dict[str, Any]]] = {"presented": [], "requested": [], "responded": []}

    def keep(kind: str) -> Any:
        def receiver(sender: str, **event: Any) -> None:
            seen[kind].append(event)

        return receiver

    receivers = [keep("presented"), keep("requested"), keep("responded")]
    tool_presented.connect(receivers[0])
    tool_requested.connect(receivers[1])
    tool_responded.connect(receivers[2])
    try:
        marker = "argument-marker-" + uuid.uuid4().hex
        for tool in ("leak", "leak_in_error", "leak_in_crash"):
            request = ToolCallRequest(
                id=new_call_id(),
                function=f"ext_guarded_{tool}",
                arguments={},
                context={
                    "account": "acme",
                    "metadata": {"m": marker},
                    "traceparent": "00-abc-def-01",
                },
                reply_to=f"{ns}:reply:x",
                deadline=time.time() + 10,
                timeout_s=10,
            )
            worker.handle(request.encode().decode(), "tools.guarded")
        _present_tools(r, ns, registry)
    finally:
        for receiver, sig in zip(
            receivers, (tool_presented, tool_requested, tool_responded), strict=True
        ):
            sig.disconnect(receiver)
    assert (
        len(seen["requested"]) == 3 and len(seen["responded"]) == 3 and len(seen["presented"]) == 1
    )
    assert [e["status"] for e in seen["responded"]] == ["ok", "tool_error", "crashed"]
    stream = [json.loads(f[b"event"]) for _, f in r.xrange(events_key(ns))]
    # one stream entry per call: its tool_responded event with the request's arguments
    assert [e["kind"] for e in stream] == ["tool_responded"] * 3
    assert [e["status"] for e in stream] == ["ok", "tool_error", "crashed"]
    assert [e["requested_at"] for e in stream] == [e["at"] for e in seen["requested"]]
    assert all(e["arguments"] == "[redacted]" for e in stream)
    everything = json.dumps([seen, stream], default=str)
    assert secret not in everything
    assert all(e["arguments"] == "[redacted]" for e in seen["requested"])
    assert all(e["traceparent"] == "00-abc-def-01" for e in seen["responded"])


def _present_tools(r: redis.Redis, ns: str, registry: Any) -> None:
    from toolfleet.worker.supervision.heartbeat import CatalogPublisher

    CatalogPublisher(r, ns, registry, "test:1", {"tools.guarded"}, 1.0, 10.0).publish()
    url = r.connection_pool.connection_kwargs
    client_url = (
        f"redis://{url.get('host', '127.0.0.1')}:{url.get('port', 6379)}/{url.get('db', 0)}"
    )
    if "path" in url:
        client_url = f"unix://{url['path']}"
    with ToolClient(client_url, namespace=ns) as client:
        assert {t["function"]["name"] for t in client.tools(account="acme")} >= {"ext_guarded_leak"}


def _metric_names_in(expr: str) -> set[str]:
    """The toolfleet metric names ``expr`` reads (label names in matchers and
    ``label_values(metric, label)``'s label are not metrics)."""
    expr = re.sub(r",\s*\w+\s*\)", ")", expr) if expr.startswith("label_values(") else expr
    names = set(re.findall(r"\b(toolfleet_[a-z_]+)\b(?!\s*(?:=|!=|=~|!~))", expr))
    out = set()
    for name in names:
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        out.add(name)
    return out


def _registered_metric_names() -> set[str]:
    from toolfleet.producer import metrics as producer_metrics
    from toolfleet.worker.supervision import metrics as worker_metrics

    names: set[str] = set()
    for module in (worker_metrics, producer_metrics):
        for value in vars(module).values():
            describe = getattr(value, "describe", None)
            if callable(describe) and hasattr(value, "_name"):
                for family in describe():
                    names.add(family.name + ("_total" if family.type == "counter" else ""))
    names |= {"toolfleet_queue_depth", "toolfleet_dead_letters", "toolfleet_queue_workers"}
    return names


def test_dashboard_and_alerts_use_only_metrics_the_code_defines() -> None:
    """Every metric name in the Grafana dashboard and the alert rules exists in the code."""
    dashboard = json.loads((ROOT / "deploy/grafana/toolfleet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = set().union(*(_metric_names_in(e) for e in exprs))
    known = _registered_metric_names()
    assert used and used <= known, sorted(used - known)


def test_dashboard_filters_by_its_variables_over_grafanas_rate_interval() -> None:
    """The dashboard has namespace, queue_group, queue and function variables; every rate
    window is $__rate_interval; each query filters on the variables its series carry (the
    queue group label being the one the PodMonitor copies from the pods)."""
    dashboard = json.loads((ROOT / "deploy/grafana/toolfleet.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"namespace", "queue_group", "queue", "function"} <= set(variables)
    for name in ("namespace", "queue_group", "queue", "function"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    monitor = yaml.safe_load((ROOT / "deploy/k8s/base/podmonitor.yaml").read_text())
    (pod_label,) = monitor["spec"]["podTargetLabels"]
    group_label = re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)  # as prometheus-operator writes it
    assert group_label in variables["queue_group"]["query"]["query"]
    fleet_wide = {"toolfleet_queue_depth", "toolfleet_dead_letters", "toolfleet_queue_workers"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            windows = re.findall(r"\[([^\]]+)\]", expr)
            assert all(w == "$__rate_interval" for w in windows), expr
            metrics = _metric_names_in(expr)
            if metrics & fleet_wide:
                assert 'queue=~"$queue"' in expr and 'namespace=~"$namespace"' in expr, expr
            elif not any(m.startswith("toolfleet_client_") for m in metrics):
                assert f'{group_label}=~"$queue_group"' in expr, expr
            if "by (function)" in expr or "_tool_call_duration_" in expr:
                assert 'function=~"$function"' in expr, expr


def test_alert_rules_are_valid() -> None:
    """`promtool check rules` accepts the alert rules (schema-checked when promtool is absent)."""
    path = ROOT / "deploy/prometheus/alerts.yml"
    import shutil

    promtool = shutil.which("promtool")
    if promtool:
        out = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stdout + out.stderr
    elif os.environ.get("CI"):
        pytest.fail("promtool missing in CI: .ci/run installs Debian's prometheus package")
    rules = yaml.safe_load(path.read_text())
    for group in rules["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert rule["alert"] and rule["expr"] and re.fullmatch(r"\d+[smh]", rule["for"])
