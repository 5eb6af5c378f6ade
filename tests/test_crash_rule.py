"""The crash rule in the script that gives a dead broker's messages back, on a real Redis.

No worker processes: a broker fetches a message as a dead process would have, its call is
claimed in that process's name, and recovery (the supervisor's, then maintenance's) runs
the rule; the counts, the ``crashed`` reply and the dead letter are read back from Redis.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from conftest import delete_namespace
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status
from toolfleet.shared.naming import brokers_key, claim_key, crashes_key, outcome_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest
from toolfleet.worker.messaging.broker import make_broker
from toolfleet.worker.messaging.maintenance import record_broker_queues, run_maintenance
from toolfleet.worker.messaging.recovery import CrashRule, recover_dead_worker

QUEUE = "tools.crashrule"
RULE = CrashRule(reruns=2, reply_ttl_s=60)


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    namespace = f"tfcrash-{uuid.uuid4().hex[:8]}"
    yield namespace
    delete_namespace(redis_url, namespace)


def _request(ns: str) -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()), function="ext_crashrule_kill", arguments={},
        reply_to=f"{ns}:reply:test", deadline=now + 30, timeout_s=30.0, sent_at=now,
    )  # fmt: skip


def _die_running(redis_url: str, ns: str, r: redis.Redis, request: ToolCallRequest, worker: str,
                 *, claim: bool = True) -> str:  # fmt: skip
    """A broker of process ``worker`` fetches the call (and claims it): its Redis id."""
    dead = make_broker(redis_url, ns)
    try:
        fetched = dead.fetch_with_ids(QUEUE, 10)
        assert len(fetched) == 1
        r.hset(brokers_key(ns), worker, dead.broker_id)
        record_broker_queues(r, ns, dead.broker_id, [QUEUE])
        if claim:
            r.set(claim_key(ns, request.id), f"{worker}#abc", ex=60)
        return fetched[0][0]
    finally:
        dead.client.close()


def test_the_third_death_answers_crashed_and_dead_letters(
    redis_url: str, ns: str, r: redis.Redis
) -> None:
    """Two deaths give the call back; the third answers crashed, dead-letters, and stops."""
    request = _request(ns)
    Publisher(r, ns).publish(QUEUE, request)
    for death in (1, 2, 3):
        worker = f"host:{death}"
        redis_id = _die_running(redis_url, ns, r, request, worker)
        moved = recover_dead_worker(r, ns, worker, RULE)
        assert int(r.get(crashes_key(ns, request.id)) or 0) == death
        ttl = r.pttl(crashes_key(ns, request.id))
        assert 0 < ttl <= 30_000  # expires at the call's deadline
        assert moved == (1 if death < 3 else 0)
    assert r.zscore(f"{ns}:{QUEUE}.XQ", redis_id) is not None
    assert r.hget(f"{ns}:{QUEUE}.msgs", redis_id) is None
    envelope = ReplyEnvelope.decode(r.lindex(request.reply_to, 0) or b"")
    assert envelope.result is not None and envelope.result.status is Status.CRASHED
    assert envelope.result.content == {
        "error": "the tool's process died 3 times running this call; it is not run again"
    }
    assert r.exists(outcome_key(ns, request.id))
    assert r.llen(request.reply_to) == 1


def test_a_message_fetched_but_not_claimed_is_not_counted(
    redis_url: str, ns: str, r: redis.Redis
) -> None:
    """A call the dead process held without running it goes back uncounted."""
    request = _request(ns)
    Publisher(r, ns).publish(QUEUE, request)
    for death in (1, 2, 3, 4):
        _die_running(redis_url, ns, r, request, f"host:{death}", claim=False)
        assert recover_dead_worker(r, ns, f"host:{death}", RULE) == 1
    assert not r.exists(crashes_key(ns, request.id))
    assert not r.exists(request.reply_to)


def test_maintenance_applies_the_rule_to_a_broker_dead_by_its_heartbeat(
    redis_url: str, ns: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole pod gone: maintenance finds the dead broker's process and counts its call."""
    monkeypatch.setenv("TOOLFLEET_CRASH_RERUNS", "0")
    request = _request(ns)
    Publisher(r, ns).publish(QUEUE, request)
    redis_id = _die_running(redis_url, ns, r, request, "host:9")
    dead_broker = r.hget(brokers_key(ns), "host:9")
    assert dead_broker is not None
    r.zadd(f"{ns}:__heartbeats__", {dead_broker: 1})  # long dead
    live = make_broker(redis_url, ns)
    try:
        result = run_maintenance(live, [QUEUE])
    finally:
        live.client.close()
    assert result.requeued == 0
    assert r.zscore(f"{ns}:{QUEUE}.XQ", redis_id) is not None
    envelope = ReplyEnvelope.decode(r.lindex(request.reply_to, 0) or b"")
    assert envelope.result is not None and envelope.result.status is Status.CRASHED
    assert "died once running this call" in str(envelope.result.content)
