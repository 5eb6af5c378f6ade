"""Exactly once under duplicate delivery: one run and one reply per request id, whoever delivers."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import encode_message
from toolfleet.shared import Status, codec
from toolfleet.shared.naming import events_key, outcome_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, new_call_id

QUEUE = "tools.promise"
FUNCTION = "ext_promise_side_effect"


@pytest.fixture(scope="module")
def once_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes of four threads serving the promise tools."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-once-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("once") / "worker.log",
        processes=2,
        threads=4,
        extra=["--extension", "promise_tools:extension"],
    )
    yield fleet
    fleet.stop()


def _enqueue(r: redis.Redis, namespace: str, request: ToolCallRequest) -> str:
    """Publish one more Dramatiq message carrying ``request``; return its Redis id."""
    redis_id, body = encode_message(QUEUE, request)
    pipe = r.pipeline(transaction=False)
    pipe.hset(f"{namespace}:{QUEUE}.msgs", redis_id, body)
    pipe.rpush(f"{namespace}:{QUEUE}", redis_id)
    pipe.execute()
    return redis_id


def _results(r: redis.Redis, reply_to: str) -> list[ReplyEnvelope]:
    return [
        envelope
        for envelope in (ReplyEnvelope.decode(item) for item in r.lrange(reply_to, 0, -1))
        if envelope.type == "result"
    ]


def test_twenty_deliveries_run_a_side_effect_tool_once_with_one_reply(
    once_fleet: Fleet, tmp_path: Path
) -> None:
    """20 deliveries of one request id (10 concurrent, 4 re-fetches of the same message while
    it runs, 6 more later) on 2 processes: the tool runs once and exactly one reply is posted."""
    r = redis.Redis.from_url(once_fleet.redis_url)
    ns = once_fleet.namespace
    key = f"{ns}:runs:{uuid.uuid4().hex}"
    reply_to = f"{ns}:reply:once-{uuid.uuid4().hex}"
    request = ToolCallRequest(
        id=new_call_id(),
        function=FUNCTION,
        arguments={"key": key, "seconds": 1.5},
        reply_to=reply_to,
        deadline=time.time() + 30,
        timeout_s=30,
    )
    try:
        # Given 10 deliveries at once, spread over both processes' threads
        threads = [threading.Thread(target=_enqueue, args=(r, ns, request)) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 10
        while r.get(key) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.get(key) == b"1", "the tool never started"
        # When the same message comes back while the call runs (a worker re-fetching its
        # own requeued message), and 6 more deliveries arrive, during and after the run
        first = _enqueue(r, ns, request)
        for _ in range(4):
            r.lpush(f"{ns}:{QUEUE}", first)
        for _ in range(3):
            _enqueue(r, ns, request)
        deadline = time.monotonic() + 15
        while not _results(r, reply_to) and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(2):
            _enqueue(r, ns, request)
        # Then every delivery is settled, the tool ran once, and one reply went out
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (
            r.llen(f"{ns}:{QUEUE}") or r.hlen(f"{ns}:{QUEUE}.msgs")
        ):
            time.sleep(0.05)
        time.sleep(0.5)
        assert r.llen(f"{ns}:{QUEUE}") == 0 and r.hlen(f"{ns}:{QUEUE}.msgs") == 0
        assert r.get(key) == b"1"
        results = _results(r, reply_to)
        assert len(results) == 1, [e.result.status if e.result else e for e in results]
        assert results[0].result is not None and results[0].result.content == 1
        assert "duplicate delivery dropped" in once_fleet.log()
    finally:
        r.delete(key, reply_to)
        r.close()


def _delivered_twice(r: redis.Redis, ns: str, index: int) -> tuple[float | None, list[str], int]:
    """Publish one request twice (together, one after the other, or the second later); return
    the seconds its first reply took (None: none within 5 s), its replies' statuses and runs."""
    key = f"{ns}:runs:{uuid.uuid4().hex}"
    reply_to = f"{ns}:reply:twice-{uuid.uuid4().hex}"
    request = ToolCallRequest(
        id=new_call_id(),
        function=FUNCTION,
        arguments={"key": key, "seconds": 0.05},
        reply_to=reply_to,
        deadline=time.time() + 30,
        timeout_s=30,
    )
    try:
        published = time.monotonic()
        if index % 3 == 0:
            both = [threading.Thread(target=_enqueue, args=(r, ns, request)) for _ in range(2)]
            for thread in both:
                thread.start()
            for thread in both:
                thread.join()
        else:
            _enqueue(r, ns, request)
            time.sleep(0.0 if index % 3 == 1 else 0.2)
            _enqueue(r, ns, request)
        took: float | None = None
        while took is None and time.monotonic() - published < 5:
            if _results(r, reply_to):
                took = time.monotonic() - published
            else:
                time.sleep(0.02)
        time.sleep(0.3)  # a second reply would be posted by now (the other delivery is done)
        statuses = [e.result.status.value for e in _results(r, reply_to) if e.result is not None]
        return took, statuses, int(r.get(key) or 0)
    finally:
        r.delete(key, reply_to)


def test_every_request_delivered_twice_gets_its_one_reply_within_5_s(once_fleet: Fleet) -> None:
    """60 requests each published twice, 6 at a time: every one has exactly one ok reply on its
    reply list within 5 s of publishing, and its tool ran once."""
    r = redis.Redis.from_url(once_fleet.redis_url)
    try:
        with ThreadPoolExecutor(6) as pool:
            runs = list(pool.map(lambda i: _delivered_twice(r, once_fleet.namespace, i), range(60)))
    finally:
        r.close()
    assert [run for run in runs if run[0] is None] == []
    assert [run for run in runs if run[1:] != (["ok"], 1)] == []


def test_calls_the_producer_resolved_get_no_worker_reply_and_late_pickups_are_expired(
    once_fleet: Fleet,
) -> None:
    """Calls resolved timeout by the producer get no worker reply (none late); one picked
    up after its deadline is recorded expired, not canceled, and not run."""
    r = redis.Redis.from_url(once_fleet.redis_url)
    ns = once_fleet.namespace
    key = f"{ns}:runs:{uuid.uuid4().hex}"
    with ToolClient(once_fleet.redis_url, namespace=ns) as client:
        # Given every worker thread (2 x 4) busy for 3 s, with as many calls queued behind
        busy = [
            client.submit(FUNCTION, {"key": f"{key}-busy", "seconds": 3}, timeout_s=20)
            for _ in range(16)
        ]
        time.sleep(0.5)
        # When one call times out at the producer while still queued, and 8 while running
        queued = client.submit(FUNCTION, {"key": key}, timeout_s=1)
        assert queued.result().status is Status.TIMEOUT
        assert all(f.result().status is Status.OK for f in busy)
        stuck = [client.submit("ext_promise_wait", {}, timeout_s=1) for _ in range(8)]
        # timeout, or the worker's own expired where it picked one up past the deadline
        # just before the producer's marker: then the producer delivers that recorded
        # outcome instead (its reply is no late reply)
        assert {f.result().status for f in stuck} <= {Status.TIMEOUT, Status.EXPIRED}
        time.sleep(2.0)
        # Then no worker reply arrived after the producer resolved them
        assert client.late_replies == 0
    outcome = r.get(outcome_key(ns, queued.call_id))
    assert outcome is not None
    recorded = ReplyEnvelope.decode(outcome).result
    assert recorded is not None and recorded.status is Status.EXPIRED
    assert r.get(key) is None  # never ran
    r.delete(key, f"{key}-busy")
    r.close()


def test_a_running_call_past_its_deadline_is_recorded_timeout_not_canceled(
    once_fleet: Fleet,
) -> None:
    """A running call the producer resolves at its deadline is stopped by the worker and
    recorded, logged and counted ``timeout``: a deadline expiry is no cancellation."""
    r = redis.Redis.from_url(once_fleet.redis_url)
    ns = once_fleet.namespace
    with ToolClient(once_fleet.redis_url, namespace=ns) as client:
        # Given a call of a 30 s tool that a cancel stops, with a 1.5 s client timeout
        future = client.submit("ext_promise_wait", {}, timeout_s=1.5)
        # When its deadline passes while it runs
        assert future.result().status is Status.TIMEOUT
        call_id = future.call_id
        # Then the worker stops it and records its outcome as timeout
        outcome = None
        give_up = time.monotonic() + 15
        while outcome is None and time.monotonic() < give_up:
            outcome = r.get(outcome_key(ns, call_id))
            time.sleep(0.1)
        assert outcome is not None
        recorded = ReplyEnvelope.decode(outcome).result
        assert recorded is not None and recorded.status is Status.TIMEOUT
        assert recorded.worker is not None  # stopped by a worker, not left to the watchdog
        assert client.late_replies == 0
    # and its tool_responded event (what the fleet's call metrics count) and its log say so
    responded = [
        codec.loads(fields[b"event"])
        for _, fields in r.xrange(events_key(ns))
        if codec.loads(fields[b"event"]).get("id") == call_id
    ]
    assert [event["status"] for event in responded] == ["timeout"]
    assert f"ext_promise_wait {call_id}: timeout" in once_fleet.log()
    assert f"ext_promise_wait {call_id}: canceled" not in once_fleet.log()
    r.close()


def test_a_worker_killed_between_its_tools_end_and_their_write_answers_each_call_once(
    tmp_path: Path,
) -> None:
    """SIGKILL of a worker process whose calls' tools have ended while their write waits.

    Writes are held on a private Redis (``CLIENT PAUSE WRITE``) while 4 side-effect calls
    run, so when their tools end the finish script waits in flight; the process is then
    SIGKILLed, before any outcome is written. The redelivery rules answer each call:
    exactly one reply per call, and the non-idempotent tool never runs a second time.
    """
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        ns = f"tfkillwrite-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(
            server.url,
            ns,
            tmp_path / "worker.log",
            processes=1,
            threads=4,
            extra=["--extension", "promise_tools:extension"],
            env={"TOOLFLEET_BROKER_HEARTBEAT_TIMEOUT_S": "3"},
        )
        r = redis.Redis.from_url(server.url)
        try:
            reply_to = f"{ns}:reply:killed"
            requests = [
                ToolCallRequest(
                    id=new_call_id(),
                    function=FUNCTION,
                    arguments={"key": f"{ns}:runs:{i}", "seconds": 2.0},
                    reply_to=reply_to,
                    deadline=time.time() + 90,
                    timeout_s=20,
                )
                for i in range(4)
            ]
            for request in requests:
                _enqueue(r, ns, request)
            keys = [f"{ns}:runs:{i}" for i in range(4)]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(r.mget(keys)):
                time.sleep(0.02)
            assert all(r.mget(keys)), "the tools never all started"
            # Given every tool running, and writes held from now on
            r.client_pause(60_000, all=False)
            ending = [q for q in requests if not r.exists(outcome_key(ns, q.id))]
            assert ending, "every call was answered before writes were held"
            time.sleep(2.0 + 1.0)  # each tool's 2 s are over: its write waits
            waiting: list[str] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "evalsha" not in waiting:
                waiting = [c["cmd"] for c in r.client_list() if "b" in c["flags"]]
                time.sleep(0.1)
            assert "evalsha" in waiting, f"no write waits: {waiting}"
            # When the process is SIGKILLed before the write
            (victim,) = fleet.worker_pids()
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and victim in fleet.worker_pids():
                time.sleep(0.05)
            assert not any(r.exists(outcome_key(ns, q.id)) for q in ending), "written anyway"
            r.client_unpause()
            # Then each call gets exactly one reply, and no tool ran twice
            deadline = time.monotonic() + 80
            while time.monotonic() < deadline and len(_results(r, reply_to)) < len(requests):
                time.sleep(0.1)
            time.sleep(2.0)  # a second reply would arrive here
            results = _results(r, reply_to)
            ids = [envelope.result.id for envelope in results if envelope.result is not None]
            assert sorted(ids) == sorted(q.id for q in requests), (ids, fleet.log()[-3000:])
            assert [int(v or 0) for v in r.mget(keys)] == [1, 1, 1, 1]
            statuses = {e.result.status for e in results if e.result is not None}
            assert statuses <= {Status.CRASHED, Status.TIMEOUT}, statuses
            print(f"\nkilled between end and write: {len(ending)} calls waiting, answered "
                  f"{sorted(s.value for s in statuses)}, each once; no tool ran twice")  # fmt: skip
        finally:
            r.client_unpause()
            r.close()
            fleet.stop()
