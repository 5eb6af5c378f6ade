"""Fleet-wide gauges are exported once: two fleets on one Redis, their scrapes, the
dashboard's queries and the alert rules evaluated by ``promtool test rules``."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import (
    TEST_QUEUE,
    Fleet,
    delete_namespace,
    start_fleet,
    toolfleet_command,
    unavailable,
)
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import codec
from toolfleet.shared.naming import catalog_key
from toolfleet.shared.wire import ToolCallRequest, new_call_id

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "toolfleet.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
F = "ext_fleet_test_"
FLEET_WIDE = ("toolfleet_queue_depth", "toolfleet_dead_letters", "toolfleet_queue_workers")
#: A queue the catalog lists and no worker serves, filling up.
GHOST_QUEUE = "tools.ghost"
#: Synthetic minutes the measured change between two scrapes is carried on for.
MINUTES = 70
#: What Grafana puts in for the dashboard's variables ("All") and $__rate_interval.
GRAFANA_VALUES = {"$__rate_interval": "5m", "$namespace": ".*", "$queue_group": ".*"}
GRAFANA_VALUES |= {"$queue": ".*", "$function": ".*", "$model": ".*"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        unavailable("promtool missing: .ci/run installs Debian's prometheus package")
    return found


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` on ``port``: (name, sorted labels) -> value."""
    status, text = _get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


class Exporter:
    """A running ``toolfleet exporter`` subprocess."""

    def __init__(
        self, redis_url: str, namespace: str, log_path: Path, *, ready: bool = True
    ) -> None:
        self.port = _free_port()
        env = {**os.environ, "TOOLFLEET_REDIS_URL": redis_url, "TOOLFLEET_NAMESPACE": namespace}
        env["TOOLFLEET_WORKER_TTL_S"] = "3"
        argv = [toolfleet_command(), "exporter", "--port", str(self.port)]
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, log_path.read_text()
            try:
                if _get(self.port, "/readyz")[0] == (200 if ready else 503):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"exporter not ready:\n{log_path.read_text()}")

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=10)
        finally:
            self.log.close()


@pytest.fixture
def two_fleets(
    redis_url: str, namespace: str, tmp_path: Path
) -> Iterator[tuple[list[Fleet], Exporter]]:
    """Fleets of 2 and 1 processes on one Redis and namespace, each with /metrics, and the
    exporter of that namespace."""
    ns = f"{namespace}-fw-{uuid.uuid4().hex[:6]}"
    fleets: list[Fleet] = []
    exporter = None
    try:
        for name, processes in (("a", 2), ("b", 1)):
            port = _free_port()
            env = {"TOOLFLEET_METRICS_PORT": str(port)}
            fleet = start_fleet(
                redis_url,
                ns,
                tmp_path / f"fleet-{name}.log",
                processes=processes,
                extra=["-Q", TEST_QUEUE],
                env=env,
            )
            fleet.metrics_port = port  # type: ignore[attr-defined]
            fleets.append(fleet)
        deadline = time.monotonic() + 30
        while fleets[0].live_workers() < 3:  # both fleets' heartbeats on the one queue
            assert time.monotonic() < deadline, "the fleets' 3 workers never showed up"
            time.sleep(0.1)
        exporter = Exporter(redis_url, ns, tmp_path / "exporter.log")
        yield fleets, exporter
    finally:
        for fleet in fleets:
            fleet.stop()
        if exporter is not None:
            assert exporter.stop() == 0
        delete_namespace(redis_url, ns)


def _fill_ghost_queue(r: redis.Redis, namespace: str, count: int) -> None:
    """Publish ``count`` calls onto GHOST_QUEUE, which no worker consumes."""
    publisher = Publisher(r, namespace)
    for _ in range(count):
        request = ToolCallRequest(
            id=new_call_id(),
            function="ext_ghost_noop",
            arguments={},
            reply_to=f"{namespace}:reply:nobody",
            deadline=time.time() + 600,
            timeout_s=1,
        )
        publisher.publish(GHOST_QUEUE, request)


def _series(
    targets: dict[str, dict[str, str]],
    before: dict[str, dict[Any, float]],
    after: dict[str, dict[Any, float]],
) -> list[dict[str, str]]:
    """promtool input series: each scraped sample with its target's labels, starting at its
    first scrape's value and changing every minute by what it changed between the scrapes."""
    out = []
    for target, labels in targets.items():
        for key, value in sorted(after[target].items()):
            name, own = key
            first = before[target].get(key, 0.0)
            all_labels = {**dict(own), **labels}
            text = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(all_labels.items()))
            out.append(
                {"series": f"{name}{{{text}}}", "values": f"{first}{value - first:+}x{MINUTES}"}
            )
    return out


def _dashboard_exprs() -> list[str]:
    """Every panel query of the dashboard, with Grafana's values put in for its variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in sorted(GRAFANA_VALUES.items(), key=lambda kv: -len(kv[0])):
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
            out.append(expr)
    return out


def _dashboard_query(metric: str) -> str:
    (expr,) = [e for e in _dashboard_exprs() if re.search(rf"\b{metric}\b", e)]
    return expr


def test_two_fleets_count_each_queue_once_and_fire_each_alert_once(
    two_fleets: tuple[list[Fleet], Exporter], tmp_path: Path
) -> None:
    """Two fleets (2 + 1 processes) on one Redis: scraped twice with the exporter, the
    dashboard shows 3 workers for the queue and every alert rule fires exactly once."""
    promtool = _promtool()
    fleets, exporter = two_fleets
    ns = fleets[0].namespace
    r = redis.Redis.from_url(fleets[0].redis_url)
    # Given: a catalogued queue nobody serves, filling up, and a dead letter on the served one.
    ghost = {"name": "ext_ghost_noop", "description": "x", "parameters": {}, "queue": GHOST_QUEUE}
    r.hset(catalog_key(ns), "ext_ghost_noop", codec.dumps(ghost))
    _fill_ghost_queue(r, ns, 120)
    poison = str(uuid.uuid4())
    r.hset(f"{ns}:{TEST_QUEUE}.msgs", poison, b"\x00not a message")
    r.rpush(f"{ns}:{TEST_QUEUE}", poison)
    deadline = time.monotonic() + 20
    while r.zcard(f"{ns}:{TEST_QUEUE}.XQ") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.zcard(f"{ns}:{TEST_QUEUE}.XQ") == 1
    ports = {"fleet-a": fleets[0].metrics_port, "fleet-b": fleets[1].metrics_port}  # type: ignore[attr-defined]
    ports["exporter"] = exporter.port
    for name in ("fleet-a", "fleet-b"):
        names = {key[0] for key in _samples(ports[name])}
        assert not names & set(FLEET_WIDE), f"{name} exports fleet-wide gauges"
    before = {name: _samples(port) for name, port in ports.items()}

    # When: calls that are slow, crash or carry invalid arguments, and the ghost queue grows.
    with ToolClient(fleets[0].redis_url, namespace=ns) as client:
        slow = client.submit(F + "slow", {"seconds": 10.5}, timeout_s=30)
        calls = [(F + "add", {"a": i, "b": 1}, "ok") for i in range(20)]
        calls += [(F + "add", '{"a": 1', "invalid_arguments")] * 10
        calls += [(F + "boom", {}, "crashed")] * 3
        futures = [(client.submit(f, a, timeout_s=20), s) for f, a, s in calls]
        for future, status in futures:
            assert future.result().status.value == status
        assert slow.result().status.value == "ok"
    _fill_ghost_queue(r, ns, 30)
    r.close()
    deadline = time.monotonic() + 20
    while True:  # the last counters land in the files just after the replies
        after = {name: _samples(port) for name, port in ports.items()}
        answered = sum(
            v
            for name in ("fleet-a", "fleet-b")
            for (metric, _), v in after[name].items()
            if metric == "toolfleet_tool_calls_total"
        )
        if answered >= len(calls) + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answered == len(calls) + 1

    # Then: promtool evaluates the dashboard's queries and the alerts over the scrapes.
    kube = {"namespace": "toolfleet", "toolfleet_queue_group": "general"}
    targets = {
        "fleet-a": {**kube, "job": "toolfleet-worker", "pod": "fleet-a", "instance": "a:9191"},
        "fleet-b": {**kube, "job": "toolfleet-worker", "pod": "fleet-b", "instance": "b:9191"},
        "exporter": {"namespace": "toolfleet", "job": "toolfleet-exporter", "pod": "exporter"},
    }
    targets["exporter"]["instance"] = "exporter:9192"
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    at = "55m"
    queues = '{queue=~"tools.fleet-test|tools.ghost"}'
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _series(targets, before, after),
                "promql_expr_test": [
                    {
                        "expr": f"({_dashboard_query('toolfleet_queue_workers')}) and on (queue)"
                        f" (count by (queue) (toolfleet_queue_workers{queues}))",
                        "eval_time": at,
                        "exp_samples": [
                            {"labels": '{queue="tools.fleet-test"}', "value": 3},
                            {"labels": '{queue="tools.ghost"}', "value": 0},
                        ],
                    },
                    {
                        "expr": _dashboard_query("toolfleet_worker_up"),
                        "eval_time": at,
                        "exp_samples": [{"labels": "{}", "value": 3}],
                    },
                    {
                        "expr": f"({_dashboard_query('toolfleet_dead_letters')}) > 0",
                        "eval_time": at,
                        "exp_samples": [{"labels": '{queue="tools.fleet-test"}', "value": 1}],
                    },
                    {
                        "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
                        "eval_time": at,
                        "exp_samples": [
                            {"labels": f'{{alertname="{rule["alert"]}"}}', "value": 1}
                            for group in yaml.safe_load(ALERTS.read_text())["groups"]
                            for rule in group["rules"]
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_dashboard_query_parses_with_grafanas_values(tmp_path: Path) -> None:
    """Each panel query, with the values Grafana puts in for its variables, is valid PromQL."""
    promtool = _promtool()
    for expr in _dashboard_exprs():
        rule = {"groups": [{"name": "q", "rules": [{"record": "q", "expr": expr}]}]}
        path = tmp_path / "q.yml"
        path.write_text(yaml.safe_dump(rule))
        checked = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
        )
        assert checked.returncode == 0, expr + "\n" + checked.stdout + checked.stderr


def test_exporter_probes_follow_redis(redis_url: str, namespace: str, tmp_path: Path) -> None:
    """/livez answers 200 while the exporter serves; /readyz 200 only while Redis answers."""
    up = Exporter(redis_url, namespace, tmp_path / "up.log")
    try:
        assert _get(up.port, "/livez") == (200, "exporter serving\n")
        assert _get(up.port, "/readyz") == (200, "Redis reachable\n")
    finally:
        assert up.stop() == 0
    down = Exporter(
        f"redis://127.0.0.1:{_free_port()}/0", namespace, tmp_path / "down.log", ready=False
    )
    try:
        assert _get(down.port, "/livez") == (200, "exporter serving\n")
        status, reason = _get(down.port, "/readyz")
        assert status == 503 and reason.startswith("Redis unreachable"), reason
        status, text = _get(down.port, "/metrics")
        assert status == 200 and "toolfleet_queue_depth" in text
    finally:
        assert down.stop() == 0
