"""The producer's sans-IO core, without Redis: the pending table, the steps, the rules."""

from __future__ import annotations

import time
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any

import pytest
import redis

from toolfleet.producer._core import steps as core
from toolfleet.producer._core.calls import check_timeout, make_context, publish_refusal
from toolfleet.producer._core.config import configure
from toolfleet.producer._core.fleet import outcomes_of, queue_resolved
from toolfleet.producer._core.pending import PendingTable
from toolfleet.producer.catalog import Catalog
from toolfleet.shared import codec
from toolfleet.shared.errors import BackpressureError, ClientError
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import (
    CallContext,
    ReplyEnvelope,
    Status,
    ToolCallRequest,
    ToolCallResult,
    ToolEvent,
)

FUNCTION = "ext_demo_echo"
QUEUE = "tools.demo"


class _Future(Future[ToolCallResult]):
    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id


def _request(timeout_s: float = 30.0) -> ToolCallRequest:
    return ToolCallRequest.model_validate(
        {
            "id": f"id-{time.monotonic_ns()}",
            "function": FUNCTION,
            "arguments": {},
            "reply_to": "ns:reply:x",
            "deadline": time.time() + timeout_s,
            "timeout_s": timeout_s,
            "sent_at": time.time(),
        }
    )


def _reply(request: ToolCallRequest, content: Any = 1) -> bytes:
    result = ToolCallResult(
        id=request.id, function=request.function, status=Status.OK, content=content
    )
    return ReplyEnvelope(type="result", result=result).encode()


def _table(released: list[int], canceled: list[str] | None = None) -> PendingTable:
    return PendingTable(lambda: released.append(1), None if canceled is None else canceled.append)


def _config(**options: Any) -> Any:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", namespace="ns")
    args: dict[str, Any] = {"max_in_flight": 10, "submit_timeout_s": 1.0, **options}
    return configure(None, namespace="ns", settings=settings, redis_client=None,
                     connection_pool=None, asyncio=False, **args)  # fmt: skip


def _catalog(live: bool = True) -> Catalog:
    entry = {"name": FUNCTION, "description": "x", "parameters": {}, "queue": QUEUE}
    return Catalog(
        entries={FUNCTION: entry},
        live_queues=frozenset({QUEUE} if live else ()),
        read_at=time.monotonic(),
    )


def _run(steps: Generator[core.Step, Any, Any], answers: dict[type, Any]) -> Any:
    """Drive ``steps`` answering each step by its type (an exception is thrown in)."""
    step = core.advance(steps, None, None)
    while not isinstance(step, core.Done):
        answer = answers[type(step)]
        answer = answer(step) if callable(answer) else answer
        if isinstance(answer, BaseException):
            step = core.advance(steps, None, answer)
        else:
            step = core.advance(steps, answer, None)
    return step.value


# -- the pending table -------------------------------------------------------------------


def test_a_reply_resolves_its_call_once_and_a_second_one_counts_late() -> None:
    """A result envelope resolves the pending call; the same reply again counts late."""
    released: list[int] = []
    table = _table(released)
    request, future = _request(), _Future("")
    table.add(request, future)
    table.deliver([_reply(request)])
    assert future.result().content == 1 and table.in_flight == 0 and released == [1]
    table.deliver([_reply(request)])
    assert table.late_replies == 1


def test_events_reach_the_sink_until_the_call_resolves() -> None:
    """Event envelopes go to the call's sink; after its result none is delivered."""
    table, seen = _table([]), []
    request = _request()
    table.add(request, _Future(""), seen.append)
    event = ToolEvent(id=request.id, kind="running", at=time.time())
    table.deliver([ReplyEnvelope(type="event", event=event).encode()])
    table.deliver([_reply(request), ReplyEnvelope(type="event", event=event).encode()])
    assert [e.kind for e in seen] == ["running"]


def test_an_undecodable_reply_naming_a_call_resolves_it_rejected() -> None:
    """A reply that fails to decode but names its id answers that call ``rejected``."""
    table = _table([])
    request, future = _request(), _Future("")
    table.add(request, future)
    table.deliver([codec.dumps({"type": "result", "result": {"id": request.id, "status": 5}})])
    assert future.result().status is Status.REJECTED


def test_due_hands_each_call_out_once_in_deadline_order() -> None:
    """Calls past their deadline are handed out once each; the next deadline is the earliest."""
    table = _table([])
    late, soon, later = _request(-1.0), _request(-0.5), _request(60.0)
    for request in (later, soon, late):
        table.add(request, _Future(""))
    assert table.due(time.time()) == [late.id, soon.id]
    assert table.due(time.time()) == []
    assert table.next_deadline() == pytest.approx(later.deadline)


def test_expire_without_outcome_answers_timeout() -> None:
    """A due call whose worker recorded nothing is answered ``timeout`` by the producer."""
    table = _table([])
    request, future = _request(-1.0), _Future("")
    table.add(request, future)
    assert table.expire(table.due(time.time()), [None]) == [request.id]
    assert future.result().status is Status.TIMEOUT


def test_expire_with_a_recorded_outcome_delivers_it_and_its_reply_is_not_late() -> None:
    """A worker that finished before the marker was written: its result reaches the caller,
    and its reply, arriving after, is dropped without counting late."""
    table = _table([])
    request, future = _request(-1.0), _Future("")
    table.add(request, future)
    assert table.expire(table.due(time.time()), [_reply(request, "done")]) == []
    assert future.result().content == "done"
    table.deliver([_reply(request, "done")])
    assert table.late_replies == 0
    table.deliver([_reply(request, "done")])
    assert table.late_replies == 1


def test_a_reply_during_expiry_wins_over_the_timeout() -> None:
    """A reply that arrives while the marker is being written resolves the call itself."""
    table = _table([])
    request, future = _request(-1.0), _Future("")
    table.add(request, future)
    due = table.due(time.time())
    table.deliver([_reply(request, "in time")])
    assert table.expire(due, [None]) == []
    assert future.result().content == "in time" and table.late_replies == 0


def test_a_canceled_future_frees_its_slot_and_is_canceled_in_the_fleet() -> None:
    """Canceling a call's future forgets it, gives its slot back and reports it to cancel."""
    released: list[int] = []
    canceled: list[str] = []
    table = _table(released, canceled)
    request = _request()
    future = _Future(request.id)
    table.add(request, future)
    assert future.cancel()
    assert canceled == [request.id] and released == [1] and table.in_flight == 0


def test_close_answers_pending_calls_and_refuses_new_ones() -> None:
    """Closing resolves every pending call ``timeout``; a later add answers ``rejected``."""
    released: list[int] = []
    table = _table(released)
    request, future = _request(), _Future("")
    table.add(request, future)
    table.close("closed")
    assert future.result().status is Status.TIMEOUT
    late = _Future("")
    with pytest.raises(RuntimeError):
        table.add(_request(), late)
    assert late.result().status is Status.REJECTED and released == [1, 1]


# -- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:1."), Status.NOT_AVAILABLE),
        (redis.ResponseError("OOM command not allowed"), Status.REJECTED),
        (redis.TimeoutError("Timeout reading from socket"), None),
        (ValueError("a bug"), Status.REJECTED),
    ],
)
def test_publish_errors_are_classified_once(exc: BaseException, status: Status | None) -> None:
    """Never sent → not_available; refused → rejected; maybe sent → left to the deadline;
    not a Redis error → rejected."""
    refusal = publish_refusal(exc)
    assert (refusal.status if refusal is not None else None) == status


def test_configure_refuses_a_bad_in_flight_cap() -> None:
    """``max_in_flight`` below 1 is misuse."""
    with pytest.raises(ClientError):
        _config(max_in_flight=0)


@pytest.mark.parametrize("timeout_s", [10**400, -(10**400), 86_401], ids=["huge", "-huge", "day+1"])
def test_an_integer_timeout_out_of_range_is_misuse(timeout_s: int) -> None:
    """An ``int`` budget beyond one day, even one too large for a float, is refused as
    misuse naming ``timeout_s``, not raised as ``OverflowError``."""
    with pytest.raises(ClientError, match="timeout_s"):
        check_timeout(timeout_s)


@pytest.mark.parametrize("context", [{"account": "acme\ud800"}, CallContext(account="\udc80")])
def test_an_account_with_a_lone_surrogate_is_misuse(context: Any) -> None:
    """An account names Redis keys (lanes, quotas): one that cannot be UTF-8 encoded is
    refused as misuse, not raised as ``UnicodeEncodeError`` from the publish."""
    with pytest.raises(ClientError, match="account"):
        make_context(context)


def test_resolved_markers_come_with_each_calls_outcome() -> None:
    """The marker commands are set, get, publish per call; the outcomes are the gets."""

    class Pipe:
        def __init__(self) -> None:
            self.commands: list[str] = []

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: self.commands.append(name)

    pipe = Pipe()
    queue_resolved(pipe, "ns", ["a", "b"], 60)
    assert pipe.commands == ["set", "get", "publish"] * 2
    assert outcomes_of([True, b"x", 0, True, None, 1]) == [b"x", None]


# -- the steps ---------------------------------------------------------------------------


def _core() -> core.ProducerCore:
    return core.ProducerCore(_config(), lambda: None)


def test_submit_publishes_an_admitted_call_on_its_queue() -> None:
    """An admitted call takes a slot, is registered and published on its queue."""
    producer, published = _core(), []
    request, future = _request(), _Future("")
    answers = {core.ReadCatalog: _catalog(), core.TakeSlot: True,
               core.Publish: lambda step: published.extend(step.items) or [None]}  # fmt: skip
    _run(producer.submit(request, future), answers)
    assert published == [(QUEUE, request)] and producer.table.holds(request.id)


def test_submit_answers_a_call_without_a_live_worker_at_once() -> None:
    """No live worker: ``not_available`` at once, no slot taken, nothing published."""
    producer, future = _core(), _Future("")
    _run(producer.submit(_request(), future), {core.ReadCatalog: _catalog(live=False)})
    assert future.result().status is Status.NOT_AVAILABLE and producer.table.in_flight == 0


def test_submit_without_a_slot_in_time_raises_backpressure() -> None:
    """No slot at once nor within the wait: ``BackpressureError``, nothing registered."""
    producer = _core()
    with pytest.raises(BackpressureError):
        _run(producer.submit(_request(), _Future("")),
             {core.ReadCatalog: _catalog(), core.TakeSlot: False})  # fmt: skip
    assert producer.table.in_flight == 0


def test_an_unexpected_publish_error_answers_rejected_and_raises() -> None:
    """A publish that fails with a non-Redis error answers the call ``rejected``, then raises."""
    producer, future = _core(), _Future("")
    answers = {core.ReadCatalog: _catalog(), core.TakeSlot: True, core.Publish: ValueError("x")}
    with pytest.raises(ValueError):
        _run(producer.submit(_request(), future), answers)
    assert future.result().status is Status.REJECTED


def test_a_turn_answers_unknown_calls_and_publishes_the_rest_in_one_batch() -> None:
    """A turn publishes its known calls together; an unknown one is answered at once."""
    producer, batches = _core(), []
    turn = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate([FUNCTION, "ext_nope_x", FUNCTION])
    ]
    answers = {core.ReadCatalog: _catalog(), core.TakeSlot: True,
               core.Publish: lambda step: batches.append(step.items) or [None, None]}  # fmt: skip
    state = _run(producer.turn(turn, None, 5.0, None, _Future), answers)
    assert [len(b) for b in batches] == [2]
    assert state.result(1).status is Status.UNKNOWN_FUNCTION


def test_cancel_writes_the_marker_before_resolving() -> None:
    """Canceling a held call asks for its marker first, then answers ``canceled``."""
    producer, request, future = _core(), _request(), _Future("")
    producer.table.add(request, future)
    seen: list[bool] = []

    def mark(step: core.MarkResolved) -> list[bytes | None]:
        seen.append(future.done())
        return [None]

    assert _run(producer.cancel([request.id]), {core.MarkResolved: mark}) is True
    assert seen == [False] and future.result().status is Status.CANCELED


# -- idempotency keys and conversation routes -----------------------------------------------


def test_a_duplicate_waits_for_the_first_calls_outcome_and_misuse_raises() -> None:
    """The enqueue script's Duplicate: the call waits in ``following`` (the poller is woken)
    and resolves with the first outcome, its own ids kept; a misuse answers rejected, raises."""
    from toolfleet.shared.errors import IdempotencyKeyError
    from toolfleet.shared.idempotency import Duplicate

    woken: list[int] = []
    producer = core.ProducerCore(_config(), lambda: None, on_follow=lambda: woken.append(1))
    sent: list[Any] = []
    request, future = _request(), _Future("")
    duplicate = [Duplicate("first", False)]
    answers = {core.ReadCatalog: _catalog(), core.TakeSlot: True,
               core.Publish: lambda step: sent.append(step) or duplicate}  # fmt: skip
    _run(producer.submit(request, future, "key-1"), answers)
    assert sent[0].keys[request.id].key == "key-1" and not future.done() and woken == [1]
    ids, keys = producer.following.keys()
    assert ids == [request.id] and keys == ["ns:outcome:first"]
    first = ToolCallResult(id="first", tool_call_id="c0", function=FUNCTION, status=Status.OK,
                           content={"n": 1})  # fmt: skip
    raw = ReplyEnvelope(type="result", result=first).encode()
    (answer,) = producer.following.settle(ids, [raw], {request.id})
    assert (answer.id, answer.duplicate_of, answer.content) == (request.id, "first", {"n": 1})
    misused, other = _request(), _Future("")
    answers[core.Publish] = [Duplicate("first", True)]
    with pytest.raises(IdempotencyKeyError, match="key-1"):
        _run(producer.submit(misused, other, "key-1"), answers)
    assert other.result().status is Status.REJECTED


def test_without_a_key_or_a_conversation_no_step_is_added() -> None:
    """No key: the Publish step carries none; no conversation: no ReadRoutes step."""
    producer, sent = _core(), []
    answers = {core.ReadCatalog: _catalog(), core.TakeSlot: True,
               core.Publish: lambda step: sent.append(step) or [None]}  # fmt: skip
    _run(producer.submit(_request(), _Future("")), answers)  # a ReadRoutes would raise KeyError
    assert sent[0].keys is None


def test_a_conversations_call_follows_its_route_and_names_the_holder() -> None:
    """A route to a slot the catalog has not read: one CheckLive; live, the call goes there
    with session_holder; a dead slot sends it to the tool's queue, still naming the holder."""
    from toolfleet.shared.affinity import Route, encode_route

    entry = {"name": FUNCTION, "description": "x", "parameters": {}, "queue": QUEUE,
             "affinity": "conversation"}  # fmt: skip
    catalog = Catalog(entries={FUNCTION: entry}, live_queues=frozenset({QUEUE}),
                      read_at=time.monotonic())  # fmt: skip
    slot = "tools.demo.slot.h-1-0"
    for live, queue in ((1, slot), (0, QUEUE)):
        producer, sent, checked = _core(), [], []
        request = _request().model_copy(
            update={"context": CallContext(account="a", conversation="c1")}
        )
        answers = {core.ReadCatalog: catalog, core.TakeSlot: True,
                   core.ReadRoutes: [encode_route(Route(slot, "h:1"))],
                   core.CheckLive: lambda step, n=live, c=checked: c.append(step.queues) or [n],
                   core.Publish: lambda step, s=sent: s.extend(step.items) or [None]}  # fmt: skip
        _run(producer.submit(request, _Future("")), answers)
        ((published_on, published),) = sent
        assert (published_on, published.session_holder) == (queue, "h:1")
        assert checked == [[slot]] and producer.slots.queues() == {slot}
