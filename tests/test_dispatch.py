"""Whole-turn dispatch of recorded OpenAI and Anthropic messages through a real fleet, by each
client (every test runs with ``ToolClient`` and with ``AsyncToolClient``)."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message, MessageParam, ToolResultBlockParam
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import Response, ResponseInputParam
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from conftest import LATE_S, Either, Fleet, start_fleet
from toolfleet.producer import CallEvent
from toolfleet.shared import ClientError, Status
from toolfleet.shared.settings import Settings

FIXTURES = Path(__file__).parent / "fixtures"
F = "ext_fleet_test_"
#: A turn's deadline, seconds: its slow call is answered timeout then, and its quick calls
#: must have run by then even on a loaded 2-core machine (queued behind other test files).
TURN_TIMEOUT_S = 3.0


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def _contents(messages: list[dict[str, Any]], key: str = "content") -> list[Any]:
    return [json.loads(m[key]) for m in messages]


def _timed_dispatch(client: Either, source: Any, **kwargs: Any) -> tuple[list[Any], float]:
    started = time.monotonic()
    messages = client.dispatch(source, timeout_s=TURN_TIMEOUT_S, **kwargs)
    return messages, time.monotonic() - started


def _check_chat(completion: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assistant = completion["choices"][0]["message"]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert [m["tool_call_id"] for m in messages] == ids  # one each, in order
    adapter = TypeAdapter(ChatCompletionToolMessageParam)
    for message in messages:
        adapter.validate_python(message)
        assert set(message) == {"role", "tool_call_id", "content"} and message["role"] == "tool"
    content = _contents(messages)
    assert content[0] == math.factorial(25)
    assert content[1] == 21
    assert "line 1" in content[2]["error"]  # truncated JSON: where parsing stopped
    assert content[3] == {"error": "unknown function 'get_current_weather'"}
    assert content[4]["error"].startswith("no reply within")
    assert content[5] == 6
    conversation = [{"role": "user", "content": "Work these out."}, assistant, *messages]
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(conversation)


@pytest.mark.parametrize("shape", ["completion", "sdk-message", "sdk-tool-calls"])
def test_chat_completions_turn_round_trips(either: Either, shape: str) -> None:
    """A recorded Chat Completions turn (dict or openai objects) gets one tool message per
    call, in order, the slow call a timeout at the turn's deadline."""
    completion = _fixture("openai_chat_completion.json")
    message = ChatCompletion.model_validate(completion).choices[0].message
    source = {
        "completion": completion,
        "sdk-message": message,
        "sdk-tool-calls": message.tool_calls,
    }[shape]
    messages, elapsed = _timed_dispatch(either, source)
    _check_chat(completion, messages)
    assert TURN_TIMEOUT_S <= elapsed < TURN_TIMEOUT_S + LATE_S  # the slow call sleeps 20 s


@pytest.mark.parametrize("sdk", [False, True])
def test_responses_turn_round_trips(either: Either, sdk: bool) -> None:
    """A recorded Responses turn gets one function_call_output per function_call, in order."""
    response = _fixture("openai_responses_response.json")
    source = Response.model_validate(response) if sdk else response
    outputs = either.dispatch(source, timeout_s=TURN_TIMEOUT_S)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
    for output in outputs:
        TypeAdapter(FunctionCallOutput).validate_python(output)
        assert set(output) == {"type", "call_id", "output"}
    content = _contents(outputs, "output")
    assert content[0] == math.factorial(30)
    assert content[1] == 12.0
    assert "line 1" in content[2]["error"]
    assert content[3] == {"error": "unknown function 'search_flights'"}
    assert content[4]["error"].startswith("no reply within")
    TypeAdapter(ResponseInputParam).validate_python([*calls, *outputs])  # the next input


@pytest.mark.parametrize("sdk", [False, True])
def test_anthropic_turn_round_trips(either: Either, sdk: bool) -> None:
    """A recorded Anthropic turn gets one tool_result block per tool_use, in order, with
    is_error set for every status but ok."""
    message = _fixture("anthropic_message.json")
    source = Message.model_validate(message) if sdk else message
    blocks, elapsed = _timed_dispatch(either, source)
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in blocks] == [u["id"] for u in uses]
    for block in blocks:
        TypeAdapter(ToolResultBlockParam).validate_python(block)
        assert set(block) == {"type", "tool_use_id", "content", "is_error"}
    assert [b["is_error"] for b in blocks] == [False, False, True, True, True, False]
    content = _contents(blocks)
    assert content[0] == math.factorial(40)
    assert content[1] == pytest.approx(math.pi * 9)
    assert "n" in content[2]["error"]
    assert content[3] == {"error": "unknown function 'get_stock_price'"}
    assert content[4]["error"].startswith("no reply within")
    assert content[5] == 6
    assert TURN_TIMEOUT_S <= elapsed < TURN_TIMEOUT_S + LATE_S  # the slow call sleeps 20 s
    conversation = [message, {"role": "user", "content": blocks}]
    TypeAdapter(list[MessageParam]).validate_python(conversation)


def test_statuses_of_a_turn(either: Either) -> None:
    """The result events of a turn carry each call's status, one per call."""
    events: list[CallEvent] = []
    either.dispatch(
        _fixture("anthropic_message.json"), timeout_s=TURN_TIMEOUT_S, on_event=events.append
    )
    results = sorted((e for e in events if e.kind == "result"), key=lambda e: e.index)
    assert [e.status for e in results] == [
        Status.OK,
        Status.OK,
        Status.INVALID_ARGUMENTS,
        Status.UNKNOWN_FUNCTION,
        Status.TIMEOUT,
        Status.OK,
    ]


def _calls(*pairs: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in pairs
    ]


def test_a_repeated_tool_call_id_is_rejected_and_never_answered_twice(
    either: Either, tmp_path: Path
) -> None:
    """Inside one turn the first call with an id runs; a later call repeating it is answered
    rejected ("duplicate tool_call id") in its result event, unpublished, and the messages
    hold one answer per id (what the next model request accepts). Calls to one function
    under distinct ids all run."""
    turn = _calls(
        ("call_0", F + "add", {"a": 1, "b": 2}),
        ("call_0", F + "mark", {"path": str(tmp_path / "ran")}),
        ("call_1", F + "add", {"a": 5, "b": 6}),
        ("call_2", F + "add", {"a": 7, "b": 8}),
        ("call_1", F + "echo", {"text": "x"}),
    )
    events, messages = either.stream(turn, timeout_s=5)
    assert [m["tool_call_id"] for m in messages] == ["call_0", "call_1", "call_2"]
    assert _contents(messages) == [3, 11, 15]
    results = {e.index: e for e in events if e.kind == "result"}
    for index, first in ((1, 0), (4, 2)):
        refused = results[index]
        assert refused.result is not None and refused.result.status is Status.REJECTED
        assert "duplicate tool_call id" in refused.result.content["error"]
        assert f"call {first} of the turn" in refused.result.content["error"]
        assert refused.message is None
        assert [e.kind for e in events if e.index == index] == ["result"]  # never queued
    assert sum(1 for e in events if e.kind == "queued") == 3
    assert not (tmp_path / "ran").exists()  # the duplicate never ran
    again = either.dispatch(turn, timeout_s=5)
    assert [m["tool_call_id"] for m in again] == ["call_0", "call_1", "call_2"]
    assert _contents(again) == [3, 11, 15] and not (tmp_path / "ran").exists()


def test_malformed_and_misused_turns(either: Either) -> None:
    """A malformed call is answered rejected in its place; input of no known format raises
    ClientError and publishes nothing."""
    turn = [
        {"id": "call_a", "type": "function", "function": {"arguments": "{}"}},
        *_calls(("call_b", F + "add", {"a": 1, "b": 1})),
    ]
    messages = either.dispatch(turn, timeout_s=5)
    assert "names no function" in json.loads(messages[0]["content"])["error"]
    assert json.loads(messages[1]["content"]) == 2
    assert either.dispatch([], timeout_s=5) == []
    for bad in ("call it", 7, [{"name": "x"}]):
        with pytest.raises(ClientError):
            either.dispatch(bad)
    with pytest.raises(ClientError):
        either.dispatch(turn, timeout_s=0)
    with pytest.raises(ClientError):
        either.dispatch(turn, context={"nope": 1})


def test_context_reaches_every_call(either: Either) -> None:
    """The turn's context is handed to each call's tool."""
    turn = _calls(("c1", F + "echo", {"text": "a"}), ("c2", F + "echo", {"text": "b"}))
    messages = either.dispatch(turn, context={"account": "acme"}, timeout_s=5)
    assert _contents(messages) == [
        {"text": "a", "account": "acme"},
        {"text": "b", "account": "acme"},
    ]


#: The worker TTL of the partial fleet's namespace, seconds.
PARTIAL_TTL_S = 600.0


@pytest.fixture(scope="module")
def partial_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """A namespace whose catalog lists the bfcl tools, served by no live worker: a full fleet
    ran and was stopped, then one serving only tools.fleet-test started. A name leaves the
    catalog one worker TTL after its last worker's heartbeat, so this fleet and the test's
    clients take a TTL longer than the module runs (PARTIAL_TTL_S)."""
    ns = f"{namespace}-partial-{uuid.uuid4().hex[:6]}"
    logs = tmp_path_factory.mktemp("partial")
    env = {"TOOLFLEET_WORKER_TTL_S": str(PARTIAL_TTL_S)}
    start_fleet(redis_url, ns, logs / "full.log", processes=1, env=env).stop()
    fleet = start_fleet(
        redis_url, ns, logs / "partial.log", processes=1, extra=["-Q", "tools.fleet-test"],
        env=env,
    )  # fmt: skip
    yield fleet
    fleet.stop()


def test_a_call_without_a_live_worker_fails_fast_in_a_turn(
    partial_fleet: Fleet, make: Callable[..., Either]
) -> None:
    """A turn's call whose queue no worker serves is answered not_available at once, before
    the turn's 0.4 s call, while the other calls run normally (streamed, and handed to a
    callback)."""
    turn = _calls(
        ("call_0", F + "async_sleep", {"seconds": 0.4}),
        ("call_1", "ext_bfcl_math_factorial", {"n": 10}),
        ("call_2", F + "add", {"a": 2, "b": 3}),
    )
    client = make(partial_fleet.redis_url, namespace=partial_fleet.namespace,
                  settings=Settings(worker_ttl_s=PARTIAL_TTL_S))  # fmt: skip
    started = time.time()
    events, messages = client.stream(turn, timeout_s=5)
    refused = [e for e in events if e.index == 1]
    assert [e.kind for e in refused] == ["result"]  # never queued
    assert refused[0].status is Status.NOT_AVAILABLE
    sleeper = next(e for e in events if e.index == 0 and e.kind == "result")
    assert refused[0].received_at < sleeper.received_at  # not behind the turn's other calls
    assert "no live worker" in json.loads(messages[1]["content"])["error"]
    assert _contents(messages)[0::2] == [0.4, 5]
    last = max(e.received_at for e in events)
    assert last - started >= 0.4  # the others ran normally

    seen: list[tuple[float, CallEvent]] = []
    started = time.time()
    messages = client.dispatch(turn, timeout_s=5, on_event=lambda e: seen.append((time.time(), e)))
    refused_at = next(t for t, e in seen if e.index == 1 and e.kind == "result")
    assert refused_at < next(t for t, e in seen if e.index == 0 and e.kind == "result")
    assert _contents(messages)[0::2] == [0.4, 5]
