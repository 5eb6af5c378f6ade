"""Reading a model turn's tool calls and writing the answers, in each API's format (no Redis)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message, ToolResultBlockParam
from openai.types.chat import ChatCompletion, ChatCompletionToolMessageParam
from openai.types.responses import Response
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from toolfleet.producer.turns import parse_tool_calls, result_message
from toolfleet.shared import ClientError, Status, ToolCallResult

FIXTURES = Path(__file__).parent / "fixtures"


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def _result(status: Status = Status.OK, content: Any = 1) -> ToolCallResult:
    return ToolCallResult(id="r", function="f", status=status, content=content)


@pytest.mark.parametrize(
    ("source", "family", "count"),
    [
        (lambda: _fixture("openai_chat_completion.json"), "openai-chat", 6),
        (
            lambda: _fixture("openai_chat_completion.json")["choices"][0]["message"],
            "openai-chat",
            6,
        ),
        (
            lambda: _fixture("openai_chat_completion.json")["choices"][0]["message"]["tool_calls"],
            "openai-chat",
            6,
        ),
        (
            lambda: ChatCompletion.model_validate(_fixture("openai_chat_completion.json")),
            "openai-chat",
            6,
        ),
        (
            lambda: (
                ChatCompletion.model_validate(_fixture("openai_chat_completion.json"))
                .choices[0]
                .message.tool_calls
            ),
            "openai-chat",
            6,
        ),
        (lambda: _fixture("openai_responses_response.json"), "openai-responses", 5),
        (lambda: _fixture("openai_responses_response.json")["output"], "openai-responses", 5),
        (
            lambda: Response.model_validate(_fixture("openai_responses_response.json")),
            "openai-responses",
            5,
        ),
        (lambda: _fixture("anthropic_message.json"), "anthropic", 6),
        (lambda: _fixture("anthropic_message.json")["content"], "anthropic", 6),
        (lambda: Message.model_validate(_fixture("anthropic_message.json")), "anthropic", 6),
        (
            lambda: Message.model_validate(_fixture("anthropic_message.json")).content,
            "anthropic",
            6,
        ),
    ],
)
def test_every_shape_of_each_family_is_read(source: Any, family: str, count: int) -> None:
    """Completions, messages, call lists and SDK objects of each family yield the same calls."""
    turn = parse_tool_calls(source())
    assert turn.family == family
    assert len(turn.calls) == count
    assert [c.index for c in turn.calls] == list(range(count))
    assert all(c.tool_call_id and c.function and not c.problem for c in turn.calls)


def test_non_call_items_are_skipped_and_arguments_kept_raw() -> None:
    """Reasoning items and text blocks are skipped; raw JSON strings travel untouched."""
    responses = parse_tool_calls(_fixture("openai_responses_response.json"))
    assert responses.calls[0].tool_call_id == "call_2Jf8KqLm0PwX6TnR3YsVb9Hc"
    assert responses.calls[2].arguments == '{"a":48,"b":}'
    anthropic = parse_tool_calls(_fixture("anthropic_message.json"))
    assert anthropic.calls[0].arguments == {"n": 40}


def test_a_message_without_tool_calls_is_an_empty_turn() -> None:
    """An assistant message with only text, or an empty list, has no calls."""
    assert parse_tool_calls({"role": "assistant", "content": "Hello"}).calls == ()
    assert parse_tool_calls({"role": "assistant", "content": None, "tool_calls": None}).calls == ()
    assert parse_tool_calls([]).calls == ()
    assert parse_tool_calls([{"type": "text", "text": "hi"}]).calls == ()


@pytest.mark.parametrize(
    "bad",
    [
        "call the tools",
        42,
        None,
        [{"name": "f", "arguments": "{}"}],
        [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ],
        {"choices": []},
    ],
)
def test_unreadable_input_is_a_client_error(bad: Any) -> None:
    """Input of no known format, or of two formats mixed, raises ClientError."""
    with pytest.raises(ClientError):
        parse_tool_calls(bad)


def test_malformed_calls_are_kept_with_the_reason() -> None:
    """A call with no name, no id, or a custom tool keeps its place and says why."""
    turn = parse_tool_calls(
        [
            {"id": "call_a", "type": "function", "function": {"arguments": "{}"}},
            {"type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_c", "type": "custom", "custom": {"name": "g", "input": "x"}},
            {"id": "call_d", "type": "function", "function": {"name": "f", "arguments": [1, 2]}},
        ]
    )
    assert [c.index for c in turn.calls] == [0, 1, 2, 3]
    assert "names no function" in turn.calls[0].problem
    assert "no id" in turn.calls[1].problem and turn.calls[1].tool_call_id == ""
    assert "custom" in turn.calls[2].problem
    assert turn.calls[3].problem == "" and turn.calls[3].arguments == "[1,2]"


def test_result_messages_load_with_the_sdk_types() -> None:
    """Each family's answer is valid for the openai / anthropic packages' parameter types."""
    chat = parse_tool_calls(_fixture("openai_chat_completion.json"))
    message = result_message(chat.family, chat.calls[0], _result(content=10**30))
    TypeAdapter(ChatCompletionToolMessageParam).validate_python(message)
    assert message == {
        "role": "tool",
        "tool_call_id": "call_8sHq2FmXwYd1KbT4oJcVn3Zp",
        "content": "1000000000000000000000000000000",
    }
    responses = parse_tool_calls(_fixture("openai_responses_response.json"))
    output = result_message(responses.family, responses.calls[1], _result(content={"x": "é"}))
    TypeAdapter(FunctionCallOutput).validate_python(output)
    assert output == {
        "type": "function_call_output",
        "call_id": "call_7WcN1RpQ5ZkY0MtH4LxJa8Ge",
        "output": '{"x":"é"}',
    }
    anthropic = parse_tool_calls(_fixture("anthropic_message.json"))
    error = _result(Status.TIMEOUT, {"error": "no reply within 2 s"})
    block = result_message(anthropic.family, anthropic.calls[4], error)
    TypeAdapter(ToolResultBlockParam).validate_python(block)
    assert block["is_error"] is True and json.loads(block["content"])["error"]


def test_a_repeated_id_marks_the_later_calls_of_every_family() -> None:
    """Each family's later call repeating an id points at the first; distinct ids and calls
    without an id (answered as malformed) are not duplicates."""
    chat = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in ("a", "b", "a", "", "")
    ]
    responses = [
        {"type": "function_call", "call_id": i, "name": "f", "arguments": "{}"}
        for i in ("a", "a", "b")
    ]
    anthropic = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ("x", "x", "x")]
    for source, expected in (
        (chat, [None, None, 0, None, None]),
        (responses, [None, 0, None]),
        (anthropic, [None, 0, 0]),
    ):
        assert [c.duplicate_of for c in parse_tool_calls(source).calls] == expected
