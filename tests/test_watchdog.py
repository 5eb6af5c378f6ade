"""Thread tools that hold the GIL are answered at their limit from outside the process."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from conftest import LATE_S, Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.naming import brokers_key, inflight_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult, new_call_id
from toolfleet.worker.pipeline.ledger import MIN_ANSWER_S, InFlight
from toolfleet.worker.supervision.watchdog import Watchdog

P = "ext_promise_"


@pytest.fixture
def hog_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process of two threads serving the promise tools."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-hog-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("hog") / "worker.log",
        processes=1,
        threads=2,
        extra=["--extension", "promise_tools:extension"],
    )
    yield fleet
    fleet.stop()


def test_gil_holding_thread_tool_is_answered_timeout_and_the_process_replaced(
    hog_fleet: Fleet,
) -> None:
    """A thread tool holding the GIL for 20 s with a 1 s limit is answered timeout within
    1.5 s (plus ``LATE_S``); a call to another tool sent to that process meanwhile is
    answered ok by its own 8 s deadline; the log names the tool that hogged the process."""
    with ToolClient(hog_fleet.redis_url, namespace=hog_fleet.namespace) as client:
        started = time.monotonic()
        hog = client.submit(P + "hog", {"seconds": 20}, timeout_s=30)
        time.sleep(0.3)
        quick = client.submit(P + "quick", {}, timeout_s=8)
        result = hog.result(timeout=30)
        hog_s = time.monotonic() - started
        assert result.status is Status.TIMEOUT, result
        assert hog_s < 1.5 + LATE_S, f"answered after {hog_s:.2f} s"
        other = quick.result(timeout=30)
        assert other.status is Status.OK, other
        print(f"\nGIL hog: timeout after {hog_s:.2f} s; the other call answered ok after "
              f"{time.monotonic() - started - 0.3:.2f} s")  # fmt: skip
    log = hog_fleet.log()
    assert f"tool {P}hog held worker process" in log
    assert "replacing the process" in log


def test_late_result_after_the_watchdog_answered_is_discarded(hog_fleet: Fleet) -> None:
    """A thread tool holding the GIL for 2 s with a 1 s limit: one reply (timeout, from the
    watchdog), the tool's late result is discarded, and the process is not replaced."""
    r = redis.Redis.from_url(hog_fleet.redis_url)
    reply_to = f"{hog_fleet.namespace}:reply:hog-{uuid.uuid4().hex}"
    pids = hog_fleet.worker_pids()
    try:
        with ToolClient(hog_fleet.redis_url, namespace=hog_fleet.namespace) as client:
            request = ToolCallRequest(
                id=new_call_id(), function=P + "hog", arguments={"seconds": 2},
                reply_to=reply_to, deadline=time.time() + 20, timeout_s=20,
            )  # fmt: skip
            client._publisher.publish("tools.promise", request)  # noqa: SLF001 - raw reply list
            time.sleep(4)
            assert client.call(P + "quick", {}, timeout_s=5).status is Status.OK
        items = [ReplyEnvelope.decode(item) for item in r.lrange(reply_to, 0, -1)]
        results = [e.result for e in items if e.result is not None]
        assert [x.status for x in results] == [Status.TIMEOUT]
        assert _same_processes(hog_fleet, pids)
        assert "result of ext_promise_hog (call" in hog_fleet.log()
        assert "discarded" in hog_fleet.log()
    finally:
        r.delete(reply_to)
        r.close()


def _same_processes(fleet: Fleet, pids: list[int]) -> bool:
    """True when the fleet still runs the same worker processes."""
    return sorted(fleet.worker_pids()) == sorted(pids)


def test_watchdog_answers_overdue_calls_once_and_counts_them(
    redis_url: str, namespace: str
) -> None:
    """A record past its answer time is answered timeout once, counted by function, and its
    process replaced after the grace period unless it heartbeated since."""
    r = redis.Redis.from_url(redis_url)
    ns = f"{namespace}-wd-{uuid.uuid4().hex[:6]}"
    worker_id = f"{socket.gethostname()}:4242"
    replaced: list[int] = []
    watchdog = Watchdog(r, ns, 60, lambda: {worker_id: 4242}, replaced.append, grace_s=0.5)
    reply_to = f"{ns}:reply:x"
    record = InFlight(id="call-1", function="ext_x_slow", reply_to=reply_to, answer_by=100.0,
                      limit_s=1.0)  # fmt: skip
    r.hset(inflight_key(ns, worker_id), "call-1", record.model_dump_json())
    try:
        watchdog.check(now=99.0)  # not due yet
        assert r.llen(reply_to) == 0
        watchdog.check(now=100.3)
        watchdog.check(now=100.4)  # answered already: nothing more
        replies = [ReplyEnvelope.decode(x).result for x in r.lrange(reply_to, 0, -1)]
        assert len(replies) == 1 and isinstance(replies[0], ToolCallResult)
        assert replies[0].status is Status.TIMEOUT and replies[0].id == "call-1"
        assert not replaced
        # a process that heartbeats after the watchdog answered is slow, not hogged
        r.hset(brokers_key(ns), worker_id, "broker-1")
        r.zadd(f"{ns}:__heartbeats__", {"broker-1": 100_500})
        watchdog.check(now=100.9)
        assert not replaced
        r.zadd(f"{ns}:__heartbeats__", {"broker-1": 100_000})
        watchdog.check(now=101.0)
        assert replaced == [4242]
        samples = {s.labels["function"]: s.value for m in watchdog.collect() for s in m.samples}
        assert samples == {"ext_x_slow": 1.0}
    finally:
        for key in r.scan_iter(match=f"{ns}*"):
            r.delete(key)
        r.close()


def test_idle_watchdog_looks_less_often_yet_answers_a_new_call_in_time(
    redis_url: str, namespace: str
) -> None:
    """With nothing in flight the watchdog pauses longer, but a call claimed right after an
    empty check is read before it falls due (its record is due MIN_ANSWER_S + margin later)."""
    r = redis.Redis.from_url(redis_url)
    ns = f"{namespace}-wdidle-{uuid.uuid4().hex[:6]}"
    worker_id = f"{socket.gethostname()}:4343"
    watchdog = Watchdog(r, ns, 60, lambda: {worker_id: 4343}, lambda pid: None)
    try:
        assert watchdog.idle_interval_s > watchdog.interval_s
        assert watchdog.check(now=time.time()) == 0
        reply_to = f"{ns}:reply:y"
        watchdog.start()
        time.sleep(0.05)  # a check may have just run: the next one is an idle pause away
        claimed = time.time()
        record = InFlight(id="call-2", function="ext_x_hog", reply_to=reply_to,
                          answer_by=claimed + MIN_ANSWER_S, limit_s=0.0)  # fmt: skip
        r.hset(inflight_key(ns, worker_id), "call-2", record.model_dump_json())
        assert watchdog.check(now=claimed) == 1  # read, not yet due
        assert r.brpop([reply_to], timeout=30) is not None  # answered timeout by the thread
        assert watchdog.idle_interval_s <= MIN_ANSWER_S + watchdog.margin_s - watchdog.interval_s
    finally:
        watchdog.stop()
        for key in r.scan_iter(match=f"{ns}*"):
            r.delete(key)
        r.close()
