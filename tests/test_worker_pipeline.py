"""The worker's registry and call pipeline: refusals before the claim, the child's context."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from conftest import delete_namespace
from toolfleet.shared import Extension, ExtensionContext, Status, Tool, ToolCallRequest
from toolfleet.shared.manifest import SwitchSpec
from toolfleet.shared.naming import claim_key, outcome_key
from toolfleet.shared.wire import ReplyEnvelope
from toolfleet.worker.isolation import child
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.pipeline.handler import CallHandler
from toolfleet.worker.pipeline.ledger import InFlight, Ledger
from toolfleet.worker.pipeline.observe import Observer
from toolfleet.worker.registry.registry import Registry


class Nothing(BaseModel):
    pass


class Quiet(Tool):
    """Say whether this call's logger is muted."""

    name = "quiet"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> dict[str, Any]:
        return {"muted": context.logger.disabled, "slug": context.slug}


EXTENSION = Extension(
    slug="walkable",
    version="1",
    tools=[Quiet],
    switches=[SwitchSpec(name="logging", default=True, description="the tools' logs")],
)
QUIET = "ext_walkable_quiet"


@pytest.fixture
def handler(r: redis.Redis, namespace: str) -> Iterator[tuple[CallHandler, str]]:
    ns = f"{namespace}-walk-{uuid.uuid4().hex[:6]}"
    registry = Registry(ns)
    registry.add_extension(EXTENSION)
    pipeline = CallPipeline(registry, worker_id="test:1")
    yield (
        CallHandler(pipeline, Ledger(r, ns, "test:1", 60, 10), Observer(registry, "test:1")),
        ns,
    )
    pipeline.close()


def _request(ns: str, function: str, deadline_in_s: float) -> ToolCallRequest:
    return ToolCallRequest(
        id=str(uuid.uuid4()),
        function=function,
        arguments={},
        reply_to=f"{ns}:reply:{uuid.uuid4().hex}",
        deadline=time.time() + deadline_in_s,
        timeout_s=5,
        sent_at=time.time() - 10,
    )


def _reply(r: redis.Redis, request: ToolCallRequest) -> Any:
    item = r.lpop(request.reply_to)
    assert item is not None, "no reply was posted"
    envelope = ReplyEnvelope.model_validate_json(item)
    assert envelope.result is not None
    return envelope.result


@pytest.mark.parametrize(
    ("function", "deadline_in_s", "status"),
    [
        ("ext_walkable_missing", 5.0, Status.UNKNOWN_FUNCTION),
        (QUIET, -1.0, Status.EXPIRED),
    ],
)
def test_local_refusals_are_answered_without_claiming_the_call(
    handler: tuple[CallHandler, str],
    r: redis.Redis,
    function: str,
    deadline_in_s: float,
    status: Status,
) -> None:
    """An unknown function or a passed deadline is answered once, and no claim is written."""
    worker, ns = handler
    request = _request(ns, function, deadline_in_s)
    worker.handle(request.encode().decode(), "tools.walkable")
    assert _reply(r, request).status is status
    assert r.exists(claim_key(ns, request.id)) == 0
    assert r.exists(outcome_key(ns, request.id)) == 1  # a redelivery is not answered again
    worker.handle(request.encode().decode(), "tools.walkable")
    assert r.llen(request.reply_to) == 0


def test_a_call_that_may_run_is_claimed_and_answered(
    handler: tuple[CallHandler, str], r: redis.Redis
) -> None:
    """The same handler claims and runs a call that passes the local checks."""
    worker, ns = handler
    request = _request(ns, QUIET, 5.0)
    worker.handle(request.encode().decode(), "tools.walkable")
    result = _reply(r, request)
    assert result.status is Status.OK, result
    assert result.content == {"muted": False, "slug": "walkable"}
    assert r.exists(claim_key(ns, request.id)) == 1


@pytest.mark.parametrize(("logging_on", "muted"), [(True, False), (False, True)])
def test_the_child_process_call_honours_the_logging_switch(logging_on: bool, muted: bool) -> None:
    """A process-isolation child builds its context through the registry: the extension's
    logger is muted while its logging switch is off, and slug and version are filled in."""
    registry = Registry("walk-child", start_mcp=False)
    registry.add_extension(EXTENSION)
    child._state["registry"] = registry
    try:
        fields = {"call_id": "c1", "function": QUIET, "deadline": time.time() + 5}
        value = child.call_in_child(QUIET, {}, fields, {"ext_walkable_logging": logging_on})
    finally:
        child._state.clear()
    assert value == {"muted": muted, "slug": "walkable"}


def test_a_claim_retried_after_its_reply_was_lost_still_owns_the_call(
    r: redis.Redis, redis_url: str, namespace: str
) -> None:
    """A claim script that ran but whose reply was lost, sent again with the same token
    (redis-py retries on a dropped connection), finds its own claim and takes the call."""
    ns = f"{namespace}-reclaim-{uuid.uuid4().hex[:6]}"
    ledger = Ledger(r, ns, "test:1", 60, 10)
    request = _request(ns, QUIET, 5.0)
    token = ledger.new_token()
    record = InFlight(
        id=request.id, function=QUIET, reply_to=request.reply_to,
        answer_by=request.deadline, limit_s=5.0,
    )  # fmt: skip
    assert ledger.claim(request, "tools.walkable", token, record).acquired
    again = ledger.claim(request, "tools.walkable", token, record)
    assert again.acquired, again
    other = ledger.claim(request, "tools.walkable", ledger.new_token(), record)
    assert not other.acquired  # a second delivery in this process is still not let in
    delete_namespace(redis_url, ns)
