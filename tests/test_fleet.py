"""End to end through real worker processes started with ``toolfleet worker``."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from conftest import LATE_S, Fleet
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import ToolCallRequest, ToolCallResult
from toolfleet.shared.errors import CrashedError, ExtensionToolError
from toolfleet.shared.wire import ReplyEnvelope, Status, new_call_id

F = "ext_fleet_test_"


def test_ok_result_round_trips_exact_big_integers(client: ToolClient) -> None:
    """An integer beyond 64 bits travels both ways as an exact JSON number."""
    big = 2**200 + 12345
    result = client.call(F + "add", {"a": big, "b": 1})
    assert result.status is Status.OK
    assert result.content == big + 1


def test_tool_call_id_and_context_ride_along(client: ToolClient) -> None:
    """The model's tool_call_id comes back untouched and the context reaches the tool."""
    result = client.call(
        F + "echo", {"text": "ab", "times": 2}, tool_call_id="call_0", context={"account": "acme"}
    )
    assert result.tool_call_id == "call_0"
    assert result.content == {"text": "abab", "account": "acme"}
    assert result.worker and ":" in result.worker


@pytest.mark.parametrize(
    "arguments",
    ['{"path": "', {}, {"path": "MARK", "verbose": True}, "[]", {"path": ["MARK"]}],
    ids=["truncated-json", "missing", "unexpected", "not-an-object", "wrong-type"],
)
def test_arguments_the_policy_refuses_are_invalid_arguments_and_never_run(
    client: ToolClient, tmp_path: Path, arguments: object
) -> None:
    """The worker answers arguments that do not parse or validate invalid_arguments and
    does not run the tool (the policy's cases and messages: test_arguments.py)."""
    mark = tmp_path / "ran"
    if isinstance(arguments, dict):
        arguments = {k: (str(mark) if v == "MARK" else v) for k, v in arguments.items()}
    result = client.call(F + "mark", arguments)
    assert result.status is Status.INVALID_ARGUMENTS and result.error, result
    assert result.worker is not None and not mark.exists()


def test_arguments_double_encoded_by_the_model_run(client: ToolClient, tmp_path: Path) -> None:
    """Arguments sent as a JSON string holding the JSON object run the tool."""
    mark = tmp_path / "ran"
    result = client.call(F + "mark", json.dumps(json.dumps({"path": str(mark)})))
    assert result.status is Status.OK and mark.exists()


def test_unknown_function(client: ToolClient) -> None:
    """A name absent from the catalog is unknown_function at once."""
    started = time.monotonic()
    result = client.call("ext_nope_nothing", {})
    assert result.status is Status.UNKNOWN_FUNCTION
    assert time.monotonic() - started < LATE_S  # the default 30 s deadline never came into it


def test_extension_tool_error_reaches_the_model(client: ToolClient) -> None:
    """ExtensionToolError becomes tool_error with exactly its message."""
    result = client.call(F + "fail", {"reason": "city not found"})
    assert result.status is Status.TOOL_ERROR
    assert result.content == {"error": "city not found"}
    try:
        result.raise_for_status()
    except ExtensionToolError as exc:
        assert exc.result is result
    else:
        raise AssertionError("raise_for_status did not raise")


def test_other_exception_is_crashed_with_traceback_only_in_log(
    client: ToolClient, fleet: Fleet
) -> None:
    """Any other exception is crashed: a generic message for the model, the traceback in the log."""
    result = client.call(F + "boom", {})
    assert result.status is Status.CRASHED
    assert "0xDEADBEEF" not in str(result.content)
    assert "Traceback" not in str(result.content)
    deadline = time.monotonic() + 5
    while "0xDEADBEEF" not in fleet.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = fleet.log()
    assert "0xDEADBEEF" in log and "Traceback" in log and result.id in log
    try:
        result.raise_for_status()
    except CrashedError:
        pass
    else:
        raise AssertionError("raise_for_status did not raise")


def test_async_tool_past_its_limit_times_out_on_time(client: ToolClient) -> None:
    """An async tool sleeping 30 s past its 1 s limit is answered timeout by the limit
    (plus ``LATE_S``)."""
    started = time.monotonic()
    result = client.call(F + "async_sleep", {"seconds": 30}, timeout_s=20)
    elapsed = time.monotonic() - started
    assert result.status is Status.TIMEOUT
    assert elapsed < 1.0 + LATE_S, elapsed


def test_sync_tool_past_its_limit_times_out_on_time(client: ToolClient) -> None:
    """A thread tool blocked in time.sleep for 30 s is answered timeout at its 1 s limit
    (plus ``LATE_S``)."""
    started = time.monotonic()
    result = client.call(F + "sleep", {"seconds": 30}, timeout_s=20)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started < 1.0 + LATE_S


def test_caller_deadline_shorter_than_tool_limit(client: ToolClient) -> None:
    """The caller's deadline wins over a longer tool limit: timeout by the deadline (plus
    ``LATE_S``)."""
    started = time.monotonic()
    result = client.call(F + "async_sleep", {"seconds": 30}, timeout_s=0.4)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started < 0.4 + LATE_S


def test_deadline_passed_while_queued_is_expired_and_not_run(fleet: Fleet, tmp_path: Path) -> None:
    """A request whose deadline passed before a worker took it is answered expired, not run."""
    client = redis.Redis.from_url(fleet.redis_url)
    reply_to = f"{fleet.namespace}:reply:test-{new_call_id()}"
    marker = tmp_path / "ran"
    request = ToolCallRequest(
        id=new_call_id(),
        function=F + "mark",
        arguments={"path": str(marker)},
        reply_to=reply_to,
        deadline=time.time() - 0.5,
        timeout_s=1.0,
    )
    Publisher(client, fleet.namespace).publish("tools.fleet-test", request)
    item = client.blpop([reply_to], timeout=10)
    assert item is not None
    result = ReplyEnvelope.decode(item[1]).result
    assert isinstance(result, ToolCallResult)
    assert result.status is Status.EXPIRED and result.id == request.id
    assert not marker.exists()
    client.close()


def test_thousand_calls_on_one_reply_connection(client: ToolClient, fleet: Fleet) -> None:
    """1,000 calls submitted at once all resolve correctly, on one reply connection."""
    futures = [client.submit(F + "add", {"a": i, "b": 10**20}) for i in range(1000)]
    reply_connections = [
        c
        for c in redis.Redis.from_url(fleet.redis_url).client_list()
        if c.get("name") == f"toolfleet-reply-{client.client_id}"
    ]
    results = [f.result(timeout=60) for f in futures]
    assert [r.status for r in results] == [Status.OK] * 1000
    assert [r.content for r in results] == [i + 10**20 for i in range(1000)]
    assert len({r.id for r in results}) == 1000
    assert len(reply_connections) == 1


def test_killed_worker_process_is_restarted(fleet: Fleet, client: ToolClient) -> None:
    """A worker process killed with SIGKILL is replaced and the fleet keeps answering."""
    before = fleet.worker_pids()
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    for i in range(20):  # the other process keeps serving meanwhile
        assert client.call(F + "add", {"a": i, "b": 1}, timeout_s=10).content == i + 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = fleet.worker_pids()
        if len(now) == 2 and before[0] not in now:
            break
        time.sleep(0.1)
    after = fleet.worker_pids()
    assert len(after) == 2 and before[0] not in after and before[1] in after
    assert fleet.process.poll() is None
    assert client.call(F + "add", {"a": 1, "b": 1}).content == 2
