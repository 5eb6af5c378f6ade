"""Streaming a turn's call events (queued, running, progress, result) from a real fleet."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from conftest import Fleet
from toolfleet.producer import AsyncToolClient, CallEvent, ToolClient
from toolfleet.shared import Status
from toolfleet.shared.wire import ReplyEnvelope

F = "ext_fleet_test_"


def _turn(*calls: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]


PROGRESS = _turn(("call_p", F + "progress", {"steps": 4, "pause_s": 0.3}))


def _stream(fleet: Fleet, turn: Any, timeout_s: float = 10) -> tuple[list[CallEvent], Any]:
    async def run() -> tuple[list[CallEvent], Any]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            events = [event async for event in client.stream(turn, timeout_s=timeout_s)]
            return events, await client.dispatch(turn, timeout_s=timeout_s)

    return asyncio.run(run())


def test_stream_yields_queued_running_progress_result_while_the_tool_runs(fleet: Fleet) -> None:
    """A progress-reporting tool streams queued → running → progress ×4 → result, in order, each
    event reaching the client while the tool still runs, with the tool's descriptions."""
    events, _ = _stream(fleet, PROGRESS)
    assert [e.kind for e in events] == ["queued", "running", *["progress"] * 4, "result"]
    assert {(e.index, e.tool_call_id, e.function) for e in events} == {
        (0, "call_p", F + "progress")
    }
    assert len({e.call_id for e in events}) == 1
    assert events[1].description == "Counting to 4…"
    assert [e.description for e in events[2:6]] == [f"step {i} of 4" for i in range(1, 5)]
    result = events[-1]
    assert result.status is Status.OK and result.description == "Counted to 4"
    assert result.message == {"role": "tool", "tool_call_id": "call_p", "content": "4"}
    received = [e.received_at for e in events]
    assert received == sorted(received)
    assert result.received_at - events[1].received_at >= 1.0  # running came ~1.2 s early
    for early in events[2:5]:  # steps 1-3 arrived while the tool still had steps to take
        assert result.received_at - early.received_at >= 0.25
    for worker_event in events[1:6]:  # delivered promptly after the worker posted them
        assert worker_event.received_at - worker_event.at < 0.5


def test_sync_dispatch_hands_events_to_a_callback_on_the_callers_thread(fleet: Fleet) -> None:
    """dispatch(on_event=...) calls back on the caller's thread with the same ordered events."""
    seen: list[tuple[int, CallEvent]] = []
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        messages = client.dispatch(
            PROGRESS, timeout_s=10, on_event=lambda e: seen.append((threading.get_ident(), e))
        )
    assert {ident for ident, _ in seen} == {threading.get_ident()}
    kinds = [e.kind for _, e in seen]
    assert kinds == ["queued", "running", *["progress"] * 4, "result"]
    assert messages == [seen[-1][1].message]


def test_interleaved_calls_each_keep_their_order_and_one_result(fleet: Fleet) -> None:
    """In a mixed turn every call's events stay in order and end with exactly one result; the
    stream's messages equal what dispatch returns."""
    turn = _turn(
        ("a", F + "progress", {"steps": 2, "pause_s": 0.25}),
        ("b", F + "add", {"a": 1, "b": 2}),
        ("c", "no_such_tool", {}),
        ("d", F + "progress", {"steps": 3, "pause_s": 0.25}),
    )

    async def run() -> tuple[list[CallEvent], list[dict[str, Any]], list[dict[str, Any]]]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            stream = client.stream(turn, timeout_s=10)
            events = [event async for event in stream]
            return events, stream.messages, await client.dispatch(turn, timeout_s=10)

    events, streamed, dispatched = asyncio.run(run())
    by_call = {i: [e.kind for e in events if e.index == i] for i in range(4)}
    assert by_call[0] == ["queued", "running", "progress", "progress", "result"]
    assert by_call[1] == ["queued", "running", "result"]
    assert by_call[2] == ["result"]
    assert by_call[3] == ["queued", "running", "progress", "progress", "progress", "result"]
    assert [json.loads(m["content"]) for m in streamed] == [
        2,
        3,
        {"error": "unknown function 'no_such_tool'"},
        3,
    ]
    assert streamed == dispatched


def test_leaving_a_stream_early_cancels_its_calls(fleet: Fleet) -> None:
    """Breaking out of `async with client.stream(...)` cancels the calls still running."""

    async def run() -> tuple[int, Any]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            turn = _turn(("long", F + "progress", {"steps": 30, "pause_s": 0.25}))
            async with client.stream(turn, timeout_s=20) as events:
                async for event in events:
                    if event.kind == "progress":
                        break
            left = client.in_flight
            after = await client.dispatch(_turn(("x", F + "add", {"a": 1, "b": 1})), timeout_s=5)
            return left, after

    left, after = asyncio.run(run())
    assert left == 0
    assert after[0]["content"] == "2"


def test_a_raising_callback_cancels_the_turn_and_propagates(fleet: Fleet) -> None:
    """An exception from on_event cancels the turn's running calls and reaches the caller."""

    def stop(event: CallEvent) -> None:
        if event.kind == "running":
            raise KeyboardInterrupt

    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        turn = _turn(("long", F + "progress", {"steps": 30, "pause_s": 0.25}))
        with pytest.raises(KeyboardInterrupt):
            client.dispatch(turn, timeout_s=20, on_event=stop)
        assert client.in_flight == 0


def test_async_dispatch_awaits_a_coroutine_callback(fleet: Fleet) -> None:
    """AsyncToolClient.dispatch(on_event=...) awaits a coroutine function per event."""
    kinds: list[str] = []

    async def on_event(event: CallEvent) -> None:
        await asyncio.sleep(0)
        kinds.append(event.kind)

    async def run() -> list[dict[str, Any]]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            return await client.dispatch(PROGRESS, timeout_s=10, on_event=on_event)

    messages = asyncio.run(run())
    assert kinds == ["queued", "running", *["progress"] * 4, "result"]
    assert messages[0]["content"] == "4"


def test_no_events_are_requested_when_nobody_streams(fleet: Fleet) -> None:
    """A plain dispatch publishes requests with events off: only result envelopes come back."""
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        types: list[str] = []
        deliver = client._listener._deliver

        def recording(batch: list[bytes]) -> None:
            types.extend(ReplyEnvelope.decode(data).type for data in batch)
            deliver(batch)

        client._listener._deliver = recording  # type: ignore[method-assign]
        assert client.dispatch(PROGRESS, timeout_s=10)[0]["content"] == "4"
        assert types == ["result"]
        client.dispatch(PROGRESS, timeout_s=10, on_event=lambda e: None)
        assert types.count("event") == 5
