"""OpenTelemetry: one call through a real fleet is one trace, producer to consumer; the
worker's JSON log lines of the call carry its trace id; without an SDK nothing changes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import tracing

QUEUE = "tools.traced"
SHOUT = "ext_traced_shout"


def _reset_global_tracer_provider() -> None:
    """Back to no SDK, as opentelemetry-test-utils' reset_trace_globals does: the API sets
    its global provider once per process, and later tests must not inherit one."""
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's tracer provider, recording into memory, for this module only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_tracer_provider()
    trace.set_tracer_provider(provider)
    yield exporter
    _reset_global_tracer_provider()
    provider.shutdown()


@pytest.fixture(scope="module")
def traced_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes with JSON logs whose SDK writes spans to a file."""
    tmp = tmp_path_factory.mktemp("tracing")
    fleet = start_fleet(
        redis_url,
        f"{namespace}-otel-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        extra=["--extension", "traced_tools:extension"],
        env={"TOOLFLEET_LOG_FORMAT": "json", "TOOLFLEET_TEST_SPANS_FILE": str(tmp / "spans")},
    )
    fleet.spans_file = tmp / "spans"  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


def _worker_spans(path: Path, call_id: str) -> list[dict[str, Any]]:
    """The worker's spans of ``call_id``, waiting until its CONSUMER span is written."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists():
            found = [
                span
                for line in path.read_text().splitlines()
                if line.strip()
                for span in [json.loads(line)]
                if span["attributes"].get("messaging.message.id") == call_id
            ]
            if found:
                return found
        time.sleep(0.1)
    raise AssertionError(f"no worker span of call {call_id} in {path}")


def _hex(value: str) -> str:
    return value.removeprefix("0x")


def test_one_call_is_one_trace_from_producer_to_consumer_and_its_logs(
    spans: InMemorySpanExporter, traced_fleet: Fleet
) -> None:
    """Inside a chat request's span, one call yields a PRODUCER span (create) and, in the
    worker process, a CONSUMER span (process) that is its child, both with the messaging
    attributes; every JSON log line of the call carries that trace id and an RFC 3339
    timestamp."""
    fleet = traced_fleet
    tracer = trace.get_tracer("test")
    with (
        ToolClient(fleet.redis_url, namespace=fleet.namespace) as client,
        tracer.start_as_current_span("chat request") as outer,
    ):
        result = client.call(SHOUT, {"text": "hi"}, timeout_s=20)
    assert result.status.value == "ok" and result.content == "HI"
    trace_id = f"{outer.get_span_context().trace_id:032x}"

    (producer,) = [
        s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.PRODUCER
        and (s.attributes or {}).get("messaging.message.id") == result.id
    ]  # fmt: skip
    assert f"{producer.context.trace_id:032x}" == trace_id
    assert (
        producer.parent is not None and producer.parent.span_id == outer.get_span_context().span_id
    )
    assert producer.name == f"create {QUEUE}"
    assert dict(producer.attributes or {}) == {
        "messaging.system": "dramatiq",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": result.id,
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "toolfleet.function": SHOUT,
    }

    (consumer,) = _worker_spans(fleet.spans_file, result.id)  # type: ignore[attr-defined]
    assert consumer["kind"] == "SpanKind.CONSUMER"
    assert consumer["name"] == f"process {QUEUE}"
    assert _hex(consumer["context"]["trace_id"]) == trace_id
    assert _hex(consumer["parent_id"]) == f"{producer.context.span_id:016x}"
    assert consumer["attributes"] == {
        "messaging.system": "dramatiq",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": result.id,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "toolfleet.function": SHOUT,
        "toolfleet.status": "ok",
    }
    assert consumer["status"]["status_code"] == "UNSET"

    lines = [json.loads(line) for line in fleet.log().splitlines() if line.startswith("{")]
    ours = [line for line in lines if line.get("call_id") == result.id]
    assert any(line["message"] == "shouting 2 characters" for line in ours), ours
    for line in ours:
        assert line["trace_id"] == trace_id
        assert line["span_id"] == _hex(consumer["context"]["span_id"])
    for line in lines:
        stamp = datetime.fromisoformat(line["timestamp"])
        assert line["timestamp"].endswith("Z") and stamp.utcoffset() is not None
        assert "ts" not in line


def test_a_crashed_call_marks_its_consumer_span_an_error(
    spans: InMemorySpanExporter, traced_fleet: Fleet
) -> None:
    """A call answered crashed (the tool raised) ends its CONSUMER span with status ERROR."""
    fleet = traced_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call("ext_fleet_test_boom", {}, timeout_s=20)
    assert result.status.value == "crashed"
    (consumer,) = _worker_spans(fleet.spans_file, result.id)  # type: ignore[attr-defined]
    assert consumer["attributes"]["toolfleet.status"] == "crashed"
    assert consumer["status"]["status_code"] == "ERROR"


_WITHOUT_SDK = r"""
import json, sys
from toolfleet.producer.publish import encode_message
from toolfleet.shared import tracing
from toolfleet.shared.wire import CallContext, ToolCallRequest
hand = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
request = ToolCallRequest(id="c1", function="f", arguments={}, reply_to="r", deadline=1e10,
                          timeout_s=1, context=CallContext(traceparent=hand))
with tracing.produce("q", request) as produced:
    same = produced is request
body = json.loads(encode_message("q", request)[1])
sent = json.loads(body["args"][0])["context"]
with tracing.consume(request, "q") as ids:
    pass
print(json.dumps({"same": same, "sent": sent["traceparent"], "ids": ids}))
"""


def test_without_an_sdk_the_request_is_untouched_and_logs_use_its_traceparent() -> None:
    """With the API but no SDK configured (a fresh process), the producer hands the request
    through as it is (no copy; a hand-set traceparent travels) and the worker's log fields
    come from that traceparent."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SDK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["same"] is True
    assert out["sent"] == "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert out["ids"] == {"trace_id": "ab" * 16, "span_id": "cd" * 8}


def test_log_ids_read_only_well_formed_traceparents() -> None:
    """trace_id/span_id come from a W3C traceparent; anything malformed gives none."""
    good = "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"
    assert tracing.log_ids(good) == {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
    }
    for bad in (None, "", "00-abc-def-01", "00-" + "g" * 32 + "-" + "0" * 16 + "-01"):
        assert tracing.log_ids(bad) == {}
