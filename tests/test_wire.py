"""Wire models, statuses and the error tree."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from toolfleet.shared import Status, ToolCallRequest, ToolCallResult, errors
from toolfleet.shared.wire import CallContext, ReplyEnvelope, new_call_id


def _request(**kw: object) -> ToolCallRequest:
    base = dict(
        id=new_call_id(),
        function="ext_x_y",
        reply_to="ns:reply:c",
        deadline=time.time() + 5,
        timeout_s=5.0,
    )
    return ToolCallRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_request_round_trip_keeps_raw_argument_string() -> None:
    """A raw argument string travels untouched for the worker to parse."""
    req = _request(arguments='{"a": 1', tool_call_id="call_0")
    back = ToolCallRequest.decode(req.encode())
    assert back.arguments == '{"a": 1' and back.tool_call_id == "call_0" and back.id == req.id


def test_call_ids_are_unique_uuids() -> None:
    """Request ids are fresh UUIDs, never the model's tool_call_id."""
    ids = {new_call_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 36 for i in ids)


def test_every_non_ok_status_maps_to_exactly_one_error_class() -> None:
    """Each wire status but ok has its own ToolCallError subclass."""
    non_ok = [s.value for s in Status if s is not Status.OK]
    assert sorted(errors.ERROR_FOR_STATUS) == sorted(non_ok)
    assert len(set(errors.ERROR_FOR_STATUS.values())) == len(non_ok)
    for status, cls in errors.ERROR_FOR_STATUS.items():
        assert issubclass(cls, errors.ToolCallError)
        assert cls.status is status and type(status) is Status


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_raise_for_status_raises_the_mapped_class(status: Status) -> None:
    """raise_for_status raises the class of the result's status, carrying the result."""
    result = ToolCallResult(id="1", function="f", status=status, content={"error": "why"})
    with pytest.raises(errors.ERROR_FOR_STATUS[status.value]) as info:
        result.raise_for_status()
    assert info.value.result is result and str(info.value) == "why"


def test_raise_for_status_returns_ok_result() -> None:
    """An ok result is returned unchanged."""
    result = ToolCallResult(id="1", function="f", status="ok", content=[1])
    assert result.raise_for_status() is result and result.error is None


def test_envelope_round_trip() -> None:
    """Reply-list entries are typed envelopes."""
    result = ToolCallResult(id="1", function="f", status="timeout", content={"error": "late"})
    env = ReplyEnvelope.decode(ReplyEnvelope(type="result", result=result).encode())
    assert env.type == "result" and env.result == result


def test_call_ids_are_canonical_version_4_uuids() -> None:
    """A request id reads back as a random (version 4, RFC 4122 variant) UUID written as
    ``str(uuid.UUID(...))`` writes it: other clients cancel and look calls up by it."""
    for _ in range(2000):
        call_id = new_call_id()
        parsed = uuid.UUID(call_id)
        assert str(parsed) == call_id
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


class _Name(str):
    """A ``str`` subclass (validation turns it into a plain ``str``)."""


def _fields(**kw: Any) -> dict[str, Any]:
    now = 1_800_000_000.5
    base: dict[str, Any] = {
        "id": "6f1c1a9e-8b3e-4c1e-9a51-3f0b7f1c2d3e",
        "function": "ext_x_y",
        "arguments": {"a": [1, {"b": 2**70}], "s": "\ud800"},
        "reply_to": "ns:reply:c",
        "deadline": now + 5,
        "timeout_s": 5.0,
        "sent_at": now,
        "tool_call_id": "call_0",
        "events": False,
        "max_result_bytes": None,
        "schema_hash": None,
    }
    return {**base, **kw}


MADE_CASES: list[dict[str, Any]] = [
    {},
    {"arguments": None, "tool_call_id": None},
    {"arguments": '{"raw": 1'},
    {"arguments": {}},
    {"max_result_bytes": 64, "schema_hash": "h" * 256, "events": True},
    {"function": _Name("ext_x_y")},  # a subclass: validated
    {"deadline": 1_800_000_005},  # an int: validated into a float
    {"arguments": {_Name("a"): 1}},  # a key that is a subclass: validated
    {"events": "yes"},  # validated into True
]


@pytest.mark.parametrize("kw", MADE_CASES)
def test_made_requests_are_what_validation_makes(kw: dict[str, Any]) -> None:
    """ToolCallRequest.made (how the producer builds each call) gives the request the
    constructor gives, field for field and byte for byte on the wire, with the caller's
    arguments copied, whether its values take the unvalidated way or not."""
    fields = _fields(**kw)
    validated = ToolCallRequest(context=CallContext(), **fields)
    made = ToolCallRequest.made(context=CallContext(), context_checked=True, **fields)
    assert type(made) is ToolCallRequest
    assert list(made.__dict__.items()) == list(validated.__dict__.items())
    assert [type(v) for v in made.__dict__.values()] == [
        type(v) for v in validated.__dict__.values()
    ]
    assert made.model_fields_set == validated.model_fields_set
    assert made.__pydantic_private__ == validated.__pydantic_private__
    if isinstance(fields["arguments"], dict):
        assert made.arguments is not fields["arguments"]
    assert made.arguments_size() == validated.arguments_size()
    assert made.encode() == validated.encode()
    assert ToolCallRequest.decode(made.encode()) == ToolCallRequest.decode(validated.encode())


REFUSED_CASES: list[dict[str, Any]] = [
    {"function": "f" * 257},
    {"tool_call_id": "c" * 257},
    {"id": "i" * 129},
    {"reply_to": "r" * 1025},
    {"deadline": float("inf")},
    {"timeout_s": float("nan")},
    {"max_result_bytes": 63},
    {"arguments": {1: "a"}},
    {"arguments": [1, 2]},
    {"events": "maybe"},
]


@pytest.mark.parametrize("kw", REFUSED_CASES)
def test_made_refuses_what_validation_refuses_with_the_same_errors(kw: dict[str, Any]) -> None:
    """A value over its bound or of the wrong type raises the ValidationError the
    constructor raises (the same fields and messages)."""
    fields = _fields(**kw)
    with pytest.raises(ValidationError) as validated:
        ToolCallRequest(context=CallContext(), **fields)
    with pytest.raises(ValidationError) as made:
        ToolCallRequest.made(context=CallContext(), context_checked=True, **fields)
    assert made.value.errors() == validated.value.errors()


def test_made_validates_a_context_it_is_not_told_was_checked() -> None:
    """A CallContext changed after it was built (no validation on assignment) is
    validated again unless the caller says it made it itself."""
    context = CallContext.model_construct(user="u" * 300)
    with pytest.raises(ValidationError, match="context.user"):
        ToolCallRequest.made(context=context, **_fields())


def test_encoding_a_request_with_metadata_and_a_trace_context() -> None:
    """The request's encoding holds every field set (context and its metadata included)
    and none left at None, whatever way the request was made."""
    context = CallContext(account="acme", traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
                          metadata={"k": [1, 2**70]})  # fmt: skip
    made = ToolCallRequest.made(context=context, context_checked=True, **_fields())
    made.arguments_size()
    decoded = json.loads(made.encode())
    assert decoded["context"] == {
        "account": "acme",
        "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
        "metadata": {"k": [1, 2**70]},
    }
    assert decoded["arguments"] == {"a": [1, {"b": 2**70}], "s": "\ud800"}
    assert "schema_hash" not in decoded and "identity" not in decoded


def test_the_default_context_is_what_validation_makes() -> None:
    """CallContext.default() (a call without context) is CallContext(): the same fields,
    none set, and a metadata object of its own each time."""
    made, validated = CallContext.default(), CallContext()
    assert list(made.__dict__.items()) == list(validated.__dict__.items())
    assert made.model_fields_set == validated.model_fields_set == set()
    assert made.__pydantic_private__ == validated.__pydantic_private__
    assert made.__pydantic_extra__ == validated.__pydantic_extra__
    assert made.model_dump() == validated.model_dump()
    assert made.metadata is not CallContext.default().metadata
