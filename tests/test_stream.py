"""Streaming a turn's call events (queued, running, progress, result) from a real fleet.

Every test runs with ``ToolClient`` and with ``AsyncToolClient`` (through
:class:`conftest.Either`) but one: awaiting a coroutine callback is the async client's own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from conftest import Either, Fleet
from toolfleet.producer import AsyncToolClient, CallEvent
from toolfleet.shared import Status
from toolfleet.shared.wire import ReplyEnvelope

F = "ext_fleet_test_"


def _turn(*calls: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]


PROGRESS = _turn(("call_p", F + "progress", {"steps": 4, "pause_s": 0.3}))


def test_stream_yields_queued_running_progress_result_while_the_tool_runs(either: Either) -> None:
    """A progress-reporting tool streams queued → running → progress ×4 → result, in order, each
    event reaching the client while the tool still runs, with the tool's descriptions."""
    events, _ = either.stream(PROGRESS, timeout_s=10)
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


def test_dispatch_hands_events_to_a_callback_on_the_clients_thread(either: Either) -> None:
    """dispatch(on_event=...) calls back with the same ordered events on the caller's thread
    (ToolClient) or the loop's (AsyncToolClient)."""
    seen: list[tuple[int, CallEvent]] = []
    messages = either.dispatch(
        PROGRESS, timeout_s=10, on_event=lambda e: seen.append((threading.get_ident(), e))
    )
    assert {ident for ident, _ in seen} == {either.thread}
    kinds = [e.kind for _, e in seen]
    assert kinds == ["queued", "running", *["progress"] * 4, "result"]
    assert messages == [seen[-1][1].message]


def test_interleaved_calls_each_keep_their_order_and_one_result(either: Either) -> None:
    """In a mixed turn every call's events stay in order and end with exactly one result; the
    stream's messages equal what dispatch returns."""
    turn = _turn(
        ("a", F + "progress", {"steps": 2, "pause_s": 0.25}),
        ("b", F + "add", {"a": 1, "b": 2}),
        ("c", "no_such_tool", {}),
        ("d", F + "progress", {"steps": 3, "pause_s": 0.25}),
    )
    events, streamed = either.stream(turn, timeout_s=10)
    dispatched = either.dispatch(turn, timeout_s=10)
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


def test_leaving_a_stream_early_cancels_its_calls(either: Either) -> None:
    """Breaking out of `(async) with client.stream(...)` cancels the calls still running."""
    turn = _turn(("long", F + "progress", {"steps": 30, "pause_s": 0.25}))
    either.stream(turn, stop=lambda event: event.kind == "progress", timeout_s=20)
    assert either.in_flight == 0
    after = either.dispatch(_turn(("x", F + "add", {"a": 1, "b": 1})), timeout_s=5)
    assert after[0]["content"] == "2"


def test_a_raising_callback_cancels_the_turn_and_propagates(either: Either) -> None:
    """An exception from on_event cancels the turn's running calls and reaches the caller."""
    # KeyboardInterrupt for the sync client; on an event loop asyncio re-raises it out of the
    # loop itself, so the async client's callback raises an ordinary error
    error = KeyboardInterrupt if either.kind == "sync" else RuntimeError

    def stop(event: CallEvent) -> None:
        if event.kind == "running":
            raise error

    turn = _turn(("long", F + "progress", {"steps": 30, "pause_s": 0.25}))
    with pytest.raises(error):
        either.dispatch(turn, timeout_s=20, on_event=stop)
    assert either.in_flight == 0


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


def test_no_events_are_requested_when_nobody_streams(either: Either) -> None:
    """A plain dispatch publishes requests with events off: only result envelopes come back."""
    listener = either.client._listener
    types: list[str] = []
    deliver = listener._deliver

    def recording(batch: list[bytes]) -> None:
        types.extend(ReplyEnvelope.decode(data).type for data in batch)
        deliver(batch)

    listener._deliver = recording
    assert either.dispatch(PROGRESS, timeout_s=10)[0]["content"] == "4"
    assert types == ["result"]
    either.dispatch(PROGRESS, timeout_s=10, on_event=lambda e: None)
    assert types.count("event") == 5
