"""Producer behaviour, the same through ToolClient and AsyncToolClient (every test runs on both,
through the blocking facade :class:`conftest.Either`), and the shells' share-nothing check."""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from conftest import IDLE, IDLE_QUEUE, LATE_S, Either, Fleet
from toolfleet.shared import BackpressureError, ClientError, Settings, Status

G = "ext_guarantee_"
F = "ext_fleet_test_"
PRODUCER = Path(__file__).resolve().parent.parent / "producer"


@pytest.fixture
def gclient(small_fleet: Fleet, make: Callable[..., Either]) -> Either:
    return make(small_fleet.redis_url, namespace=small_fleet.namespace)


@pytest.fixture
def r(small_fleet: Fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(small_fleet.redis_url)
    yield client
    client.close()


# -- deadlines and time limits -----------------------------------------------------------


def test_stuck_thread_tool_times_out_on_time_and_capacity_recovers(gclient: Either) -> None:
    """sleep(3600) as a thread tool with a 2 s limit answers timeout by its limit (plus
    ``LATE_S``, under 4 s: the third sleep's timeout); three of them on a 2-thread worker do
    not block a quick call beyond the first limit; capacity recovers."""
    started = time.monotonic()
    sleeps = [gclient.submit(G + "sleep", {"seconds": 3600}, timeout_s=30) for _ in range(3)]
    quick = gclient.submit(G + "quick", {}, timeout_s=30)
    done_at: dict[int, float] = {}
    for i, future in enumerate([*sleeps, quick]):
        gclient.when_done(future, lambda _f, i=i: done_at.setdefault(i, time.monotonic() - started))
    results = [gclient.result(f) for f in sleeps]
    assert [r.status for r in results] == [Status.TIMEOUT] * 3
    assert all(r.run_s is not None and r.run_s < 2.0 + LATE_S for r in results)
    assert sorted(done_at[i] for i in range(3))[:2] < [2.0 + LATE_S, 2.0 + LATE_S]
    assert gclient.result(quick).status is Status.OK and done_at[3] < 2.3 + LATE_S
    t = time.monotonic()
    assert gclient.call(G + "quick", {}).status is Status.OK
    assert time.monotonic() - t < 0.5 + LATE_S  # not behind a 2 s limit


def test_a_call_times_out_at_its_deadline(
    redis_url: str, idle_namespace: str, make: Callable[..., Either]
) -> None:
    """A call nobody answers resolves timeout at its deadline, not later."""
    client = make(redis_url, namespace=idle_namespace)
    client.call(IDLE, {}, timeout_s=0.2)  # connections and catalog are warm
    started = time.monotonic()
    result = client.call(IDLE, {}, timeout_s=0.5)
    assert result.status is Status.TIMEOUT
    assert 0.5 <= time.monotonic() - started < 0.5 + LATE_S


def test_a_budget_too_short_for_the_round_trip_is_answered_timeout_never_not_available(
    small_fleet: Fleet, make: Callable[..., Either]
) -> None:
    """timeout_s=0.001 against a healthy fleet is answered timeout (or expired, when a
    worker took the call after its deadline), with a cold catalog and a warm one, for a
    lone call and for a turn; never not_available "Redis unreachable"."""
    for _ in range(3):
        client = make(small_fleet.redis_url, namespace=small_fleet.namespace)  # cold catalog
        for _ in range(2):
            result = client.call(F + "echo", {"text": "x"}, timeout_s=0.001)
            assert result.status in (Status.TIMEOUT, Status.EXPIRED), result
        assert client.call(F + "echo", {"text": "x"}, timeout_s=30).status is Status.OK
        turn = [{"id": "call_0", "type": "function",
                 "function": {"name": F + "echo", "arguments": '{"text": "x"}'}}]  # fmt: skip
        for timeout_s in (0.001, 0.001):
            (message,) = make(small_fleet.redis_url, namespace=small_fleet.namespace).dispatch(
                turn, timeout_s=timeout_s
            )
            assert "unreachable" not in message["content"], message
            (message,) = client.dispatch(turn, timeout_s=timeout_s)
            assert "unreachable" not in message["content"], message


# -- cancellation ------------------------------------------------------------------------


def test_cancel_while_queued_never_runs(gclient: Either, r: redis.Redis) -> None:
    """A call canceled while it waits in the queue resolves canceled and never runs."""
    blockers = [gclient.submit(G + "sleep", {"seconds": 1.0}, timeout_s=10) for _ in range(2)]
    time.sleep(0.2)
    key = f"count-{uuid.uuid4().hex}"
    queued = gclient.submit(G + "count", {"key": key}, timeout_s=10)
    assert gclient.cancel(queued.call_id)
    assert gclient.result(queued).status is Status.CANCELED
    assert [gclient.result(b).status for b in blockers] == [Status.OK, Status.OK]
    time.sleep(0.5)
    assert r.get(key) is None
    assert not gclient.cancel(queued.call_id)


@pytest.mark.parametrize("tool", ["ticks", "process_ticks"])
def test_cancel_while_running_stops_the_tool(gclient: Either, r: redis.Redis, tool: str) -> None:
    """A running async or process tool stops within 0.3 s of cancel; the call is canceled."""
    key = f"ticks-{uuid.uuid4().hex}"
    future = gclient.submit(G + tool, {"key": key}, timeout_s=20)
    deadline = time.monotonic() + 5
    while int(r.get(key) or 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert int(r.get(key) or 0) >= 3, "the tool never started"
    assert gclient.cancel(future.call_id)
    assert gclient.result(future).status is Status.CANCELED
    time.sleep(0.3)
    settled = int(r.get(key) or 0)
    time.sleep(0.5)
    assert int(r.get(key) or 0) == settled, "the tool kept running after cancel"


def test_cancel_reaches_a_running_thread_tool(gclient: Either, r: redis.Redis) -> None:
    """A running thread tool sees context.canceled become true."""
    key = f"watch-{uuid.uuid4().hex}"
    future = gclient.submit(G + "watch_cancel", {"key": key}, timeout_s=20)
    time.sleep(0.3)
    assert gclient.cancel(future.call_id)
    assert gclient.result(future).status is Status.CANCELED
    deadline = time.monotonic() + 2
    while r.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.get(key) == b"saw cancel"


def test_a_second_client_cancels_a_running_call_of_the_first(
    small_fleet: Fleet, make: Callable[..., Either]
) -> None:
    """Client B cancels, by its id alone, a call client A is running: A's call resolves
    canceled within 2 s (plus ``LATE_S``); canceling it again returns False."""
    a = make(small_fleet.redis_url, namespace=small_fleet.namespace)
    b = make(small_fleet.redis_url, namespace=small_fleet.namespace)
    future = a.submit("ext_promise_wait", {}, timeout_s=20)
    time.sleep(0.5)
    asked = time.monotonic()
    assert b.cancel(future.call_id)
    result = a.result(future, 20)
    assert result.status is Status.CANCELED, result
    assert time.monotonic() - asked < 2.0 + LATE_S
    assert not b.cancel(future.call_id)


def test_a_second_client_answers_a_queued_call_of_the_first_at_once(
    small_fleet: Fleet, make: Callable[..., Either], r: redis.Redis
) -> None:
    """Client B cancels, by its id alone, a call of client A that waits behind busy workers:
    A's call resolves canceled within 1 s, long before a worker is free, and once the
    workers are free it never runs and no second reply comes."""
    a = make(small_fleet.redis_url, namespace=small_fleet.namespace)
    b = make(small_fleet.redis_url, namespace=small_fleet.namespace)
    b.tools()  # B's connections and catalog are warm
    # two rounds of work for both worker threads (the tool's time limit is 2 s)
    blockers = [a.submit(G + "sleep", {"seconds": 1.8}, timeout_s=20) for _ in range(4)]
    time.sleep(0.3)
    key = f"count-{uuid.uuid4().hex}"
    queued = a.submit(G + "count", {"key": key}, timeout_s=20)
    time.sleep(0.2)
    asked = time.monotonic()
    assert b.cancel(queued.call_id)
    result = a.result(queued, 20)
    waited = time.monotonic() - asked
    assert result.status is Status.CANCELED, result
    assert waited < LATE_S, f"answered {waited:.2f} s after the cancel"
    assert [a.result(f, 20).status for f in blockers] == [Status.OK] * 4
    time.sleep(1.0)  # the workers are free: the canceled call would have run by now
    assert r.get(key) is None
    assert a.client.late_replies == 0
    assert not b.cancel(queued.call_id)


# -- refusals, backpressure, close --------------------------------------------------------


def test_producer_refuses_oversize_arguments(gclient: Either) -> None:
    """Arguments over the size limit are rejected before anything is published."""
    result = gclient.call(G + "count", {"key": "x" * 2_000_000})
    assert result.status is Status.REJECTED and "over the limit" in str(result.content)


def test_submit_waits_for_a_slot_then_raises_backpressure(
    fleet: Fleet, make: Callable[..., Either]
) -> None:
    """With max_in_flight=2, a third submit waits up to submit_timeout_s for a slot, then
    raises BackpressureError; with a longer wait it goes out as soon as a call resolves;
    a turn larger than the cap still runs every call."""
    client = make(fleet.redis_url, namespace=fleet.namespace, max_in_flight=2, submit_timeout_s=0.3)
    busy = [client.submit(F + "async_sleep", {"seconds": 0.8}) for _ in range(2)]
    started = time.monotonic()
    with pytest.raises(BackpressureError, match="max_in_flight"):
        client.submit(F + "add", {"a": 1, "b": 2})
    assert 0.28 <= time.monotonic() - started < 0.3 + LATE_S
    assert [client.result(f).content for f in busy] == [0.8, 0.8]
    assert client.call(F + "add", {"a": 1, "b": 2}).content == 3
    client = make(fleet.redis_url, namespace=fleet.namespace, max_in_flight=2, submit_timeout_s=5)
    busy = [client.submit(F + "async_sleep", {"seconds": 0.5}) for _ in range(2)]
    started = time.monotonic()
    assert client.call(F + "add", {"a": 1, "b": 2}).content == 3
    assert time.monotonic() - started >= 0.4  # it waited for a busy call to resolve
    assert [client.result(f).content for f in busy] == [0.5, 0.5]
    calls = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": F + "add", "arguments": f'{{"a": {i}, "b": 100}}'}}
        for i in range(5)
    ]  # fmt: skip
    messages = client.dispatch(calls, timeout_s=10)
    assert [m["content"] for m in messages] == [str(100 + i) for i in range(5)]


def test_full_queue_refuses_new_calls(
    redis_url: str, idle_namespace: str, make: Callable[..., Either]
) -> None:
    """A queue at TOOLFLEET_MAX_QUEUE_LENGTH answers new calls rejected at once, from this
    client's own count and from a fresh client's read of the queue's length."""
    settings = Settings(redis_url=redis_url, namespace=idle_namespace, max_queue_length=3)
    client = make(settings=settings)
    futures = [client.submit(IDLE, {"x": i}, timeout_s=30) for i in range(5)]
    assert client.in_flight == 3
    refused = [client.result(f, 1) for f in futures[3:]]
    assert [r.status for r in refused] == [Status.REJECTED] * 2
    assert "TOOLFLEET_MAX_QUEUE_LENGTH" in (refused[0].error or "")
    # the client publishes what submit gathered behind it: a fresh client sees the three
    # once they are on the queue
    r = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while r.hlen(f"{idle_namespace}:{IDLE_QUEUE}.msgs") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        r.close()
    late = make(settings=settings).call(IDLE, {"x": 9}, timeout_s=30)
    assert late.status is Status.REJECTED and "holds 3 calls" in (late.error or "")
    client.close(wait=False)
    assert all(client.result(f, 1).status is Status.TIMEOUT for f in futures[:3])


def test_close_resolves_pending_calls_and_refuses_new_ones(
    redis_url: str, idle_namespace: str, make: Callable[..., Either]
) -> None:
    """close(wait=False) resolves calls in flight timeout; a closed client raises ClientError."""
    client = make(redis_url, namespace=idle_namespace)
    future = client.submit(IDLE, {}, timeout_s=30)
    client.close(wait=False)
    result = client.result(future)
    assert result.status is Status.TIMEOUT and "closed" in (result.error or "")
    with pytest.raises(ClientError, match="closed"):
        client.submit(IDLE, {})


# -- the shells share no code ----------------------------------------------------------------


class _Erase(ast.NodeTransformer):
    """Every name, string (f-strings too) and number made the same."""

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        return ast.Constant(0)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(0)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name("_", node.ctx)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("attr", "arg", "name"):
            if isinstance(getattr(node, field, None), str):
                setattr(node, field, "_")
        return super().generic_visit(node)


def _shape(path: Path) -> list[str]:
    """One normalised line per statement: names, strings and numbers erased (keywords,
    ``async``/``await`` included, kept), docstrings and imports left out, so that code of
    the same shape under other names compares equal (what the duplicates tool compares)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [  # type: ignore[attr-defined]
                n for n in body
                if not isinstance(n, (ast.Import, ast.ImportFrom))
                and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
            ] or [ast.Pass()]  # fmt: skip
    tree = _Erase().visit(tree)
    return [line.strip() for line in ast.unparse(tree).splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("one", "other"),
    [("client.py", "async_client.py"), ("listener.py", "async_listener.py")],
)
def test_the_two_shells_share_no_six_line_block(one: str, other: str) -> None:
    """The sync and async modules repeat no run of 6 statement lines, even renamed: what
    they share lives once in the core."""
    window = 6
    mine = _shape(PRODUCER / one)
    theirs = _shape(PRODUCER / other)
    seen = {tuple(theirs[i : i + window]) for i in range(len(theirs) - window + 1)}
    shared = [
        "\n".join(mine[i : i + window])
        for i in range(len(mine) - window + 1)
        if tuple(mine[i : i + window]) in seen
    ]
    assert not shared, shared[0]


def test_the_shape_check_finds_a_renamed_copy(tmp_path: Path) -> None:
    """The shape comparison sees a block copied with other names, numbers and strings."""
    one, other = tmp_path / "one.py", tmp_path / "other.py"
    one.write_text("def f(a):\n" + "".join(f"    x{i} = a.get({i})\n" for i in range(6)))
    other.write_text("def g(b):\n" + "".join(f"    y{i} = b.get({i} + 1)\n" for i in range(6)))
    assert _shape(one) != _shape(other)  # a different expression stays different
    other.write_text("def g(b):\n" + "".join(f"    y{i} = b.put('{i}')  # x\n" for i in range(6)))
    assert _shape(one) == _shape(other)
