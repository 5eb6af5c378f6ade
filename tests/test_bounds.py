"""Bounds on every request field and on nesting: refused at the producer, answered briefly by the
worker, and the same documents accepted on both sides."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conftest import IDLE, IDLE_QUEUE, Either, Fleet, enqueue_raw
from toolfleet.producer import ToolClient
from toolfleet.shared import ClientError, Status
from toolfleet.shared.wire import CallContext, ReplyEnvelope

ECHO = "ext_fleet_test_echo"
FIVE_MB = 5_000_000
#: The largest reply a refused oversized request may get, bytes.
SHORT_REPLY = 4096
#: The longest worker log line a refused oversized request may cause, characters.
SHORT_LINE = 5000


def _nested(depth: int) -> Any:
    """``depth`` objects nested in one another around the number 1."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture
def deep_stack_host() -> Iterator[None]:
    """A host application that raised Python's recursion limit (as many do)."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    yield
    sys.setrecursionlimit(previous)


def _queued(r: redis.Redis, namespace: str) -> int:
    return int(r.llen(f"{namespace}:{IDLE_QUEUE}")) + int(r.hlen(f"{namespace}:{IDLE_QUEUE}.msgs"))


def test_arguments_nested_past_the_bound_are_refused_at_the_producer(
    deep_stack_host: None,
    redis_url: str,
    idle_namespace: str,
    r: redis.Redis,
    make: Callable[..., Either],
) -> None:
    """Arguments nested 1,100 levels raise ClientError naming the arguments and the
    1,024-level bound, and nothing is published, even where the standard library could
    encode them."""
    client = make(redis_url, namespace=idle_namespace)
    with pytest.raises(ClientError, match=r"arguments nest deeper.*1024"):
        client.submit(IDLE, _nested(1100), timeout_s=5)
    assert _queued(r, idle_namespace) == 0


#: A field of a call set 5 MB long: ``(what the error names, submit's keyword arguments)``.
OVERSIZED: list[tuple[str, dict[str, Any]]] = [
    ("tool_call_id", {"tool_call_id": "c" * FIVE_MB}),
    ("account", {"context": {"account": "a" * FIVE_MB}}),
    ("user", {"context": {"user": "u" * FIVE_MB}}),
    ("llmclient", {"context": {"llmclient": "l" * FIVE_MB}}),
    ("conversation", {"context": {"conversation": "v" * FIVE_MB}}),
    ("traceparent", {"context": {"traceparent": "t" * FIVE_MB}}),
    ("tracestate", {"context": {"tracestate": "s" * FIVE_MB}}),
    ("metadata", {"context": {"metadata": {"blob": "m" * FIVE_MB}}}),
    ("context.user", {"context": CallContext.model_construct(user="u" * FIVE_MB)}),
]


@pytest.mark.parametrize(("field", "options"), OVERSIZED, ids=[f for f, _ in OVERSIZED])
def test_a_field_over_its_bound_is_refused_at_the_producer(
    field: str,
    options: dict[str, Any],
    redis_url: str,
    idle_namespace: str,
    r: redis.Redis,
    make: Callable[..., Either],
) -> None:
    """A 5 MB tool_call_id or context field (or metadata) raises ClientError naming the
    field and its bound, and nothing is published."""
    client = make(redis_url, namespace=idle_namespace)
    bound = "65536 bytes" if field == "metadata" else "at most"
    with pytest.raises(ClientError, match=rf"(?s){field}: .*{bound}") as raised:
        client.submit(IDLE, {}, timeout_s=5, **options)
    assert len(str(raised.value)) < 500
    assert _queued(r, idle_namespace) == 0


def test_a_function_name_over_its_bound_is_refused_at_the_producer(
    redis_url: str, idle_namespace: str, make: Callable[..., Either]
) -> None:
    """A 5 MB function name raises ClientError naming ``function`` and its 256-character
    bound, while a long name within it is still answered ``unknown_function``."""
    client = make(redis_url, namespace=idle_namespace)
    with pytest.raises(ClientError, match="function: .*at most 256 characters"):
        client.submit("f" * FIVE_MB, {}, timeout_s=5)
    assert client.call("f" * 200, {}, timeout_s=5).status is Status.UNKNOWN_FUNCTION


def test_a_request_at_the_depth_bound_is_read_and_answered_by_the_worker(fleet: Fleet) -> None:
    """Arguments nested 1,023 levels (a request of exactly 1,024 levels) are published and
    reach the tool's validation on the worker (``invalid_arguments``), not refused as
    undecodable."""
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call(ECHO, _nested(1023), timeout_s=20)
    assert result.status is Status.INVALID_ARGUMENTS, result
    assert result.error == "unexpected argument: a"


def _publish_raw(fleet: Fleet, r: redis.Redis, request_text: str) -> None:
    """Enqueue a Dramatiq message whose one argument is ``request_text``, as is."""
    enqueue_raw(r, fleet.namespace, request_text)


def _reply(r: redis.Redis, reply_to: str, fleet: Fleet) -> bytes:
    popped = r.blpop([reply_to], timeout=20)
    r.delete(reply_to)
    assert popped is not None, f"no reply on {reply_to}:\n{fleet.log()[-3000:]}"
    return bytes(popped[1])


def test_a_raw_request_nested_too_deep_is_answered_rejected(fleet: Fleet, r: redis.Redis) -> None:
    """A raw request nested 1,101 levels deep whose reply_to follows the deep arguments
    is answered ``rejected`` saying it nests deeper than 1,024 levels."""
    reply_to = f"{fleet.namespace}:reply:deep-{uuid.uuid4().hex[:6]}"
    call_id = str(uuid.uuid4())
    deep = '{"a":' * 1100 + "1" + "}" * 1100
    head = json.dumps({"id": call_id, "function": ECHO, "deadline": time.time() + 30,
                       "timeout_s": 30.0})[:-1]  # fmt: skip
    _publish_raw(fleet, r, f'{head}, "arguments": {deep}, "reply_to": {json.dumps(reply_to)}}}')
    result = ReplyEnvelope.decode(_reply(r, reply_to, fleet)).result
    assert result is not None
    assert result.status is Status.REJECTED
    assert result.id == call_id and result.function == ECHO
    assert "deeper than 1024 levels" in str(result.error)


#: A raw request's field set 5 MB long: ``(the field's name in the error, request update)``.
RAW_OVERSIZED: list[tuple[str, dict[str, Any]]] = [
    ("function", {"function": "f" * FIVE_MB}),
    ("tool_call_id", {"tool_call_id": "c" * FIVE_MB}),
    ("context.user", {"context": {"user": "u" * FIVE_MB}}),
    ("context.metadata", {"context": {"metadata": {"blob": "m" * FIVE_MB}}}),
]


@pytest.mark.parametrize(("field", "update"), RAW_OVERSIZED, ids=[f for f, _ in RAW_OVERSIZED])
def test_a_raw_request_over_a_field_bound_is_answered_briefly(
    field: str, update: dict[str, Any], fleet: Fleet, r: redis.Redis
) -> None:
    """A raw request with a 5 MB function, tool_call_id, context.user or metadata is
    answered ``rejected`` naming the field, in a reply of a few KB, and every worker log
    line it causes is short."""
    reply_to = f"{fleet.namespace}:reply:big-{uuid.uuid4().hex[:6]}"
    call_id = str(uuid.uuid4())
    request = {"id": call_id, "function": ECHO, "arguments": {"text": "x"}, "reply_to": reply_to,
               "deadline": time.time() + 30, "timeout_s": 30.0, **update}  # fmt: skip
    start = len(fleet.log())
    _publish_raw(fleet, r, json.dumps(request))
    data = _reply(r, reply_to, fleet)
    assert len(data) < SHORT_REPLY, data[:300]
    result = ReplyEnvelope.decode(data).result
    assert result is not None
    assert result.status is Status.REJECTED, result
    assert result.id == call_id
    assert field in str(result.error)
    time.sleep(1.0)  # what the worker logs after replying is in the log by now
    lines = fleet.log()[start:].splitlines()
    assert any(call_id in line or "undecodable" in line for line in lines), lines[-5:]
    assert max(map(len, lines), default=0) < SHORT_LINE, max(lines, key=len)[:300]
