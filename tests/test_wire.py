"""Wire models, statuses and the error tree."""

from __future__ import annotations

import time

import pytest

from toolfleet.shared import Status, ToolCallRequest, ToolCallResult, errors
from toolfleet.shared.wire import ReplyEnvelope, new_call_id


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
