"""A conversation routed to a slot whose supervisor died falls back at once.

Real Redis and real ``toolfleet worker`` supervisors with the production heartbeat
lifetime (``worker_ttl_s`` 10 s): the supervisor holding a conversation's session is
SIGKILLed (its worker processes die with it) and a new one starts on the host; the
conversation's next call runs in the new process at once, with fresh state that says
why, instead of waiting on the dead slot's queue until its deadline.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import redis

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.affinity import Route, decode_route, encode_route
from toolfleet.shared.naming import (
    affinity_queue_for,
    route_key,
    slot_name,
    slots_key,
    workers_key,
)

QUEUE = "tools.affinity-test"
REMEMBER = "ext_affinity_test_remember"
#: the production heartbeat lifetime: a hard-killed slot's heartbeats stay this fresh
ENV = {"TOOLFLEET_WORKER_TTL_S": "10"}


def _start(redis_url: str, ns: str, log: Path) -> Fleet:
    return start_fleet(redis_url, ns, log, processes=1, threads=2,
                       extra=["--extension", "affinity_tools:extension"], ready_queue=QUEUE,
                       env=ENV)  # fmt: skip


def test_a_route_to_a_killed_supervisors_slot_falls_back_at_once(
    redis_url: str, namespace: str, tmp_path: Path, r: redis.Redis
) -> None:
    """SIGKILL the supervisor holding a conversation, start another: the next call is
    answered ok by the new process with fresh state naming the gone holder."""
    ns = f"{namespace}-slot-{uuid.uuid4().hex[:6]}"
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    context = {"account": "acme", "conversation": conversation}
    first_fleet = _start(redis_url, ns, tmp_path / "first.log")
    second_fleet = None
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            first = client.call(REMEMBER, {"value": 5}, context=context, timeout_s=20)
            assert first.status is Status.OK, first
            again = client.call(REMEMBER, {}, context=context, timeout_s=20)
            assert again.content == {"before": 5, "session_lost": None}, again
            route = decode_route(r.get(route_key(ns, "acme", conversation, REMEMBER)))
            assert route is not None and route.worker == first.worker
            pids = first_fleet.worker_pids()
            os.kill(first_fleet.process.pid, signal.SIGKILL)  # the pod's supervisor, at once
            first_fleet.process.wait()
            deadline = time.monotonic() + 10
            while any(os.path.exists(f"/proc/{p}") for p in pids):
                assert time.monotonic() < deadline, "the killed supervisor's workers live on"
                time.sleep(0.05)
            second_fleet = _start(redis_url, ns, tmp_path / "second.log")
            after = client.call(REMEMBER, {"value": 6}, context=context, timeout_s=15)
        assert after.status is Status.OK, after
        assert after.worker != first.worker
        assert after.content["before"] is None
        assert str(first.worker) in str(after.content["session_lost"]), after.content
    finally:
        if second_fleet is not None:
            second_fleet.stop()
        first_fleet.stop()


def test_calls_routed_to_a_slot_of_another_host_are_handed_back_once_it_stops_beating(
    redis_url: str, namespace: str, tmp_path: Path, r: redis.Redis
) -> None:
    """A slot of another host (a pod gone outright) beat last just now: the call routed
    there is handed back as soon as the slot's beat is older than ``worker_ttl_s``, the
    age at which producers stop routing there, and answered within its deadline."""
    ns = f"{namespace}-slot-{uuid.uuid4().hex[:6]}"
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    context = {"account": "acme", "conversation": conversation}
    env = {"TOOLFLEET_WORKER_TTL_S": "4"}
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1, threads=2,
                        extra=["--extension", "affinity_tools:extension"], ready_queue=QUEUE,
                        env=env)  # fmt: skip
    gone = affinity_queue_for(QUEUE, slot_name("elsewhere", 1, 0))
    try:
        r.hset(slots_key(ns), gone, QUEUE)
        r.zadd(workers_key(ns, gone), {"elsewhere:1": time.time()})  # its last beat
        r.set(route_key(ns, "acme", conversation, REMEMBER),
              encode_route(Route(gone, "elsewhere:1")), ex=60)  # fmt: skip
        with ToolClient(redis_url, namespace=ns) as client:
            after = client.call(REMEMBER, {"value": 1}, context=context, timeout_s=10)
        assert after.status is Status.OK, after
        assert "elsewhere:1" in str(after.content["session_lost"]), after.content
    finally:
        fleet.stop()
