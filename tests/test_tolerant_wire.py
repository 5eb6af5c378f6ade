"""Tolerant readers: fields a newer peer adds to requests, contexts and replies are ignored."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from conftest import IDLE, TEST_QUEUE, Fleet
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import ClientError, Status, codec
from toolfleet.shared.wire import CallContext, ToolCallRequest, new_call_id

ECHO = "ext_fleet_test_echo"


class NewerContext(CallContext):
    """A context as a newer producer might send it: one field older workers do not know."""

    tenant_tier: str = "gold"


class NewerRequest(ToolCallRequest):
    """A request as a newer producer might send it: new fields at the top and in context."""

    priority: int = 7
    routing: dict[str, str] = {"region": "eu"}
    context: NewerContext = NewerContext()


def _newer_reply(call_id: str, function: str) -> list[bytes]:
    """An event and a result as a newer worker might post them, with fields unknown here."""
    event = {
        "type": "event",
        "trace": {"span": "abc"},
        "event": {"id": call_id, "kind": "running", "at": time.time(), "host_load": 0.3},
    }
    result = {
        "type": "result",
        "shard": 3,
        "result": {
            "id": call_id,
            "function": function,
            "status": "ok",
            "content": {"answer": 42},
            "cost_usd": 0.001,
            "retries": {"count": 0},
        },
    }
    return [codec.dumps(event), codec.dumps(result)]


def test_worker_serves_a_request_with_unknown_fields(fleet: Fleet, r: redis.Redis) -> None:
    """A request carrying fields this worker does not know (top level and in ``context``)
    is served ``ok`` with the fields it knows, not rejected."""
    reply_to = f"{fleet.namespace}:reply:tolerant-{uuid.uuid4().hex[:6]}"
    now = time.time()
    request = NewerRequest(
        id=new_call_id(),
        function=ECHO,
        arguments={"text": "hi", "times": 2},
        context=NewerContext(account="acme", tenant_tier="platinum"),
        reply_to=reply_to,
        deadline=now + 20,
        timeout_s=20,
    )
    wire = codec.loads(request.encode())
    assert wire["priority"] == 7 and wire["context"]["tenant_tier"] == "platinum"
    Publisher(r, fleet.namespace).publish(TEST_QUEUE, request)
    popped = r.blpop([reply_to], timeout=20)
    r.delete(reply_to)
    assert popped is not None, fleet.log()
    envelope = codec.loads(popped[1])
    assert envelope["type"] == "result"
    assert envelope["result"]["status"] == "ok", envelope
    assert envelope["result"]["content"] == {"text": "hihi", "account": "acme"}


def test_sync_client_reads_a_reply_with_unknown_fields(redis_url: str, idle_namespace: str) -> None:
    """ToolClient resolves a call from a reply (and an event before it) carrying unknown fields."""
    events: list[str] = []
    with ToolClient(redis_url, namespace=idle_namespace) as client:
        future = client.submit(IDLE, {}, timeout_s=20)
        r = redis.Redis.from_url(redis_url)
        r.rpush(client.reply_to, *_newer_reply(future.call_id, IDLE))
        r.close()
        result = future.result(timeout=20)
        messages = client.dispatch(
            [{"id": "c1", "type": "function", "function": {"name": IDLE, "arguments": "{}"}}],
            timeout_s=20,
            on_event=lambda e: _push_reply_on_queued(redis_url, client.reply_to, e, events),
        )
    assert result.status is Status.OK
    assert result.content == {"answer": 42}
    assert events == ["queued", "running", "result"]
    assert codec.loads(messages[0]["content"]) == {"answer": 42}


def _push_reply_on_queued(url: str, reply_to: str, event: object, seen: list[str]) -> None:
    kind = str(getattr(event, "kind", ""))
    seen.append(kind)
    if kind == "queued":
        r = redis.Redis.from_url(url)
        r.rpush(reply_to, *_newer_reply(str(getattr(event, "call_id", "")), IDLE))
        r.close()


def test_async_client_reads_a_reply_with_unknown_fields(
    redis_url: str, idle_namespace: str
) -> None:
    """AsyncToolClient resolves a call from a reply carrying unknown fields."""

    async def run() -> object:
        async with AsyncToolClient(redis_url, namespace=idle_namespace) as client:
            future = await client.submit(IDLE, {}, timeout_s=20)
            r = redis.asyncio.Redis.from_url(redis_url)
            await r.rpush(client.reply_to, *_newer_reply(future.call_id, IDLE))
            await r.aclose()
            return await asyncio.wait_for(future, 20)

    result = asyncio.run(run())
    assert getattr(result, "status", None) is Status.OK
    assert getattr(result, "content", None) == {"answer": 42}


def test_callers_context_with_an_unknown_field_is_misuse(
    redis_url: str, idle_namespace: str
) -> None:
    """What a caller hands the producer is still checked: a typo'd context field raises."""
    with (
        ToolClient(redis_url, namespace=idle_namespace) as client,
        pytest.raises(ClientError, match="acount"),
    ):
        client.submit(IDLE, {}, context={"acount": "acme"})
