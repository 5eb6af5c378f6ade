"""Per-tool concurrency limits (fleet-wide, leased slots) and circuit breakers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import orjson
import pytest
import redis
from tenancy_tools import FLAKY_COOLDOWN_S, record_key, wait_out_the_cooldown

from conftest import Fleet, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import catalog_key, claim_key, inflight_key
from toolfleet.shared.tenancy.breakers import breaker_key
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, new_call_id
from toolfleet.worker.tenancy.concurrency import concurrency_key

LIMITED = "ext_tenancy_test_limited"
POOLED = "ext_tenancy_test_pooled"
HOLD = "ext_tenancy_test_hold"
FLAKY = "ext_tenancy_test_flaky"
TALLY = "ext_tenancy_test_tally"


@pytest.fixture(scope="module")
def limits_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes of eight threads serving the limit-test tools."""
    ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
    log = tmp_path_factory.mktemp("limits") / "worker.log"
    running = start_fleet(
        redis_url, ns, log, processes=2, threads=8,
        extra=["--extension", "tenancy_tools:extension"],
    )  # fmt: skip
    yield running
    running.stop()


@pytest.fixture
def r(limits_fleet: Fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(limits_fleet.redis_url)
    yield client
    client.close()


@pytest.fixture
def tc(limits_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(limits_fleet.redis_url, namespace=limits_fleet.namespace) as client:
        yield client


def test_the_catalog_shows_declared_limits(r: redis.Redis, limits_fleet: Fleet) -> None:
    """Catalog entries carry a tool's declared concurrency and breaker policy."""
    entries = {
        name.decode(): orjson.loads(raw)
        for name, raw in r.hgetall(catalog_key(limits_fleet.namespace)).items()
    }
    assert entries[LIMITED]["concurrency"] == 3 and entries[LIMITED]["breaker"] is None
    assert entries[FLAKY]["breaker"]["failures"] == 5
    assert entries[FLAKY]["breaker"]["on"] == ["timeout", "crashed"]


def test_a_limited_tool_never_runs_more_than_its_limit_across_processes(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """200 calls of a tool limited to 3: all run, never more than 3 at once, on both workers."""
    futures = [tc.submit(LIMITED, {"seconds": 0.03}, timeout_s=60) for _ in range(200)]
    results = [f.result(timeout=90) for f in futures]
    assert [res.status for res in results] == [Status.OK] * 200, results[0].content
    seen = [int(v) for v in r.lrange(record_key(limits_fleet.namespace, "seen"), 0, -1)]
    assert len(seen) == 200
    assert max(seen) == 3  # the limit was reached, and never passed
    assert len({res.worker for res in results}) == 2  # both processes ran it


def test_a_call_without_a_slot_by_its_deadline_is_answered_timeout_without_running(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """Once the one slot is held (for 2.5 s), a call with a 1.5 s budget comes back timeout,
    never run (the budget leaves a loaded machine time to fetch the call before its
    deadline, so it waits for the slot rather than arriving expired)."""
    pids_key = record_key(limits_fleet.namespace, "hold_pids")
    r.delete(pids_key)
    holder = tc.submit(HOLD, {"seconds": 2.5}, timeout_s=10)
    assert _wait_for(lambda: bool(r.llen(pids_key)), 10) is not None, "the holder never ran"
    late = tc.call(HOLD, {"seconds": 0.01}, timeout_s=1.5)
    assert late.status == Status.TIMEOUT
    assert holder.result().status == Status.OK
    assert r.llen(pids_key) == 1  # the late call never ran


def test_a_slot_held_by_a_sigkilled_worker_comes_back_when_its_lease_ends(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """SIGKILL the worker holding the only slot: the next call gets the slot and runs."""
    pids_key = record_key(limits_fleet.namespace, "hold_pids")
    r.delete(pids_key)
    # Given a worker process holding the tool's only slot
    doomed = tc.submit(HOLD, {"seconds": 2.5}, timeout_s=10)
    deadline = time.monotonic() + 10
    while not r.llen(pids_key) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(r.lindex(pids_key, 0))
    assert r.zcard(concurrency_key(limits_fleet.namespace, HOLD)) == 1  # it holds the slot
    # When it is SIGKILLed while holding it
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.result(timeout=30)
    # Then a new call gets the slot once the lease ends, and runs
    after = tc.call(HOLD, {"seconds": 0.01}, timeout_s=20)
    assert after.status == Status.OK, after.content
    waited = time.monotonic() - killed_at
    assert waited < 12, waited  # lease: the 3 s time limit + 2 s margin (and restart slack)


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``predicate()`` held (polled every 10 ms), or None if not in time."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.01)
    return None


def _freeze_a_slot_holder(
    r: redis.Redis, limits_fleet: Fleet, slot_set: str, timeout_s: float
) -> tuple[int, set[str], set[str]]:
    """SIGSTOP a worker process that holds a slot of ``slot_set``.

    Returns:
        Its pid, the ids of the calls it holds (claimed, unanswered) and those of them
        holding a slot, read while it is frozen.
    """
    host = socket.gethostname()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in limits_fleet.worker_pids():
            os.kill(pid, signal.SIGSTOP)
            calls = {
                c.decode() for c in r.hkeys(inflight_key(limits_fleet.namespace, f"{host}:{pid}"))
            }
            leases = {m.decode() for m in r.zrange(slot_set, 0, -1)}
            if calls & leases:
                return pid, calls, calls & leases
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError(f"no worker process held a slot of {slot_set} within {timeout_s} s")


def test_a_sigkilled_workers_slots_are_freed_with_its_recovery_and_waiting_calls_run(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """A SIGKILLed worker's slot leases go with its recovery; waiting calls run, none time out."""
    ns = limits_fleet.namespace
    slot_set = concurrency_key(ns, POOLED)
    # Given 150 calls of a tool limited to 3 (30 s time limit: 32 s leases) on 2 processes
    futures = [tc.submit(POOLED, {"seconds": 0.1}, timeout_s=60) for _ in range(150)]
    time.sleep(1.0)
    # When a process holding some of its slots is SIGKILLed
    victim, victim_calls, victim_leases = _freeze_a_slot_holder(r, limits_fleet, slot_set, 10)
    victim_id = f"{socket.gethostname()}:{victim}"
    os.kill(victim, signal.SIGKILL)
    # Then its leases leave the slot set within a few seconds, not when they end
    freed = _wait_for(
        lambda: not victim_leases & {m.decode() for m in r.zrange(slot_set, 0, -1)}, 3.0
    )
    assert freed is not None, f"leases of the dead process still held 3 s after: {victim_leases}"
    # And the calls waiting take every slot again at once
    retaken = _wait_for(lambda: r.zcard(slot_set) == 3, 2.0)
    assert retaken is not None, f"{r.zcard(slot_set)} of 3 slots held 2 s after the release"
    results = {f.result(timeout=70).id: f.result() for f in futures}
    # And every call is answered: the dead process's calls crashed, all the others ok
    timed_out = [res.content for res in results.values() if res.status is Status.TIMEOUT]
    assert not timed_out, (len(timed_out), timed_out[:3])
    crashed = {call_id for call_id, res in results.items() if res.status is Status.CRASHED}
    assert crashed == victim_calls, (sorted(crashed), sorted(victim_calls))
    for call_id in crashed:
        assert r.get(claim_key(ns, call_id)).decode().startswith(f"{victim_id}#")  # type: ignore[union-attr]
    others = [res for call_id, res in results.items() if call_id not in crashed]
    assert all(res.status is Status.OK for res in others), {res.status for res in others}
    print(f"\nSIGKILL of a process holding {len(victim_leases)} of 3 slots: leases freed in "
          f"{freed:.2f} s, slots retaken {retaken:.2f} s later; {len(crashed)} crashed, "
          f"{len(others)} ok")  # fmt: skip
    limits_fleet.wait_ready()  # its replacement serves the next tests


def test_a_sigkill_answers_crashed_only_for_calls_whose_tool_started(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """Calls waiting for a fleet-wide slot are not claimed: a SIGKILL re-serves them.

    A call that never started its tool is never answered ``crashed``: only a call whose
    run its process did not survive (a start the tool recorded, with no finish) may be.
    """
    started_key = record_key(limits_fleet.namespace, "tally_started")
    finished_key = record_key(limits_fleet.namespace, "tally_finished")
    r.delete(started_key, finished_key)
    # Given many calls of a non-idempotent tool limited to 1 at once, fleet-wide, in flight
    futures = [tc.submit(TALLY, {"seconds": 0.4}, timeout_s=60) for _ in range(14)]
    # When the worker process running one of them is SIGKILLed while the others wait
    assert _wait_for(lambda: r.hlen(started_key) > 0, 20.0) is not None, "no call started"
    pid = int(next(iter(r.hvals(started_key))))
    os.kill(pid, signal.SIGKILL)
    # Then every call is answered, once
    results = [future.result(timeout=90) for future in futures]
    assert len({res.id for res in results}) == len(futures)
    # And only calls whose tool started and did not finish may be answered crashed
    started = {key.decode() for key in r.hkeys(started_key)}
    finished = {key.decode() for key in r.hkeys(finished_key)}
    unfinished = started - finished
    crashed = {res.id for res in results if res.status is Status.CRASHED}
    assert crashed <= unfinished, (sorted(crashed - unfinished), len(crashed), len(unfinished))
    others = {res.status for res in results if res.id not in crashed}
    assert others <= {Status.OK}, others
    print(f"\nSIGKILL with 14 calls of a tool limited to 1: {len(crashed)} crashed, "
          f"{len(unfinished)} started and unfinished, {len(finished)} finished")  # fmt: skip
    limits_fleet.wait_ready()  # its replacement serves the next tests


def test_a_redelivered_call_of_a_dead_worker_gives_back_the_slot_it_held(
    r: redis.Redis, limits_fleet: Fleet
) -> None:
    """A call whose claim names a dead worker frees that worker's lease when it is answered."""
    ns = limits_fleet.namespace
    slot_set = concurrency_key(ns, POOLED)
    reply_to = f"{ns}:reply:ghost-{uuid.uuid4().hex[:6]}"
    now = time.time()
    request = ToolCallRequest(
        id=new_call_id(),
        function=POOLED,
        arguments={"seconds": 0.0},
        reply_to=reply_to,
        deadline=now + 20,
        timeout_s=20.0,
        sent_at=now,
    )
    # Given a worker of another host that claimed the call, took a slot for it, and died
    r.set(claim_key(ns, request.id), "gone-host:1#0123456789ab", ex=60)
    r.zadd(slot_set, {request.id: int((now + 30) * 1000)})
    # When the call is delivered again (as Dramatiq's maintenance hands it back)
    assert Publisher(r, ns).publish("tools.tenancy-test", request) is None
    popped = r.blpop([reply_to], timeout=15)
    assert popped is not None, "no reply"
    result = ReplyEnvelope.decode(popped[1]).result
    # Then it is answered crashed, and the dead delivery's lease is gone
    assert result is not None and result.status is Status.CRASHED, result
    assert r.zscore(slot_set, request.id) is None
    r.delete(reply_to)


def test_a_failing_tool_opens_its_breaker_then_a_probe_closes_it(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """5 crashes in a row open the breaker; calls are refused unrun; one probe; success closes."""
    ns = limits_fleet.namespace
    runs_key, fail_key = record_key(ns, "flaky_runs"), record_key(ns, "flaky_fail")
    r.delete(runs_key, breaker_key(ns, FLAKY))
    r.set(fail_key, 1)
    # Given 5 failures in a row
    for _ in range(5):
        assert tc.call(FLAKY, {"seconds": 0.0}).status == Status.CRASHED
    assert r.hget(breaker_key(ns, FLAKY), "state") == b"open"
    # Then the next calls are answered at once, without running
    refused_ms = []
    for _ in range(5):
        started = time.perf_counter()
        refused = tc.call(FLAKY, {"seconds": 0.0})
        refused_ms.append((time.perf_counter() - started) * 1000)
        assert refused.status == Status.NOT_AVAILABLE
        assert 0 < refused.content["retry_after_s"] <= FLAKY_COOLDOWN_S
        assert "temporarily unavailable" in refused.content["error"]
        assert not refused.run_s
    print(f"\nbreaker refusals, ms end to end: {sorted(round(ms, 1) for ms in refused_ms)}")
    assert int(r.get(runs_key)) == 5
    top = subprocess.run(
        [toolfleet_command(), "--redis-url", limits_fleet.redis_url, "--namespace", ns,
         "top", "--once"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert top.returncode == 0, top.stderr
    assert any(FLAKY in line and " open " in line for line in top.stdout.splitlines()), top.stdout
    # When the cool-down passes and the backend is back, one probe runs
    r.delete(fail_key)
    wait_out_the_cooldown(r, breaker_key(ns, FLAKY))
    probe = tc.submit(FLAKY, {"seconds": 3.0})
    deadline = time.monotonic() + 30
    while int(r.get(runs_key) or 0) < 6:  # the probe has started (it runs for 3 s)
        assert time.monotonic() < deadline, "the probe never ran"
        time.sleep(0.01)
    meanwhile = tc.call(FLAKY, {"seconds": 0.0})
    assert meanwhile.status == Status.NOT_AVAILABLE  # half-open: only the probe runs
    assert probe.result().status == Status.OK
    # Then its success closes the breaker
    assert r.hget(breaker_key(ns, FLAKY), "state") == b"closed"
    assert tc.call(FLAKY, {"seconds": 0.0}).status == Status.OK
    assert int(r.get(runs_key)) == 7


def test_a_worker_refuses_a_published_call_once_the_breaker_opened(
    tc: ToolClient, r: redis.Redis, limits_fleet: Fleet
) -> None:
    """A call published before its breaker opened is answered not_available by the worker, unrun."""
    ns = limits_fleet.namespace
    runs_key = record_key(ns, "flaky_runs")
    r.delete(runs_key, breaker_key(ns, FLAKY), record_key(ns, "flaky_fail"))
    # Given every worker process frozen (SIGSTOP), so that none can take a call yet
    limits_fleet.wait_ready(timeout_s=60)
    pids = limits_fleet.worker_pids()
    assert len(pids) == limits_fleet.processes, pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # and a call of FLAKY published: on its queue (the client's publisher thread sends
        # what submit gathered, so wait until the message is there, under the call's id)
        queued = tc.submit(FLAKY, {"seconds": 0.0})
        waiting = f"{ns}:tools.tenancy-test.msgs"
        deadline = time.monotonic() + 30
        while not r.hexists(waiting, queued.call_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.hexists(waiting, queued.call_id), (
            "the call was never published",
            queued.result(timeout=0) if queued.done() else "no answer yet",
        )
        # When its breaker opens before a worker takes it
        until_ms = int((time.time() + 5) * 1000)
        r.hset(breaker_key(ns, FLAKY), mapping={"state": "open", "until": until_ms})
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    result = queued.result(timeout=30)
    # Then the worker answers it without running it
    assert result.status == Status.NOT_AVAILABLE, result.content
    assert 0 < result.content["retry_after_s"] <= 5
    assert result.worker  # answered by a worker, not the producer
    assert r.get(runs_key) is None
    r.delete(breaker_key(ns, FLAKY))
