"""Metric labels: wire strings never become label values, and no collector breaks /metrics."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from conftest import (
    Fleet,
    delete_namespace,
    enqueue_raw,
    start_fleet,
    toolfleet_command,
)
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import catalog_key
from toolfleet.shared.wire import ReplyEnvelope
from toolfleet.worker.supervision.exposition import listen, serve_metrics

ECHO = "ext_fleet_test_echo"
#: The longest label value the tests accept in any exposition, characters.
LABEL_BOUND = 256
#: Function strings only a raw message can carry: a lone surrogate and 1 MB of text.
#: Function strings off the wire and how a worker answers each: a lone surrogate and a name
#: too long for a label (but within the request's bound) are unknown functions; 1 MB is over
#: the request's bound on ``function`` and is refused.
WIRE_FUNCTIONS = ["\ud800", "f" * 255, "f" * 1_048_576]
WIRE_STATUSES = ["unknown_function", "unknown_function", "rejected"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def _families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def label_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with /metrics on a free port."""
    tmp = tmp_path_factory.mktemp("labels")
    port = _free_port()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-labels-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        processes=1,
        threads=4,
        env={"TOOLFLEET_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(tmp / "m")},
    )
    fleet.metrics_port = port  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()
    delete_namespace(redis_url, fleet.namespace)


def _publish_raw(r: redis.Redis, ns: str, function: str, reply_to: str) -> None:
    """Enqueue a Dramatiq message by hand, as no producer would: ``function`` as given."""
    request = {
        "id": str(uuid.uuid4()), "function": function, "arguments": {"text": "x"},
        "reply_to": reply_to, "deadline": time.time() + 60, "timeout_s": 60.0,
    }  # fmt: skip
    enqueue_raw(r, ns, request)


def test_function_label_is_a_served_name_or_unknown() -> None:
    """A name the known set holds is its own label; anything else, even when the set holds
    it (a lone surrogate, over 64 characters, not a string, a trailing newline), is
    ``unknown``."""
    from toolfleet.shared.metric_labels import function_label

    known = {"ext_a_b", "\ud800", "x" * 65, "ext_a_b\n"}
    assert function_label("ext_a_b", known) == "ext_a_b"
    assert function_label("ext_a_c", known) == "unknown"
    assert function_label("\ud800", known) == "unknown"
    assert function_label("x" * 65, known) == "unknown"
    assert function_label("ext_a_b\n", known) == "unknown"
    assert function_label(42, known) == "unknown"
    assert function_label("f" * 1_048_576, known) == "unknown"


def test_wire_function_strings_count_under_unknown_and_metrics_stay_up(
    label_fleet: Fleet, r: redis.Redis
) -> None:
    """Raw messages whose function is a lone surrogate, 255 characters or 1 MB of text are
    answered (unknown_function, or rejected past the field's bound) and counted under
    function="unknown": /metrics answers 200, parses, holds no label value over 256
    characters and no raw string."""
    fleet = label_fleet
    port: int = fleet.metrics_port  # type: ignore[attr-defined]
    replies = [f"{fleet.namespace}:reply:labels-{i}" for i in range(len(WIRE_FUNCTIONS))]
    for function, reply_to in zip(WIRE_FUNCTIONS, replies, strict=True):
        _publish_raw(r, fleet.namespace, function, reply_to)
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        assert client.call(ECHO, {"text": "hi"}, timeout_s=30).ok
    for reply_to, expected in zip(replies, WIRE_STATUSES, strict=True):
        popped = r.blpop([reply_to], timeout=60)
        assert popped is not None, f"no reply on {reply_to}:\n{fleet.log()[-3000:]}"
        result = ReplyEnvelope.decode(popped[1]).result
        assert result is not None and result.status.value == expected
    deadline = time.monotonic() + 30
    counted: dict[tuple[str, str], float] = {}
    while time.monotonic() < deadline:
        status, text = _get(port)
        assert status == 200, text[:2000]
        families = _families(text)
        calls = families["toolfleet_tool_calls"].samples
        counted = {
            (s.labels["function"], s.labels["status"]): s.value
            for s in calls
            if s.name == "toolfleet_tool_calls_total"
        }
        if counted.get(("unknown", "unknown_function")) == 2 and (ECHO, "ok") in counted:
            break
        time.sleep(0.3)
    assert counted == {("unknown", "unknown_function"): 2.0, (ECHO, "ok"): 1.0}
    for family in families.values():
        for sample in family.samples:
            for name, value in sample.labels.items():
                assert len(value) <= LABEL_BOUND, (sample.name, name, len(value))
                assert value not in WIRE_FUNCTIONS, (sample.name, name)
                if name == "function":
                    assert value in (ECHO, "unknown"), (sample.name, value[:80])


def _write_old_samples(directory: Path) -> None:
    """Write multiprocess files as a worker without the label rule did: one counter series
    whose function label is a lone surrogate, one that is a served name."""
    script = (
        "from prometheus_client import Counter\n"
        "c = Counter('toolfleet_tool_calls', 'calls', ['function', 'extension', 'status'])\n"
        "c.labels('\\ud800', '', 'unknown_function').inc()\n"
        "c.labels('ext_fleet_test_echo', 'fleet-test', 'ok').inc(3)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)


class _Raising:
    """A collector that fails the way a collector reading odd data does."""

    def collect(self) -> Iterator[Metric]:
        yield from ()
        raise RuntimeError("odd data")


class _Working:
    """A collector with one gauge."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("toolfleet_test_working", "A working collector.", value=7)


@pytest.fixture
def supervisor_metrics(tmp_path: Path) -> Iterator[tuple[Any, int]]:
    """The supervisor's /metrics registry over a multiprocess folder holding samples an
    older worker wrote, served on a free port; the server is shut down afterwards."""
    directory = tmp_path / "multiproc"
    directory.mkdir()
    _write_old_samples(directory)
    registry = serve_metrics(0, directory)
    assert registry is not None
    port = _free_port()
    server = listen(port, make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield registry, port
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_old_multiprocess_files_with_a_bad_label_do_not_break_metrics(
    supervisor_metrics: tuple[Any, int],
) -> None:
    """A multiprocess file holding a lone-surrogate label (written before the label rule):
    /metrics answers 200, serves the good series, drops the bad one and counts it."""
    _, port = supervisor_metrics
    status, text = _get(port)
    assert status == 200, text[:2000]
    families = _families(text)
    calls = [s for s in families["toolfleet_tool_calls"].samples if s.name.endswith("_total")]
    assert [(s.labels["function"], s.value) for s in calls] == [("ext_fleet_test_echo", 3.0)]
    errors = families["toolfleet_collector_errors"].samples
    assert any(
        s.labels == {"collector": "MultiProcessCollector", "kind": "sample_dropped"}
        and s.value >= 1
        for s in errors
    ), errors


def test_a_raising_collector_leaves_the_rest_of_metrics_served(
    supervisor_metrics: tuple[Any, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A collector that raises at every scrape: /metrics answers 200 with the other
    collectors' families, counts each failure and logs it once."""
    registry, port = supervisor_metrics
    registry.register(_Raising())
    registry.register(_Working())
    caplog.set_level(logging.WARNING, logger="toolfleet.worker.metrics")
    for _ in range(3):
        status, text = _get(port)
        assert status == 200, text[:2000]
    families = _families(text)
    assert families["toolfleet_test_working"].samples[0].value == 7
    assert "toolfleet_tool_calls" in families
    errors = {
        (s.labels["collector"], s.labels["kind"]): s.value
        for s in families["toolfleet_collector_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors[("_Raising", "raised")] == 3
    logged = [rec for rec in caplog.records if "_Raising" in rec.getMessage()]
    assert len(logged) == 1, [rec.getMessage() for rec in logged]


def test_exporter_serves_metrics_when_the_catalog_holds_odd_data(
    redis_url: str, namespace: str, r: redis.Redis, tmp_path: Path
) -> None:
    """A catalog entry that is JSON but not an object is skipped, as every catalog reader
    skips it: the exporter's /metrics answers 200 with its queue gauges and counts no
    collector failure (a collector that raises is counted: see the test above)."""
    ns = f"{namespace}-odd-{uuid.uuid4().hex[:6]}"
    r.hset(catalog_key(ns), "ext_odd_entry", b"[1, 2, 3]")
    port = _free_port()
    env = {**os.environ, "TOOLFLEET_REDIS_URL": redis_url, "TOOLFLEET_NAMESPACE": ns}
    log = (tmp_path / "exporter.log").open("wb")
    argv = [toolfleet_command(), "exporter", "--port", str(port)]
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                if _get(port, "/livez")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "exporter never served"
            time.sleep(0.1)
        for _ in range(2):
            status, text = _get(port)
            assert status == 200, text[:2000]
        families = _families(text)
        assert "toolfleet_queue_workers" in families
        errors = (
            families["toolfleet_collector_errors"].samples
            if "toolfleet_collector_errors" in families
            else []
        )
        assert not any(s.labels.get("collector") == "QueueCollector" and s.value for s in errors)
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        delete_namespace(redis_url, ns)
